#pragma once
#include <cstddef>
#include <span>
#include <string_view>

#include "branchgrpo/correlator/concept.hpp"
#include "branchgrpo/correlator/sibling_rows.hpp"

namespace branchgrpo {

/// Antithetic pairs: child 2j draws its own eps (its key, stream edge) and child 2j + 1 gets -eps, so each
/// pair explores both sides of the mean; with odd K the last child draws its own independent noise.
/// Every row is still N(0, I) (returns 1); paired rows correlate by -1, rows of different pairs by 0.
/// Example: K 3, elements 2, the first two children of independent's example and a third {seed 7, node 3}
///   -> out = {-1.057266, -1.515668, 1.057266, 1.515668, -0.324166, -1.848057} (6 digits);
///   row 1 == -row 0 exactly; returns 1.
/// @pre K = group.children.size() >= 2, group.elements >= 1, out.size() == K * group.elements.
/// @post row 2j + 1 == -row 2j element-wise; for odd K the last row is its own keyed draw; returns 1.
struct antithetic {
  double operator()(const sibling_group& group, std::span<double> out) const {
    const std::size_t k = detail::check_sibling_group(group, out, "antithetic");
    for (std::size_t b = 0; b < k; b += 2) {
      detail::fill_own_row(group, b, out);
      if (b + 1 == k) break;
      const std::span<const double> first = detail::sibling_row(out, b, group.elements);
      const std::span<double> second = detail::sibling_row(out, b + 1, group.elements);
      for (std::size_t i = 0; i < group.elements; ++i) second[i] = -first[i];
    }
    return 1.0;
  }
  friend bool operator==(const antithetic&, const antithetic&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "antithetic", summary = "pairs of opposite draws (even K)";
};

}  // namespace branchgrpo
