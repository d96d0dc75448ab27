#pragma once
// The generic BranchGRPO training iteration, as public stages that train_iteration composes:
//   1. rollout          frontier-batched sampling of one tree per prompt (rollout/engine.hpp)
//   2. score_leaves     leaf rewards; keep_finite_trees drops a tree with a non-finite leaf reward
//   3. assign_credit    fusion -> normalization -> pruning -> the trained edges and their advantages
//   4. the update       the objective's (loss/objective.hpp): ppo_ratio's PPO-clipped update over the trained
//                       edges, or a decoupled objective's over the samples, on training/update_loop.hpp's loop of
//                       `updates_per_iteration` optimizer steps (update_policy: ppo_ratio's on one process)
// Each stage can be called, tested and benchmarked alone; an observer (train_iteration's optional last argument)
// sees an iteration's data between stages 3 and 4 (iteration_view).
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
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "branchgrpo/advantage/concept.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/correlator/concept.hpp"
#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/fusion/concept.hpp"
#include "branchgrpo/loss/objective.hpp"
#include "branchgrpo/pruning/combinators.hpp"
#include "branchgrpo/pruning/concept.hpp"
#include "branchgrpo/rollout/engine.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/topology/adaptive_branching.hpp"
#include "branchgrpo/topology/concept.hpp"
#include "branchgrpo/training/concepts.hpp"
#include "branchgrpo/training/credit.hpp"
#include "branchgrpo/training/kl_term.hpp"
#include "branchgrpo/training/options.hpp"
#include "branchgrpo/training/update_input.hpp"
#include "branchgrpo/training/update_loop.hpp"

namespace branchgrpo {

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

/// What one iteration did. Times in seconds.
struct iteration_stats {
  int iteration = 0;
  double reward_mean = 0, reward_std = 0, reward_min = 0, reward_max = 0;  ///< over finite leaf rewards
  std::int64_t rollout_evaluations = 0;                                    ///< denoiser rows in the rollout
  std::int64_t rollout_evaluations_saved = 0;  ///< denoiser rows a value pruner's cut saved (pruning/value.hpp)
  std::int64_t update_evaluations = 0;         ///< policy rows in the update
  std::int64_t edges = 0;                      ///< edges of the rollout
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

namespace detail {

using training_clock = std::chrono::steady_clock;

inline double seconds_since(training_clock::time_point start) {
  return std::chrono::duration<double>(training_clock::now() - start).count();
}

}  // namespace detail

/// What train_iteration shows its observer (its optional last argument) after stage 3, before the update: this
/// rank's rollout, the whole forest's leaf rewards and, unless every tree was dropped, the credit. For traces and
/// checks from outside the trainer (`branchgrpo train --trace`); the observer sees the stages' own data and
/// changes nothing.
/// Example: branch, 2 prompts over 20 steps, one process -> result.latents.size() == 21 (latents[0] the 2 roots),
///   leaves.scores.size() == 32, credit->trained.size() == 436, credit->edge_advantage.size() == 438.
template <Backend B>
struct iteration_view {
  int iteration = 0;
  const rollout_result<B>& result;  ///< this rank's trees: latents[s] with rows tree.nodes_at_step(s), log-probs
  const rollout_tree& forest;       ///< every rank's trees (log-probs gathered); a copy of result.tree on one process
  tree_share share;                 ///< this rank's trees of `forest`
  const scored_leaves& leaves;      ///< every leaf's reward (forest.leaves() order) and the kept trees
  const edge_credit* credit;        ///< stage 3's credit; nullptr when every tree was dropped (no update)
};

/// train_iteration's observer when none is given: does nothing.
struct ignore_iteration {
  template <Backend B>
  void operator()(const iteration_view<B>& /*view*/) const {}
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
      // edges_at_step holds the sampled edges only: nodes below a stopped node or left out have no latent to train.
      if (!credit.mask[static_cast<std::size_t>(n)] || subset.kind(n) != edge_kind::sde) continue;
      credit.edge_advantage[static_cast<std::size_t>(original(n))] = credit.advantages[static_cast<std::size_t>(n)];
      credit.trained.push_back(original(n));
    }
  return credit;
}

/// Stage 4 on one process with the GRPO objective: ppo_ratio's update of the trained edges (loss/ppo_ratio.hpp).
/// Example: one dense tree's 218 trained edges, updates_per_iteration 2, max_batch 64 -> two optimizer steps
///   over edges [0, 109) and [109, 218), evaluations 218, clip_fraction 0 in the first step
///   (tests/unit/test_trainer.cpp).
/// @pre credit.trained non-empty and from `result`'s forest; options valid (train_iteration's checks).
/// @post the policy took min(updates_per_iteration, credit.trained.size()) optimizer steps.
template <Backend B, Policy<B> Model, Stepper S>
update_report update_policy(B& backend, Model& policy, const rollout_result<B>& result, const edge_credit& credit,
                            const S& stepper, const sigma_schedule& schedule, const training_options& options) {
  require(!credit.trained.empty(), "the update needs at least one trained edge");
  single_process one;
  const latent_shape unused;  // ppo_ratio trains the rollout's own latents
  const update_input<B, S> input{.backend = backend,
                                 .result = result,
                                 .forest = result.tree,
                                 .kept_trees = {},
                                 .credit = credit,
                                 .share = {.first = 0, .last = result.tree.tree_count()},
                                 .stepper = stepper,
                                 .schedule = schedule,
                                 .shape = unused,
                                 .options = options};
  return ppo_ratio{}.update(policy, input, one);
}

namespace detail {

// The value of frontier nodes for a value pruner's cut: the reward of their x0-hat rows, each with its tree's prompt
// (score_tree_rows: a groupwise reward sees each tree's nodes as one group when the trees have equally many). A
// ComponentReward's parts of the call are kept per node in `parts` (one entry per part, rows indexed by node, NaN
// elsewhere; later calls fill other nodes) for the phantom leaves' parts (score_leaves).
template <Backend B, class Score>
std::vector<double> value_rows(Score& reward, const typename B::tensor& x0_hat, const rollout_tree& tree,
                               std::span<const std::int32_t> nodes, std::vector<reward_component>& parts) {
  std::vector<double> values = score_tree_rows<B>(reward, x0_hat, tree, nodes);
  if constexpr (ComponentReward<Score>) {
    const auto nan = std::numeric_limits<double>::quiet_NaN();
    for (const reward_component& part : reward.last_component_rows()) {
      require(part.rows.size() == nodes.size(), "reward part '", part.name, "' returned ", part.rows.size(),
              " scores for ", nodes.size(), " valued nodes");
      auto same =
          std::find_if(parts.begin(), parts.end(), [&](const reward_component& c) { return c.name == part.name; });
      if (same == parts.end())
        same = parts.insert(parts.end(), reward_component{.name = part.name,
                                                          .weight = part.weight,
                                                          .rows = std::vector<double>(
                                                              static_cast<std::size_t>(tree.node_count()), nan)});
      for (std::size_t r = 0; r < nodes.size(); ++r) same->rows[static_cast<std::size_t>(nodes[r])] = part.rows[r];
    }
  }
  return values;
}

// The whole forest of an iteration on every rank: each rank's trees' leaf scores, node log-probs and marks (node
// values and a value pruner's stops: rollout_tree::tree_marks), gathered in rank order (shares padded to the largest),
// set into the forest of every tree (`infos`, all ranks' trees). A reward's parts (components) travel the same way,
// after the log-probs: every rank has the same reward, so the same parts in the same order.
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
  // Per tree: leaf scores, node log-probs, each part's leaf scores, then per node its marks (rollout_tree::tree_marks):
  // its value (NaN when it has none) and flags (1: valued, 2: stopped, 4: left out).
  const std::size_t marks_at = leaves + nodes + parts * leaves;
  const std::size_t per_tree = marks_at + 2 * nodes;
  const auto at = [](auto begin, std::size_t offset) { return begin + static_cast<std::ptrdiff_t>(offset); };
  std::vector<double> mine(static_cast<std::size_t>(widest) * per_tree, 0.0);
  for (std::int32_t t = 0; t < local.tree_count(); ++t) {
    const auto tree = static_cast<std::size_t>(t);
    const auto block = at(mine.begin(), tree * per_tree);
    std::copy_n(at(local_scores.begin(), tree * leaves), leaves, block);
    std::copy_n(at(local.log_probs().begin(), tree * nodes), nodes, at(block, leaves));
    for (std::size_t c = 0; c < parts; ++c)
      std::copy_n(at(local_components[c].rows.begin(), tree * leaves), leaves, at(block, leaves + nodes + c * leaves));
    std::fill_n(at(block, marks_at), nodes, std::numeric_limits<double>::quiet_NaN());
    const rollout_tree::tree_marks marks = local.marks_of_tree(t);
    for (std::size_t i = 0; i < marks.valued.size(); ++i) {
      const auto node = static_cast<std::size_t>(marks.valued[i]);
      *at(block, marks_at + node) = marks.values[i];
      *at(block, marks_at + nodes + node) = 1;
    }
    for (const std::int32_t node : marks.stopped) *at(block, marks_at + nodes + static_cast<std::size_t>(node)) += 2;
    for (const std::int32_t node : marks.left_out) *at(block, marks_at + nodes + static_cast<std::size_t>(node)) += 4;
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
      rollout_tree::tree_marks marks;
      for (std::size_t n = 0; n < nodes; ++n) {
        const auto flag = static_cast<int>(*at(from, marks_at + nodes + n));
        if (flag & 1) {
          marks.valued.push_back(static_cast<std::int32_t>(n));
          marks.values.push_back(*at(from, marks_at + n));
        }
        if (flag & 2) marks.stopped.push_back(static_cast<std::int32_t>(n));
        if (flag & 4) marks.left_out.push_back(static_cast<std::int32_t>(n));
      }
      out.tree.mark_tree(static_cast<std::int32_t>(t), marks);
    }
  }
  return out;
}

}  // namespace detail

namespace detail {

// train_iteration's preconditions, each refused in one line.
template <Backend B, class Model, Objective Held, Communicator Comm>
void check_iteration(const Held& objective, std::span<const std::int64_t> prompts, int iteration,
                     const training_options& options, Comm& communicator) {
  require(!prompts.empty(), "an iteration needs at least one prompt");
  require(static_cast<std::int64_t>(prompts.size()) >= communicator.size(), "an iteration of ", prompts.size(),
          prompts.size() == 1 ? " prompt" : " prompts", " cannot give each of ", communicator.size(),
          " ranks a tree: use at least as many prompts per iteration as ranks");
  require(options.max_batch >= 1, "max_batch must be at least 1, got ", options.max_batch);
  require(options.updates_per_iteration >= 1, "updates_per_iteration must be at least 1, got ",
          options.updates_per_iteration);
  require(iteration >= 0, "iteration must be non-negative, got ", iteration);
  validate(options.loss);
  if constexpr (!ReferencePolicy<Model, B>)
    require(options.loss.kl_beta == 0.0, "kl_beta = ", options.loss.kl_beta,
            " needs a policy with a reference model (reference_velocity); this policy has none");
  validate_parameters(objective, "objective");
  const std::string conflict = transition_option_conflict(objective, options.loss, option_spelling::cpp);
  require(conflict.empty(), conflict);
}

// One tree per prompt, keyed by its index in the whole iteration.
inline std::vector<tree_info> iteration_trees(std::span<const std::int64_t> prompts) {
  std::vector<tree_info> infos(prompts.size());
  for (std::size_t t = 0; t < prompts.size(); ++t)
    infos[t] = {.key = static_cast<std::uint32_t>(t), .prompt = prompts[t]};
  return infos;
}

// The statistics of stage 2: the whole forest's edges, the dropped trees, the kept rewards.
inline void record_rewards(iteration_stats& stats, const rollout_tree& forest, const scored_leaves& leaves) {
  stats.edges = forest.edge_count();
  stats.trees_dropped = forest.tree_count() - static_cast<int>(leaves.kept_trees.size());
  stats.reward_mean = leaves.mean;
  stats.reward_std = leaves.std;
  stats.reward_min = leaves.min;
  stats.reward_max = leaves.max;
}

// train_iteration with the objective `objective` (the recipe's own, or the one its any_objective holds): the
// recipe's other components are used in place, so that a stateful normalizer keeps its state.
template <Backend B, Policy<B> Model, Reward<B> Score, Topology T, Stepper S, NoiseCorrelator C, Fusion F, Normalizer N,
          Pruner P, Objective O, class Held, Communicator Comm, class Observe>
iteration_stats train_iteration_with(B& backend, Model& policy, Score& reward, method<T, S, C, F, N, P, O>& recipe,
                                     const Held& objective, const sigma_schedule& schedule, const latent_shape& shape,
                                     std::span<const std::int64_t> prompts, int iteration,
                                     const training_options& options, Comm& communicator, Observe& observe) {
  check_iteration<B, Model>(objective, prompts, iteration, options, communicator);
  const auto start = training_clock::now();
  iteration_stats stats{.iteration = iteration};

  // 1. Rollout of this rank's trees, keyed by their index in the whole iteration.
  const tree_plan plan = ode_where_noiseless(shape_plan(recipe.pruner, recipe.topology(schedule.steps()), iteration),
                                             recipe.stepper, schedule);
  std::vector<tree_info> infos = iteration_trees(prompts);
  const tree_share share =
      tree_share::of(static_cast<std::int64_t>(prompts.size()), communicator.rank(), communicator.size());
  std::vector<tree_info> mine(infos.begin() + share.first, infos.begin() + share.last);
  // An adaptive topology's trees differ per prompt: each of this rank's trees gets its level of the envelope.
  const std::vector<int> levels = split_levels_of(recipe.topology, plan, infos);
  rollout_tree forest(plan, std::move(mine));
  for (std::int32_t t = 0; t < forest.tree_count() && !levels.empty(); ++t)
    apply_split_level(forest, t, levels[static_cast<std::size_t>(share.first + t)]);
  // A value pruner's cut (pruning/value.hpp) and a dense fusion's node values (fusion/step_gain.hpp): the run's
  // reward on the frontier's x0-hat is the value.
  rollout_cut cut = rollout_cut_of(recipe.pruner, plan, iteration);
  cut.value_every_step = needs_node_values(recipe.fusion);
  require(!cut.active() || Held::trains_transitions,
          "the value pruner needs an objective that trains transitions: ", Held::name,
          " trains on the leaves' samples, and the pruned branches have none");
  std::vector<reward_component> value_parts;
  const auto value = [&](const typename B::tensor& x0_hat, const rollout_tree& tree,
                         std::span<const std::int32_t> nodes) {
    return value_rows<B>(reward, x0_hat, tree, nodes, value_parts);
  };
  const auto result = rollout(
      backend, policy, recipe.stepper, recipe.correlator, schedule, std::move(forest), shape,
      {.max_batch = options.max_batch, .seed = options.seed, .iteration = static_cast<std::uint32_t>(iteration)}, cut,
      value);
  stats.rollout_evaluations = result.evaluations;
  stats.rollout_seconds = seconds_since(start);

  // 2. Rewards; trees with a non-finite leaf reward are dropped from the update. Every rank gets the whole
  // forest's rewards and log-probs, so that the credit below is the one-process credit everywhere. On one rank the
  // gather is a copy: the forest is the rollout's (the same plan, trees and log-probs) and keep_finite_trees sees
  // the same scores that score_leaves gave.
  const auto reward_start = training_clock::now();
  const scored_leaves local = score_leaves(backend, reward, result, value_parts);
  gathered_forest whole =
      gather_forest(communicator, plan, std::move(infos), result.tree, local.scores, local.components);
  const scored_leaves leaves = keep_finite_trees(whole.tree, std::move(whole.scores), std::move(whole.components));
  observe_rewards(recipe.topology, whole.tree, leaves.scores, leaves.kept_trees);
  std::array<double, 2> evaluations{static_cast<double>(stats.rollout_evaluations),
                                    static_cast<double>(result.evaluations_saved)};
  communicator.all_reduce_sum(std::span<double>(evaluations));
  stats.rollout_evaluations = static_cast<std::int64_t>(evaluations[0]);
  stats.rollout_evaluations_saved = static_cast<std::int64_t>(evaluations[1]);
  record_rewards(stats, whole.tree, leaves);
  stats.reward_seconds = seconds_since(reward_start);
  const auto view = [&](const edge_credit* credit) {
    return iteration_view<B>{.iteration = iteration,
                             .result = result,
                             .forest = whole.tree,
                             .share = share,
                             .leaves = leaves,
                             .credit = credit};
  };
  if (leaves.kept_trees.empty()) {
    observe(view(nullptr));
    stats.seconds = seconds_since(start);
    return stats;
  }

  // 3. Credit assignment on the whole forest, 4. the objective's update of this rank's rows.
  const auto update_start = training_clock::now();
  const edge_credit credit = assign_credit(recipe, whole.tree, leaves, iteration, options.total_iterations);
  observe(view(&credit));
  const update_input<B, S> input{.backend = backend,
                                 .result = result,
                                 .forest = whole.tree,
                                 .kept_trees = leaves.kept_trees,
                                 .credit = credit,
                                 .share = share,
                                 .stepper = recipe.stepper,
                                 .schedule = schedule,
                                 .shape = shape,
                                 .options = options,
                                 .iteration = static_cast<std::uint32_t>(iteration)};
  static_assert(
      requires {
        { objective.update(policy, input, communicator) } -> std::same_as<update_report>;
      },
      "an objective needs update(policy, update_input, communicator) returning an update_report (loss/objective.hpp)");
  const update_report update = objective.update(policy, input, communicator);
  stats.edges_trained = update.rows;
  stats.update_evaluations = update.evaluations;
  stats.loss = update.loss;
  stats.clip_fraction = update.clip_fraction;
  stats.kl = update.kl;
  stats.first_update_log_prob_gap = update.first_update_log_prob_gap;
  stats.update_seconds = seconds_since(update_start);
  stats.seconds = seconds_since(start);
  return stats;
}

}  // namespace detail

/// Runs one iteration of `recipe` on `prompts` (one tree per prompt) and updates `policy`, composing the stages:
/// rollout (rollout/engine.hpp) -> score_leaves -> assign_credit -> update_policy. With a communicator of several
/// ranks every rank passes the same prompts and rolls out its tree_share of them (see the file comment); the
/// returned statistics are those of the whole iteration, equal on every rank. `observe(iteration_view<B>)`, when
/// given, is called once, after the credit and before the update (after the rewards when every tree was dropped).
/// Example: toy policy, branch method, 4 prompts on 2 ranks -> rank 0 rolls out trees 0 and 1, rank 1 trees 2 and
///   3, and both end with the parameters of the one-process iteration up to rounding in the gradient's sum
///   (tests/distributed).
/// @pre prompts is not empty and has at least one tree per rank; schedule.steps() is the number of denoising
///      steps of every tree; options.max_batch >= 1, options.updates_per_iteration >= 1; kl_beta > 0 only for a
///      ReferencePolicy; with several ranks a DataParallelPolicy, and the same arguments on every rank.
/// @post the policy took min(updates_per_iteration, trained edges) optimizer steps (none when every tree was
///       dropped or no edge was kept).
template <Backend B, Policy<B> Model, Reward<B> Score, Topology T, Stepper S, NoiseCorrelator C, Fusion F, Normalizer N,
          Pruner P, Objective O, Communicator Comm, class Observe = ignore_iteration>
iteration_stats train_iteration(B& backend, Model& policy, Score& reward, method<T, S, C, F, N, P, O>& recipe,
                                const sigma_schedule& schedule, const latent_shape& shape,
                                std::span<const std::int64_t> prompts, int iteration, const training_options& options,
                                Comm& communicator, Observe&& observe = {}) {
  static_assert(std::invocable<Observe&, const iteration_view<B>&>,
                "train_iteration's observer takes a const iteration_view<B>&");
  if constexpr (!ObjectivePolicy<O>)  // chosen at run time: the held objective's update
    return std::visit(
        [&](const auto& held) {
          return detail::train_iteration_with(backend, policy, reward, recipe, held, schedule, shape, prompts,
                                              iteration, options, communicator, observe);
        },
        recipe.objective.policy);
  else
    return detail::train_iteration_with(backend, policy, reward, recipe, recipe.objective, schedule, shape, prompts,
                                        iteration, options, communicator, observe);
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
