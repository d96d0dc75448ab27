#pragma once
// The frontier-batched rollout engine: all nodes of one denoising step, across every tree of the forest,
// go through the denoiser together (in chunks of at most max_batch rows), so a forest of T dense trees over
// 20 steps costs 20 denoiser calls instead of the 203 T batch-1 calls of the official code.
// Every draw is keyed (noise/keyed_normal.hpp), so the result does not depend on max_batch or the backend.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
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
template <Backend B, Denoiser<B> D, Stepper S, NoiseCorrelator C>
rollout_result<B> rollout(B& backend, D& denoiser, const S& stepper, const C& correlator,
                          const sigma_schedule& schedule, rollout_tree tree, const latent_shape& shape,
                          const rollout_options& options) {
  require(schedule.steps() == tree.steps(), "sigma schedule has ", schedule.steps(), " steps, the tree has ",
          tree.steps());
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
  result.latents.reserve(static_cast<std::size_t>(plan.steps) + 1);

  // Roots.
  std::vector<std::int32_t> frontier = forest.nodes_at_step(0);
  std::vector<double> host(frontier.size() * elements);
  for (std::size_t r = 0; r < frontier.size(); ++r)
    fill_keyed_normal(detail::rollout_key(forest, options, frontier[r], 0, noise_stream::root_latent),
                      std::span<double>(host).subspan(r * elements, elements));
  result.latents.push_back(backend.from_host(host, static_cast<std::int64_t>(frontier.size()), shape));

  std::vector<noise_key> sibling_keys, parent_keys;
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
    const auto parents = static_cast<std::int64_t>(frontier.size());
    const typename B::tensor velocity =
        detail::frontier_velocity(backend, denoiser, result.latents.back(), forest, frontier, s, schedule.sigma(s),
                                  options.max_batch, result.denoiser_calls);
    result.evaluations += parents;

    const affine_step step =
        kind == edge_kind::sde
            ? step_coefficients(stepper, schedule, s, plan.layer(s))
            : ode_step(plan.ode, schedule, {.from = s, .to = plan.ode_target(s), .previous = previous_step});
    if (kind == edge_kind::sde) previous_step = -1;
    const int k = plan.branching[static_cast<std::size_t>(s)];
    const std::vector<std::int32_t> children = forest.nodes_at_step(s + 1);
    const auto child_rows = static_cast<std::int64_t>(children.size());
    if (kind == edge_kind::sde)
      require(std::isfinite(step.noise_std) && step.noise_std > 0.0, "SDE step ", s, " has noise_std ", step.noise_std,
              "; an SDE edge needs a positive std (make it an ODE edge: ode_where_noiseless)");
    // stds: what each child's noise is drawn with; scored: what its edge is scored with (the same unless the
    // stepper sets log_prob_std).
    std::vector<double> stds(children.size(), step.noise_std);
    std::vector<double> scored(children.size(), scoring_std(step, step.noise_std));

    // Noise fixed by the keys alone (a chain step; a split whose siblings are independent, i.e. own draws with
    // factor 1, or correlated{s}, factor 1): one keyed_sde_step, which a backend may run on its device
    // (rollout/keyed_sde_step.hpp). Other correlators are host policies and keep the path below.
    constexpr bool correlated_siblings = std::same_as<C, correlated>;
    if (kind == edge_kind::sde && (k == 1 || std::same_as<C, independent> || correlated_siblings)) {
      sibling_keys.resize(children.size());
      for (std::size_t j = 0; j < children.size(); ++j)
        sibling_keys[j] = detail::rollout_key(forest, options, children[j], s, noise_stream::edge);
      parent_keys.clear();
      double correlation = 0.0;
      if constexpr (correlated_siblings) {
        if (k > 1)
          for (const std::int32_t parent : frontier)
            parent_keys.push_back(detail::rollout_key(forest, options, parent, s, noise_stream::shared));
        correlation = correlator.s;
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
      keyed_sde_result<typename B::tensor> stepped =
          keyed_sde_step(backend, result.latents.back(), velocity, transition, shape);
      detail::record_edges(log_probs, result.edge_std, children, stepped.log_probs, scored, s);
      result.latents.push_back(std::move(stepped.next));
      frontier = children;
      continue;
    }

    // affine checks that the velocity has the latents' rows and shape.
    typename B::tensor mean = backend.affine(step.x_coeff, result.latents.back(), step.velocity_coeff, velocity);
    if (step.previous_x0_coeff != 0.0) mean = backend.affine(1.0, mean, step.previous_x0_coeff, *previous_x0);
    if (kind == edge_kind::ode && multistep) {
      // ODE edges never split (validate), so the frontier's rows stay the paths' rows.
      previous_x0 = backend.affine(1.0, result.latents.back(), -schedule.sigma(s), velocity);
      previous_step = s;
    }
    // Children of a node are contiguous and every node has K, so child row j has parent row j / K.
    if (k > 1) {
      std::vector<std::int64_t> index(children.size());
      for (std::size_t j = 0; j < children.size(); ++j) index[j] = static_cast<std::int64_t>(j) / k;
      mean = backend.gather_rows(mean, index);
    }

    if (kind == edge_kind::ode) {
      // No log-prob to inspect here, so probe the mean itself: log N(mean; mean, 1) is NaN exactly when
      // some element is NaN or infinite, and costs one reduction on the backend.
      const std::vector<double> ones(children.size(), 1.0);
      const std::vector<double> probe = backend.row_log_prob(mean, mean, ones);
      for (std::size_t j = 0; j < children.size(); ++j)
        require(std::isfinite(probe[j]), "non-finite latent at ODE step ", s, " for node ", children[j],
                " (a non-finite velocity?)");
      result.latents.push_back(std::move(mean));
      frontier = children;
      continue;
    }

    // A split with another correlator: it writes the group's rows on the host.
    host.assign(children.size() * elements, 0.0);
    const auto group_size = static_cast<std::size_t>(k);
    sibling_keys.resize(group_size);
    for (std::int64_t p = 0; p < parents; ++p) {
      const std::size_t first = static_cast<std::size_t>(p) * group_size;
      for (std::size_t b = 0; b < group_size; ++b)
        sibling_keys[b] = detail::rollout_key(forest, options, children[first + b], s, noise_stream::edge);
      const sibling_group group{.parent = detail::rollout_key(forest, options, frontier[static_cast<std::size_t>(p)], s,
                                                              noise_stream::shared),
                                .children = sibling_keys,
                                .elements = elements};
      const double factor = correlator(group, std::span<double>(host).subspan(first * elements, group_size * elements));
      require(std::isfinite(factor) && factor > 0.0, "correlator returned factor ", factor, " at step ", s,
              " for node ", frontier[static_cast<std::size_t>(p)], "; it must be positive and finite");
      for (std::size_t b = 0; b < group_size; ++b) {
        stds[first + b] = step.noise_std * factor;
        scored[first + b] = scoring_std(step, stds[first + b]);
      }
    }
    for (std::size_t j = 0; j < children.size(); ++j)
      for (std::size_t i = 0; i < elements; ++i) host[j * elements + i] *= stds[j];
    const typename B::tensor noise = backend.from_host(host, child_rows, shape);
    typename B::tensor next = backend.affine(1.0, mean, 1.0, noise);
    detail::record_edges(log_probs, result.edge_std, children, backend.row_log_prob(next, mean, scored), scored, s);
    result.latents.push_back(std::move(next));
    frontier = children;
  }
  return result;
}

/// Node n's latent as host doubles (one row of latents[step(n)]).
template <Backend B>
std::vector<double> latent_of(B& backend, const rollout_result<B>& result, std::int32_t node) {
  const std::int64_t row = result.tree.row_at_step(node);
  return backend.to_host(
      backend.slice_rows(result.latents[static_cast<std::size_t>(result.tree.step(node))], row, row + 1));
}

/// The leaves' latents, one row per leaf in tree.leaves() order (the order of leaf rewards).
template <Backend B>
typename B::tensor leaf_latents(B& backend, const rollout_result<B>& result) {
  const std::span<const std::int32_t> leaves = result.tree.leaves();
  std::vector<std::int64_t> index(leaves.size());
  for (std::size_t i = 0; i < leaves.size(); ++i) index[i] = result.tree.row_at_step(leaves[i]);
  return backend.gather_rows(result.latents.back(), index);
}

}  // namespace branchgrpo
