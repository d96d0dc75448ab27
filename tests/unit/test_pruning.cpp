#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "branchgrpo/pruning.hpp"
#include "branchgrpo/topology/flow_grpo_fast.hpp"
#include "branchgrpo/topology/sequential.hpp"
#include "branchgrpo/topology/split_schedule.hpp"

using namespace branchgrpo;

namespace {

// Tree {steps 4, splits {0, 2}, K 2}: nodes 0 | 1 2 | 3 4 | 5 6 7 8 | 9 10 11 12 by depth.
// Edge depth of node n = depth(n) - 1: {1,2} -> 0, {3,4} -> 1, {5..8} -> 2, {9..12} -> 3. Last split L = 2.
rollout_tree small_tree(std::int32_t trees = 1) {
  return rollout_tree(split_schedule{.split_steps = {0, 2}, .branching = {2}}(4), numbered_trees(trees));
}

using ctx = prune_context;

rollout_tree dense_tree() { return rollout_tree(split_schedule::dense()(20), numbered_trees(1)); }

std::int64_t kept(const edge_mask& mask) { return std::count(mask.begin(), mask.end(), std::uint8_t{1}); }

// Number of kept edges per edge depth.
std::vector<int> kept_per_depth(const rollout_tree& tree, const edge_mask& mask) {
  std::vector<int> counts(static_cast<std::size_t>(tree.steps()), 0);
  for (std::int32_t n = 0; n < tree.node_count(); ++n)
    if (mask[static_cast<std::size_t>(n)]) ++counts[static_cast<std::size_t>(tree.depth(n) - 1)];
  return counts;
}

edge_mask repeat(const edge_mask& one, int times) {
  edge_mask all;
  for (int t = 0; t < times; ++t) all.insert(all.end(), one.begin(), one.end());
  return all;
}

}  // namespace

TEST_CASE("the small hand tree has the layout the expected masks assume") {
  const auto tree = small_tree();
  REQUIRE(tree.node_count() == 13);
  CHECK(tree.last_split_depth() == 2);
  const std::vector<std::int32_t> parents = {no_parent, 0, 0, 1, 2, 3, 3, 4, 4, 5, 6, 7, 8};
  for (std::int32_t n = 0; n < 13; ++n) CHECK(tree.parent(n) == parents[static_cast<std::size_t>(n)]);
  CHECK(std::vector<std::int32_t>(tree.leaves().begin(), tree.leaves().end()) ==
        std::vector<std::int32_t>{9, 10, 11, 12});
}

TEST_CASE("depth_window: doc example, sliding window with clamp") {
  const auto tree = small_tree();
  const depth_window pruner{.width = 2, .start = 1, .every = 1};
  CHECK(pruner.window(tree, 0) == std::vector<int>{1, 2});
  // iteration 0: window [1, 3) pruned: edges at depths 1, 2 (nodes 3..8) dropped.
  CHECK(pruner(tree, ctx{.iteration = 0}) == edge_mask{0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1});
  // iteration 1: window [2, 4): nodes 5..12 dropped.
  CHECK(pruner(tree, ctx{.iteration = 1}) == edge_mask{0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0});
  // iteration 9: start 1 + 9 = 10, clamped to steps - width = 2.
  CHECK(pruner.window(tree, 9) == std::vector<int>{2, 3});
  CHECK(pruner(tree, ctx{.iteration = 9}) == pruner(tree, ctx{.iteration = 1}));
}

TEST_CASE("depth_window: fixed depths and keep_window") {
  const auto tree = small_tree();
  const depth_window fixed{.depths = {3, 0}};
  CHECK(fixed(tree, ctx{.iteration = 0}) == edge_mask{0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0});
  CHECK(fixed(tree, ctx{.iteration = 500}) == fixed(tree, ctx{.iteration = 0}));
  depth_window inverse = fixed;
  inverse.keep_window = true;
  CHECK(inverse(tree, ctx{.iteration = 0}) == edge_mask{0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1});
  // Two trees: the same mask per tree.
  const auto forest = small_tree(2);
  CHECK(fixed(forest, {}) == repeat(fixed(tree, {}), 2));
}

TEST_CASE("depth_window: paper defaults on the dense 20-step tree") {
  const auto tree = dense_tree();
  REQUIRE(tree.edge_count() == 218);
  const depth_window paper{};
  // Last split 9: window [9, 13) pruned = 4 depths x 16 edges = 64; 218 - 64 = 154 trained.
  CHECK(paper.window(tree, 0) == std::vector<int>{9, 10, 11, 12});
  CHECK(kept(paper(tree, ctx{.iteration = 0})) == 154);
  CHECK(paper.window(tree, 29) == std::vector<int>{9, 10, 11, 12});
  CHECK(paper.window(tree, 30) == std::vector<int>{10, 11, 12, 13});
  CHECK(paper.window(tree, 100000) == std::vector<int>{16, 17, 18, 19});  // clamped at steps - width
  const auto counts = kept_per_depth(tree, paper(tree, ctx{.iteration = 30}));
  // Edges per edge depth: 2 x 3, 4 x 3, 8 x 3, 16 x 11; depths 10..13 dropped.
  const std::vector<int> expected = {2, 2, 2, 4, 4, 4, 8, 8, 8, 16, 0, 0, 0, 0, 16, 16, 16, 16, 16, 16};
  CHECK(counts == expected);
}

TEST_CASE("depth_window: the official code's downward slide to a stop depth") {
  const auto tree = dense_tree();
  // Code: child depths 15..18 sliding down every 30 iterations to the last split 9 (child depth) =
  // edge depths 14..17 down to 8.
  const depth_window code{.start = 14, .every = 30, .direction = -1, .stop = 8};
  CHECK(code.window(tree, 0) == std::vector<int>{14, 15, 16, 17});
  CHECK(code.window(tree, 60) == std::vector<int>{12, 13, 14, 15});
  CHECK(code.window(tree, 1000000) == std::vector<int>{8, 9, 10, 11});
  // Edge depth 8 has 8 edges, 9..11 have 16: 8 + 48 = 56 pruned, 162 trained.
  CHECK(kept(code(tree, ctx{.iteration = 1000000})) == 162);
  // Without a stop the window runs down to depth 0.
  const depth_window free{.start = 14, .every = 30, .direction = -1};
  CHECK(free.window(tree, 1000000) == std::vector<int>{0, 1, 2, 3});
  // A stop holds an upward slide too.
  const depth_window held{.start = 9, .every = 1, .stop = 11};
  CHECK(held.window(tree, 5) == std::vector<int>{11, 12, 13, 14});
}

TEST_CASE("depth_window: no split starts at depth 0; ODE edges never trained") {
  const rollout_tree chains(sequential{.group_size = 2, .shared_root = false}(4), numbered_trees(1));
  REQUIRE(chains.last_split_depth() == -1);
  CHECK(depth_window{.width = 1}.window(chains, 0) == std::vector<int>{0});
  // Flow-GRPO-Fast: kinds {ode, ode, sde, sde, ode}; nodes 0 | 1 | 2 | 3..6 | 7..10 | 11..14.
  const rollout_tree fast(flow_grpo_fast{.group_size = 4, .split_step = 2, .sde_steps = 2}(5), numbered_trees(1));
  const auto mask = depth_window{.depths = {2}}(fast, {});
  // Only the SDE edges of depth 3 (nodes 7..10) survive: depth 2 is pruned, the rest is ODE.
  CHECK(kept_per_depth(fast, mask) == std::vector<int>{0, 0, 0, 4, 0});
}

TEST_CASE("depth_window rejects bad parameters") {
  const auto tree = small_tree();
  CHECK_THROWS_AS((depth_window{.depths = {4}}(tree, {})), invalid_input);
  CHECK_THROWS_AS((depth_window{.depths = {-1}}(tree, {})), invalid_input);
  CHECK_THROWS_AS((depth_window{.width = 0}(tree, {})), invalid_input);
  CHECK_THROWS_AS((depth_window{.width = 5}(tree, {})), invalid_input);
  CHECK_THROWS_AS((depth_window{.width = 2, .every = 0}(tree, {})), invalid_input);
  CHECK_THROWS_AS((depth_window{.width = 2, .direction = 2}(tree, {})), invalid_input);
  CHECK_THROWS_AS((depth_window{.width = 2, .start = -2}(tree, {})), invalid_input);
  CHECK_THROWS_AS((depth_window{.width = 2, .stop = 4}(tree, {})), invalid_input);
  CHECK_THROWS_AS((depth_window{.width = 2}(tree, ctx{.iteration = -1})), invalid_input);
  CHECK_THROWS_WITH((depth_window{.width = 7}(tree, {})), "depth_window width 7 is not in [1, 4]");
}

TEST_CASE("parent_top_k: doc example") {
  const auto tree = small_tree();
  // Children of the depth-2 parents: 3 -> {5, 6}, 4 -> {7, 8}.
  std::vector<double> fused(13, 0.0);
  fused[5] = 0.2, fused[6] = 0.7, fused[7] = 0.5, fused[8] = 0.5;
  const prune_context context = ctx{.fused = fused};
  // k = 1: 6 beats 5; 7 ties 8 and wins by lower sibling rank. Above L: nodes 1..4. Subtrees: 6 -> 10, 7 -> 11.
  CHECK(parent_top_k{}(tree, context) == edge_mask{0, 1, 1, 1, 1, 0, 1, 1, 0, 0, 1, 1, 0});
  CHECK(parent_top_k{.k = 2}(tree, context) == all_edges(tree));
  CHECK(parent_top_k{.k = 9}(tree, context) == all_edges(tree));
  fused[8] = 0.6;  // now 8 beats 7
  CHECK(parent_top_k{}(tree, ctx{.fused = fused}) == edge_mask{0, 1, 1, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1});
}

TEST_CASE("parent_top_k: deeper subtrees, several trees, ternary splits") {
  // Splits {0, 1}, K 3, 3 steps: 0 | 1 2 3 | 4..12 | 13..21 (leaf 13 + i under node 4 + i). L = 1:
  // parents 1, 2, 3 with children {4,5,6}, {7,8,9}, {10,11,12}.
  const rollout_tree tree(split_schedule{.split_steps = {0, 1}, .branching = {3}}(3), numbered_trees(2));
  REQUIRE(tree.node_count() == 44);
  std::vector<double> fused(44, 0.0);
  // Tree 0: best children 6, 7, 12 for k = 1; 6 & 5, 7 & 9, 12 & 11 for k = 2.
  const std::vector<double> tree0 = {0.1, 0.4, 0.9, 0.8, 0.0, 0.3, -1.0, 0.0, 0.5};
  std::copy(tree0.begin(), tree0.end(), fused.begin() + 4);
  // Tree 1 (offset 22): all children equal: rank 0 wins (nodes 26, 29, 32).
  const prune_context context = ctx{.fused = fused};
  edge_mask one(44, 0);
  for (const int n : {1, 2, 3, 6, 7, 12, 15, 16, 21}) one[static_cast<std::size_t>(n)] = 1;
  for (const int n : {1, 2, 3, 4, 7, 10, 13, 16, 19}) one[static_cast<std::size_t>(22 + n)] = 1;
  CHECK(parent_top_k{}(tree, context) == one);
  const auto two = parent_top_k{.k = 2}(tree, context);
  CHECK(kept(two) == 2 * (3 + 6 + 6));
  for (const int n : {5, 6, 7, 9, 11, 12, 14, 15, 16, 18, 20, 21}) CHECK(two[static_cast<std::size_t>(n)] == 1);
  for (const int n : {4, 8, 10, 13, 17, 19}) CHECK(two[static_cast<std::size_t>(n)] == 0);
}

TEST_CASE("parent_top_k: no split keeps every edge; bad input rejected") {
  const rollout_tree chains(sequential{.group_size = 2, .shared_root = false}(3), numbered_trees(1));
  CHECK(parent_top_k{}(chains, {}) == all_edges(chains));
  const auto tree = small_tree();
  std::vector<double> fused(13, 0.0);
  CHECK_THROWS_AS((parent_top_k{.k = 0}(tree, ctx{.fused = fused})), invalid_input);
  CHECK_THROWS_AS((parent_top_k{}(tree, ctx{.fused = std::span<const double>(fused).first(12)})), invalid_input);
  fused[7] = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH((parent_top_k{}(tree, ctx{.fused = fused})), "parent_top_k fused reward 7 is nan");
}

namespace {

// parent_top_k node by node: sort each depth-L parent's children (best fused first, ties to the lower rank),
// keep the first k, and let every deeper node follow its parent.
edge_mask parent_top_k_reference(const rollout_tree& tree, const std::vector<double>& fused, int k) {
  const int last = tree.last_split_depth();
  if (last < 0) return trainable_edges(tree);
  std::vector<std::uint8_t> selected(static_cast<std::size_t>(tree.node_count()), 0);
  for (std::int32_t n = 0; n < tree.node_count(); ++n) {
    if (tree.depth(n) != last) continue;
    std::vector<std::int32_t> order;
    for (std::int32_t c = tree.children(n).begin; c < tree.children(n).end; ++c) order.push_back(c);
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
      return fused[static_cast<std::size_t>(a)] > fused[static_cast<std::size_t>(b)];
    });
    for (std::size_t i = 0; i < order.size() && i < static_cast<std::size_t>(k); ++i)
      selected[static_cast<std::size_t>(order[i])] = 1;
  }
  edge_mask mask(static_cast<std::size_t>(tree.node_count()), 0);
  for (std::int32_t n = 0; n < tree.node_count(); ++n) {
    if (tree.is_root(n)) continue;
    const auto at = static_cast<std::size_t>(n);
    if (tree.depth(n) <= last) selected[at] = 1;
    if (tree.depth(n) > last + 1) selected[at] = selected[static_cast<std::size_t>(tree.parent(n))];
    mask[at] = selected[at] && tree.kind(n) == edge_kind::sde ? 1 : 0;
  }
  return mask;
}

}  // namespace

TEST_CASE("parent_top_k: the span overload equals the vector overload and the node-by-node rule") {
  // Binary, ternary and 70-wide last splits (ranked by counting, and by sorting), ODE edges below the split
  // (flow_grpo_fast), several trees; fused rewards with many ties.
  tree_plan wide = split_schedule{.split_steps = {1}, .branching = {70}}(3);
  wide.kinds[2] = edge_kind::ode;
  const std::vector<tree_plan> plans = {split_schedule::dense()(20),
                                        split_schedule{.split_steps = {0, 2, 4}, .branching = {3}}(7),
                                        flow_grpo_fast{.group_size = 4, .split_step = 2, .sde_steps = 2}(6), wide,
                                        sequential{.group_size = 3, .shared_root = false}(4)};
  for (const tree_plan& plan : plans)
    for (const std::int32_t trees : {1, 3}) {
      const rollout_tree tree(plan, numbered_trees(trees));
      std::vector<double> fused(static_cast<std::size_t>(tree.node_count()));
      for (std::size_t i = 0; i < fused.size(); ++i)
        fused[i] = static_cast<double>((i * 7) % 5) - (i % 3 == 0 ? 0.0 : -0.0);
      for (const int k : {1, 2, 3, 5, 69, 70, 100}) {
        INFO("nodes " << tree.node_count() << ", k " << k);
        const edge_mask expected = parent_top_k{.k = k}(tree, ctx{.fused = fused});
        CHECK(expected == parent_top_k_reference(tree, fused, k));
        edge_mask reused(fused.size(), 7);
        for (int round = 0; round < 2; ++round) {
          parent_top_k{.k = k}(tree, ctx{.fused = fused}, reused);
          CHECK(reused == expected);
        }
      }
    }
  const auto tree = small_tree();
  edge_mask too_small(12);
  CHECK_THROWS_WITH((parent_top_k{}(tree, ctx{}, too_small)), "parent_top_k got room for 12 mask flags for 13 nodes");
  std::vector<double> fused(13, 0.0);
  fused[8] = std::numeric_limits<double>::infinity();
  edge_mask mask(13);
  CHECK_THROWS_WITH((parent_top_k{}(tree, ctx{.fused = fused}, mask)), "parent_top_k fused reward 8 is inf");
}

TEST_CASE("trainable_edges: the span overload is the non-root SDE edges") {
  const rollout_tree tree(flow_grpo_fast{.group_size = 4, .split_step = 2, .sde_steps = 2}(6), numbered_trees(2));
  edge_mask mask(static_cast<std::size_t>(tree.node_count()), 9);
  trainable_edges(tree, mask);
  for (std::int32_t n = 0; n < tree.node_count(); ++n)
    CHECK(mask[static_cast<std::size_t>(n)] == (!tree.is_root(n) && tree.kind(n) == edge_kind::sde ? 1 : 0));
  CHECK(mask == trainable_edges(tree));
  CHECK(kept(mask) > 0);
  CHECK(kept(mask) < tree.edge_count());
  edge_mask too_big(mask.size() + 1);
  CHECK_THROWS_WITH(trainable_edges(tree, too_big), "got room for " + std::to_string(too_big.size()) +
                                                        " mask flags for " + std::to_string(mask.size()) + " nodes");
}

TEST_CASE("extreme: doc example") {
  const auto tree = small_tree();
  const std::vector<double> rewards = {0.1, 0.5, 0.9, 0.3};
  // Best leaf 11 (0.9) via 7, worst leaf 9 (0.1) via 5; nodes 1..4 sit above the last split.
  CHECK(extreme{}(tree, ctx{.leaf_rewards = rewards}) == edge_mask{0, 1, 1, 1, 1, 1, 0, 1, 0, 1, 0, 1, 0});
  CHECK(extreme{.b = 2}(tree, ctx{.leaf_rewards = rewards}) == all_edges(tree));
}

TEST_CASE("extreme: whole chains without a deep split, per tree, ties") {
  // Shared root split into 4 chains over 3 steps: 0 | 1..4 | 5..8 | 9..12; L = 0, so every edge is below it.
  const rollout_tree fan(sequential{.group_size = 4}(3), numbered_trees(2));
  // Tree 0: best position 2 (chain 3, 7, 11), worst position 1 (chain 2, 6, 10).
  // Tree 1: all equal: best = lowest position 4 (chain 14, 18, 22), worst = highest position 7 (17, 21, 25).
  const std::vector<double> rewards = {3, 1, 4, 2, 5, 5, 5, 5};
  const edge_mask expected = {0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0,   // tree 0
                              0, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1};  // tree 1
  CHECK(extreme{}(fan, ctx{.leaf_rewards = rewards}) == expected);
  // Separate roots (no split): L = -1, chains 0->2->4 and 1->3->5 per root; 2 leaves, 2b >= 2: all kept.
  const rollout_tree chains(sequential{.group_size = 2, .shared_root = false}(2), numbered_trees(1));
  const std::vector<double> two = {0.0, 1.0};
  CHECK(extreme{}(chains, ctx{.leaf_rewards = two}) == all_edges(chains));
}

TEST_CASE("extreme rejects bad input") {
  const auto tree = small_tree();
  std::vector<double> rewards = {0.1, 0.5, 0.9, 0.3};
  CHECK_THROWS_AS((extreme{.b = 0}(tree, ctx{.leaf_rewards = rewards})), invalid_input);
  CHECK_THROWS_AS((extreme{}(tree, ctx{.leaf_rewards = std::span<const double>(rewards).first(3)})), invalid_input);
  rewards[2] = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH((extreme{}(tree, ctx{.leaf_rewards = rewards})), "extreme leaf reward 2 is inf");
}

TEST_CASE("sde_window: shape of the dense 20-step plan") {
  const auto plan = split_schedule::dense()(20);
  const sde_window mix{.width = 4, .start = 0, .every = 1};
  const auto sde_steps = [](const tree_plan& shaped) {
    std::vector<int> steps;
    for (int s = 0; s < shaped.steps; ++s)
      if (shaped.kinds[static_cast<std::size_t>(s)] == edge_kind::sde) steps.push_back(s);
    return steps;
  };
  CHECK(sde_steps(mix.shape(plan, 0)) == std::vector<int>{0, 1, 2, 3, 6, 9});
  CHECK(sde_steps(mix.shape(plan, 5)) == std::vector<int>{0, 3, 5, 6, 7, 8, 9});
  CHECK(sde_steps(mix.shape(plan, 100)) == std::vector<int>{0, 3, 6, 9, 16, 17, 18, 19});
  const auto shaped = mix.shape(plan, 5);
  CHECK(shaped.branching == plan.branching);
  CHECK(shaped.steps == plan.steps);
  CHECK_NOTHROW(validate(shaped));
  // every 3, stride 2: iteration 7 -> w = 0 + 2 * 2 = 4.
  CHECK(sde_window{.width = 4, .every = 3, .stride = 2}.window(20, 7) == step_window{4, 8});
  CHECK(sde_window{.width = 4, .start = 3, .stride = 0}.window(20, 1000) == step_window{3, 7});
}

TEST_CASE("sde_window: doc example mask on a shaped small tree") {
  const sde_window mix{.width = 1, .start = 1};
  const auto plan = mix.shape(split_schedule{.split_steps = {0, 2}, .branching = {2}}(4), 0);
  CHECK(plan.kinds == std::vector<edge_kind>{edge_kind::sde, edge_kind::sde, edge_kind::sde, edge_kind::ode});
  const rollout_tree tree(plan, numbered_trees(1));
  CHECK(mix(tree, {}) == edge_mask{0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0});
  sde_window window_only = mix;
  window_only.train_splits = false;
  CHECK(window_only(tree, {}) == edge_mask{0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0});
  // At iteration 2 the window is [3, 4) but edge depth 3 is ODE in this tree: only splits are trained.
  CHECK(mix(tree, ctx{.iteration = 2}) == edge_mask{0, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0});
}

TEST_CASE("sde_window: MixGRPO-Flash's ODE stride and solver (doc example)") {
  const auto plan = split_schedule::dense()(20);
  const auto flash = sde_window{.ode_stride = 2, .solver = ode_solver::dpm_solver_2m}.shape(plan, 0);
  const auto steps_of = [&](edge_kind kind) {
    std::vector<int> steps;
    for (int s = 0; s < flash.steps; ++s)
      if (flash.kinds[static_cast<std::size_t>(s)] == kind) steps.push_back(s);
    return steps;
  };
  CHECK(steps_of(edge_kind::sde) == std::vector<int>{0, 1, 2, 3, 6, 9});
  CHECK(steps_of(edge_kind::ode) == std::vector<int>{4, 7, 10, 12, 14, 16, 18});
  CHECK(steps_of(edge_kind::skip) == std::vector<int>{5, 8, 11, 13, 15, 17, 19});
  CHECK(flash.ode == ode_solver::dpm_solver_2m);
  CHECK(flash.evaluations() == 111);
  CHECK(flash.ode_target(4) == 6);
  CHECK(flash.ode_target(18) == 20);
  CHECK_NOTHROW(validate(flash));
  // Skip edges are never trained: the mask of the flash tree equals branch-mix's.
  const rollout_tree flash_tree(flash, numbered_trees(1)), mix_tree(sde_window{}.shape(plan, 0), numbered_trees(1));
  const edge_mask mask = sde_window{.ode_stride = 2}(flash_tree, {});
  CHECK(mask == sde_window{}(mix_tree, {}));
  // The defaults leave branch-mix's plan as it was: Euler, no skip step.
  CHECK(sde_window{}.shape(plan, 0).ode == ode_solver::euler);
  CHECK(sde_window{}.shape(plan, 0).evaluations() == 203);
}

TEST_CASE("sde_window: a multistep solver on a topology it cannot serve") {
  // The dense tree serves ode_stride 4 at every window position, also where the window leaves ODE runs of 3.
  for (int iteration = 0; iteration < 20; ++iteration)
    CHECK_NOTHROW(
        sde_window{.ode_stride = 4, .solver = ode_solver::dpm_solver_2m}.shape(split_schedule::dense()(20), iteration));
  // Splits at every step leave no ODE step at all; splits every second step leave ODE runs of one step.
  const auto every_step = split_schedule{.split_steps = {0, 1, 2, 3}, .branching = {2}}(4);
  CHECK_THROWS_WITH((sde_window{.width = 1, .solver = ode_solver::dpm_solver_2m}.shape(every_step, 0)),
                    "sde_window solver dpm_solver_2m cannot serve this topology: its longest stretch of steps without "
                    "a split is 0, a second-order step at ode_stride 1 needs 2");
  const auto every_other = split_schedule{.split_steps = {0, 2, 4}, .branching = {2}}(6);
  CHECK_THROWS_WITH((sde_window{.width = 1, .ode_stride = 2}.shape(every_other, 0)),
                    "sde_window ode_stride 2 cannot serve this topology: it has no two steps in a row without a "
                    "split");
  CHECK_THROWS_WITH((sde_window{.ode_stride = 0}.shape(split_schedule::dense()(20), 0)),
                    "sde_window ode_stride 0 is below 1");
  // A stretch of 3 serves stride 2 (evaluated at its 1st and 3rd step); stride 3 would need 4. The window's
  // position does not matter: where it leaves a shorter run, that run is only integrated at a lower order.
  const auto short_runs = split_schedule{.split_steps = {0, 4}, .branching = {2}}(8);
  CHECK_NOTHROW(sde_window{.width = 1, .ode_stride = 2, .solver = ode_solver::dpm_solver_2m}.shape(short_runs, 0));
  CHECK_THROWS_AS((sde_window{.width = 1, .ode_stride = 3, .solver = ode_solver::dpm_solver_2m}.shape(short_runs, 0)),
                  invalid_input);
}

TEST_CASE("sde_window rejects bad parameters") {
  const auto plan = split_schedule::dense()(20);
  CHECK_THROWS_AS((sde_window{.width = 0}.shape(plan, 0)), invalid_input);
  CHECK_THROWS_AS((sde_window{.width = 21}.shape(plan, 0)), invalid_input);
  CHECK_THROWS_AS((sde_window{.every = 0}.shape(plan, 0)), invalid_input);
  CHECK_THROWS_AS((sde_window{.stride = -1}.shape(plan, 0)), invalid_input);
  CHECK_THROWS_AS((sde_window{.start = -1}.shape(plan, 0)), invalid_input);
  CHECK_THROWS_WITH((sde_window{}.shape(plan, -3)), "sde_window iteration -3 is negative");
}

TEST_CASE("all_of intersects masks, prune_all builds it") {
  const auto tree = small_tree();
  const std::vector<double> rewards = {0.1, 0.5, 0.9, 0.3};
  const prune_context context = ctx{.leaf_rewards = rewards};
  CHECK(extreme{}(tree, context) == edge_mask{0, 1, 1, 1, 1, 1, 0, 1, 0, 1, 0, 1, 0});
  CHECK(depth_window{.depths = {0}}(tree, context) == edge_mask{0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  const auto both = prune_all(extreme{}, depth_window{.depths = {0}});
  CHECK(both(tree, context) == edge_mask{0, 0, 0, 1, 1, 1, 0, 1, 0, 1, 0, 1, 0});
  const all_of<extreme, depth_window> same{{extreme{}, depth_window{.depths = {0}}}};
  CHECK(same == both);
  const all_of deduced{std::tuple{extreme{}}};
  CHECK(deduced(tree, context) == extreme{}(tree, context));
  // Intersecting with the complement keeps nothing.
  const auto none = prune_all(depth_window{.depths = {1}}, depth_window{.depths = {1}, .keep_window = true});
  CHECK(kept(none(tree, context)) == 0);
}

TEST_CASE("all_of shapes with its shaping members in order; shape_plan") {
  const auto plan = split_schedule::dense()(20);
  const auto mixed = prune_all(depth_window{}, sde_window{.width = 4});
  CHECK(mixed.shape(plan, 5) == sde_window{.width = 4}.shape(plan, 5));
  // Two shapers: the second sees the first's output; windows [0, 4) then [8, 12) -> the second wins.
  const auto twice = prune_all(sde_window{.width = 4}, sde_window{.width = 4, .start = 8});
  CHECK(twice.shape(plan, 0) == sde_window{.width = 4, .start = 8}.shape(plan, 0));
  CHECK(shape_plan(extreme{}, plan, 7) == plan);
  CHECK(shape_plan(sde_window{.width = 1}, plan, 0) == sde_window{.width = 1}.shape(plan, 0));
  CHECK(shape_plan(mixed, plan, 3) == mixed.shape(plan, 3));
}

TEST_CASE("active_for switches off at fraction * total_iterations") {
  const auto tree = small_tree();
  std::vector<double> fused(13, 0.0);
  fused[6] = 1.0;
  const active_for half{parent_top_k{}, 0.5};
  const auto pruned = parent_top_k{}(tree, ctx{.fused = fused});
  REQUIRE(pruned != all_edges(tree));
  // total 10: 0.5 * 10 = 5, active at 0..4.
  CHECK(half(tree, ctx{.iteration = 4, .total_iterations = 10, .fused = fused}) == pruned);
  CHECK(half(tree, ctx{.iteration = 5, .total_iterations = 10, .fused = fused}) == all_edges(tree));
  CHECK(half(tree, ctx{.iteration = 9, .total_iterations = 10, .fused = fused}) == all_edges(tree));
  // total 7: 3.5 -> active at 0..3.
  CHECK(half(tree, ctx{.iteration = 3, .total_iterations = 7, .fused = fused}) == pruned);
  CHECK(half(tree, ctx{.iteration = 4, .total_iterations = 7, .fused = fused}) == all_edges(tree));
  const active_for never{parent_top_k{}, 0.0};
  CHECK(never(tree, ctx{.iteration = 0, .total_iterations = 10, .fused = fused}) == all_edges(tree));
  const active_for always{parent_top_k{}};
  CHECK(always(tree, ctx{.iteration = 9, .total_iterations = 10, .fused = fused}) == pruned);
  CHECK_THROWS_AS(((active_for{parent_top_k{}, 1.5})(tree, ctx{.fused = fused})), invalid_input);
  CHECK_THROWS_AS(((active_for{parent_top_k{}, std::numeric_limits<double>::quiet_NaN()})(tree, ctx{.fused = fused})),
                  invalid_input);
  CHECK_THROWS_AS((half(tree, ctx{.total_iterations = 0, .fused = fused})), invalid_input);
}

TEST_CASE("active_for forwards shape; after the cutoff ODE edges stay untrained") {
  const sde_window mix{.width = 1, .start = 1};
  const active_for early{mix, 0.5};
  const auto base = split_schedule{.split_steps = {0, 2}, .branching = {2}}(4);
  CHECK(early.shape(base, 0) == mix.shape(base, 0));
  CHECK(early.shape(base, 99) == mix.shape(base, 99));
  const rollout_tree tree(early.shape(base, 0), numbered_trees(1));
  CHECK(early(tree, ctx{.iteration = 0, .total_iterations = 2}) == mix(tree, {}));
  // Cutoff: every SDE edge; depth 3 is ODE so nodes 9..12 stay 0.
  CHECK(early(tree, ctx{.iteration = 1, .total_iterations = 2}) == edge_mask{0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0});
}
