#pragma once
// Objectives: what the trained rows of an iteration are and what they contribute to the policy gradient. Each is
// one header and one entry of objective_policies; each owns its update (update(policy, update_input, communicator),
// on training/update_loop.hpp's loop).
//   ppo_ratio                    PPO-clipped ratio of transition log-probs (loss/ppo_ratio.hpp); the default,
//                                GRPO. Use it with an SDE sampler whose transition log-probs are exact.
//   advantage_weighted_matching  AWM (arXiv 2509.25050): PPO-clipped ratio of flow-matching "log-probs" on the
//                                samples (loss/advantage_weighted_matching.hpp).
//   diffusion_nft                DiffusionNFT (arXiv 2509.16117): implicit positive / negative velocities on the
//                                samples (loss/diffusion_nft.hpp).
//   flow_dppo                    Flow-DPPO (arXiv 2606.11025): the unclipped ratio of transition log-probs, masked
//                                by a trust region on the step Gaussians' KL (loss/flow_dppo.hpp). Use it where PPO's
//                                clip stalls edges whose Gaussians barely moved.
// The two decoupled objectives need no transition log-prob (loss/matching.hpp): any sampler may make the samples.
//
// To add an objective: a header with a ListedPolicy struct (name, summary, parameters()), trains_transitions, and
// update(policy, input, communicator) returning an update_report (a matching objective may write
// accumulate_matching and call update_matching); then one entry in objective_policies below. docs/extending.md.
#include <concepts>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "branchgrpo/core/policy_list.hpp"
#include "branchgrpo/loss/advantage_weighted_matching.hpp"
#include "branchgrpo/loss/diffusion_nft.hpp"
#include "branchgrpo/loss/flow_dppo.hpp"
#include "branchgrpo/loss/matching.hpp"
#include "branchgrpo/loss/ppo.hpp"
#include "branchgrpo/loss/ppo_ratio.hpp"
#include "branchgrpo/loss/step_weights.hpp"

namespace branchgrpo {

using objective_policies = policy_list<"objective", ppo_ratio, advantage_weighted_matching, diffusion_nft, flow_dppo>;

/// One of the objectives, chosen at run time (a run config's [objective] table). train_iteration visits it once per
/// iteration and runs the held objective's update. Default: ppo_ratio.
/// Example: any_objective{diffusion_nft{.beta = 0.5}}.name() == "nft".
using any_objective = any_policy<objective_policies>;

/// One objective: a listed policy that says whether it trains transitions (whether the loss options kl_beta,
/// ratio_norm and step_weight apply to it). Its update(policy, update_input, communicator) is checked where
/// train_iteration calls it, with the backend's types.
template <class O>
concept ObjectivePolicy = ListedPolicy<O> && requires {
  { O::trains_transitions } -> std::convertible_to<bool>;
};

namespace detail {
template <class O>
struct is_objective_choice : std::false_type {};
template <class List, class... Policies>
struct is_objective_choice<any_policy<List, std::variant<Policies...>>>
    : std::bool_constant<(ObjectivePolicy<Policies> && ...)> {};
}  // namespace detail

/// An objective of the update: one objective, or one chosen at run time from a list of them (any_objective, or
/// any_policy over a user's extended_policy_list<objective_policies, ...>).
template <class O>
concept Objective = ObjectivePolicy<O> || detail::is_objective_choice<O>::value;

/// Whether `objective` (or the one a run-time choice holds) trains transitions (ppo, dppo) rather than the leaves'
/// samples (nft, awm). Example: trains_transitions(ppo_ratio{}) == true; trains_transitions(any_objective{
///   diffusion_nft{}}) == false.
template <Objective O>
bool trains_transitions(const O& objective) {
  if constexpr (!ObjectivePolicy<O>)
    return std::visit([](const auto& held) { return trains_transitions(held); }, objective.policy);
  else
    return O::trains_transitions;
}

/// How transition_option_conflict names what it refuses: as C++ options ("ratio_norm = on with objective nft") or
/// as a run config's keys ("loss.ratio_norm = true with objective.kind = \"nft\"").
enum class option_spelling { cpp, config };

/// Why `loss` cannot go with `objective`, in one line, or "" when it can: the KL term, RatioNorm and the per-step
/// weights act on a transition's log-prob, which an objective that trains no transition has not; RatioNorm also
/// needs a clipped ratio (an objective with clips_ratio = false has none). The one rule, for
/// train_iteration, the run config and compare's --methods.
/// Example: (diffusion_nft{}, {.ratio_norm = true}, cpp) -> "ratio_norm = on with objective nft: RatioNorm
///   normalizes a transition's importance ratio, and this objective has none (objective ppo only)";
///   (flow_dppo{}, {.ratio_norm = true}, cpp) -> "ratio_norm = on with objective dppo: RatioNorm normalizes the ratio
///   PPO clips, and this objective bounds the step KL instead (objective ppo only)"; (ppo_ratio{}, anything) -> "".
template <Objective O>
std::string transition_option_conflict(const O& objective, const ppo_options& loss, option_spelling spelling) {
  if constexpr (!ObjectivePolicy<O>) {
    return std::visit([&](const auto& held) { return transition_option_conflict(held, loss, spelling); },
                      objective.policy);
  } else {
    const bool config = spelling == option_spelling::config;
    const std::string key = config ? "loss." : "";
    const std::string with = config ? " with objective.kind = \"" + std::string(O::name) + "\": "
                                    : " with objective " + std::string(O::name) + ": ";
    std::ostringstream out;
    if constexpr (O::trains_transitions) {
      if constexpr (requires { O::clips_ratio; })
        if (!O::clips_ratio && loss.ratio_norm)
          out << key << "ratio_norm = " << (config ? "true" : "on") << with
              << "RatioNorm normalizes the ratio PPO clips, and this objective bounds the step KL instead "
                 "(objective ppo only)";
      return out.str();
    }
    if (loss.kl_beta != 0.0)
      out << key << "kl_beta = " << loss.kl_beta << with
          << "the KL term is defined on transition log-probs (objectives ppo and dppo)";
    else if (loss.ratio_norm)
      out << key << "ratio_norm = " << (config ? "true" : "on") << with
          << "RatioNorm normalizes a transition's importance ratio, and this objective has none (objective ppo only)";
    else if (loss.step_weight != step_weighting::none)
      out << key << "step_weight = " << (config ? "\"" : "") << step_weighting_name(loss.step_weight)
          << (config ? "\"" : "") << with
          << "per-step weights weigh denoising transitions, and this objective trains none (objectives ppo and dppo)";
    return out.str();
  }
}

}  // namespace branchgrpo
