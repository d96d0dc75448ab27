#pragma once
// Reading TOML tables into the library's described types (toml++): every error is one line naming the file, the
// key path and the value as written, e.g. "run.toml: rollout.steps = 0: must be at least 1", and unknown keys are
// rejected with the keys the table has.
//
//   table_reader r(file, "optimizer", table);    remembers which keys were read; r.finish() rejects the rest
//   read_parameters(r, options)                  every described parameter of `options` (core/parameters.hpp)
//   read_policy(r, "kind", any_fusion& f)        the policy named by `kind` from a family's list, then its
//                                                parameters; keys of the family's other policies are rejected
//                                                as "is not used by fusion.kind = \"...\""
#include <toml++/toml.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/core/policy_list.hpp"

namespace branchgrpo::config {

/// The most elements a list key holds ([[rewards]], [[pruning.pruners]], topology.branching, lora.targets...): far
/// above any real run (a tree has at most 255 steps), and a bound on what a pasted or generated file can make the
/// reader build.
inline constexpr std::size_t max_list_length = 256;

/// A TOML value on one line, as written in TOML (strings quoted, floats in their shortest exact form), cut in the
/// middle at 80 characters: a 50 MB string or a million-element array is echoed as its start and its end.
/// Example: node_text of 0.5 is "0.5"; of [0.3, 1] "[ 0.3, 1 ]"; of a 1000-character string '"aaaa...aaa"'
/// (80 characters).
inline std::string node_text(const toml::node& node) {
  constexpr std::size_t most = 80;
  if (const auto* number = node.as_floating_point()) return value_text(number->get());
  if (const auto* array = node.as_array(); array != nullptr && array->size() > max_list_length)
    return "[... " + std::to_string(array->size()) + " elements]";  // never printed whole, even into a buffer
  if (const auto* array = node.as_array(); array != nullptr && !array->empty()) {  // its floats shortest, as above
    std::string text = "[";
    for (std::size_t i = 0; i < array->size(); ++i) text += (i == 0 ? " " : ", ") + node_text((*array)[i]);
    return echo_middle(text + " ]", most);
  }
  if (const auto* string = node.as_string(); string != nullptr && string->get().size() > most)
    return "\"" + echo_middle(string->get(), most - 2) + "\"";
  std::ostringstream out;
  node.visit([&](const auto& value) { out << value; });
  std::string text = out.str();
  std::replace(text.begin(), text.end(), '\n', ' ');
  return echo_middle(text, most);
}

/// Reads one table, remembering the keys it consumed so that the rest can be rejected as unknown.
class table_reader {
 public:
  table_reader(std::string file, std::string path, const toml::table* table)
      : file_(std::move(file)), path_(std::move(path)), table_(table) {}

  [[nodiscard]] std::string key_path(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }
  [[nodiscard]] const toml::node* find(std::string_view key) const {
    return table_ == nullptr ? nullptr : table_->get(key);
  }
  [[nodiscard]] bool has(std::string_view key) const { return find(key) != nullptr; }

  [[noreturn]] void bad(std::string_view key, std::string_view why) const {
    fail(file_, ": ", key_path(key), " = ", node_text(*find(key)), ": ", why);
  }

  /// Reads `key` into `out` when present (type-checked); returns whether it was present.
  template <class T>
  bool read(std::string_view key, T& out) {
    known_.insert(std::string(key));
    const toml::node* node = find(key);
    if (node == nullptr) return false;
    out = convert<T>(key, *node);
    return true;
  }

  /// read, then `check(value)` must return "" (else the reason).
  template <class T, class Check>
  bool read(std::string_view key, T& out, Check check) {
    if (!read(key, out)) return false;
    const std::string why = check(out);
    if (!why.empty()) bad(key, why);
    return true;
  }

  /// Marks `key` as known but rejects it when present and `used` is false (a key of another kind).
  void only_if(bool used, std::string_view key, std::string_view why) {
    known_.insert(std::string(key));
    if (!used && has(key)) bad(key, why);
  }

  /// A sub-table (absent: an empty reader); rejects a non-table value.
  table_reader table(std::string_view key) {
    known_.insert(std::string(key));
    const toml::node* node = find(key);
    if (node != nullptr && !node->is_table()) bad(key, "must be a table");
    return table_reader(file_, key_path(key), node == nullptr ? nullptr : node->as_table());
  }

  /// The tables of an array of tables (absent: none).
  std::vector<table_reader> tables(std::string_view key) {
    known_.insert(std::string(key));
    std::vector<table_reader> out;
    const toml::node* node = find(key);
    if (node == nullptr) return out;
    if (!node->is_array()) bad(key, "must be an array of tables ([[" + key_path(key) + "]])");
    const toml::array& array = *node->as_array();
    if (array.size() > max_list_length)
      fail(file_, ": ", key_path(key), ": ", array.size(), " entries, at most ", max_list_length, " are supported");
    for (std::size_t i = 0; i < array.size(); ++i) {
      const std::string where = key_path(key) + "[" + std::to_string(i) + "]";
      if (!array[i].is_table()) fail(file_, ": ", where, " = ", node_text(array[i]), ": must be a table");
      out.emplace_back(file_, where, array[i].as_table());
    }
    return out;
  }

  /// Rejects every key that was not read. `names` lists the known keys in the message.
  void finish() const {
    if (table_ == nullptr) return;
    for (const auto& [key, node] : *table_) {
      if (known_.contains(std::string(key.str()))) continue;
      std::string names;
      for (const std::string& k : order_or_known()) names += (names.empty() ? "" : ", ") + k;
      fail(file_, ": unknown key ", echo_middle(key_path(key.str()), 80),
           path_.empty() ? " (sections: " + names + ")" : " (" + path_ + " has: " + names + ")");
    }
  }

  [[nodiscard]] const std::string& file() const { return file_; }
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] const toml::table* raw() const { return table_; }

 private:
  [[nodiscard]] std::vector<std::string> order_or_known() const { return {known_.begin(), known_.end()}; }

  template <class T>
  T convert(std::string_view key, const toml::node& node) {
    if constexpr (std::is_same_v<T, bool>) {
      if (!node.is_boolean()) bad(key, "must be true or false");
      return node.as_boolean()->get();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!node.is_string()) bad(key, "must be a string");
      return node.as_string()->get();
    } else if constexpr (std::is_same_v<T, double>) {
      if (node.is_integer()) return static_cast<double>(node.as_integer()->get());
      if (!node.is_floating_point()) bad(key, "must be a number");
      return node.as_floating_point()->get();
    } else if constexpr (std::is_integral_v<T>) {
      if (!node.is_integer()) bad(key, "must be an integer");
      const std::int64_t value = node.as_integer()->get();
      if constexpr (std::is_unsigned_v<T>) {
        if (value < 0) bad(key, "must be non-negative");
      } else {
        if (value < std::numeric_limits<T>::min() || value > std::numeric_limits<T>::max())
          bad(key, "must be an integer in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                       std::to_string(std::numeric_limits<T>::max()) + "]");
      }
      return static_cast<T>(value);
    } else if constexpr (NamedEnum<T>) {
      std::vector<std::string_view> names;
      if (node.is_string())
        for (const auto& choice : enum_choices(T{})) {
          if (choice.name == node.as_string()->get()) return choice.value;
          names.push_back(choice.name);
        }
      else
        for (const auto& choice : enum_choices(T{})) names.push_back(choice.name);
      bad(key, "must be " + name_list(names));
    } else if constexpr (std::is_same_v<T, std::vector<int>>) {
      if (!node.is_array()) bad(key, "must be an array of integers");
      check_length(key, *node.as_array());
      std::vector<int> out;
      for (const toml::node& item : *node.as_array()) {
        if (!item.is_integer() || item.as_integer()->get() < std::numeric_limits<int>::min() ||
            item.as_integer()->get() > std::numeric_limits<int>::max())
          bad(key, "must be an array of integers");
        out.push_back(static_cast<int>(item.as_integer()->get()));
      }
      return out;
    } else if constexpr (std::is_same_v<T, std::vector<double>>) {
      if (!node.is_array()) bad(key, "must be an array of numbers");
      check_length(key, *node.as_array());
      std::vector<double> out;
      for (const toml::node& item : *node.as_array()) {
        if (item.is_integer())
          out.push_back(static_cast<double>(item.as_integer()->get()));
        else if (item.is_floating_point())
          out.push_back(item.as_floating_point()->get());
        else
          bad(key, "must be an array of numbers");
      }
      return out;
    } else {
      static_assert(std::is_same_v<T, std::vector<std::string>>);
      if (!node.is_array()) bad(key, "must be an array of strings");
      check_length(key, *node.as_array());
      std::vector<std::string> out;
      for (const toml::node& item : *node.as_array()) {
        if (!item.is_string()) bad(key, "must be an array of strings");
        out.push_back(item.as_string()->get());
      }
      return out;
    }
  }

  void check_length(std::string_view key, const toml::array& array) const {
    if (array.size() > max_list_length)
      bad(key, "holds " + std::to_string(array.size()) + " elements, at most " + std::to_string(max_list_length) +
                   " are supported");
  }

  std::string file_, path_;
  const toml::table* table_;
  std::set<std::string> known_;
};

/// A check for read(): the value must be one of `names` ("must be a, b or c").
/// (rules::one_of_names' check, holding its names.)
inline auto one_of(std::vector<std::string_view> names) {
  return [names](const std::string& value) { return rules::one_of_names{.names = names}.why(value); };
}

/// Runs `body`; an invalid_input it throws becomes "<file>: <key> = <value>, ...: <its message>", naming
/// those of `keys` that the table sets (or "<section> (defaults)").
template <class Body>
void checked(const table_reader& r, std::initializer_list<std::string_view> keys, Body&& body) {
  try {
    body();
  } catch (const invalid_input& error) {
    std::string named;
    for (std::string_view key : keys)
      if (r.has(key)) named += (named.empty() ? "" : ", ") + r.key_path(key) + " = " + node_text(*r.find(key));
    fail(r.file(), ": ", named.empty() ? r.path() + " (defaults)" : named, ": ", error.what());
  }
}

/// Reads every described parameter of `value` present in the table, each checked by its rule.
/// Example: table {lr = 0} into optimizer_options -> "run.toml: optimizer.lr = 0: must be positive".
template <Described T>
void read_parameters(table_reader& r, T& value) {
  std::apply(
      [&](const auto&... p) { (r.read(p.name, value.*(p.member), [&](const auto& v) { return p.why(v); }), ...); },
      T::parameters());
}

/// Reads a policy of List's family into `out`: the name under `kind_key` (absent: out's current policy's name,
/// unless `required`), that policy's defaults, then its parameters. Keys of the family's other policies are known
/// but rejected: "run.toml: correlator.s = 2: is not used by correlator.kind = \"scaled\"".
/// @post out holds the named policy with every given parameter obeying its rule.
template <PolicyList List>
void read_policy(table_reader& r, std::string_view kind_key, any_policy<List>& out, bool required = false) {
  const std::vector<std::string_view> names(List::names.begin(), List::names.end());
  std::string kind(out.name());
  if (!r.read(kind_key, kind, one_of(names)) && required)
    fail(r.file(), ": ", r.path(), ": needs a ", kind_key, " (", name_list(names), ")");
  std::set<std::string_view> own;
  for_each_policy<List>([&]<class P>(std::type_identity<P>) {
    if (P::name == kind) std::apply([&](const auto&... p) { (own.insert(p.name), ...); }, parameters_of<P>());
  });
  const std::string why = "is not used by " + r.key_path(kind_key) + " = \"" + kind + "\"";
  for_each_policy<List>([&]<class P>(std::type_identity<P>) {
    std::apply([&](const auto&... p) { ((own.contains(p.name) ? void() : r.only_if(false, p.name, why)), ...); },
               parameters_of<P>());
  });
  for_each_policy<List>([&]<class P>(std::type_identity<P>) {
    if (P::name != kind) return;
    P policy{};
    if constexpr (Described<P>) read_parameters(r, policy);
    out.policy = std::move(policy);
  });
}

}  // namespace branchgrpo::config
