#pragma once
// The Eigen CPU backend: a batch of latents as one row-major Eigen array, one row per latent (its elements
// flattened row-major, as host_backend stores them). Every operation is one vectorized Eigen expression; the
// numbers match host_backend (the reference) up to the scalar type and summation order.
// basic_eigen_backend<float> halves memory and bandwidth and reproduces the reference to about 1e-5 relative.
#include <Eigen/Core>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/rollout/host_backend.hpp"

namespace branchgrpo {

/// `rows()` latents of shape `shape`: values(r, i) is element i (row-major flattened) of latent r.
template <std::floating_point Scalar>
struct basic_eigen_tensor {
  using array = Eigen::Array<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  array values;
  latent_shape shape;

  [[nodiscard]] std::int64_t rows() const { return static_cast<std::int64_t>(values.rows()); }

  // Eigen's == is element-wise; a tensor compares whole.
  friend bool operator==(const basic_eigen_tensor& x, const basic_eigen_tensor& y) {
    return x.shape == y.shape && x.values.rows() == y.values.rows() && x.values.cols() == y.values.cols() &&
           (x.values == y.values).all();
  }
};

using eigen_tensor = basic_eigen_tensor<double>;

/// The Eigen backend (models Backend); computes in Scalar, talks to the host in double.
/// Example: x = from_host({1, 2, 3, 4, 5, 6}, 3, {2}) (rows {1,2}, {3,4}, {5,6}) ->
///   to_host(gather_rows(x, {2, 0, 2})) == {5, 6, 1, 2, 5, 6};  to_host(slice_rows(x, 1, 3)) == {3, 4, 5, 6};
///   to_host(affine(2, x, -1, x)) == {1, 2, 3, 4, 5, 6};
///   row_log_prob(from_host({1, 3}, 1, {2}), from_host({1, 1}, 1, {2}), {2}) == {-0.25 - log 2 - 0.5 log(2 pi)}.
/// @pre shapes valid; operands of affine and row_log_prob have equal rows and shapes; gather indices in
///      [0, rows); 0 <= begin <= end <= rows; every std > 0 and finite.
/// @post results are fresh tensors (no aliasing); any violated precondition throws invalid_input with the
///       message host_backend gives.
template <std::floating_point Scalar>
struct basic_eigen_backend {
  using tensor = basic_eigen_tensor<Scalar>;
  using array = typename tensor::array;

  /// Tensor of `rows` rows from rows * shape.elements() row-major doubles.
  [[nodiscard]] tensor from_host(std::span<const double> values, std::int64_t rows, const latent_shape& shape) const {
    validate(shape);
    require(rows >= 0, "from_host row count must be non-negative, got ", rows);
    const std::int64_t elements = shape.elements();
    require(static_cast<std::int64_t>(values.size()) == rows * elements, "from_host got ", values.size(),
            " values for ", rows, " rows of ", elements, " elements");
    using host_array = Eigen::Array<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const Eigen::Map<const host_array> host(values.data(), static_cast<Eigen::Index>(rows),
                                            static_cast<Eigen::Index>(elements));
    return {.values = host.template cast<Scalar>(), .shape = shape};
  }

  [[nodiscard]] std::vector<double> to_host(const tensor& x) const {
    check(x, "to_host");
    std::vector<double> out(static_cast<std::size_t>(x.values.size()));
    using host_array = Eigen::Array<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::Map<host_array>(out.data(), x.values.rows(), x.values.cols()) = x.values.template cast<double>();
    return out;
  }

  [[nodiscard]] std::int64_t rows(const tensor& x) const { return x.rows(); }

  /// Rows x[index[0]], x[index[1]], ...; indices may repeat.
  [[nodiscard]] tensor gather_rows(const tensor& x, std::span<const std::int64_t> index) const {
    check(x, "gather_rows");
    for (std::size_t i = 0; i < index.size(); ++i)
      require(index[i] >= 0 && index[i] < x.rows(), "gather_rows index[", i, "] = ", index[i], " is outside [0, ",
              x.rows(), ")");
    return {.values = x.values(index, Eigen::all), .shape = x.shape};
  }

  /// Rows [begin, end).
  [[nodiscard]] tensor slice_rows(const tensor& x, std::int64_t begin, std::int64_t end) const {
    check(x, "slice_rows");
    require(begin >= 0 && begin <= end && end <= x.rows(), "slice_rows [", begin, ", ", end,
            ") is not a range inside [0, ", x.rows(), ")");
    return {.values = x.values.middleRows(static_cast<Eigen::Index>(begin), static_cast<Eigen::Index>(end - begin)),
            .shape = x.shape};
  }

  /// The rows of parts[0], parts[1], ... one after another; all parts share one shape.
  [[nodiscard]] tensor concat_rows(std::span<const tensor> parts) const {
    require(!parts.empty(), "concat_rows needs at least one part");
    const latent_shape& shape = parts.front().shape;
    Eigen::Index total = 0;
    for (std::size_t p = 0; p < parts.size(); ++p) {
      check(parts[p], "concat_rows");
      if (parts[p].shape != shape)  // not require(): its message arguments would be built on every call
        fail("concat_rows part ", p, " has rows of shape ", detail::shape_text(parts[p].shape), ", part 0 has ",
             detail::shape_text(shape));
      total += parts[p].values.rows();
    }
    tensor out{.values = array(total, static_cast<Eigen::Index>(shape.elements())), .shape = shape};
    Eigen::Index offset = 0;
    for (const tensor& part : parts) {
      out.values.middleRows(offset, part.values.rows()) = part.values;
      offset += part.values.rows();
    }
    return out;
  }

  /// a * x + c * v, element-wise.
  [[nodiscard]] tensor affine(double a, const tensor& x, double c, const tensor& v) const {
    check_pair(x, v, "affine");
    return {.values = static_cast<Scalar>(a) * x.values + static_cast<Scalar>(c) * v.values, .shape = x.shape};
  }

  /// Per row r: mean over elements of log N(next; mean, std[r]^2) (gaussian_log_prob_mean).
  [[nodiscard]] std::vector<double> row_log_prob(const tensor& next, const tensor& mean,
                                                 std::span<const double> std) const {
    check_pair(next, mean, "row_log_prob");
    require(static_cast<std::int64_t>(std.size()) == next.rows(), "row_log_prob got ", std.size(),
            " standard deviations for ", next.rows(), " rows");
    for (std::size_t r = 0; r < std.size(); ++r)
      require(std::isfinite(std[r]) && std[r] > 0.0, "row_log_prob std[", r, "] = ", std[r],
              " must be positive and finite");
    std::vector<double> out(std.size());
    if (out.empty()) return out;
    // The squared distances reduce in Scalar; the per-row scalars stay double like the host's.
    const Eigen::ArrayXd squares = (next.values - mean.values).rowwise().squaredNorm().template cast<double>();
    const Eigen::Map<const Eigen::ArrayXd> sigma(std.data(), static_cast<Eigen::Index>(std.size()));
    const double n = static_cast<double>(next.values.cols());
    Eigen::Map<Eigen::ArrayXd>(out.data(), static_cast<Eigen::Index>(out.size())) =
        -squares / (2.0 * n * sigma.square()) - sigma.log() - 0.5 * std::log(2.0 * std::numbers::pi);
    return out;
  }

  friend bool operator==(const basic_eigen_backend&, const basic_eigen_backend&) = default;

 private:
  // A hand-assembled tensor may disagree with its shape; catch it before indexing out of bounds.
  static void check(const tensor& x, const char* operation) {
    validate(x.shape);
    if (static_cast<std::int64_t>(x.values.cols()) != x.shape.elements())  // message built only on failure
      fail(operation, ": tensor holds rows of ", x.values.cols(), " elements, its shape ", detail::shape_text(x.shape),
           " has ", x.shape.elements());
  }
  static void check_pair(const tensor& x, const tensor& v, const char* operation) {
    check(x, operation);
    check(v, operation);
    if (x.rows() != v.rows() || x.shape != v.shape)  // not require(): it would build the shape texts every call
      fail(operation, " operands differ: ", x.rows(), " rows of ", detail::shape_text(x.shape), " vs ", v.rows(),
           " rows of ", detail::shape_text(v.shape));
  }
};

using eigen_backend = basic_eigen_backend<double>;

}  // namespace branchgrpo
