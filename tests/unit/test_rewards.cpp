// The core's reward forms (training/concepts.hpp, reward/win_rate.hpp): pointwise and groupwise rewards, the win
// rate against hand-computed values, and how the trainer calls each and carries a reward's parts.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "branchgrpo/branchgrpo.hpp"
#include "branchgrpo/toy.hpp"

using namespace branchgrpo;

namespace {

constexpr double nan_value = std::numeric_limits<double>::quiet_NaN();

// Scores row r with values[r] whatever the latent: the test prepares the scores.
struct prepared_reward {
  std::vector<double> values;
  std::vector<double> operator()(const host_tensor&, std::span<const std::int64_t> prompts) const {
    REQUIRE(prompts.size() == values.size());
    return values;
  }
};

// A groupwise reward that records what the trainer told it: each row scores its tree's key.
struct key_reward {
  std::vector<std::uint32_t> seen_keys;
  std::int32_t seen_leaves = 0;
  std::vector<double> operator()(const host_tensor&, std::span<const std::int64_t> prompts, const leaf_groups& groups) {
    seen_keys.assign(groups.keys.begin(), groups.keys.end());
    seen_leaves = groups.leaves_per_tree;
    std::vector<double> out;
    for (std::uint32_t key : groups.keys)
      for (std::int32_t l = 0; l < groups.leaves_per_tree; ++l) out.push_back(key + 0.1 * l);
    REQUIRE(out.size() == prompts.size());
    return out;
  }
};

// Two weighted parts with prepared scores: a ComponentReward.
struct two_part_reward {
  std::vector<reward_component> parts;
  std::vector<double> operator()(const host_tensor&, std::span<const std::int64_t> prompts) const {
    std::vector<double> total(prompts.size(), 0.0);
    for (const reward_component& part : parts)
      for (std::size_t r = 0; r < total.size(); ++r) total[r] += part.weight * part.rows[r];
    return total;
  }
  [[nodiscard]] std::span<const reward_component> last_component_rows() const { return parts; }
};

}  // namespace

static_assert(PointwiseReward<prepared_reward, host_backend>);
static_assert(!GroupwiseReward<prepared_reward, host_backend>);
static_assert(GroupwiseReward<key_reward, host_backend>);
static_assert(!PointwiseReward<key_reward, host_backend>);
static_assert(Reward<key_reward, host_backend> && Reward<prepared_reward, host_backend>);
static_assert(GroupwiseReward<win_rate<prepared_reward>, host_backend>);
static_assert(ComponentReward<two_part_reward> && !ComponentReward<prepared_reward>);
static_assert(!Reward<int, host_backend>);

TEST_CASE("win_rates: the doc examples and the edge cases, by hand", "[rewards]") {
  const std::vector<std::uint32_t> one = {0}, two = {0, 1};
  CHECK(win_rates(std::vector<double>{0.2, 0.5, 0.5, 0.9}, {.leaves_per_tree = 4, .keys = one}) ==
        std::vector<double>{0, 0.5, 0.5, 1});
  CHECK(win_rates(std::vector<double>{1, 2, 7, 7}, {.leaves_per_tree = 2, .keys = two}) ==
        std::vector<double>{0, 1, 0.5, 0.5});
  // tie 0: ties count nothing; tie 1: ties count as wins. {3, 3, 1}: each 3 beats the 1 and ties the other 3.
  CHECK(win_rates(std::vector<double>{3, 3, 1}, {.leaves_per_tree = 3, .keys = one}, 0.0) ==
        std::vector<double>{0.5, 0.5, 0});
  CHECK(win_rates(std::vector<double>{3, 3, 1}, {.leaves_per_tree = 3, .keys = one}, 1.0) ==
        std::vector<double>{1, 1, 0});
  // A NaN row gets NaN and is nobody's opponent: {0.4, NaN, 0.1} -> 0.4 beats its one opponent.
  const std::vector<double> with_nan =
      win_rates(std::vector<double>{0.4, nan_value, 0.1}, {.leaves_per_tree = 3, .keys = one});
  CHECK(with_nan[0] == 1.0);
  CHECK(std::isnan(with_nan[1]));
  CHECK(with_nan[2] == 0.0);
  // No opponent: tie.
  CHECK(win_rates(std::vector<double>{5}, {.leaves_per_tree = 1, .keys = one}) == std::vector<double>{0.5});
  // With tie 0.5 a group of m sums to m / 2 whatever the scores.
  const std::vector<double> rates =
      win_rates(std::vector<double>{0.3, -2, 8, 0.3, 0.3, 1e9}, {.leaves_per_tree = 6, .keys = one});
  double sum = 0;
  for (double r : rates) sum += r;
  CHECK(sum == Approx(3.0));
  CHECK_THROWS_WITH(win_rates(std::vector<double>{1, 2, 3}, {.leaves_per_tree = 2, .keys = two}),
                    "win_rate: 3 scores for 4 rows (2 groups of 2)");
  CHECK_THROWS_WITH(win_rates(std::vector<double>{1}, {.leaves_per_tree = 1, .keys = one}, 1.5),
                    "win_rate tie 1.5 is outside [0, 1]");
}

TEST_CASE("win_rate makes a pointwise reward groupwise; the trainer passes the trees", "[rewards]") {
  host_backend backend;
  const std::vector<std::uint32_t> one = {0};
  win_rate<prepared_reward> reward{.score = {.values = {0.2, 0.5, 0.5, 0.9}}};
  const host_tensor leaves = backend.from_host(std::vector<double>(8, 0.0), 4, latent_shape{{2}});
  const std::vector<std::int64_t> prompts(4, 0);
  CHECK(score_rows<host_backend>(reward, leaves, prompts, {.leaves_per_tree = 4, .keys = one}) ==
        std::vector<double>{0, 0.5, 0.5, 1});
  // score_rows takes the pointwise form of a pointwise reward.
  CHECK(score_rows<host_backend>(reward.score, leaves, prompts, {.leaves_per_tree = 4, .keys = one}) ==
        reward.score.values);

  // score_leaves on 2 trees of 2 leaves keyed 5 and 9: the groupwise reward sees both trees, in order.
  auto policy = make_toy_policy(3);
  const rollout_tree two(split_schedule{.split_steps = {0}, .branching = {2}}(2),
                         {{.key = 5, .prompt = 0}, {.key = 9, .prompt = 1}});
  const auto result =
      rollout(backend, policy, dance_sde{}, independent{}, shifted_linear_schedule(2), two, toy_latent_shape(), {});
  key_reward keys;
  const scored_leaves scored = score_leaves(backend, keys, result);
  CHECK(keys.seen_keys == std::vector<std::uint32_t>{5, 9});
  CHECK(keys.seen_leaves == 2);
  CHECK(scored.scores == std::vector<double>{5, 5.1, 9, 9.1});
}

TEST_CASE("a reward's parts reach the normalizer, kept with their trees", "[rewards]") {
  // keep_finite_trees: the doc example with one part.
  const rollout_tree two(split_schedule{.split_steps = {0}, .branching = {2}}(1),
                         {{.key = 0, .prompt = 0}, {.key = 1, .prompt = 1}});
  const scored_leaves kept =
      keep_finite_trees(two, {0.1, 0.5, nan_value, 0.3}, {{.name = "a", .weight = 1, .rows = {0.1, 0.2, 0.3, 0.4}}});
  REQUIRE(kept.kept_components.size() == 1);
  CHECK(kept.kept_components[0].name == "a");
  CHECK(kept.kept_components[0].rows == std::vector<double>{0.1, 0.2});
  CHECK(kept.components[0].rows.size() == 4);
  CHECK_THROWS_WITH(keep_finite_trees(two, {0.1, 0.5, 0.2, 0.3}, {{.name = "b", .weight = 1, .rows = {1}}}),
                    "reward part 'b' returned 1 scores for 4 leaves");

  // score_leaves -> assign_credit with per_reward: each part normalized on its own (advantage/per_reward.hpp's
  // example on the 7-node binary tree), against the plain stage on the weighted sum.
  host_backend backend;
  auto policy = make_toy_policy(3);
  const rollout_tree binary(split_schedule{.split_steps = {0, 1}, .branching = {2}}(2), {{.key = 0, .prompt = 0}});
  const auto result =
      rollout(backend, policy, dance_sde{}, independent{}, shifted_linear_schedule(2), binary, toy_latent_shape(), {});
  two_part_reward reward{.parts = {{.name = "a", .weight = 1.0, .rows = {1, 3, 2, 6}},
                                   {.name = "b", .weight = 0.5, .rows = {0, 2, 4, 6}}}};
  const scored_leaves scored = score_leaves(backend, reward, result);
  CHECK(scored.scores == std::vector<double>{1, 4, 4, 9});
  REQUIRE(scored.kept_components.size() == 2);
  method split{split_schedule{.split_steps = {0, 1}, .branching = {2}},
               dance_sde{},
               independent{},
               uniform_mean{},
               per_reward<uniform_mean, depth_wise>{},
               keep_all{}};
  const edge_credit credit = assign_credit(split, result.tree, scored, 0, 1);
  const std::vector<double> expected = {0, -1.06066, 1.06066, -1.50677, -0.19365, -0.26926, 1.96968};
  REQUIRE(credit.advantages.size() == expected.size());
  for (std::size_t n = 0; n < expected.size(); ++n) CHECK(credit.advantages[n] == Approx(expected[n]).margin(1e-5));
  CHECK(split.normalizer.parts.size() == 2);
  // The plain stage on the same tree normalizes the sum {1, 4, 4, 9}.
  method plain{split_schedule{.split_steps = {0, 1}, .branching = {2}},
               dance_sde{},
               independent{},
               uniform_mean{},
               depth_wise{},
               keep_all{}};
  const std::vector<double> summed = assign_credit(plain, result.tree, scored, 0, 1).advantages;
  const std::vector<double> expected_sum = {0, -0.70711, 0.70711, -1.05529, -0.15076, -0.15076, 1.35680};
  for (std::size_t n = 0; n < expected_sum.size(); ++n) CHECK(summed[n] == Approx(expected_sum[n]).margin(1e-5));
}
