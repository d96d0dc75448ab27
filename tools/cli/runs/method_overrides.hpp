#pragma once
// The ablation overrides a `--methods` entry may carry after the method's name (`branch:scope=per_batch:s=1`), as
// one table: each key described once, with the field it fills, how its value is read (range and message) and what
// it changes in a run. Both `compare` models (the toy and the shapes model) and `gradient-signal` apply this table
// to one view of a run (override_target: the erased recipe's components and the run's settings), so a key means
// the same thing, and fails with the same line, wherever it is given.
//
//   key           value                                         changes
//   scope         per_tree | per_batch | pooled | leaf_scaled   the depth-wise normalizer's statistics
//   s             a number in [0, 1000]                         correlated sibling noise's s
//   fusion        a fusion policy's name (fusion/catalog.hpp)   the fusion, with its default parameters
//   stepper       a stepper policy's name                       the stepper, with its default parameters
//   objective     an objective's name (loss/objective.hpp)      the objective, with its default parameters
//   updates       an integer in [1, 1000]                       optimizer steps per iteration
//   lr            a number in (0, 1]                            the optimizer's learning rate
//   ratio_norm    on | off                                      ppo_options::ratio_norm (GRPO-Guard's RatioNorm)
//   step_weight   none | inverse_dt | noise_std | equal_steps   ppo_options::step_weight
//   intermediate  0 | 1                                         a decoupled objective's intermediate_nodes
//   ode_stride    an integer in [1, max_steps]                  every sde_window's schedule steps per ODE call
//   solver        euler | dpm_solver_2m                         every sde_window's ODE solver
//   value_keep    an integer in [1, 2^24]                       value pruning during the rollout: nodes kept per tree
//   value_step    an integer in [-1, max_steps]                 value pruning's step (-1: the last split)
//   value_pruned  value | drop                                  what becomes of a branch the value pruning stopped
//                 (each value_* key adds the value pruner, pruning/value.hpp, when the run has none)
//   topology      a topology's name (topology/catalog.hpp)      the topology, with its default parameters
//   budget        an integer in [1, 10^7]                       adaptive_branching's evaluations per prompt
//
// Example: read_override(o, "s", "1", "--methods branch:s=1: s", "branch:s=1") sets o.correlation_s = 1;
// apply_overrides(o, t, {.label = "branch:s=1", .method = "branch"}) then sets t.correlator's correlated::s to 1,
// and for dance (label "dance:s=1") fails with "--methods dance:s=1: s needs correlated sibling noise, and dance
// has independent chains".
// Torch-free: the toy's runs use it without LibTorch.
#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <variant>

#include "branchgrpo/advantage/catalog.hpp"
#include "branchgrpo/advantage/depth_wise.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/limits.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/core/policy_list.hpp"
#include "branchgrpo/correlator/catalog.hpp"
#include "branchgrpo/correlator/correlated.hpp"
#include "branchgrpo/fusion/catalog.hpp"
#include "branchgrpo/loss/objective.hpp"
#include "branchgrpo/loss/ppo.hpp"
#include "branchgrpo/loss/step_weights.hpp"
#include "branchgrpo/pruning/catalog.hpp"
#include "branchgrpo/pruning/sde_window.hpp"
#include "branchgrpo/pruning/value.hpp"
#include "branchgrpo/schedule/stepper_catalog.hpp"
#include "branchgrpo/topology/catalog.hpp"

namespace branchgrpo::cli {

/// What a `--methods` entry overrides; unset: the method's own.
struct method_overrides {
  std::optional<normalization_scope> scope = {};
  std::optional<double> correlation_s = {};
  std::optional<std::string> fusion = {};
  std::optional<std::string> stepper = {};    ///< a stepper policy's name (its default parameters)
  std::optional<std::string> objective = {};  ///< an objective's name (its default parameters)
  std::optional<int> updates = {};
  std::optional<double> lr = {};
  std::optional<bool> ratio_norm = {};
  std::optional<step_weighting> step_weight = {};
  std::optional<bool> intermediate = {};           ///< a decoupled objective's intermediate_nodes
  std::optional<int> ode_stride = {};              ///< an sde_window's ode_stride
  std::optional<ode_solver> solver = {};           ///< an sde_window's ODE solver
  std::optional<int> value_keep = {};              ///< the value pruner's keep
  std::optional<int> value_step = {};              ///< the value pruner's step
  std::optional<pruned_branch> value_pruned = {};  ///< the value pruner's pruned
  std::optional<std::string> topology = {};        ///< a topology's name (its default parameters)
  std::optional<int> budget = {};                  ///< adaptive_branching's budget
};

/// One run as the overrides see it: its recipe's erased components and its settings, each a reference into the
/// run's own (the toy's variant_run, the shapes model's run_config).
struct override_target {
  any_topology& topology;
  any_stepper& stepper;
  any_correlator& correlator;
  any_fusion& fusion;
  any_normalizer& normalizer;
  any_pruner& pruner;
  any_objective& objective;
  int& updates;       ///< optimizer steps per iteration
  double& lr;         ///< the optimizer's learning rate
  ppo_options& loss;  ///< the loss options
};

/// Whose run an override is applied to, for the messages: the entry as given and the method it names.
struct override_owner {
  std::string_view label;   ///< e.g. "dance:s=1"
  std::string_view method;  ///< e.g. "dance"
};

/// One row of the table: the key, the field it fills, how its value is read (`what` is "--methods ENTRY: KEY",
/// the start of every message) and how it is applied.
template <class T>
struct override_row {
  std::string_view key;
  std::optional<T> method_overrides::*field;
  T (*read)(const std::string& value, const std::string& what);
  void (*apply)(const T& value, const override_target& run, const override_owner& owner);
};

namespace detail {

// The value of `names` (enum_choice entries) called `value`, or the one line "WHAT = VALUE: must be EXPECTED".
template <class Names>
auto named_choice(const Names& names, const std::string& value, const std::string& what, std::string_view expected) {
  const auto* named =
      std::find_if(std::begin(names), std::end(names), [&](const auto& choice) { return choice.name == value; });
  require(named != std::end(names), what, " = ", value, ": must be ", expected);
  return named->value;
}

// A policy's name of the list, kept as given; an unknown one: make_policy's line, listing the known ones.
template <PolicyList List>
std::string policy_name(const std::string& value, const std::string&) {
  (void)make_policy<List>(value);
  return value;
}

inline normalization_scope read_scope(const std::string& value, const std::string& what) {
  return named_choice(normalization_scope_names, value, what, "per_tree, per_batch, pooled or leaf_scaled");
}

inline bool read_on_off(const std::string& value, const std::string& what) {
  require(value == "on" || value == "off", what, " = ", value, ": must be on or off");
  return value == "on";
}

inline step_weighting read_step_weight(const std::string& value, const std::string& what) {
  return named_choice(step_weighting_choices, value, what, "none, inverse_dt, noise_std or equal_steps");
}

inline void set_scope(const normalization_scope& value, const override_target& run, const override_owner& owner) {
  auto* normalizer = std::get_if<depth_wise>(&run.normalizer.policy);
  require(normalizer != nullptr, "--methods ", owner.label, ": scope needs a depth-wise normalizer, and ", owner.method,
          " has none");
  normalizer->scope = value;
}

inline void set_s(const double& value, const override_target& run, const override_owner& owner) {
  auto* correlator = std::get_if<correlated>(&run.correlator.policy);
  require(correlator != nullptr, "--methods ", owner.label, ": s needs correlated sibling noise, and ", owner.method,
          " has independent chains");
  correlator->s = value;
}

inline void set_intermediate(const bool& value, const override_target& run, const override_owner& owner) {
  const bool decoupled = std::visit(
      [&](auto& objective) {
        if constexpr (MatchingObjective<std::decay_t<decltype(objective)>>) {
          objective.intermediate_nodes = value;
          return true;
        } else {
          return false;
        }
      },
      run.objective.policy);
  require(decoupled, "--methods ", owner.label,
          ": intermediate needs a decoupled objective (nft, awm, branch-nft, branch-awm)");
}

// Every sde_window pruner of the run passed to `set`; none: the one line ode_stride and solver share.
template <class Set>
void each_sde_window(const override_target& run, const override_owner& owner, Set&& set) {
  bool windowed = false;
  for (any_pruner_choice& choice : run.pruner.pruner.pruners)
    if (auto* window = std::get_if<sde_window>(&choice.policy)) {
      set(*window);
      windowed = true;
    }
  require(windowed, "--methods ", owner.label,
          ": ode_stride and solver need an SDE window (branch-mix, branch-mix-flash)");
}

// The run's value pruner, added with its defaults when it has none.
inline value_prune& value_pruner(const override_target& run) {
  for (any_pruner_choice& choice : run.pruner.pruner.pruners)
    if (auto* value = std::get_if<value_prune>(&choice.policy)) return *value;
  run.pruner.pruner.pruners.push_back(any_pruner_choice{value_prune{}});
  return std::get<value_prune>(run.pruner.pruner.pruners.back().policy);
}

}  // namespace detail

// clang-format off
/// The table, in the order keys are listed in messages and applied to a run. `what`: "--methods ENTRY: KEY".
inline constexpr auto override_table = std::tuple{
    override_row<normalization_scope>{
        .key = "scope", .field = &method_overrides::scope, .read = detail::read_scope, .apply = detail::set_scope},
    override_row<double>{
        .key = "s", .field = &method_overrides::correlation_s,
        .read = [](const std::string& value, const std::string& what) {
          return parse_number(value, what, 0.0, 1000.0);  // correlated::s's range
        },
        .apply = detail::set_s},
    override_row<std::string>{
        .key = "fusion", .field = &method_overrides::fusion, .read = detail::policy_name<fusion_policies>,
        .apply = [](const std::string& value, const override_target& run, const override_owner&) {
          run.fusion.policy = make_policy<fusion_policies>(value);
        }},
    override_row<std::string>{
        .key = "stepper", .field = &method_overrides::stepper, .read = detail::policy_name<stepper_policies>,
        .apply = [](const std::string& value, const override_target& run, const override_owner&) {
          run.stepper.policy = make_policy<stepper_policies>(value);
        }},
    override_row<std::string>{
        .key = "objective", .field = &method_overrides::objective, .read = detail::policy_name<objective_policies>,
        .apply = [](const std::string& value, const override_target& run, const override_owner&) {
          run.objective.policy = make_policy<objective_policies>(value);
        }},
    override_row<int>{
        .key = "updates", .field = &method_overrides::updates,
        .read = [](const std::string& value, const std::string& what) {
          return parse_integer<int>(value, what, 1, 1000);
        },
        .apply = [](const int& value, const override_target& run, const override_owner&) { run.updates = value; }},
    override_row<double>{
        .key = "lr", .field = &method_overrides::lr,
        .read = [](const std::string& value, const std::string& what) {
          return parse_number(value, what, 1e-12, 1.0);
        },
        .apply = [](const double& value, const override_target& run, const override_owner&) { run.lr = value; }},
    override_row<bool>{
        .key = "ratio_norm", .field = &method_overrides::ratio_norm, .read = detail::read_on_off,
        .apply = [](const bool& value, const override_target& run, const override_owner&) {
          run.loss.ratio_norm = value;
        }},
    override_row<step_weighting>{
        .key = "step_weight", .field = &method_overrides::step_weight, .read = detail::read_step_weight,
        .apply = [](const step_weighting& value, const override_target& run, const override_owner&) {
          run.loss.step_weight = value;
        }},
    override_row<bool>{
        .key = "intermediate", .field = &method_overrides::intermediate,
        .read = [](const std::string& value, const std::string& what) {
          return parse_integer<int>(value, what, 0, 1) == 1;
        },
        .apply = detail::set_intermediate},
    override_row<int>{
        .key = "ode_stride", .field = &method_overrides::ode_stride,
        .read = [](const std::string& value, const std::string& what) {
          return parse_integer<int>(value, what, 1, max_steps);
        },
        .apply = [](const int& value, const override_target& run, const override_owner& owner) {
          detail::each_sde_window(run, owner, [&](sde_window& window) { window.ode_stride = value; });
        }},
    override_row<ode_solver>{
        .key = "solver", .field = &method_overrides::solver,
        .read = [](const std::string& value, const std::string& what) {
          return detail::named_choice(ode_solver_names, value, what, "euler or dpm_solver_2m");
        },
        .apply = [](const ode_solver& value, const override_target& run, const override_owner& owner) {
          detail::each_sde_window(run, owner, [&](sde_window& window) { window.solver = value; });
        }},
    override_row<int>{
        .key = "value_keep", .field = &method_overrides::value_keep,
        .read = [](const std::string& value, const std::string& what) {
          return parse_integer<int>(value, what, 1, static_cast<int>(max_leaves_per_tree));
        },
        .apply = [](const int& value, const override_target& run, const override_owner&) {
          detail::value_pruner(run).keep = value;
        }},
    override_row<int>{
        .key = "value_step", .field = &method_overrides::value_step,
        .read = [](const std::string& value, const std::string& what) {
          return parse_integer<int>(value, what, -1, max_steps);
        },
        .apply = [](const int& value, const override_target& run, const override_owner&) {
          detail::value_pruner(run).step = value;
        }},
    override_row<pruned_branch>{
        .key = "value_pruned", .field = &method_overrides::value_pruned,
        .read = [](const std::string& value, const std::string& what) {
          return detail::named_choice(pruned_branch_names, value, what, "value or drop");
        },
        .apply = [](const pruned_branch& value, const override_target& run, const override_owner&) {
          detail::value_pruner(run).pruned = value;
        }},
    override_row<std::string>{
        .key = "topology", .field = &method_overrides::topology, .read = detail::policy_name<topology_policies>,
        .apply = [](const std::string& value, const override_target& run, const override_owner&) {
          run.topology.policy = make_policy<topology_policies>(value);
        }},
    override_row<int>{
        .key = "budget", .field = &method_overrides::budget,
        .read = [](const std::string& value, const std::string& what) {
          return parse_integer<int>(value, what, 1, 10'000'000);
        },
        .apply = [](const int& value, const override_target& run, const override_owner& owner) {
          auto* adaptive = std::get_if<adaptive_branching>(&run.topology.policy);
          require(adaptive != nullptr, "--methods ", owner.label, ": budget needs topology=adaptive_branching, and ",
                  owner.method, " has ", run.topology.name());
          adaptive->budget = value;
        }},
};
// clang-format on

/// The table's keys in its order. Example: override_keys()[1] == "s".
inline constexpr auto override_keys() {
  return std::apply([](const auto&... row) { return std::array<std::string_view, sizeof...(row)>{row.key...}; },
                    override_table);
}

/// Reads `value` into the field of the row keyed `key`; false when no row has that key.
/// Example: read_override(o, "updates", "4", "--methods dance:updates=4: updates", "dance:updates=4") sets
///   o.updates = 4 and returns true; read_override(o, "eta", "1", ...) returns false and changes nothing.
/// @pre the field is unset (else invalid_input "--methods: 'KEY' is set twice in 'ENTRY'", `entry` being what
///      `what` names); the value is in the row's domain (else invalid_input "WHAT = VALUE: must be ..." or the
///      number parsers' line).
/// @post the field is set, or nothing changed when the key is unknown.
inline bool read_override(method_overrides& overrides, std::string_view key, const std::string& value,
                          const std::string& what, std::string_view entry) {
  const auto read_row = [&](const auto& row) {
    if (row.key != key) return false;
    require(!(overrides.*row.field), "--methods: '", key, "' is set twice in '", entry, "'");
    overrides.*row.field = row.read(value, what);
    return true;
  };
  return std::apply([&](const auto&... row) { return (read_row(row) || ...); }, override_table);
}

/// Applies every set override to `run`, in the table's order.
/// Example: with o.scope = per_batch and o.updates = 4, the run's depth_wise gets scope per_batch and
///   run.updates becomes 4; nothing else changes.
/// @pre each set override fits the run: scope needs a depth_wise normalizer, s a correlated correlator,
///      intermediate a decoupled objective, ode_stride and solver an sde_window pruner (else invalid_input naming
///      owner.label; the first failing key in the table's order is named, and the run may be half changed).
inline void apply_overrides(const method_overrides& overrides, const override_target& run,
                            const override_owner& owner) {
  std::apply(
      [&](const auto&... row) {
        ((overrides.*row.field ? row.apply(*(overrides.*row.field), run, owner) : void()), ...);
      },
      override_table);
}

}  // namespace branchgrpo::cli
