#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/pruning/concept.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// BranchGRPO DepPru: skip back-propagation through a window of edge depths (edge depth = depth of the
/// edge's parent = step of the transition). Every SDE edge outside the window is trained; with
/// keep_window the roles swap and only the window is trained. ODE edges are never trained.
///
/// If `depths` is non-empty it is the window, fixed (width, start, every, direction, stop are ignored).
/// Otherwise the window at iteration i is [w, w + width) with
///   w = start + direction * (i / every),   start == -1 meaning the last split depth (0 without splits),
/// held at `stop` (w never passes it; -1: no stop) and clamped to [0, steps - width].
///   paper  (defaults):   start -1, direction +1, width 4, every 30: [9, 13) on the dense 20-step tree,
///                        one step later every 30 iterations, up to [16, 20).
///   official code:       child depths 15..18 sliding down to the last split 9 is, in edge depths,
///                        {.start = 14, .direction = -1, .stop = 8} (the code counts the child's depth).
///
/// Example: tree {steps 4, splits {0, 2}, K 2} (nodes 0 | 1 2 | 3 4 | 5 6 7 8 | 9 10 11 12, edge depth of
/// node n = depth(n) - 1) and depth_window{.width = 2, .start = 1, .every = 1}:
///   iteration 0 -> window [1, 3) -> mask {0, 1,1, 0,0, 0,0,0,0, 1,1,1,1};
///   iteration 1 -> window [2, 4) -> mask {0, 1,1, 1,1, 0,0,0,0, 0,0,0,0}; iteration 9 -> clamped to [2, 4).
///   depth_window{.depths = {0, 3}} -> mask {0, 0,0, 1,1, 1,1,1,1, 0,0,0,0} at every iteration.
/// @pre depths in [0, steps); otherwise 1 <= width <= steps, every >= 1, direction in {+1, -1},
///      -1 <= start < steps, -1 <= stop < steps; context.iteration >= 0.
/// @post mask[n] == 1 only for a non-root SDE edge; window(tree, iteration) gives the window's depths.
struct depth_window {
  std::vector<int> depths = {};  ///< fixed set of edge depths; empty: the sliding window below
  int width = 4;
  int start = -1;            ///< first depth of the window at iteration 0; -1: the last split depth
  int every = 30;            ///< iterations per one-depth slide
  int direction = +1;        ///< +1: slide to later steps (paper); -1: to earlier steps (official code)
  int stop = -1;             ///< the window's first depth never passes this depth; -1: no stop
  bool keep_window = false;  ///< false: prune the window (paper, code); true: train only the window

  /// The edge depths of the window at `iteration` (sorted, distinct).
  [[nodiscard]] std::vector<int> window(const rollout_tree& tree, int iteration) const {
    const int steps = tree.steps();
    if (!depths.empty()) {
      for (const int d : depths)
        require(d >= 0 && d < steps, "depth_window depth ", d, " is not an edge depth in [0, ", steps, ")");
      std::vector<int> fixed = depths;
      std::sort(fixed.begin(), fixed.end());
      fixed.erase(std::unique(fixed.begin(), fixed.end()), fixed.end());
      return fixed;
    }
    require(width >= 1 && width <= steps, "depth_window width ", width, " is not in [1, ", steps, "]");
    require(every >= 1, "depth_window every ", every, " is below 1");
    require(direction == 1 || direction == -1, "depth_window direction ", direction, " is not +1 or -1");
    require(start >= -1 && start < steps, "depth_window start ", start, " is not -1 or in [0, ", steps, ")");
    require(stop >= -1 && stop < steps, "depth_window stop ", stop, " is not -1 or in [0, ", steps, ")");
    require(iteration >= 0, "depth_window iteration ", iteration, " is negative");
    // 64-bit: start + iteration / every cannot overflow.
    std::int64_t first = start == -1 ? std::max(tree.last_split_depth(), 0) : start;
    first += static_cast<std::int64_t>(direction) * (iteration / every);
    if (stop != -1) first = direction > 0 ? std::min<std::int64_t>(first, stop) : std::max<std::int64_t>(first, stop);
    first = std::clamp<std::int64_t>(first, 0, steps - width);
    std::vector<int> result(static_cast<std::size_t>(width));
    for (int i = 0; i < width; ++i) result[static_cast<std::size_t>(i)] = static_cast<int>(first) + i;
    return result;
  }

  edge_mask operator()(const rollout_tree& tree, const prune_context& context) const {
    const auto inside = window(tree, context.iteration);
    std::vector<bool> in_window(static_cast<std::size_t>(tree.steps()), false);
    for (const int d : inside) in_window[static_cast<std::size_t>(d)] = true;
    edge_mask mask(static_cast<std::size_t>(tree.node_count()), 0);
    for (std::int32_t n = 0; n < tree.node_count(); ++n) {
      if (tree.is_root(n) || tree.kind(n) != edge_kind::sde) continue;
      const bool windowed = in_window[static_cast<std::size_t>(tree.depth(n) - 1)];
      mask[static_cast<std::size_t>(n)] = windowed == keep_window ? 1 : 0;
    }
    return mask;
  }

  friend bool operator==(const depth_window&, const depth_window&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "depth_window",
                                    summary = "depth: prune a window of depths sliding over training";
  static constexpr auto parameters() {
    return std::tuple{
        parameter("depths", &depth_window::depths, "fixed edge depths to prune; empty = the sliding window",
                  rules::each_at_least{0}),
        parameter("width", &depth_window::width, "depths in the sliding window", rules::at_least{1}),
        parameter("start", &depth_window::start, "first depth of the window at iteration 0; -1 = the last split depth",
                  rules::at_least{-1}),
        parameter("every", &depth_window::every, "iterations per one-depth slide", rules::at_least{1}),
        parameter("direction", &depth_window::direction,
                  "+1 slides to later steps (paper), -1 to earlier (official code)", rules::sign{}),
        parameter("stop", &depth_window::stop, "the window never passes this depth; -1 = no stop", rules::at_least{-1}),
        parameter("keep_window", &depth_window::keep_window, "true trains only the window instead of pruning it",
                  rules::any{})};
  }
};

}  // namespace branchgrpo
