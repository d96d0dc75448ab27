#pragma once
// One recipe type for every run-time choice of components: each family's choice is its catalog's any_policy
// (core/policy_list.hpp), so train_iteration is instantiated once for every configuration. The run config's reader
// (adapters/config: run_config.hpp) fills it from TOML, the Python package (python/src/method.hpp) from keyword
// sections; both set each policy through its parameters(), so the keys and their rules are described once.
//
//   run_normalizer          the advantage stage: a normalizer, or per_reward over the run's fusion and that normalizer
//   run_recipe              method<any_topology, any_stepper, any_correlator, any_fusion, run_normalizer, any_pruner,
//                           any_objective>
//   method_recipe(name)     with_method's recipe `name` as a run_recipe
//   same_recipe(a, b)       whether two run recipes hold equal components
#include <string_view>
#include <type_traits>

#include "branchgrpo/advantage/catalog.hpp"
#include "branchgrpo/advantage/per_reward.hpp"
#include "branchgrpo/core/state.hpp"
#include "branchgrpo/correlator/catalog.hpp"
#include "branchgrpo/fusion/catalog.hpp"
#include "branchgrpo/loss/objective.hpp"
#include "branchgrpo/pruning/catalog.hpp"
#include "branchgrpo/schedule/stepper_catalog.hpp"
#include "branchgrpo/topology/catalog.hpp"
#include "branchgrpo/training/methods.hpp"
#include "branchgrpo/training/trainer.hpp"

namespace branchgrpo {

// Each family's run-time choice is its catalog's any_policy (core/policy_list.hpp: any_topology, any_stepper,
// any_correlator, any_fusion, any_normalizer) and the pruners a run-time list (any_pruner = active_for<all_in<...>>).

/// The run's advantage stage ([advantage]): `normalizer` (its kind) on the weighted sum of the [[rewards]], or,
/// with per_reward = true, per_reward over the run's [fusion] and that normalizer: each [[rewards]] entry fused and
/// normalized on its own, the advantages summed with the entries' weights (MixGRPO's advantage_aggr;
/// docs/advantage.md). A Normalizer; its state (per_prompt_running's buffers, per part with per_reward) reaches
/// checkpoints through save_state / load_state.
struct run_normalizer {
  any_normalizer normalizer{};
  bool per_reward = false;
  /// The per-reward stage, used when per_reward: its fusion is the run's (use_fusion), its normalizer `normalizer`.
  branchgrpo::per_reward<any_fusion, any_normalizer> parts{};

  /// Sets the fusion each part is fused with: the run's [fusion] (the config reader calls it).
  void use_fusion(const any_fusion& fusion) { parts.fusion = fusion; }

  std::vector<double> operator()(const rollout_tree& tree, const reward_view& rewards) {
    if (!per_reward) return normalizer(tree, rewards);
    if (parts.parts.empty()) parts.normalizer = normalizer;  // the parts are made from [advantage]'s policy
    return parts(tree, rewards);
  }

  [[nodiscard]] component_state save_state() const { return per_reward ? parts.save_state() : normalizer.save_state(); }
  void load_state(const component_state& state) {
    if (!per_reward) return normalizer.load_state(state);
    parts.normalizer = normalizer;
    parts.load_state(state);
  }

  friend bool operator==(const run_normalizer& a, const run_normalizer& b) {
    return a.normalizer == b.normalizer && a.per_reward == b.per_reward && a.parts.fusion == b.parts.fusion;
  }
};

/// The run's recipe: one method type for every configuration.
using run_recipe =
    method<any_topology, any_stepper, any_correlator, any_fusion, run_normalizer, any_pruner, any_objective>;

/// Whether two run recipes hold equal components (method itself has no operator==).
inline bool same_recipe(const run_recipe& a, const run_recipe& b) {
  return a.topology == b.topology && a.stepper == b.stepper && a.correlator == b.correlator && a.fusion == b.fusion &&
         a.normalizer == b.normalizer && a.pruner == b.pruner && a.objective == b.objective;
}

/// with_method's recipe `name` as a run_recipe (same components, same parameters).
/// Example: method_recipe("dance").topology(20).evaluations() == 305.
/// Example: method_recipe("branch-nft").objective.name() == "nft".
/// @pre name is one of method_names, decoupled_method_names or flash_method_names (else invalid_input naming it).
inline run_recipe method_recipe(std::string_view name) {
  return with_method(name, [&](auto recipe) {
    run_recipe out;
    out.topology.policy = recipe.topology;
    out.stepper.policy = recipe.stepper;
    out.correlator.policy = recipe.correlator;
    out.fusion.policy = recipe.fusion;
    out.normalizer.normalizer.policy = recipe.normalizer;
    out.normalizer.use_fusion(out.fusion);
    if constexpr (!std::is_same_v<decltype(recipe.pruner), keep_all>) out.pruner.pruner.pruners = {recipe.pruner};
    out.objective.policy = recipe.objective;
    return out;
  });
}

}  // namespace branchgrpo
