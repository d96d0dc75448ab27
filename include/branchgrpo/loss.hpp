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
// Options of the same loss, off by default (composing with the clip and the KL term; with a BranchGRPO tree they
// are new here):
//   log r_hat = s (log r + mean_i dmu_i^2 / (2 s^2))                 ratio_norm_log_ratio   GRPO-Guard RatioNorm
//   w_t = 1 / (sigma_t - sigma_{t+1})                                 inverse_dt_weight      GRPO-Guard reweighting
//   w_t = std_t / mean_s std_s                                        noise_aware_weights    TempFlow-GRPO
// (ppo_options::ratio_norm, ppo_options::step_weight; loss/ratio_guard.hpp, loss/step_weights.hpp).
//
// Objectives (loss/objective.hpp, method's 7th component): ppo_ratio (the above, the default), or a decoupled
// objective trained by flow matching on the leaves, no transition log-prob: advantage_weighted_matching (AWM,
// arXiv 2509.25050) and diffusion_nft (DiffusionNFT, arXiv 2509.16117).
#include "branchgrpo/loss/objective.hpp"
#include "branchgrpo/loss/ppo.hpp"
#include "branchgrpo/loss/ratio_guard.hpp"
#include "branchgrpo/loss/step_weights.hpp"
