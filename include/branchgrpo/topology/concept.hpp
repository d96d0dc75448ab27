#pragma once
#include <concepts>
#include <cstdint>
#include <span>
#include <variant>
#include <vector>

#include "branchgrpo/tree/rollout_tree.hpp"
#include "branchgrpo/tree/tree_plan.hpp"

namespace branchgrpo {

/// A topology policy turns a number of denoising steps into the plan of one rollout tree.
template <class T>
concept Topology = std::regular<T> && requires(const T& topology, int steps) {
  { topology(steps) } -> std::same_as<tree_plan>;
};

/// A topology whose trees differ per prompt (adaptive_branching): the plan is the envelope, split_levels gives each
/// tree of an iteration its level (apply_split_level), and observe learns from the iteration's kept trees.
template <class T>
concept AdaptiveTopology = Topology<T> &&
    requires(const T& topology, T& learning, const tree_plan& plan, std::span<const tree_info> trees,
             const rollout_tree& forest, std::span<const double> scores, std::span<const std::int32_t> kept) {
  { topology.split_levels(plan, trees) } -> std::same_as<std::vector<int>>;
  learning.observe(forest, scores, kept);
};

/// Each tree's split level when `topology` (or the policy a run-time choice holds) is adaptive, else empty: every
/// tree is the whole plan.
template <class T>
std::vector<int> split_levels_of(const T& topology, const tree_plan& plan, std::span<const tree_info> trees) {
  if constexpr (requires { topology.policy.index(); })
    return std::visit([&](const auto& held) { return split_levels_of(held, plan, trees); }, topology.policy);
  else if constexpr (AdaptiveTopology<T>)
    return topology.split_levels(plan, trees);
  else
    return {};
}

/// observe on an adaptive topology (or the one a run-time choice holds); nothing for any other.
template <class T>
void observe_rewards(T& topology, const rollout_tree& forest, std::span<const double> scores,
                     std::span<const std::int32_t> kept) {
  if constexpr (requires { topology.policy.index(); })
    std::visit([&](auto& held) { observe_rewards(held, forest, scores, kept); }, topology.policy);
  else if constexpr (AdaptiveTopology<T>)
    topology.observe(forest, scores, kept);
}

}  // namespace branchgrpo
