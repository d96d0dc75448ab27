// End-to-end tests of the generic trainer on the exact-gradient toy model.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "branchgrpo/branchgrpo.hpp"
#include "branchgrpo/toy.hpp"

using namespace branchgrpo;

namespace {

const std::vector<std::int64_t> eight_prompts = {0, 1, 2, 3, 4, 5, 6, 7};

struct run_summary {
  std::vector<iteration_stats> stats;
  std::vector<double> parameters;
};

template <class Recipe>
run_summary train_toy(Recipe recipe, int iterations, std::int64_t max_batch, int updates = 1,
                      std::vector<std::int64_t> prompts = eight_prompts) {
  auto policy = make_toy_policy(7);
  mode_reward<> reward;
  host_backend backend;
  const auto schedule = shifted_linear_schedule(20);
  run_summary summary;
  for (int i = 0; i < iterations; ++i)
    summary.stats.push_back(train_iteration(
        backend, policy, reward, recipe, schedule, toy_latent_shape(), prompts, i,
        training_options{
            .max_batch = max_batch, .seed = 11, .updates_per_iteration = updates, .total_iterations = iterations}));
  summary.parameters.assign(policy.parameters().begin(), policy.parameters().end());
  return summary;
}

double mean_reward(const std::vector<iteration_stats>& stats, std::size_t first, std::size_t last) {
  double sum = 0;
  for (std::size_t i = first; i < last; ++i) sum += stats[i].reward_mean;
  return sum / static_cast<double>(last - first);
}

}  // namespace

TEST_CASE("methods have the paper's rollout costs", "[trainer]") {
  // branch uses 203/305 of dance's rollout evaluations at G = 16, 20 steps.
  const auto evaluations = [](std::string_view name) {
    return with_method(name, [](auto recipe) { return recipe.topology(20).evaluations(); });
  };
  CHECK(evaluations("dance") == 305);
  for (auto name : {"branch", "branch-widpru", "branch-deppru", "branch-mix"}) CHECK(evaluations(name) == 203);
  CHECK_THROWS_WITH(evaluations("grpo"),
                    "unknown method 'grpo' (expected dance, branch, branch-widpru, branch-deppru or branch-mix)");

  const auto stats = with_method("branch", [](auto recipe) { return train_toy(recipe, 1, 64).stats; });
  CHECK(stats[0].rollout_evaluations == 8 * 203);
  CHECK(stats[0].edges == 8 * 218);
  CHECK(stats[0].edges_trained == 8 * 218);
  CHECK(stats[0].update_evaluations == 8 * 218);
  const auto dance = with_method("dance", [](auto recipe) { return train_toy(recipe, 1, 64).stats; });
  CHECK(dance[0].rollout_evaluations == 8 * 305);
  CHECK(dance[0].edges_trained == 8 * 320);
}

TEST_CASE("every method raises the toy reward within 30 iterations", "[trainer]") {
  for (auto name : method_names) {
    DYNAMIC_SECTION(name) {
      const auto stats = with_method(name, [](auto recipe) { return train_toy(recipe, 30, 64).stats; });
      const double before = mean_reward(stats, 0, 3);
      const double after = mean_reward(stats, 27, 30);
      INFO(name << ": reward " << before << " -> " << after);
      CHECK(after > before + 0.25);  // measured gains 0.36 (mix) to 0.47 (branch)
      for (const auto& s : stats) {
        CHECK(s.trees_dropped == 0);
        CHECK(s.first_update_log_prob_gap == 0.0);  // the first update's ratio is exactly 1
      }
    }
  }
}

TEST_CASE("training is reproducible and independent of max_batch", "[trainer]") {
  const auto run = [](std::int64_t max_batch) {
    return with_method("branch-widpru", [&](auto recipe) { return train_toy(recipe, 4, max_batch, 2); });
  };
  const auto a = run(64);
  const auto b = run(64);
  const auto c = run(5);
  CHECK(a.parameters == b.parameters);
  CHECK(a.parameters == c.parameters);
  for (std::size_t i = 0; i < a.stats.size(); ++i) {
    CHECK(a.stats[i].reward_mean == c.stats[i].reward_mean);
    CHECK(a.stats[i].loss == c.stats[i].loss);
  }
  // Different seed, different run.
  const auto other = with_method("branch-widpru", [](auto recipe) {
    auto policy = make_toy_policy(7);
    mode_reward<> reward;
    host_backend backend;
    train_iteration(backend, policy, reward, recipe, shifted_linear_schedule(20), toy_latent_shape(), eight_prompts, 0,
                    training_options{.seed = 12});
    return std::vector<double>(policy.parameters().begin(), policy.parameters().end());
  });
  CHECK(other != a.parameters);
}

TEST_CASE("pruning and Mix train fewer edges than plain branch", "[trainer]") {
  const auto trained = [](std::string_view name) {
    return with_method(name, [](auto recipe) { return train_toy(recipe, 1, 64).stats[0]; });
  };
  const auto branch = trained("branch");
  const auto widpru = trained("branch-widpru");
  const auto deppru = trained("branch-deppru");
  const auto mix = trained("branch-mix");
  // Parent-Top1 drops the second child subtree of each of the 8 last-split parents: 8 chains of 11 edges.
  CHECK(widpru.edges_trained == 8 * (218 - 8 * 11));
  // The paper's depth window prunes edge depths [9, 13): 4 depths of 16 edges.
  CHECK(deppru.edges_trained == 8 * (218 - 64));
  // Mix at iteration 0: SDE window [0, 4) plus the split steps 6 and 9: 2+2+2+4 + 8 + 16 edges.
  CHECK(mix.edges_trained == 8 * (2 + 2 + 2 + 4 + 8 + 16));
  CHECK(branch.edges_trained == 8 * 218);
  CHECK(mix.rollout_evaluations == branch.rollout_evaluations);
}

TEST_CASE("a non-finite leaf reward drops its tree from the update", "[trainer]") {
  struct nan_on_first_leaf {
    mode_reward<> inner;
    std::vector<double> operator()(const host_tensor& leaves, std::span<const std::int64_t> prompts) {
      auto scores = inner(leaves, prompts);
      scores[0] = std::numeric_limits<double>::quiet_NaN();
      return scores;
    }
  };
  static_assert(Reward<nan_on_first_leaf, host_backend>);
  auto recipe = branch_method();
  auto policy = make_toy_policy(7);
  nan_on_first_leaf reward;
  host_backend backend;
  const auto stats = train_iteration(backend, policy, reward, recipe, shifted_linear_schedule(20), toy_latent_shape(),
                                     eight_prompts, 0, training_options{});
  CHECK(stats.trees_dropped == 1);
  CHECK(stats.edges_trained == 7 * 218);
  CHECK(std::isfinite(stats.reward_mean));
  CHECK(std::isfinite(stats.loss));

  // Every tree failing: no update, NaN reward statistics, nothing thrown.
  struct always_nan {
    std::vector<double> operator()(const host_tensor& leaves, std::span<const std::int64_t>) {
      return std::vector<double>(static_cast<std::size_t>(leaves.rows), std::numeric_limits<double>::quiet_NaN());
    }
  };
  always_nan broken;
  const std::vector<double> before(policy.parameters().begin(), policy.parameters().end());
  const auto none = train_iteration(backend, policy, broken, recipe, shifted_linear_schedule(20), toy_latent_shape(),
                                    eight_prompts, 1, training_options{});
  CHECK(none.trees_dropped == 8);
  CHECK(none.edges_trained == 0);
  CHECK(std::isnan(none.reward_mean));
  CHECK(std::vector<double>(policy.parameters().begin(), policy.parameters().end()) == before);
}

TEST_CASE("bad trainer input is rejected with one line", "[trainer]") {
  auto recipe = branch_method();
  auto policy = make_toy_policy(7);
  mode_reward<> reward;
  host_backend backend;
  const auto schedule = shifted_linear_schedule(20);
  CHECK_THROWS_WITH(train_iteration(backend, policy, reward, recipe, schedule, toy_latent_shape(),
                                    std::vector<std::int64_t>{}, 0, training_options{}),
                    "an iteration needs at least one prompt");
  CHECK_THROWS_WITH(train_iteration(backend, policy, reward, recipe, schedule, toy_latent_shape(), eight_prompts, 0,
                                    training_options{.max_batch = 0}),
                    "max_batch must be at least 1, got 0");
  CHECK_THROWS_WITH(train_iteration(backend, policy, reward, recipe, schedule, toy_latent_shape(), eight_prompts, 0,
                                    training_options{.updates_per_iteration = 0}),
                    "updates_per_iteration must be at least 1, got 0");
}
