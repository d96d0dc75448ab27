#pragma once
// The per-edge policy loss: PPO-clipped importance ratio with a clipped advantage, plus an optional KL term
// to a reference policy. The formulas are generic over the value type T: double here, a tensor type in
// the adapters. They use only arithmetic operators and unqualified exp / clamp / max found by argument-
// dependent lookup, so a type such as at::Tensor works unchanged. Finite-value checks apply to floating T.
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <numbers>
#include <span>
#include <tuple>
#include <type_traits>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/loss/step_weights.hpp"

namespace branchgrpo {

/// PPO options of the policy update, a run config's [loss]: each option described once in parameters(), its range
/// checked by validate() on every path (train_iteration, the run config's reader, compare).
/// clip_range: the paper's 1e-3 (the official code's default is 1e-4); advantage_clip: |A| <= 5 as in
/// the code; kl_beta: 0 in BranchGRPO (Flow-GRPO uses 0.01 - 0.04 against the base model).
/// ratio_norm: GRPO-Guard's RatioNorm of the importance ratio (loss/ratio_guard.hpp); step_weight: a per-step
/// weight of the loss (loss/step_weights.hpp: GRPO-Guard's inverse_dt, TempFlow-GRPO's noise_std, equal_steps).
/// Both off by default: the loss is then exactly the PPO loss above. A canonical text writes them only when on,
/// so that the text of a run from before they existed reads as it did (its checkpoints resume).
struct ppo_options {
  double clip_range = 1e-3;
  double advantage_clip = 5.0;
  double kl_beta = 0.0;
  bool ratio_norm = false;
  step_weighting step_weight = step_weighting::none;
  friend bool operator==(const ppo_options&, const ppo_options&) = default;
  static constexpr auto parameters() {
    using self = ppo_options;
    return std::tuple{
        parameter("clip_range", &self::clip_range, "PPO ratio clip epsilon", rules::open_unit_interval{}),
        parameter("advantage_clip", &self::advantage_clip, "advantages clipped to [-c, c]",
                  rules::in_range{.low = 1e-3, .high = 1e3}),
        parameter("kl_beta", &self::kl_beta, "weight of the KL to the reference model",
                  rules::in_range{.low = 0, .high = 1e3}),
        parameter("ratio_norm", &self::ratio_norm, "GRPO-Guard's RatioNorm of the importance ratio")
            .written_if(+[](const self& o) { return o.ratio_norm; }),
        parameter("step_weight", &self::step_weight, "per-step weight of the loss").written_if(+[](const self& o) {
          return o.step_weight != step_weighting::none;
        })};
  }
};

/// Throws invalid_input naming the first option outside its range (ppo_options::parameters()).
/// Example: validate(ppo_options{.clip_range = 0}) throws "loss.clip_range = 0.0: must be in (0, 1)".
/// Example: validate(ppo_options{.step_weight = step_weighting{7}}) throws
///   "loss.step_weight = 7: must be none, inverse_dt, noise_std or equal_steps".
/// @post 0 < clip_range < 1, advantage_clip in [1e-3, 1e3], kl_beta in [0, 1e3], step_weight one of the
///       enumerators.
inline void validate(const ppo_options& options) { validate_parameters(options, "loss"); }

namespace detail {

template <class T>
void require_finite(const T& value, const char* name) {
  if constexpr (std::floating_point<T>) require(std::isfinite(value), name, " ", value, " is not finite");
}

template <class T>
T clamp_between(const T& value, double low, double high) {
  if constexpr (std::is_arithmetic_v<T>)
    return std::clamp(value, static_cast<T>(low), static_cast<T>(high));
  else
    return clamp(value, low, high);  // ADL: at::clamp(tensor, scalar, scalar)
}

template <class T>
T larger(const T& a, const T& b) {
  if constexpr (std::is_arithmetic_v<T>)
    return std::max(a, b);
  else
    return max(a, b);  // ADL: element-wise maximum
}

}  // namespace detail

/// The advantage clipped to [-limit, limit].
/// Example: clip_advantage(7.0, 5.0) == 5.0; clip_advantage(-6.0, 5.0) == -5.0; clip_advantage(0.3, 5.0) == 0.3.
/// @pre limit > 0; a floating advantage is finite.
template <class T>
T clip_advantage(const T& advantage, double limit) {
  require(limit > 0.0, "advantage clip limit ", limit, " is not positive");
  detail::require_finite(advantage, "advantage");
  return detail::clamp_between(advantage, -limit, limit);
}

/// r = exp(log_new - log_old).
/// Example: importance_ratio(0.01, 0.0) == exp(0.01) = 1.010050167.
/// @pre floating log-probs are finite.
template <class T>
T importance_ratio(const T& log_new, const T& log_old) {
  using std::exp;
  detail::require_finite(log_new, "log_new");
  detail::require_finite(log_old, "log_old");
  return exp(log_new - log_old);
}

/// PPO clipped surrogate, to minimize: max(-A r, -A clamp(r, 1 - eps, 1 + eps)).
/// Example (eps = 1e-3, log_old = 0):
///   log_new  0.01, A  1 -> max(-1.010050, -1.001)    = -1.001;
///   log_new  0.01, A -2 -> max( 2.020100,  2.002)    =  2.020100334 (= 2 exp(0.01));
///   log_new -0.01, A  1 -> max(-0.990050, -0.999)    = -0.990049834 (= -exp(-0.01));
///   log_new -0.01, A -2 -> max( 1.980100,  1.998)    =  1.998.
/// @pre 0 < clip_range < 1; floating inputs finite.
template <class T>
T ppo_clipped_loss(const T& log_new, const T& log_old, const T& advantage, double clip_range) {
  require(clip_range > 0.0 && clip_range < 1.0, "ppo clip_range ", clip_range, " is not in (0, 1)");
  detail::require_finite(advantage, "advantage");
  const T ratio = importance_ratio(log_new, log_old);
  const T unclipped = -advantage * ratio;
  const T clipped = -advantage * detail::clamp_between(ratio, 1.0 - clip_range, 1.0 + clip_range);
  return detail::larger(unclipped, clipped);
}

/// d ppo_clipped_loss / d log_new (for exact-gradient toy policies). dr/dlog_new = r, so the unclipped
/// branch gives -A r; the clipped branch is flat outside [1 - eps, 1 + eps] and wins exactly when
/// (A > 0 and r > 1 + eps) or (A < 0 and r < 1 - eps): then the gradient is 0. On the clip boundary the
/// two branches agree (PyTorch's clamp passes the gradient at its bounds), so it is -A r there too.
/// Example (eps = 1e-3, log_old = 0): (0.01, A 1) -> 0; (0.01, A -2) -> 2.020100334; (-0.01, A 1) ->
///   -0.990049834; (-0.01, A -2) -> 0; (0.0005, A 3) -> -3 exp(0.0005) = -3.001500250.
/// @pre as ppo_clipped_loss.
inline double ppo_clipped_loss_gradient(double log_new, double log_old, double advantage, double clip_range) {
  require(clip_range > 0.0 && clip_range < 1.0, "ppo clip_range ", clip_range, " is not in (0, 1)");
  detail::require_finite(advantage, "advantage");
  const double ratio = importance_ratio(log_new, log_old);
  const bool flat = (advantage > 0.0 && ratio > 1.0 + clip_range) || (advantage < 0.0 && ratio < 1.0 - clip_range);
  return flat ? 0.0 : -advantage * ratio;
}

/// KL between two Gaussians of equal std, per element (Flow-GRPO): (mu - mu_ref)^2 / (2 sigma^2), where
/// mu, mu_ref are the transition means under the trained and the reference policy and sigma the edge's std.
/// Example: kl_flow_element(2.0, 1.5, 0.5) == 0.25 / 0.5 == 0.5.
/// @pre a floating sigma is finite and > 0; floating means finite.
template <class T, class S>
T kl_flow_element(const T& mu, const T& mu_ref, const S& sigma) {
  if constexpr (std::floating_point<S>)
    require(sigma > 0.0 && std::isfinite(sigma), "kl sigma ", sigma, " is not finite and positive");
  detail::require_finite(mu, "kl mu");
  detail::require_finite(mu_ref, "kl mu_ref");
  const T difference = mu - mu_ref;
  return difference * difference / (2.0 * sigma * sigma);
}

namespace detail {

inline void check_kl_inputs(std::span<const double> mu, std::span<const double> mu_ref, double sigma) {
  require(!mu.empty(), "kl over an empty latent");
  require(mu.size() == mu_ref.size(), "kl got ", mu.size(), " means and ", mu_ref.size(), " reference means");
  require(sigma > 0.0 && std::isfinite(sigma), "kl sigma ", sigma, " is not finite and positive");
  for (std::size_t i = 0; i < mu.size(); ++i) {
    require(std::isfinite(mu[i]), "kl mean ", i, " is ", mu[i]);
    require(std::isfinite(mu_ref[i]), "kl reference mean ", i, " is ", mu_ref[i]);
  }
}

}  // namespace detail

/// KL of one edge: the mean over the N latent elements of (mu_i - mu_ref_i)^2 / (2 sigma^2).
/// Example: mu {1, 2, 3}, mu_ref {1, 1.5, 4}, sigma 0.5 -> (0 + 0.25 + 1) / (2 * 0.25) / 3 = 0.833333.
/// @pre same non-zero size, finite values, sigma finite and > 0.
inline double kl_flow(std::span<const double> mu, std::span<const double> mu_ref, double sigma) {
  detail::check_kl_inputs(mu, mu_ref, sigma);
  double sum = 0.0;
  for (std::size_t i = 0; i < mu.size(); ++i) sum += (mu[i] - mu_ref[i]) * (mu[i] - mu_ref[i]);
  return sum / (2.0 * sigma * sigma) / static_cast<double>(mu.size());
}

/// d kl_flow / d mu_i = (mu_i - mu_ref_i) / (sigma^2 N).
/// Example: mu {1, 2, 3}, mu_ref {1, 1.5, 4}, sigma 0.5 -> {0, 0.5 / 0.75, -1 / 0.75} = {0, 0.666667, -1.333333}.
/// @pre as kl_flow.
inline std::vector<double> kl_flow_gradient(std::span<const double> mu, std::span<const double> mu_ref, double sigma) {
  detail::check_kl_inputs(mu, mu_ref, sigma);
  const double scale = 1.0 / (sigma * sigma * static_cast<double>(mu.size()));
  std::vector<double> gradient(mu.size());
  for (std::size_t i = 0; i < mu.size(); ++i) gradient[i] = (mu[i] - mu_ref[i]) * scale;
  return gradient;
}

/// KL of one edge from the policy's log-prob (averaged over elements, as row_log_prob) at the reference mean:
/// log p_theta(mu_ref) = -kl_flow(mu, mu_ref, sigma) - log sigma - log(2 pi) / 2, so
/// KL = -log_prob - log sigma - log(2 pi) / 2 (what train_iteration's accumulate_kl uses; its gradient is that of
/// -log_prob).
/// Example: mu {1, 2, 3}, mu_ref {1, 1.5, 4}, sigma 0.5: log_prob = -0.833333 + 0.693147 - 0.918939 = -1.059125
///   -> 0.833333 (= kl_flow's example).
/// @pre log_prob finite; sigma finite and > 0.
inline double kl_from_log_prob_at_reference(double log_prob, double sigma) {
  require(std::isfinite(log_prob), "kl log-prob ", log_prob, " is not finite");
  require(sigma > 0.0 && std::isfinite(sigma), "kl sigma ", sigma, " is not finite and positive");
  return -log_prob - std::log(sigma) - 0.5 * std::log(2.0 * std::numbers::pi);
}

/// The loss of one trained edge: ppo_clipped_loss(log_new, log_old, clip_advantage(A, advantage_clip),
/// clip_range) + kl_beta * kl. With kl_beta == 0 the kl argument is not read.
/// Example: log_new 0.01, log_old 0, A 7, kl 0.833333, {1e-3, 5, 0.04}: A -> 5, -5 * 1.001 + 0.04 * 0.833333
///   = -5.005 + 0.033333 = -4.971667.
/// @pre validate(options) passes; floating inputs finite.
template <class T>
T edge_loss(const T& log_new, const T& log_old, const T& advantage, const T& kl, const ppo_options& options) {
  validate(options);
  const T surrogate =
      ppo_clipped_loss(log_new, log_old, clip_advantage(advantage, options.advantage_clip), options.clip_range);
  if (options.kl_beta == 0.0) return surrogate;
  detail::require_finite(kl, "kl");
  return surrogate + options.kl_beta * kl;
}

}  // namespace branchgrpo
