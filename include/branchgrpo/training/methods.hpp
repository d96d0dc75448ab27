#pragma once
// Named recipes for the methods compared in the paper. Each is a `method` of concrete component types,
// so a run-time name is dispatched once, at the top, to code that is fully typed below it:
//
//   with_method("branch-widpru", [&](auto recipe) { ... train_iteration(..., recipe, ...) ... });
//
//   dance          DanceGRPO: sequential G = 16 with a shared root, independent noise, leaf-group z-score,
//                  every edge trained (305 evaluations over 20 steps).
//   branch         BranchGRPO: dense tree {0,3,6,9} x 2, correlated noise s = 4 (paper Eq. 2), uniform
//                  fusion, depth-wise advantages per tree, every edge trained (203 evaluations).
//   branch-widpru  branch + width pruning Parent-Top1 after the last split.
//   branch-deppru  branch + depth pruning: a window of 4 depths from the last split, sliding later every
//                  30 iterations.
//   branch-mix     branch + a sliding window of 4 SDE steps (splits always SDE), ODE elsewhere.
// The field's newer samplers (flash_method_names; with_method accepts them too):
//   branch-mix-flash  branch-mix whose ODE runs take three schedule steps per denoiser call, integrated by
//                     DPM-Solver++(2M) (MixGRPO-Flash): 95 evaluations per tree instead of 203.
// Trees that adapt (adaptive_method_names; with_method accepts them too):
//   branch-value     branch + value pruning during the rollout (pruning/value.hpp): at the last split each tree
//                    keeps the 4 of 8 nodes whose x0-hat scores best and stops sampling the others (123 evaluations).
//   branch-dense     branch with dense step rewards (fusion/step_gain.hpp, weight 0.5): x0-hat reward gains per step
//                    beside the leaf mean (the reward is called on every step's frontier).
//   branch-adaptive  the dense tree as an envelope whose splits branch per prompt from its reward spread and gain,
//                    under 120 evaluations per prompt (topology/adaptive_branching.hpp).
//   branch-value-dense  branch-value with branch-dense's fusion: the dense gains recover what the cut loses (on the
//                    toy: branch's gain per iteration at 0.45 of DanceGRPO's time, docs/results.md).
// Decoupled objectives (loss/objective.hpp), trained on the final samples by flow matching, no transition
// log-prob (decoupled_method_names; with_method accepts them too):
//   nft, awm               dance's sequential chains, trained with DiffusionNFT / AWM.
//   branch-nft, branch-awm branch's dense tree, its leaves trained with DiffusionNFT / AWM.
#include <array>
#include <string_view>
#include <vector>

#include "branchgrpo/advantage/depth_wise.hpp"
#include "branchgrpo/advantage/leaf_group.hpp"
#include "branchgrpo/correlator/correlated.hpp"
#include "branchgrpo/correlator/independent.hpp"
#include "branchgrpo/fusion/step_gain.hpp"
#include "branchgrpo/fusion/uniform_mean.hpp"
#include "branchgrpo/pruning/depth_window.hpp"
#include "branchgrpo/pruning/keep_all.hpp"
#include "branchgrpo/pruning/parent_top_k.hpp"
#include "branchgrpo/pruning/sde_window.hpp"
#include "branchgrpo/pruning/value.hpp"
#include "branchgrpo/schedule/steppers.hpp"
#include "branchgrpo/topology/adaptive_branching.hpp"
#include "branchgrpo/topology/sequential.hpp"
#include "branchgrpo/topology/split_schedule.hpp"
#include "branchgrpo/training/trainer.hpp"

namespace branchgrpo {

/// The names with_method accepts, dance first.
inline constexpr std::array<std::string_view, 5> method_names = {"dance", "branch", "branch-widpru", "branch-deppru",
                                                                 "branch-mix"};

/// The methods with a decoupled objective, which with_method accepts besides method_names. Kept apart so that what
/// runs every method of the paper (toy --compare, demo, the config's method_recipe) keeps running those five.
inline constexpr std::array<std::string_view, 4> decoupled_method_names = {"nft", "awm", "branch-nft", "branch-awm"};

/// The methods on the field's newer samplers, which with_method accepts besides method_names (kept apart for the
/// same reason as decoupled_method_names).
inline constexpr std::array<std::string_view, 1> flash_method_names = {"branch-mix-flash"};

/// The methods whose trees adapt during or between rollouts, which with_method accepts besides method_names (kept
/// apart for the same reason as decoupled_method_names).
inline constexpr std::array<std::string_view, 4> adaptive_method_names = {"branch-value", "branch-dense",
                                                                          "branch-adaptive", "branch-value-dense"};

/// Every name with_method accepts: method_names, decoupled_method_names, flash_method_names, adaptive_method_names.
inline std::vector<std::string_view> named_methods() {
  std::vector<std::string_view> names(method_names.begin(), method_names.end());
  names.insert(names.end(), decoupled_method_names.begin(), decoupled_method_names.end());
  names.insert(names.end(), flash_method_names.begin(), flash_method_names.end());
  names.insert(names.end(), adaptive_method_names.begin(), adaptive_method_names.end());
  return names;
}

/// DanceGRPO (the "dance" method).
inline auto dance_method() {
  return method{sequential{.group_size = 16, .shared_root = true},
                dance_sde{},
                independent{},
                uniform_mean{},
                leaf_group{},
                keep_all{}};
}

/// BranchGRPO with `pruner` ("branch" with keep_all; the pruned variants with the pruner of their name).
template <Pruner P = keep_all>
auto branch_method(P pruner = {}) {
  return method{split_schedule::dense(), dance_sde{}, correlated{.s = 4.0}, uniform_mean{}, depth_wise{}, pruner};
}

/// `recipe` with its objective replaced by `objective`.
template <Topology T, Stepper S, NoiseCorrelator C, Fusion F, Normalizer N, Pruner P, Objective O, Objective Other>
auto with_objective(const method<T, S, C, F, N, P, O>& recipe, Other objective) {
  return method{recipe.topology,   recipe.stepper, recipe.correlator, recipe.fusion,
                recipe.normalizer, recipe.pruner,  objective};
}

/// Calls `body(recipe)` with the recipe named `name`; returns what body returns.
/// Example: with_method("dance", [](auto r) { return r.topology(20).evaluations(); }) == 305.
/// @pre name is one of method_names, decoupled_method_names, flash_method_names or adaptive_method_names (else
///      invalid_input naming it).
template <class Body>
decltype(auto) with_method(std::string_view name, Body&& body) {
  if (name == "dance") return body(dance_method());
  if (name == "branch") return body(branch_method());
  if (name == "branch-widpru") return body(branch_method(parent_top_k{.k = 1}));
  if (name == "branch-deppru") return body(branch_method(depth_window{}));
  if (name == "branch-mix") return body(branch_method(sde_window{}));
  if (name == "branch-mix-flash")
    // ode_stride 3: the toy's held-out reward stays within branch-mix's interval at 2, 3 and 4 (docs/results.md), and
    // 3 is the first at 0.2x DanceGRPO's transformer FLOPs per iteration.
    return body(branch_method(sde_window{.ode_stride = 3, .solver = ode_solver::dpm_solver_2m}));
  if (name == "branch-value") return body(branch_method(value_prune{}));
  if (name == "branch-dense")
    return body(
        method{split_schedule::dense(), dance_sde{}, correlated{.s = 4.0}, step_gain{}, depth_wise{}, keep_all{}});
  if (name == "branch-value-dense")
    return body(
        method{split_schedule::dense(), dance_sde{}, correlated{.s = 4.0}, step_gain{}, depth_wise{}, value_prune{}});
  if (name == "branch-adaptive")
    return body(
        method{adaptive_branching{}, dance_sde{}, correlated{.s = 4.0}, uniform_mean{}, depth_wise{}, keep_all{}});
  if (name == "nft") return body(with_objective(dance_method(), diffusion_nft{}));
  if (name == "awm") return body(with_objective(dance_method(), advantage_weighted_matching{}));
  if (name == "branch-nft") return body(with_objective(branch_method(), diffusion_nft{}));
  if (name == "branch-awm") return body(with_objective(branch_method(), advantage_weighted_matching{}));
  fail("unknown method '", name, "' (expected ", name_list(named_methods()), ")");
}

}  // namespace branchgrpo
