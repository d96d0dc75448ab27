#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "branchgrpo/advantage/concept.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/core/state.hpp"
#include "branchgrpo/tree/leaf_rewards.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

namespace detail {

/// Population standard deviation (divide by m, as np.std) of a non-empty range, two-pass.
template <class Iterator>
double population_std(Iterator begin, Iterator end) {
  double sum = 0.0;
  std::size_t m = 0;
  for (Iterator it = begin; it != end; ++it, ++m) sum += *it;
  const double mean = sum / static_cast<double>(m);
  double squares = 0.0;
  for (Iterator it = begin; it != end; ++it) squares += (*it - mean) * (*it - mean);
  return std::sqrt(squares / static_cast<double>(m));
}

}  // namespace detail

/// Flow-GRPO's per-prompt stat tracker. Per prompt id it keeps a FIFO buffer of the `history` most recent
/// leaf rewards. Each call first appends this iteration's leaf rewards of every prompt (trees in order)
/// and drops the oldest beyond `history`, then A_l = (r_l - mean(buffer)) / (std(buffer) + epsilon),
/// std the population std (np.std). global_std uses the population std of all of this call's leaf
/// rewards instead (Flow-GRPO's global_std option). Edges get leaf advantages as in leaf_group.
/// Example: one tree of the 7-node uniform_mean tree, prompt 0, fresh tracker:
///   call 1, leaf rewards {1, 3, 2, 6}: buffer {1, 3, 2, 6}, mean 3, std sqrt(3.5) = 1.87083 ->
///     leaf advantages {-1.06899, 0, -0.53449, 1.60348}, result {0, -0.53449, 0.53449, -1.06899, 0, -0.53449, 1.60348};
///   call 2, leaf rewards {5, 5, 5, 5}: buffer {1, 3, 2, 6, 5, 5, 5, 5}, mean 4, std sqrt(2.75) = 1.65831 ->
///     every leaf and edge 1 / 1.65841 = 0.60299, root 0.
/// @pre history >= 1; epsilon finite and > 0; rewards.leaf.size() == tree.leaf_count(), finite. On a
///   rejected call the buffers are unchanged.
/// @post result.size() == tree.node_count(); roots 0; every prompt of the call has at most `history`
///   rewards buffered.
struct per_prompt_running {
  std::size_t history = 64;
  double epsilon = 1e-4;
  bool global_std = false;
  /// State: the buffered leaf rewards per prompt id, oldest first.
  std::map<std::int64_t, std::deque<double>> buffers{};

  std::vector<double> operator()(const rollout_tree& tree, const reward_view& rewards) {
    require(history >= 1, "per_prompt_running history ", history, " is below 1");
    require(std::isfinite(epsilon) && epsilon > 0.0, "per_prompt_running epsilon ", epsilon,
            " is not a finite value > 0");
    const std::span<const double> leaf = rewards.leaf;
    check_leaf_rewards(tree, leaf);
    const auto per_tree = static_cast<std::size_t>(tree.leaves_per_tree());
    for (std::int32_t t = 0; t < tree.tree_count(); ++t) {
      std::deque<double>& buffer = buffers[tree.info(t).prompt];
      const std::size_t first = static_cast<std::size_t>(t) * per_tree;
      buffer.insert(buffer.end(), leaf.begin() + static_cast<std::ptrdiff_t>(first),
                    leaf.begin() + static_cast<std::ptrdiff_t>(first + per_tree));
      while (buffer.size() > history) buffer.pop_front();
    }
    double batch_std = 0.0;
    if (global_std) batch_std = detail::population_std(leaf.begin(), leaf.end());
    std::vector<double> leaf_advantages(leaf.size());
    for (std::int32_t t = 0; t < tree.tree_count(); ++t) {
      const std::deque<double>& buffer = buffers.at(tree.info(t).prompt);
      double mean = 0.0;
      for (const double r : buffer) mean += r;
      mean /= static_cast<double>(buffer.size());
      const double sigma = global_std ? batch_std : detail::population_std(buffer.begin(), buffer.end());
      const std::size_t first = static_cast<std::size_t>(t) * per_tree;
      for (std::size_t i = first; i < first + per_tree; ++i) leaf_advantages[i] = (leaf[i] - mean) / (sigma + epsilon);
    }
    return spread_leaf_advantages(tree, leaf_advantages);
  }

  /// Forgets every buffered reward (Flow-GRPO clears its tracker once per epoch).
  void clear() { buffers.clear(); }

  /// The buffers as {"prompt.<id>": rewards, oldest first} (concept Stateful).
  /// Example: after call 1 of the example above, {"prompt.0": {1, 3, 2, 6}}.
  [[nodiscard]] component_state save_state() const {
    component_state state;
    for (const auto& [prompt, buffer] : buffers)
      state["prompt." + std::to_string(prompt)] = std::vector<double>(buffer.begin(), buffer.end());
    return state;
  }

  /// Replaces the buffers with what save_state returned.
  /// @pre every key is "prompt.<integer id>" and every buffer holds finite values (else invalid_input naming it,
  ///      nothing changed).
  void load_state(const component_state& state) {
    std::map<std::int64_t, std::deque<double>> loaded;
    for (const auto& [key, values] : state) {
      const std::int64_t prompt = prompt_state_key(key, "per_prompt_running");
      for (const double v : values) require(std::isfinite(v), "per_prompt_running state ", key, " holds ", v);
      loaded[prompt] = std::deque<double>(values.begin(), values.end());
    }
    buffers = std::move(loaded);
  }

  friend bool operator==(const per_prompt_running&, const per_prompt_running&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "per_prompt_running", summary = "running per-prompt statistics (Flow-GRPO)";
  static constexpr auto parameters() {
    return std::tuple{
        parameter("history", &per_prompt_running::history, "leaf rewards buffered per prompt", rules::at_least{1}),
        parameter("epsilon", &per_prompt_running::epsilon, "added to the std before dividing",
                  rules::in_range{.low = 1e-30, .high = 1}),
        parameter("global_std", &per_prompt_running::global_std,
                  "divide by the std of the whole call instead of the prompt's buffer", rules::any{})};
  }
};

}  // namespace branchgrpo
