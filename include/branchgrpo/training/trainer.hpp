#pragma once
// The generic BranchGRPO training iteration, as public stages that train_iteration composes:
//   1. rollout          frontier-batched sampling of one tree per prompt (rollout/engine.hpp)
//   2. score_leaves     leaf rewards; keep_finite_trees drops a tree with a non-finite leaf reward
//   3. assign_credit    fusion -> normalization -> pruning -> the trained edges and their advantages
//   4. update_policy    PPO-clipped update over the trained edges, batched by step, gradients accumulated and
//                       applied in `updates_per_iteration` optimizer steps; the KL term through accumulate_kl
// Each stage can be called, tested and benchmarked alone.
// Every algorithmic choice is a component of `method`; the model is a Policy, the score a Reward.
//
// Data parallel over trees (a Communicator, distributed/communicator.hpp; one process is its one-rank case,
// single_process, through the same code: its gather is a copy and it owns every edge): every rank calls
// train_iteration with the same prompts and rolls out its tree_share of them, keyed by the global tree index, so
// the ranks' trees together are the one-process rollout. The leaf rewards and the trees' log-probs are gathered
// (a few doubles per node), so every rank assigns credit on the whole forest exactly as one process would, and
// the stateful normalizers and cross-tree pruners stay identical everywhere; each rank then accumulates the
// gradient of its own trees' trained edges with the one-process weights (1 / all trained edges), the gradients
// are summed over the ranks before every optimizer step (DataParallelPolicy), and the parameters stay identical.
// A policy whose accumulate is itself a collective (PaddedAccumulationPolicy: ZeRO-2 reducing during the backward
// pass) gets the same number of accumulate calls on every rank: a rank with fewer edges pads.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <variant>
#include <vector>

#include "branchgrpo/advantage/concept.hpp"
#include "branchgrpo/correlator/concept.hpp"
#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/fusion/concept.hpp"
#include "branchgrpo/loss/objective.hpp"
#include "branchgrpo/loss/ppo.hpp"
#include "branchgrpo/loss/ratio_guard.hpp"
#include "branchgrpo/loss/step_weights.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/pruning/combinators.hpp"
#include "branchgrpo/pruning/concept.hpp"
#include "branchgrpo/rollout/engine.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/topology/concept.hpp"
#include "branchgrpo/training/concepts.hpp"

namespace branchgrpo {

/// An objective of the update (loss/objective.hpp): the GRPO ratio, a decoupled matching objective, or
/// any_objective, one of them chosen at run time (a run config's [objective]).
template <class O>
concept Objective = std::same_as<O, ppo_ratio> || MatchingObjective<O> || std::same_as<O, any_objective>;

/// A training recipe: one policy of each component family, and the objective of the update (the GRPO ratio by
/// default, so a six-component `method{...}` is the GRPO recipe it always was).
template <Topology T, Stepper S, NoiseCorrelator C, Fusion F, Normalizer N, Pruner P, Objective O = ppo_ratio>
struct method {
  T topology;
  S stepper;
  C correlator;
  F fusion;
  N normalizer;
  P pruner;
  O objective = {};
};

struct training_options {
  std::int64_t max_batch = 64;  ///< rows per denoiser call, in the rollout and in the update
  std::uint64_t seed = 0;
  int updates_per_iteration = 1;  ///< optimizer steps per iteration; the kept edges are split evenly
  int total_iterations = 1;       ///< planned length of the run (pruners active for a fraction of it)
  ppo_options loss = {};
};

/// What one iteration did. Times in seconds.
struct iteration_stats {
  int iteration = 0;
  double reward_mean = 0, reward_std = 0, reward_min = 0, reward_max = 0;  ///< over finite leaf rewards
  std::int64_t rollout_evaluations = 0;                                    ///< denoiser rows in the rollout
  std::int64_t update_evaluations = 0;                                     ///< policy rows in the update
  std::int64_t edges = 0;                                                  ///< edges of the rollout
  /// edges kept by the pruner (SDE only) in trees that were not dropped; with a decoupled objective, its rows
  /// (kept leaves x times_per_sample, plus the internal split nodes with intermediate_nodes)
  std::int64_t edges_trained = 0;
  int trees_dropped = 0;     ///< trees with a non-finite leaf reward, left out of the update
  double loss = 0;           ///< mean PPO loss over the trained edges (a decoupled objective's: over its rows)
  double clip_fraction = 0;  ///< fraction of trained edges whose ratio left [1 - eps, 1 + eps]
  double kl = 0;             ///< mean KL to the reference over the trained edges, as accumulated (0 when kl_beta == 0)
  /// max |log-prob at the first update - log-prob of the rollout|: 0 when the policy is batch-invariant.
  double first_update_log_prob_gap = 0;
  double rollout_seconds = 0, reward_seconds = 0, update_seconds = 0, seconds = 0;
};

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

namespace detail {

using training_clock = std::chrono::steady_clock;

inline double seconds_since(training_clock::time_point start) {
  return std::chrono::duration<double>(training_clock::now() - start).count();
}

/// The forest restricted to `kept` trees (in order), with the rollout's log-probs copied.
inline rollout_tree select_trees(const rollout_tree& tree, std::span<const std::int32_t> kept) {
  std::vector<tree_info> infos;
  for (std::int32_t t : kept) infos.push_back(tree.info(t));
  rollout_tree subset(tree.plan(), std::move(infos));
  const std::int32_t per_tree = tree.nodes_per_tree();
  auto log_probs = subset.mutable_log_probs();
  for (std::size_t i = 0; i < kept.size(); ++i)
    std::copy_n(tree.log_probs().begin() + kept[i] * per_tree, per_tree,
                log_probs.begin() + static_cast<std::ptrdiff_t>(i) * per_tree);
  return subset;
}

}  // namespace detail

/// The leaf rewards of a rollout with the non-finite-reward policy applied: a tree with any non-finite leaf reward
/// is dropped from the update, its finite leaves too (a half-scored tree would bias its own baseline).
struct scored_leaves {
  std::vector<double> scores;                  ///< every leaf's reward, tree.leaves() order
  std::vector<std::int32_t> kept_trees;        ///< the trees whose leaf rewards are all finite, in order
  std::vector<double> kept_scores;             ///< those trees' leaf rewards, tree.leaves() order
  double mean = 0, std = 0, min = 0, max = 0;  ///< over kept_scores (population std); NaN when none was kept
  /// A ComponentReward's parts: rows over every leaf (components) and over the kept trees' leaves
  /// (kept_components), in the reward's order; empty for a reward that reports none.
  std::vector<reward_component> components = {};
  std::vector<reward_component> kept_components = {};
};

/// Stage 2 of an iteration, on rewards already computed: which trees train, and the statistics of their rewards.
/// Example: 2 trees of 2 leaves, scores {0.1, 0.5, NaN, 0.3} -> kept_trees {0}, kept_scores {0.1, 0.5},
///   mean 0.3, std 0.2, min 0.1, max 0.5.
///   With components {"a", weight 1, {0.1, 0.2, 0.3, 0.4}} -> kept_components {"a", 1, {0.1, 0.2}}.
/// @pre scores.size() == tree.leaf_count(), and so every component's rows (else invalid_input naming both).
/// @post kept_scores.size() == kept_trees.size() * tree.leaves_per_tree(), and so every kept component's rows;
///       every kept score finite.
inline scored_leaves keep_finite_trees(const rollout_tree& tree, std::vector<double> scores,
                                       std::vector<reward_component> components = {}) {
  require(scores.size() == static_cast<std::size_t>(tree.leaf_count()), "reward returned ", scores.size(),
          " scores for ", tree.leaf_count(), " leaves");
  for (const reward_component& part : components)
    require(part.rows.size() == scores.size(), "reward part '", part.name, "' returned ", part.rows.size(),
            " scores for ", tree.leaf_count(), " leaves");
  scored_leaves out{.scores = std::move(scores), .kept_trees = {}, .kept_scores = {}};
  out.components = std::move(components);
  for (const reward_component& part : out.components)
    out.kept_components.push_back({.name = part.name, .weight = part.weight, .rows = {}});
  const std::int32_t leaves_per_tree = tree.leaves_per_tree();
  for (std::int32_t t = 0; t < tree.tree_count(); ++t) {
    const auto offset = static_cast<std::ptrdiff_t>(t) * leaves_per_tree;
    const auto first = out.scores.begin() + offset;
    if (std::all_of(first, first + leaves_per_tree, [](double r) { return std::isfinite(r); })) {
      out.kept_trees.push_back(t);
      out.kept_scores.insert(out.kept_scores.end(), first, first + leaves_per_tree);
      for (std::size_t c = 0; c < out.components.size(); ++c) {
        const auto part = out.components[c].rows.begin() + offset;
        out.kept_components[c].rows.insert(out.kept_components[c].rows.end(), part, part + leaves_per_tree);
      }
    }
  }
  if (out.kept_scores.empty()) {
    out.mean = out.std = out.min = out.max = std::numeric_limits<double>::quiet_NaN();
    return out;
  }
  const auto [low, high] = std::minmax_element(out.kept_scores.begin(), out.kept_scores.end());
  double sum = 0, squares = 0;
  for (double r : out.kept_scores) sum += r;
  out.mean = sum / static_cast<double>(out.kept_scores.size());
  for (double r : out.kept_scores) squares += (r - out.mean) * (r - out.mean);
  out.std = std::sqrt(squares / static_cast<double>(out.kept_scores.size()));
  out.min = *low;
  out.max = *high;
  return out;
}

/// Stage 2: scores the rollout's leaves (their final latents, each with its tree's prompt; a groupwise reward also
/// sees which tree each leaf is of) and applies keep_finite_trees, with the parts of a ComponentReward.
/// @pre the reward returns one score per leaf (else invalid_input).
template <Backend B, Reward<B> Score>
scored_leaves score_leaves(B& backend, Score& reward, const rollout_result<B>& result) {
  const rollout_tree& tree = result.tree;
  std::vector<std::int64_t> leaf_prompts;
  leaf_prompts.reserve(static_cast<std::size_t>(tree.leaf_count()));
  for (std::int32_t leaf : tree.leaves()) leaf_prompts.push_back(tree.info(tree.tree(leaf)).prompt);
  std::vector<std::uint32_t> keys;
  for (std::int32_t t = 0; t < tree.tree_count(); ++t) keys.push_back(tree.info(t).key);
  const leaf_groups groups{.leaves_per_tree = tree.leaves_per_tree(), .keys = keys};
  std::vector<double> scores = score_rows<B>(reward, leaf_latents(backend, result), leaf_prompts, groups);
  std::vector<reward_component> components;
  if constexpr (ComponentReward<Score>) {
    const std::span<const reward_component> parts = reward.last_component_rows();
    components.assign(parts.begin(), parts.end());
  }
  return keep_finite_trees(tree, std::move(scores), std::move(components));
}

/// Credit assignment of the kept trees: the fused reward and the advantage of every node, the pruner's mask, and
/// the trained edges with their advantages, ordered for the update.
struct edge_credit {
  rollout_tree kept;                        ///< the forest of the kept trees (log-probs copied)
  std::vector<double> fused = {};           ///< per node of `kept`
  std::vector<double> advantages = {};      ///< per node of `kept` (the edge into it)
  edge_mask mask = {};                      ///< per node of `kept`: 1 = the pruner keeps the edge
  std::vector<std::int32_t> trained = {};   ///< nodes of the full forest whose (SDE, kept) edges train, by step
  std::vector<double> edge_advantage = {};  ///< per node of the full forest: a trained edge's advantage, else 0
};

/// Stage 3: fusion -> normalization -> pruning on the kept trees, then the trained edges (kept by the pruner and
/// SDE) in step order with their advantages, indexed in the full forest.
/// Example: branch_method() on one dense tree over 20 steps with every leaf scored -> trained.size() == 218 (every
///   edge), the edges of step 0 first; with parent_top_k{.k = 1} the worse child of each of the 8 last-split
///   parents and its chain are dropped: 218 - 8 * 11 = 130 (tests/unit/test_trainer.cpp).
/// @pre leaves came from keep_finite_trees of `full` with at least one kept tree; the recipe's components accept
///      `full`'s plan (else their invalid_input).
/// @post mask.size() == kept.node_count(); every trained node is an SDE edge whose mask is 1.
template <Topology T, Stepper S, NoiseCorrelator C, Fusion F, Normalizer N, Pruner P, Objective O>
edge_credit assign_credit(method<T, S, C, F, N, P, O>& recipe, const rollout_tree& full, const scored_leaves& leaves,
                          int iteration, int total_iterations) {
  require(!leaves.kept_trees.empty(), "credit assignment needs at least one kept tree");
  const bool all_kept = static_cast<std::int32_t>(leaves.kept_trees.size()) == full.tree_count();
  edge_credit credit{.kept = all_kept ? rollout_tree(full) : detail::select_trees(full, leaves.kept_trees)};
  const rollout_tree& subset = credit.kept;
  credit.fused = recipe.fusion(subset, leaves.kept_scores);
  std::vector<leaf_component> parts;
  for (const reward_component& part : leaves.kept_components)
    parts.push_back({.name = part.name, .weight = part.weight, .leaf = part.rows});
  credit.advantages =
      recipe.normalizer(subset, reward_view{.leaf = leaves.kept_scores, .fused = credit.fused, .components = parts});
  credit.mask = recipe.pruner(subset, prune_context{.iteration = iteration,
                                                    .total_iterations = total_iterations,
                                                    .leaf_rewards = leaves.kept_scores,
                                                    .fused = credit.fused,
                                                    .advantages = credit.advantages});
  require(credit.mask.size() == static_cast<std::size_t>(subset.node_count()), "pruner returned ", credit.mask.size(),
          " flags for ", subset.node_count(), " nodes");
  // `original` maps a node of the kept forest to the full forest.
  const std::int32_t per_tree = full.nodes_per_tree();
  const auto original = [&](std::int32_t n) {
    return leaves.kept_trees[static_cast<std::size_t>(n / per_tree)] * per_tree + n % per_tree;
  };
  credit.edge_advantage.assign(static_cast<std::size_t>(full.node_count()), 0.0);
  for (int s = 0; s < full.steps(); ++s)
    for (std::int32_t n : subset.edges_at_step(s)) {
      if (!credit.mask[static_cast<std::size_t>(n)] || subset.kind(n) != edge_kind::sde) continue;
      credit.edge_advantage[static_cast<std::size_t>(original(n))] = credit.advantages[static_cast<std::size_t>(n)];
      credit.trained.push_back(original(n));
    }
  return credit;
}

/// A policy whose accumulated gradient can be summed over a process group: policy.all_reduce_gradients(c) replaces
/// the gradient buffer by its sum over c's ranks (called before every optimizer step with any communicator but
/// single_process).
template <class P, class C>
concept DataParallelPolicy = Communicator<C> && requires(P& policy, C& communicator) {
  policy.all_reduce_gradients(communicator);
};

/// What the update stage did.
struct update_report {
  std::int64_t evaluations = 0;          ///< policy rows (PPO, plus the KL term's and RatioNorm's when on)
  double loss = 0;                       ///< mean PPO loss over the trained edges (weighted; r_hat with ratio_norm)
  double clip_fraction = 0;              ///< fraction of trained edges whose ratio left [1 - eps, 1 + eps]
  double kl = 0;                         ///< mean KL to the reference over the trained edges (0 when kl_beta == 0)
  double first_update_log_prob_gap = 0;  ///< max |log-prob at the first update - the rollout's|
};

namespace detail {

// The end of one optimizer step: `pads` empty accumulates (a rank with fewer calls than the busiest, for a policy
// whose accumulate is a collective), the sum of the ranks' gradients, the step. single_process is one rank by its
// type, and the sum over one rank is the gradient itself: nothing to call, so a policy without
// all_reduce_gradients trains alone. Any other communicator may have several ranks, so it always sums (a group of
// one at run time sums one gradient); the dispatch is on the type, never on size(), so the one-rank case runs the
// same code as any other.
template <class Model, Communicator Comm>
void finish_optimizer_step(Model& policy, Comm& communicator, double pads) {
  if constexpr (PaddedAccumulationPolicy<Model>)
    for (; pads > 0; --pads) policy.pad_accumulate();
  else
    (void)pads;
  if constexpr (!std::same_as<Comm, single_process>) {
    static_assert(DataParallelPolicy<Model, Comm>,
                  "training on more than one process needs a policy with all_reduce_gradients(communicator)");
    policy.all_reduce_gradients(communicator);
  } else {
    (void)communicator;
  }
  policy.apply_update();
}

// The trained edges of one rank: `trained` are nodes of `result`'s forest in the global update order, `advantage`
// is per node of that forest, `group_ends[g]` is the end in `trained` of optimizer step g's edges, `per_edge` is
// 1 / (trained edges of all ranks). After every group the gradient is summed over the ranks, then applied.
template <Backend B, Policy<B> Model, Stepper S, Communicator Comm>
update_report update_edges(B& backend, Model& policy, const rollout_result<B>& result,
                           std::span<const std::int32_t> trained, std::span<const double> advantage,
                           std::span<const std::size_t> group_ends, double per_edge, const S& stepper,
                           const sigma_schedule& schedule, const training_options& options, Comm& communicator) {
  const rollout_tree& full = result.tree;
  update_report report;
  double loss_sum = 0, kl_sum = 0;
  std::int64_t clipped = 0;
  std::size_t group_begin = 0;
  // The end of the chunk that starts at `begin`: at most max_batch edges of one step.
  const auto chunk_end = [&](std::size_t begin, std::size_t group_end) {
    const int step = full.step(full.parent(trained[begin]));
    std::size_t end = begin;
    while (end < group_end && static_cast<std::int64_t>(end - begin) < options.max_batch &&
           full.step(full.parent(trained[end])) == step)
      ++end;
    return end;
  };
  const bool with_kl = ReferencePolicy<Model, B> && options.loss.kl_beta > 0.0;
  // The edges [begin, end) of one step as a batch.
  const auto edges_of = [&](std::size_t begin, std::size_t end) {
    const std::span<const std::int32_t> chunk(trained.data() + begin, end - begin);
    edge_batch<typename B::tensor> edges;
    edges.step = full.step(full.parent(chunk.front()));
    edges.sigma = schedule.sigma(edges.step);
    edges.coeffs = step_coefficients(stepper, schedule, edges.step, full.plan().layer(edges.step));  // the rollout's
    std::vector<std::int64_t> parent_rows, child_rows;
    for (std::int32_t n : chunk) {
      parent_rows.push_back(full.row_at_step(full.parent(n)));
      child_rows.push_back(full.row_at_step(n));
      edges.std.push_back(result.edge_std[static_cast<std::size_t>(n)]);
      edges.trees.push_back(full.info(full.tree(n)).key);
      edges.prompts.push_back(full.info(full.tree(n)).prompt);
    }
    edges.x = backend.gather_rows(result.latents[static_cast<std::size_t>(edges.step)], parent_rows);
    edges.next = backend.gather_rows(result.latents[static_cast<std::size_t>(edges.step) + 1], child_rows);
    return edges;
  };
  // The policy's transition mean of every row of a batch, without gradient.
  const auto transition_mean = [&](const edge_batch<typename B::tensor>& edges) {
    const denoise_batch batch{.step = edges.step, .sigma = edges.sigma, .trees = edges.trees, .prompts = edges.prompts};
    return backend.affine(edges.coeffs.x_coeff, edges.x, edges.coeffs.velocity_coeff, policy(edges.x, batch));
  };
  // Per-step loss weights (ppo_options::step_weight); empty when every weight is 1, so the default multiplies by
  // nothing and stays bit-identical.
  std::vector<double> step_weight;
  if (options.loss.step_weight == step_weighting::equal_steps) {
    // The trained edges of every rank per step: a tree's nodes per step, summed over the iteration's trees.
    std::vector<double> edges_per_step(static_cast<std::size_t>(schedule.steps()), 0.0);
    for (const std::int32_t n : trained) edges_per_step[static_cast<std::size_t>(full.step(full.parent(n)))] += 1;
    communicator.all_reduce_sum(std::span<double>(edges_per_step));
    step_weight = equal_step_weights(edges_per_step);
  } else if (options.loss.step_weight != step_weighting::none) {
    std::vector<double> step_noise(static_cast<std::size_t>(schedule.steps()));
    for (int t = 0; t < schedule.steps(); ++t)
      step_noise[static_cast<std::size_t>(t)] =
          step_coefficients(stepper, schedule, t, full.plan().layer(t)).noise_std;  // at the step's tree layer
    step_weight = step_loss_weights(options.loss.step_weight, schedule, step_noise);
  }
  // RatioNorm needs the old (rollout) policy's mean of every edge trained after the first optimizer step. Before that
  // step the parameters are the rollout's, so the old means are the policy's own: computed here, one forward pass per
  // such edge, and kept (one latent per edge) until their group. The first group needs none: its ratio is exactly 1
  // and its mean gap 0.
  std::vector<typename B::tensor> old_means;  // per chunk of groups 1, 2, ..., in update order
  if (options.loss.ratio_norm)
    for (std::size_t group = 1; group < group_ends.size(); ++group)
      for (std::size_t begin = group_ends[group - 1]; begin < group_ends[group];) {
        const std::size_t end = chunk_end(begin, group_ends[group]);
        old_means.push_back(transition_mean(edges_of(begin, end)));
        report.evaluations += static_cast<std::int64_t>(end - begin);
        begin = end;
      }
  std::size_t old_mean_index = 0;
  for (std::size_t group = 0; group < group_ends.size(); ++group) {
    const std::size_t group_end = group_ends[group];
    const bool first_group = group == 0;
    const bool with_mean_gap = options.loss.ratio_norm && !first_group;
    // A policy whose accumulate is a collective: every rank makes as many calls as the rank with the most edges.
    double pads = 0;
    if constexpr (PaddedAccumulationPolicy<Model>) {
      double calls = 0;
      for (std::size_t begin = group_begin; begin < group_end; begin = chunk_end(begin, group_end))
        calls += 1 + (with_kl ? 1 : 0) + (with_mean_gap ? 1 : 0);
      const std::vector<double> all = all_gather_values(communicator, std::span<const double>(&calls, 1));
      pads = *std::max_element(all.begin(), all.end()) - calls;
    }
    for (std::size_t begin = group_begin; begin < group_end;) {
      const std::size_t end = chunk_end(begin, group_end);
      const std::span<const std::int32_t> chunk(trained.data() + begin, end - begin);
      const edge_batch<typename B::tensor> edges = edges_of(begin, end);
      const int step = edges.step;
      const double weight_of_step = step_weight.empty() ? 1.0 : step_weight[static_cast<std::size_t>(step)];
      // RatioNorm's mean gap b = mean (mu - mu_old)^2 / (2 std^2) per row, from the log-density of the old mean
      // under the current one (kl_from_log_prob_at_reference); 0 in the first group.
      std::vector<double> mean_gap(chunk.size(), 0.0);
      const typename B::tensor* old_mean = nullptr;
      if (with_mean_gap) {
        old_mean = &old_means.at(old_mean_index++);
        const std::vector<double> at_old = backend.row_log_prob(*old_mean, transition_mean(edges), edges.std);
        for (std::size_t i = 0; i < chunk.size(); ++i)
          mean_gap[i] = std::max(0.0, kl_from_log_prob_at_reference(at_old[i], edges.std[i]));
        report.evaluations += static_cast<std::int64_t>(chunk.size());
      }
      std::vector<double> weights(chunk.size());

      const auto gradient = [&](std::span<const double> log_probs) {
        require(log_probs.size() == chunk.size(), "policy returned ", log_probs.size(), " log-probs for ", chunk.size(),
                " edges");
        for (std::size_t i = 0; i < log_probs.size(); ++i) {
          const std::int32_t n = chunk[i];
          require(std::isfinite(log_probs[i]), "policy log-prob of edge ", n, " at step ", step, " is ", log_probs[i]);
          const double rollout_log_prob = full.log_prob(n);
          if (first_group)
            report.first_update_log_prob_gap =
                std::max(report.first_update_log_prob_gap, std::abs(log_probs[i] - rollout_log_prob));
          const double old_log_prob = first_group ? log_probs[i] : rollout_log_prob;
          const double clipped_advantage =
              clip_advantage(advantage[static_cast<std::size_t>(n)], options.loss.advantage_clip);
          double loss = 0, loss_gradient = 0, log_ratio = 0;
          if (options.loss.ratio_norm) {
            const double edge_std = edges.std[i];
            log_ratio = ratio_norm_log_ratio(log_probs[i], old_log_prob, mean_gap[i], edge_std);
            loss = ppo_clipped_loss(log_ratio, 0.0, clipped_advantage, options.loss.clip_range);
            loss_gradient = ratio_norm_loss_gradient(log_probs[i], old_log_prob, mean_gap[i], clipped_advantage,
                                                     options.loss.clip_range, edge_std);
          } else {
            log_ratio = log_probs[i] - old_log_prob;
            loss = ppo_clipped_loss(log_probs[i], old_log_prob, clipped_advantage, options.loss.clip_range);
            loss_gradient =
                ppo_clipped_loss_gradient(log_probs[i], old_log_prob, clipped_advantage, options.loss.clip_range);
          }
          if (std::abs(std::exp(log_ratio) - 1.0) > options.loss.clip_range) ++clipped;
          if (step_weight.empty()) {
            loss_sum += loss;
            weights[i] = per_edge * loss_gradient;
          } else {
            loss_sum += weight_of_step * loss;
            weights[i] = per_edge * weight_of_step * loss_gradient;
          }
        }
        return weights;
      };
      policy.accumulate(edges, loss_gradient_fn(gradient));
      report.evaluations += static_cast<std::int64_t>(chunk.size());
      if (with_mean_gap) {
        // The gap's gradient: b = -log p(mu_old) + const, so the rows' log-probs at mu_old get minus the weights.
        edge_batch<typename B::tensor> at_old_mean = edges;
        at_old_mean.next = *old_mean;
        policy.accumulate(at_old_mean, loss_gradient_fn([&](std::span<const double> log_probs) {
                            require(log_probs.size() == chunk.size(), "policy returned ", log_probs.size(),
                                    " log-probs for ", chunk.size(), " edges");
                            std::vector<double> opposite(weights.size());
                            for (std::size_t i = 0; i < weights.size(); ++i) opposite[i] = -weights[i];
                            return opposite;
                          }));
        report.evaluations += static_cast<std::int64_t>(chunk.size());
      }
      if constexpr (ReferencePolicy<Model, B>)
        if (options.loss.kl_beta > 0.0) {
          for (const double kl : accumulate_kl(backend, policy, edges, options.loss.kl_beta * per_edge)) kl_sum += kl;
          report.evaluations += static_cast<std::int64_t>(chunk.size());
        }
      begin = end;
    }
    finish_optimizer_step(policy, communicator, pads);
    group_begin = group_end;
  }
  // The ranks' partial sums, and the largest gap of any rank. On one rank the sum is the rank's own (the counts
  // are below 2^53, exact as doubles) and the largest gap its only one.
  std::array<double, 4> sums = {loss_sum, kl_sum, static_cast<double>(clipped),
                                static_cast<double>(report.evaluations)};
  communicator.all_reduce_sum(sums);
  loss_sum = sums[0];
  kl_sum = sums[1];
  clipped = static_cast<std::int64_t>(sums[2]);
  report.evaluations = static_cast<std::int64_t>(sums[3]);
  const std::vector<double> gaps =
      all_gather_values(communicator, std::span<const double>(&report.first_update_log_prob_gap, 1));
  report.first_update_log_prob_gap = *std::max_element(gaps.begin(), gaps.end());
  report.loss = loss_sum * per_edge;
  report.clip_fraction = static_cast<double>(clipped) * per_edge;
  report.kl = kl_sum * per_edge;
  return report;
}

// The ends of the min(updates_per_iteration, edges) contiguous groups of near-equal size of `edges` edges.
inline std::vector<std::size_t> update_group_ends(std::int64_t edges, int updates_per_iteration) {
  const auto groups = std::min<std::int64_t>(updates_per_iteration, edges);
  std::vector<std::size_t> ends;
  for (std::int64_t group = 0; group < groups; ++group)
    ends.push_back(static_cast<std::size_t>((group + 1) * edges / groups));
  return ends;
}

}  // namespace detail

/// Stage 4: the PPO update over the trained edges. They are split into min(updates_per_iteration, edges)
/// contiguous groups of near-equal size (so the grouping does not depend on max_batch); each group is fed by
/// step in chunks of max_batch rows through policy.accumulate (plus accumulate_kl when kl_beta > 0), then one
/// optimizer step. The loss is the mean over all trained edges. Before the first optimizer step the parameters
/// are those of the rollout, so the first group's old log-prob is the one just computed: its ratio is exactly 1.
/// ppo_options::step_weight multiplies each edge's loss and weight by its step's weight; ppo_options::ratio_norm
/// clips GRPO-Guard's normalized ratio instead (docs/loss.md), at 3 more evaluations per edge after the first group.
/// Example: one dense tree's 218 trained edges, updates_per_iteration 2, max_batch 64 -> two optimizer steps
///   over edges [0, 109) and [109, 218), evaluations 218, clip_fraction 0 in the first group
///   (tests/unit/test_trainer.cpp).
/// @pre credit.trained non-empty and from `result`'s forest; options valid (train_iteration's checks).
/// @post the policy took min(updates_per_iteration, credit.trained.size()) optimizer steps.
template <Backend B, Policy<B> Model, Stepper S>
update_report update_policy(B& backend, Model& policy, const rollout_result<B>& result, const edge_credit& credit,
                            const S& stepper, const sigma_schedule& schedule, const training_options& options) {
  require(!credit.trained.empty(), "the update needs at least one trained edge");
  const auto edge_count = static_cast<std::int64_t>(credit.trained.size());
  single_process one;
  return detail::update_edges(backend, policy, result, credit.trained, credit.edge_advantage,
                              detail::update_group_ends(edge_count, options.updates_per_iteration),
                              1.0 / static_cast<double>(edge_count), stepper, schedule, options, one);
}

/// One row of a decoupled objective's update: a sample (a leaf of a kept tree, node of the rollout's forest) at
/// its draw-th noise level, the schedule step whose sigma is that level, and the sample's advantage. An
/// intermediate row is an internal split node n itself, at its own step: state x_n, target the straight-path
/// velocity (x_n - mean of the leaves under n) / sigma_n (the objectives' intermediate_nodes option).
struct matching_row {
  std::int32_t node = 0;
  std::uint32_t draw = 0;
  int step = 0;
  double advantage = 0;
  bool intermediate = false;
};

/// The schedule step whose sigma a sample trains at, draw `draw` of the sample `node` (index inside its tree)
/// of tree `tree`: a keyed uniform draw over the steps [0, steps), so it depends on neither max_batch nor ranks.
/// Example: any key with steps 1 -> 0; the same key twice -> the same step.
/// @pre steps >= 1; draw <= max_noise_step.
inline int matching_step(std::uint64_t seed, std::uint32_t iteration, std::uint32_t tree, std::uint32_t node,
                         std::uint32_t draw, int steps) {
  require(steps >= 1, "matching needs at least one step, got ", steps);
  const double z = keyed_normal({.seed = seed,
                                 .iteration = iteration,
                                 .tree = tree,
                                 .node = node,
                                 .step = draw,
                                 .stream = noise_stream::matching_time},
                                0);
  const double uniform = 0.5 * std::erfc(-z / std::numbers::sqrt2);
  return std::min(steps - 1, static_cast<int>(uniform * steps));
}

/// The rows of a decoupled objective for the samples `nodes` (with `advantages`) of `tree`: times_per_sample
/// draws of each leaf, one row of each internal node at its own step; ordered by step, then leaves before
/// internal nodes, then by sample, then by draw (so the grouping into optimizer steps does not depend on
/// max_batch).
/// @pre nodes and advantages of equal size; times_per_sample in [1, max_noise_step + 1]; no root among nodes.
inline std::vector<matching_row> matching_rows(const rollout_tree& tree, std::span<const std::int32_t> nodes,
                                               std::span<const double> advantages, int times_per_sample,
                                               std::uint64_t seed, std::uint32_t iteration) {
  require(nodes.size() == advantages.size(), "matching got ", nodes.size(), " samples and ", advantages.size(),
          " advantages");
  std::vector<matching_row> rows;
  const std::int32_t per_tree = tree.nodes_per_tree();
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (!tree.is_leaf(nodes[i])) {
      rows.push_back(
          {.node = nodes[i], .draw = 0, .step = tree.step(nodes[i]), .advantage = advantages[i], .intermediate = true});
      continue;
    }
    for (int k = 0; k < times_per_sample; ++k) {
      const auto draw = static_cast<std::uint32_t>(k);
      const std::int32_t n = nodes[i];
      rows.push_back({.node = n,
                      .draw = draw,
                      .step = matching_step(seed, iteration, tree.info(tree.tree(n)).key,
                                            static_cast<std::uint32_t>(n % per_tree), draw, tree.steps()),
                      .advantage = advantages[i]});
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const matching_row& a, const matching_row& b) {
    return a.step != b.step ? a.step < b.step : a.intermediate < b.intermediate;
  });
  return rows;
}

namespace detail {

// One chunk of matching rows (one step, at most max_batch rows): the noised samples x_t, the targets
// u = eps - x0, and, when the objective needs the sampling policy, its velocity v_old at x_t.
template <class Tensor>
struct matching_chunk {
  std::size_t begin = 0, end = 0;
  Tensor x_t = {}, target = {}, old_velocity = {};
  std::vector<double> old_log_prob = {};  // AWM with several optimizer steps: the sampling policy's lp
};

// The update of a decoupled objective over this rank's `rows` (nodes of `result`'s forest), in optimizer steps
// ending at `group_ends`; `per_row` is 1 / (rows of all ranks). Mirrors update_edges: every v_old / lp_old is
// computed before the first optimizer step (the sampling policy's), the gradient is summed over the ranks before
// every step.
template <Backend B, Policy<B> Model, MatchingObjective O, Communicator Comm>
update_report update_matching(B& backend, Model& policy, const rollout_result<B>& result,
                              std::span<const matching_row> rows, std::span<const std::size_t> group_ends,
                              double per_row, const O& objective, const sigma_schedule& schedule,
                              const latent_shape& shape, const training_options& options, std::uint32_t iteration,
                              Comm& communicator) {
  using tensor = typename B::tensor;
  const rollout_tree& forest = result.tree;
  const std::int32_t per_tree = forest.nodes_per_tree();
  const std::int64_t elements = shape.elements();
  constexpr bool nft = std::same_as<O, diffusion_nft>;
  const bool precompute_old = nft || group_ends.size() > 1;
  update_report report;
  double loss_sum = 0;
  std::int64_t clipped = 0;
  const auto weight_of = [&](int step) {
    if constexpr (nft)
      return 1.0;
    else
      return weight_at(objective.weighting, schedule.sigma(step));
  };
  const auto batch_of = [&](const matching_chunk<tensor>& chunk, std::vector<std::uint32_t>& trees,
                            std::vector<std::int64_t>& prompts) {
    for (std::size_t i = chunk.begin; i < chunk.end; ++i) {
      trees.push_back(forest.info(forest.tree(rows[i].node)).key);
      prompts.push_back(forest.info(forest.tree(rows[i].node)).prompt);
    }
  };
  // Chunks: at most max_batch rows per policy call (NFT calls with two rows per sample), of one step, never across an
  // optimizer step's end.
  const std::int64_t samples_per_call = nft ? std::max<std::int64_t>(1, options.max_batch / 2) : options.max_batch;
  std::vector<matching_chunk<tensor>> chunks;
  std::vector<std::size_t> chunks_end;  // per group: the end of its chunks
  std::size_t begin = 0;
  for (const std::size_t group_end : group_ends) {
    while (begin < group_end) {
      std::size_t end = begin;
      while (end < group_end && static_cast<std::int64_t>(end - begin) < samples_per_call &&
             rows[end].step == rows[begin].step && rows[end].intermediate == rows[begin].intermediate)
        ++end;
      chunks.push_back({.begin = begin, .end = end});
      begin = end;
    }
    chunks_end.push_back(chunks.size());
  }
  // x_t = (1 - t) x0 + t eps and u = eps - x0 with keyed eps; the sampling policy's velocity where needed.
  for (matching_chunk<tensor>& chunk : chunks) {
    const int step = rows[chunk.begin].step;
    const double t = schedule.sigma(step);
    const auto count = static_cast<std::int64_t>(chunk.end - chunk.begin);
    if (rows[chunk.begin].intermediate) {
      // x_n and (x_n - mean of the leaves under n) / sigma_n, the leaves' mean on the host.
      std::vector<std::int64_t> index;
      std::vector<double> leaf_means(static_cast<std::size_t>(count * elements), 0.0);
      for (std::size_t i = chunk.begin; i < chunk.end; ++i) {
        index.push_back(forest.row_at_step(rows[i].node));
        const std::span<const std::int32_t> under = forest.leaves_under(rows[i].node);
        std::vector<std::int64_t> leaf_rows;
        for (const std::int32_t leaf : under) leaf_rows.push_back(forest.row_at_step(leaf));
        const std::vector<double> values = backend.to_host(backend.gather_rows(result.latents.back(), leaf_rows));
        const auto row = (i - chunk.begin) * static_cast<std::size_t>(elements);
        for (std::size_t j = 0; j < values.size(); ++j)
          leaf_means[row + j % static_cast<std::size_t>(elements)] += values[j] / static_cast<double>(under.size());
      }
      chunk.x_t = backend.gather_rows(result.latents[static_cast<std::size_t>(step)], index);
      chunk.target = backend.affine(1.0 / t, chunk.x_t, -1.0 / t, backend.from_host(leaf_means, count, shape));
    } else {
      std::vector<std::int64_t> index;
      std::vector<double> noise(static_cast<std::size_t>(count * elements));
      for (std::size_t i = chunk.begin; i < chunk.end; ++i) {
        const matching_row& row = rows[i];
        index.push_back(forest.row_at_step(row.node));
        fill_keyed_normal({.seed = options.seed,
                           .iteration = iteration,
                           .tree = forest.info(forest.tree(row.node)).key,
                           .node = static_cast<std::uint32_t>(row.node % per_tree),
                           .step = row.draw,
                           .stream = noise_stream::matching_noise},
                          std::span<double>(noise).subspan((i - chunk.begin) * static_cast<std::size_t>(elements),
                                                           static_cast<std::size_t>(elements)));
      }
      const tensor x0 = backend.gather_rows(result.latents.back(), index);
      const tensor eps = backend.from_host(noise, count, shape);
      chunk.x_t = backend.affine(1.0 - t, x0, t, eps);
      chunk.target = backend.affine(-1.0, x0, 1.0, eps);
    }
    if (!precompute_old) continue;
    std::vector<std::uint32_t> trees;
    std::vector<std::int64_t> prompts;
    batch_of(chunk, trees, prompts);
    chunk.old_velocity = policy(chunk.x_t, denoise_batch{.step = step, .sigma = t, .trees = trees, .prompts = prompts});
    report.evaluations += count;
    if constexpr (!nft) {
      const std::vector<double> stds(static_cast<std::size_t>(count), matching_std(weight_of(step)));
      chunk.old_log_prob = backend.row_log_prob(chunk.target, chunk.old_velocity, stds);
      for (double& lp : chunk.old_log_prob) lp = matching_log_prob(lp, weight_of(step));
    }
  }
  std::size_t chunk_begin = 0;
  for (std::size_t group = 0; group < group_ends.size(); ++group) {
    const bool first_group = group == 0;
    double pads = 0;
    if constexpr (PaddedAccumulationPolicy<Model>) {
      const auto calls = static_cast<double>(chunks_end[group] - chunk_begin);
      const std::vector<double> all = all_gather_values(communicator, std::span<const double>(&calls, 1));
      pads = *std::max_element(all.begin(), all.end()) - calls;
    }
    for (std::size_t c = chunk_begin; c < chunks_end[group]; ++c) {
      const matching_chunk<tensor>& chunk = chunks[c];
      const int step = rows[chunk.begin].step;
      const std::size_t count = chunk.end - chunk.begin;
      edge_batch<tensor> edges;
      edges.step = step;
      edges.sigma = schedule.sigma(step);
      batch_of(chunk, edges.trees, edges.prompts);
      const double weight = weight_of(step);
      edges.coeffs = {.x_coeff = 0.0, .velocity_coeff = 1.0, .noise_std = matching_std(weight)};
      if constexpr (nft) {
        // Two rows per sample: the positive target u+ first, then the negative u- (nft_targets).
        const nft_targets to = nft_targets::of(objective.beta);
        const std::array<tensor, 2> x_twice = {chunk.x_t, chunk.x_t};
        const std::array<tensor, 2> targets = {
            backend.affine(to.plus_u, chunk.target, to.plus_old, chunk.old_velocity),
            backend.affine(to.minus_u, chunk.target, to.minus_old, chunk.old_velocity)};
        edges.x = backend.concat_rows(x_twice);
        edges.next = backend.concat_rows(targets);
        edges.trees.insert(edges.trees.end(), edges.trees.begin(), edges.trees.end());
        edges.prompts.insert(edges.prompts.end(), edges.prompts.begin(), edges.prompts.end());
        edges.std.assign(2 * count, matching_std(weight));
        policy.accumulate(edges, loss_gradient_fn([&](std::span<const double> log_probs) {
                            require(log_probs.size() == 2 * count, "policy returned ", log_probs.size(),
                                    " log-probs for ", 2 * count, " matching rows");
                            std::vector<double> weights(2 * count);
                            const double scale = objective.advantage_max * objective.beta;
                            for (std::size_t i = 0; i < count; ++i) {
                              const double r = nft_optimality(rows[chunk.begin + i].advantage, objective.advantage_max);
                              const double plus = matching_log_prob(log_probs[i], weight);
                              const double minus = matching_log_prob(log_probs[count + i], weight);
                              require(std::isfinite(plus) && std::isfinite(minus), "policy matching log-prob at step ",
                                      step, " is not finite");
                              loss_sum += scale * (r * -plus + (1.0 - r) * -minus);
                              weights[i] = -scale * r * per_row;
                              weights[count + i] = -scale * (1.0 - r) * per_row;
                            }
                            return weights;
                          }));
        report.evaluations += static_cast<std::int64_t>(2 * count);
      } else {
        edges.x = chunk.x_t;
        edges.next = chunk.target;
        edges.std.assign(count, matching_std(weight));
        policy.accumulate(
            edges, loss_gradient_fn([&](std::span<const double> log_probs) {
              require(log_probs.size() == count, "policy returned ", log_probs.size(), " log-probs for ", count,
                      " matching rows");
              std::vector<double> weights(count);
              for (std::size_t i = 0; i < count; ++i) {
                const double lp = matching_log_prob(log_probs[i], weight);
                require(std::isfinite(lp), "policy matching log-prob at step ", step, " is ", lp);
                // One optimizer step: the parameters are the sampling policy's, lp is lp_old.
                const double old = precompute_old ? chunk.old_log_prob[i] : lp;
                if (first_group && precompute_old)
                  report.first_update_log_prob_gap = std::max(report.first_update_log_prob_gap, std::abs(lp - old));
                const double advantage = clip_advantage(rows[chunk.begin + i].advantage, objective.advantage_max);
                if (std::abs(importance_ratio(lp, old) - 1.0) > objective.clip_range) ++clipped;
                loss_sum += ppo_clipped_loss(lp, old, advantage, objective.clip_range);
                weights[i] = per_row * ppo_clipped_loss_gradient(lp, old, advantage, objective.clip_range);
              }
              return weights;
            }));
        report.evaluations += static_cast<std::int64_t>(count);
      }
    }
    finish_optimizer_step(policy, communicator, pads);
    chunk_begin = chunks_end[group];
  }
  std::array<double, 3> sums = {loss_sum, static_cast<double>(clipped), static_cast<double>(report.evaluations)};
  communicator.all_reduce_sum(sums);
  const std::vector<double> gaps =
      all_gather_values(communicator, std::span<const double>(&report.first_update_log_prob_gap, 1));
  report.first_update_log_prob_gap = *std::max_element(gaps.begin(), gaps.end());
  report.loss = sums[0] * per_row;
  report.clip_fraction = sums[1] * per_row;
  report.evaluations = static_cast<std::int64_t>(sums[2]);
  return report;
}

}  // namespace detail

namespace detail {

// The whole forest of an iteration on every rank: each rank's trees' leaf scores and node log-probs, gathered in
// rank order (shares padded to the largest), set into the forest of every tree (`infos`, all ranks' trees).
// A reward's parts (components) travel the same way, after the log-probs: every rank has the same reward, so the
// same parts in the same order.
struct gathered_forest {
  rollout_tree tree;
  std::vector<double> scores;  // every leaf's reward, tree.leaves() order
  std::vector<reward_component> components = {};
};

template <Communicator Comm>
gathered_forest gather_forest(Comm& communicator, const tree_plan& plan, std::vector<tree_info> infos,
                              const rollout_tree& local, std::span<const double> local_scores,
                              std::span<const reward_component> local_components = {}) {
  const auto trees = static_cast<std::int64_t>(infos.size());
  const int ranks = communicator.size();
  const std::int64_t widest = (trees + ranks - 1) / ranks;  // a share has at most this many trees
  gathered_forest out{.tree = rollout_tree(plan, std::move(infos)), .scores = {}};
  const auto leaves = static_cast<std::size_t>(out.tree.leaves_per_tree());
  const auto nodes = static_cast<std::size_t>(out.tree.nodes_per_tree());
  const std::size_t parts = local_components.size();
  const std::size_t per_tree = leaves + nodes + parts * leaves;
  const auto at = [](auto begin, std::size_t offset) { return begin + static_cast<std::ptrdiff_t>(offset); };
  std::vector<double> mine(static_cast<std::size_t>(widest) * per_tree, 0.0);
  for (std::int32_t t = 0; t < local.tree_count(); ++t) {
    const auto tree = static_cast<std::size_t>(t);
    const auto block = at(mine.begin(), tree * per_tree);
    std::copy_n(at(local_scores.begin(), tree * leaves), leaves, block);
    std::copy_n(at(local.log_probs().begin(), tree * nodes), nodes, at(block, leaves));
    for (std::size_t c = 0; c < parts; ++c)
      std::copy_n(at(local_components[c].rows.begin(), tree * leaves), leaves, at(block, leaves + nodes + c * leaves));
  }
  const std::vector<double> all = all_gather_values(communicator, std::span<const double>(mine));
  out.scores.resize(static_cast<std::size_t>(trees) * leaves);
  for (const reward_component& part : local_components)
    out.components.push_back(
        {.name = part.name, .weight = part.weight, .rows = std::vector<double>(out.scores.size(), 0.0)});
  const std::span<double> log_probs = out.tree.mutable_log_probs();
  for (int r = 0; r < ranks; ++r) {
    const tree_share share = tree_share::of(trees, r, ranks);
    for (std::int64_t t = share.first; t < share.last; ++t) {
      const auto tree = static_cast<std::size_t>(t);
      const auto from = at(all.begin(), static_cast<std::size_t>(r * widest + t - share.first) * per_tree);
      std::copy_n(from, leaves, at(out.scores.begin(), tree * leaves));
      std::copy_n(at(from, leaves), nodes, at(log_probs.begin(), tree * nodes));
      for (std::size_t c = 0; c < parts; ++c)
        std::copy_n(at(from, leaves + nodes + c * leaves), leaves, at(out.components[c].rows.begin(), tree * leaves));
    }
  }
  return out;
}

}  // namespace detail

namespace detail {

// train_iteration with the objective `objective` (the recipe's own, or the one its any_objective holds): the
// recipe's other components are used in place, so that a stateful normalizer keeps its state.
template <Backend B, Policy<B> Model, Reward<B> Score, Topology T, Stepper S, NoiseCorrelator C, Fusion F, Normalizer N,
          Pruner P, Objective O, class Held, Communicator Comm>
iteration_stats train_iteration_with(B& backend, Model& policy, Score& reward, method<T, S, C, F, N, P, O>& recipe,
                                     const Held& objective, const sigma_schedule& schedule, const latent_shape& shape,
                                     std::span<const std::int64_t> prompts, int iteration,
                                     const training_options& options, Comm& communicator) {
  require(!prompts.empty(), "an iteration needs at least one prompt");
  require(static_cast<std::int64_t>(prompts.size()) >= communicator.size(), "an iteration of ", prompts.size(),
          prompts.size() == 1 ? " prompt" : " prompts", " cannot give each of ", communicator.size(),
          " ranks a tree: use at least as many prompts per iteration as ranks");
  require(options.max_batch >= 1, "max_batch must be at least 1, got ", options.max_batch);
  require(options.updates_per_iteration >= 1, "updates_per_iteration must be at least 1, got ",
          options.updates_per_iteration);
  require(iteration >= 0, "iteration must be non-negative, got ", iteration);
  if constexpr (!ReferencePolicy<Model, B>)
    require(options.loss.kl_beta == 0.0, "kl_beta = ", options.loss.kl_beta,
            " needs a policy with a reference model (reference_velocity); this policy has none");
  if constexpr (MatchingObjective<Held>) {
    validate_parameters(objective, "objective");
    require(options.loss.kl_beta == 0.0, "kl_beta = ", options.loss.kl_beta, " with objective ", Held::name,
            ": the KL term is defined on transition log-probs (ppo objective only)");
    // RatioNorm and the per-step weights act on the ratio of an SDE transition, which a decoupled objective has not.
    require(!options.loss.ratio_norm, "ratio_norm = on with objective ", Held::name,
            ": RatioNorm normalizes a transition's importance ratio, and this objective has none (ppo objective only)");
    require(options.loss.step_weight == step_weighting::none,
            "step_weight = ", step_weighting_name(options.loss.step_weight), " with objective ", Held::name,
            ": per-step weights weigh denoising transitions, and this objective trains none (ppo objective only)");
  }
  const auto start = detail::training_clock::now();
  iteration_stats stats{.iteration = iteration};

  // 1. Rollout of this rank's trees, keyed by their index in the whole iteration.
  const tree_plan plan = ode_where_noiseless(shape_plan(recipe.pruner, recipe.topology(schedule.steps()), iteration),
                                             recipe.stepper, schedule);
  std::vector<tree_info> infos(prompts.size());
  for (std::size_t t = 0; t < prompts.size(); ++t)
    infos[t] = {.key = static_cast<std::uint32_t>(t), .prompt = prompts[t]};
  const tree_share share =
      tree_share::of(static_cast<std::int64_t>(prompts.size()), communicator.rank(), communicator.size());
  std::vector<tree_info> mine(infos.begin() + share.first, infos.begin() + share.last);
  const auto result = rollout(
      backend, policy, recipe.stepper, recipe.correlator, schedule, rollout_tree(plan, std::move(mine)), shape,
      {.max_batch = options.max_batch, .seed = options.seed, .iteration = static_cast<std::uint32_t>(iteration)});
  stats.rollout_evaluations = result.evaluations;
  stats.rollout_seconds = detail::seconds_since(start);

  // 2. Rewards; trees with a non-finite leaf reward are dropped from the update. Every rank gets the whole
  // forest's rewards and log-probs, so that the credit below is the one-process credit everywhere. On one rank the
  // gather is a copy: the forest is the rollout's (the same plan, trees and log-probs) and keep_finite_trees sees
  // the same scores that score_leaves gave.
  const auto reward_start = detail::training_clock::now();
  const scored_leaves local = score_leaves(backend, reward, result);
  detail::gathered_forest whole =
      detail::gather_forest(communicator, plan, std::move(infos), result.tree, local.scores, local.components);
  const scored_leaves leaves = keep_finite_trees(whole.tree, std::move(whole.scores), std::move(whole.components));
  double evaluations = static_cast<double>(stats.rollout_evaluations);
  communicator.all_reduce_sum(std::span<double>(&evaluations, 1));
  stats.rollout_evaluations = static_cast<std::int64_t>(evaluations);
  const rollout_tree& forest = whole.tree;
  stats.edges = forest.edge_count();
  stats.reward_seconds = detail::seconds_since(reward_start);
  stats.trees_dropped = forest.tree_count() - static_cast<int>(leaves.kept_trees.size());
  stats.reward_mean = leaves.mean;
  stats.reward_std = leaves.std;
  stats.reward_min = leaves.min;
  stats.reward_max = leaves.max;
  if (leaves.kept_trees.empty()) {
    stats.seconds = detail::seconds_since(start);
    return stats;
  }

  // 3. Credit assignment on the whole forest, 4. the update of this rank's trained edges.
  const auto update_start = detail::training_clock::now();
  const edge_credit credit = assign_credit(recipe, forest, leaves, iteration, options.total_iterations);
  stats.edges_trained = static_cast<std::int64_t>(credit.trained.size());
  if constexpr (MatchingObjective<Held>) {
    // The samples are the kept trees' leaves with their advantages, in the whole forest's order; this rank
    // trains the rows of its own trees.
    const std::int32_t per_tree = forest.nodes_per_tree();
    std::vector<std::int32_t> samples;
    std::vector<double> sample_advantages;
    const auto add_sample = [&](std::int32_t n) {
      samples.push_back(leaves.kept_trees[static_cast<std::size_t>(n / per_tree)] * per_tree + n % per_tree);
      sample_advantages.push_back(credit.advantages[static_cast<std::size_t>(n)]);
    };
    for (const std::int32_t n : credit.kept.leaves()) add_sample(n);
    // Optionally the internal split nodes (not the roots: no edge, no advantage), in node order.
    if (objective.intermediate_nodes)
      for (std::int32_t n = 0; n < credit.kept.node_count(); ++n)
        if (!credit.kept.is_root(n) && credit.kept.children(n).size() > 1) add_sample(n);
    const auto iteration_key = static_cast<std::uint32_t>(iteration);
    const std::vector<matching_row> all_rows =
        matching_rows(forest, samples, sample_advantages, objective.times_per_sample, options.seed, iteration_key);
    stats.edges_trained = static_cast<std::int64_t>(all_rows.size());
    const std::vector<std::size_t> global_ends =
        detail::update_group_ends(static_cast<std::int64_t>(all_rows.size()), options.updates_per_iteration);
    const auto offset = static_cast<std::int32_t>(share.first) * per_tree;
    const auto owned_end = static_cast<std::int32_t>(share.last) * per_tree;
    std::vector<matching_row> mine_rows;
    std::vector<std::size_t> group_ends;
    std::size_t next_end = 0;
    for (std::size_t i = 0; i < all_rows.size(); ++i) {
      if (all_rows[i].node >= offset && all_rows[i].node < owned_end) {
        mine_rows.push_back(all_rows[i]);
        mine_rows.back().node -= offset;
      }
      while (next_end < global_ends.size() && global_ends[next_end] == i + 1) {
        group_ends.push_back(mine_rows.size());
        ++next_end;
      }
    }
    const update_report update = detail::update_matching(backend, policy, result, mine_rows, group_ends,
                                                         1.0 / static_cast<double>(all_rows.size()), objective,
                                                         schedule, shape, options, iteration_key, communicator);
    stats.update_evaluations = update.evaluations;
    stats.loss = update.loss;
    stats.clip_fraction = update.clip_fraction;
    stats.first_update_log_prob_gap = update.first_update_log_prob_gap;
  } else if (!credit.trained.empty()) {
    const auto edge_count = static_cast<std::int64_t>(credit.trained.size());
    const std::vector<std::size_t> global_ends = detail::update_group_ends(edge_count, options.updates_per_iteration);
    // This rank's trees' trained edges, renumbered in its own forest (trees are contiguous: an offset), with the
    // optimizer steps' ends among them. One rank owns every tree: offset 0, every edge, the same ends.
    const std::int32_t per_tree = forest.nodes_per_tree();
    const auto offset = static_cast<std::int32_t>(share.first) * per_tree;
    const auto owned_end = static_cast<std::int32_t>(share.last) * per_tree;
    const std::span<const double> advantage =
        std::span<const double>(credit.edge_advantage)
            .subspan(static_cast<std::size_t>(offset), static_cast<std::size_t>(owned_end - offset));
    std::vector<std::int32_t> trained;
    std::vector<std::size_t> group_ends;
    std::size_t next_end = 0;
    for (std::size_t i = 0; i < credit.trained.size(); ++i) {
      if (credit.trained[i] >= offset && credit.trained[i] < owned_end) trained.push_back(credit.trained[i] - offset);
      while (next_end < global_ends.size() && global_ends[next_end] == i + 1) {
        group_ends.push_back(trained.size());
        ++next_end;
      }
    }
    const update_report update =
        detail::update_edges(backend, policy, result, trained, advantage, group_ends,
                             1.0 / static_cast<double>(edge_count), recipe.stepper, schedule, options, communicator);
    stats.update_evaluations = update.evaluations;
    stats.loss = update.loss;
    stats.clip_fraction = update.clip_fraction;
    stats.kl = update.kl;
    stats.first_update_log_prob_gap = update.first_update_log_prob_gap;
  }
  stats.update_seconds = detail::seconds_since(update_start);
  stats.seconds = detail::seconds_since(start);
  return stats;
}

}  // namespace detail

/// Runs one iteration of `recipe` on `prompts` (one tree per prompt) and updates `policy`, composing the stages:
/// rollout (rollout/engine.hpp) -> score_leaves -> assign_credit -> update_policy. With a communicator of several
/// ranks every rank passes the same prompts and rolls out its tree_share of them (see the file comment); the
/// returned statistics are those of the whole iteration, equal on every rank.
/// Example: toy policy, branch method, 4 prompts on 2 ranks -> rank 0 rolls out trees 0 and 1, rank 1 trees 2 and
///   3, and both end with the parameters of the one-process iteration up to rounding in the gradient's sum
///   (tests/distributed).
/// @pre prompts is not empty and has at least one tree per rank; schedule.steps() is the number of denoising
///      steps of every tree; options.max_batch >= 1, options.updates_per_iteration >= 1; kl_beta > 0 only for a
///      ReferencePolicy; with several ranks a DataParallelPolicy, and the same arguments on every rank.
/// @post the policy took min(updates_per_iteration, trained edges) optimizer steps (none when every tree was
///       dropped or no edge was kept).
template <Backend B, Policy<B> Model, Reward<B> Score, Topology T, Stepper S, NoiseCorrelator C, Fusion F, Normalizer N,
          Pruner P, Objective O, Communicator Comm>
iteration_stats train_iteration(B& backend, Model& policy, Score& reward, method<T, S, C, F, N, P, O>& recipe,
                                const sigma_schedule& schedule, const latent_shape& shape,
                                std::span<const std::int64_t> prompts, int iteration, const training_options& options,
                                Comm& communicator) {
  if constexpr (std::same_as<O, any_objective>)
    return std::visit(
        [&](const auto& held) {
          return detail::train_iteration_with(backend, policy, reward, recipe, held, schedule, shape, prompts,
                                              iteration, options, communicator);
        },
        recipe.objective.policy);
  else
    return detail::train_iteration_with(backend, policy, reward, recipe, recipe.objective, schedule, shape, prompts,
                                        iteration, options, communicator);
}

/// train_iteration on this process alone.
template <Backend B, Policy<B> Model, Reward<B> Score, Topology T, Stepper S, NoiseCorrelator C, Fusion F, Normalizer N,
          Pruner P, Objective O>
iteration_stats train_iteration(B& backend, Model& policy, Score& reward, method<T, S, C, F, N, P, O>& recipe,
                                const sigma_schedule& schedule, const latent_shape& shape,
                                std::span<const std::int64_t> prompts, int iteration, const training_options& options) {
  single_process one;
  return train_iteration(backend, policy, reward, recipe, schedule, shape, prompts, iteration, options, one);
}

}  // namespace branchgrpo
