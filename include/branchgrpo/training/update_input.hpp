#pragma once
// What stage 4 of an iteration hands an objective's update (an objective's update(policy, input, communicator),
// loss/objective.hpp): this rank's rollout, the credit of the whole forest, and the run's settings.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/rollout/engine.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/training/concepts.hpp"
#include "branchgrpo/training/credit.hpp"
#include "branchgrpo/training/options.hpp"

namespace branchgrpo {

/// The inputs of one update. With one rank, forest is result.tree and share owns every tree.
/// Example: 4 trees of 31 nodes on 2 ranks, rank 1 -> share {2, 4}, first_node() 62, end_node() 124.
template <Backend B, Stepper S>
struct update_input {
  B& backend;
  const rollout_result<B>& result;           ///< this rank's trees: latents, edge stds, log-probs
  const rollout_tree& forest;                ///< every rank's trees (log-probs gathered)
  std::span<const std::int32_t> kept_trees;  ///< the trees of `forest` that train (keep_finite_trees)
  const edge_credit& credit;                 ///< the credit of the kept trees
  tree_share share;                          ///< this rank's trees of `forest`
  const S& stepper;                          ///< the rollout's (transition coefficients)
  const sigma_schedule& schedule;
  const latent_shape& shape;
  const training_options& options;
  std::uint32_t iteration = 0;

  /// The first node of this rank's trees in `forest`, and the end of them.
  [[nodiscard]] std::int32_t first_node() const {
    return static_cast<std::int32_t>(share.first) * forest.nodes_per_tree();
  }
  [[nodiscard]] std::int32_t end_node() const {
    return static_cast<std::int32_t>(share.last) * forest.nodes_per_tree();
  }
};

/// The trained edges `nodes` (of this rank's forest, all into one step) as a batch: the parents' latents x, the
/// children's latents next, the edges' stds and the rollout's transition coefficients at that step.
/// Example: the 4 edges of step 19 of a dense tree -> step 19, x 4 rows of latents[19], next 4 rows of latents[20].
/// @pre nodes non-empty, all of one step.
template <Backend B, Stepper S>
edge_batch<typename B::tensor> transition_batch(const update_input<B, S>& input, std::span<const std::int32_t> nodes) {
  const rollout_tree& tree = input.result.tree;
  edge_batch<typename B::tensor> edges;
  edges.step = tree.step(tree.parent(nodes.front()));
  edges.sigma = input.schedule.sigma(edges.step);
  edges.coeffs = step_coefficients(input.stepper, input.schedule, edges.step, tree.plan().layer(edges.step));
  std::vector<std::int64_t> parent_rows, child_rows;
  for (const std::int32_t n : nodes) {
    parent_rows.push_back(tree.row_at_step(tree.parent(n)));
    child_rows.push_back(tree.row_at_step(n));
    edges.std.push_back(input.result.edge_std[static_cast<std::size_t>(n)]);
    edges.trees.push_back(tree.info(tree.tree(n)).key);
    edges.prompts.push_back(tree.info(tree.tree(n)).prompt);
  }
  const auto& latents = input.result.latents;
  edges.x = input.backend.gather_rows(latents[static_cast<std::size_t>(edges.step)], parent_rows);
  edges.next = input.backend.gather_rows(latents[static_cast<std::size_t>(edges.step) + 1], child_rows);
  return edges;
}

}  // namespace branchgrpo
