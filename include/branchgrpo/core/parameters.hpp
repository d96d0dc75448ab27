#pragma once
// Parameters described as data: a name, the member it sets, what it means and the rule its value obeys. One
// description serves every reader: the TOML reader and its error messages, the command-line tool's descriptions,
// the docs table and `validate_parameters` for options built in C++.
//
//   parameter("lr", &optimizer_options::lr, "learning rate", rules::positive{})
//   validate_parameters(optimizer_options{.lr = 0}, "optimizer")   throws "optimizer.lr = 0.0: must be positive"
//
// A rule is a small struct with `std::string why(const Value&) const` ("" when the value obeys it, else the reason,
// worded to follow "<key> = <value>: ") and `std::string text() const` (the constraint for tables, "" for none).
// Enumerations name their values through `enum_choices(E{})`, found by argument-dependent lookup.
#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/numbers.hpp"

namespace branchgrpo {

/// A name for one value of an enumeration (see enum_choices).
template <class Enum>
struct enum_choice {
  std::string_view name;
  Enum value;
};

/// An enumeration whose values have names: `enum_choices(E{})` (found by ADL) returns a range of enum_choice<E>.
template <class E>
concept NamedEnum = std::is_enum_v<E> && requires(E e) {
  { *std::begin(enum_choices(e)) } -> std::convertible_to<enum_choice<E>>;
};

/// The text of a value as a config file writes it: shortest round-trip doubles ("0.3", "1e-05", "4.0"),
/// integers, true/false, [a, b], enum names.
/// Example: value_text(4.0) == "4.0", value_text(std::vector<int>{0, 3}) == "[0, 3]", value_text(true) == "true".
template <class V>
std::string value_text(const V& value) {
  if constexpr (std::is_same_v<V, bool>) {
    return value ? "true" : "false";
  } else if constexpr (std::is_floating_point_v<V>) {
    char buffer[64];
    const auto end = std::to_chars(buffer, buffer + sizeof buffer, value).ptr;
    std::string text(buffer, end);
    if (std::isfinite(value) && text.find_first_of(".e") == std::string::npos) text += ".0";
    return text;
  } else if constexpr (std::is_integral_v<V>) {
    return std::to_string(value);
  } else if constexpr (NamedEnum<V>) {
    for (const auto& choice : enum_choices(value))
      if (choice.value == value) return std::string(choice.name);
    return std::to_string(static_cast<long long>(value));
  } else if constexpr (std::is_convertible_v<const V&, std::string_view>) {
    return "\"" + std::string(std::string_view(value)) + "\"";
  } else {
    std::string text = "[";
    for (std::size_t i = 0; i < value.size(); ++i) text += (i == 0 ? "" : ", ") + value_text(value[i]);
    return text + "]";
  }
}

/// "a, b or c" from names.
template <class Names>
std::string name_list(const Names& names, std::string_view last_separator = " or ") {
  std::string text;
  const auto count = static_cast<std::size_t>(std::size(names));
  std::size_t i = 0;
  for (const auto& name : names) {
    text += (i == 0 ? "" : i + 1 == count ? std::string(last_separator) : std::string(", ")) + std::string(name);
    ++i;
  }
  return text;
}

namespace rules {

/// Any value.
struct any {
  template <class V>
  std::string why(const V&) const {
    return {};
  }
  std::string text() const { return {}; }
};

/// A finite number.
struct finite {
  std::string why(double value) const { return std::isfinite(value) ? "" : "must be finite"; }
  std::string text() const { return "finite"; }
};

/// A finite number > 0.
struct positive {
  template <class V>
  std::string why(V value) const {
    return std::isfinite(static_cast<double>(value)) && value > 0 ? "" : "must be positive";
  }
  std::string text() const { return "> 0"; }
};

/// A finite number >= 0.
struct non_negative {
  template <class V>
  std::string why(V value) const {
    return std::isfinite(static_cast<double>(value)) && value >= 0 ? "" : "must be non-negative";
  }
  std::string text() const { return ">= 0"; }
};

/// A number >= low.
struct at_least {
  double low = 0;
  template <class V>
  std::string why(V value) const {
    return static_cast<double>(value) >= low ? "" : "must be at least " + bound_text();
  }
  std::string text() const { return ">= " + bound_text(); }

 private:
  std::string bound_text() const {
    const std::string text = value_text(low);
    return text.ends_with(".0") ? text.substr(0, text.size() - 2) : text;
  }
};

/// A finite number in [low, high]. The bounds keep a value where the arithmetic stays meaningful: a learning rate
/// of 1e300 or an eta of 5e-324 is refused by key here, not met later as a NaN that names nothing.
/// Example: in_range{.low = 1e-12, .high = 1}.why(1e300) == "must be in [1e-12, 1]"; .why(NaN) is the same.
struct in_range {
  double low = 0;
  double high = 0;
  template <class V>
  std::string why(V value) const {
    const auto v = static_cast<double>(value);
    return v >= low && v <= high ? "" : "must be in " + text();
  }
  std::string text() const { return "[" + number_bound_text(low) + ", " + number_bound_text(high) + "]"; }
};

/// A number in [0, 1] (closed_right) or [0, 1).
struct unit_interval {
  bool closed_right = true;
  std::string why(double value) const {
    const bool ok = value >= 0 && (closed_right ? value <= 1 : value < 1);
    return ok ? "" : "must be in " + text();
  }
  std::string text() const { return closed_right ? "[0, 1]" : "[0, 1)"; }
};

/// A number in (0, 1).
struct open_unit_interval {
  std::string why(double value) const { return value > 0 && value < 1 ? "" : "must be in (0, 1)"; }
  std::string text() const { return "(0, 1)"; }
};

/// +1 or -1.
struct sign {
  std::string why(int value) const { return value == 1 || value == -1 ? "" : "must be 1 or -1"; }
  std::string text() const { return "1 or -1"; }
};

/// A non-empty list whose every element is >= low.
struct non_empty {
  double low = -1e300;
  template <class V>
  std::string why(const std::vector<V>& values) const {
    if (values.empty()) return "must not be empty";
    for (const V& v : values)
      if (!(static_cast<double>(v) >= low)) return "must hold values " + at_least{low}.text();
    return {};
  }
  std::string text() const { return low > -1e300 ? "non-empty, each " + at_least{low}.text() : "non-empty"; }
};

/// A list (possibly empty) whose every element is >= low.
struct each_at_least {
  double low = 0;
  template <class V>
  std::string why(const std::vector<V>& values) const {
    for (const V& v : values)
      if (!(static_cast<double>(v) >= low)) return "must hold values " + at_least{low}.text();
    return {};
  }
  std::string text() const { return "each " + at_least{low}.text(); }
};

/// A finite number in (low, high]: "must be in (0, 100]"; `note` follows the range in the message.
/// Example: above_up_to{.low = 0, .high = 100}.why(0.0) == "must be in (0, 100]".
struct above_up_to {
  double low = 0;
  double high = 0;
  std::string_view note = {};
  std::string why(double value) const {
    return value > low && value <= high ? "" : "must be in " + text() + (note.empty() ? "" : " " + std::string(note));
  }
  std::string text() const { return "(" + number_bound_text(low) + ", " + number_bound_text(high) + "]"; }
};

/// A string that is one of `names` (the empty name shown as ""). Example: one_of_names{.names = dtypes}.why("half")
///   == "must be float32, bfloat16 or float16" with dtypes = {"float32", "bfloat16", "float16"}; with names
///   {"", "dev"}, why("x") == "must be \"\" or dev".
struct one_of_names {
  std::span<const std::string_view> names;
  std::string why(const std::string& value) const {
    for (const std::string_view name : names)
      if (name == value) return {};
    return "must be " + text();
  }
  std::string text() const {
    std::vector<std::string_view> shown(names.begin(), names.end());
    std::replace(shown.begin(), shown.end(), std::string_view(), std::string_view("\"\""));
    return name_list(shown);
  }
};

/// A non-empty string.
struct not_empty {
  std::string why(const std::string& value) const { return value.empty() ? "must not be empty" : ""; }
  std::string text() const { return "not empty"; }
};

}  // namespace rules

/// One described parameter of Owner: the member `member` of type Value, called `name`, obeying `rule`.
template <class Owner, class Value, class Rule>
struct parameter_of {
  using owner_type = Owner;
  using value_type = Value;
  std::string_view name;
  Value Owner::*member;
  std::string_view meaning;
  Rule rule;
  /// `train --resume` accepts a change of this key: it changes speed, memory, a path or the run's bookkeeping, not
  /// the experiment (config/config_text.hpp).
  bool may_change_on_resume = false;
  /// Whether a canonical text writes the key for this owner; nullptr: always. A key added after runs were
  /// checkpointed is written only when set, so that their texts read as before and they resume.
  bool (*written)(const Owner&) = nullptr;

  /// This parameter, marked as one that resume may change.
  [[nodiscard]] constexpr parameter_of resumable() const {
    parameter_of out = *this;
    out.may_change_on_resume = true;
    return out;
  }
  /// This parameter, written to a canonical text only where `when(owner)` holds.
  [[nodiscard]] constexpr parameter_of written_if(bool (*when)(const Owner&)) const {
    parameter_of out = *this;
    out.written = when;
    return out;
  }
  /// Whether a canonical text writes it for `owner`.
  [[nodiscard]] bool is_written(const Owner& owner) const { return written == nullptr || written(owner); }

  /// "" when `value` obeys the rule (and, for an enumeration, is one of its named values), else the reason.
  [[nodiscard]] std::string why(const Value& value) const {
    if constexpr (NamedEnum<Value>) {
      std::vector<std::string_view> names;
      for (const auto& choice : enum_choices(value)) {
        if (choice.value == value) return rule.why(value);
        names.push_back(choice.name);
      }
      return "must be " + name_list(names);
    } else {
      return rule.why(value);
    }
  }
  /// The rule as a table shows it; for an enumeration, its names.
  [[nodiscard]] std::string constraint() const {
    if constexpr (NamedEnum<Value>) {
      std::vector<std::string_view> names;
      for (const auto& choice : enum_choices(Value{})) names.push_back(choice.name);
      return name_list(names);
    } else {
      return rule.text();
    }
  }
};

/// parameter("k", &parent_top_k::k, "children kept per parent", rules::at_least{1}).
template <class Owner, class Value, class Rule = rules::any>
constexpr parameter_of<Owner, Value, Rule> parameter(std::string_view name, Value Owner::*member,
                                                     std::string_view meaning, Rule rule = {}) {
  return {.name = name, .member = member, .meaning = meaning, .rule = rule};
}

/// Types whose parameters are described: `T::parameters()` returns a tuple of parameter_of<T, ...>.
template <class T>
concept Described = requires {
  std::tuple_size<std::remove_cvref_t<decltype(T::parameters())>>::value;
};

/// Throws invalid_input "<prefix>.<name> = <value>: <reason>" for the first parameter of `value` that breaks its
/// rule. Example: validate_parameters(optimizer_options{.lr = 0}, "optimizer") throws
///   "optimizer.lr = 0.0: must be positive".
/// @post returns only when every described parameter obeys its rule.
template <Described T>
void validate_parameters(const T& value, std::string_view prefix) {
  std::apply(
      [&](const auto&... p) {
        (
            [&] {
              const std::string why = p.why(value.*(p.member));
              if (!why.empty()) fail(prefix, ".", p.name, " = ", value_text(value.*(p.member)), ": ", why);
            }(),
            ...);
      },
      T::parameters());
}

}  // namespace branchgrpo
