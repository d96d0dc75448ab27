#pragma once
#include <cstddef>
#include <span>
#include <string_view>

#include "branchgrpo/correlator/concept.hpp"
#include "branchgrpo/correlator/sibling_rows.hpp"

namespace branchgrpo {

/// Independent siblings: child b gets its own keyed N(0, 1) draw, exactly as a chain edge would.
/// Example: children keys {seed 7, node 1} and {seed 7, node 2} (other fields 0), elements 2 ->
///   out = {keyed_normal(child 0, 0), keyed_normal(child 0, 1), keyed_normal(child 1, 0),
///          keyed_normal(child 1, 1)} = {-1.057266, -1.515668, 0.867662, 0.734200} (6 digits); returns 1.
/// @pre K = group.children.size() >= 2, group.elements >= 1, out.size() == K * group.elements.
/// @post row b depends on children[b] only; every row is N(0, I); returns 1.
struct independent {
  double operator()(const sibling_group& group, std::span<double> out) const {
    const std::size_t k = detail::check_sibling_group(group, out, "independent");
    for (std::size_t b = 0; b < k; ++b) detail::fill_own_row(group, b, out);
    return 1.0;
  }
  friend bool operator==(const independent&, const independent&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "independent", summary = "each child its own draw (the plain SDE)";
};

}  // namespace branchgrpo
