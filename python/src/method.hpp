#pragma once
// A method for Python: one of with_method's names as a run_recipe (training/run_recipe.hpp), with sections that
// override its components by the run config's keys. Each section is a dict like the TOML table of the same name,
// and each policy is set through its own parameters() (parameters.hpp), so the keys, defaults and rules are the
// config's:
//   topology   {kind, ...its parameters}          rollout    {stepper, ...the stepper's parameters}
//   correlator {kind, ...}   fusion {kind, ...}    advantage  {kind, per_reward, ...}
//   pruning    {active_fraction, pruners: [{kind, ...}, ...]}   objective {kind, ...}
// A section's kind defaults to the method's own component, whose parameters the section then overrides; another
// kind starts from that policy's defaults (the config reader's rule).
// Example: make_method("branch", {"correlator": {"s": 2.0}}) -> branch with correlated{.s = 2};
//   {"correlator": {"kind": "scaled", "s": 2.0}} -> ValueError "correlator.s: unknown key (scaled has: scale)".
// The recipe's normalizer (per_prompt_running) and topology (adaptive_branching) may keep state across iterations:
// state() and load_state() carry it (method_state).
#include <nanobind/nanobind.h>

#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/policy_list.hpp"
#include "branchgrpo/core/state.hpp"
#include "branchgrpo/training/run_recipe.hpp"
#include "parameters.hpp"

namespace branchgrpo::python {

namespace nb = nanobind;
namespace bg = branchgrpo;

/// The sections a Method takes, in the order they are applied (fusion before advantage: per_reward fuses with it).
inline constexpr std::array<std::string_view, 7> method_sections = {"topology",  "rollout", "correlator", "fusion",
                                                                    "advantage", "pruning", "objective"};

struct method_spec {
  std::string name;
  nb::dict sections;  ///< as given, for repr and for the state's record
  bg::run_recipe recipe;
};

namespace detail {

/// `section` (a dict) without the keys in `skip`, checked to be a dict with string keys.
inline nb::dict section_dict(const nb::handle& value, const std::string& where) {
  if (!nb::isinstance<nb::dict>(value))
    throw nb::type_error(
        (where + " = " + nb::cast<std::string>(nb::repr(value)) + ": must be a dict of its keys").c_str());
  nb::dict out;
  for (const auto& [key, item] : nb::borrow<nb::dict>(value)) {
    if (!nb::isinstance<nb::str>(key))
      throw nb::type_error((where + ": key " + nb::cast<std::string>(nb::repr(key)) + " must be a string").c_str());
    out[key] = item;
  }
  return out;
}

/// Takes `key` out of `params` as a string, or "" when absent.
inline std::string take_string(nb::dict& params, const char* key, const std::string& where) {
  if (!params.contains(key)) return {};
  const nb::object value = params[key];
  nb::del(params[key]);
  if (!nb::isinstance<nb::str>(value))
    throw nb::type_error(
        (where + "." + key + " = " + nb::cast<std::string>(nb::repr(value)) + ": must be a string").c_str());
  return nb::cast<std::string>(value);
}

/// Sets `out` from a section: the policy named by params[kind_key] (default: out's own; another kind starts from its
/// defaults), then the remaining keys through its parameters(). An unknown kind lists the family's names.
template <bg::PolicyList List>
void set_policy(bg::any_policy<List>& out, nb::dict params, const std::string& where, const char* kind_key,
                bool required = false) {
  std::string kind = take_string(params, kind_key, where);
  if (kind.empty() && required)
    throw nb::value_error((where + ": needs a " + kind_key + " (" + bg::policy_names_text<List>() + ")").c_str());
  if (kind.empty()) kind = std::string(out.name());
  bool known = false;
  bg::for_each_policy<List>([&]<class P>(std::type_identity<P>) {
    if (P::name != kind) return;
    known = true;
    P policy = std::holds_alternative<P>(out.policy) ? std::get<P>(out.policy) : P{};
    set_parameters(policy, params, where);
    out.policy = std::move(policy);
  });
  if (!known)
    throw nb::value_error(
        (where + "." + kind_key + " = '" + kind + "': must be " + bg::policy_names_text<List>()).c_str());
}

inline void set_pruning(bg::any_pruner& out, nb::dict params) {
  if (params.contains("active_fraction")) {
    const nb::object value = params["active_fraction"];
    nb::del(params["active_fraction"]);
    out.fraction = from_python<double>(value, "pruning.active_fraction");
    const std::string why = bg::rules::unit_interval{}.why(out.fraction);
    if (!why.empty())
      throw nb::value_error(
          ("pruning.active_fraction = " + nb::cast<std::string>(nb::repr(value)) + ": " + why).c_str());
  }
  if (params.contains("pruners")) {
    const nb::object list = params["pruners"];
    nb::del(params["pruners"]);
    if (!nb::isinstance<nb::list>(list) && !nb::isinstance<nb::tuple>(list))
      throw nb::type_error(
          ("pruning.pruners = " + nb::cast<std::string>(nb::repr(list)) + ": must be a list of dicts").c_str());
    out.pruner.pruners.clear();
    for (const nb::handle entry : list) {
      const std::string where = "pruning.pruners[" + std::to_string(out.pruner.pruners.size()) + "]";
      bg::any_pruner_choice choice;
      set_policy(choice, section_dict(entry, where), where, "kind", /*required=*/true);
      out.pruner.pruners.push_back(std::move(choice));
    }
  }
  for (const auto& [key, value] : params)
    throw nb::value_error(
        ("pruning." + nb::cast<std::string>(key) + ": unknown key (pruning has: active_fraction, pruners)").c_str());
}

inline void set_rollout(bg::any_stepper& out, nb::dict params) {
  for (const char* argument : {"steps", "shift"})
    if (params.contains(argument))
      throw nb::value_error((std::string("rollout.") + argument +
                             ": is rollout()'s argument, not a Method key (rollout has: stepper and its parameters)")
                                .c_str());
  set_policy(out, std::move(params), "rollout", "stepper");
}

inline void set_advantage(bg::run_normalizer& out, const bg::any_fusion& fusion, nb::dict params) {
  if (params.contains("per_reward")) {
    out.per_reward = from_python<bool>(params["per_reward"], "advantage.per_reward");
    nb::del(params["per_reward"]);
  }
  set_policy(out.normalizer, std::move(params), "advantage", "kind");
  out.use_fusion(fusion);
}

}  // namespace detail

/// with_method's recipe `name` with `sections` applied (see the file comment); every error names the key and value.
inline method_spec make_method(const std::string& name, const nb::dict& sections) {
  method_spec out{.name = name, .sections = {}, .recipe = bg::method_recipe(name)};
  for (const auto& [key, value] : sections) {
    const std::string section = nb::cast<std::string>(key);
    if (std::find(method_sections.begin(), method_sections.end(), section) == method_sections.end())
      throw nb::value_error(
          (section + ": unknown section (a Method has: " + bg::name_list(method_sections, ", ") + ")").c_str());
    out.sections[key] = detail::section_dict(value, section);
  }
  bg::run_recipe& r = out.recipe;
  for (const std::string_view section : method_sections) {
    const nb::str key(section.data(), section.size());
    if (!out.sections.contains(key)) continue;
    const nb::dict params = detail::section_dict(out.sections[key], std::string(section));
    if (section == "topology") detail::set_policy(r.topology, params, "topology", "kind");
    if (section == "rollout") detail::set_rollout(r.stepper, params);
    if (section == "correlator") detail::set_policy(r.correlator, params, "correlator", "kind");
    if (section == "fusion") detail::set_policy(r.fusion, params, "fusion", "kind");
    if (section == "advantage") detail::set_advantage(r.normalizer, r.fusion, params);
    if (section == "pruning") detail::set_pruning(r.pruner, params);
    if (section == "objective") detail::set_policy(r.objective, params, "objective", "kind");
  }
  r.normalizer.use_fusion(r.fusion);
  return out;
}

/// The components' names: {"topology": "split_schedule", "stepper": "dance_sde", ...}.
inline nb::dict component_names(const method_spec& m) {
  nb::dict out;
  out["topology"] = std::string(m.recipe.topology.name());
  out["stepper"] = std::string(m.recipe.stepper.name());
  out["correlator"] = std::string(m.recipe.correlator.name());
  out["fusion"] = std::string(m.recipe.fusion.name());
  out["advantage"] = std::string(m.recipe.normalizer.normalizer.name());
  nb::list pruners;
  for (const auto& p : m.recipe.pruner.pruner.pruners) pruners.append(std::string(p.name()));
  out["pruners"] = pruners;
  out["objective"] = std::string(m.recipe.objective.name());
  return out;
}

/// The recipe's state: the normalizer's buffers under their own keys (as before topologies kept state), the
/// topology's records under "topology.<key>".
/// Example: Method("branch", advantage={"kind": "per_prompt_running"}) after one step -> {"prompt.0": [...], ...};
///   Method("branch", topology={"kind": "adaptive_branching"}) -> {"topology.prompt.0": [visits, spread, mean, gain]}.
inline bg::component_state method_state(const method_spec& m) {
  bg::component_state state = m.recipe.normalizer.save_state();
  for (auto& [key, values] : m.recipe.topology.save_state()) state["topology." + key] = std::move(values);
  return state;
}

/// Restores what method_state returned: "topology.*" keys to the topology, the others to the normalizer.
inline void load_method_state(method_spec& m, const bg::component_state& state) {
  constexpr std::string_view prefix = "topology.";
  bg::component_state normalizer, topology;
  for (const auto& [key, values] : state)
    (key.starts_with(prefix) ? topology[key.substr(prefix.size())] : normalizer[key]) = values;
  m.recipe.normalizer.load_state(normalizer);
  m.recipe.topology.load_state(topology);
}

}  // namespace branchgrpo::python
