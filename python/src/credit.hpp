#pragma once
// Stages 2-4 of an iteration for Python, on a rollout's forest: the credit (keep_finite_trees, then the method's
// fusion, normalizer and pruner: assign_credit), the trained edges' table (where each edge's latents are and how its
// transition is scored, for the torch loss), and ppo_options' rules and defaults.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/loss/ppo.hpp"
#include "branchgrpo/loss/step_weights.hpp"
#include "branchgrpo/reward/win_rate.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/schedule/steppers.hpp"
#include "branchgrpo/training/credit.hpp"
#include "branchgrpo/training/run_recipe.hpp"
#include "branchgrpo/training/trainer.hpp"
#include "forest.hpp"
#include "method.hpp"
#include "rollout.hpp"

namespace branchgrpo::python {

namespace nb = nanobind;
namespace bg = branchgrpo;

// --- Credit -------------------------------------------------------------------------------------------------------

// Stage 3 of train_iteration on a rollout's forest and its leaf rewards: the method's fusion, normalizer and pruner
// (assign_credit), after keep_finite_trees (the trees whose every leaf reward is finite train).
struct credit_output {
  std::vector<std::int32_t> kept_trees, trained;
  std::vector<double> fused, advantages, edge_advantage;
  std::vector<std::uint8_t> mask;
};

/// A reward's parts from Python: (name, weight, one score per leaf) each.
using python_components = std::vector<std::tuple<std::string, double, std::vector<double>>>;

inline std::vector<bg::reward_component> reward_components(python_components parts) {
  std::vector<bg::reward_component> out;
  for (auto& [name, weight, rows] : parts) out.push_back({.name = name, .weight = weight, .rows = std::move(rows)});
  return out;
}

inline credit_output assign(method_spec& method, const forest& trees, std::vector<double> scores,
                            python_components components, int iteration, int total_iterations) {
  bg::require(total_iterations >= 1 && iteration >= 0 && iteration < total_iterations,
              "credit: iteration = ", iteration, ", total_iterations = ", total_iterations,
              ": needs 0 <= iteration < total_iterations");
  const bg::scored_leaves leaves =
      bg::keep_finite_trees(trees.tree, std::move(scores), reward_components(std::move(components)));
  bg::require(!leaves.kept_trees.empty(), "credit: every tree has a non-finite leaf reward; none can train");
  bg::edge_credit credit = bg::assign_credit(method.recipe, trees.tree, leaves, iteration, total_iterations);
  return credit_output{.kept_trees = leaves.kept_trees,
                       .trained = std::move(credit.trained),
                       .fused = std::move(credit.fused),
                       .advantages = std::move(credit.advantages),
                       .edge_advantage = std::move(credit.edge_advantage),
                       .mask = std::move(credit.mask)};
}

// --- Win rates ------------------------------------------------------------------------------------------------------

/// Pref-GRPO's win rate of each leaf within its group (reward/win_rate.hpp: win_rates), the groups given per row as
/// the iteration's tree keys: rows of one group are contiguous and every group has the same size, as score() and the
/// trainer hand them. Example: scores {0.2, 0.5, 0.5, 0.9}, groups {0, 0, 0, 0} -> {0, 0.5, 0.5, 1}.
inline std::vector<double> group_win_rates(std::span<const double> scores, std::span<const std::int64_t> groups,
                                           double tie) {
  bg::require(scores.size() == groups.size() && !groups.empty(), "win_rate: ", scores.size(), " scores for ",
              groups.size(), " group ids");
  std::size_t size = 1;
  while (size < groups.size() && groups[size] == groups[0]) ++size;
  std::vector<std::uint32_t> keys;
  for (std::size_t first = 0; first < groups.size(); first += size) {
    for (std::size_t j = first; j < first + size; ++j)
      bg::require(j < groups.size() && groups[j] == groups[first], "win_rate: the groups must be runs of ", size,
                  " rows each; row ", j, " breaks that");
    keys.push_back(static_cast<std::uint32_t>(groups[first]));
  }
  return bg::win_rates(scores, {.leaves_per_tree = static_cast<std::int32_t>(size), .keys = keys}, tie);
}

// --- The trained edges ---------------------------------------------------------------------------------------------

// Per trained edge (credit.trained's order, by step): where its latents are and how its transition is scored, so
// that torch can recompute its log-prob with gradients: mean = x_coeff x + velocity_coeff v(x), the row's mean of
// log N(next; mean, std^2) (torch_backend's row_log_prob).
struct edge_table {
  std::vector<std::int32_t> node, step, parent_row, row;
  std::vector<double> sigma, x_coeff, velocity_coeff, std, old_log_prob, advantage;
  std::vector<double> weight;  ///< the trainer's: w(step) / edges, w the ppo step weighting's (1 with none)
};

// The loss weight of each step of the rollout's schedule under `kind` (ppo_ratio's step_weights on one rank): none,
// inverse_dt and noise_std from the schedule and the stepper, equal_steps from the trained edges per step.
// Example: kind none -> 1 per step; equal_steps with edges per step {2, 4, 0, 10} -> {2.666667, 1.333333, 0, 0.533333}.
inline std::vector<double> step_weights_of(const rollout_output& result, const bg::run_recipe& recipe,
                                           std::span<const std::int32_t> edge_steps, bg::step_weighting kind) {
  const bg::sigma_schedule& schedule = result.schedule;
  if (kind == bg::step_weighting::equal_steps) {
    std::vector<double> edges_per_step(static_cast<std::size_t>(result.steps), 0.0);
    for (const std::int32_t s : edge_steps) edges_per_step[static_cast<std::size_t>(s)] += 1;
    return bg::equal_step_weights(edges_per_step);
  }
  std::vector<double> step_noise(static_cast<std::size_t>(result.steps));
  for (int t = 0; t < result.steps; ++t)
    step_noise[static_cast<std::size_t>(t)] =
        bg::step_coefficients(recipe.stepper, schedule, t, result.trees.tree.plan().layer(t)).noise_std;
  return bg::step_loss_weights(kind, schedule, step_noise);
}

inline edge_table trained_edges(const rollout_output& result, const credit_output& credit,
                                bg::step_weighting step_weight) {
  const bg::rollout_tree& tree = result.trees.tree;
  const bg::sigma_schedule& schedule = result.schedule;
  const bg::run_recipe& recipe = nb::cast<const method_spec&>(result.method).recipe;
  edge_table out;
  for (const std::int32_t n : credit.trained) {
    bg::require(n >= 0 && n < tree.node_count() && !tree.is_root(n), "edges: node ", n,
                " is not an edge of this rollout's forest (a Credit of another rollout?)");
    const std::int32_t parent = tree.parent(n);
    const int s = tree.step(parent);
    const bg::affine_step step = bg::step_coefficients(recipe.stepper, schedule, s, tree.plan().layer(s));
    out.node.push_back(n);
    out.step.push_back(s);
    out.parent_row.push_back(tree.row_at_step(parent));
    out.row.push_back(tree.row_at_step(n));
    out.sigma.push_back(schedule.sigma(s));
    out.x_coeff.push_back(step.x_coeff);
    out.velocity_coeff.push_back(step.velocity_coeff);
    out.std.push_back(result.edge_std[static_cast<std::size_t>(n)]);
    out.old_log_prob.push_back(tree.log_prob(n));
    out.advantage.push_back(credit.edge_advantage[static_cast<std::size_t>(n)]);
  }
  if (out.node.empty()) return out;
  const std::vector<double> per_step = step_weights_of(result, recipe, out.step, step_weight);
  for (const std::int32_t s : out.step)
    out.weight.push_back(per_step[static_cast<std::size_t>(s)] / static_cast<double>(out.node.size()));
  return out;
}

// The ppo_ratio options' rules (ppo_options::parameters()), on the values a Python loss is given.
inline void check_ppo(double clip_range, double advantage_clip) {
  bg::validate_parameters(bg::ppo_options{.clip_range = clip_range, .advantage_clip = advantage_clip}, "loss");
}

// Per edge, ppo_ratio's loss and its derivative in the log-prob (loss/ppo.hpp: ppo_clipped_loss and
// ppo_clipped_loss_gradient of the clipped advantage): the terms of the package's differentiable ppo_loss.
// Example: log_prob {0.01}, old {0}, advantage {-2}, clip_range 1e-3 -> loss {2.020100334}, gradient {2.020100334}.
struct ppo_terms_output {
  std::vector<double> loss, gradient;
};

inline ppo_terms_output ppo_terms(std::span<const double> log_prob, std::span<const double> old_log_prob,
                                  std::span<const double> advantage, double clip_range, double advantage_clip) {
  check_ppo(clip_range, advantage_clip);
  bg::require(old_log_prob.size() == log_prob.size() && advantage.size() == log_prob.size(),
              "ppo_loss: ", log_prob.size(), " log-probs, ", old_log_prob.size(), " old log-probs and ",
              advantage.size(), " advantages: one of each per edge");
  ppo_terms_output out;
  for (std::size_t i = 0; i < log_prob.size(); ++i) {
    bg::require(std::isfinite(log_prob[i]), "ppo_loss: log_prob[", i, "] = ", log_prob[i], " is not finite");
    const double a = bg::clip_advantage(advantage[i], advantage_clip);
    out.loss.push_back(bg::ppo_clipped_loss(log_prob[i], old_log_prob[i], a, clip_range));
    out.gradient.push_back(bg::ppo_clipped_loss_gradient(log_prob[i], old_log_prob[i], a, clip_range));
  }
  return out;
}

}  // namespace branchgrpo::python
