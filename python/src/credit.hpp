#pragma once
// Stages 2-4 of an iteration for Python, on a rollout's forest: the credit (keep_finite_trees, then the method's
// fusion, normalizer and pruner: assign_credit), the trained edges' table (where each edge's latents are and how its
// transition is scored, for the torch loss), and ppo_options' rules and defaults.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/loss/ppo.hpp"
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

inline credit_output assign(method_spec& method, const forest& trees, std::vector<double> scores, int iteration,
                            int total_iterations) {
  bg::require(total_iterations >= 1 && iteration >= 0 && iteration < total_iterations,
              "credit: iteration = ", iteration, ", total_iterations = ", total_iterations,
              ": needs 0 <= iteration < total_iterations");
  const bg::scored_leaves leaves = bg::keep_finite_trees(trees.tree, std::move(scores));
  bg::require(!leaves.kept_trees.empty(), "credit: every tree has a non-finite leaf reward; none can train");
  bg::edge_credit credit = bg::assign_credit(method.recipe, trees.tree, leaves, iteration, total_iterations);
  return credit_output{.kept_trees = leaves.kept_trees,
                       .trained = std::move(credit.trained),
                       .fused = std::move(credit.fused),
                       .advantages = std::move(credit.advantages),
                       .edge_advantage = std::move(credit.edge_advantage),
                       .mask = std::move(credit.mask)};
}

// --- The trained edges ---------------------------------------------------------------------------------------------

// Per trained edge (credit.trained's order, by step): where its latents are and how its transition is scored, so
// that torch can recompute its log-prob with gradients: mean = x_coeff x + velocity_coeff v(x), the row's mean of
// log N(next; mean, std^2) (torch_backend's row_log_prob).
struct edge_table {
  std::vector<std::int32_t> node, step, parent_row, row;
  std::vector<double> sigma, x_coeff, velocity_coeff, std, old_log_prob, advantage;
};

inline edge_table trained_edges(const rollout_output& result, const credit_output& credit) {
  const bg::rollout_tree& tree = result.trees.tree;
  const bg::sigma_schedule schedule = bg::shifted_linear_schedule(result.steps, result.shift);
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
  return out;
}

// The ppo_ratio options' rules (ppo_options::parameters()), on the values a Python loss is given.
inline void check_ppo(double clip_range, double advantage_clip) {
  bg::validate_parameters(bg::ppo_options{.clip_range = clip_range, .advantage_clip = advantage_clip}, "loss");
}

}  // namespace branchgrpo::python
