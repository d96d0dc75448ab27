#pragma once
// The cost of one rollout tree, as `branchgrpo tree` prints it. Kept free of CLI11 and JSON so it is unit-tested
// (tests/unit/test_tree_report.cpp).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "branchgrpo/tree/tree_plan.hpp"

namespace branchgrpo::cli {

/// Counts of one tree of a plan. Depth d holds the nodes after d steps; every node above the leaves is one
/// denoiser evaluation, and every node but a root is the end of one edge.
struct tree_report {
  std::int64_t leaves = 0;
  std::int64_t nodes = 0;
  std::int64_t evaluations = 0;
  std::int64_t edges = 0;
  std::vector<std::int64_t> nodes_per_depth;  ///< size steps + 1; also the evaluations of step d for d < steps
  std::vector<std::int64_t> edges_per_step;   ///< size steps; edges of step s == nodes_per_depth[s + 1]
  std::int64_t sde_edges = 0;
  std::int64_t ode_edges = 0;
  double evaluations_per_leaf = 0.0;
  double edges_per_leaf = 0.0;

  friend bool operator==(const tree_report&, const tree_report&) = default;
};

/// Example: steps 3, roots 1, branching {2, 1, 2}, kinds {sde, ode, sde} ->
///   nodes_per_depth {1, 2, 2, 4}, edges_per_step {2, 2, 4}, 4 leaves, 9 nodes, 5 evaluations, 8 edges,
///   6 SDE and 2 ODE edges, 1.25 evaluations and 2 edges per leaf.
/// Example: split_schedule::dense() over 20 steps -> 16 leaves, 219 nodes, 203 evaluations, 218 edges.
/// @pre validate(plan) passes (checked: throws invalid_input otherwise).
/// @post sde_edges + ode_edges == edges; sum of nodes_per_depth == nodes.
inline tree_report make_tree_report(const tree_plan& plan) {
  validate(plan);
  tree_report report;
  report.leaves = plan.leaf_count();
  report.nodes = plan.node_count();
  report.evaluations = plan.evaluations();
  report.edges = plan.edge_count();
  report.nodes_per_depth.reserve(static_cast<std::size_t>(plan.steps) + 1);
  for (int d = 0; d <= plan.steps; ++d) report.nodes_per_depth.push_back(plan.node_count_at_step(d));
  report.edges_per_step.assign(report.nodes_per_depth.begin() + 1, report.nodes_per_depth.end());
  for (int s = 0; s < plan.steps; ++s) {
    const std::int64_t count = report.edges_per_step[static_cast<std::size_t>(s)];
    (plan.kinds[static_cast<std::size_t>(s)] == edge_kind::sde ? report.sde_edges : report.ode_edges) += count;
  }
  report.evaluations_per_leaf = static_cast<double>(report.evaluations) / static_cast<double>(report.leaves);
  report.edges_per_leaf = static_cast<double>(report.edges) / static_cast<double>(report.leaves);
  return report;
}

}  // namespace branchgrpo::cli
