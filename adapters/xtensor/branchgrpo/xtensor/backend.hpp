#pragma once
// The xtensor CPU backend: a batch of latents as one N-d row-major xt::xarray of shape [rows, dims...], so a
// denoiser written with xtensor sees its latents in their natural shape. Operations are xtensor expressions
// (views, keep-indexing, lazy reductions over the latent axes); the numbers match host_backend (the
// reference) up to summation order.
#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/rollout/host_backend.hpp"

namespace branchgrpo {

/// A batch of latents: `values` has shape [rows, dims...]; row-major whatever XTENSOR_DEFAULT_LAYOUT says,
/// so that to_host / from_host are plain copies.
struct xtensor_tensor {
  using array = xt::xarray<double, xt::layout_type::row_major>;

  array values;

  [[nodiscard]] std::int64_t rows() const {
    return values.dimension() == 0 ? 0 : static_cast<std::int64_t>(values.shape()[0]);
  }
  /// The latent shape: every axis but the first.
  [[nodiscard]] latent_shape shape() const {
    latent_shape shape;
    for (std::size_t axis = 1; axis < values.dimension(); ++axis)
      shape.dims.push_back(static_cast<std::int64_t>(values.shape()[axis]));
    return shape;
  }

  friend bool operator==(const xtensor_tensor& x, const xtensor_tensor& y) { return x.values == y.values; }
};

/// The xtensor backend (models Backend).
/// Example: x = from_host({1, 2, 3, 4, 5, 6}, 3, {2}) (values of shape [3, 2]) ->
///   to_host(gather_rows(x, {2, 0, 2})) == {5, 6, 1, 2, 5, 6};  to_host(slice_rows(x, 1, 3)) == {3, 4, 5, 6};
///   to_host(affine(2, x, -1, x)) == {1, 2, 3, 4, 5, 6};
///   row_log_prob(from_host({1, 3}, 1, {2}), from_host({1, 1}, 1, {2}), {2}) == {-0.25 - log 2 - 0.5 log(2 pi)}.
/// @pre shapes valid; operands of affine and row_log_prob have equal rows and shapes; gather indices in
///      [0, rows); 0 <= begin <= end <= rows; every std > 0 and finite.
/// @post results are fresh tensors (no aliasing); any violated precondition throws invalid_input with the
///       message host_backend gives.
struct xtensor_backend {
  using tensor = xtensor_tensor;
  using array = tensor::array;

  /// Tensor of shape [rows, shape.dims...] from rows * shape.elements() row-major doubles.
  [[nodiscard]] tensor from_host(std::span<const double> values, std::int64_t rows, const latent_shape& shape) const {
    validate(shape);
    require(rows >= 0, "from_host row count must be non-negative, got ", rows);
    const std::int64_t expected = rows * shape.elements();
    require(static_cast<std::int64_t>(values.size()) == expected, "from_host got ", values.size(), " values for ",
            rows, " rows of ", shape.elements(), " elements");
    tensor out{.values = empty(rows, shape)};
    std::copy(values.begin(), values.end(), out.values.data());
    return out;
  }

  [[nodiscard]] std::vector<double> to_host(const tensor& x) const {
    check(x, "to_host");
    return std::vector<double>(x.values.data(), x.values.data() + x.values.size());
  }

  [[nodiscard]] std::int64_t rows(const tensor& x) const { return x.rows(); }

  /// Rows x[index[0]], x[index[1]], ...; indices may repeat.
  [[nodiscard]] tensor gather_rows(const tensor& x, std::span<const std::int64_t> index) const {
    check(x, "gather_rows");
    for (std::size_t i = 0; i < index.size(); ++i)
      require(index[i] >= 0 && index[i] < x.rows(), "gather_rows index[", i, "] = ", index[i],
              " is outside [0, ", x.rows(), ")");
    // xt::keep of no index would allocate garbage in xtensor 0.24: build the empty batch directly.
    if (index.empty()) return {.values = empty(0, x.shape())};
    const std::vector<std::int64_t> rows(index.begin(), index.end());
    return {.values = xt::view(x.values, xt::keep(rows))};
  }

  /// Rows [begin, end).
  [[nodiscard]] tensor slice_rows(const tensor& x, std::int64_t begin, std::int64_t end) const {
    check(x, "slice_rows");
    require(begin >= 0 && begin <= end && end <= x.rows(), "slice_rows [", begin, ", ", end,
            ") is not a range inside [0, ", x.rows(), ")");
    return {.values = xt::view(x.values, xt::range(begin, end))};
  }

  /// The rows of parts[0], parts[1], ... one after another; all parts share one shape.
  [[nodiscard]] tensor concat_rows(std::span<const tensor> parts) const {
    require(!parts.empty(), "concat_rows needs at least one part");
    check(parts.front(), "concat_rows");
    const latent_shape shape = parts.front().shape();
    std::int64_t total = 0;
    for (std::size_t p = 0; p < parts.size(); ++p) {
      check(parts[p], "concat_rows");
      if (parts[p].shape() != shape)  // not require(): its message arguments would be built on every call
        fail("concat_rows part ", p, " has rows of shape ", detail::shape_text(parts[p].shape()), ", part 0 has ",
             detail::shape_text(shape));
      total += parts[p].rows();
    }
    tensor out{.values = empty(total, shape)};
    std::int64_t offset = 0;
    for (const tensor& part : parts) {
      if (part.rows() > 0) xt::view(out.values, xt::range(offset, offset + part.rows())) = part.values;
      offset += part.rows();
    }
    return out;
  }

  /// a * x + c * v, element-wise.
  [[nodiscard]] tensor affine(double a, const tensor& x, double c, const tensor& v) const {
    check_pair(x, v, "affine");
    return {.values = a * x.values + c * v.values};
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
    // Sum the squared distances over every latent axis: one value per row. (The lazy reducer: xtensor
    // 0.24's immediate reducer mis-sizes its result for runtime axes.)
    std::vector<std::size_t> axes(next.values.dimension() - 1);
    for (std::size_t i = 0; i < axes.size(); ++i) axes[i] = i + 1;
    const array squares = xt::sum(xt::square(next.values - mean.values), axes);
    const auto sigma = xt::adapt(std.data(), std.size(), xt::no_ownership(), std::vector<std::size_t>{std.size()});
    const double n = static_cast<double>(next.shape().elements());
    const array log_probs = -squares / (2.0 * n * xt::square(sigma)) - xt::log(sigma) -
                            0.5 * std::log(2.0 * std::numbers::pi);
    std::copy(log_probs.data(), log_probs.data() + log_probs.size(), out.begin());
    return out;
  }

  friend bool operator==(const xtensor_backend&, const xtensor_backend&) = default;

 private:
  // An uninitialized array of shape [rows, shape.dims...].
  static array empty(std::int64_t rows, const latent_shape& shape) {
    std::vector<std::size_t> extents{static_cast<std::size_t>(rows)};
    for (const std::int64_t dim : shape.dims) extents.push_back(static_cast<std::size_t>(dim));
    return array::from_shape(extents);
  }
  // A hand-assembled tensor may lack the batch axis or have an empty latent axis.
  static void check(const tensor& x, const char* operation) {
    require(x.values.dimension() >= 2, operation, ": tensor has ", x.values.dimension(),
            " axes, needs [rows, latent dims...] (at least 2)");
    validate(x.shape());
  }
  static void check_pair(const tensor& x, const tensor& v, const char* operation) {
    check(x, operation);
    check(v, operation);
    if (x.rows() != v.rows() || x.shape() != v.shape())  // not require(): it would build the shape texts every call
      fail(operation, " operands differ: ", x.rows(), " rows of ", detail::shape_text(x.shape()), " vs ", v.rows(),
           " rows of ", detail::shape_text(v.shape()));
  }
};

}  // namespace branchgrpo
