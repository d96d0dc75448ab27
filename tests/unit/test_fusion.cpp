#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "branchgrpo/fusion.hpp"
#include "branchgrpo/topology.hpp"

using namespace branchgrpo;

namespace {

// split_schedule{{0, 1}, {2}} over 2 steps: root 0; 1, 2 at depth 1; leaves 3, 4 (under 1), 5, 6 (under 2).
rollout_tree binary_tree(std::vector<tree_info> trees = numbered_trees(1)) {
  return rollout_tree(split_schedule{.split_steps = {0, 1}, .branching = {2}}(2), std::move(trees));
}

// Log-probs of the edges into nodes 1, 2, ... (the root keeps 0).
void set_edge_log_probs(rollout_tree& tree, const std::vector<double>& edges) {
  const std::span<double> log_probs = tree.mutable_log_probs();
  for (std::size_t i = 0; i < edges.size(); ++i) log_probs[i + 1] = edges[i];
}

const double ln2 = std::log(2.0);
const double ln3 = std::log(3.0);
const std::vector<double> doc_rewards = {1, 3, 2, 6};
const std::vector<double> doc_log_probs = {0, -ln2, 0, -ln3, 0, 0};

void check_values(const std::vector<double>& actual, const std::vector<double>& expected, double margin = 1e-12) {
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("node " << i);
    CHECK(actual[i] == Approx(expected[i]).margin(margin));
  }
}

}  // namespace

TEST_CASE("uniform_mean: doc example, leaves keep their reward exactly") {
  const rollout_tree tree = binary_tree();
  const auto fused = uniform_mean{}(tree, doc_rewards);
  // root (1 + 3 + 2 + 6) / 4 = 3; node 1 (1 + 3) / 2 = 2; node 2 (2 + 6) / 2 = 4.
  CHECK(fused == std::vector<double>{3, 2, 4, 1, 3, 2, 6});
}

TEST_CASE("max_reward: doc example") {
  const rollout_tree tree = binary_tree();
  // root max(1, 3, 2, 6) = 6; node 1 max(1, 3) = 3; node 2 max(2, 6) = 6.
  CHECK(max_reward{}(tree, doc_rewards) == std::vector<double>{6, 3, 6, 1, 3, 2, 6});
}

TEST_CASE("path_softmax: doc example with beta 1") {
  rollout_tree tree = binary_tree();
  set_edge_log_probs(tree, doc_log_probs);
  // node 1: path log-probs to leaves 3, 4 are 0, -ln 3 -> weights 1 : 1/3 = 3/4, 1/4 -> 3/4 * 1 + 1/4 * 3 = 1.5.
  // node 2: 0, 0 -> 1/2, 1/2 -> 4.
  // root: 0 + 0, 0 - ln 3, -ln 2 + 0, -ln 2 + 0 -> 1, 1/3, 1/2, 1/2 (sum 7/3) -> 3/7, 1/7, 3/14, 3/14
  //   -> 3/7 + 3/7 + 6/14 + 18/14 = 18/7.
  check_values(path_softmax{}(tree, doc_rewards), {18.0 / 7.0, 1.5, 4, 1, 3, 2, 6});
}

TEST_CASE("path_softmax: beta 2 squares the path probabilities") {
  rollout_tree tree = binary_tree();
  set_edge_log_probs(tree, doc_log_probs);
  // node 1: 1 : 1/9 -> 9/10, 1/10 -> 0.9 + 0.3 = 1.2.
  // root: 1, 1/9, 1/4, 1/4 = 36, 4, 9, 9 over 58 -> (36 + 12 + 18 + 54) / 58 = 120 / 58 = 60 / 29.
  check_values(path_softmax{.beta = 2.0}(tree, doc_rewards), {60.0 / 29.0, 1.2, 4, 1, 3, 2, 6});
}

TEST_CASE("path_softmax: a negative beta favours the unlikely path") {
  rollout_tree tree = binary_tree();
  set_edge_log_probs(tree, doc_log_probs);
  // beta -1, node 1: weights exp(0) : exp(ln 3) = 1 : 3 -> 1/4 * 1 + 3/4 * 3 = 2.5.
  CHECK(path_softmax{.beta = -1.0}(tree, doc_rewards)[1] == Approx(2.5).margin(1e-12));
}

TEST_CASE("path_softmax: beta 0 equals uniform_mean bit for bit") {
  rollout_tree tree(split_schedule::dense()(20), numbered_trees(3));
  const std::span<double> log_probs = tree.mutable_log_probs();
  for (std::int32_t n = 0; n < tree.node_count(); ++n)
    if (!tree.is_root(n)) log_probs[static_cast<std::size_t>(n)] = -0.5 - 0.37 * std::sin(0.7 * n);
  std::vector<double> rewards(static_cast<std::size_t>(tree.leaf_count()));
  for (std::size_t i = 0; i < rewards.size(); ++i) rewards[i] = 0.3 + 0.1 * std::cos(1.3 * static_cast<double>(i));
  const auto uniform = uniform_mean{}(tree, rewards);
  CHECK(path_softmax{.beta = 0.0}(tree, rewards) == uniform);
  // beta 1 is not uniform on this tree (the test can fail).
  CHECK(path_softmax{.beta = 1.0}(tree, rewards) != uniform);
}

TEST_CASE("path_softmax: stable for log-probs far from 0") {
  rollout_tree tree = binary_tree();
  set_edge_log_probs(tree, doc_log_probs);
  const auto reference = path_softmax{}(tree, doc_rewards);
  // Adding the same constant to every edge shifts all path log-probs from a node equally (by 1 or 2
  // constants): the weights do not change. Without subtracting the max, exp(-2000) underflows to 0 / 0.
  for (const double shift : {-1000.0, 1000.0, -1e5}) {
    INFO("shift " << shift);
    std::vector<double> shifted = doc_log_probs;
    for (double& lp : shifted) lp += shift;
    set_edge_log_probs(tree, shifted);
    check_values(path_softmax{}(tree, doc_rewards), reference, 1e-9);
  }
}

TEST_CASE("path_softmax: results stay within the leaf rewards under each node") {
  rollout_tree tree(split_schedule{.split_steps = {0, 2, 3}, .branching = {3, 2, 2}}(5), numbered_trees(2));
  const std::span<double> log_probs = tree.mutable_log_probs();
  for (std::int32_t n = 0; n < tree.node_count(); ++n)
    if (!tree.is_root(n)) log_probs[static_cast<std::size_t>(n)] = -3.0 * std::fabs(std::sin(1.1 * n));
  std::vector<double> rewards(static_cast<std::size_t>(tree.leaf_count()));
  for (std::size_t i = 0; i < rewards.size(); ++i) rewards[i] = std::cos(0.9 * static_cast<double>(i));
  const auto fused = path_softmax{.beta = 3.0}(tree, rewards);
  // min of the leaves under n = -max of the negated leaves under n.
  std::vector<double> negated(rewards);
  for (double& r : negated) r = -r;
  const auto highest = max_reward{}(tree, rewards);
  const auto minus_lowest = max_reward{}(tree, negated);
  for (std::int32_t n = 0; n < tree.node_count(); ++n) {
    INFO("node " << n);
    CHECK(fused[static_cast<std::size_t>(n)] <= highest[static_cast<std::size_t>(n)] + 1e-12);
    CHECK(fused[static_cast<std::size_t>(n)] >= -minus_lowest[static_cast<std::size_t>(n)] - 1e-12);
  }
}

TEST_CASE("split_softmax: doc example with alpha 1") {
  rollout_tree tree = binary_tree();
  set_edge_log_probs(tree, doc_log_probs);
  // node 1: softmax(0, -ln 3) = 3/4, 1/4 -> 1.5; node 2: 1/2, 1/2 -> 4;
  // root: softmax(0, -ln 2) = 2/3, 1/3 -> 2/3 * 1.5 + 1/3 * 4 = 7/3.
  check_values(split_softmax{}(tree, doc_rewards), {7.0 / 3.0, 1.5, 4, 1, 3, 2, 6});
}

TEST_CASE("split_softmax: alpha 0 is the mean of the children, uniform on a level-uniform tree") {
  rollout_tree tree = binary_tree();
  set_edge_log_probs(tree, doc_log_probs);
  check_values(split_softmax{.alpha = 0.0}(tree, doc_rewards), {3, 2, 4, 1, 3, 2, 6});
}

TEST_CASE("fusions on a sequential topology: only the root mixes") {
  // sequential{4} over 2 steps: root 0 -> 1, 2, 3, 4 (step 1) -> leaves 5, 6, 7, 8 (chains).
  rollout_tree tree(sequential{.group_size = 4}(2), numbered_trees(1));
  REQUIRE(tree.node_count() == 9);
  // Edges 1..4 then 5..8.
  set_edge_log_probs(tree, {0, 0, -ln2, -ln2, 0, -ln3, 0, 0});
  const std::vector<double> rewards = {1, 2, 3, 4};
  // path_softmax root: path log-probs 0, -ln 3, -ln 2, -ln 2 -> 1, 1/3, 1/2, 1/2 (sum 7/3)
  //   -> 3/7 * 1 + 1/7 * 2 + 3/14 * 3 + 3/14 * 4 = 5/7 + 21/14 = 31/14.
  // split_softmax root: only edges 1..4 count: 1, 1, 1/2, 1/2 (sum 3) -> (1 + 2 + 1.5 + 2) / 3 = 13/6.
  // Chain nodes 1..4 carry their leaf's reward exactly in every fusion.
  CHECK(uniform_mean{}(tree, rewards) == std::vector<double>{2.5, 1, 2, 3, 4, 1, 2, 3, 4});
  CHECK(max_reward{}(tree, rewards) == std::vector<double>{4, 1, 2, 3, 4, 1, 2, 3, 4});
  const auto path = path_softmax{}(tree, rewards);
  CHECK(path[0] == Approx(31.0 / 14.0).margin(1e-12));
  CHECK(std::vector<double>(path.begin() + 1, path.end()) == std::vector<double>{1, 2, 3, 4, 1, 2, 3, 4});
  const auto split = split_softmax{}(tree, rewards);
  CHECK(split[0] == Approx(13.0 / 6.0).margin(1e-12));
  CHECK(std::vector<double>(split.begin() + 1, split.end()) == std::vector<double>{1, 2, 3, 4, 1, 2, 3, 4});
}

TEST_CASE("fusions treat separate roots and trees separately") {
  // Two trees: tree 0 leaves {1, 3, 2, 6}, tree 1 (nodes 7..13) leaves {0, 2, 4, 6}.
  const rollout_tree forest = binary_tree(numbered_trees(2));
  const std::vector<double> rewards = {1, 3, 2, 6, 0, 2, 4, 6};
  // tree 1: root (0 + 2 + 4 + 6) / 4 = 3, node 8 (0 + 2) / 2 = 1, node 9 (4 + 6) / 2 = 5.
  CHECK(uniform_mean{}(forest, rewards) == std::vector<double>{3, 2, 4, 1, 3, 2, 6, 3, 1, 5, 0, 2, 4, 6});
  // sequential without a shared root: 3 roots 0, 1, 2 -> 3, 4, 5 -> leaves 6, 7, 8; each root is its leaf.
  const rollout_tree chains(sequential{.group_size = 3, .shared_root = false}(2), numbered_trees(1));
  CHECK(path_softmax{}(chains, std::vector<double>{7, 8, 9}) == std::vector<double>{7, 8, 9, 7, 8, 9, 7, 8, 9});
}

TEST_CASE("fusions reject bad input with a one-line message") {
  rollout_tree tree = binary_tree();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> short_rewards = {1, 2, 3};
  const std::vector<double> nan_rewards = {1, 3, nan, 6};
  const std::vector<double> inf_rewards = {1, 3, 2, -inf};
  CHECK_THROWS_MATCHES(uniform_mean{}(tree, short_rewards), invalid_input,
                       Catch::Message("got 3 leaf rewards for 4 leaves"));
  CHECK_THROWS_MATCHES(max_reward{}(tree, nan_rewards), invalid_input,
                       Catch::Message("leaf reward at leaf position 2 (node 5) is nan"));
  CHECK_THROWS_MATCHES(path_softmax{}(tree, inf_rewards), invalid_input,
                       Catch::Message("leaf reward at leaf position 3 (node 6) is -inf"));
  CHECK_THROWS_MATCHES(split_softmax{}(tree, nan_rewards), invalid_input,
                       Catch::Message("leaf reward at leaf position 2 (node 5) is nan"));
  CHECK_THROWS_MATCHES(path_softmax{.beta = nan}(tree, doc_rewards), invalid_input,
                       Catch::Message("path_softmax beta nan is not finite"));
  CHECK_THROWS_MATCHES(split_softmax{.alpha = inf}(tree, doc_rewards), invalid_input,
                       Catch::Message("split_softmax alpha inf is not finite"));
  set_edge_log_probs(tree, {0, 0, nan, 0, 0, 0});
  CHECK_THROWS_MATCHES(path_softmax{}(tree, doc_rewards), invalid_input,
                       Catch::Message("path_softmax: edge log-prob nan of node 3 (child of node 1) gives a "
                                      "non-finite scaled path log-prob nan"));
  CHECK_THROWS_MATCHES(split_softmax{}(tree, doc_rewards), invalid_input,
                       Catch::Message("split_softmax: edge log-prob nan of node 3 (child of node 1) times alpha 1 "
                                      "is not finite"));
  // A NaN on a chain edge is found too: below a split (sequential) and on chains up to the roots.
  rollout_tree fan(sequential{.group_size = 4}(2), numbered_trees(1));
  fan.mutable_log_probs()[6] = nan;
  CHECK_THROWS_MATCHES(path_softmax{}(fan, std::vector<double>{1, 2, 3, 4}), invalid_input,
                       Catch::Message("path_softmax: edge log-prob nan of node 6 (child of node 2) gives a "
                                      "non-finite scaled path log-prob nan"));
  rollout_tree chains(sequential{.group_size = 3, .shared_root = false}(2), numbered_trees(1));
  chains.mutable_log_probs()[4] = inf;
  CHECK_THROWS_MATCHES(path_softmax{}(chains, std::vector<double>{1, 2, 3}), invalid_input,
                       Catch::Message("path_softmax: edge log-prob inf of node 4 (child of node 1) gives a "
                                      "non-finite scaled path log-prob inf"));
  // Finite log-probs whose scaled sum overflows are rejected too, not turned into 0 / 0.
  set_edge_log_probs(tree, {0, 0, -1e308, 0, 0, 0});
  CHECK_THROWS_AS(path_softmax{.beta = 10.0}(tree, doc_rewards), invalid_input);
  set_edge_log_probs(tree, {-1e308, 0, -1e308, -1e308, 0, 0});  // each edge finite; every path via node 1 is not
  CHECK_THROWS_MATCHES(path_softmax{}(tree, doc_rewards), invalid_input,
                       Catch::Message("path_softmax: a path log-prob times beta 1 overflows"));
}

TEST_CASE("fusion policies are regular value types") {
  CHECK(path_softmax{.beta = 0.5} == path_softmax{.beta = 0.5});
  CHECK(path_softmax{.beta = 0.5} != path_softmax{});
  CHECK(split_softmax{.alpha = 2.0} != split_softmax{});
  CHECK(uniform_mean{} == uniform_mean{});
  CHECK(max_reward{} == max_reward{});
}

TEST_CASE("uniform_mean: the span overload writes the vector overload's values into a reused buffer") {
  // Dense K = 2 over 20 steps, 5 trees; rewards with ties and signed zeros.
  const rollout_tree tree(split_schedule::dense()(20), numbered_trees(5));
  std::vector<double> rewards(static_cast<std::size_t>(tree.leaf_count()));
  for (std::size_t i = 0; i < rewards.size(); ++i)
    rewards[i] = i % 7 == 0 ? -0.0 : static_cast<double>((i * 13) % 17) / 7.0 - 1.0;
  const std::vector<double> expected = uniform_mean{}(tree, rewards);
  std::vector<double> reused(static_cast<std::size_t>(tree.node_count()), std::numeric_limits<double>::quiet_NaN());
  for (int round = 0; round < 2; ++round) {
    uniform_mean{}(tree, rewards, reused);
    REQUIRE(std::memcmp(reused.data(), expected.data(), expected.size() * sizeof(double)) == 0);
  }
  std::vector<double> too_small(reused.size() - 1);
  CHECK_THROWS_WITH(uniform_mean{}(tree, rewards, too_small), "got room for 1094 node values for 1095 nodes");
  const std::vector<double> short_rewards(rewards.begin(), rewards.end() - 1);
  CHECK_THROWS_WITH(uniform_mean{}(tree, short_rewards, reused), "got 79 leaf rewards for 80 leaves");
}
