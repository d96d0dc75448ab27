#pragma once
// What stage 4 of an iteration hands an objective's update (an objective's update(policy, input, communicator),
// loss/objective.hpp): this rank's rollout, the credit of the whole forest, and the run's settings.
#include <cstdint>
#include <span>

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

}  // namespace branchgrpo
