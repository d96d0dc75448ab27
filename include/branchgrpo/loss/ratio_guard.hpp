#pragma once
// GRPO-Guard's RatioNorm (arXiv 2510.22319; docs/loss.md). For an SDE edge drawn from the old policy,
// next = mu_old + s eps with s the edge's std, the log importance ratio of the current policy (mean mu) is
//   log r = mean_i(eps_i dmu_i) / s - mean_i(dmu_i^2) / (2 s^2),   dmu = mu - mu_old,
// whose second term pulls the ratio's mean below 1 and whose first term's spread grows as s shrinks (late steps),
// so PPO's symmetric clip misses over-confident positive updates. RatioNorm adds the mean gap back and rescales:
//   log r_hat = s (log r + b) = mean_i(eps_i dmu_i),   b = mean_i(dmu_i^2) / (2 s^2),
// a ratio centred on 1 whose spread no longer grows as 1 / s, then clips r_hat = exp(log r_hat) as usual. b is
// kl_flow(mu, mu_old, s), and from the policy's log-prob at mu_old, b = -log p(mu_old) - log s - log(2 pi) / 2
// (kl_from_log_prob_at_reference), so d b / d theta is the gradient of -log p(mu_old): the trainer feeds it through a
// second accumulate at next = mu_old.
#include <cmath>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/loss/ppo.hpp"

namespace branchgrpo {

namespace detail {
inline void check_ratio_norm(double mean_gap, double std) {
  require(std::isfinite(std) && std > 0.0, "ratio_norm std ", std, " is not finite and positive");
  require(std::isfinite(mean_gap) && mean_gap >= 0.0, "ratio_norm mean gap ", mean_gap, " is not finite and >= 0");
}
}  // namespace detail

/// log r_hat = std (log_new - log_old + mean_gap).
/// Example: log_new -0.02, log_old 0, mean_gap 0.03, std 0.1 -> 0.1 * 0.01 = 0.001 (the plain ratio exp(-0.02) =
///   0.980 sat below 1; with the gap added back it is exp(0.001) = 1.0010005).
/// @pre std finite and > 0; mean_gap finite and >= 0; log-probs finite.
inline double ratio_norm_log_ratio(double log_new, double log_old, double mean_gap, double std) {
  detail::check_ratio_norm(mean_gap, std);
  detail::require_finite(log_new, "log_new");
  detail::require_finite(log_old, "log_old");
  return std * (log_new - log_old + mean_gap);
}

/// The PPO loss on the normalized ratio: ppo_clipped_loss(log r_hat, 0, A, eps).
/// Example (eps 1e-3, A 1): log_new 0.01, log_old 0, gap 0, std 0.05 -> log r_hat 0.0005 -> -exp(0.0005) =
///   -1.000500125 (the plain loss would be clipped at -1.001).
/// @pre as ratio_norm_log_ratio and ppo_clipped_loss.
inline double ratio_norm_loss(double log_new, double log_old, double mean_gap, double advantage, double clip_range,
                              double std) {
  return ppo_clipped_loss(ratio_norm_log_ratio(log_new, log_old, mean_gap, std), 0.0, advantage, clip_range);
}

/// d ratio_norm_loss / d log_new = std * ppo_clipped_loss_gradient(log r_hat, 0, A, eps). The loss depends on the
/// policy's log-prob at mu_old through the gap (b = -log p(mu_old) + const), with the opposite sign: its derivative
/// there is minus this value.
/// Example (eps 1e-3): (log_new 0.01, log_old 0, gap 0, A 1, std 0.05) -> 0.05 * -exp(0.0005) = -0.050025006
///   (plain PPO: 0, clipped); (0.01, 0, 0, A -2, std 0.1) -> 0.1 * 2 exp(0.001) = 0.200200100;
///   (-0.02, 0, gap 0.03, A 1, std 0.1) -> 0 (r_hat = 1.0010005 > 1 + eps: clipped; plain PPO: -exp(-0.02) = -0.980).
/// @pre as ratio_norm_loss.
inline double ratio_norm_loss_gradient(double log_new, double log_old, double mean_gap, double advantage,
                                       double clip_range, double std) {
  return std *
         ppo_clipped_loss_gradient(ratio_norm_log_ratio(log_new, log_old, mean_gap, std), 0.0, advantage, clip_range);
}

}  // namespace branchgrpo
