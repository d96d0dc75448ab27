#pragma once
// Reads the params of one [[rewards]] (or [[eval.rewards]]) entry as its reward_table entry declares them
// (reward_table.hpp): numbers and strings by name, each checked by its declared rule as it is read, and, at the
// end, every param the entry sets that its reward does not take (for the model's medium) refused. Each error is one
// line naming the entry and the key; the builder (tools/app/branchgrpo/app/reward_builds.hpp) gives the defaults.
//
//   reward_param_reader p{.source = "run.toml", .entry = {name "jpeg_compressibility", params {quality = 101}},
//                         .index = 0, .reward = *find_reward("jpeg_compressibility"), .medium = image};
//   p.number("quality", 95)  throws "run.toml: rewards[0].params.quality = 101: must be an integer in [1, 100]"
//   params {colour = 1} of alignment, p.finish() throws
//     "run.toml: unknown key rewards[0].params.colour (alignment has: colour_weight, colour_width, fill_width)"
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>

#include "branchgrpo/config/reward_table.hpp"
#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/core/error.hpp"

namespace branchgrpo {

namespace detail {
/// A double in its shortest round-trip form (for messages). Example: 1e6 -> "1e+06", 0.001 -> "0.001".
inline std::string run_number_text(double value) {
  char buffer[64];
  return std::string(buffer, std::to_chars(buffer, buffer + sizeof buffer, value).ptr);
}
}  // namespace detail

/// Why `value` breaks `param`'s rule, "" when it does not.
/// Example: {rule integer_in, low 1, high 100} with 101 -> "must be an integer in [1, 100]"; with 95 -> "".
inline std::string param_why(const reward_param& param, double value) {
  using detail::run_number_text;
  const std::string range = "[" + run_number_text(param.low) + ", " + run_number_text(param.high) + "]";
  const bool integer = value == std::floor(value);
  switch (param.rule) {
    case param_rule::positive:
      return value > 0 && std::isfinite(value) ? "" : "must be positive";
    case param_rule::integer_in:
      return value >= param.low && value <= param.high && integer ? "" : "must be an integer in " + range;
    case param_rule::integer_from:
      return value >= param.low && integer ? "" : "must be an integer >= " + run_number_text(param.low);
    case param_rule::zero_or_in:
    case param_rule::in_range:
      if (param.rule == param_rule::zero_or_in && value == 0) return "";
      if (!(value >= param.low && value <= param.high)) return "must be in " + range;
      return param.whole && !integer ? "must be an integer" : "";
    case param_rule::any:
    case param_rule::http_url:
      return "";
  }
  return "";
}

/// The reader of one entry's params (see the file comment).
/// @pre reward is the reward_table entry named entry.name and serves medium.
/// @post each number() or text() value satisfies its declared rule; finish() leaves no undeclared key.
struct reward_param_reader {
  std::string source;  ///< the config file errors start with
  const reward_entry& entry;
  std::size_t index;
  std::string_view list = "rewards";  ///< "rewards" or "eval.rewards"
  const reward_descriptor& reward;
  reward_media medium = reward_media::image;

  /// "rewards[2]": the entry, as errors name it.
  [[nodiscard]] std::string where() const { return std::string(list) + "[" + std::to_string(index) + "]"; }
  /// "<source>: <where>.params.<key> = <value>: <why>".
  [[noreturn]] void bad(std::string_view key, const std::string& value, const std::string& why) const {
    fail(source, ": ", where(), ".params.", key, " = ", value, ": ", why);
  }
  /// The number params.<key> (fallback when unset), checked by its declared rule.
  /// @pre the reward declares `key` as a number param for the medium.
  double number(std::string_view key, double fallback) const {
    const reward_param& param = declared(key, false);
    const auto it = entry.params.find(std::string(key));
    if (it == entry.params.end()) return fallback;
    const double* v = std::get_if<double>(&it->second);
    if (v == nullptr) bad_type(key, "must be a number");
    if (const std::string why = param_why(param, *v); !why.empty()) bad(key, detail::run_number_text(*v), why);
    return *v;
  }
  /// The string params.<key> (fallback when unset), checked by its declared rule.
  /// @pre the reward declares `key` as a string param for the medium.
  std::string text(std::string_view key, const std::string& fallback) const {
    const reward_param& param = declared(key, true);
    const auto it = entry.params.find(std::string(key));
    std::string value = fallback;
    if (it != entry.params.end()) {
      const std::string* v = std::get_if<std::string>(&it->second);
      if (v == nullptr) bad_type(key, "must be a string");
      value = *v;
    }
    if (!param.required.empty() && value.empty()) fail(source, ": ", where(), ".params.", key, ": ", param.required);
    if (param.rule == param_rule::http_url && !value.starts_with("http://") && !value.starts_with("https://"))
      bad(key, "'" + value + "'", "is not http:// or https://");
    return value;
  }
  /// Refuses the first param the entry sets that its reward does not take for the medium:
  /// "<source>: unknown key <where>.params.<key> (<name> has: <its params>)".
  void finish() const {
    for (const auto& [key, value] : entry.params)
      if (!takes(key)) {
        std::string names;
        for (const reward_param& p : reward.params)
          if (serves(p.media, medium)) names += (names.empty() ? "" : ", ") + std::string(p.name);
        fail(source, ": unknown key ", where(), ".params.", key, " (", entry.name,
             " has: ", names.empty() ? std::string("no parameters") : names, ")");
      }
  }

 private:
  [[nodiscard]] bool takes(std::string_view key) const {
    return std::any_of(reward.params.begin(), reward.params.end(),
                       [&](const reward_param& p) { return p.name == key && serves(p.media, medium); });
  }
  const reward_param& declared(std::string_view key, bool text) const {
    for (const reward_param& p : reward.params)
      if (p.name == key && p.text == text && serves(p.media, medium)) return p;
    throw std::logic_error("reward '" + std::string(reward.name) + "' reads params." + std::string(key) +
                           ", which reward_table does not declare as a " + (text ? "string" : "number"));
  }
  [[noreturn]] void bad_type(std::string_view key, const std::string& why) const {
    const auto& value = entry.params.at(std::string(key));
    const std::string text = std::holds_alternative<std::string>(value) ? "'" + std::get<std::string>(value) + "'"
                             : std::holds_alternative<bool>(value)      ? (std::get<bool>(value) ? "true" : "false")
                                                                   : detail::run_number_text(std::get<double>(value));
    bad(key, text, why);
  }
};

}  // namespace branchgrpo
