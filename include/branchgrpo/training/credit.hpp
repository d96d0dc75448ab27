#pragma once
// Stages 2 and 3's data: which trees of a rollout train (keep_finite_trees, score_leaves) and the credit of the
// kept trees (edge_credit, filled by assign_credit in training/trainer.hpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/pruning/concept.hpp"
#include "branchgrpo/rollout/engine.hpp"
#include "branchgrpo/training/concepts.hpp"

namespace branchgrpo {

namespace detail {

/// The forest restricted to `kept` trees (in order), with the rollout's log-probs, values and stops copied.
inline rollout_tree select_trees(const rollout_tree& tree, std::span<const std::int32_t> kept) {
  std::vector<tree_info> infos;
  for (std::int32_t t : kept) infos.push_back(tree.info(t));
  rollout_tree subset(tree.plan(), std::move(infos));
  const std::int32_t per_tree = tree.nodes_per_tree();
  auto log_probs = subset.mutable_log_probs();
  for (std::size_t i = 0; i < kept.size(); ++i) {
    std::copy_n(tree.log_probs().begin() + kept[i] * per_tree, per_tree,
                log_probs.begin() + static_cast<std::ptrdiff_t>(i) * per_tree);
    subset.mark_tree(static_cast<std::int32_t>(i), tree.marks_of_tree(kept[i]));
  }
  return subset;
}

}  // namespace detail

/// Whether every value recorded on tree t (a value function's scores of x0-hat, rollout_tree::set_values) is finite.
inline bool finite_values(const rollout_tree& tree, std::int32_t t) {
  if (!tree.has_values()) return true;
  const rollout_tree::tree_marks marks = tree.marks_of_tree(t);
  return std::all_of(marks.values.begin(), marks.values.end(), [](double v) { return std::isfinite(v); });
}

/// The leaf rewards of a rollout with the non-finite-reward policy applied: a tree with any non-finite leaf reward,
/// or any non-finite value of a node its rollout valued, is dropped from the update, its finite leaves too (a
/// half-scored tree would bias its own baseline).
struct scored_leaves {
  std::vector<double> scores;                  ///< every leaf's reward, tree.leaves() order
  std::vector<std::int32_t> kept_trees;        ///< the trees whose leaf rewards are all finite, in order
  std::vector<double> kept_scores;             ///< those trees' leaf rewards, tree.leaves() order
  double mean = 0, std = 0, min = 0, max = 0;  ///< over kept_scores (population std); NaN when none was kept
  /// A ComponentReward's parts: rows over every leaf (components) and over the kept trees' leaves
  /// (kept_components), in the reward's order; empty for a reward that reports none.
  std::vector<reward_component> components = {};
  std::vector<reward_component> kept_components = {};
};

/// Stage 2 of an iteration, on rewards already computed: which trees train, and the statistics of their rewards.
/// Example: 2 trees of 2 leaves, scores {0.1, 0.5, NaN, 0.3} -> kept_trees {0}, kept_scores {0.1, 0.5},
///   mean 0.3, std 0.2, min 0.1, max 0.5.
///   With components {"a", weight 1, {0.1, 0.2, 0.3, 0.4}} -> kept_components {"a", 1, {0.1, 0.2}}.
/// @pre scores.size() == tree.leaf_count(), and so every component's rows (else invalid_input naming both).
/// @post kept_scores.size() == kept_trees.size() * tree.leaves_per_tree(), and so every kept component's rows;
///       every kept score finite.
inline scored_leaves keep_finite_trees(const rollout_tree& tree, std::vector<double> scores,
                                       std::vector<reward_component> components = {}) {
  require(scores.size() == static_cast<std::size_t>(tree.leaf_count()), "reward returned ", scores.size(),
          " scores for ", tree.leaf_count(), " leaves");
  for (const reward_component& part : components)
    require(part.rows.size() == scores.size(), "reward part '", part.name, "' returned ", part.rows.size(),
            " scores for ", tree.leaf_count(), " leaves");
  scored_leaves out{.scores = std::move(scores), .kept_trees = {}, .kept_scores = {}};
  out.components = std::move(components);
  for (const reward_component& part : out.components)
    out.kept_components.push_back({.name = part.name, .weight = part.weight, .rows = {}});
  const std::int32_t leaves_per_tree = tree.leaves_per_tree();
  for (std::int32_t t = 0; t < tree.tree_count(); ++t) {
    const auto offset = static_cast<std::ptrdiff_t>(t) * leaves_per_tree;
    const auto first = out.scores.begin() + offset;
    if (std::all_of(first, first + leaves_per_tree, [](double r) { return std::isfinite(r); }) &&
        finite_values(tree, t)) {
      out.kept_trees.push_back(t);
      out.kept_scores.insert(out.kept_scores.end(), first, first + leaves_per_tree);
      for (std::size_t c = 0; c < out.components.size(); ++c) {
        const auto part = out.components[c].rows.begin() + offset;
        out.kept_components[c].rows.insert(out.kept_components[c].rows.end(), part, part + leaves_per_tree);
      }
    }
  }
  if (out.kept_scores.empty()) {
    out.mean = out.std = out.min = out.max = std::numeric_limits<double>::quiet_NaN();
    return out;
  }
  const auto [low, high] = std::minmax_element(out.kept_scores.begin(), out.kept_scores.end());
  double sum = 0, squares = 0;
  for (double r : out.kept_scores) sum += r;
  out.mean = sum / static_cast<double>(out.kept_scores.size());
  for (double r : out.kept_scores) squares += (r - out.mean) * (r - out.mean);
  out.std = std::sqrt(squares / static_cast<double>(out.kept_scores.size()));
  out.min = *low;
  out.max = *high;
  return out;
}

/// Every leaf's score from the sampled leaves' scores (`sampled`, in tree.leaves() order of the sampled leaves): a
/// leaf that was not sampled scores its tree.leaf_value_source: below a stopped node (rollout_tree::stop) that node's
/// value, tree.value(node), or `node_values[node]` when given (a reward part's values); below a left-out node
/// (rollout_tree::leave_out) the score of the sampled leaf it mirrors.
/// Example: one tree {steps 2, branching {2, 1}} after stop({1}, {0.4}), sampled {0.7} -> {0.4, 0.7}; after
///   leave_out({2}) instead, sampled {0.9} -> {0.9, 0.9}. With every leaf sampled the result is `sampled`.
/// @pre sampled has one score per sampled leaf; node_values empty or one value per node (else invalid_input).
inline std::vector<double> with_phantom_leaves(const rollout_tree& tree, std::span<const double> sampled,
                                               std::span<const double> node_values = {}) {
  if (!tree.has_unsampled_leaves()) {
    require(sampled.size() == static_cast<std::size_t>(tree.leaf_count()), "reward returned ", sampled.size(),
            " scores for ", tree.leaf_count(), " leaves");
    return {sampled.begin(), sampled.end()};
  }
  require(node_values.empty() || node_values.size() == static_cast<std::size_t>(tree.node_count()), "got ",
          node_values.size(), " node values for ", tree.node_count(), " nodes");
  const std::span<const std::int32_t> leaves = tree.leaves();
  std::vector<double> all(leaves.size());
  std::size_t next = 0;
  for (std::size_t i = 0; i < leaves.size(); ++i)
    if (tree.sampled(leaves[i])) {
      require(next < sampled.size(), "reward returned ", sampled.size(), " scores for more sampled leaves");
      all[i] = sampled[next++];
    }
  require(next == sampled.size(), "reward returned ", sampled.size(), " scores for ", next, " sampled leaves");
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    if (tree.sampled(leaves[i])) continue;
    const std::int32_t source = tree.leaf_value_source(leaves[i]);
    all[i] = tree.is_leaf(source)  ? all[static_cast<std::size_t>(tree.leaf_position(source))]
             : node_values.empty() ? tree.value(source)
                                   : node_values[static_cast<std::size_t>(source)];
  }
  return all;
}

/// The reward of `x`, one row per node of `rows` (sampled nodes of `tree`, tree-major) with its tree's prompt. A
/// groupwise reward sees each tree's rows as one group when every tree has equally many (a cut keeps min(keep,
/// frontier) nodes in each); trees of different shapes (adaptive_branching) have no common group size, so a reward that
/// is also pointwise is called pointwise, and one that is only groupwise is refused in one line.
template <Backend B, Reward<B> Score>
std::vector<double> score_tree_rows(Score& reward, const typename B::tensor& x, const rollout_tree& tree,
                                    std::span<const std::int32_t> rows) {
  std::vector<std::int64_t> prompts;
  for (const std::int32_t n : rows) prompts.push_back(tree.info(tree.tree(n)).prompt);
  std::vector<std::uint32_t> keys;
  for (std::int32_t t = 0; t < tree.tree_count(); ++t) keys.push_back(tree.info(t).key);
  std::vector<std::int32_t> count(static_cast<std::size_t>(tree.tree_count()), 0);
  for (const std::int32_t n : rows) ++count[static_cast<std::size_t>(tree.tree(n))];
  const bool uniform = std::all_of(count.begin(), count.end(), [&](std::int32_t c) { return c == count.front(); });
  if (uniform) return score_rows<B>(reward, x, prompts, leaf_groups{.leaves_per_tree = count.front(), .keys = keys});
  if constexpr (PointwiseReward<Score, B>) {
    return reward(x, prompts);
  } else {
    const auto first = std::find_if(count.begin(), count.end(), [&](std::int32_t c) { return c != count.front(); });
    fail("a groupwise reward needs the same number of rows in every tree: tree 0 has ", count.front(), ", tree ",
         first - count.begin(), " has ", *first,
         " (trees of different shapes: use a pointwise reward with adaptive_branching)");
  }
}

/// Stage 2: scores the rollout's sampled leaves (their final latents, each with its tree's prompt; a groupwise reward
/// also sees which tree each leaf is of) and applies keep_finite_trees, with the parts of a ComponentReward. A
/// phantom leaf below a stopped node scores that node's value (tree.value), and each part its part of the value
/// (`value_parts`: rows per node, as the value function's call reported them).
/// @pre the reward returns one score per sampled leaf (else invalid_input).
template <Backend B, Reward<B> Score>
scored_leaves score_leaves(B& backend, Score& reward, const rollout_result<B>& result,
                           std::span<const reward_component> value_parts = {}) {
  const rollout_tree& tree = result.tree;
  std::vector<std::int32_t> sampled_leaves;
  for (const std::int32_t leaf : tree.leaves())
    if (tree.sampled(leaf)) sampled_leaves.push_back(leaf);
  std::vector<double> scores =
      with_phantom_leaves(tree, score_tree_rows<B>(reward, leaf_latents(backend, result), tree, sampled_leaves));
  std::vector<reward_component> components;
  if constexpr (ComponentReward<Score>) {
    const std::span<const reward_component> parts = reward.last_component_rows();
    for (const reward_component& part : parts) {
      std::span<const double> node_rows;
      for (const reward_component& valued : value_parts)
        if (valued.name == part.name) node_rows = valued.rows;
      require(!tree.has_stops() || !node_rows.empty(), "reward part '", part.name,
              "' has no value at the stopped nodes");
      components.push_back(
          {.name = part.name, .weight = part.weight, .rows = with_phantom_leaves(tree, part.rows, node_rows)});
    }
  }
  return keep_finite_trees(tree, std::move(scores), std::move(components));
}

/// Credit assignment of the kept trees: the fused reward and the advantage of every node, the pruner's mask, and
/// the trained edges with their advantages, ordered for the update.
struct edge_credit {
  rollout_tree kept;                        ///< the forest of the kept trees (log-probs copied)
  std::vector<double> fused = {};           ///< per node of `kept`
  std::vector<double> advantages = {};      ///< per node of `kept` (the edge into it)
  edge_mask mask = {};                      ///< per node of `kept`: 1 = the pruner keeps the edge
  std::vector<std::int32_t> trained = {};   ///< nodes of the full forest whose (SDE, kept) edges train, by step
  std::vector<double> edge_advantage = {};  ///< per node of the full forest: a trained edge's advantage, else 0
};

}  // namespace branchgrpo
