#pragma once
// What the decoupled objectives (advantage_weighted_matching, diffusion_nft) share: they train on samples of the
// kept trees, not on transitions, by flow matching. A sample x0 (a leaf) is noised to x_t = (1 - t) x0 + t eps
// (eps ~ N(0, I), t a noise level of the schedule) and the policy's velocity v_theta(x_t, t) is compared with the
// target u = eps - x0. A policy only offers accumulate() over Gaussian log-probs (training/concepts.hpp), and a
// Gaussian row with x_coeff 0, velocity_coeff 1, next = target and std = 1 / sqrt(2 w) has, per element,
//   log N(target; v, std^2) = -w (target - v)^2 - log std - log(2 pi) / 2,
// so its mean over elements is the matching log-prob -w mean_i (v_i - target_i)^2 plus a constant: every policy
// trains these objectives unchanged (the trick accumulate_kl uses for the KL term). See docs/loss.md.
//
//   matching_std, matching_log_prob   a matching row as a Gaussian row, and back
//   matching_rows                     the samples' rows: keyed noise levels, ordered by step
//   update_matching                   the update of a MatchingObjective: its rows, their noised samples and
//                                     targets, the sampling policy's velocity where the objective needs it, and
//                                     the objective's accumulate_matching on each chunk (training/update_loop.hpp)
#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/training/update_input.hpp"
#include "branchgrpo/training/update_loop.hpp"

namespace branchgrpo {

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

/// A chunk of matching rows (one step, at most one policy call): the noised samples x_t, the targets u, and the
/// sampling policy's velocity v_old at x_t when the objective uses it (empty otherwise).
template <class Tensor>
struct matching_chunk {
  row_chunk rows = {};
  Tensor x_t = {}, target = {}, old_velocity = {};
};

/// What an objective's accumulate_matching gets for one chunk: the batch to accumulate (step, sigma, trees and
/// prompts set; x, next and std for the objective to fill), its rows, the weight w(t) of its step, and the sums to
/// add its loss, clip count, evaluations and first-step gap to.
template <Backend B, class Model>
struct matching_call {
  B& backend;
  Model& policy;
  const matching_chunk<typename B::tensor>& chunk;
  std::span<const matching_row> rows;  ///< the chunk's rows
  edge_batch<typename B::tensor> edges;
  double weight = 1;          ///< w(t) of the chunk's step (matching_std(weight) is its rows' std)
  double per_row = 1;         ///< 1 / (rows of all ranks)
  bool first_group = true;    ///< the parameters are the sampling policy's
  bool old_velocity = false;  ///< chunk.old_velocity holds v_old
  update_sums& sums;
};

/// A decoupled objective: it trains sample rows by flow matching. It says how many Gaussian rows one sample makes
/// per policy call, whether its update needs the sampling policy's velocity, the weight w(t) of a step's rows, and
/// what one chunk accumulates. Examples: advantage_weighted_matching, diffusion_nft.
template <class O>
concept MatchingObjective = requires(const O& objective, double t, std::size_t steps) {
  { objective.times_per_sample } -> std::convertible_to<int>;
  { objective.intermediate_nodes } -> std::convertible_to<bool>;
  { O::rows_per_sample } -> std::convertible_to<int>;
  { objective.uses_sampling_policy(steps) } -> std::same_as<bool>;
  { objective.weight(t) } -> std::same_as<double>;
};

namespace detail {

// The samples of a decoupled objective with their advantages, in the whole forest's order: the kept trees' leaves,
// then (intermediate_nodes) their internal split nodes (not the roots: no edge, no advantage), in node order.
template <Backend B, Stepper S>
std::pair<std::vector<std::int32_t>, std::vector<double>> matching_samples(const update_input<B, S>& input,
                                                                           bool intermediate_nodes) {
  const edge_credit& credit = input.credit;
  const std::int32_t per_tree = input.forest.nodes_per_tree();
  std::vector<std::int32_t> samples;
  std::vector<double> advantages;
  const auto add_sample = [&](std::int32_t n) {
    samples.push_back(input.kept_trees[static_cast<std::size_t>(n / per_tree)] * per_tree + n % per_tree);
    advantages.push_back(credit.advantages[static_cast<std::size_t>(n)]);
  };
  for (const std::int32_t n : credit.kept.leaves()) add_sample(n);
  if (intermediate_nodes)
    for (std::int32_t n = 0; n < credit.kept.node_count(); ++n)
      if (!credit.kept.is_root(n) && credit.kept.children(n).size() > 1) add_sample(n);
  return {std::move(samples), std::move(advantages)};
}

// x_n and (x_n - mean of the leaves under n) / sigma_n of an intermediate chunk, the leaves' mean on the host.
template <Backend B>
void intermediate_targets(B& backend, const rollout_result<B>& result, std::span<const matching_row> rows, double t,
                          const latent_shape& shape, matching_chunk<typename B::tensor>& chunk) {
  const rollout_tree& forest = result.tree;
  const std::int64_t elements = shape.elements();
  const auto count = static_cast<std::int64_t>(rows.size());
  std::vector<std::int64_t> index;
  std::vector<double> leaf_means(static_cast<std::size_t>(count * elements), 0.0);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    index.push_back(forest.row_at_step(rows[i].node));
    const std::span<const std::int32_t> under = forest.leaves_under(rows[i].node);
    std::vector<std::int64_t> leaf_rows;
    for (const std::int32_t leaf : under) leaf_rows.push_back(forest.row_at_step(leaf));
    const std::vector<double> values = backend.to_host(backend.gather_rows(result.latents.back(), leaf_rows));
    const auto row = i * static_cast<std::size_t>(elements);
    for (std::size_t j = 0; j < values.size(); ++j)
      leaf_means[row + j % static_cast<std::size_t>(elements)] += values[j] / static_cast<double>(under.size());
  }
  chunk.x_t = backend.gather_rows(result.latents[static_cast<std::size_t>(rows.front().step)], index);
  chunk.target = backend.affine(1.0 / t, chunk.x_t, -1.0 / t, backend.from_host(leaf_means, count, shape));
}

// x_t = (1 - t) x0 + t eps and u = eps - x0 of a chunk of leaf rows, with eps keyed by the sample and its draw.
template <Backend B, Stepper S>
void noised_targets(const update_input<B, S>& input, std::span<const matching_row> rows, double t,
                    matching_chunk<typename B::tensor>& chunk) {
  const rollout_tree& forest = input.result.tree;
  const std::int64_t elements = input.shape.elements();
  const auto count = static_cast<std::int64_t>(rows.size());
  std::vector<std::int64_t> index;
  std::vector<double> noise(static_cast<std::size_t>(count * elements));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    index.push_back(forest.row_at_step(rows[i].node));
    fill_keyed_normal(
        {.seed = input.options.seed,
         .iteration = input.iteration,
         .tree = forest.info(forest.tree(rows[i].node)).key,
         .node = static_cast<std::uint32_t>(rows[i].node % forest.nodes_per_tree()),
         .step = rows[i].draw,
         .stream = noise_stream::matching_noise},
        std::span<double>(noise).subspan(i * static_cast<std::size_t>(elements), static_cast<std::size_t>(elements)));
  }
  const auto x0 = input.backend.gather_rows(input.result.latents.back(), index);
  const auto eps = input.backend.from_host(noise, count, input.shape);
  chunk.x_t = input.backend.affine(1.0 - t, x0, t, eps);
  chunk.target = input.backend.affine(-1.0, x0, 1.0, eps);
}

// The batch of a chunk's rows: step, sigma, trees and prompts.
template <class Tensor>
edge_batch<Tensor> matching_batch(const rollout_tree& forest, std::span<const matching_row> rows,
                                  const sigma_schedule& schedule) {
  edge_batch<Tensor> edges;
  edges.step = rows.front().step;
  edges.sigma = schedule.sigma(edges.step);
  for (const matching_row& row : rows) {
    edges.trees.push_back(forest.info(forest.tree(row.node)).key);
    edges.prompts.push_back(forest.info(forest.tree(row.node)).prompt);
  }
  return edges;
}

}  // namespace detail

/// The update of a decoupled objective over this rank's rows, the report of all ranks: the rows of the kept trees'
/// samples (matching_rows), split into updates_per_iteration optimizer steps and chunks of max_batch Gaussian rows
/// of one step; every chunk's noised samples and targets, and the sampling policy's velocity where the objective
/// uses it, are made before the first optimizer step; then the objective's accumulate_matching on each chunk.
/// Example: 4 trees of 16 leaves, times_per_sample 1, 2 steps -> 64 rows; NFT's evaluations 64 (v_old) + 128 (two
///   rows a sample), AWM's 64 (lp_old) + 64 (tests/unit/test_objective.cpp, "decoupled methods train ...").
/// @pre objective valid (validate_parameters); at least one kept tree.
/// @post the policy took min(updates_per_iteration, rows) optimizer steps; report.rows == rows of all ranks.
template <MatchingObjective O, Backend B, Policy<B> Model, Stepper S, Communicator Comm>
update_report update_matching(const O& objective, Model& policy, const update_input<B, S>& input, Comm& communicator) {
  using tensor = typename B::tensor;
  const auto [samples, advantages] = detail::matching_samples(input, objective.intermediate_nodes);
  const std::vector<matching_row> all =
      matching_rows(input.forest, samples, advantages, objective.times_per_sample, input.options.seed, input.iteration);
  const std::vector<std::size_t> global_ends =
      update_group_ends(static_cast<std::int64_t>(all.size()), input.options.updates_per_iteration);
  const rank_rows<matching_row> mine =
      rows_of_rank(std::span<const matching_row>(all), std::span<const std::size_t>(global_ends), input.first_node(),
                   input.end_node(), [](matching_row& row) -> std::int32_t& { return row.node; });
  const std::span<const matching_row> rows(mine.rows);
  const std::int64_t per_call = std::max<std::int64_t>(1, input.options.max_batch / O::rows_per_sample);
  const auto groups = chunk_groups(mine.group_ends, per_call, [&](std::size_t first, std::size_t row) {
    return rows[row].step == rows[first].step && rows[row].intermediate == rows[first].intermediate;
  });
  const bool old_velocity = objective.uses_sampling_policy(groups.size());
  update_sums sums;
  std::vector<matching_chunk<tensor>> chunks;
  for (const auto& group : groups)
    for (const row_chunk& chunk : group) {
      const std::span<const matching_row> part = rows.subspan(chunk.begin, chunk.size());
      const double t = input.schedule.sigma(part.front().step);
      matching_chunk<tensor>& made = chunks.emplace_back(matching_chunk<tensor>{.rows = chunk});
      if (part.front().intermediate)
        detail::intermediate_targets(input.backend, input.result, part, t, input.shape, made);
      else
        detail::noised_targets(input, part, t, made);
      if (!old_velocity) continue;
      const edge_batch<tensor> batch = detail::matching_batch<tensor>(input.result.tree, part, input.schedule);
      made.old_velocity = policy(
          made.x_t, denoise_batch{.step = batch.step, .sigma = t, .trees = batch.trees, .prompts = batch.prompts});
      sums.evaluations += static_cast<std::int64_t>(chunk.size());
    }
  const double per_row = 1.0 / static_cast<double>(all.size());
  std::size_t next = 0;
  run_optimizer_steps(
      policy, communicator, groups, [](std::size_t) { return 1.0; },
      [&](const row_chunk& chunk, std::size_t group) {
        const std::span<const matching_row> part = rows.subspan(chunk.begin, chunk.size());
        const double weight = objective.weight(input.schedule.sigma(part.front().step));
        edge_batch<tensor> edges = detail::matching_batch<tensor>(input.result.tree, part, input.schedule);
        edges.coeffs = {.x_coeff = 0.0, .velocity_coeff = 1.0, .noise_std = matching_std(weight)};
        matching_call<B, Model> call{.backend = input.backend,
                                     .policy = policy,
                                     .chunk = chunks[next++],
                                     .rows = part,
                                     .edges = std::move(edges),
                                     .weight = weight,
                                     .per_row = per_row,
                                     .first_group = group == 0,
                                     .old_velocity = old_velocity,
                                     .sums = sums};
        objective.accumulate_matching(call);
      });
  return finish_update(communicator, sums, per_row, static_cast<std::int64_t>(all.size()));
}

}  // namespace branchgrpo
