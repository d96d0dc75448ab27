#pragma once
// Objectives: what a trained sample contributes to the policy gradient. The default, ppo_ratio, is the GRPO
// loss of loss/ppo.hpp on the rollout's transition log-probs. The two decoupled objectives need no transition
// log-prob: they train on the final samples (the leaves) by flow matching, so any sampler may produce them.
//   ppo_ratio                    PPO-clipped ratio of transition log-probs (loss/ppo.hpp); the default.
//   advantage_weighted_matching  AWM (arXiv 2509.25050): PPO-clipped ratio of flow-matching "log-probs".
//   diffusion_nft                DiffusionNFT (arXiv 2509.16117): implicit positive / negative velocities.
//
// Both decoupled objectives noise a leaf x0 to x_t = (1 - t) x0 + t eps (eps ~ N(0, I), t a noise level of the
// schedule) and compare the policy's velocity v_theta(x_t, t) with the target u = eps - x0. A policy only offers
// accumulate() over Gaussian log-probs (training/concepts.hpp), and a Gaussian row with x_coeff 0,
// velocity_coeff 1, next = target and std = 1 / sqrt(2 w) has, per element,
//   log N(target; v, std^2) = -w (target - v)^2 - log std - log(2 pi) / 2,
// so its mean over elements is the matching log-prob -w mean_i (v_i - target_i)^2 plus a constant: every policy
// trains these objectives unchanged (the trick accumulate_kl uses for the KL term). See docs/loss.md.
#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <numbers>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/core/policy_list.hpp"
#include "branchgrpo/loss/ppo.hpp"

namespace branchgrpo {

/// The GRPO objective: PPO-clipped ratio of the rollout's transition log-probs (training_options::loss).
struct ppo_ratio {
  friend bool operator==(const ppo_ratio&, const ppo_ratio&) = default;
  static constexpr std::string_view name = "ppo", summary = "PPO-clipped ratio of transition log-probs (GRPO)";
  static constexpr auto parameters() { return std::tuple{}; }
};

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
};

/// DiffusionNFT (arXiv 2509.16117), velocity form: v+ = beta v_theta + (1 - beta) v_old,
/// v- = (1 + beta) v_old - beta v_theta (v_old the sampling policy's velocity, no gradient), optimality
/// probability r = clamp(clip(A) / advantage_max / 2 + 1/2, 0, 1), and
///   loss = advantage_max (r mean ||v+ - u||^2 + (1 - r) mean ||v- - u||^2) / beta.
struct diffusion_nft {
  double beta = 1.0;
  int times_per_sample = 1;  ///< noise levels drawn per sample per iteration
  double advantage_max = 5.0;
  bool intermediate_nodes = false;  ///< also train the trees' internal split nodes (new here, docs/loss.md)
  friend bool operator==(const diffusion_nft&, const diffusion_nft&) = default;
  static constexpr std::string_view name = "nft", summary = "DiffusionNFT: implicit positive / negative velocities";
  static constexpr auto parameters() {
    return std::tuple{
        parameter("beta", &diffusion_nft::beta, "guidance strength beta", rules::in_range{.low = 1e-6, .high = 1e6}),
        parameter("times_per_sample", &diffusion_nft::times_per_sample, "noise levels per sample per iteration",
                  rules::in_range{.low = 1, .high = 256}),
        parameter("advantage_max", &diffusion_nft::advantage_max, "advantages clipped to [-max, max]",
                  rules::positive{}),
        parameter("intermediate_nodes", &diffusion_nft::intermediate_nodes, "also train internal split nodes (new)")};
  }
};

using objective_policies = policy_list<"objective", ppo_ratio, advantage_weighted_matching, diffusion_nft>;

/// One of the objectives, chosen at run time (a run config's [objective] table). train_iteration visits it once per
/// iteration and runs the held objective's update. Default: ppo_ratio.
/// Example: any_objective{diffusion_nft{.beta = 0.5}}.name() == "nft".
using any_objective = any_policy<objective_policies>;

/// An objective that trains by flow matching on the final samples rather than on transition log-probs.
template <class O>
concept MatchingObjective = std::same_as<O, advantage_weighted_matching> || std::same_as<O, diffusion_nft>;

/// The std of a matching row whose Gaussian log-prob is -w mean (target - v)^2 + const: 1 / sqrt(2 w).
/// Example: matching_std(0.5) == 1; matching_std(2) == 0.5.
/// @pre w finite and > 0 (else invalid_input naming it).
inline double matching_std(double weight) {
  require(std::isfinite(weight) && weight > 0.0, "matching weight ", weight, " is not finite and positive");
  return 1.0 / std::sqrt(2.0 * weight);
}

/// The matching log-prob -w mean (target - v)^2 of a row whose Gaussian log-prob (mean over elements) is
/// `gaussian_log_prob` with std matching_std(w): adds back log std + log(2 pi) / 2.
/// Example: w 0.5 (std 1), v {1, 2}, target {0, 0}: gaussian -(1 + 4) / 2 / 2 - log(2 pi) / 2 = -2.168939
///   -> -1.25 (= -0.5 * (1 + 4) / 2).
inline double matching_log_prob(double gaussian_log_prob, double weight) {
  return gaussian_log_prob + std::log(matching_std(weight)) + 0.5 * std::log(2.0 * std::numbers::pi);
}

/// NFT's optimality probability r = clamp(clamp(A, -a_max, a_max) / a_max / 2 + 1/2, 0, 1).
/// Example: nft_optimality(2.5, 5) == 0.75; nft_optimality(-9, 5) == 0; nft_optimality(0, 5) == 0.5.
/// @pre a_max > 0, A finite.
inline double nft_optimality(double advantage, double advantage_max) {
  const double clipped = clip_advantage(advantage, advantage_max);
  return std::clamp(clipped / advantage_max / 2.0 + 0.5, 0.0, 1.0);
}

/// The two matching rows of one NFT sample: since ||v+ - u||^2 = beta^2 ||v_theta - u+||^2 with
/// u+ = (u - (1 - beta) v_old) / beta and ||v- - u||^2 = beta^2 ||v_theta - u-||^2 with
/// u- = ((1 + beta) v_old - u) / beta, the loss a_max (r ||v+ - u||^2 + (1 - r) ||v- - u||^2) / beta is
/// a_max beta (r ||v_theta - u+||^2 + (1 - r) ||v_theta - u-||^2): two rows of weight w = 1 whose matching
/// log-probs lp+- = -mean ||v_theta - u+-||^2 enter with d loss / d lp = -a_max beta r and -a_max beta (1 - r).
/// Coefficients: u+ = plus_u u + plus_old v_old, u- = minus_u u + minus_old v_old.
/// Example: beta 0.5 -> u+ = 2 u - v_old, u- = -2 u + 3 v_old.
struct nft_targets {
  double plus_u, plus_old, minus_u, minus_old;
  static nft_targets of(double beta) {
    require(std::isfinite(beta) && beta > 0.0, "nft beta ", beta, " is not finite and positive");
    return {1.0 / beta, -(1.0 - beta) / beta, -1.0 / beta, (1.0 + beta) / beta};
  }
};

}  // namespace branchgrpo
