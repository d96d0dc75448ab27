#pragma once
// A cut of the rollout by a value estimate: at one step, each tree keeps the frontier nodes with the best values and
// stops sampling below the others (rollout_tree::stop). The value of a frontier node is a score of its predicted
// clean sample x0-hat = x - sigma v, from the velocity the step computes anyway; pruning/value.hpp is the policy
// that asks for a cut, the rollout engine (rollout/engine.hpp) makes it.
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// Where and how wide the rollout is cut: at step `step` (-1: never) every tree keeps its `keep` best-valued
/// frontier nodes. With value_every_step every evaluated frontier is valued (its values recorded on the tree for
/// dense rewards), whether or not a cut is made.
struct rollout_cut {
  int step = -1;
  std::int32_t keep = 1;
  bool value_every_step = false;

  [[nodiscard]] bool active() const { return step >= 0; }
  [[nodiscard]] bool values_any() const { return active() || value_every_step; }
  friend bool operator==(const rollout_cut&, const rollout_cut&) = default;
};

/// A value function for a cut or dense rewards: one value per row of `x0_hat`, the predicted clean samples of `nodes`
/// (sampled nodes of `tree`, one step, tree-major). NaN marks a node it cannot value (ranked last).
template <class V, class B>
concept RolloutValue = Backend<B> && requires(V& value, const typename B::tensor& x0_hat, const rollout_tree& tree,
                                              std::span<const std::int32_t> nodes) {
  { value(x0_hat, tree, nodes) } -> std::same_as<std::vector<double>>;
};

/// The value function of a rollout without a cut (never called).
struct no_value {
  template <class Tensor>
  std::vector<double> operator()(const Tensor&, const rollout_tree&, std::span<const std::int32_t>) const {
    fail("no_value was called: a rollout_cut with a step needs a value function");
  }
};

/// Throws invalid_input naming the first key of `cut` that does not fit `plan`.
/// @post !cut.active(), or cut.step is an evaluated step at or before the last split and cut.keep >= 1.
inline void validate(const rollout_cut& cut, const tree_plan& plan) {
  if (!cut.active()) return;
  const std::vector<int> splits = plan.branching_steps();
  require(!splits.empty() && cut.step <= splits.back(), "value pruning step = ", cut.step, " is past the last split (",
          splits.empty() ? std::string("this tree has none") : "step " + std::to_string(splits.back()),
          "): nothing is left to prune");
  require(plan.kinds[static_cast<std::size_t>(cut.step)] != edge_kind::skip, "value pruning step = ", cut.step,
          " is a skip step: no velocity is computed there to value its nodes");
  require(cut.keep >= 1, "value pruning keep = ", cut.keep, " leaves no leaf in a tree");
}

/// The frontier nodes a cut stops: in each tree, all but the `keep` with the highest values (NaN lowest; among equal
/// values the earlier node stays). `frontier` is tree-major, `values` one per frontier node.
/// Example: frontier {3, 4, 5, 6} of one tree, values {0.2, 0.9, NaN, 0.2}, keep 2 -> {5, 6}.
/// @pre values.size() == frontier.size(); keep >= 1.
/// @post every tree keeps min(keep, its frontier nodes) nodes; the result is in node order.
inline std::vector<std::int32_t> nodes_to_stop(const rollout_tree& tree, std::span<const std::int32_t> frontier,
                                               std::span<const double> values, std::int32_t keep) {
  require(values.size() == frontier.size(), "the value function returned ", values.size(), " values for ",
          frontier.size(), " nodes");
  require(keep >= 1, "value pruning keep = ", keep, " leaves no leaf in a tree");
  const auto better = [&](std::size_t a, std::size_t b) {
    const bool a_valued = !std::isnan(values[a]), b_valued = !std::isnan(values[b]);
    if (a_valued != b_valued) return a_valued;
    return a_valued && values[a] > values[b];
  };
  std::vector<std::int32_t> stopped;
  for (std::size_t first = 0; first < frontier.size();) {
    std::size_t last = first;
    while (last < frontier.size() && tree.tree(frontier[last]) == tree.tree(frontier[first])) ++last;
    std::vector<std::size_t> order(last - first);
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = first + i;
    std::stable_sort(order.begin(), order.end(), better);
    for (std::size_t i = static_cast<std::size_t>(keep); i < order.size(); ++i) stopped.push_back(frontier[order[i]]);
    first = last;
  }
  std::sort(stopped.begin(), stopped.end());
  return stopped;
}

}  // namespace branchgrpo
