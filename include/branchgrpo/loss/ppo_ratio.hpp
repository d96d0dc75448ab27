#pragma once
// ppo_ratio, the GRPO objective (the default): the PPO-clipped ratio of the rollout's transition log-probs over
// the trained edges (loss/ppo.hpp), with the options of training_options::loss: the KL term to a reference
// policy (kl_beta), GRPO-Guard's RatioNorm (ratio_norm, loss/ratio_guard.hpp) and per-step weights (step_weight,
// loss/step_weights.hpp).
//
// Its update: the trained edges split into updates_per_iteration optimizer steps, fed by step in chunks of max_batch
// rows through policy.accumulate (plus accumulate_kl when kl_beta > 0). Before the first optimizer step the
// parameters are those of the rollout, so the first step's old log-prob is the one just computed: its ratio is
// exactly 1. step_weight multiplies each edge's loss and weight by its step's weight; ratio_norm clips the
// normalized ratio instead, at 3 more evaluations per edge after the first step.
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/loss/ppo.hpp"
#include "branchgrpo/loss/ratio_guard.hpp"
#include "branchgrpo/loss/step_weights.hpp"
#include "branchgrpo/training/kl_term.hpp"
#include "branchgrpo/training/update_input.hpp"
#include "branchgrpo/training/update_loop.hpp"

namespace branchgrpo {

namespace detail {

/// One trained edge's term of a transition objective: its loss, d loss / d log-prob, and whether the rule cut it
/// (a clip, a mask: counted in the report's clip_fraction).
struct edge_term {
  double loss = 0;
  double loss_gradient = 0;
  bool cut = false;
};

/// An edge rule of the transition update below: what one trained edge contributes, given its log-prob under the
/// current and the old (rollout) policy, the mean gap b = mean (mu - mu_old)^2 / (2 std^2) between the two policies'
/// transition Gaussians (0 unless needs_mean_gap), its advantage and its std.
///   needs_mean_gap(loss)    whether b is computed (the old means kept, one forward per edge after the first step)
///   gap_has_gradient(loss)  whether the loss depends on the current mean through b (one more accumulate per edge)
///   term(...)               the edge_term
template <class R>
concept TransitionEdgeRule = requires(const R& rule, const ppo_options& loss, double log_prob, double old_log_prob,
                                      double mean_gap, double advantage, double edge_std) {
  { rule.needs_mean_gap(loss) } -> std::same_as<bool>;
  { rule.gap_has_gradient(loss) } -> std::same_as<bool>;
  { rule.term(log_prob, old_log_prob, mean_gap, advantage, edge_std, loss) } -> std::same_as<edge_term>;
};

/// ppo_ratio's rule: the PPO-clipped ratio, with GRPO-Guard's RatioNorm when loss.ratio_norm.
struct ppo_clip_rule {
  [[nodiscard]] bool needs_mean_gap(const ppo_options& loss) const { return loss.ratio_norm; }
  [[nodiscard]] bool gap_has_gradient(const ppo_options& loss) const { return loss.ratio_norm; }
  [[nodiscard]] edge_term term(double log_prob, double old_log_prob, double mean_gap, double advantage, double edge_std,
                               const ppo_options& loss) const {
    const double clip_range = loss.clip_range;
    edge_term out;
    double log_ratio = 0;
    if (loss.ratio_norm) {
      log_ratio = ratio_norm_log_ratio(log_prob, old_log_prob, mean_gap, edge_std);
      out.loss = ppo_clipped_loss(log_ratio, 0.0, advantage, clip_range);
      out.loss_gradient = ratio_norm_loss_gradient(log_prob, old_log_prob, mean_gap, advantage, clip_range, edge_std);
    } else {
      log_ratio = log_prob - old_log_prob;
      out.loss = ppo_clipped_loss(log_prob, old_log_prob, advantage, clip_range);
      out.loss_gradient = ppo_clipped_loss_gradient(log_prob, old_log_prob, advantage, clip_range);
    }
    out.cut = std::abs(std::exp(log_ratio) - 1.0) > clip_range;
    return out;
  }
};

// The update of the trained edges `trained` (nodes of this rank's forest, in the global update order) with the
// advantage of each node in `advantage` by the edge rule `rule`; `per_edge` is 1 / (trained edges of all ranks).
template <TransitionEdgeRule Rule, Backend B, Policy<B> Model, Stepper S, Communicator Comm>
class transition_edges_update {
 public:
  using tensor = typename B::tensor;

  transition_edges_update(const Rule& rule, Model& policy, const update_input<B, S>& input,
                          std::span<const std::int32_t> trained, std::span<const double> advantage, double per_edge,
                          Comm& communicator)
      : rule_(rule),
        policy_(policy),
        in_(input),
        trained_(trained),
        advantage_(advantage),
        per_edge_(per_edge),
        communicator_(communicator) {}

  update_sums run(std::span<const std::size_t> group_ends) {
    const rollout_tree& full = in_.result.tree;
    const auto groups = chunk_groups(group_ends, in_.options.max_batch, [&](std::size_t first, std::size_t row) {
      return full.step(full.parent(trained_[row])) == full.step(full.parent(trained_[first]));
    });
    step_weight_ = step_weights();
    if (rule_.needs_mean_gap(in_.options.loss)) old_means_ = old_means(groups);
    const bool with_kl = ReferencePolicy<Model, B> && in_.options.loss.kl_beta > 0.0;
    const bool gap_gradient = rule_.gap_has_gradient(in_.options.loss);
    const auto calls_per_chunk = [&](std::size_t group) {
      return 1.0 + (with_kl ? 1.0 : 0.0) + (gap_gradient && group > 0 ? 1.0 : 0.0);
    };
    std::size_t chunk_index = 0;
    run_optimizer_steps(policy_, communicator_, groups, calls_per_chunk,
                        [&](const row_chunk& chunk, std::size_t group) { accumulate(chunk, group, chunk_index++); });
    return sums_;
  }

 private:
  // The edges of one chunk (one step) as a batch, with the rollout's transition coefficients.
  [[nodiscard]] edge_batch<tensor> edges_of(const row_chunk& chunk) const {
    return transition_batch(in_, trained_.subspan(chunk.begin, chunk.size()));
  }

  // The policy's transition mean of every row of a batch, without gradient.
  tensor transition_mean(const edge_batch<tensor>& edges) {
    const denoise_batch batch{.step = edges.step, .sigma = edges.sigma, .trees = edges.trees, .prompts = edges.prompts};
    return in_.backend.affine(edges.coeffs.x_coeff, edges.x, edges.coeffs.velocity_coeff, policy_(edges.x, batch));
  }

  // Per-step loss weights (ppo_options::step_weight); empty when every weight is 1, so the default multiplies by
  // nothing and stays bit-identical.
  std::vector<double> step_weights() {
    const step_weighting kind = in_.options.loss.step_weight;
    const rollout_tree& full = in_.result.tree;
    const int steps = in_.schedule.steps();
    if (kind == step_weighting::equal_steps) {
      // The trained edges of every rank per step: a tree's nodes per step, summed over the iteration's trees.
      std::vector<double> edges_per_step(static_cast<std::size_t>(steps), 0.0);
      for (const std::int32_t n : trained_) edges_per_step[static_cast<std::size_t>(full.step(full.parent(n)))] += 1;
      communicator_.all_reduce_sum(std::span<double>(edges_per_step));
      return equal_step_weights(edges_per_step);
    }
    if (kind == step_weighting::none) return {};
    std::vector<double> step_noise(static_cast<std::size_t>(steps));
    for (int t = 0; t < steps; ++t)  // at the step's tree layer
      step_noise[static_cast<std::size_t>(t)] =
          step_coefficients(in_.stepper, in_.schedule, t, full.plan().layer(t)).noise_std;
    return step_loss_weights(kind, in_.schedule, step_noise);
  }

  // The mean gap needs the old (rollout) policy's mean of every edge trained after the first optimizer step. Before
  // that step the parameters are the rollout's, so the old means are the policy's own: computed here, one forward
  // pass per such edge, and kept (one latent per edge) until their step. The first step needs none: its ratio is
  // exactly 1 and its mean gap 0. Indexed by chunk, empty for the first step's chunks.
  std::vector<tensor> old_means(const std::vector<std::vector<row_chunk>>& groups) {
    std::vector<tensor> means(groups.front().size());
    for (std::size_t group = 1; group < groups.size(); ++group)
      for (const row_chunk& chunk : groups[group]) {
        means.push_back(transition_mean(edges_of(chunk)));
        sums_.evaluations += static_cast<std::int64_t>(chunk.size());
      }
    return means;
  }

  // The rule's loss of one edge and d loss / d log-prob; counts a cut edge.
  std::pair<double, double> edge_loss_and_gradient(double log_prob, double old_log_prob, double mean_gap,
                                                   double advantage, double edge_std) {
    const edge_term term = rule_.term(log_prob, old_log_prob, mean_gap, advantage, edge_std, in_.options.loss);
    if (term.cut) ++sums_.clipped;
    return {term.loss, term.loss_gradient};
  }

  // The rows' weights d loss / d log-prob of one chunk, given the policy's log-probs; adds their losses.
  std::vector<double> chunk_weights(const row_chunk& chunk, bool first_group, int step, std::span<const double> stds,
                                    std::span<const double> mean_gap, std::span<const double> log_probs) {
    require(log_probs.size() == chunk.size(), "policy returned ", log_probs.size(), " log-probs for ", chunk.size(),
            " edges");
    const double weight_of_step = step_weight_.empty() ? 1.0 : step_weight_[static_cast<std::size_t>(step)];
    std::vector<double> weights(chunk.size());
    for (std::size_t i = 0; i < log_probs.size(); ++i) {
      const std::int32_t n = trained_[chunk.begin + i];
      require(std::isfinite(log_probs[i]), "policy log-prob of edge ", n, " at step ", step, " is ", log_probs[i]);
      const double rollout_log_prob = in_.result.tree.log_prob(n);
      if (first_group)
        sums_.first_update_log_prob_gap =
            std::max(sums_.first_update_log_prob_gap, std::abs(log_probs[i] - rollout_log_prob));
      const double old_log_prob = first_group ? log_probs[i] : rollout_log_prob;
      const double advantage = clip_advantage(advantage_[static_cast<std::size_t>(n)], in_.options.loss.advantage_clip);
      const auto [loss, loss_gradient] =
          edge_loss_and_gradient(log_probs[i], old_log_prob, mean_gap[i], advantage, stds[i]);
      if (step_weight_.empty()) {
        sums_.loss += loss;
        weights[i] = per_edge_ * loss_gradient;
      } else {
        sums_.loss += weight_of_step * loss;
        weights[i] = per_edge_ * weight_of_step * loss_gradient;
      }
    }
    return weights;
  }

  // One chunk's accumulate calls: the rule's term, the mean gap's gradient after the first step (RatioNorm), the KL
  // term.
  void accumulate(const row_chunk& chunk, std::size_t group, std::size_t chunk_index) {
    const bool first_group = group == 0;
    const bool with_mean_gap = rule_.needs_mean_gap(in_.options.loss) && !first_group;
    const edge_batch<tensor> edges = edges_of(chunk);
    // RatioNorm's mean gap b = mean (mu - mu_old)^2 / (2 std^2) per row, from the log-density of the old mean
    // under the current one (kl_from_log_prob_at_reference); 0 in the first step.
    std::vector<double> mean_gap(chunk.size(), 0.0);
    if (with_mean_gap) {
      const tensor& old_mean = old_means_.at(chunk_index);
      const std::vector<double> at_old = in_.backend.row_log_prob(old_mean, transition_mean(edges), edges.std);
      for (std::size_t i = 0; i < chunk.size(); ++i)
        mean_gap[i] = std::max(0.0, kl_from_log_prob_at_reference(at_old[i], edges.std[i]));
      sums_.evaluations += static_cast<std::int64_t>(chunk.size());
    }
    std::vector<double> weights;
    policy_.accumulate(edges, loss_gradient_fn([&](std::span<const double> log_probs) {
                         weights = chunk_weights(chunk, first_group, edges.step, edges.std, mean_gap, log_probs);
                         return weights;
                       }));
    sums_.evaluations += static_cast<std::int64_t>(chunk.size());
    if (with_mean_gap && rule_.gap_has_gradient(in_.options.loss)) {
      // The gap's gradient: b = -log p(mu_old) + const, so the rows' log-probs at mu_old get minus the weights.
      edge_batch<tensor> at_old_mean = edges;
      at_old_mean.next = old_means_.at(chunk_index);
      policy_.accumulate(at_old_mean, loss_gradient_fn([&](std::span<const double> log_probs) {
                           require(log_probs.size() == chunk.size(), "policy returned ", log_probs.size(),
                                   " log-probs for ", chunk.size(), " edges");
                           std::vector<double> opposite(weights.size());
                           for (std::size_t i = 0; i < weights.size(); ++i) opposite[i] = -weights[i];
                           return opposite;
                         }));
      sums_.evaluations += static_cast<std::int64_t>(chunk.size());
    }
    if constexpr (ReferencePolicy<Model, B>)
      if (in_.options.loss.kl_beta > 0.0) {
        for (const double kl : accumulate_kl(in_.backend, policy_, edges, in_.options.loss.kl_beta * per_edge_))
          sums_.kl += kl;
        sums_.evaluations += static_cast<std::int64_t>(chunk.size());
      }
  }

  Rule rule_;
  Model& policy_;
  const update_input<B, S>& in_;
  std::span<const std::int32_t> trained_;
  std::span<const double> advantage_;
  double per_edge_;
  Comm& communicator_;
  std::vector<double> step_weight_ = {};
  std::vector<tensor> old_means_ = {};
  update_sums sums_ = {};
};

/// A transition objective's update with the edge rule `rule`: this rank's share of the trained edges
/// (input.credit.trained, in step order), the report of all ranks (ppo_ratio and flow_dppo).
template <TransitionEdgeRule Rule, Backend B, Policy<B> Model, Stepper S, Communicator Comm>
update_report update_transitions(const Rule& rule, Model& policy, const update_input<B, S>& input, Comm& communicator) {
  const std::vector<std::int32_t>& all = input.credit.trained;
  if (all.empty()) return {};  // every edge pruned: no step (the same on every rank)
  const auto edges = static_cast<std::int64_t>(all.size());
  const std::vector<std::size_t> global_ends = update_group_ends(edges, input.options.updates_per_iteration);
  const rank_rows<std::int32_t> mine =
      rows_of_rank(std::span<const std::int32_t>(all), std::span<const std::size_t>(global_ends), input.first_node(),
                   input.end_node(), [](std::int32_t& node) -> std::int32_t& { return node; });
  const std::span<const double> advantage =
      std::span<const double>(input.credit.edge_advantage)
          .subspan(static_cast<std::size_t>(input.first_node()),
                   static_cast<std::size_t>(input.end_node() - input.first_node()));
  const double per_edge = 1.0 / static_cast<double>(edges);
  transition_edges_update<Rule, B, Model, S, Comm> update(rule, policy, input, mine.rows, advantage, per_edge,
                                                          communicator);
  return finish_update(communicator, update.run(mine.group_ends), per_edge, edges);
}

}  // namespace detail

/// The GRPO objective: PPO-clipped ratio of the rollout's transition log-probs (training_options::loss).
struct ppo_ratio {
  friend bool operator==(const ppo_ratio&, const ppo_ratio&) = default;
  static constexpr std::string_view name = "ppo", summary = "PPO-clipped ratio of transition log-probs (GRPO)";
  static constexpr auto parameters() { return std::tuple{}; }
  /// It trains transitions: the loss options kl_beta, ratio_norm and step_weight apply (loss/objective.hpp).
  static constexpr bool trains_transitions = true;

  /// The update of this rank's share of the trained edges (input.credit.trained, in step order), the report of
  /// all ranks. Example: one dense tree's 218 trained edges, updates_per_iteration 2, max_batch 64 -> two
  /// optimizer steps over edges [0, 109) and [109, 218), evaluations 218, clip_fraction 0 in the first step
  /// (tests/unit/test_trainer.cpp).
  /// @pre training_options valid (train_iteration's checks).
  /// @post the policy took min(updates_per_iteration, trained edges) optimizer steps (none without a trained
  ///       edge); report.rows == trained edges.
  template <Backend B, Policy<B> Model, Stepper S, Communicator Comm>
  update_report update(Model& policy, const update_input<B, S>& input, Comm& communicator) const {
    return detail::update_transitions(detail::ppo_clip_rule{}, policy, input, communicator);
  }
};

}  // namespace branchgrpo
