#pragma once
// What the trainer needs from a model and a reward. The core never needs autograd: a policy computes
// log-probs of edge batches and accumulates the gradient of a weighted sum of them itself (in closed form
// for the toy, with autograd in adapters/torch).
#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/schedule/steppers.hpp"

namespace branchgrpo {

/// A batch of trained edges of one denoising step: parents' latents x, children's latents next, and the
/// Gaussian each child was drawn from: mean = coeffs.x_coeff * x + coeffs.velocity_coeff * v(x), std[row].
template <class Tensor>
struct edge_batch {
  int step = 0;
  double sigma = 1.0;
  affine_step coeffs;
  Tensor x;
  Tensor next;
  std::vector<double> std;            ///< per row: the std the child was drawn with
  std::vector<std::uint32_t> trees;   ///< per row: tree key
  std::vector<std::int64_t> prompts;  ///< per row: prompt
};

/// Maps the current log-probs of a batch's rows to d loss / d log-prob per row.
using loss_gradient_fn = std::function<std::vector<double>(std::span<const double> log_probs)>;

/// A trainable policy on backend B:
///   policy(x, batch)                  velocity, as a Denoiser (used by the rollout)
///   policy.accumulate(edges, grad_fn) computes the rows' log-probs under the current parameters, asks
///                                     grad_fn for the weights w = d loss / d log-prob, adds the gradient
///                                     of sum_rows w * log-prob to its gradient buffer, and returns the
///                                     log-probs it computed
///   policy.apply_update()             one optimizer step on the accumulated gradient, then zeroes it
template <class P, class B>
concept Policy = Denoiser<P, B> &&
    requires(P& policy, const edge_batch<typename B::tensor>& edges, const loss_gradient_fn& gradient) {
  { policy.accumulate(edges, gradient) } -> std::same_as<std::vector<double>>;
  {policy.apply_update()};
};

/// A policy with a frozen reference model (the base without its adapters, or the initial weights):
///   policy.reference_velocity(x, batch)  the reference model's velocity, without gradient
/// The loss's KL term (ppo_options::kl_beta > 0) needs it; train_iteration applies the term for every policy
/// through accumulate (accumulate_kl in training/trainer.hpp).
template <class P, class B>
concept ReferencePolicy = Policy<P, B> && requires(P& policy, const typename B::tensor& x, const denoise_batch& batch) {
  { policy.reference_velocity(x, batch) } -> std::same_as<typename B::tensor>;
};

/// A reward scores the leaves' final latents (rows of `leaves`) given each leaf's prompt.
/// A non-finite score marks that leaf as failed; the trainer drops its tree from the update.
template <class R, class B>
concept Reward = Backend<B> &&
    requires(R& reward, const typename B::tensor& leaves, std::span<const std::int64_t> prompts) {
  { reward(leaves, prompts) } -> std::same_as<std::vector<double>>;
};

}  // namespace branchgrpo
