#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string_view>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/correlator/concept.hpp"
#include "branchgrpo/correlator/sibling_rows.hpp"

namespace branchgrpo {

namespace detail {

inline double row_dot(std::span<const double> a, std::span<const double> b) {
  double sum = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace detail

/// Orthogonal siblings: the K own draws x_b (keys children[b], stream edge) are orthogonalized by modified
/// Gram-Schmidt in child order, and each result is rescaled to the norm |x_b| of its own draw. A row alone
/// is then exactly N(0, I): a chi-distributed norm times a direction that is uniform by rotation symmetry
/// and independent of that norm. Returns 1. Only `elements` rows can be orthogonal in `elements`
/// dimensions: if K > elements, rows [elements, K) are left as their independent draws.
/// Each row is projected twice (one re-orthogonalization pass) so orthogonality holds to rounding even
/// when K is close to elements.
/// Example: K 2, elements 2, the keys of independent's example: x_0 = {-1.057266, -1.515668},
///   x_1 = {0.867662, 0.734200}; v_1 = x_1 - (x_0.x_1 / x_0.x_0) x_0 = x_1 + 0.594470 x_0
///   = {0.239149, -0.166820}; |x_1| = 1.136612, |v_1| = 0.291584;
///   out = {x_0, v_1 |x_1| / |v_1|} = {-1.057266, -1.515668, 0.932217, -0.650275} (6 digits); returns 1.
/// @pre K = group.children.size() >= 2, group.elements >= 1, out.size() == K * group.elements.
/// @post rows 0 .. min(K, elements) - 1 are pairwise orthogonal (to rounding); |row b| == |x_b|;
///       row 0 == x_0; rows >= elements == their own draws; returns 1.
struct orthogonal {
  double operator()(const sibling_group& group, std::span<double> out) const {
    const std::size_t k = detail::check_sibling_group(group, out, "orthogonal");
    const std::size_t n = group.elements;
    for (std::size_t b = 0; b < k; ++b) detail::fill_own_row(group, b, out);
    for (std::size_t b = 1; b < std::min(k, n); ++b) {
      const std::span<double> row = detail::sibling_row(out, b, n);
      const double norm = std::sqrt(detail::row_dot(row, row));
      for (int pass = 0; pass < 2; ++pass) {
        for (std::size_t j = 0; j < b; ++j) {
          const std::span<const double> earlier = detail::sibling_row(out, j, n);
          const double coefficient = detail::row_dot(earlier, row) / detail::row_dot(earlier, earlier);
          for (std::size_t i = 0; i < n; ++i) row[i] -= coefficient * earlier[i];
        }
      }
      const double residual = std::sqrt(detail::row_dot(row, row));
      // Zero only if draw b lies in the span of the earlier draws: probability 0, but never divide by it.
      require(residual > 0.0 && std::isfinite(residual), "orthogonal: draw of child ", b,
              " is linearly dependent on the earlier children's draws (residual norm ", residual, ")");
      const double rescale = norm / residual;
      for (double& value : row) value *= rescale;
    }
    return 1.0;
  }
  friend bool operator==(const orthogonal&, const orthogonal&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "orthogonal",
                                    summary = "Gram-Schmidt orthogonalized draws (K >= 3, small latents)";
};

}  // namespace branchgrpo
