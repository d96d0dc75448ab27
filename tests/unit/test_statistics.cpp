// evaluation/statistics.hpp: the summaries behind `branchgrpo compare`. Each doc example is checked, the t quantile
// against printed table values and closed forms (1, 2 and 4 degrees of freedom), the interval on synthetic samples.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "branchgrpo/evaluation/statistics.hpp"
#include "error_text.hpp"

using branchgrpo::curve_at;
using branchgrpo::mean_interval;
using branchgrpo::regularized_incomplete_beta;
using branchgrpo::sample_mean;
using branchgrpo::sample_std;
using branchgrpo::student_t_cdf;
using branchgrpo::student_t_quantile;
using branchgrpo::t_interval;
using branchgrpo::testing::error_of;
using V = std::vector<double>;

TEST_CASE("sample_mean and sample_std", "[statistics]") {
  CHECK(sample_mean(V{1, 2, 3, 6}) == 3.0);
  CHECK(sample_std(V{2, 4, 4, 4, 5, 5, 7, 9}) == Approx(std::sqrt(32.0 / 7.0)).epsilon(1e-14));
  CHECK(sample_std(V{1, 1}) == 0.0);
  CHECK(error_of([] { (void)sample_mean(V{}); }) == "the mean of 0 values is undefined");
  CHECK(error_of([] { (void)sample_std(V{1}); }) == "the sample standard deviation needs at least 2 values, got 1");
  CHECK(error_of([] { (void)sample_mean(V{1, NAN}); }) == "value 1 of the sample is not finite: nan");
}

TEST_CASE("regularized_incomplete_beta: closed forms and symmetry", "[statistics]") {
  CHECK(regularized_incomplete_beta(1, 1, 0.3) == Approx(0.3).epsilon(1e-14));
  CHECK(regularized_incomplete_beta(2, 3, 0.4) == Approx(0.5248).epsilon(1e-13));
  CHECK(regularized_incomplete_beta(2, 3, 0.0) == 0.0);
  CHECK(regularized_incomplete_beta(2, 3, 1.0) == 1.0);
  // Integer a, b: I_x(a, b) = P(Binomial(a + b - 1, x) >= a).
  for (const double x : {0.05, 0.3, 0.5, 0.77, 0.99}) {
    const int a = 3, b = 5, n = a + b - 1;
    double expected = 0, choose = 1;  // C(n, j), built up from j = 0
    for (int j = 0; j <= n; ++j) {
      if (j >= a) expected += choose * std::pow(x, j) * std::pow(1 - x, n - j);
      choose = choose * (n - j) / (j + 1);
    }
    CHECK(regularized_incomplete_beta(a, b, x) == Approx(expected).epsilon(1e-12));
    CHECK(regularized_incomplete_beta(a, b, x) == Approx(1 - regularized_incomplete_beta(b, a, 1 - x)).epsilon(1e-12));
  }
  CHECK(error_of([] { (void)regularized_incomplete_beta(0, 1, 0.5); }) ==
        "incomplete beta: a = 0, b = 1 must be positive and finite");
  CHECK(error_of([] { (void)regularized_incomplete_beta(1, 1, 1.5); }) == "incomplete beta: x = 1.5 is not in [0, 1]");
}

TEST_CASE("student_t_cdf matches the closed forms for 1, 2 and 4 degrees of freedom", "[statistics]") {
  CHECK(student_t_cdf(0, 5) == 0.5);
  CHECK(student_t_cdf(INFINITY, 3) == 1.0);
  CHECK(student_t_cdf(-INFINITY, 3) == 0.0);
  for (const double t : {-30.0, -2.5, -0.3, 0.1, 1.0, 2.776, 12.7, 400.0}) {
    CHECK(student_t_cdf(t, 1) == Approx(0.5 + std::atan(t) / std::numbers::pi).epsilon(1e-12));
    CHECK(student_t_cdf(t, 2) == Approx(0.5 + t / (2 * std::sqrt(2 + t * t))).epsilon(1e-12));
    const double u = t / std::sqrt(1 + t * t / 4), w = t * t / (1 + t * t / 4);
    CHECK(student_t_cdf(t, 4) == Approx(0.5 + 0.375 * u * (1 - w / 12)).margin(1e-13));  // absolute: 0.5 + ... cancels
    CHECK(student_t_cdf(-t, 7.5) == Approx(1 - student_t_cdf(t, 7.5)).margin(1e-13));
  }
  CHECK(student_t_cdf(12.7062047, 1) == Approx(0.975).epsilon(1e-9));
}

TEST_CASE("student_t_quantile reproduces the t table", "[statistics]") {
  // The values, then more printed table entries (to their printed digits) and the exact forms.
  CHECK(student_t_quantile(0.975, 1) == Approx(12.706).margin(5e-4));
  CHECK(student_t_quantile(0.975, 4) == Approx(2.776).margin(5e-4));
  CHECK(student_t_quantile(0.975, 19) == Approx(2.093).margin(5e-4));
  CHECK(student_t_quantile(0.975, 4) == Approx(2.7764451052).margin(1e-9));
  CHECK(student_t_quantile(0.975, 19) == Approx(2.0930240544).margin(1e-9));
  CHECK(student_t_quantile(0.95, 10) == Approx(1.8124611228).margin(1e-9));
  CHECK(student_t_quantile(0.995, 30) == Approx(2.7499956536).margin(1e-9));
  CHECK(student_t_quantile(0.975, 1) == Approx(std::tan(0.475 * std::numbers::pi)).epsilon(1e-11));
  CHECK(student_t_quantile(0.9995, 1) == Approx(std::tan(0.4995 * std::numbers::pi)).epsilon(1e-10));
  CHECK(student_t_quantile(0.975, 2) == Approx(0.95 / std::sqrt(2 * 0.975 * 0.025)).epsilon(1e-11));
  CHECK(student_t_quantile(0.975, 1e6) == Approx(1.959966).margin(2e-6));  // the normal's 1.959964 + O(1 / dof)
  CHECK(student_t_quantile(0.025, 4) == Approx(-2.7764451052).margin(1e-9));
  CHECK(student_t_quantile(0.5, 3) == 0.0);
  for (const double dof : {1.0, 2.5, 9.0, 99.0})
    for (const double p : {0.001, 0.2, 0.6, 0.9, 0.999999})
      CHECK(student_t_cdf(student_t_quantile(p, dof), dof) == Approx(p).epsilon(1e-10));
  CHECK(error_of([] { (void)student_t_quantile(1, 4); }) == "Student t: probability 1 is not in (0, 1)");
  CHECK(error_of([] { (void)student_t_quantile(0.9, 0); }) ==
        "Student t: degrees of freedom 0 must be positive and finite");
}

TEST_CASE("t_interval on samples with known mean and interval", "[statistics]") {
  const mean_interval five = t_interval(V{1, 2, 3, 4, 5});
  CHECK(five.mean == 3.0);
  CHECK(five.count == 5);
  CHECK(five.standard_deviation == Approx(std::sqrt(2.5)).epsilon(1e-14));
  CHECK(five.t == Approx(2.7764451052).margin(1e-9));
  CHECK(five.half_width == Approx(2.7764451052 * std::sqrt(2.5) / std::sqrt(5.0)).epsilon(1e-9));
  CHECK(five.half_width == Approx(1.963).margin(5e-4));
  CHECK(five.low == Approx(1.037).margin(5e-4));
  CHECK(five.high == Approx(4.963).margin(5e-4));
  CHECK(five.high - five.mean == Approx(five.mean - five.low).epsilon(1e-14));

  const mean_interval constant = t_interval(V{0.5, 0.5, 0.5});
  CHECK(constant.low == 0.5);
  CHECK(constant.high == 0.5);

  // Two seeds: t_{0.975, 1} = 12.706; {0.1, 0.3}: mean 0.2, s = 0.1414, half width 12.706 x 0.1 = 1.2706.
  const mean_interval two = t_interval(V{0.1, 0.3});
  CHECK(two.half_width == Approx(1.2706204736).margin(1e-9));
  // 20 seeds 0, 1, ..., 19: mean 9.5, s = sqrt(35), half width 2.093 sqrt(35 / 20).
  V twenty;
  for (int i = 0; i < 20; ++i) twenty.push_back(i);
  const mean_interval t20 = t_interval(twenty);
  CHECK(t20.mean == 9.5);
  CHECK(t20.half_width == Approx(2.0930240544 * std::sqrt(35.0 / 20.0)).epsilon(1e-9));
  // A 90 % interval is narrower: t_{0.95, 4} = 2.1318.
  CHECK(t_interval(V{1, 2, 3, 4, 5}, 0.9).t == Approx(2.1318467863).margin(1e-9));

  CHECK(error_of([] { (void)t_interval(V{1}); }) == "the sample standard deviation needs at least 2 values, got 1");
  CHECK(error_of([] { (void)t_interval(V{1, 2}, 1.0); }) == "confidence 1 is not in (0, 1)");
}

TEST_CASE("t_interval covers the true mean about 95 % of the time", "[statistics]") {
  // Samples of 4 from a fixed, deterministic sequence of N(2, 1) draws (Box-Muller over a 64-bit LCG).
  std::uint64_t state = 12345;
  const auto uniform = [&state] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (static_cast<double>(state >> 11) + 0.5) / 9007199254740992.0;
  };
  int covered = 0;
  const int trials = 4000;
  for (int trial = 0; trial < trials; ++trial) {
    V sample;
    for (int i = 0; i < 4; ++i)
      sample.push_back(2.0 + std::sqrt(-2 * std::log(uniform())) * std::cos(2 * std::numbers::pi * uniform()));
    const mean_interval ci = t_interval(sample);
    if (ci.low <= 2.0 && 2.0 <= ci.high) ++covered;
  }
  // Binomial(4000, 0.95): sd 0.0034; a z-interval (t = 1.96) would cover only ~0.86 with 3 degrees of freedom.
  CHECK(covered / static_cast<double>(trials) == Approx(0.95).margin(0.015));
}

TEST_CASE("curve_at interpolates linearly and holds the ends", "[statistics]") {
  const V times{0, 2, 4}, values{0.5, 0.7, 0.6};
  CHECK(curve_at(times, values, 1) == Approx(0.6).epsilon(1e-15));
  CHECK(curve_at(times, values, 3) == Approx(0.65).epsilon(1e-15));
  CHECK(curve_at(times, values, 4) == 0.6);
  CHECK(curve_at(times, values, 9) == 0.6);
  CHECK(curve_at(times, values, -1) == 0.5);
  CHECK(curve_at(times, values, 2) == 0.7);
  CHECK(curve_at(V{0, 1, 1, 2}, V{0, 1, 3, 3}, 1) == 3.0);  // a repeated time: the later point
  CHECK(curve_at(V{5}, V{0.25}, 0) == 0.25);
  CHECK(error_of([] { (void)curve_at(V{0, 2, 1}, V{0, 0, 0}, 1); }) == "curve times decrease at index 2: 2 then 1");
  CHECK(error_of([] {
          (void)curve_at(V{0, 1}, V{0}, 1);
        }) == "a curve needs as many values as times (at least one), got 2 times and 1 values");
  CHECK(error_of([] { (void)curve_at(V{0, 1}, V{0, NAN}, 0.5); }) == "curve point 1 is not finite: (1, nan)");
}
