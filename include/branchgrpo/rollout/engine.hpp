#pragma once
// The frontier-batched rollout engine: all nodes of one denoising step, across every tree of the forest,
// go through the denoiser together (in chunks of at most max_batch rows), so a forest of T dense trees over
// 20 steps costs 20 denoiser calls instead of the 203 T batch-1 calls of the official code.
// Every draw is keyed (noise/keyed_normal.hpp), so the result does not depend on max_batch or the backend.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/stop.hpp"
#include "branchgrpo/correlator/concept.hpp"
#include "branchgrpo/correlator/correlated.hpp"
#include "branchgrpo/correlator/independent.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/rollout/keyed_sde_step.hpp"
#include "branchgrpo/rollout/value_cut.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/schedule/steppers.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"
#include "branchgrpo/tree/tree_plan.hpp"

namespace branchgrpo {

/// max_batch: most rows per denoiser call; seed and iteration key every draw of the rollout.
struct rollout_options {
  std::int64_t max_batch = 64;
  std::uint64_t seed = 0;
  std::uint32_t iteration = 0;  ///< at most max_noise_iteration

  friend bool operator==(const rollout_options&, const rollout_options&) = default;
};

/// What one rollout produced.
template <Backend B>
struct rollout_result {
  rollout_tree tree;                        ///< log-probs of SDE edges filled (roots and ODE edges: 0)
  std::vector<typename B::tensor> latents;  ///< latents[s]: rows = tree.nodes_at_step(s), in that order
  std::vector<double> edge_std;             ///< per node: std its edge is scored with (0: root/ODE): the std its
                                            ///< sample was drawn with, or the stepper's log_prob_std (cps)
  std::int64_t evaluations = 0;             ///< denoiser rows evaluated
  std::int64_t denoiser_calls = 0;          ///< calls to the denoiser (chunks)
  /// Denoiser rows a cut saved: the evaluations of the uncut forest minus `evaluations`.
  std::int64_t evaluations_saved = 0;
};

namespace detail {

static_assert(static_cast<std::uint32_t>(max_steps) <= max_noise_step,
              "every step of a valid plan must fit a noise key");

/// The key of node n's own draw at step s.
inline noise_key rollout_key(const rollout_tree& tree, const rollout_options& options, std::int32_t n, int s,
                             noise_stream stream) {
  return {.seed = options.seed,
          .iteration = options.iteration,
          .tree = tree.info(tree.tree(n)).key,
          .node = static_cast<std::uint32_t>(tree.local_index(n)),
          .step = static_cast<std::uint32_t>(s),
          .stream = stream};
}

/// Velocities of the frontier `x` (rows = `frontier`), in chunks of at most max_batch rows.
template <Backend B, Denoiser<B> D>
typename B::tensor frontier_velocity(B& backend, D& denoiser, const typename B::tensor& x, const rollout_tree& tree,
                                     std::span<const std::int32_t> frontier, int s, double sigma,
                                     std::int64_t max_batch, std::int64_t& calls) {
  std::vector<std::uint32_t> trees(frontier.size());
  std::vector<std::int64_t> prompts(frontier.size());
  for (std::size_t r = 0; r < frontier.size(); ++r) {
    const tree_info& info = tree.info(tree.tree(frontier[r]));
    trees[r] = info.key;
    prompts[r] = info.prompt;
  }
  const auto rows = static_cast<std::int64_t>(frontier.size());
  auto evaluate = [&](const typename B::tensor& chunk, std::int64_t begin, std::int64_t end) {
    const auto first = static_cast<std::size_t>(begin), count = static_cast<std::size_t>(end - begin);
    const denoise_batch batch{.step = s,
                              .sigma = sigma,
                              .trees = std::span<const std::uint32_t>(trees).subspan(first, count),
                              .prompts = std::span<const std::int64_t>(prompts).subspan(first, count)};
    check_stop("the rollout");  // between denoiser calls: a stop ends a rollout within one call's time
    typename B::tensor v = denoiser(chunk, batch);
    ++calls;
    require(backend.rows(v) == end - begin, "denoiser returned ", backend.rows(v), " rows for a batch of ", end - begin,
            " at step ", s);
    return v;
  };
  if (rows <= max_batch) return evaluate(x, 0, rows);
  std::vector<typename B::tensor> parts;
  parts.reserve(static_cast<std::size_t>((rows + max_batch - 1) / max_batch));
  for (std::int64_t begin = 0; begin < rows; begin += max_batch) {
    const std::int64_t end = begin + max_batch < rows ? begin + max_batch : rows;
    parts.push_back(evaluate(backend.slice_rows(x, begin, end), begin, end));
  }
  return backend.concat_rows(std::span<const typename B::tensor>(parts));
}

/// Stores the SDE edges into `children` (log-prob and std per child row); a non-finite log-prob is refused,
/// naming the step and node, so a non-finite velocity never propagates silently.
inline void record_edges(std::span<double> log_probs, std::vector<double>& edge_std,
                         std::span<const std::int32_t> children, const std::vector<double>& edge_log_probs,
                         std::span<const double> stds, int s) {
  require(edge_log_probs.size() == children.size(), "the SDE step at ", s, " returned ", edge_log_probs.size(),
          " log-probs for ", children.size(), " rows");
  for (std::size_t j = 0; j < children.size(); ++j) {
    const auto node = static_cast<std::size_t>(children[j]);
    require(std::isfinite(edge_log_probs[j]), "non-finite log-prob ", edge_log_probs[j], " at SDE step ", s,
            " for node ", children[j], " (a non-finite velocity?)");
    log_probs[node] = edge_log_probs[j];
    edge_std[node] = stds[j];
  }
}

/// Values the frontier by its x0-hat (x - sigma v) and records the values on the forest (rollout_tree::set_values).
template <Backend B, class V>
std::vector<double> value_frontier(B& backend, rollout_tree& forest, std::span<const std::int32_t> frontier,
                                   const typename B::tensor& x, const typename B::tensor& velocity, double sigma,
                                   V& value) {
  std::vector<double> values = value(backend.affine(1.0, x, -sigma, velocity), std::as_const(forest), frontier);
  require(values.size() == frontier.size(), "the value function returned ", values.size(), " values for ",
          frontier.size(), " nodes");
  forest.set_values(frontier, values);
  return values;
}

/// The cut at this step: stops the nodes nodes_to_stop chooses by `values` (one per frontier node). When it stopped
/// any, `frontier`, `velocity` and a multistep solver's `previous_x0` keep the surviving rows only, and the
/// surviving rows of `x` are returned.
template <Backend B>
std::optional<typename B::tensor> cut_frontier(B& backend, rollout_tree& forest, std::vector<std::int32_t>& frontier,
                                               std::span<const double> values, const typename B::tensor& x,
                                               typename B::tensor& velocity,
                                               std::optional<typename B::tensor>& previous_x0, std::int32_t keep) {
  const std::vector<std::int32_t> stopped = nodes_to_stop(forest, frontier, values, keep);
  if (stopped.empty()) return std::nullopt;
  std::vector<double> stopped_values;
  for (const std::int32_t n : stopped) stopped_values.push_back(forest.value(n));
  forest.stop(stopped, stopped_values);
  std::vector<std::int64_t> rows;
  std::vector<std::int32_t> survivors;
  for (std::size_t r = 0; r < frontier.size(); ++r)
    if (!forest.stopped(frontier[r])) {
      rows.push_back(static_cast<std::int64_t>(r));
      survivors.push_back(frontier[r]);
    }
  velocity = backend.gather_rows(velocity, rows);
  if (previous_x0) previous_x0 = backend.gather_rows(*previous_x0, rows);
  frontier = std::move(survivors);
  return backend.gather_rows(x, rows);
}

/// What an SDE transition of the rollout reads and writes besides its rows.
template <class C>
struct sde_context {
  const rollout_tree& forest;
  const rollout_options& options;
  const C& correlator;
  const affine_step& step;
  int s = 0;
  const latent_shape& shape;
  std::span<double> log_probs;    ///< per node of the forest, written for `children`
  std::vector<double>& edge_std;  ///< per node of the forest, written for `children`
};

/// The SDE transition of `frontier` (rows of x and velocity) into `children`, K per parent (child row j has parent row
/// j / K): their latents, with their log-probs and edge stds recorded. Noise fixed by the keys alone (a chain step; a
/// split whose siblings are independent, i.e. own draws with factor 1, or correlated{s}, factor 1) goes through one
/// keyed_sde_step, which a backend may run on its device (rollout/keyed_sde_step.hpp); another correlator writes
/// each sibling group's rows on the host.
template <Backend B, NoiseCorrelator C>
typename B::tensor sde_rows(B& backend, const sde_context<C>& context, const typename B::tensor& x,
                            const typename B::tensor& velocity, std::span<const std::int32_t> frontier,
                            std::span<const std::int32_t> children, int k) {
  const affine_step& step = context.step;
  const int s = context.s;
  // stds: what each child's noise is drawn with; scored: what its edge is scored with (the same unless the stepper
  // sets log_prob_std).
  std::vector<double> stds(children.size(), step.noise_std);
  std::vector<double> scored(children.size(), scoring_std(step, step.noise_std));
  std::vector<noise_key> sibling_keys(children.size());
  for (std::size_t j = 0; j < children.size(); ++j)
    sibling_keys[j] = rollout_key(context.forest, context.options, children[j], s, noise_stream::edge);
  constexpr bool correlated_siblings = std::same_as<C, correlated>;
  if (k == 1 || std::same_as<C, independent> || correlated_siblings) {
    std::vector<noise_key> parent_keys;
    double correlation = 0.0;
    if constexpr (correlated_siblings) {
      if (k > 1)
        for (const std::int32_t parent : frontier)
          parent_keys.push_back(rollout_key(context.forest, context.options, parent, s, noise_stream::shared));
      correlation = context.correlator.s;
    }
    const sde_transition transition{
        .x_coeff = step.x_coeff,
        .velocity_coeff = step.velocity_coeff,
        .branching = k,
        .keys = sibling_keys,
        .stds = stds,
        .parent_keys = parent_keys,
        .s = correlation,
        .log_prob_stds = step.log_prob_std > 0.0 ? std::span<const double>(scored) : std::span<const double>()};
    keyed_sde_result<typename B::tensor> stepped = keyed_sde_step(backend, x, velocity, transition, context.shape);
    record_edges(context.log_probs, context.edge_std, children, stepped.log_probs, scored, s);
    return std::move(stepped.next);
  }

  // A split with another correlator: it writes the group's rows on the host. Children of a node are contiguous and
  // every node has K, so child row j has parent row j / K. affine checks the velocity's rows and shape.
  typename B::tensor mean = backend.affine(step.x_coeff, x, step.velocity_coeff, velocity);
  std::vector<std::int64_t> index(children.size());
  for (std::size_t j = 0; j < children.size(); ++j) index[j] = static_cast<std::int64_t>(j) / k;
  mean = backend.gather_rows(mean, index);
  const auto elements = static_cast<std::size_t>(context.shape.elements());
  std::vector<double> host(children.size() * elements, 0.0);
  const auto group_size = static_cast<std::size_t>(k);
  for (std::size_t p = 0; p < frontier.size(); ++p) {
    const std::size_t first = p * group_size;
    const sibling_group group{
        .parent = rollout_key(context.forest, context.options, frontier[p], s, noise_stream::shared),
        .children = std::span<const noise_key>(sibling_keys).subspan(first, group_size),
        .elements = elements};
    const double factor =
        context.correlator(group, std::span<double>(host).subspan(first * elements, group_size * elements));
    require(std::isfinite(factor) && factor > 0.0, "correlator returned factor ", factor, " at step ", s, " for node ",
            frontier[p], "; it must be positive and finite");
    for (std::size_t b = 0; b < group_size; ++b) {
      stds[first + b] = step.noise_std * factor;
      scored[first + b] = scoring_std(step, stds[first + b]);
    }
  }
  for (std::size_t j = 0; j < children.size(); ++j)
    for (std::size_t i = 0; i < elements; ++i) host[j * elements + i] *= stds[j];
  const typename B::tensor noise = backend.from_host(host, static_cast<std::int64_t>(children.size()), context.shape);
  typename B::tensor next = backend.affine(1.0, mean, 1.0, noise);
  record_edges(context.log_probs, context.edge_std, children, backend.row_log_prob(next, mean, scored), scored, s);
  return next;
}

/// sde_rows for a frontier whose parents split into K (all their children sampled) or continue as a chain (only
/// their first child sampled: rollout_tree::leave_out): the split parents' groups through sde_rows with K, the others
/// with 1 (their child's own keyed draw), the rows merged back into node order. A split parent's children are those of
/// the uniform forest bit for bit.
/// @pre every parent has K or 1 sampled children (else invalid_input naming it).
template <Backend B, NoiseCorrelator C>
typename B::tensor mixed_sde_rows(B& backend, const sde_context<C>& context, const typename B::tensor& x,
                                  const typename B::tensor& velocity, std::span<const std::int32_t> frontier,
                                  std::span<const std::int32_t> children, int k) {
  std::vector<std::int64_t> split_rows, chain_rows;
  std::vector<std::int32_t> split_parents, chain_parents, split_children, chain_children;
  std::vector<bool> child_split;  // per child in node order: whether it belongs to a split parent
  std::size_t next_child = 0;
  for (std::size_t r = 0; r < frontier.size(); ++r) {
    std::size_t count = 0;
    while (next_child + count < children.size() && context.forest.parent(children[next_child + count]) == frontier[r])
      ++count;
    require(count == static_cast<std::size_t>(k) || count == 1, "node ", frontier[r], " at step ", context.s, " has ",
            count, " sampled children: a node splits into all ", k, " or continues as a chain");
    const bool split = count == static_cast<std::size_t>(k);
    (split ? split_rows : chain_rows).push_back(static_cast<std::int64_t>(r));
    (split ? split_parents : chain_parents).push_back(frontier[r]);
    for (std::size_t c = 0; c < count; ++c) {
      (split ? split_children : chain_children).push_back(children[next_child + c]);
      child_split.push_back(split);
    }
    next_child += count;
  }
  std::vector<typename B::tensor> parts;
  if (!split_rows.empty())
    parts.push_back(sde_rows(backend, context, backend.gather_rows(x, split_rows),
                             backend.gather_rows(velocity, split_rows), split_parents, split_children, k));
  if (!chain_rows.empty())
    parts.push_back(sde_rows(backend, context, backend.gather_rows(x, chain_rows),
                             backend.gather_rows(velocity, chain_rows), chain_parents, chain_children, 1));
  // The split children come first in `parts`, then the chain children, each in node order.
  std::vector<std::int64_t> order(children.size());
  std::int64_t split_next = 0, chain_next = static_cast<std::int64_t>(split_children.size());
  for (std::size_t j = 0; j < children.size(); ++j) order[j] = child_split[j] ? split_next++ : chain_next++;
  return backend.gather_rows(backend.concat_rows(std::span<const typename B::tensor>(parts)), order);
}

}  // namespace detail

/// The plan with every SDE step at which the stepper draws no noise (noise_std == 0: cps's last step, where
/// sigma[i+1] = 0) made an ODE edge: deterministic, log-prob 0, never trained, as Flow-CPS leaves it untrained.
/// Example: split_schedule::dense() over shifted_linear_schedule(20) with cps{} -> kinds sde at steps 0..18, ode at
///   19; with dance_sde{} the plan is unchanged.
/// @pre schedule.steps() == plan.steps; a noiseless step does not split (its children would be identical: else
///      invalid_input naming the step).
template <Stepper S>
tree_plan ode_where_noiseless(tree_plan plan, const S& stepper, const sigma_schedule& schedule) {
  require(schedule.steps() == plan.steps, "sigma schedule has ", schedule.steps(), " steps, the plan has ", plan.steps);
  for (int s = 0; s < plan.steps; ++s) {
    const auto at = static_cast<std::size_t>(s);
    if (plan.kinds[at] != edge_kind::sde || step_coefficients(stepper, schedule, s, plan.layer(s)).noise_std != 0.0)
      continue;
    require(plan.branching[at] == 1, "step ", s, " splits into ", plan.branching[at],
            " but the stepper draws no noise there (sigma ", schedule.sigma(s + 1),
            " next): identical children; split earlier");
    plan.kinds[at] = edge_kind::ode;
  }
  return plan;
}

/// Samples every tree of `tree` from keyed root noise to its leaves, one frontier (step) at a time.
///   roots:  x = keyed N(0, I) {seed, iteration, tree key, local index, step 0, root_latent}
///   step s: v = denoiser(frontier, sigma(s)); {a, c, std, lp} = step_coefficients(stepper, schedule, s,
///           plan.layer(s)) (SDE); mean = a x + c v, repeated for each of the K children;
///           SDE: next = mean + std * f * eps, eps keyed {.., child local index, step s, edge} when K = 1,
///                or written by the correlator (which returns f) for a split; edge std = lp if lp > 0 (cps),
///                else std * f (f = 1 for K = 1); edge log-prob = gaussian_log_prob_mean(next, mean, edge std);
///           ODE: {a, c, p} = ode_step(plan.ode, schedule, {s, plan.ode_target(s), previous evaluated ODE step of
///                the path or -1}); next = mean = a x + c v + p x0_prev, log-prob 0, edge std 0;
///           skip: no evaluation, next = x (the ODE edge before integrated past the step).
/// Example: split_schedule::dense() over shifted_linear_schedule(20), dance_sde{}, independent{}, two
///   trees, max_batch 64 -> 20 denoiser calls (one per step), 406 evaluations (203 per tree), latents[20]
///   has 32 rows; the same call with max_batch 1 gives bit-identical latents, log-probs and edge stds.
/// @pre schedule.steps() == tree.steps(); max_batch >= 1; shape valid; options.iteration fits a noise key;
///      the denoiser returns one row of `shape` per input row; SDE steps have noise_std > 0 (ode_where_noiseless
///      makes the others ODE edges).
/// Example: the same forest shaped by sde_window{.ode_stride = 2, .solver = ode_solver::dpm_solver_2m} at
///   iteration 0 -> 111 evaluations per tree instead of 203 (the ODE run of steps 10..19 evaluated at 10, 12, .., 18).
/// @post evaluations == tree.evaluations(); every log-prob is finite (else invalid_input naming the step and
///       node: a non-finite velocity never propagates silently); result.tree's SDE edge log-probs are filled.
///
/// With a cut (rollout_cut, rollout/value_cut.hpp) the frontier of step cut.step is valued after its velocity:
///   values = value(x0_hat = x - sigma(step) v, tree, frontier), recorded by tree.set_values; nodes_to_stop(...) stop
///   (rollout_tree::stop) and the step goes on with the others. With cut.value_every_step every evaluated frontier
///   is valued and recorded so (dense rewards: fusion/step_gain.hpp), cut or not. Nothing else changes: a surviving
///   node's noise keys, latent and log-prob are those of the uncut rollout bit for bit, and the stopped subtrees'
///   evaluations are saved (evaluations_saved).
/// Example: the dense tree (splits {0, 3, 6, 9}, K 2, 20 steps) cut at step 9 keeping 4 of its 8 nodes -> the 4
///   stopped nodes skip 2 x 10 evaluations each: 123 evaluations instead of 203, evaluations_saved 80.
/// @pre validate(cut, tree.plan()) passes; the value returns one value per frontier node.
template <Backend B, Denoiser<B> D, Stepper S, NoiseCorrelator C, RolloutValue<B> V>
rollout_result<B> rollout(B& backend, D& denoiser, const S& stepper, const C& correlator,
                          const sigma_schedule& schedule, rollout_tree tree, const latent_shape& shape,
                          const rollout_options& options, const rollout_cut& cut, V&& value) {
  require(schedule.steps() == tree.steps(), "sigma schedule has ", schedule.steps(), " steps, the tree has ",
          tree.steps());
  validate(cut, tree.plan());
  require(options.max_batch >= 1, "max_batch must be at least 1, got ", options.max_batch);
  require(options.iteration <= max_noise_iteration, "iteration ", options.iteration, " exceeds ", max_noise_iteration);
  validate(shape);
  const auto elements = static_cast<std::size_t>(shape.elements());

  rollout_result<B> result{
      .tree = std::move(tree), .latents = {}, .edge_std = {}, .evaluations = 0, .denoiser_calls = 0};
  rollout_tree& forest = result.tree;
  const tree_plan& plan = forest.plan();
  const std::span<double> log_probs = forest.mutable_log_probs();
  std::fill(log_probs.begin(), log_probs.end(), 0.0);
  result.edge_std.assign(static_cast<std::size_t>(forest.node_count()), 0.0);
  const std::int64_t uncut_evaluations = forest.evaluations();
  result.latents.reserve(static_cast<std::size_t>(plan.steps) + 1);

  // Roots.
  std::vector<std::int32_t> frontier = forest.nodes_at_step(0);
  std::vector<double> host(frontier.size() * elements);
  for (std::size_t r = 0; r < frontier.size(); ++r)
    fill_keyed_normal(detail::rollout_key(forest, options, frontier[r], 0, noise_stream::root_latent),
                      std::span<double>(host).subspan(r * elements, elements));
  result.latents.push_back(backend.from_host(host, static_cast<std::int64_t>(frontier.size()), shape));

  // A multistep ODE solver's memory (plan.ode): the data prediction x0 = x - sigma v of the frontier's paths at
  // their last evaluated ODE step, and that step; -1 after a root or an SDE edge, where a path's history is noise.
  std::optional<typename B::tensor> previous_x0;
  int previous_step = -1;
  const bool multistep = plan.ode != ode_solver::euler;
  for (int s = 0; s < plan.steps; ++s) {
    const edge_kind kind = plan.kinds[static_cast<std::size_t>(s)];
    if (kind == edge_kind::skip) {
      // The ODE edge before integrated past this step (tree_plan::ode_target): no evaluation, the latent carries.
      result.latents.push_back(result.latents.back());
      frontier = forest.nodes_at_step(s + 1);
      continue;
    }
    typename B::tensor velocity =
        detail::frontier_velocity(backend, denoiser, result.latents.back(), forest, frontier, s, schedule.sigma(s),
                                  options.max_batch, result.denoiser_calls);
    result.evaluations += static_cast<std::int64_t>(frontier.size());
    std::optional<typename B::tensor> survivors;  // the frontier's latents after a cut stopped some of its nodes
    if (s == cut.step || cut.value_every_step) {
      const std::vector<double> values =
          detail::value_frontier(backend, forest, frontier, result.latents.back(), velocity, schedule.sigma(s), value);
      if (s == cut.step)
        survivors = detail::cut_frontier(backend, forest, frontier, values, result.latents.back(), velocity,
                                         previous_x0, cut.keep);
    }
    const typename B::tensor& x = survivors ? *survivors : result.latents.back();

    const affine_step step =
        kind == edge_kind::sde
            ? step_coefficients(stepper, schedule, s, plan.layer(s))
            : ode_step(plan.ode, schedule, {.from = s, .to = plan.ode_target(s), .previous = previous_step});
    const int k = plan.branching[static_cast<std::size_t>(s)];
    std::vector<std::int32_t> children = forest.nodes_at_step(s + 1);
    if (kind == edge_kind::sde) {
      previous_step = -1;
      require(std::isfinite(step.noise_std) && step.noise_std > 0.0, "SDE step ", s, " has noise_std ", step.noise_std,
              "; an SDE edge needs a positive std (make it an ODE edge: ode_where_noiseless)");
      const detail::sde_context<C> context{.forest = forest,
                                           .options = options,
                                           .correlator = correlator,
                                           .step = step,
                                           .s = s,
                                           .shape = shape,
                                           .log_probs = log_probs,
                                           .edge_std = result.edge_std};
      if (static_cast<std::int64_t>(children.size()) == static_cast<std::int64_t>(frontier.size()) * k)
        result.latents.push_back(detail::sde_rows(backend, context, x, velocity, frontier, children, k));
      else  // trees of different shapes (rollout_tree::leave_out): split and unsplit parents side by side
        result.latents.push_back(detail::mixed_sde_rows(backend, context, x, velocity, frontier, children, k));
      frontier = std::move(children);
      continue;
    }

    // An ODE edge: one child per parent (ODE edges never split: validate). affine checks that the velocity has the
    // latents' rows and shape.
    typename B::tensor mean = backend.affine(step.x_coeff, x, step.velocity_coeff, velocity);
    if (step.previous_x0_coeff != 0.0) mean = backend.affine(1.0, mean, step.previous_x0_coeff, *previous_x0);
    if (multistep) {
      previous_x0 = backend.affine(1.0, x, -schedule.sigma(s), velocity);
      previous_step = s;
    }
    // No log-prob to inspect here, so probe the mean itself: log N(mean; mean, 1) is NaN exactly when some element
    // is NaN or infinite, and costs one reduction on the backend.
    const std::vector<double> ones(children.size(), 1.0);
    const std::vector<double> probe = backend.row_log_prob(mean, mean, ones);
    for (std::size_t j = 0; j < children.size(); ++j)
      require(std::isfinite(probe[j]), "non-finite latent at ODE step ", s, " for node ", children[j],
              " (a non-finite velocity?)");
    result.latents.push_back(std::move(mean));
    frontier = std::move(children);
  }
  result.evaluations_saved = uncut_evaluations - result.evaluations;
  return result;
}

/// The rollout without a cut.
template <Backend B, Denoiser<B> D, Stepper S, NoiseCorrelator C>
rollout_result<B> rollout(B& backend, D& denoiser, const S& stepper, const C& correlator,
                          const sigma_schedule& schedule, rollout_tree tree, const latent_shape& shape,
                          const rollout_options& options) {
  return rollout(backend, denoiser, stepper, correlator, schedule, std::move(tree), shape, options, rollout_cut{},
                 no_value{});
}

/// Node n's latent as host doubles (one row of latents[step(n)]).
template <Backend B>
std::vector<double> latent_of(B& backend, const rollout_result<B>& result, std::int32_t node) {
  const std::int64_t row = result.tree.row_at_step(node);
  return backend.to_host(
      backend.slice_rows(result.latents[static_cast<std::size_t>(result.tree.step(node))], row, row + 1));
}

/// The sampled leaves' latents, one row per sampled leaf in tree.leaves() order (the order of leaf rewards; without
/// stops, every leaf).
template <Backend B>
typename B::tensor leaf_latents(B& backend, const rollout_result<B>& result) {
  std::vector<std::int64_t> index;
  for (const std::int32_t leaf : result.tree.leaves())
    if (result.tree.sampled(leaf)) index.push_back(result.tree.row_at_step(leaf));
  return backend.gather_rows(result.latents.back(), index);
}

}  // namespace branchgrpo
