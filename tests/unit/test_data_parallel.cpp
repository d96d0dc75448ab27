// The data-parallel trainer (training/trainer.hpp with a Communicator, distributed/communicator.hpp) on the toy
// policy, ranks as threads (tests/support/thread_group.hpp): any number of ranks ends with the parameters and the
// statistics of one process, up to rounding in the sum of the ranks' gradients.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "branchgrpo/branchgrpo.hpp"
#include "branchgrpo/toy.hpp"
#include "error_text.hpp"
#include "thread_group.hpp"
#include "two_part_reward.hpp"

using namespace branchgrpo;
using branchgrpo::testing::error_of;
using branchgrpo::testing::thread_group;
using branchgrpo::testing::two_part_reward;

namespace {

struct run_summary {
  std::vector<iteration_stats> stats;
  std::vector<double> parameters;
};

// `iterations` of `recipe` on the toy with `prompts`; the communicator decides this rank's trees.
template <class Recipe, class Comm, class Score = mode_reward<>>
run_summary train_toy(Recipe recipe, const std::vector<std::int64_t>& prompts, int iterations, int updates,
                      Comm& communicator, ppo_options loss = {}) {
  auto policy = make_toy_policy(7);
  Score reward;
  host_backend backend;
  const auto schedule = shifted_linear_schedule(20);
  run_summary out;
  for (int i = 0; i < iterations; ++i)
    out.stats.push_back(train_iteration(backend, policy, reward, recipe, schedule, toy_latent_shape(), prompts, i,
                                        training_options{.max_batch = 16,
                                                         .seed = 11,
                                                         .updates_per_iteration = updates,
                                                         .total_iterations = iterations,
                                                         .loss = loss},
                                        communicator));
  out.parameters.assign(policy.parameters().begin(), policy.parameters().end());
  return out;
}

// Every rank's summary of the same run on `ranks` threads.
template <class Score = mode_reward<>, class Recipe>
std::vector<run_summary> train_on_ranks(const Recipe& recipe, const std::vector<std::int64_t>& prompts, int ranks,
                                        int iterations, int updates, ppo_options loss = {}) {
  std::vector<run_summary> out(static_cast<std::size_t>(ranks));
  thread_group group(ranks);
  group.run([&](thread_group::member& member) {
    out[static_cast<std::size_t>(member.rank())] =
        train_toy<Recipe, thread_group::member, Score>(recipe, prompts, iterations, updates, member, loss);
  });
  return out;
}

double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(std::abs(a[i]), 1e-12));
  return worst;
}

template <class Score = mode_reward<>, class Recipe>
void check_ranks_match_one_process(const Recipe& recipe, const std::vector<std::int64_t>& prompts, int ranks,
                                   int updates, ppo_options loss = {}) {
  single_process one;
  const run_summary alone = train_toy<Recipe, single_process, Score>(recipe, prompts, 3, updates, one, loss);
  const std::vector<run_summary> parts = train_on_ranks<Score>(recipe, prompts, ranks, 3, updates, loss);
  for (const run_summary& part : parts) {
    CHECK(part.parameters == parts[0].parameters);  // every rank holds the same parameters
    CHECK(max_relative_difference(part.parameters, alone.parameters) < 1e-9);
    for (std::size_t i = 0; i < alone.stats.size(); ++i) {
      // The first iteration's rollouts are the one-process rollout, bit for bit; later ones start from parameters
      // that differ by the rounding of the gradient's sum over the ranks.
      if (i == 0)
        CHECK(part.stats[i].reward_mean == alone.stats[i].reward_mean);
      else
        CHECK(part.stats[i].reward_mean == Approx(alone.stats[i].reward_mean).epsilon(1e-9));
      CHECK(part.stats[i].rollout_evaluations == alone.stats[i].rollout_evaluations);
      CHECK(part.stats[i].edges == alone.stats[i].edges);
      CHECK(part.stats[i].edges_trained == alone.stats[i].edges_trained);
      CHECK(part.stats[i].update_evaluations == alone.stats[i].update_evaluations);
      // The PPO loss of the first update is a mean of advantages that cancel to ~1e-16: relative to what it cancels.
      CHECK(part.stats[i].loss == Approx(alone.stats[i].loss).epsilon(1e-9).margin(1e-12));
    }
  }
}

const std::vector<std::int64_t> four_prompts = {0, 1, 2, 3};

}  // namespace

TEST_CASE("data parallel: 2 and 3 ranks end where one process ends", "[distributed][trainer]") {
  for (const char* name : {"dance", "branch", "branch-widpru", "branch-mix"}) {
    INFO(name);
    with_method(name, [](auto recipe) {
      check_ranks_match_one_process(recipe, four_prompts, 2, 1);
      check_ranks_match_one_process(recipe, {0, 1, 2, 3, 4}, 3, 2);  // uneven shares, two optimizer steps
      return 0;
    });
  }
  // GRPO-Guard's options: each rank keeps the old means of its own edges.
  with_method("branch", [](auto recipe) {
    check_ranks_match_one_process(recipe, four_prompts, 2, 2,
                                  ppo_options{.ratio_norm = true, .step_weight = step_weighting::inverse_dt});
    return 0;
  });
}

TEST_CASE("data parallel: the decoupled objectives on 2 and 3 ranks end where one process ends",
          "[distributed][trainer]") {
  for (const char* name : {"nft", "branch-nft", "branch-awm"}) {
    INFO(name);
    with_method(name, [](auto recipe) {
      check_ranks_match_one_process(recipe, four_prompts, 2, 1);
      check_ranks_match_one_process(recipe, {0, 1, 2, 3, 4}, 3, 2);  // uneven shares, two optimizer steps
      return 0;
    });
  }
  INFO("branch-nft with intermediate nodes");
  check_ranks_match_one_process(with_objective(branch_method(), diffusion_nft{.intermediate_nodes = true}),
                                {0, 1, 2, 3, 4}, 3, 2);
}

TEST_CASE("data parallel: trees that adapt on 2 and 3 ranks end where one process ends",
          "[distributed][trainer][value_pruning][step_gain][adaptive_branching]") {
  // The cuts, the node values and the per-prompt shapes travel with the gathered forest, and adaptive_branching's
  // records are updated from it on every rank.
  for (const char* name : {"branch-value-dense", "branch-adaptive"}) {
    INFO(name);
    with_method(name, [](auto recipe) {
      check_ranks_match_one_process(recipe, four_prompts, 2, 1);
      check_ranks_match_one_process(recipe, {0, 1, 2, 3, 4}, 3, 2);  // uneven shares, two optimizer steps
      return 0;
    });
  }
}

TEST_CASE("data parallel: stateful and cross-tree components see the whole forest", "[distributed][trainer]") {
  // per_prompt_running keeps per-prompt statistics across iterations and leaf_group normalizes over every tree:
  // both must see every rank's trees to stay identical to one process.
  with_method("branch-widpru", [](auto recipe) {
    auto running =
        method{recipe.topology, recipe.stepper, recipe.correlator, recipe.fusion, per_prompt_running{}, recipe.pruner};
    check_ranks_match_one_process(running, {0, 1, 0, 1}, 2, 1);
    auto grouped =
        method{recipe.topology, recipe.stepper, recipe.correlator, recipe.fusion, leaf_group{}, recipe.pruner};
    check_ranks_match_one_process(grouped, four_prompts, 2, 1);
    return 0;
  });
}

TEST_CASE("data parallel: per-reward advantages get every rank's reward parts", "[distributed][trainer]") {
  with_method("branch", [](auto recipe) {
    auto separate = method{recipe.topology,
                           recipe.stepper,
                           recipe.correlator,
                           recipe.fusion,
                           per_reward<decltype(recipe.fusion), per_prompt_running>{.fusion = recipe.fusion},
                           recipe.pruner};
    check_ranks_match_one_process<two_part_reward>(separate, four_prompts, 2, 1);
    check_ranks_match_one_process<two_part_reward>(separate, {0, 1, 2, 3, 4}, 3, 2);
    return 0;
  });
}

TEST_CASE("data parallel: fewer trees than ranks is one clear error", "[distributed][trainer]") {
  std::mutex lock;
  std::vector<std::string> errors;
  thread_group(2).run([&](thread_group::member& member) {
    const std::string error = error_of([&] {
      with_method("branch", [&](auto recipe) { return train_toy(recipe, {0}, 1, 1, member).parameters.size(); });
    });
    const std::scoped_lock guard(lock);
    errors.push_back(error);
  });
  for (const std::string& error : errors)
    CHECK(error ==
          "an iteration of 1 prompt cannot give each of 2 ranks a tree: use at least as many prompts per iteration as "
          "ranks");
}

namespace {
// The toy policy as a PaddedAccumulationPolicy that counts its calls: accumulate and pad_accumulate between two
// optimizer steps (what a policy whose accumulate is a collective, ZeRO-2, needs equal on every rank).
struct counting_policy : decltype(make_toy_policy(7)) {
  counting_policy() : decltype(make_toy_policy(7))(make_toy_policy(7)) {}
  std::vector<double> accumulate(const edge_batch<host_backend::tensor>& edges, const loss_gradient_fn& gradient) {
    ++calls;
    return decltype(make_toy_policy(7))::accumulate(edges, gradient);
  }
  void pad_accumulate() {
    ++calls;
    ++pads;
  }
  auto apply_update() {
    per_update.push_back(calls);
    calls = 0;
    return decltype(make_toy_policy(7))::apply_update();
  }
  int calls = 0, pads = 0;
  std::vector<int> per_update;
};
}  // namespace

TEST_CASE("data parallel: a policy whose accumulate is a collective gets as many calls on every rank",
          "[distributed][trainer]") {
  // 3 trees on 2 ranks: rank 0 rolls out 1, rank 1 2, so rank 0 has fewer trained edges in every optimizer step and
  // makes up the difference with pad_accumulate (train_iteration counts the calls with one all-gather per step).
  static_assert(PaddedAccumulationPolicy<counting_policy>);
  // RatioNorm adds an accumulate per chunk after the first optimizer step: counted too.
  for (const ppo_options loss : {ppo_options{}, ppo_options{.ratio_norm = true}}) {
    INFO("ratio_norm " << loss.ratio_norm);
    const std::vector<std::int64_t> prompts = {0, 1, 2};
    std::vector<counting_policy> policies(2);
    std::vector<std::vector<double>> parameters(2);
    with_method("branch", [&](auto recipe) {
      thread_group group(2);
      group.run([&](thread_group::member& member) {
        counting_policy& policy = policies[static_cast<std::size_t>(member.rank())];
        mode_reward<> reward;
        host_backend backend;
        for (int i = 0; i < 2; ++i)
          (void)train_iteration(
              backend, policy, reward, recipe, shifted_linear_schedule(20), toy_latent_shape(), prompts, i,
              training_options{
                  .max_batch = 4, .seed = 11, .updates_per_iteration = 2, .total_iterations = 2, .loss = loss},
              member);
        parameters[static_cast<std::size_t>(member.rank())].assign(policy.parameters().begin(),
                                                                   policy.parameters().end());
      });
      return 0;
    });
    REQUIRE(policies[0].per_update.size() == 4);  // 2 iterations x 2 optimizer steps
    CHECK(policies[0].per_update == policies[1].per_update);
    CHECK(policies[0].pads > 0);
    CHECK(policies[1].pads == 0);
    CHECK(parameters[0] == parameters[1]);
  }
}
