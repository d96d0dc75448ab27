#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "branchgrpo/topology.hpp"
#include "branchgrpo/tree/leaf_rewards.hpp"
#include "branchgrpo/tree/levels.hpp"

using namespace branchgrpo;

TEST_CASE("the doc example: a two-step tree with one split", "[tree]") {
  const tree_plan plan{.steps = 2, .roots = 1, .branching = {2, 1}, .kinds = {edge_kind::sde, edge_kind::sde}};
  const rollout_tree tree(plan, numbered_trees(1));
  REQUIRE(tree.node_count() == 5);
  CHECK(tree.children(0) == node_range{1, 3});
  CHECK(tree.parent(3) == 1);
  CHECK(tree.parent(4) == 2);
  CHECK(std::vector<std::int32_t>(tree.leaves().begin(), tree.leaves().end()) == std::vector<std::int32_t>{3, 4});
  CHECK(tree.sibling_rank(2) == 1);
  CHECK(tree.is_root(0));
  CHECK(tree.is_leaf(4));
}

TEST_CASE("dense forest layout and queries", "[tree]") {
  const rollout_tree tree(split_schedule::dense()(20), numbered_trees(3));
  REQUIRE(tree.node_count() == 3 * 219);
  REQUIRE(tree.leaf_count() == 48);
  CHECK(tree.evaluations() == 3 * 203);
  CHECK(tree.edge_count() == 3 * 218);
  CHECK(tree.last_split_depth() == 9);

  // Tree 1 starts at node 219; its root splits into 220 and 221.
  CHECK(tree.tree(219) == 1);
  CHECK(tree.local_index(221) == 2);
  CHECK(tree.children(219) == node_range{220, 222});
  CHECK(tree.nodes_at_depth(1, 0) == node_range{219, 220});
  CHECK(tree.nodes_at_depth(1, 1) == node_range{220, 222});
  CHECK(tree.nodes_at_depth(1, 4) == node_range{219 + 7, 219 + 11});  // 1 + 3*2 = 7 nodes before depth 4
  CHECK(tree.nodes_at_depth(2, 20).size() == 16);

  // Every node: children point back, depth is parent's + 1, leaves under the root are the tree's 16 leaves.
  for (std::int32_t n = 0; n < tree.node_count(); ++n) {
    const auto kids = tree.children(n);
    for (std::int32_t c = kids.begin; c < kids.end; ++c) {
      CHECK(tree.parent(c) == n);
      CHECK(tree.depth(c) == tree.depth(n) + 1);
      CHECK(tree.tree(c) == tree.tree(n));
    }
    for (std::int32_t leaf : tree.leaves_under(n)) {
      const auto path = tree.path_to_root(leaf);
      CHECK(std::find(path.begin(), path.end(), n) != path.end());
    }
  }
  CHECK(tree.leaves_under(219).size() == 16);
  CHECK(tree.leaves_under(219).front() == tree.leaves()[16]);
  CHECK(tree.leaf_positions_under(219) == node_range{16, 32});
  const auto leaf = tree.leaves()[20];
  CHECK(tree.leaf_position(leaf) == 20);
  CHECK(tree.path_to_root(leaf).size() == 21);
  CHECK(tree.path_to_root(leaf).back() == 219);

  // edges_at_step: transition s is taken by the nodes at step s + 1, tree-major.
  const auto edges = tree.edges_at_step(3);
  CHECK(edges.size() == 3 * 4);
  for (std::size_t i = 0; i < edges.size(); ++i) {
    CHECK(tree.step(tree.parent(edges[i])) == 3);
    CHECK(tree.row_at_step(edges[i]) == static_cast<std::int32_t>(i));
  }
  CHECK_THROWS_WITH(tree.parent(tree.node_count()), "node 657 is outside [0, 657)");
  CHECK_THROWS_WITH(tree.edges_at_step(20), "edge step 20 is outside [0, 20)");
}

TEST_CASE("topology costs match the paper", "[topology]") {
  const auto dense = split_schedule::dense()(20);
  CHECK(dense.leaf_count() == 16);
  CHECK(dense.node_count() == 219);
  CHECK(dense.evaluations() == 203);
  CHECK(dense.edge_count() == 218);
  CHECK(split_schedule::mixed()(20).leaf_count() == 16);
  CHECK(split_schedule::sparse()(20).branching_steps() == std::vector<int>{0, 5, 10, 15});
  CHECK(split_schedule::dense(3)(20).leaf_count() == 81);
  CHECK(split_schedule::dense(4)(20).leaf_count() == 256);
  CHECK(sequential{.group_size = 16}(20).evaluations() == 305);
  CHECK(sequential{.group_size = 16, .shared_root = false}(20).evaluations() == 320);
  CHECK(sequential{.group_size = 16, .shared_root = false}(20).leaf_count() == 16);
  // Per-split factors.
  CHECK(split_schedule{.split_steps = {0, 3}, .branching = {4, 3}}(20).leaf_count() == 12);
  // Factor 1 splits are allowed (a chain).
  CHECK(split_schedule{.split_steps = {2}, .branching = {1}}(5).leaf_count() == 1);
}

TEST_CASE("flow_grpo_fast plan: the doc example", "[topology]") {
  const auto plan = flow_grpo_fast{.group_size = 4, .split_step = 2, .sde_steps = 2}(5);
  CHECK(plan.kinds ==
        std::vector<edge_kind>{edge_kind::ode, edge_kind::ode, edge_kind::sde, edge_kind::sde, edge_kind::ode});
  CHECK(plan.branching == std::vector<int>{1, 1, 4, 1, 1});
  CHECK(plan.leaf_count() == 4);
  CHECK(plan.evaluations() == 11);
}

TEST_CASE("skip steps: evaluations, ode_target and validation (the doc example)", "[tree]") {
  const tree_plan plan{.steps = 4,
                       .roots = 1,
                       .branching = {2, 1, 1, 1},
                       .kinds = {edge_kind::sde, edge_kind::ode, edge_kind::skip, edge_kind::ode}};
  CHECK_NOTHROW(validate(plan));
  CHECK(plan.node_count() == 9);
  CHECK(plan.evaluations() == 5);
  CHECK(plan.ode_target(1) == 3);
  CHECK(plan.ode_target(3) == 4);
  CHECK(std::string(to_string(edge_kind::skip)) == "skip");
  tree_plan after_sde = plan;
  after_sde.kinds = {edge_kind::sde, edge_kind::skip, edge_kind::ode, edge_kind::ode};
  CHECK_THROWS_WITH(validate(after_sde),
                    "skip step 1 does not follow an ODE step: only an ODE edge can integrate past it");
  tree_plan split_skip = plan;
  split_skip.branching = {2, 1, 2, 1};
  CHECK_THROWS_WITH(validate(split_skip), "split at step 2 must be an SDE edge: ODE children would be identical");
}

TEST_CASE("invalid topologies name the bad value", "[topology]") {
  CHECK_THROWS_WITH((split_schedule{.split_steps = {0, 20}}(20)), "split step 20 is not in [0, 20)");
  CHECK_THROWS_WITH((split_schedule{.split_steps = {0, 3}, .branching = {0}}(20)),
                    "branching factor 0 at split step 0 is below 1");
  CHECK_THROWS_WITH((split_schedule{.split_steps = {3, 3}}(20)), "split step 3 is given more than once");
  CHECK_THROWS_WITH((split_schedule{.split_steps = {0, 1, 2, 3, 4}, .branching = {32}}(20)),
                    "tree exceeds 2^24 leaves after step 4 (1048576 x 32)");
  CHECK_THROWS_WITH((split_schedule{.split_steps = {0, 1}, .branching = {2, 2, 2}}(20)),
                    "split_schedule has 3 branching factors for 2 split steps");
  CHECK_THROWS_WITH((sequential{.group_size = 0}(20)), "group size 0 is below 1");
  CHECK_THROWS_WITH((flow_grpo_fast{.split_step = 19, .sde_steps = 2}(20)),
                    "sde_steps 2 from split step 19 runs past 20 steps");
  CHECK_THROWS_WITH((flow_grpo_fast{.split_step = 0, .sde_steps = 0}(20)),
                    "sde_steps 0 is below 1 (the split itself is an SDE step)");
  const tree_plan ode_split{.steps = 1, .roots = 1, .branching = {2}, .kinds = {edge_kind::ode}};
  CHECK_THROWS_WITH(validate(ode_split), "split at step 0 must be an SDE edge: ODE children would be identical");
  CHECK_THROWS_WITH((rollout_tree(split_schedule::dense()(20), {})), "a rollout needs at least one tree");
}

TEST_CASE("validate accepts max_steps steps and no more", "[topology]") {
  STATIC_REQUIRE(max_steps == 255);
  CHECK_NOTHROW(validate(sequential{.group_size = 2}(max_steps)));
  CHECK_THROWS_WITH(validate(sequential{.group_size = 2}(max_steps + 1)), "at most 255 steps are supported, got 256");
  // The per-level scratch of for_each_level_bottom_up holds every level of the deepest plan.
  const rollout_tree deepest(sequential{.group_size = 2}(max_steps), numbered_trees(1));
  int levels = 0;
  for_each_level_bottom_up(deepest, [&](const tree_level&) { ++levels; });
  CHECK(levels == max_steps);
}

TEST_CASE("tree_plan counts: the doc example", "[topology]") {
  const tree_plan plan{
      .steps = 3, .roots = 1, .branching = {2, 1, 2}, .kinds = {edge_kind::sde, edge_kind::ode, edge_kind::sde}};
  CHECK(plan.node_count_at_step(0) == 1);
  CHECK(plan.node_count_at_step(2) == 2);
  CHECK(plan.leaf_count() == 4);
  CHECK(plan.node_count() == 9);
  CHECK(plan.evaluations() == 5);
  CHECK(plan.edge_count() == 8);
  CHECK(plan.branching_steps() == std::vector<int>{0, 2});
}

namespace {
// The worked example of tree/leaf_rewards.hpp and tree/levels.hpp: root 0; 1, 2; leaves 3, 4 under 1 and 5, 6
// under 2 (7 nodes per tree).
rollout_tree seven_node_forest(std::int32_t trees) {
  return rollout_tree(split_schedule{.split_steps = {0, 1}, .branching = {2}}(2), numbered_trees(trees));
}
}  // namespace

TEST_CASE("for_each_level_bottom_up: doc example", "[tree]") {
  std::vector<tree_level> visited;
  for_each_level_bottom_up(seven_node_forest(2), [&](const tree_level& level) { visited.push_back(level); });
  CHECK(visited == std::vector<tree_level>{{.parents = {1, 3}, .first_child = 3, .children = 2, .depth = 1},
                                           {.parents = {0, 1}, .first_child = 1, .children = 2, .depth = 0},
                                           {.parents = {8, 10}, .first_child = 10, .children = 2, .depth = 1},
                                           {.parents = {7, 8}, .first_child = 8, .children = 2, .depth = 0}});
}

TEST_CASE("leaf reward helpers: doc examples", "[tree]") {
  const rollout_tree tree = seven_node_forest(1);
  const std::vector<double> rewards = {1, 3, 2, 6};
  CHECK_NOTHROW(check_leaf_rewards(tree, rewards));
  CHECK_THROWS_WITH(check_leaf_rewards(tree, std::vector<double>{1, 3}), "got 2 leaf rewards for 4 leaves");
  CHECK_THROWS_WITH(check_leaf_rewards(tree, std::vector<double>{1, std::nan(""), 2, 6}),
                    "leaf reward at leaf position 1 (node 4) is nan");

  std::vector<double> per_node(7, 0.0);
  copy_leaf_rewards(tree, rewards, per_node);
  CHECK(per_node == std::vector<double>{0, 0, 0, 1, 3, 2, 6});
  std::vector<double> too_small(6, 0.0);
  CHECK_THROWS_WITH(copy_leaf_rewards(tree, rewards, too_small), "got room for 6 node values for 7 nodes");

  CHECK(mean_of_leaves_under(tree, rewards) == std::vector<double>{3, 2, 4, 1, 3, 2, 6});

  const std::vector<double> spread = spread_leaf_advantages(tree, std::vector<double>{-0.9, 0, -0.5, 1.4});
  REQUIRE(spread.size() == 7);
  CHECK(spread[0] == 0.0);
  CHECK(spread[1] == Approx(-0.45));
  CHECK(spread[2] == Approx(0.45));
  CHECK(std::vector<double>(spread.begin() + 3, spread.end()) == std::vector<double>{-0.9, 0, -0.5, 1.4});
  CHECK_THROWS_WITH(spread_leaf_advantages(tree, std::vector<double>{0, std::numeric_limits<double>::infinity(), 0, 0}),
                    "leaf reward at leaf position 1 (node 4) is inf");
}

TEST_CASE("mean_of_leaves_under: the span overload overwrites a reused buffer bit for bit", "[tree]") {
  // Dense K = 3 over 6 steps, 3 trees: splits of 3 and chains; rewards with ties and signed zeros.
  const rollout_tree tree(split_schedule{.split_steps = {0, 2, 4}, .branching = {3}}(6), numbered_trees(3));
  std::vector<double> rewards(static_cast<std::size_t>(tree.leaf_count()));
  for (std::size_t i = 0; i < rewards.size(); ++i)
    rewards[i] = i % 5 == 0 ? -0.0 : static_cast<double>((i * 7) % 11) / 3.0 - 1.0;
  const std::vector<double> expected = mean_of_leaves_under(tree, rewards);
  std::vector<double> reused(static_cast<std::size_t>(tree.node_count()), std::nan(""));
  for (int round = 0; round < 2; ++round) {
    mean_of_leaves_under(tree, rewards, reused);
    REQUIRE(std::memcmp(reused.data(), expected.data(), expected.size() * sizeof(double)) == 0);
  }
  for (std::int32_t n = 0; n < tree.node_count(); ++n) {  // each node: the mean of the leaves under it
    double sum = 0.0;
    const node_range under = tree.leaf_positions_under(n);
    for (std::int32_t p = under.begin; p < under.end; ++p) sum += rewards[static_cast<std::size_t>(p)];
    CHECK(expected[static_cast<std::size_t>(n)] == Approx(sum / under.size()).margin(1e-12));
  }
  std::vector<double> too_small(static_cast<std::size_t>(tree.node_count()) - 1);
  CHECK_THROWS_WITH(mean_of_leaves_under(tree, rewards, too_small), "got room for 236 node values for 237 nodes");
}
