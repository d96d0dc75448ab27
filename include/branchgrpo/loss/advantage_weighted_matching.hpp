#pragma once
// advantage_weighted_matching, AWM (arXiv 2509.25050): the PPO-clipped ratio of flow-matching "log-probs" on the
// kept trees' samples (loss/matching.hpp). Use it to train from samples any sampler made (no transition
// log-prob), with a PPO guard on how far one iteration moves the policy.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/loss/matching.hpp"
#include "branchgrpo/loss/ppo.hpp"

namespace branchgrpo {

/// AWM's weighting of the matching log-prob by the noise level t: 1, t or t^2.
enum class time_weighting { uniform, t, t_squared };
inline constexpr std::array<enum_choice<time_weighting>, 3> time_weighting_names = {
    {{"uniform", time_weighting::uniform}, {"t", time_weighting::t}, {"t_squared", time_weighting::t_squared}}};
constexpr const auto& enum_choices(time_weighting) { return time_weighting_names; }

/// w(t) of a weighting. Example: weight_at(time_weighting::t_squared, 0.5) == 0.25; uniform -> 1.
inline double weight_at(time_weighting weighting, double t) {
  switch (weighting) {
    case time_weighting::t:
      return t;
    case time_weighting::t_squared:
      return t * t;
    case time_weighting::uniform:
      break;
  }
  return 1.0;
}

/// AWM (arXiv 2509.25050): loss = max(-A rho, -A clamp(rho, 1 - eps, 1 + eps)) with rho = exp(lp - lp_old) and
/// lp = -w(t) mean_i (v_theta(x_t, t) - u)_i^2 the matching log-prob; lp_old is the sampling policy's (before any
/// update of the iteration); A clipped to [-advantage_max, advantage_max]. Defaults as Flow-Factory's trainer.
struct advantage_weighted_matching {
  time_weighting weighting = time_weighting::uniform;
  int times_per_sample = 1;  ///< noise levels drawn per sample per iteration
  double clip_range = 1e-4;
  double advantage_max = 5.0;
  bool intermediate_nodes = false;  ///< also train the trees' internal split nodes (new here, docs/loss.md)
  friend bool operator==(const advantage_weighted_matching&, const advantage_weighted_matching&) = default;
  static constexpr std::string_view name = "awm",
                                    summary = "Advantage Weighted Matching: PPO on flow-matching log-probs";
  static constexpr auto parameters() {
    using self = advantage_weighted_matching;
    return std::tuple{
        parameter("weighting", &self::weighting, "weight w(t) of the matching log-prob"),
        parameter("times_per_sample", &self::times_per_sample, "noise levels per sample per iteration",
                  rules::in_range{.low = 1, .high = 256}),
        parameter("clip_range", &self::clip_range, "PPO clip range of the matching ratio", rules::open_unit_interval{}),
        parameter("advantage_max", &self::advantage_max, "advantages clipped to [-max, max]", rules::positive{}),
        parameter("intermediate_nodes", &self::intermediate_nodes, "also train internal split nodes (new)")};
  }
  /// It trains no transition (loss/objective.hpp's transition_option_conflict).
  static constexpr bool trains_transitions = false;
  /// One Gaussian row per sample and noise level.
  static constexpr int rows_per_sample = 1;

  /// lp_old is the sampling policy's: with one optimizer step the parameters are still its own when each chunk
  /// is accumulated, so v_old is needed only before a second step. Example: uses_sampling_policy(1) == false.
  [[nodiscard]] bool uses_sampling_policy(std::size_t optimizer_steps) const { return optimizer_steps > 1; }
  /// w(t). Example: {.weighting = time_weighting::t}.weight(0.25) == 0.25.
  [[nodiscard]] double weight(double t) const { return weight_at(weighting, t); }

  /// One chunk: the PPO-clipped loss of the matching ratio, each row's gradient weight d loss / d lp.
  template <Backend B, class Model>
  void accumulate_matching(matching_call<B, Model>& call) const {
    const std::size_t count = call.rows.size();
    std::vector<double> old_log_prob;  // the sampling policy's lp, from v_old
    const std::vector<double> stds(count, matching_std(call.weight));
    if (call.old_velocity) {
      old_log_prob = call.backend.row_log_prob(call.chunk.target, call.chunk.old_velocity, stds);
      for (double& lp : old_log_prob) lp = matching_log_prob(lp, call.weight);
    }
    call.edges.x = call.chunk.x_t;
    call.edges.next = call.chunk.target;
    call.edges.std = stds;
    call.policy.accumulate(call.edges, loss_gradient_fn([&](std::span<const double> log_probs) {
                             require(log_probs.size() == count, "policy returned ", log_probs.size(), " log-probs for ",
                                     count, " matching rows");
                             return row_weights(call, old_log_prob, log_probs);
                           }));
    call.sums.evaluations += static_cast<std::int64_t>(count);
  }

 private:
  template <Backend B, class Model>
  std::vector<double> row_weights(matching_call<B, Model>& call, std::span<const double> old_log_prob,
                                  std::span<const double> log_probs) const {
    std::vector<double> weights(log_probs.size());
    for (std::size_t i = 0; i < log_probs.size(); ++i) {
      const double lp = matching_log_prob(log_probs[i], call.weight);
      require(std::isfinite(lp), "policy matching log-prob at step ", call.edges.step, " is ", lp);
      // Without v_old the parameters are the sampling policy's: lp is lp_old.
      const double old = call.old_velocity ? old_log_prob[i] : lp;
      if (call.first_group && call.old_velocity)
        call.sums.first_update_log_prob_gap = std::max(call.sums.first_update_log_prob_gap, std::abs(lp - old));
      const double advantage = clip_advantage(call.rows[i].advantage, advantage_max);
      if (std::abs(importance_ratio(lp, old) - 1.0) > clip_range) ++call.sums.clipped;
      call.sums.loss += ppo_clipped_loss(lp, old, advantage, clip_range);
      weights[i] = call.per_row * ppo_clipped_loss_gradient(lp, old, advantage, clip_range);
    }
    return weights;
  }

 public:
  /// The update: update_matching (loss/matching.hpp) with this objective's rows and accumulate.
  template <Backend B, Policy<B> Model, Stepper S, Communicator Comm>
  update_report update(Model& policy, const update_input<B, S>& input, Comm& communicator) const {
    return update_matching(*this, policy, input, communicator);
  }
};

}  // namespace branchgrpo
