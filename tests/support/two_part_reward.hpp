#pragma once
// A ComponentReward on the toy for the trainer's tests: the mode reward r as two weighted parts, r (weight 1) and
// r^2 (weight 0.5), whose parts per_reward advantages normalize one by one.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "branchgrpo/toy.hpp"

namespace branchgrpo::testing {

/// Scores r + 0.5 r^2 per leaf and reports the parts {"mode", 1, r} and {"squared", 0.5, r^2}. With
/// failed_tree >= 0 the first leaf of that tree scores NaN in both parts, so the trainer drops the tree.
/// Example: r = 0.5 -> 0.625, parts {0.5} and {0.25}.
struct two_part_reward {
  std::int64_t failed_tree = -1;
  mode_reward<> mode = {};
  std::vector<reward_component> parts = {};

  std::vector<double> operator()(const host_tensor& leaves, std::span<const std::int64_t> prompts,
                                 const leaf_groups& groups) {
    std::vector<double> r = mode(leaves, prompts);
    if (failed_tree >= 0)
      r[static_cast<std::size_t>(failed_tree * groups.leaves_per_tree)] = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> squared(r.size()), total(r.size());
    for (std::size_t i = 0; i < r.size(); ++i) {
      squared[i] = r[i] * r[i];
      total[i] = r[i] + 0.5 * squared[i];
    }
    parts = {{.name = "mode", .weight = 1.0, .rows = r}, {.name = "squared", .weight = 0.5, .rows = squared}};
    return total;
  }
  [[nodiscard]] std::span<const reward_component> last_component_rows() const { return parts; }
};

}  // namespace branchgrpo::testing
