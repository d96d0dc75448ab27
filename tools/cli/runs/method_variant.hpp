#pragma once
// A named method with ablation overrides, as `compare --methods` and `gradient-signal --methods` take it: the
// method's name, then `:key=value` parts that each change one thing, so an ablation switches one candidate cause at
// a time:
//
//   branch                        the named recipe as it is
//   branch:scope=per_batch        depth-wise statistics over every tree of the iteration, not per tree
//   branch:scope=pooled           each tree's own mean, the std pooled over the iteration's trees
//   branch:scope=leaf_scaled      each tree's own mean, divided by the std of the tree's leaves
//   branch:s=1                    correlated siblings with s = 1 (correlation 1 / (1 + s^2) = 0.5)
//   branch:fusion=path_softmax    another fusion weighting (fusion/catalog.hpp)
//   branch:stepper=cps            another stepper, with its default parameters (schedule/stepper_catalog.hpp)
//   branch:objective=dppo         another objective, with its default parameters (loss/objective.hpp)
//   dance:updates=4               4 optimizer steps per iteration (the trained edges split in 4 groups)
//   branch:lr=0.05                another learning rate (the toy's Adam, the shapes model's AdamW)
//   branch:ratio_norm=on          GRPO-Guard's RatioNorm of the importance ratio (ppo_options::ratio_norm)
//   branch:step_weight=noise_std  a per-step loss weight (ppo_options::step_weight: inverse_dt, noise_std, equal_steps)
//   branch-nft:intermediate=1     a decoupled objective also trained on the tree's internal split nodes
//   branch-mix-flash:ode_stride=3 an sde_window's schedule steps per ODE call (MixGRPO-Flash's compression)
//   branch-mix-flash:solver=euler an sde_window's ODE solver (euler or dpm_solver_2m)
//
// The keys, their values and what each changes are one table (cli/runs/method_overrides.hpp); here the entry is
// parsed, and the toy's runs get the variant's recipe with the table applied (make_variant_run). The shapes model's
// runs apply the same table to their run_config (commands/compare.cpp). Torch-free: the toy uses it without LibTorch.
#include <algorithm>
#include <string>
#include <string_view>
#include <utility>

#include "branchgrpo/advantage/catalog.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/correlator/catalog.hpp"
#include "branchgrpo/fusion/catalog.hpp"
#include "branchgrpo/loss/objective.hpp"
#include "branchgrpo/loss/ppo.hpp"
#include "branchgrpo/pruning/catalog.hpp"
#include "branchgrpo/pruning/keep_all.hpp"
#include "branchgrpo/schedule/stepper_catalog.hpp"
#include "branchgrpo/topology/catalog.hpp"
#include "branchgrpo/training/methods.hpp"
#include "cli/runs/method_overrides.hpp"

namespace branchgrpo::cli {

/// One entry of `--methods`: a named method and what it overrides (the method_overrides fields; unset: the
/// method's own).
struct method_variant : method_overrides {
  std::string label;   ///< the entry as given: the method's name in tables, files and JSON
  std::string method;  ///< one of named_methods()

  /// Whether it is the named method unchanged.
  [[nodiscard]] bool plain() const { return label == method; }
};

/// Parses one `--methods` entry.
/// Example: parse_method_variant("branch:scope=per_batch:s=1") == {.label = "branch:scope=per_batch:s=1",
///   .method = "branch", .scope = per_batch, .correlation_s = 1}; parse_method_variant("dance") is plain.
/// @pre the name is one of named_methods(); each part is key=value with
///      a key of override_table, at most once, and a value in its domain (method_overrides.hpp); no ratio_norm = on
///      or step_weight other than none on a decoupled method (else invalid_input naming the part).
inline method_variant parse_method_variant(std::string_view entry) {
  method_variant out;
  out.label = std::string(entry);
  std::size_t colon = entry.find(':');
  out.method = std::string(entry.substr(0, colon));
  const std::vector<std::string_view> names = named_methods();
  require(std::find(names.begin(), names.end(), out.method) != names.end(), "--methods: unknown method '", out.method,
          "' in '", entry, "' (expected ", name_list(names), ", optionally followed by :key=value overrides)");
  while (colon != std::string_view::npos) {
    const std::size_t next = entry.find(':', colon + 1);
    const std::string_view part = entry.substr(colon + 1, next == std::string_view::npos ? next : next - colon - 1);
    colon = next;
    const std::size_t equals = part.find('=');
    require(equals != std::string_view::npos && equals > 0, "--methods: '", part, "' in '", entry,
            "' is not key=value (keys: ", name_list(override_keys(), ", "), ")");
    const std::string_view key = part.substr(0, equals);
    const std::string what = "--methods " + std::string(entry) + ": " + std::string(key);
    if (!read_override(out, key, std::string(part.substr(equals + 1)), what, entry))
      fail("--methods: unknown key '", key, "' in '", entry, "' (expected ", name_list(override_keys()), ")");
  }
  // The loss options that act on a transition, beside an objective that trains none: the trainer's one rule.
  any_objective objective = with_method(out.method, [](auto r) { return any_objective{r.objective}; });
  if (out.objective) objective.policy = make_policy<objective_policies>(*out.objective);
  const std::string conflict =
      transition_option_conflict(objective,
                                 ppo_options{.ratio_norm = out.ratio_norm.value_or(false),
                                             .step_weight = out.step_weight.value_or(step_weighting::none)},
                                 option_spelling::cpp);
  require(conflict.empty(), "--methods ", entry, ": ", conflict);
  return out;
}

/// The recipe of a run whose components are chosen at run time: every family's any_ type, so that any override
/// fits in its slot and one train_iteration serves every method.
using variant_recipe =
    method<any_topology, any_stepper, any_correlator, any_fusion, any_normalizer, any_pruner, any_objective>;

/// A torch-free run of a variant (the toy's): its recipe and the settings the overrides change.
struct variant_run {
  variant_recipe recipe;
  int updates = 1;        ///< optimizer steps per iteration
  double lr = 0;          ///< the optimizer's learning rate: the caller's default unless overridden
  ppo_options loss = {};  ///< the loss options
};

/// with_method's recipe of variant.method, erased (same components, same parameters), with the variant's
/// overrides applied, and `lr` unless the variant overrides it.
/// Example: make_variant_run(parse_method_variant("branch:s=1:updates=4"), 0.1) holds correlated{.s = 1} in
///   recipe.correlator, updates 4, lr 0.1 and default loss options.
/// @pre the overrides fit the method (apply_overrides; else invalid_input naming the variant).
inline variant_run make_variant_run(const method_variant& variant, double lr) {
  variant_run run{.recipe = with_method(variant.method,
                                        [](auto r) {
                                          any_pruner pruner;
                                          if constexpr (!std::same_as<decltype(r.pruner), keep_all>)
                                            pruner.pruner.pruners = {r.pruner};
                                          return variant_recipe{r.topology,   r.stepper, r.correlator, r.fusion,
                                                                r.normalizer, pruner,    r.objective};
                                        }),
                  .lr = lr};
  apply_overrides(variant,
                  {run.recipe.topology, run.recipe.stepper, run.recipe.correlator, run.recipe.fusion,
                   run.recipe.normalizer, run.recipe.pruner, run.recipe.objective, run.updates, run.lr, run.loss},
                  {.label = variant.label, .method = variant.method});
  return run;
}

}  // namespace branchgrpo::cli
