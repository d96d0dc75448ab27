#pragma once
// A policy's parameters set from Python values by its own description (parameters(): names, member types, rules), as
// the TOML reader sets them from a config: the package's one path from keyword arguments to a component.
// Example: set_parameters(split_schedule, {"branching": [3]}, "topology") -> branching {3}; {"branching": 2} ->
//   TypeError "topology.branching = 2: must be a list of integers"; {"branchng": ...} -> ValueError "topology.branchng:
//   unknown key (split_schedule has: split_steps, branching)".
#include <nanobind/nanobind.h>

#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/core/policy_list.hpp"

namespace branchgrpo::python {

namespace nb = nanobind;
namespace bg = branchgrpo;

// --- Parameters from Python values, by the policy's own description ---------------------------------------------

// What a parameter of type V takes, for messages: "an integer", "a list of integers".
template <class V>
std::string type_text() {
  if constexpr (std::is_same_v<V, bool>)
    return "True or False";
  else if constexpr (std::is_integral_v<V>)
    return "an integer";
  else if constexpr (std::is_floating_point_v<V>)
    return "a number";
  else if constexpr (std::is_same_v<V, std::string> || bg::NamedEnum<V>)
    return "a string";
  else
    return "a list of " +
           type_text<typename V::value_type>().substr(type_text<typename V::value_type>().find(' ') + 1) + "s";
}

// `value` as the parameter's type, or a TypeError naming `where` ("topology.branching = 2: must be a list of
// integers").
template <class V>
V from_python(const nb::handle& value, const std::string& where) {
  try {
    if constexpr (std::is_same_v<V, bool>) {
      if (!nb::isinstance<nb::bool_>(value)) throw nb::cast_error();
      return nb::cast<bool>(value);
    } else if constexpr (std::is_integral_v<V>) {
      if (nb::isinstance<nb::bool_>(value) || !nb::isinstance<nb::int_>(value)) throw nb::cast_error();
      return nb::cast<V>(value);
    } else if constexpr (std::is_floating_point_v<V>) {
      if (nb::isinstance<nb::bool_>(value)) throw nb::cast_error();
      return nb::cast<V>(value);
    } else if constexpr (std::is_same_v<V, std::string>) {
      return nb::cast<std::string>(value);
    } else if constexpr (bg::NamedEnum<V>) {
      const std::string name = nb::cast<std::string>(value);
      for (const auto& choice : enum_choices(V{}))
        if (choice.name == name) return choice.value;
      std::vector<std::string_view> names;
      for (const auto& choice : enum_choices(V{})) names.push_back(choice.name);
      throw nb::value_error((where + " = '" + name + "': must be " + bg::name_list(names)).c_str());
    } else {
      if (!nb::isinstance<nb::list>(value) && !nb::isinstance<nb::tuple>(value)) throw nb::cast_error();
      V out;
      for (const nb::handle item : value)
        out.push_back(from_python<typename V::value_type>(item, where + "[" + std::to_string(out.size()) + "]"));
      return out;
    }
  } catch (const nb::cast_error&) {
    throw nb::type_error(
        (where + " = " + nb::cast<std::string>(nb::repr(value)) + ": must be " + type_text<V>()).c_str());
  }
}

// Sets every entry of `params` on `policy` by its parameters() and checks each against its rule, naming it
// ("topology.branching = [0]: ..."); an unknown key lists the policy's.
template <class P>
void set_parameters(P& policy, const nb::dict& params, std::string_view section) {
  for (const auto& [key, value] : params) {
    const std::string name = nb::cast<std::string>(key);
    bool found = false;
    std::vector<std::string_view> known;
    std::apply(
        [&](const auto&... p) {
          (([&] {
             known.push_back(p.name);
             if (p.name != name) return;
             found = true;
             using V = typename std::decay_t<decltype(p)>::value_type;
             policy.*(p.member) = from_python<V>(value, std::string(section) + "." + name);
           }()),
           ...);
        },
        bg::parameters_of<P>());
    if (!found) {
      std::string owner(section);  // a policy says its name; a settings section (the loss) is its section
      if constexpr (requires { P::name; }) owner = std::string(P::name);
      throw nb::value_error(
          (std::string(section) + "." + name + ": unknown key (" + owner + " has: " + bg::name_list(known, ", ") + ")")
              .c_str());
    }
  }
  if constexpr (bg::Described<P>) bg::validate_parameters(policy, section);
}

}  // namespace branchgrpo::python
