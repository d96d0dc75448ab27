#pragma once
// Rewards in the core: what the trainer asks of a reward (training/concepts.hpp) and the wrappers that do not
// depend on what is scored (docs/rewards.md). Image and video scorers live above the core (tools/app).
//
//   PointwiseReward      reward(leaves, prompts): one score per leaf from the leaf and its prompt alone. Most
//                        scorers (HPS, PickScore, CLIP score, the shapes reward).
//   GroupwiseReward      reward(leaves, prompts, groups): sees each tree's leaves at once (leaf_groups) and may
//                        score a leaf against its siblings. Use for pairwise judges and win rates.
//   win_rate<R>          Pref-GRPO: any pointwise R made groupwise, a leaf's score the fraction of its tree's
//                        leaves it beats (ties count `tie`). Use against reward hacking and scale differences.
//   ComponentReward      a reward that reports its weighted parts (reward_component) after each call; with
//                        per_reward (advantage/per_reward.hpp) each part is fused and normalized on its own.
//
// The trainer calls score_rows, which takes the groupwise form when a reward has it.
#include "branchgrpo/reward/win_rate.hpp"
#include "branchgrpo/training/concepts.hpp"
