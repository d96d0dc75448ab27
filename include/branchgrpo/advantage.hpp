#pragma once
// Advantage normalizers: rewards -> one advantage per node, the advantage of the edge into it; roots 0
// (docs/advantage.md).
//
//   depth_wise          Paper Eq. 4 (BranchGRPO): A(n) = (r(n) - mu_d) / (sigma_d + epsilon) over the
//                       fused rewards of the nodes at depth d, per tree (the official code) or per batch;
//                       sigma unbiased. Use with a fusion for tree rollouts.
//   leaf_group          DanceGRPO: z-score of the raw leaf rewards within each prompt group, unbiased
//                       sigma; each edge gets the mean advantage of the leaves under it. Use for
//                       sequential baselines, or trees scored by leaf outcome only.
//   per_prompt_running  Flow-GRPO: like leaf_group, but mean and population sigma come from a FIFO buffer
//                       of each prompt's recent leaf rewards (stateful). Use when a prompt recurs across
//                       iterations with few samples per iteration.
//   per_reward<F, N>    MixGRPO's advantage_aggr: each part of a weighted reward fused by F and normalized by N on
//                       its own, the advantages summed with the weights. Use with several rewards of different
//                       scales (a combinator over any fusion and normalizer, not one of the list below).
//
// A normalizer is any copyable type with
// `std::vector<double> operator()(const rollout_tree&, const reward_view&)` (concept Normalizer).
// Advantages are not clipped here: clipping (the code's +-5) belongs to the loss.
// The list of these policies is advantage_policies (catalog.hpp), and any_normalizer chooses one of them at run time.
#include "branchgrpo/advantage/catalog.hpp"
#include "branchgrpo/advantage/concept.hpp"
#include "branchgrpo/advantage/depth_wise.hpp"
#include "branchgrpo/advantage/leaf_group.hpp"
#include "branchgrpo/advantage/per_prompt_running.hpp"
#include "branchgrpo/advantage/per_reward.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"
