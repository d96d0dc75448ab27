#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/pruning/concept.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"
#include "branchgrpo/tree/tree_plan.hpp"

namespace branchgrpo {

/// A half-open range of steps (or edge depths) [begin, end).
struct step_window {
  int begin = 0;
  int end = 0;
  [[nodiscard]] bool contains(int step) const { return step >= begin && step < end; }
  friend bool operator==(const step_window&, const step_window&) = default;
};

/// MixGRPO / BranchGRPO-Mix: a sliding window of SDE steps, ODE elsewhere. At iteration i the window is
///   [w, w + width),   w = start + stride * (i / every), clamped to [0, steps - width]
/// (clamped, not wrapped: once it reaches the last steps it stays there).
/// shape(plan, i) makes the steps inside the window and every split step (branching > 1, so the tree stays
/// branched) SDE and the others ODE: the rollout gets cheaper. The call operator trains the SDE edges of the
/// tree inside the window, and also the SDE split edges outside it when train_splits (the default; the
/// paper and the official code train every SDE edge). ODE edges are never trained.
/// The official code's window does not slide across training: it is {0 .. width - 1} plus the splits, i.e.
/// sde_window{.width = 4, .every = huge}.
///
/// Example: split_schedule::dense() over 20 steps and sde_window{.width = 4, .start = 0, .every = 1}:
///   shape(plan, 0)   -> SDE at steps {0, 1, 2, 3, 6, 9}, ODE elsewhere;
///   shape(plan, 5)   -> SDE at {0, 3, 5, 6, 7, 8, 9};
///   shape(plan, 100) -> window clamped to [16, 20): SDE at {0, 3, 6, 9, 16, 17, 18, 19}.
/// Tree {steps 4, splits {0, 2}, K 2} shaped by sde_window{.width = 1, .start = 1} at iteration 0: kinds
/// {sde, sde, sde, ode}; nodes 0 | 1 2 | 3 4 | 5 6 7 8 | 9 10 11 12 (edge depth = depth - 1):
///   mask {0, 1,1, 1,1, 1,1,1,1, 0,0,0,0}; with .train_splits = false -> {0, 0,0, 1,1, 0,0,0,0, 0,0,0,0}.
///
/// MixGRPO-Flash (arXiv 2507.21802) also makes the ODE part cheaper: with ode_stride m > 1, each maximal run of
/// ODE steps [a, e) is evaluated at a, a + m, a + 2m, ... only; the steps between become skip edges (no denoiser
/// call; tree_plan::ode_target), and solver (set on the plan: tree_plan::ode) integrates each longer step,
/// DPM-Solver++(2M) as MixGRPO-Flash does. The window and the splits stay at full resolution.
/// Example: the dense tree above with sde_window{.ode_stride = 2, .solver = ode_solver::dpm_solver_2m} at
///   iteration 0 -> kinds sde at {0, 1, 2, 3, 6, 9}, ode at {4, 7, 10, 12, 14, 16, 18}, skip at {5, 8, 11, 13, 15,
///   17, 19}; plan.ode dpm_solver_2m; 111 evaluations instead of 203.
/// @pre 1 <= width <= steps, every >= 1, stride >= 0, 0 <= start <= steps - width, iteration >= 0, ode_stride >= 1;
///      a multistep solver needs a stretch of ode_stride + 1 steps without a split, an ode_stride > 1 one of 2 (else
///      invalid_input: the solver cannot serve the topology).
/// @post shape keeps steps, roots and branching; mask[n] == 1 only for a non-root SDE edge.
struct sde_window {
  int width = 4;
  int start = 0;
  int every = 1;   ///< iterations per slide
  int stride = 1;  ///< steps per slide
  bool train_splits = true;
  int ode_stride = 1;                     ///< schedule steps per denoiser call on the ODE runs (MixGRPO-Flash)
  ode_solver solver = ode_solver::euler;  ///< how the ODE edges are integrated

  /// The window at `iteration` for `steps` denoising steps.
  [[nodiscard]] step_window window(int steps, int iteration) const {
    require(width >= 1 && width <= steps, "sde_window width ", width, " is not in [1, ", steps, "]");
    require(every >= 1, "sde_window every ", every, " is below 1");
    require(stride >= 0, "sde_window stride ", stride, " is negative");
    require(start >= 0, "sde_window start ", start, " is negative");
    // The window slides towards the last steps and stays there; a start past them is a typo, not a window.
    require(start <= steps - width, "sde_window start ", start, " leaves no room for width ", width, " in ", steps,
            " steps (at most ", steps - width, ")");
    require(iteration >= 0, "sde_window iteration ", iteration, " is negative");
    // 64-bit: stride * (iteration / every) may exceed int.
    const std::int64_t first =
        std::min<std::int64_t>(start + static_cast<std::int64_t>(stride) * (iteration / every), steps - width);
    return {static_cast<int>(first), static_cast<int>(first) + width};
  }

  tree_plan shape(const tree_plan& plan, int iteration) const {
    validate(plan);
    const auto inside = window(plan.steps, iteration);
    require(ode_stride >= 1, "sde_window ode_stride ", ode_stride, " is below 1");
    // Whether the topology can serve the ODE options at all, whatever the window's position: a multistep solver
    // needs two evaluated steps in one stretch without a split (else it is Euler under another name), a stride
    // needs two steps to compress. A window that momentarily leaves shorter runs only lowers the order there.
    int longest_stretch = 0;
    for (int s = 0, stretch = 0; s < plan.steps; ++s) {
      stretch = plan.branching[static_cast<std::size_t>(s)] > 1 ? 0 : stretch + 1;
      longest_stretch = std::max(longest_stretch, stretch);
    }
    if (solver == ode_solver::dpm_solver_2m)
      require(longest_stretch >= ode_stride + 1, "sde_window solver dpm_solver_2m cannot serve this topology: its ",
              "longest stretch of steps without a split is ", longest_stretch, ", a second-order step at ode_stride ",
              ode_stride, " needs ", ode_stride + 1);
    else
      require(ode_stride == 1 || longest_stretch >= 2, "sde_window ode_stride ", ode_stride,
              " cannot serve this topology: it has no two steps in a row without a split");
    tree_plan shaped = plan;
    shaped.ode = solver;
    for (int s = 0, run = 0; s < plan.steps; ++s) {
      const auto at = static_cast<std::size_t>(s);
      const bool sde = inside.contains(s) || plan.branching[at] > 1;
      run = sde ? 0 : run + 1;  // position in the current ODE run, from 1
      shaped.kinds[at] = sde ? edge_kind::sde : (run - 1) % ode_stride == 0 ? edge_kind::ode : edge_kind::skip;
    }
    return shaped;
  }

  edge_mask operator()(const rollout_tree& tree, const prune_context& context) const {
    const auto inside = window(tree.steps(), context.iteration);
    const auto& branching = tree.plan().branching;
    edge_mask mask(static_cast<std::size_t>(tree.node_count()), 0);
    for (std::int32_t n = 0; n < tree.node_count(); ++n) {
      if (tree.is_root(n) || tree.kind(n) != edge_kind::sde) continue;
      const int edge_depth = tree.depth(n) - 1;
      const bool split = branching[static_cast<std::size_t>(edge_depth)] > 1;
      mask[static_cast<std::size_t>(n)] = inside.contains(edge_depth) || (train_splits && split) ? 1 : 0;
    }
    return mask;
  }

  friend bool operator==(const sde_window&, const sde_window&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "sde_window", summary = "MixGRPO: a sliding SDE window, ODE elsewhere";
  static constexpr auto parameters() {
    return std::tuple{parameter("width", &sde_window::width, "SDE steps in the window", rules::at_least{1}),
                      parameter("start", &sde_window::start, "first window step at iteration 0", rules::at_least{0}),
                      parameter("every", &sde_window::every, "iterations per slide", rules::at_least{1}),
                      parameter("stride", &sde_window::stride, "steps per slide", rules::at_least{0}),
                      parameter("train_splits", &sde_window::train_splits,
                                "split edges outside the window stay SDE and are trained", rules::any{}),
                      parameter("ode_stride", &sde_window::ode_stride,
                                "schedule steps per denoiser call on the ODE runs (MixGRPO-Flash)", rules::at_least{1}),
                      parameter("solver", &sde_window::solver, "how the ODE edges are integrated")};
  }
};

}  // namespace branchgrpo
