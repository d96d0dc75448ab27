#pragma once
// Fusion weightings: leaf rewards (indexed like tree.leaves()) -> one reward per node (docs/fusion.md).
// Every fusion but step_gain is a weighted mean of the leaf rewards under a node; leaves keep their own reward.
//
//   uniform_mean   r(n) = mean of the leaf rewards under n. The official code's default and Eq. 3 at
//                  beta = 0. Use by default: robust, no dependence on log-probs.
//   path_softmax   Paper Eq. 3: r(n) = sum_l softmax_l(beta * log p(path n -> l)) r_l. beta = 1 is the
//                  paper's path-probability weighting; use it to favour likely continuations.
//   split_softmax  The official code's "weighted" option: r(n) = sum_c softmax_c(alpha * log_prob(c)) r(c),
//                  recursive over the splits. Use to reproduce the official runs.
//   max_reward     r(n) = max of the leaf rewards under n. Use for optimistic, best-of-branch credit.
//   step_gain      Dense step rewards: r(n) = (1 - w) mean of the leaves under n + w (V(n) - V(parent)), V the
//                  reward of a node's x0-hat = x - sigma v, valued during the rollout (one reward call per step).
//                  Use to credit each step with what it gained (DenseGRPO, Stepwise-Flow-GRPO) on top of the tree.
//
// A fusion is any regular type with
// `std::vector<double> operator()(const rollout_tree&, std::span<const double>) const` (concept Fusion).
// The helpers these are written with (leaf-reward checks, the bottom-up level pass) are in
// tree/leaf_rewards.hpp and tree/levels.hpp.
// The list of these policies is fusion_policies (catalog.hpp), and any_fusion chooses one of them at run time.
#include "branchgrpo/fusion/catalog.hpp"
#include "branchgrpo/fusion/concept.hpp"
#include "branchgrpo/fusion/max_reward.hpp"
#include "branchgrpo/fusion/path_softmax.hpp"
#include "branchgrpo/fusion/split_softmax.hpp"
#include "branchgrpo/fusion/step_gain.hpp"
#include "branchgrpo/fusion/uniform_mean.hpp"
#include "branchgrpo/tree/leaf_rewards.hpp"
#include "branchgrpo/tree/levels.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"
