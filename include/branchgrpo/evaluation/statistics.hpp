#pragma once
// Summaries of repeated runs, for evidence that holds across seeds (`branchgrpo compare`, docs/results.md): the
// mean, the sample standard deviation, Student's t distribution (its CDF through the regularized incomplete beta
// function, its quantile by bisection on the CDF: no table, any degrees of freedom), the t interval of a mean, and
// a piecewise-linear curve read at a time. Standard library only.
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>

#include "branchgrpo/core/error.hpp"

namespace branchgrpo {

/// The arithmetic mean. Example: sample_mean({1, 2, 3, 6}) == 3.
/// @pre values not empty, every value finite (else invalid_input naming the count or the index).
inline double sample_mean(std::span<const double> values) {
  require(!values.empty(), "the mean of 0 values is undefined");
  double sum = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    require(std::isfinite(values[i]), "value ", i, " of the sample is not finite: ", values[i]);
    sum += values[i];
  }
  return sum / static_cast<double>(values.size());
}

/// The sample standard deviation (divisor n - 1). Example: sample_std({2, 4, 4, 4, 5, 5, 7, 9}) == sqrt(32 / 7)
/// (~2.138); sample_std({1, 1}) == 0.
/// @pre at least 2 values, every value finite.
inline double sample_std(std::span<const double> values) {
  require(values.size() >= 2, "the sample standard deviation needs at least 2 values, got ", values.size());
  const double m = sample_mean(values);
  double squares = 0;
  for (const double v : values) squares += (v - m) * (v - m);
  return std::sqrt(squares / static_cast<double>(values.size() - 1));
}

/// The regularized incomplete beta function I_x(a, b) = B(x; a, b) / B(a, b), to about 1e-14.
/// Example: regularized_incomplete_beta(1, 1, 0.3) == 0.3; regularized_incomplete_beta(2, 3, 0.4) == 0.5248
///   (1 - (1 - x)^3 (1 + 3x)); I_x(a, b) == 1 - I_{1-x}(b, a).
/// @pre a > 0, b > 0, 0 <= x <= 1, all finite.
inline double regularized_incomplete_beta(double a, double b, double x);

/// Student's t CDF with `dof` degrees of freedom. Example: student_t_cdf(0, 5) == 0.5;
///   student_t_cdf(12.7062047, 1) ~ 0.975; student_t_cdf(-t, dof) == 1 - student_t_cdf(t, dof).
/// @pre dof > 0 and finite; t not NaN.
inline double student_t_cdf(double t, double dof);

/// The p-quantile of Student's t with `dof` degrees of freedom, by bisection on the CDF to ~1e-12 relative.
/// Example: student_t_quantile(0.975, 1) ~ 12.706 (exactly tan(0.475 pi)); (0.975, 4) ~ 2.776;
///   (0.975, 19) ~ 2.093; (0.975, 1e6) ~ 1.960 (the normal's); student_t_quantile(0.025, 4) ~ -2.776.
/// @pre 0 < p < 1; dof > 0 and finite (else invalid_input naming the value).
/// @post student_t_cdf(result, dof) == p to ~1e-12.
inline double student_t_quantile(double p, double dof);

/// The t interval of a mean: mean -+ t_{(1 + confidence) / 2, n - 1} s / sqrt(n), s the sample standard deviation.
struct mean_interval {
  double mean = 0, low = 0, high = 0;
  double half_width = 0;          ///< t s / sqrt(n)
  double t = 0;                   ///< the quantile t_{(1 + confidence) / 2, n - 1}
  double standard_deviation = 0;  ///< s
  std::size_t count = 0;          ///< n
};

/// The Student-t interval of the mean of `values` (independent draws of one quantity, e.g. a reward gain per
/// seed). Example: t_interval({1, 2, 3, 4, 5}) -> mean 3, s = sqrt(2.5), t = 2.776, half width
///   2.776 sqrt(2.5) / sqrt(5) = 1.963, [1.037, 4.963]; t_interval({0.5, 0.5, 0.5}) -> [0.5, 0.5].
/// @pre at least 2 values, every value finite; 0 < confidence < 1.
/// @post low <= mean <= high; high - mean == mean - low == half_width.
inline mean_interval t_interval(std::span<const double> values, double confidence = 0.95);

/// The piecewise-linear curve through (times[i], values[i]) read at time `t`: before the first time the first
/// value, after the last time the last value (a run that has finished keeps the reward it reached); where times
/// repeat, the later point wins. Example: with times {0, 2, 4} and values {0.5, 0.7, 0.6}: at 1 -> 0.6, at 3 ->
///   0.65, at 4 -> 0.6, at 9 -> 0.6, at -1 -> 0.5.
/// @pre times and values of equal size, not empty, finite; times non-decreasing; t finite.
inline double curve_at(std::span<const double> times, std::span<const double> values, double t);

// --- Definitions ------------------------------------------------------------------------------------------------

namespace detail {

// The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes' betacf), which
// converges fast for x < (a + 1) / (a + b + 2): in O(sqrt(max(a, b))) terms.
inline double beta_fraction(double a, double b, double x) {
  constexpr double tiny = 1e-300, epsilon = 1e-16;
  const double qab = a + b, qap = a + 1, qam = a - 1;
  double c = 1, d = 1 - qab * x / qap;
  if (std::abs(d) < tiny) d = tiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 1'000'000; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
    d = 1 + aa * d;
    if (std::abs(d) < tiny) d = tiny;
    c = 1 + aa / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1 / d;
    h *= d * c;
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
    d = 1 + aa * d;
    if (std::abs(d) < tiny) d = tiny;
    c = 1 + aa / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1 / d;
    const double step = d * c;
    h *= step;
    if (std::abs(step - 1) < epsilon) break;
  }
  return h;
}

// P(T > t) for t >= 0: I_x(dof / 2, 1 / 2) / 2 with x = dof / (dof + t^2).
inline double student_t_upper_tail(double t, double dof) {
  const double x = dof / (dof + t * t);
  return regularized_incomplete_beta(dof / 2, 0.5, x) / 2;
}

}  // namespace detail

inline double regularized_incomplete_beta(double a, double b, double x) {
  require(std::isfinite(a) && std::isfinite(b) && a > 0 && b > 0, "incomplete beta: a = ", a, ", b = ", b,
          " must be positive and finite");
  require(x >= 0 && x <= 1, "incomplete beta: x = ", x, " is not in [0, 1]");
  if (x == 0 || x == 1) return x;
  const double log_front = std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x);
  if (x < (a + 1) / (a + b + 2)) return std::exp(log_front) * detail::beta_fraction(a, b, x) / a;
  return 1 - std::exp(log_front) * detail::beta_fraction(b, a, 1 - x) / b;
}

inline double student_t_cdf(double t, double dof) {
  require(std::isfinite(dof) && dof > 0, "Student t: degrees of freedom ", dof, " must be positive and finite");
  require(!std::isnan(t), "Student t: the CDF of NaN is undefined");
  if (std::isinf(t)) return t > 0 ? 1.0 : 0.0;
  const double tail = detail::student_t_upper_tail(std::abs(t), dof);
  return t >= 0 ? 1 - tail : tail;
}

inline double student_t_quantile(double p, double dof) {
  require(std::isfinite(dof) && dof > 0, "Student t: degrees of freedom ", dof, " must be positive and finite");
  require(p > 0 && p < 1, "Student t: probability ", p, " is not in (0, 1)");
  if (p == 0.5) return 0;
  if (p < 0.5) return -student_t_quantile(1 - p, dof);
  // Solve P(T > t) = 1 - p on the upper tail, which keeps its precision where p is close to 1.
  const double tail = 1 - p;
  double low = 0, high = 1;
  while (detail::student_t_upper_tail(high, dof) > tail) {
    low = high;
    high *= 2;
    require(std::isfinite(high), "Student t: the ", p, "-quantile with ", dof, " degrees of freedom overflows");
  }
  for (int i = 0; i < 200 && high - low > 1e-13 * high; ++i) {
    const double middle = (low + high) / 2;
    (detail::student_t_upper_tail(middle, dof) > tail ? low : high) = middle;
  }
  return (low + high) / 2;
}

inline mean_interval t_interval(std::span<const double> values, double confidence) {
  require(confidence > 0 && confidence < 1, "confidence ", confidence, " is not in (0, 1)");
  mean_interval out;
  out.count = values.size();
  out.standard_deviation = sample_std(values);  // checks the count and finiteness
  out.mean = sample_mean(values);
  out.t = student_t_quantile((1 + confidence) / 2, static_cast<double>(values.size() - 1));
  out.half_width = out.t * out.standard_deviation / std::sqrt(static_cast<double>(values.size()));
  out.low = out.mean - out.half_width;
  out.high = out.mean + out.half_width;
  return out;
}

inline double curve_at(std::span<const double> times, std::span<const double> values, double t) {
  require(!times.empty() && times.size() == values.size(), "a curve needs as many values as times (at least one), got ",
          times.size(), " times and ", values.size(), " values");
  require(std::isfinite(t), "a curve is read at a finite time, got ", t);
  for (std::size_t i = 0; i < times.size(); ++i) {
    require(std::isfinite(times[i]) && std::isfinite(values[i]), "curve point ", i, " is not finite: (", times[i], ", ",
            values[i], ")");
    require(i == 0 || times[i] >= times[i - 1], "curve times decrease at index ", i, ": ", times[i - 1], " then ",
            times[i]);
  }
  if (t < times.front()) return values.front();
  if (t >= times.back()) return values.back();
  std::size_t i = 1;
  while (times[i] <= t) ++i;  // times[i - 1] <= t < times[i], so times[i] > times[i - 1]
  const double w = (t - times[i - 1]) / (times[i] - times[i - 1]);
  return values[i - 1] + w * (values[i] - values[i - 1]);
}

}  // namespace branchgrpo
