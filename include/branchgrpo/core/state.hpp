#pragma once
// State beyond a component's parameters, for checkpoints: a stateful component (per_prompt_running's reward
// buffers) saves it as named buffers of doubles and restores it from them. Everything else is stateless.
#include <concepts>
#include <map>
#include <string>
#include <vector>

namespace branchgrpo {

/// Named buffers of doubles, e.g. {"prompt.3": {0.5, 0.7}}.
using component_state = std::map<std::string, std::vector<double>>;

/// A component whose state can be saved and restored: load_state(save_state()) leaves it as it was.
template <class C>
concept Stateful = requires(const C& saved, C& restored, const component_state& state) {
  { saved.save_state() } -> std::same_as<component_state>;
  restored.load_state(state);
};

}  // namespace branchgrpo
