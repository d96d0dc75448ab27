#pragma once
// The policy loss of the update step (docs/loss.md), per trained edge, then averaged over the kept edges:
//
//   r = exp(logp_new - logp_old)                                  importance_ratio
//   A = clamp(advantage, -advantage_clip, advantage_clip)           clip_advantage   (+-5)
//   L_ppo = max(-A r, -A clamp(r, 1 - eps, 1 + eps))                ppo_clipped_loss (eps 1e-3, code 1e-4)
//   KL = mean_i (mu_i - mu_ref_i)^2 / (2 sigma^2)                    kl_flow          (Flow-GRPO form)
//   L = L_ppo + kl_beta * KL                                        edge_loss        (BranchGRPO: beta 0)
//
// ppo_options holds eps, the advantage clip and kl_beta. The formulas are generic over the value type
// (double, or a tensor type whose exp / clamp / max are found by ADL); the gradients
// ppo_clipped_loss_gradient and kl_flow_gradient are closed forms for double, used by exact-gradient toys.
// Use kl_beta > 0 (0.01 - 0.04) against reward hacking on long runs, as Flow-GRPO does.
//
// Objectives (loss/objective.hpp, method's 7th component): ppo_ratio (the above, the default), or a decoupled
// objective trained by flow matching on the leaves, no transition log-prob: advantage_weighted_matching (AWM,
// arXiv 2509.25050) and diffusion_nft (DiffusionNFT, arXiv 2509.16117).
#include "branchgrpo/loss/objective.hpp"
#include "branchgrpo/loss/ppo.hpp"
