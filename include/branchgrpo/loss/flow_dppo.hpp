#pragma once
// flow_dppo, Flow-DPPO (arXiv 2606.11025; the authors' code: Tencent-Hunyuan/UniRL, unirl/algorithms/flowdppo.py):
// PPO's ratio clip replaced by a trust region on the exact KL between the old and the current step Gaussians. An
// edge keeps its unclipped term -A ratio unless its KL reached the bound and its ratio already moved the way its
// advantage pushes (ratio > 1 with A > 0, or ratio < 1 with A < 0): such an edge is masked, loss and gradient 0.
// Unlike the clip, an edge whose Gaussian barely moved is never cut, however far its ratio went.
//
// Its update is ppo_ratio's (loss/ppo_ratio.hpp: optimizer steps, chunks, the KL term and the step weights of
// training_options::loss) with this edge rule. The KL is the mean gap b = mean (mu - mu_old)^2 / (2 std^2) of the
// transition means: the old means are computed before the first optimizer step (one forward per edge trained after
// it) and the current ones before each chunk's accumulate (one more forward per such edge), as RatioNorm's are. In
// the first optimizer step the policy is the rollout's: b = 0 and ratio = 1, no edge is masked. Equal stds make the
// KL exact (UniRL's add_kl_coefficient = true: sigma_t is the transition's std). The report's clip_fraction is the
// masked fraction.
#include <cmath>
#include <string_view>
#include <tuple>

#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/loss/ppo_ratio.hpp"

namespace branchgrpo {

/// One edge's Flow-DPPO term.
struct dppo_edge {
  double loss = 0;           ///< -advantage * ratio, or 0 when masked
  double loss_gradient = 0;  ///< d loss / d log_prob: -advantage * ratio, or 0 when masked
  bool masked = false;       ///< the trust region cut the edge
};

/// Flow-DPPO's term of one edge: ratio = exp(log_prob - old_log_prob); masked when kl >= kl_threshold and the ratio
/// moved with the advantage (ratio > 1 and advantage > 0, or ratio < 1 and advantage < 0), else loss = -advantage
/// ratio with d loss / d log_prob = -advantage ratio (the authors' comparisons, strict and non-strict, exactly).
/// Example: (log_prob ln 2, old 0, kl 0.1, advantage 1, threshold 0.01) -> masked, loss 0, gradient 0;
///   the same with kl 0.001 -> {loss -2, gradient -2}; with advantage -1 and kl 0.1 -> {loss 2, gradient 2} (the
///   ratio moved against the advantage: kept); ratio 1 (log_prob == old) -> never masked.
/// @pre kl >= 0 and kl_threshold > 0, all finite.
/// @post masked implies loss == loss_gradient == 0.
inline dppo_edge dppo_edge_loss(double log_prob, double old_log_prob, double kl, double advantage,
                                double kl_threshold) {
  const double ratio = std::exp(log_prob - old_log_prob);
  const bool beyond = !(kl < kl_threshold);
  const bool masked = beyond && ((ratio > 1.0 && advantage > 0.0) || (ratio < 1.0 && advantage < 0.0));
  if (masked) return {.loss = 0.0, .loss_gradient = 0.0, .masked = true};
  return {.loss = -advantage * ratio, .loss_gradient = -advantage * ratio, .masked = false};
}

namespace detail {

/// flow_dppo's edge rule for the transition update: the KL is the mean gap, without a gradient of its own.
struct dppo_rule {
  double kl_threshold = 1e-5;
  [[nodiscard]] bool needs_mean_gap(const ppo_options&) const { return true; }
  [[nodiscard]] bool gap_has_gradient(const ppo_options&) const { return false; }
  [[nodiscard]] edge_term term(double log_prob, double old_log_prob, double mean_gap, double advantage, double,
                               const ppo_options&) const {
    const dppo_edge edge = dppo_edge_loss(log_prob, old_log_prob, mean_gap, advantage, kl_threshold);
    return {.loss = edge.loss, .loss_gradient = edge.loss_gradient, .cut = edge.masked};
  }
};

}  // namespace detail

/// Flow-DPPO: the ratio's unclipped term, masked by a trust region on the step Gaussians' KL (see the top).
struct flow_dppo {
  double kl_threshold = 1e-5;  ///< the trust region's bound on the per-element KL (the authors' default 1e-5)

  friend bool operator==(const flow_dppo&, const flow_dppo&) = default;
  static constexpr std::string_view name = "dppo",
                                    summary = "Flow-DPPO: unclipped ratio, masked by a KL trust region on the steps";
  static constexpr auto parameters() {
    return std::tuple{
        parameter("kl_threshold", &flow_dppo::kl_threshold,
                  "the trust region's bound on the KL between the old and the current step Gaussians (per element)",
                  rules::positive{})};
  }
  /// It trains transitions: the loss options kl_beta and step_weight apply; ratio_norm, a variant of the clip this
  /// objective replaces, does not (loss/objective.hpp).
  static constexpr bool trains_transitions = true;
  static constexpr bool clips_ratio = false;

  /// The update of this rank's share of the trained edges, the report of all ranks: ppo_ratio's with the edge rule
  /// dppo_edge_loss. Example: updates_per_iteration 1 -> one optimizer step at the rollout's parameters, where every
  /// ratio is 1 and nothing is masked: the gradient is the plain policy gradient -A d log-prob (tests/unit/
  /// test_objective.cpp).
  /// @pre training_options valid (train_iteration's checks); kl_threshold > 0.
  /// @post as ppo_ratio's; report.clip_fraction is the masked fraction.
  template <Backend B, Policy<B> Model, Stepper S, Communicator Comm>
  update_report update(Model& policy, const update_input<B, S>& input, Comm& communicator) const {
    return detail::update_transitions(detail::dppo_rule{.kl_threshold = kl_threshold}, policy, input, communicator);
  }
};

}  // namespace branchgrpo
