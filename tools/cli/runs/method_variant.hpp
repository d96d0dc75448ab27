#pragma once
// A named method with ablation overrides, as `compare --methods` takes it: the method's name, then `:key=value`
// parts that each change one thing, so an ablation switches one candidate cause at a time:
//
//   branch                        the named recipe as it is
//   branch:scope=per_batch        depth-wise statistics over every tree of the iteration, not per tree
//   branch:scope=pooled           each tree's own mean, the std pooled over the iteration's trees
//   branch:scope=leaf_scaled      each tree's own mean, divided by the std of the tree's leaves
//   branch:s=1                    correlated siblings with s = 1 (correlation 1 / (1 + s^2) = 0.5)
//   branch:fusion=path_softmax    another fusion weighting (fusion/catalog.hpp)
//   branch:stepper=cps            another stepper, with its default parameters (schedule/stepper_catalog.hpp)
//   dance:updates=4               4 optimizer steps per iteration (the trained edges split in 4 groups)
//   branch:lr=0.05                another learning rate (the toy's Adam, the shapes model's AdamW)
//   branch:ratio_norm=on          GRPO-Guard's RatioNorm of the importance ratio (ppo_options::ratio_norm)
//   branch:step_weight=noise_std  a per-step loss weight (ppo_options::step_weight: inverse_dt, noise_std, equal_steps)
//   branch-nft:intermediate=1     a decoupled objective also trained on the tree's internal split nodes
//   branch-mix-flash:ode_stride=3 an sde_window's schedule steps per ODE call (MixGRPO-Flash's compression)
//   branch-mix-flash:solver=euler an sde_window's ODE solver (euler or dpm_solver_2m)
//
// The recipe overrides (scope, s, fusion) act on with_method's typed recipe; updates, lr and the loss options act
// on the run's options and are read by the caller (loss_options()). Torch-free: the toy's compare uses it without
// LibTorch.
#include <algorithm>
#include <cmath>
#include <concepts>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "branchgrpo/advantage/depth_wise.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/core/policy_list.hpp"
#include "branchgrpo/correlator/correlated.hpp"
#include "branchgrpo/fusion/catalog.hpp"
#include "branchgrpo/loss/ppo.hpp"
#include "branchgrpo/pruning/sde_window.hpp"
#include "branchgrpo/schedule/stepper_catalog.hpp"
#include "branchgrpo/training/methods.hpp"

namespace branchgrpo::cli {

/// One entry of `--methods`: a named method and what it overrides (unset: the method's own).
struct method_variant {
  std::string label;   ///< the entry as given: the method's name in tables, files and JSON
  std::string method;  ///< one of method_names
  std::optional<normalization_scope> scope = {};
  std::optional<double> correlation_s = {};
  std::optional<std::string> fusion = {};
  std::optional<std::string> stepper = {};  ///< a stepper policy's name (its default parameters)
  std::optional<int> updates = {};
  std::optional<double> lr = {};
  std::optional<bool> ratio_norm = {};
  std::optional<step_weighting> step_weight = {};
  std::optional<bool> intermediate = {};  ///< a decoupled objective's intermediate_nodes
  std::optional<int> ode_stride = {};     ///< an sde_window's ode_stride
  std::optional<ode_solver> solver = {};  ///< an sde_window's ODE solver

  /// Whether it is the named method unchanged.
  [[nodiscard]] bool plain() const { return label == method; }

  /// The run's loss options with this variant's overrides applied to `loss`.
  /// Example: parse_method_variant("branch:ratio_norm=on").loss_options({}) == ppo_options{.ratio_norm = true}.
  [[nodiscard]] ppo_options loss_options(ppo_options loss) const {
    if (ratio_norm) loss.ratio_norm = *ratio_norm;
    if (step_weight) loss.step_weight = *step_weight;
    return loss;
  }
};

/// Parses one `--methods` entry.
/// Example: parse_method_variant("branch:scope=per_batch:s=1") == {.label = "branch:scope=per_batch:s=1",
///   .method = "branch", .scope = per_batch, .correlation_s = 1}; parse_method_variant("dance") is plain.
/// @pre the name is one of method_names, decoupled_method_names or flash_method_names; each part is key=value with a
/// known key (scope, s,
///      fusion, stepper, updates, lr, ratio_norm, step_weight, intermediate, ode_stride, solver) and a value in its
///      domain (scope per_tree | per_batch | pooled | leaf_scaled, s in [0, 1000], fusion / stepper a policy's name,
///      updates an integer in [1, 1000], lr in (0, 1], ratio_norm on | off, step_weight none | inverse_dt | noise_std |
///      equal_steps, intermediate 0 or 1, ode_stride in [1, max_steps], solver euler | dpm_solver_2m); no key twice;
///      no ratio_norm = on or step_weight other than none on a decoupled method (else invalid_input naming the part).
inline method_variant parse_method_variant(std::string_view entry) {
  method_variant out{.label = std::string(entry), .method = {}};
  std::size_t colon = entry.find(':');
  out.method = std::string(entry.substr(0, colon));
  bool known = false;
  for (const std::string_view name : method_names) known = known || name == out.method;
  for (const std::string_view name : decoupled_method_names) known = known || name == out.method;
  for (const std::string_view name : flash_method_names) known = known || name == out.method;
  require(known, "--methods: unknown method '", out.method, "' in '", entry, "' (expected ",
          name_list(method_names, ", "), ", ", name_list(decoupled_method_names, ", "), " or ",
          name_list(flash_method_names), ", optionally followed by :key=value overrides)");
  while (colon != std::string_view::npos) {
    const std::size_t next = entry.find(':', colon + 1);
    const std::string_view part = entry.substr(colon + 1, next == std::string_view::npos ? next : next - colon - 1);
    colon = next;
    const std::size_t equals = part.find('=');
    require(equals != std::string_view::npos && equals > 0, "--methods: '", part, "' in '", entry,
            "' is not key=value (keys: scope, s, fusion, stepper, updates, lr, ratio_norm, step_weight, intermediate, "
            "ode_stride, solver)");
    const std::string_view key = part.substr(0, equals);
    const std::string value(part.substr(equals + 1));
    const std::string what = "--methods " + std::string(entry) + ": " + std::string(key);
    const auto once = [&](bool unset) { require(unset, "--methods: '", key, "' is set twice in '", entry, "'"); };
    if (key == "scope") {
      once(!out.scope);
      bool named = false;
      for (const auto& choice : normalization_scope_names)
        if (choice.name == value) {
          out.scope = choice.value;
          named = true;
        }
      require(named, what, " = ", value, ": must be per_tree, per_batch, pooled or leaf_scaled");
    } else if (key == "s") {
      once(!out.correlation_s);
      out.correlation_s = parse_number(value, what, 0.0, 1000.0);  // correlated::s's range
    } else if (key == "fusion") {
      once(!out.fusion);
      (void)make_policy<fusion_policies>(value);  // refuses an unknown name, listing the known ones
      out.fusion = value;
    } else if (key == "stepper") {
      once(!out.stepper);
      (void)make_policy<stepper_policies>(value);  // refuses an unknown name, listing the known ones
      out.stepper = value;
    } else if (key == "updates") {
      once(!out.updates);
      out.updates = parse_integer<int>(value, what, 1, 1000);
    } else if (key == "lr") {
      once(!out.lr);
      out.lr = parse_number(value, what, 1e-12, 1.0);
    } else if (key == "ratio_norm") {
      once(!out.ratio_norm);
      require(value == "on" || value == "off", what, " = ", value, ": must be on or off");
      out.ratio_norm = value == "on";
    } else if (key == "step_weight") {
      once(!out.step_weight);
      const auto* known_name = std::find(std::begin(step_weighting_names), std::end(step_weighting_names), value);
      require(known_name != std::end(step_weighting_names), what, " = ", value,
              ": must be none, inverse_dt, noise_std or equal_steps");
      out.step_weight = parse_step_weighting(value);
    } else if (key == "intermediate") {
      once(!out.intermediate);
      out.intermediate = parse_integer<int>(value, what, 0, 1) == 1;
    } else if (key == "ode_stride") {
      once(!out.ode_stride);
      out.ode_stride = parse_integer<int>(value, what, 1, max_steps);
    } else if (key == "solver") {
      once(!out.solver);
      const auto* named = std::find_if(std::begin(ode_solver_names), std::end(ode_solver_names),
                                       [&](const auto& choice) { return choice.name == value; });
      require(named != std::end(ode_solver_names), what, " = ", value, ": must be euler or dpm_solver_2m");
      out.solver = named->value;
    } else {
      fail("--methods: unknown key '", key, "' in '", entry,
           "' (expected scope, s, fusion, stepper, updates, lr, ratio_norm, step_weight, intermediate, ode_stride or "
           "solver)");
    }
  }
  // RatioNorm and the per-step weights act on a transition's ratio, which a decoupled objective has not.
  const bool decoupled = std::find(decoupled_method_names.begin(), decoupled_method_names.end(), out.method) !=
                         decoupled_method_names.end();
  if (decoupled &&
      (out.ratio_norm.value_or(false) || out.step_weight.value_or(step_weighting::none) != step_weighting::none))
    fail("--methods ", entry, ": ratio_norm and step_weight act on a transition's importance ratio, and ", out.method,
         " trains a decoupled objective, which has none");
  return out;
}

/// Calls `body(recipe)` with the variant's recipe: with_method's, with scope, s and intermediate set, and with an
/// any_fusion and an any_stepper in those slots when the variant names a fusion or a stepper. Returns what body
/// returns. Example: with_variant(parse_method_variant("branch:s=1"), [](auto r) { return r.correlator.s; }) == 1.
/// @pre the overrides fit the recipe: scope needs a depth_wise normalizer, s a correlated correlator (else
///      invalid_input naming the variant).
template <class Body>
decltype(auto) with_variant(const method_variant& variant, Body&& body) {
  return with_method(variant.method, [&](auto recipe) {
    if (variant.scope) {
      if constexpr (std::same_as<decltype(recipe.normalizer), depth_wise>)
        recipe.normalizer.scope = *variant.scope;
      else
        fail("--methods ", variant.label, ": scope needs a depth-wise normalizer, and ", variant.method, " has none");
    }
    if (variant.correlation_s) {
      if constexpr (std::same_as<decltype(recipe.correlator), correlated>)
        recipe.correlator.s = *variant.correlation_s;
      else
        fail("--methods ", variant.label, ": s needs correlated sibling noise, and ", variant.method,
             " has independent chains");
    }
    if (variant.ode_stride || variant.solver) {
      if constexpr (std::same_as<decltype(recipe.pruner), sde_window>) {
        if (variant.ode_stride) recipe.pruner.ode_stride = *variant.ode_stride;
        if (variant.solver) recipe.pruner.solver = *variant.solver;
      } else {
        fail("--methods ", variant.label, ": ode_stride and solver need an SDE window (branch-mix, branch-mix-flash)");
      }
    }
    if (variant.intermediate) {
      if constexpr (MatchingObjective<decltype(recipe.objective)>)
        recipe.objective.intermediate_nodes = *variant.intermediate;
      else
        fail("--methods ", variant.label,
             ": intermediate needs a decoupled objective (nft, awm, branch-nft, branch-awm)");
    }
    if (!variant.fusion && !variant.stepper) return body(std::move(recipe));
    // A named policy in place of the recipe's: both slots become their family's any_ type, the other keeping its
    // policy.
    any_fusion fusion;
    if (variant.fusion)
      fusion.policy = make_policy<fusion_policies>(*variant.fusion);
    else
      fusion.policy = recipe.fusion;
    any_stepper stepper;
    if (variant.stepper)
      stepper.policy = make_policy<stepper_policies>(*variant.stepper);
    else
      stepper.policy = recipe.stepper;
    return body(method{recipe.topology, stepper, recipe.correlator, fusion, recipe.normalizer, recipe.pruner,
                       recipe.objective});
  });
}

}  // namespace branchgrpo::cli
