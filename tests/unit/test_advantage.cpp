#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "branchgrpo/advantage.hpp"
#include "branchgrpo/fusion.hpp"
#include "branchgrpo/topology.hpp"

using namespace branchgrpo;

namespace {

// split_schedule{{0, 1}, {2}} over 2 steps: root 0; 1, 2 at depth 1; leaves 3, 4 (under 1), 5, 6 (under 2).
// A second tree holds nodes 7..13 the same way (root 7; 8, 9; leaves 10, 11 under 8, 12, 13 under 9).
rollout_tree binary_tree(std::vector<tree_info> trees = numbered_trees(1)) {
  return rollout_tree(split_schedule{.split_steps = {0, 1}, .branching = {2}}(2), std::move(trees));
}

void check_values(const std::vector<double>& actual, const std::vector<double>& expected, double margin = 1e-5) {
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("node " << i);
    CHECK(actual[i] == Approx(expected[i]).epsilon(0).margin(margin));
  }
}

const std::vector<double> leaves_a = {1, 3, 2, 6};  // fused {3, 2, 4, 1, 3, 2, 6}
const std::vector<double> leaves_b = {0, 2, 4, 6};  // fused {3, 1, 5, 0, 2, 4, 6}
const std::vector<double> fused_a = {3, 2, 4, 1, 3, 2, 6};
const std::vector<double> two_trees_leaf = {1, 3, 2, 6, 0, 2, 4, 6};
const std::vector<double> two_trees_fused = {3, 2, 4, 1, 3, 2, 6, 3, 1, 5, 0, 2, 4, 6};

}  // namespace

// ---- depth_wise -------------------------------------------------------------------------------------------

TEST_CASE("depth_wise: doc example, per tree") {
  const rollout_tree tree = binary_tree();
  REQUIRE(uniform_mean{}(tree, leaves_a) == fused_a);
  // depth 1: {2, 4}, mu 3, sigma sqrt((1 + 1) / 1) = 1.41421 -> -+1 / 1.41421 = -+0.70711.
  // depth 2: {1, 3, 2, 6}, mu 3, deviations -2, 0, -1, 3, sigma sqrt(14 / 3) = 2.16025
  //   -> -0.92582, 0, -0.46291, 1.38873. Root alone at depth 0 -> 0.
  check_values(depth_wise{}(tree, {.leaf = leaves_a, .fused = fused_a}),
               {0, -0.70711, 0.70711, -0.92582, 0, -0.46291, 1.38873});
}

TEST_CASE("depth_wise: a depth of two nodes gives -+0.7071 whatever the gap") {
  const rollout_tree tree = binary_tree();
  for (const double gap : {1e-3, 1.0, 1000.0}) {
    INFO("gap " << gap);
    // depth 1: {2, 2 + gap}: mu 2 + gap / 2, sigma gap / sqrt(2) -> -+(gap / 2) / (gap / sqrt 2) = -+1 / sqrt 2.
    const std::vector<double> fused = {0, 2, 2 + gap, 1, 3, 2, 6};
    const auto advantages = depth_wise{}(tree, {.leaf = leaves_a, .fused = fused});
    CHECK(advantages[1] == Approx(-std::sqrt(0.5)).margin(1e-5));
    CHECK(advantages[2] == Approx(std::sqrt(0.5)).margin(1e-5));
  }
}

TEST_CASE("depth_wise: 0 for a depth of one node and below min_std") {
  // split_schedule{{1}, {2}} over 2 steps: root 0 -> 1 (alone at depth 1) -> leaves 2, 3.
  const rollout_tree chain(split_schedule{.split_steps = {1}, .branching = {2}}(2), numbered_trees(1));
  // depth 2 {4, 6}: mu 5, sigma sqrt(2) -> -+1 / sqrt(2); node 1 alone at depth 1 -> 0 whatever its reward.
  check_values(depth_wise{}(chain, {.leaf = {}, .fused = std::vector<double>{5, 5, 4, 6}}), {0, 0, -0.70711, 0.70711});
  const rollout_tree tree = binary_tree();
  // depth 1 flat {2, 2}: sigma 0 < 1e-6 -> 0; depth 2 {1, 1 + 1e-7, 1, 1}: sigma 5e-8 < 1e-6 -> 0.
  const std::vector<double> flat = {0, 2, 2, 1, 1 + 1e-7, 1, 1};
  CHECK(depth_wise{}(tree, {.leaf = {}, .fused = flat}) == std::vector<double>(7, 0.0));
  // With min_std 0 the tiny spread is blown up instead: (1e-7 - 2.5e-8) / (5e-8 + 1e-8) = 1.25.
  CHECK(depth_wise{.min_std = 0.0}(tree, {.leaf = {}, .fused = flat})[4] == Approx(1.25).margin(1e-6));
}

TEST_CASE("depth_wise: per_tree, per_batch, pooled and leaf_scaled on a 2-tree forest") {
  const rollout_tree forest = binary_tree(numbered_trees(2));
  REQUIRE(uniform_mean{}(forest, two_trees_leaf) == two_trees_fused);
  const reward_view rewards{.leaf = two_trees_leaf, .fused = two_trees_fused};
  // per_tree, tree 1: depth 1 {1, 5} -> -+0.70711; depth 2 {0, 2, 4, 6}, mu 3, sigma sqrt(20 / 3) = 2.58199
  //   -> -1.16190, -0.38730, 0.38730, 1.16190.
  check_values(depth_wise{}(forest, rewards), {0, -0.70711, 0.70711, -0.92582, 0, -0.46291, 1.38873,  //
                                               0, -0.70711, 0.70711, -1.16190, -0.38730, 0.38730, 1.16190});
  // per_batch: depth 1 {2, 4, 1, 5}, mu 3, sigma sqrt(10 / 3) = 1.82574 -> -0.54772, 0.54772, -1.09545, 1.09545;
  //   depth 2 {1, 3, 2, 6, 0, 2, 4, 6}, mu 3, sigma sqrt(34 / 7) = 2.20389
  //   -> -0.90749, 0, -0.45374, 1.36123, -1.36123, -0.45374, 0.45374, 1.36123. Roots 0 (no edge).
  check_values(depth_wise{.scope = normalization_scope::per_batch}(forest, rewards),
               {0, -0.54772, 0.54772, -0.90749, 0, -0.45374, 1.36123,  //
                0, -1.09545, 1.09545, -1.36123, -0.45374, 0.45374, 1.36123});
  // pooled: each tree centred on its own mean, the within-tree variance pooled. Depth 1: tree 0 {2, 4} (mu 3, +-1),
  //   tree 1 {1, 5} (mu 3, +-2), sigma^2 = (1 + 1 + 4 + 4) / (2 * 1) = 5 -> -+0.44721, -+0.89443 (the wider split
  //   gets the larger advantage; per_tree gives both -+0.70711); depth 2: squares 14 + 20, sigma^2 = 34 / (2 * 3),
  //   sigma 2.38048 -> -0.84017, 0, -0.42008, 1.26025 and -1.26025, -0.42008, 0.42008, 1.26025.
  check_values(depth_wise{.scope = normalization_scope::pooled}(forest, rewards),
               {0, -0.44721, 0.44721, -0.84017, 0, -0.42008, 1.26025,  //
                0, -0.89443, 0.89443, -1.26025, -0.42008, 0.42008, 1.26025});
  // leaf_scaled: each tree centred on its own mean at every depth, divided by the std of its own leaves: tree 0's
  //   {1, 3, 2, 6} sqrt(14 / 3) = 2.16025, tree 1's {0, 2, 4, 6} sqrt(20 / 3) = 2.58199. Depth 1 -> -+1 / 2.16025 =
  //   -+0.46291 and -+2 / 2.58199 = -+0.77460; the leaves' depth is per_tree's.
  check_values(depth_wise{.scope = normalization_scope::leaf_scaled}(forest, rewards),
               {0, -0.46291, 0.46291, -0.92582, 0, -0.46291, 1.38873,  //
                0, -0.77460, 0.77460, -1.16190, -0.38730, 0.38730, 1.16190});
}

TEST_CASE("depth_wise: roots stay 0 even with several roots per tree") {
  // sequential{3, no shared root} over 2 steps: roots 0, 1, 2 -> 3, 4, 5 -> leaves 6, 7, 8.
  const rollout_tree chains(sequential{.group_size = 3, .shared_root = false}(2), numbered_trees(1));
  // depth 1 and 2: {1, 2, 3}, mu 2, sigma 1 -> -1, 0, 1 (over 1 + 1e-8).
  const auto advantages = depth_wise{}(chains, {.leaf = {}, .fused = std::vector<double>{1, 2, 3, 1, 2, 3, 1, 2, 3}});
  check_values(advantages, {0, 0, 0, -1, 0, 1, -1, 0, 1});
}

TEST_CASE("depth_wise: sequential topology") {
  // sequential{4} over 2 steps: root 0 -> 1..4 -> leaves 5..8; uniform fused = {2.5, 1, 2, 3, 4, 1, 2, 3, 4}.
  const rollout_tree tree(sequential{.group_size = 4}(2), numbered_trees(1));
  const std::vector<double> leaf = {1, 2, 3, 4};
  const auto fused = uniform_mean{}(tree, leaf);
  // depths 1 and 2: {1, 2, 3, 4}, mu 2.5, sigma sqrt(5 / 3) = 1.29099 -> -1.16190, -0.38730, 0.38730, 1.16190.
  check_values(depth_wise{}(tree, {.leaf = leaf, .fused = fused}),
               {0, -1.16190, -0.38730, 0.38730, 1.16190, -1.16190, -0.38730, 0.38730, 1.16190});
}

TEST_CASE("depth_wise: rejects bad input") {
  const rollout_tree tree = binary_tree();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_MATCHES((depth_wise{}(tree, {.leaf = {}, .fused = std::vector<double>{1, 2, 3}})), invalid_input,
                       Catch::Message("got 3 fused rewards for 7 nodes"));
  CHECK_THROWS_MATCHES((depth_wise{}(tree, {.leaf = {}, .fused = std::vector<double>{3, 2, 4, 1, nan, 2, 6}})),
                       invalid_input, Catch::Message("fused reward of node 4 is nan"));
  // Also at a depth that is never normalized (one node) and at the root.
  const rollout_tree chain(split_schedule{.split_steps = {1}, .branching = {2}}(2), numbered_trees(1));
  CHECK_THROWS_MATCHES((depth_wise{}(chain, {.leaf = {}, .fused = std::vector<double>{5, nan, 4, 6}})), invalid_input,
                       Catch::Message("fused reward of node 1 is nan"));
  CHECK_THROWS_MATCHES((depth_wise{.scope = normalization_scope::per_batch}(
                           chain, {.leaf = {}, .fused = std::vector<double>{nan, 5, 4, 6}})),
                       invalid_input, Catch::Message("fused reward of node 0 is nan"));
  CHECK_THROWS_MATCHES((depth_wise{}(tree, {.leaf = {}, .fused = std::vector<double>{3, 2, 4, 1e300, -1e300, 2, 6}})),
                       invalid_input, Catch::Message("depth_wise: the fused rewards at depth 2 overflow when squared"));
  CHECK_THROWS_MATCHES((depth_wise{.epsilon = -1.0}(tree, {.leaf = {}, .fused = fused_a})), invalid_input,
                       Catch::Message("depth_wise epsilon -1 is not a finite value >= 0"));
  CHECK_THROWS_MATCHES((depth_wise{.min_std = nan}(tree, {.leaf = {}, .fused = fused_a})), invalid_input,
                       Catch::Message("depth_wise min_std nan is not a finite value >= 0"));
  CHECK_THROWS_MATCHES((depth_wise{.epsilon = 0.0, .min_std = 0.0}(tree, {.leaf = {}, .fused = fused_a})),
                       invalid_input, Catch::Message("depth_wise needs epsilon > 0 or min_std > 0 (both are 0)"));
}

namespace {

// Eq. 4 node by node, per tree: the arithmetic depth_wise documents (deviations from the group's first
// value, one pass of two sums, unbiased std), written without level ranges.
std::vector<double> depth_wise_reference(const rollout_tree& tree, const std::vector<double>& fused, double epsilon,
                                         double min_std) {
  std::vector<double> out(fused.size(), 0.0);
  for (std::int32_t t = 0; t < tree.tree_count(); ++t)
    for (int d = 1; d <= tree.steps(); ++d) {
      std::vector<std::int32_t> group;
      for (std::int32_t n = 0; n < tree.node_count(); ++n)
        if (tree.tree(n) == t && tree.depth(n) == d) group.push_back(n);
      if (group.size() < 2) continue;
      const double shift = fused[static_cast<std::size_t>(group.front())];
      double sum = 0.0;
      double squares = 0.0;
      for (const std::int32_t n : group) {
        const double deviation = fused[static_cast<std::size_t>(n)] - shift;
        sum += deviation;
        squares += deviation * deviation;
      }
      const auto m = static_cast<double>(group.size());
      const double sigma = std::sqrt(std::max(0.0, (squares - sum * sum / m) / (m - 1.0)));
      if (sigma < min_std) continue;
      const double mean = shift + sum / m;
      const double scale = 1.0 / (sigma + epsilon);
      for (const std::int32_t n : group)
        out[static_cast<std::size_t>(n)] = (fused[static_cast<std::size_t>(n)] - mean) * scale;
    }
  return out;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

}  // namespace

TEST_CASE("depth_wise: the span overload equals the vector overload and Eq. 4 node by node, bit for bit") {
  // Forests of 1, 5 and 8 trees (trees are normalized four at a time), binary and ternary splits, several
  // roots; rewards with ties, and a flat forest (every depth below min_std).
  const std::vector<tree_plan> plans = {split_schedule::dense()(20),
                                        split_schedule{.split_steps = {0, 2, 4}, .branching = {3}}(6),
                                        sequential{.group_size = 3, .shared_root = false}(4)};
  for (const tree_plan& plan : plans)
    for (const std::int32_t trees : {1, 5, 8})
      for (const bool flat : {false, true}) {
        const rollout_tree tree(plan, numbered_trees(trees));
        std::vector<double> leaf(static_cast<std::size_t>(tree.leaf_count()));
        for (std::size_t i = 0; i < leaf.size(); ++i)
          leaf[i] = flat ? 0.25 : static_cast<double>((i * 13) % 17) / 7.0 - 1.0;
        const std::vector<double> fused = uniform_mean{}(tree, leaf);
        for (const depth_wise normalizer : {depth_wise{}, depth_wise{.epsilon = 0.0, .min_std = 0.3},
                                            depth_wise{.scope = normalization_scope::per_batch}}) {
          INFO("trees " << trees << ", leaves " << tree.leaf_count() << ", flat " << flat << ", scope "
                        << to_string(normalizer.scope) << ", min_std " << normalizer.min_std);
          const std::vector<double> expected = normalizer(tree, {.leaf = leaf, .fused = fused});
          if (normalizer.scope == normalization_scope::per_tree)
            CHECK(same_bits(expected, depth_wise_reference(tree, fused, normalizer.epsilon, normalizer.min_std)));
          std::vector<double> reused(fused.size(), std::numeric_limits<double>::quiet_NaN());
          for (int round = 0; round < 2; ++round) {
            normalizer(tree, {.leaf = leaf, .fused = fused}, reused);
            CHECK(same_bits(reused, expected));
          }
        }
      }
}

TEST_CASE("depth_wise: the span overload rejects what the vector overload rejects, and a wrong buffer size") {
  const rollout_tree tree = binary_tree(numbered_trees(5));  // 35 nodes: tree 4 is normalized on its own
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> fused;
  for (int t = 0; t < 5; ++t) fused.insert(fused.end(), fused_a.begin(), fused_a.end());
  std::vector<double> out(fused.size());
  CHECK_THROWS_MATCHES((depth_wise{}(tree, {.leaf = {}, .fused = fused}, std::span<double>(out).first(34))),
                       invalid_input, Catch::Message("got room for 34 advantages for 35 nodes"));
  for (const std::size_t bad : {std::size_t{0}, std::size_t{12}, std::size_t{30}, std::size_t{33}}) {
    std::vector<double> with_nan = fused;
    with_nan[bad] = nan;
    const std::string message = "fused reward of node " + std::to_string(bad) + " is nan";
    CHECK_THROWS_MATCHES((depth_wise{}(tree, {.leaf = {}, .fused = with_nan}, out)), invalid_input,
                         Catch::Message(message));
    CHECK_THROWS_MATCHES((depth_wise{}(tree, {.leaf = {}, .fused = with_nan})), invalid_input, Catch::Message(message));
  }
  // Depth 2 of tree 4 overflows, and a NaN at depth 1 of tree 4: the lower depth is named first.
  std::vector<double> both = fused;
  both[31] = 1e300, both[32] = -1e300, both[30] = nan;
  CHECK_THROWS_MATCHES((depth_wise{}(tree, {.leaf = {}, .fused = both}, out)), invalid_input,
                       Catch::Message("fused reward of node 30 is nan"));
  both[30] = 4;
  CHECK_THROWS_MATCHES((depth_wise{}(tree, {.leaf = {}, .fused = both}, out)), invalid_input,
                       Catch::Message("depth_wise: the fused rewards at depth 2 overflow when squared"));
}

// ---- leaf_group -------------------------------------------------------------------------------------------

TEST_CASE("leaf_group: doc example") {
  const rollout_tree tree = binary_tree();
  // leaves {1, 3, 2, 6}: mu 3, sigma sqrt(14 / 3) = 2.16025 -> -0.92582, 0, -0.46291, 1.38873;
  // edge 1: mean(-0.92582, 0) = -0.46291; edge 2: mean(-0.46291, 1.38873) = 0.46291; root 0.
  check_values(leaf_group{}(tree, {.leaf = leaves_a, .fused = {}}),
               {0, -0.46291, 0.46291, -0.92582, 0, -0.46291, 1.38873});
}

TEST_CASE("leaf_group: trees sharing a prompt form one group") {
  const rollout_tree forest = binary_tree(std::vector<tree_info>{{.key = 0, .prompt = 7}, {.key = 1, .prompt = 7}});
  // 8 leaves {1, 3, 2, 6, 0, 2, 4, 6}: mu 3, sigma s = sqrt(34 / 7) = 2.20389; leaf advantages d / s:
  //   -2/s, 0, -1/s, 3/s | -3/s, -1/s, 1/s, 3/s = -0.90749, 0, -0.45374, 1.36123 | -1.36123, -0.45374, 0.45374, 1.36123
  // edges 1, 2: -1/s, 1/s = -0.45374, 0.45374; edges 8, 9: -2/s, 2/s = -0.90749, 0.90749.
  check_values(leaf_group{}(forest, {.leaf = two_trees_leaf, .fused = {}}),
               {0, -0.45374, 0.45374, -0.90749, 0, -0.45374, 1.36123,  //
                0, -0.90749, 0.90749, -1.36123, -0.45374, 0.45374, 1.36123});
  // Distinct prompts: each tree alone. Tree 1: sigma sqrt(20 / 3) = 2.58199 -> -1.16190, -0.38730, 0.38730,
  //   1.16190; edges 8, 9: -+0.77460.
  const rollout_tree apart = binary_tree(numbered_trees(2));
  check_values(leaf_group{}(apart, {.leaf = two_trees_leaf, .fused = {}}),
               {0, -0.46291, 0.46291, -0.92582, 0, -0.46291, 1.38873,  //
                0, -0.77460, 0.77460, -1.16190, -0.38730, 0.38730, 1.16190});
}

TEST_CASE("leaf_group: groups need not be contiguous") {
  // Prompts {7, 8, 7}: trees 0 and 2 form one group, tree 1 is alone.
  const rollout_tree forest =
      binary_tree(std::vector<tree_info>{{.key = 0, .prompt = 7}, {.key = 1, .prompt = 8}, {.key = 2, .prompt = 7}});
  const std::vector<double> leaf = {1, 3, 2, 6, 9, 9, 9, 9, 0, 2, 4, 6};
  const auto advantages = leaf_group{}(forest, {.leaf = leaf, .fused = {}});
  // Trees 0 and 2 as in the shared-prompt case; tree 1 flat (sigma 0 < min_std) -> 0.
  check_values(std::vector<double>(advantages.begin(), advantages.begin() + 7),
               {0, -0.45374, 0.45374, -0.90749, 0, -0.45374, 1.36123});
  check_values(std::vector<double>(advantages.begin() + 7, advantages.begin() + 14), std::vector<double>(7, 0.0));
  check_values(std::vector<double>(advantages.begin() + 14, advantages.end()),
               {0, -0.90749, 0.90749, -1.36123, -0.45374, 0.45374, 1.36123});
}

TEST_CASE("leaf_group: sequential topology gives every edge of a chain its leaf's advantage") {
  // root 0 -> 1..4 -> leaves 5..8; leaves {1, 2, 3, 4}: mu 2.5, sigma sqrt(5 / 3) -> -1.16190, -0.38730, ...
  const rollout_tree tree(sequential{.group_size = 4}(2), numbered_trees(1));
  check_values(leaf_group{}(tree, {.leaf = std::vector<double>{1, 2, 3, 4}, .fused = {}}),
               {0, -1.16190, -0.38730, 0.38730, 1.16190, -1.16190, -0.38730, 0.38730, 1.16190});
  // One leaf per group: no spread to measure -> 0.
  const rollout_tree single(sequential{.group_size = 1}(2), numbered_trees(1));
  CHECK(leaf_group{}(single, {.leaf = std::vector<double>{4}, .fused = {}}) == std::vector<double>{0, 0, 0});
}

TEST_CASE("leaf_group: rejects bad input") {
  const rollout_tree tree = binary_tree();
  const double inf = std::numeric_limits<double>::infinity();
  CHECK_THROWS_MATCHES((leaf_group{}(tree, {.leaf = std::vector<double>{1, 2}, .fused = {}})), invalid_input,
                       Catch::Message("got 2 leaf rewards for 4 leaves"));
  CHECK_THROWS_MATCHES((leaf_group{}(tree, {.leaf = std::vector<double>{1, inf, 2, 3}, .fused = {}})), invalid_input,
                       Catch::Message("leaf reward at leaf position 1 (node 4) is inf"));
  CHECK_THROWS_MATCHES((leaf_group{.epsilon = inf}(tree, {.leaf = leaves_a, .fused = {}})), invalid_input,
                       Catch::Message("leaf_group epsilon inf is not a finite value >= 0"));
}

// ---- per_prompt_running -----------------------------------------------------------------------------------

TEST_CASE("per_prompt_running: doc example over two calls") {
  const rollout_tree tree = binary_tree();
  per_prompt_running tracker;
  // Call 1: buffer {1, 3, 2, 6}, mean 3, population std sqrt(14 / 4) = 1.87083
  //   -> (r - 3) / 1.87093 = -1.06899, 0, -0.53449, 1.60348; edges 1, 2: -+0.53449.
  check_values(tracker(tree, {.leaf = leaves_a, .fused = {}}), {0, -0.53449, 0.53449, -1.06899, 0, -0.53449, 1.60348});
  CHECK(tracker.buffers.at(0) == std::deque<double>{1, 3, 2, 6});
  // Call 2: buffer {1, 3, 2, 6, 5, 5, 5, 5}, mean 4, deviations -3, -1, -2, 2, 1, 1, 1, 1 (squares 22),
  //   std sqrt(22 / 8) = 1.65831 -> (5 - 4) / 1.65841 = 0.60299 on every leaf and edge.
  const std::vector<double> fives = {5, 5, 5, 5};
  check_values(tracker(tree, {.leaf = fives, .fused = {}}), {0, 0.60299, 0.60299, 0.60299, 0.60299, 0.60299, 0.60299});
}

TEST_CASE("per_prompt_running: history bounds the buffer, clear() forgets") {
  const rollout_tree tree = binary_tree();
  const std::vector<double> fives = {5, 5, 5, 5};
  // history 6: call 2 keeps {2, 6, 5, 5, 5, 5}, mean 28 / 6 = 4.66667, std 1.24722
  //   -> (5 - 4.66667) / 1.24732 = 0.26724.
  per_prompt_running six{.history = 6};
  six(tree, {.leaf = leaves_a, .fused = {}});
  CHECK(six(tree, {.leaf = fives, .fused = {}})[3] == Approx(0.26724).margin(1e-5));
  CHECK(six.buffers.at(0) == std::deque<double>{2, 6, 5, 5, 5, 5});
  // history 4: call 2 sees only {5, 5, 5, 5}: std 0 -> 0 / 1e-4 = 0.
  per_prompt_running four{.history = 4};
  four(tree, {.leaf = leaves_a, .fused = {}});
  CHECK(four(tree, {.leaf = fives, .fused = {}}) == std::vector<double>(7, 0.0));
  // clear(): the next call starts afresh, as call 1 of the doc example.
  per_prompt_running tracker;
  tracker(tree, {.leaf = fives, .fused = {}});
  tracker.clear();
  CHECK(tracker.buffers.empty());
  CHECK(tracker(tree, {.leaf = leaves_a, .fused = {}})[3] == Approx(-1.06899).margin(1e-5));
}

TEST_CASE("per_prompt_running: prompts keep separate buffers, shared prompts pool") {
  // Two trees of one prompt: one buffer of 8 leaves {1, 3, 2, 6, 0, 2, 4, 6}, mean 3, population std
  // sqrt(34 / 8) = 2.06155 -> leaf 3: -2 / 2.06165 = -0.97009; leaf 13: 3 / 2.06165 = 1.45514.
  const rollout_tree shared = binary_tree(std::vector<tree_info>{{.key = 0, .prompt = 7}, {.key = 1, .prompt = 7}});
  per_prompt_running tracker;
  const auto pooled = tracker(shared, {.leaf = two_trees_leaf, .fused = {}});
  CHECK(pooled[3] == Approx(-0.97009).margin(1e-5));
  CHECK(pooled[13] == Approx(1.45514).margin(1e-5));
  CHECK(tracker.buffers.size() == 1);
  CHECK(tracker.buffers.at(7).size() == 8);
  // Distinct prompts 0 and 1: tree 1 alone has mean 3, std sqrt(20 / 4) = 2.23607 -> leaf 13: 3 / 2.23617 = 1.34158.
  const rollout_tree apart = binary_tree(numbered_trees(2));
  per_prompt_running separate;
  CHECK(separate(apart, {.leaf = two_trees_leaf, .fused = {}})[13] == Approx(1.34158).margin(1e-5));
  // A later call for prompt 1 only does not see prompt 0's buffer: {0, 2, 4, 6, 6, 6, 6, 6}, mean 4.5,
  // deviations -4.5, -2.5, -0.5, 1.5 x 5 (squares 20.25 + 6.25 + 0.25 + 11.25 = 38), std sqrt(38 / 8) = 2.17945
  //   -> (6 - 4.5) / 2.17955 = 0.68822.
  const rollout_tree prompt_one = binary_tree(std::vector<tree_info>{{.key = 0, .prompt = 1}});
  CHECK(separate(prompt_one, {.leaf = std::vector<double>{6, 6, 6, 6}, .fused = {}})[3] ==
        Approx(0.68822).margin(1e-5));
  CHECK(separate.buffers.at(0) == std::deque<double>{1, 3, 2, 6});
}

TEST_CASE("per_prompt_running: global_std divides by the std of the whole call") {
  // Prompts 0 and 1, leaves {1, 3, 2, 6 | 0, 2, 4, 6}: each prompt's mean is 3; the population std of all
  // 8 is sqrt(34 / 8) = 2.06155 -> leaf 3: -2 / 2.06165 = -0.97009; leaf 10: -3 / 2.06165 = -1.45514.
  const rollout_tree apart = binary_tree(numbered_trees(2));
  per_prompt_running tracker{.global_std = true};
  const auto advantages = tracker(apart, {.leaf = two_trees_leaf, .fused = {}});
  CHECK(advantages[3] == Approx(-0.97009).margin(1e-5));
  CHECK(advantages[10] == Approx(-1.45514).margin(1e-5));
}

TEST_CASE("per_prompt_running: sequential chains carry leaf advantages") {
  const rollout_tree tree(sequential{.group_size = 4}(2), numbered_trees(1));
  // leaves {1, 2, 3, 4}: mean 2.5, population std sqrt(5 / 4) = 1.11803
  //   -> -1.5 / 1.11813 = -1.34152, -0.5 / 1.11813 = -0.44717, ...
  per_prompt_running tracker;
  check_values(tracker(tree, {.leaf = std::vector<double>{1, 2, 3, 4}, .fused = {}}),
               {0, -1.34152, -0.44717, 0.44717, 1.34152, -1.34152, -0.44717, 0.44717, 1.34152});
}

TEST_CASE("per_prompt_running: rejects bad input and leaves its state unchanged") {
  const rollout_tree tree = binary_tree();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  per_prompt_running tracker;
  tracker(tree, {.leaf = leaves_a, .fused = {}});
  const per_prompt_running before = tracker;
  CHECK_THROWS_MATCHES((tracker(tree, {.leaf = std::vector<double>{5, 5, nan, 5}, .fused = {}})), invalid_input,
                       Catch::Message("leaf reward at leaf position 2 (node 5) is nan"));
  CHECK(tracker == before);
  tracker.history = 0;
  CHECK_THROWS_MATCHES((tracker(tree, {.leaf = leaves_a, .fused = {}})), invalid_input,
                       Catch::Message("per_prompt_running history 0 is below 1"));
  tracker.history = 64;
  tracker.epsilon = 0.0;
  CHECK_THROWS_MATCHES((tracker(tree, {.leaf = leaves_a, .fused = {}})), invalid_input,
                       Catch::Message("per_prompt_running epsilon 0 is not a finite value > 0"));
  tracker.epsilon = 1e-4;
  CHECK(tracker == before);
}

TEST_CASE("normalizers are copyable values; the tracker's state takes part in equality") {
  CHECK(depth_wise{} == depth_wise{});
  CHECK(depth_wise{.scope = normalization_scope::per_batch} != depth_wise{});
  CHECK(leaf_group{.epsilon = 1e-6} != leaf_group{});
  const rollout_tree tree = binary_tree();
  per_prompt_running tracker;
  per_prompt_running copy = tracker;
  CHECK(copy == tracker);
  tracker(tree, {.leaf = leaves_a, .fused = {}});
  CHECK(copy != tracker);
  copy = tracker;
  CHECK(copy == tracker);
  CHECK(std::string(to_string(normalization_scope::per_batch)) == "per_batch");
}

// ---- per_reward ----------------------------------------------------------------------------------------------

TEST_CASE("per_reward: the doc example, by hand") {
  const rollout_tree tree = binary_tree();
  const std::vector<leaf_component> parts = {{.name = "a", .weight = 1.0, .leaf = leaves_a},
                                             {.name = "b", .weight = 0.5, .leaf = leaves_b}};
  const std::vector<double> total = {1, 4, 4, 9};  // a + 0.5 b
  per_reward<uniform_mean, depth_wise> combined;
  // N(a) = {0, -+1/sqrt 2, -0.92582, 0, -0.46291, 1.38873}; N(b): depth 2 {0, 2, 4, 6}, mu 3, sigma
  // sqrt(20 / 3) = 2.58199 -> -+1.16190, -+0.38730. A = N(a) + 0.5 N(b).
  const double h = 1 / std::sqrt(2.0);
  check_values(combined(tree, {.leaf = total, .fused = {}, .components = parts}),
               {0, -1.5 * h, 1.5 * h, -0.92582 - 0.58095, -0.19365, -0.46291 + 0.19365, 1.38873 + 0.58095});
  CHECK(combined.parts.size() == 2);
  // Without parts: the plain stage, N(tree, {r, F(r)}) on the sum. Depth 2 of {1, 4, 4, 9}: mu 4.5, sigma
  // sqrt(33 / 3) = 3.31662 -> -1.05529, -0.15076, -0.15076, 1.35680.
  per_reward<uniform_mean, depth_wise> single;
  check_values(single(tree, {.leaf = total}), {0, -h, h, -1.05529, -0.15076, -0.15076, 1.35680});
  CHECK(single(tree, {.leaf = total}) == depth_wise{}(tree, {.leaf = total, .fused = uniform_mean{}(tree, total)}));
  // The parts keep their count.
  CHECK_THROWS_WITH(combined(tree, {.leaf = total}), "per_reward was set up for 2 reward parts, this call has 1");
  per_reward<uniform_mean, depth_wise> fresh;
  const std::vector<double> short_leaf = {1, 2};
  const std::vector<leaf_component> bad = {{.name = "short", .weight = 1, .leaf = short_leaf}};
  CHECK_THROWS_WITH(fresh(tree, {.leaf = total, .components = bad}),
                    "per_reward part 'short' has 2 leaf scores for 4 leaves");
}

TEST_CASE("per_reward: a stateful normalizer keeps one state per part, saved and restored") {
  const rollout_tree tree = binary_tree();
  const std::vector<leaf_component> parts = {{.name = "a", .weight = 1.0, .leaf = leaves_a},
                                             {.name = "b", .weight = 2.0, .leaf = leaves_b}};
  per_reward<uniform_mean, per_prompt_running> running;
  const std::vector<double> total = {1, 7, 10, 18};
  const std::vector<double> first = running(tree, {.leaf = total, .components = parts});
  // Each part's own tracker: a buffer {1, 3, 2, 6} (mean 3, std sqrt 3.5) and b {0, 2, 4, 6} (mean 3, std sqrt 5);
  // leaf 6: (6 - 3) / (sqrt 3.5 + 1e-4) + 2 (6 - 3) / (sqrt 5 + 1e-4).
  CHECK(first[6] == Approx(3 / (std::sqrt(3.5) + 1e-4) + 6 / (std::sqrt(5.0) + 1e-4)));
  CHECK(running.parts[0].buffers.at(0) == std::deque<double>{1, 3, 2, 6});
  CHECK(running.parts[1].buffers.at(0) == std::deque<double>{0, 2, 4, 6});
  const component_state saved = running.save_state();
  CHECK(saved.at("parts") == std::vector<double>{2});
  CHECK(saved.at("part.1.prompt.0") == std::vector<double>{0, 2, 4, 6});
  per_reward<uniform_mean, per_prompt_running> restored;
  restored.load_state(saved);
  CHECK(restored.parts == running.parts);
  CHECK(restored(tree, {.leaf = total, .components = parts}) == running(tree, {.leaf = total, .components = parts}));
  CHECK_THROWS_WITH(restored.load_state({{"part.0.prompt.0", {1}}}),
                    "per_reward state needs 'parts' = one whole count");
  CHECK_THROWS_WITH(restored.load_state({{"parts", {1}}, {"part.3.prompt.0", {1}}}),
                    "per_reward state key 'part.3.prompt.0' is not part.<index below 1>.<key>");
  static_assert(Stateful<per_reward<uniform_mean, per_prompt_running>>);
  static_assert(!Stateful<per_reward<uniform_mean, depth_wise>>);
  static_assert(Normalizer<per_reward<uniform_mean, depth_wise>>);
}
