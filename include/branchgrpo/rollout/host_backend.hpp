#pragma once
// The reference backend: a batch of latents as row-major doubles in a std::vector. Every other backend
// (Eigen, xtensor, LibTorch, CUDA) must give the same numbers up to its dtype; this one defines them.
// Shapes are checked on every operation; values are data and are not checked for finiteness (a tensor
// library does not either): the rollout engine checks its log-probs instead.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/schedule/steppers.hpp"

namespace branchgrpo {

namespace detail {
/// "{16, 90, 90}": a latent shape for error messages.
inline std::string shape_text(const latent_shape& shape) {
  std::string text = "{";
  for (std::size_t i = 0; i < shape.dims.size(); ++i) text += (i ? ", " : "") + std::to_string(shape.dims[i]);
  return text + "}";
}
}  // namespace detail

/// `rows` latents of shape `shape`, row-major: element i of row r is values[r * shape.elements() + i].
struct host_tensor {
  std::int64_t rows = 0;
  latent_shape shape;
  std::vector<double> values;

  friend bool operator==(const host_tensor&, const host_tensor&) = default;
};

/// The std::vector reference backend (models Backend).
/// Example: x = from_host({1, 2, 3, 4, 5, 6}, 3, {2}) (rows {1,2}, {3,4}, {5,6}) ->
///   gather_rows(x, {2, 0, 2}).values == {5, 6, 1, 2, 5, 6};  slice_rows(x, 1, 3).values == {3, 4, 5, 6};
///   affine(2, x, -1, x).values == {1, 2, 3, 4, 5, 6};
///   row_log_prob(from_host({1, 3}, 1, {2}), from_host({1, 1}, 1, {2}), {2}) == {-0.25 - log 2 - 0.5 log(2 pi)}.
/// @pre shapes valid; operands of affine and row_log_prob have equal rows and shapes; gather indices in
///      [0, rows); 0 <= begin <= end <= rows; every std > 0 and finite.
/// @post results are fresh tensors (no aliasing); any violated precondition throws invalid_input.
struct host_backend {
  using tensor = host_tensor;

  /// Tensor of `rows` rows from rows * shape.elements() row-major doubles.
  [[nodiscard]] tensor from_host(std::span<const double> values, std::int64_t rows, const latent_shape& shape) const {
    validate(shape);
    require(rows >= 0, "from_host row count must be non-negative, got ", rows);
    const std::int64_t expected = rows * shape.elements();
    require(static_cast<std::int64_t>(values.size()) == expected, "from_host got ", values.size(), " values for ",
            rows, " rows of ", shape.elements(), " elements");
    return {.rows = rows, .shape = shape, .values = std::vector<double>(values.begin(), values.end())};
  }

  [[nodiscard]] std::vector<double> to_host(const tensor& x) const {
    check(x, "to_host");
    return x.values;
  }

  [[nodiscard]] std::int64_t rows(const tensor& x) const { return x.rows; }

  /// Rows x[index[0]], x[index[1]], ...; indices may repeat.
  [[nodiscard]] tensor gather_rows(const tensor& x, std::span<const std::int64_t> index) const {
    check(x, "gather_rows");
    const auto elements = static_cast<std::size_t>(x.shape.elements());
    tensor out{.rows = static_cast<std::int64_t>(index.size()), .shape = x.shape, .values = {}};
    out.values.reserve(index.size() * elements);
    for (std::size_t i = 0; i < index.size(); ++i) {
      const std::int64_t row = index[i];
      require(row >= 0 && row < x.rows, "gather_rows index[", i, "] = ", row, " is outside [0, ", x.rows, ")");
      const auto first = x.values.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(row) * elements);
      out.values.insert(out.values.end(), first, first + static_cast<std::ptrdiff_t>(elements));
    }
    return out;
  }

  /// Rows [begin, end).
  [[nodiscard]] tensor slice_rows(const tensor& x, std::int64_t begin, std::int64_t end) const {
    check(x, "slice_rows");
    require(begin >= 0 && begin <= end && end <= x.rows, "slice_rows [", begin, ", ", end,
            ") is not a range inside [0, ", x.rows, ")");
    const auto elements = x.shape.elements();
    return {.rows = end - begin,
            .shape = x.shape,
            .values = std::vector<double>(x.values.begin() + static_cast<std::ptrdiff_t>(begin * elements),
                                          x.values.begin() + static_cast<std::ptrdiff_t>(end * elements))};
  }

  /// The rows of parts[0], parts[1], ... one after another; all parts share one shape.
  [[nodiscard]] tensor concat_rows(std::span<const tensor> parts) const {
    require(!parts.empty(), "concat_rows needs at least one part");
    tensor out{.rows = 0, .shape = parts.front().shape, .values = {}};
    for (std::size_t p = 0; p < parts.size(); ++p) {
      check(parts[p], "concat_rows");
      if (parts[p].shape != out.shape)  // not require(): its message arguments would be built on every call
        fail("concat_rows part ", p, " has rows of shape ", detail::shape_text(parts[p].shape), ", part 0 has ",
             detail::shape_text(out.shape));
      out.rows += parts[p].rows;
      out.values.insert(out.values.end(), parts[p].values.begin(), parts[p].values.end());
    }
    return out;
  }

  /// a * x + c * v, element-wise.
  [[nodiscard]] tensor affine(double a, const tensor& x, double c, const tensor& v) const {
    check_pair(x, v, "affine");
    tensor out{.rows = x.rows, .shape = x.shape, .values = std::vector<double>(x.values.size())};
    for (std::size_t i = 0; i < x.values.size(); ++i) out.values[i] = a * x.values[i] + c * v.values[i];
    return out;
  }

  /// Per row r: mean over elements of log N(next; mean, std[r]^2) (gaussian_log_prob_mean).
  [[nodiscard]] std::vector<double> row_log_prob(const tensor& next, const tensor& mean,
                                                 std::span<const double> std) const {
    check_pair(next, mean, "row_log_prob");
    require(static_cast<std::int64_t>(std.size()) == next.rows, "row_log_prob got ", std.size(),
            " standard deviations for ", next.rows, " rows");
    const auto elements = static_cast<std::size_t>(next.shape.elements());
    const std::span<const double> all_next(next.values), all_mean(mean.values);
    std::vector<double> out(std.size());
    for (std::size_t r = 0; r < std.size(); ++r) {
      require(std::isfinite(std[r]) && std[r] > 0.0, "row_log_prob std[", r, "] = ", std[r],
              " must be positive and finite");
      out[r] = gaussian_log_prob_mean(all_next.subspan(r * elements, elements),
                                      all_mean.subspan(r * elements, elements), std[r]);
    }
    return out;
  }

  friend bool operator==(const host_backend&, const host_backend&) = default;

 private:
  // A hand-assembled host_tensor may be inconsistent; catch it before indexing out of bounds.
  static void check(const tensor& x, const char* operation) {
    validate(x.shape);
    require(x.rows >= 0 && static_cast<std::int64_t>(x.values.size()) == x.rows * x.shape.elements(), operation,
            ": tensor holds ", x.values.size(), " values for ", x.rows, " rows of ", x.shape.elements(),
            " elements");
  }
  static void check_pair(const tensor& x, const tensor& v, const char* operation) {
    check(x, operation);
    check(v, operation);
    if (x.rows != v.rows || x.shape != v.shape)  // not require(): it would build the shape texts every call
      fail(operation, " operands differ: ", x.rows, " rows of ", detail::shape_text(x.shape), " vs ", v.rows,
           " rows of ", detail::shape_text(v.shape));
  }
};

}  // namespace branchgrpo
