#pragma once
// State beyond a component's parameters, for checkpoints: a stateful component (per_prompt_running's reward
// buffers) saves it as named buffers of doubles and restores it from them. Everything else is stateless.
#include <charconv>
#include <concepts>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "branchgrpo/core/error.hpp"

namespace branchgrpo {

/// Named buffers of doubles, e.g. {"prompt.3": {0.5, 0.7}}.
using component_state = std::map<std::string, std::vector<double>>;

/// A component whose state can be saved and restored: load_state(save_state()) leaves it as it was.
template <class C>
concept Stateful = requires(const C& saved, C& restored, const component_state& state) {
  { saved.save_state() } -> std::same_as<component_state>;
  restored.load_state(state);
};

/// The prompt id of a per-prompt state key "prompt.<id>" (per_prompt_running's buffers, adaptive_branching's records).
/// Example: prompt_state_key("prompt.12", "per_prompt_running") == 12; "prompt.x" -> invalid_input
///   "per_prompt_running state key 'prompt.x' is not prompt.<id>".
inline std::int64_t prompt_state_key(const std::string& key, std::string_view owner) {
  constexpr std::string_view prefix = "prompt.";
  std::int64_t prompt = 0;
  const char* first = key.data() + (key.starts_with(prefix) ? prefix.size() : 0);
  const char* last = key.data() + key.size();
  const auto [end, error] = key.starts_with(prefix) ? std::from_chars(first, last, prompt)
                                                    : std::from_chars_result{first, std::errc::invalid_argument};
  require(error == std::errc{} && end == last && first != last, owner, " state key '", key, "' is not prompt.<id>");
  return prompt;
}

}  // namespace branchgrpo
