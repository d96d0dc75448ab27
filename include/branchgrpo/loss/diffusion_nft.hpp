#pragma once
// diffusion_nft, DiffusionNFT (arXiv 2509.16117): flow matching towards implicit positive and negative
// velocities on the kept trees' samples (loss/matching.hpp). Use it to train from samples any sampler made, with
// no ratio: the advantage sets how much each sample pulls towards v+ or v-.
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
  /// It trains no transition (loss/objective.hpp's transition_option_conflict).
  static constexpr bool trains_transitions = false;
  /// Two Gaussian rows per sample and noise level: towards u+ and towards u- (nft_targets).
  static constexpr int rows_per_sample = 2;

  /// v+ and v- mix in v_old, the sampling policy's velocity, always.
  [[nodiscard]] bool uses_sampling_policy(std::size_t /*optimizer_steps*/) const { return true; }
  /// Rows of weight 1: matching_std(1).
  [[nodiscard]] double weight(double /*t*/) const { return 1.0; }

  /// One chunk: two rows per sample, the positive target u+ first, then the negative u-.
  template <Backend B, class Model>
  void accumulate_matching(matching_call<B, Model>& call) const {
    using tensor = typename B::tensor;
    const std::size_t count = call.rows.size();
    const nft_targets to = nft_targets::of(beta);
    const std::array<tensor, 2> x_twice = {call.chunk.x_t, call.chunk.x_t};
    const std::array<tensor, 2> targets = {
        call.backend.affine(to.plus_u, call.chunk.target, to.plus_old, call.chunk.old_velocity),
        call.backend.affine(to.minus_u, call.chunk.target, to.minus_old, call.chunk.old_velocity)};
    edge_batch<tensor>& edges = call.edges;
    edges.x = call.backend.concat_rows(x_twice);
    edges.next = call.backend.concat_rows(targets);
    edges.trees.insert(edges.trees.end(), edges.trees.begin(), edges.trees.end());
    edges.prompts.insert(edges.prompts.end(), edges.prompts.begin(), edges.prompts.end());
    edges.std.assign(2 * count, matching_std(call.weight));
    call.policy.accumulate(edges, loss_gradient_fn([&](std::span<const double> log_probs) {
                             require(log_probs.size() == 2 * count, "policy returned ", log_probs.size(),
                                     " log-probs for ", 2 * count, " matching rows");
                             std::vector<double> weights(2 * count);
                             const double scale = advantage_max * beta;
                             for (std::size_t i = 0; i < count; ++i) {
                               const double r = nft_optimality(call.rows[i].advantage, advantage_max);
                               const double plus = matching_log_prob(log_probs[i], call.weight);
                               const double minus = matching_log_prob(log_probs[count + i], call.weight);
                               require(std::isfinite(plus) && std::isfinite(minus), "policy matching log-prob at step ",
                                       edges.step, " is not finite");
                               call.sums.loss += scale * (r * -plus + (1.0 - r) * -minus);
                               weights[i] = -scale * r * call.per_row;
                               weights[count + i] = -scale * (1.0 - r) * call.per_row;
                             }
                             return weights;
                           }));
    call.sums.evaluations += static_cast<std::int64_t>(2 * count);
  }

  /// The update: update_matching (loss/matching.hpp) with this objective's rows and accumulate.
  template <Backend B, Policy<B> Model, Stepper S, Communicator Comm>
  update_report update(Model& policy, const update_input<B, S>& input, Comm& communicator) const {
    return update_matching(*this, policy, input, communicator);
  }
};

}  // namespace branchgrpo
