#pragma once
// The KL term of the loss (loss/ppo.hpp's kl_flow), accumulated into a ReferencePolicy's gradient.
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/loss/ppo.hpp"
#include "branchgrpo/training/concepts.hpp"

namespace branchgrpo {

/// The KL term of the loss for one batch of trained edges, added to the policy's gradient through accumulate:
/// `weight` times the gradient of sum_r KL_r, with KL_r the KL between the edge's Gaussian under the policy and
/// under its reference model (equal stds; per element, averaged like the log-probs):
///   KL_r = mean_i (mean_i - mean_ref_i)^2 / (2 std_r^2) = -log p_theta(mean_ref) - log std_r - log(2 pi) / 2,
/// so its gradient is that of -log p_theta at the reference mean: one accumulate over the batch with `next`
/// replaced by the reference mean (a x + c v_ref) and every row weighted by -weight. Returns KL_r per row.
/// Example: a toy policy at its base weights (reference = base) -> every KL_r == 0 (to rounding) and no gradient;
///   with W = base + 0.01 the KL_r equal kl_flow(mean, mean_ref, std) (tests/unit/test_trainer.cpp, with a
///   finite-difference check of the gradient).
/// @pre edges as for accumulate; weight finite and >= 0.
/// @post the policy's gradient buffer grew by weight * d/dtheta sum_r KL_r; the parameters are unchanged.
template <Backend B, ReferencePolicy<B> P>
std::vector<double> accumulate_kl(B& backend, P& policy, const edge_batch<typename B::tensor>& edges, double weight) {
  require(std::isfinite(weight) && weight >= 0.0, "KL weight ", weight, " is not finite and >= 0");
  const denoise_batch batch{.step = edges.step, .sigma = edges.sigma, .trees = edges.trees, .prompts = edges.prompts};
  edge_batch<typename B::tensor> reference = edges;
  reference.next = backend.affine(edges.coeffs.x_coeff, edges.x, edges.coeffs.velocity_coeff,
                                  policy.reference_velocity(edges.x, batch));
  std::vector<double> kl;
  policy.accumulate(reference, loss_gradient_fn([&](std::span<const double> log_probs) {
                      require(log_probs.size() == edges.std.size(), "policy returned ", log_probs.size(),
                              " log-probs for ", edges.std.size(), " edges");
                      kl.resize(log_probs.size());
                      for (std::size_t r = 0; r < log_probs.size(); ++r)
                        kl[r] = kl_from_log_prob_at_reference(log_probs[r], edges.std[r]);
                      return std::vector<double>(log_probs.size(), -weight);
                    }));
  return kl;
}

}  // namespace branchgrpo
