#pragma once
// What the trainer needs from a model and a reward. The core never needs autograd: a policy computes
// log-probs of edge batches and accumulates the gradient of a weighted sum of them itself (in closed form
// for the toy, with autograd in adapters/torch).
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
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

/// A policy whose accumulate takes part in collectives of its own (ZeRO-2 reducing gradient buckets while the
/// backward pass completes them, branchgrpo/torch/policy.hpp): every rank must make the same number of accumulate
/// calls per optimizer step, so train_iteration has a rank with fewer edges make up the difference with
/// pad_accumulate(), which accumulates nothing and takes part in the same collectives.
template <class P>
concept PaddedAccumulationPolicy = requires(P& policy) {
  policy.pad_accumulate();
};

/// A policy with a frozen reference model (the base without its adapters, or the initial weights):
///   policy.reference_velocity(x, batch)  the reference model's velocity, without gradient
/// The loss's KL term (ppo_options::kl_beta > 0) needs it; train_iteration applies the term for every policy
/// through accumulate (accumulate_kl in training/trainer.hpp).
template <class P, class B>
concept ReferencePolicy = Policy<P, B> && requires(P& policy, const typename B::tensor& x, const denoise_batch& batch) {
  { policy.reference_velocity(x, batch) } -> std::same_as<typename B::tensor>;
};

/// Where the rows a reward scores sit: rows [t L, (t + 1) L) are the leaves of tree t of the call, in
/// tree.leaves() order (L = leaves_per_tree), and keys[t] is that tree's key in the iteration (its index among
/// every rank's trees). A group is one tree: DanceGRPO's G chains of a prompt are one tree too (split at step 0).
/// Example: 2 trees of 4 leaves -> {.leaves_per_tree = 4, .keys = {0, 1}}: rows 0..3 are tree 0's.
struct leaf_groups {
  std::int32_t leaves_per_tree = 0;
  std::span<const std::uint32_t> keys = {};

  [[nodiscard]] std::size_t rows() const { return keys.size() * static_cast<std::size_t>(leaves_per_tree); }
};

/// A pointwise reward scores each leaf's final latent (a row of `leaves`) given its prompt alone.
template <class R, class B>
concept PointwiseReward = Backend<B> &&
    requires(R& reward, const typename B::tensor& leaves, std::span<const std::int64_t> prompts) {
  { reward(leaves, prompts) } -> std::same_as<std::vector<double>>;
};

/// A groupwise reward sees every leaf of each tree at once (`groups`) and may score a leaf against its group
/// (Pref-GRPO's win rate, a pairwise judge). The trainer never splits a tree across two calls.
template <class R, class B>
concept GroupwiseReward = Backend<B> && requires(R& reward, const typename B::tensor& leaves,
                                                 std::span<const std::int64_t> prompts, const leaf_groups& groups) {
  { reward(leaves, prompts, groups) } -> std::same_as<std::vector<double>>;
};

/// A reward scores the leaves, pointwise or groupwise, one score per row. A non-finite score marks that leaf as
/// failed; the trainer drops its tree from the update.
template <class R, class B>
concept Reward = PointwiseReward<R, B> || GroupwiseReward<R, B>;

/// One call of either form: the groupwise one when the reward has it.
/// @pre groups.rows() == prompts.size() == the rows of leaves.
template <Backend B, Reward<B> R>
std::vector<double> score_rows(R& reward, const typename B::tensor& leaves, std::span<const std::int64_t> prompts,
                               const leaf_groups& groups) {
  if constexpr (GroupwiseReward<R, B>)
    return reward(leaves, prompts, groups);
  else
    return reward(leaves, prompts);
}

/// One component of a reward made of weighted parts, as its last call scored it: the component's unweighted
/// score per row, its weight and its name. The reward's score is sum_c weight_c rows_c.
struct reward_component {
  std::string name;
  double weight = 1.0;
  std::vector<double> rows = {};
};

/// A reward that reports its components (a weighted sum of rewards): after a call, reward.last_component_rows()
/// holds one reward_component per part with that call's rows. Per-reward advantages (advantage/per_reward.hpp)
/// normalize each part on its own.
template <class R>
concept ComponentReward = requires(const R& reward) {
  { reward.last_component_rows() } -> std::convertible_to<std::span<const reward_component>>;
};

}  // namespace branchgrpo
