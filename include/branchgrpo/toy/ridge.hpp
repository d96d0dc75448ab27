#pragma once
// Ridge regression by its normal equations and a Cholesky solve: the closed-form fit of the toy's base model.
#include <cmath>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"

namespace branchgrpo {

/// Solves A X = B for a symmetric positive definite n x n matrix A (row-major; only the lower triangle is
/// read) and an n x k right-hand side B (row-major). Cholesky A = L L^T, then two triangular solves.
/// Example: A = {4, 2, 2, 3}, B = {6, 7} (n 2, k 1) -> X = {0.5, 2}  (4 * 0.5 + 2 * 2 = 6, 2 * 0.5 + 3 * 2 = 7).
/// @pre a.size() == n * n, b.size() == n * k, n >= 1; A positive definite (else invalid_input naming the
///      first non-positive pivot).
/// @post returns X, n x k row-major.
inline std::vector<double> cholesky_solve(std::vector<double> a, std::size_t n, std::span<const double> b,
                                          std::size_t k) {
  require(n >= 1 && a.size() == n * n, "cholesky_solve needs an n x n matrix with n >= 1, got ", a.size(),
          " values for n = ", n);
  require(b.size() == n * k, "cholesky_solve right-hand side has ", b.size(), " values, expected ", n, " x ", k);
  // In place: the lower triangle of `a` becomes L.
  for (std::size_t j = 0; j < n; ++j) {
    double pivot = a[j * n + j];
    for (std::size_t p = 0; p < j; ++p) pivot -= a[j * n + p] * a[j * n + p];
    require(std::isfinite(pivot) && pivot > 0.0, "cholesky_solve: matrix is not positive definite (pivot ", j, " is ",
            pivot, ")");
    const double diagonal = std::sqrt(pivot);
    a[j * n + j] = diagonal;
    for (std::size_t i = j + 1; i < n; ++i) {
      double value = a[i * n + j];
      for (std::size_t p = 0; p < j; ++p) value -= a[i * n + p] * a[j * n + p];
      a[i * n + j] = value / diagonal;
    }
  }
  std::vector<double> x(b.begin(), b.end());
  for (std::size_t c = 0; c < k; ++c) {
    for (std::size_t i = 0; i < n; ++i) {  // L y = b
      double value = x[i * k + c];
      for (std::size_t p = 0; p < i; ++p) value -= a[i * n + p] * x[p * k + c];
      x[i * k + c] = value / a[i * n + i];
    }
    for (std::size_t i = n; i-- > 0;) {  // L^T x = y
      double value = x[i * k + c];
      for (std::size_t p = i + 1; p < n; ++p) value -= a[p * n + i] * x[p * k + c];
      x[i * k + c] = value / a[i * n + i];
    }
  }
  return x;
}

/// Ridge regression of `outputs` targets on `features` features, accumulated one sample at a time:
///   W = argmin (1/N) sum_i |W phi_i - y_i|^2 + lambda |W|_F^2 = Y^T Phi (Phi^T Phi + N lambda I)^-1,
/// solved as (Phi^T Phi / N + lambda I) W^T = Phi^T Y / N. W is outputs x features, row-major.
/// Example: features 1, outputs 1, samples (phi, y) = (1, 2), (2, 4); lambda 0.5 ->
///   (2.5 + 0.5) w = 5  ->  W = {5/3}  (Phi^T Phi / N = 5 / 2, Phi^T y / N = 10 / 2).
/// @pre features, outputs >= 1; every added value finite; at least one sample; lambda >= 0 and finite
///      (lambda 0 needs Phi^T Phi positive definite).
class ridge_regression {
 public:
  ridge_regression(std::size_t features, std::size_t outputs)
      : features_(features), outputs_(outputs), gram_(features * features), cross_(features * outputs) {
    require(features >= 1 && outputs >= 1, "ridge_regression needs at least one feature and one output, got ", features,
            " and ", outputs);
  }

  /// Adds one sample: feature vector phi (features values) and target y (outputs values).
  void add(std::span<const double> phi, std::span<const double> y) {
    require(phi.size() == features_ && y.size() == outputs_, "ridge_regression sample has ", phi.size(),
            " features and ", y.size(), " targets, expected ", features_, " and ", outputs_);
    for (std::size_t i = 0; i < phi.size(); ++i)
      require(std::isfinite(phi[i]), "ridge_regression feature ", i, " is ", phi[i]);
    for (std::size_t i = 0; i < y.size(); ++i)
      require(std::isfinite(y[i]), "ridge_regression target ", i, " is ", y[i]);
    // Lower triangle only (cholesky_solve reads nothing else); raw pointers keep unoptimized builds fast.
    const double* f = phi.data();
    for (std::size_t i = 0; i < features_; ++i) {
      double* row = gram_.data() + i * features_;
      const double fi = f[i];
      for (std::size_t j = 0; j <= i; ++j) row[j] += fi * f[j];
      double* cross = cross_.data() + i * outputs_;
      for (std::size_t o = 0; o < outputs_; ++o) cross[o] += fi * y[o];
    }
    ++samples_;
  }

  [[nodiscard]] std::size_t samples() const { return samples_; }

  /// W (outputs x features, row-major) for ridge strength lambda.
  [[nodiscard]] std::vector<double> solve(double lambda) const {
    require(std::isfinite(lambda) && lambda >= 0.0, "ridge lambda must be non-negative and finite, got ", lambda);
    require(samples_ >= 1, "ridge_regression has no samples");
    const double scale = 1.0 / static_cast<double>(samples_);
    std::vector<double> a(gram_.size());
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = gram_[i] * scale;
    for (std::size_t i = 0; i < features_; ++i) a[i * features_ + i] += lambda;
    std::vector<double> b(cross_.size());
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = cross_[i] * scale;
    const std::vector<double> transposed = cholesky_solve(std::move(a), features_, b, outputs_);  // features x outputs
    std::vector<double> w(outputs_ * features_);
    for (std::size_t i = 0; i < features_; ++i)
      for (std::size_t o = 0; o < outputs_; ++o) w[o * features_ + i] = transposed[i * outputs_ + o];
    return w;
  }

 private:
  std::size_t features_;
  std::size_t outputs_;
  std::vector<double> gram_;   // Phi^T Phi, lower triangle
  std::vector<double> cross_;  // Phi^T Y, features x outputs
  std::size_t samples_ = 0;
};

}  // namespace branchgrpo
