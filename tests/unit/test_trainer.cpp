// End-to-end tests of the generic trainer on the exact-gradient toy model.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/branchgrpo.hpp"
#include "branchgrpo/toy.hpp"
#include "two_part_reward.hpp"

using namespace branchgrpo;
using branchgrpo::testing::two_part_reward;

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
  // branch-mix-flash's tree is branch's; its pruner removes the evaluations of the skip steps (sde_window, ode_stride
  // 3: the ODE run 10..19 is evaluated at 10, 13, 16, 19).
  CHECK(with_method("branch-mix-flash",
                    [](auto recipe) { return shape_plan(recipe.pruner, recipe.topology(20), 0).evaluations(); }) == 95);
  CHECK_THROWS_WITH(
      evaluations("grpo"),
      "unknown method 'grpo' (expected dance, branch, branch-widpru, branch-deppru, branch-mix, nft, awm, "
      "branch-nft, branch-awm, branch-mix-flash, branch-value, branch-dense, branch-adaptive or branch-value-dense)");

  const auto stats = with_method("branch", [](auto recipe) { return train_toy(recipe, 1, 64).stats; });
  CHECK(stats[0].rollout_evaluations == 8 * 203);
  const auto flash = with_method("branch-mix-flash", [](auto recipe) { return train_toy(recipe, 1, 64).stats; });
  CHECK(flash[0].rollout_evaluations == 8 * 95);
  CHECK(std::isfinite(flash[0].loss));
  CHECK(flash[0].first_update_log_prob_gap == 0.0);  // the SDE edges are recomputed exactly; skip edges untrained
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

TEST_CASE("cps and per_layer_eta train through every topology with the rollout's log-probs", "[trainer][stepper]") {
  // The update recomputes each step's coefficients (at its layer) and scores each edge with the rollout's std, so
  // the first update's log-probs are the rollout's bit for bit; cps's noiseless last step is an ODE edge, untrained.
  const auto check_run = [](auto recipe, std::int64_t edges_trained) {
    const auto stats = train_toy(recipe, 2, 7).stats;
    for (const auto& s : stats) {
      CHECK(s.first_update_log_prob_gap == 0.0);
      CHECK(s.edges_trained == edges_trained);
      CHECK(std::isfinite(s.loss));
    }
  };
  const auto dense = split_schedule::dense();
  SECTION("cps on the dense tree, correlated and scaled splits: the 16 edges of step 19 do not train") {
    check_run(method{dense, cps{}, correlated{.s = 4.0}, uniform_mean{}, depth_wise{}, keep_all{}}, 8 * (218 - 16));
    check_run(method{dense, cps{.eta = 0.5}, scaled{}, uniform_mean{}, depth_wise{}, keep_all{}}, 8 * (218 - 16));
  }
  SECTION("cps on sequential groups and Flow-GRPO-Fast; with an SDE window (Mix)") {
    check_run(method{sequential{.group_size = 4}, cps{}, independent{}, uniform_mean{}, depth_wise{}, keep_all{}},
              8 * 4 * 19);
    check_run(method{flow_grpo_fast{.group_size = 4, .split_step = 17, .sde_steps = 3}, cps{}, independent{},
                     uniform_mean{}, depth_wise{}, keep_all{}},
              8 * 4 * 2);
    check_run(method{dense, cps{}, correlated{.s = 4.0}, uniform_mean{}, depth_wise{}, sde_window{.every = 1000}},
              8 * (2 + 2 + 2 + 4 + 8 + 16));  // the window {0, 1, 2, 3} and the splits at 6, 9
  }
  SECTION("per_layer_eta (dance_sde and cps) on the dense tree and sequential groups, through any_stepper") {
    check_run(
        method{dense, per_layer_eta{.etas = {0.9, 0.6, 0.3}}, antithetic{}, uniform_mean{}, depth_wise{}, keep_all{}},
        8 * 218);
    check_run(method{dense, any_stepper{per_layer_eta{.etas = {1.0, 0.7}, .sampler = layer_sampler::cps}},
                     correlated{.s = 4.0}, uniform_mean{}, depth_wise{}, keep_all{}},
              8 * (218 - 16));
    check_run(method{sequential{.group_size = 4}, per_layer_eta{.etas = {0.4}}, independent{}, uniform_mean{},
                     depth_wise{}, keep_all{}},
              8 * 4 * 20);
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
  single_process one;
  bool without_credit = false;  // the observer still sees the rewards, and no credit
  const auto none = train_iteration(
      backend, policy, broken, recipe, shifted_linear_schedule(20), toy_latent_shape(), eight_prompts, 1,
      training_options{}, one, [&](const iteration_view<host_backend>& view) {
        without_credit = view.credit == nullptr && view.leaves.kept_trees.empty() && view.leaves.scores.size() == 128;
      });
  CHECK(without_credit);
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

namespace {

// Four toy edges of step 3 by hand (prompts 0..3); `next` is not read by the KL.
edge_batch<host_backend::tensor> toy_edges(host_backend& backend, const sigma_schedule& schedule) {
  edge_batch<host_backend::tensor> edges;
  edges.step = 3;
  edges.sigma = schedule.sigma(3);
  edges.coeffs = dance_sde{}(schedule, 3);
  const std::vector<double> x = {0.3, -0.7, 1.1, 0.2, -0.4, -0.9, 0.8, 0.5};
  edges.x = backend.from_host(x, 4, toy_latent_shape());
  edges.next = edges.x;
  edges.std.assign(4, edges.coeffs.noise_std);
  edges.trees = {0, 1, 2, 3};
  edges.prompts = {0, 1, 2, 3};
  return edges;
}

// sum_r kl_flow(mean_r, mean_ref_r, std_r) of the toy edges under the policy's current weights, computed
// directly from the velocities (not through accumulate).
template <class Policy>
double toy_kl_sum(Policy& policy, host_backend& backend, const edge_batch<host_backend::tensor>& edges) {
  const std::vector<double> x = backend.to_host(edges.x);
  const denoise_batch batch{.step = edges.step, .sigma = edges.sigma, .trees = edges.trees, .prompts = edges.prompts};
  const std::vector<double> reference = backend.to_host(policy.reference_velocity(edges.x, batch));
  double sum = 0;
  for (std::size_t r = 0; r < 4; ++r) {
    const auto v = policy.velocity({x[2 * r], x[2 * r + 1]}, edges.sigma, edges.prompts[r]);
    const double a = edges.coeffs.x_coeff, c = edges.coeffs.velocity_coeff;
    const std::vector<double> mean = {a * x[2 * r] + c * v[0], a * x[2 * r + 1] + c * v[1]};
    const std::vector<double> mean_ref = {a * x[2 * r] + c * reference[2 * r],
                                          a * x[2 * r + 1] + c * reference[2 * r + 1]};
    sum += kl_flow(mean, mean_ref, edges.std[r]);
  }
  return sum;
}

}  // namespace

TEST_CASE("the KL term: accumulate_kl's values and gradient on the toy", "[trainer][kl]") {
  static_assert(ReferencePolicy<fourier_policy<host_backend>, host_backend>);
  host_backend backend;
  const auto schedule = shifted_linear_schedule(20);
  auto policy = make_toy_policy(7);
  const auto edges = toy_edges(backend, schedule);

  // At the base the policy is its own reference: KL 0, no gradient.
  const std::vector<double> at_base = accumulate_kl(backend, policy, edges, 1.0);
  for (const double kl : at_base) CHECK(kl == Approx(0.0).margin(1e-12));
  for (const double g : policy.gradient()) CHECK(g == Approx(0.0).margin(1e-12));
  policy.reset_to_base();

  // Away from the base: the values are kl_flow's, the gradient is d/dW sum_r KL_r (central differences).
  const std::span<double> w = policy.parameters();
  for (std::size_t j = 0; j < w.size(); ++j) w[j] += 0.02 * std::sin(static_cast<double>(j));
  const std::vector<double> kl = accumulate_kl(backend, policy, edges, 1.0);
  double kl_total = 0;
  for (const double v : kl) kl_total += v;
  CHECK(kl_total > 1e-4);
  CHECK(kl_total == Approx(toy_kl_sum(policy, backend, edges)).epsilon(1e-9));
  const std::vector<double> gradient(policy.gradient().begin(), policy.gradient().end());
  const double h = 1e-6;
  int checked = 0;
  for (std::size_t j = 0; j < w.size(); j += 37) {
    const double original = w[j];
    w[j] = original + h;
    const double up = toy_kl_sum(policy, backend, edges);
    w[j] = original - h;
    const double down = toy_kl_sum(policy, backend, edges);
    w[j] = original;
    INFO("weight " << j);
    CHECK(gradient[j] == Approx((up - down) / (2 * h)).epsilon(1e-5).margin(1e-9));
    ++checked;
  }
  CHECK(checked >= 10);
}

TEST_CASE("the KL term keeps the toy policy near its reference", "[trainer][kl]") {
  // Same runs but kl_beta: with a large beta the weights move measurably less from the base.
  const auto distance_from_base = [](double kl_beta) {
    auto policy = make_toy_policy(7);
    mode_reward<> reward;
    host_backend backend;
    const auto schedule = shifted_linear_schedule(20);
    auto recipe = branch_method();
    double kl = 0;
    for (int i = 0; i < 8; ++i)
      kl = train_iteration(backend, policy, reward, recipe, schedule, toy_latent_shape(),
                           std::vector<std::int64_t>{0, 1}, i,
                           training_options{.seed = 11, .total_iterations = 8, .loss = {.kl_beta = kl_beta}})
               .kl;
    if (kl_beta == 0) CHECK(kl == 0.0);
    double squares = 0;
    for (std::size_t j = 0; j < policy.parameters().size(); ++j)
      squares += std::pow(policy.parameters()[j] - policy.base_parameters()[j], 2);
    return std::sqrt(squares);
  };
  const double free = distance_from_base(0.0);
  const double held = distance_from_base(100.0);
  INFO("distance from the base: kl_beta 0 -> " << free << ", kl_beta 100 -> " << held);
  CHECK(free > 0.0);
  CHECK(held < 0.6 * free);  // measured 8.16 -> 3.64
}

TEST_CASE("prompt_schedule and train_loop", "[trainer][loop]") {
  const prompt_schedule twelve{.prompt_count = 12, .per_iteration = 2};
  CHECK(twelve(0) == std::vector<std::int64_t>{0, 1});
  CHECK(twelve(7) == std::vector<std::int64_t>{2, 3});  // (7 * 2) mod 12
  CHECK(prompt_schedule{.prompt_count = 3, .per_iteration = 5}(1) == std::vector<std::int64_t>{2, 0, 1, 2, 0});
  CHECK_THROWS_WITH(prompt_schedule{.prompt_count = 0}(0), "prompt_schedule prompt_count must be at least 1, got 0");
  CHECK_THROWS_WITH(twelve(-1), "prompt_schedule iteration must be non-negative, got -1");

  // Shuffled: the doc example's seed 7 order; every epoch holds each prompt once, epochs differ, the seed matters.
  const prompt_schedule shuffled{.prompt_count = 12, .per_iteration = 2, .shuffle = true, .seed = 7};
  CHECK(shuffled(0) == std::vector<std::int64_t>{0, 4});
  CHECK(shuffled(1) == std::vector<std::int64_t>{8, 2});
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<std::int64_t> rows;
    for (int i = 6 * epoch; i < 6 * epoch + 6; ++i)
      for (const std::int64_t row : shuffled(i)) rows.push_back(row);
    std::vector<std::int64_t> sorted = rows;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
    if (epoch > 0) CHECK(rows != std::vector<std::int64_t>{0, 4, 8, 2, 1, 10, 6, 7, 5, 11, 3, 9});
  }
  CHECK(prompt_schedule{.prompt_count = 12, .per_iteration = 2, .shuffle = true, .seed = 8}(0) != shuffled(0));
  // An iteration that crosses an epoch: positions 10, 11 of epoch 0 and 0, 1, 2 of epoch 1 (P = 5, N = 12, i = 2).
  const prompt_schedule crossing{.prompt_count = 12, .per_iteration = 5, .shuffle = true, .seed = 7};
  const keyed_permutation epoch0{.size = 12, .seed = 7, .stream = 0}, epoch1{.size = 12, .seed = 7, .stream = 1};
  CHECK(crossing(2) ==
        std::vector<std::int64_t>{static_cast<std::int64_t>(epoch0(10)), static_cast<std::int64_t>(epoch0(11)),
                                  static_cast<std::int64_t>(epoch1(0)), static_cast<std::int64_t>(epoch1(1)),
                                  static_cast<std::int64_t>(epoch1(2))});

  // The doc example: prompts {0, 1}, {2, 3}, {4, 5}, a hook per iteration; the same as calling train_iteration.
  const auto run = [](int first, auto hook) {
    auto policy = make_toy_policy(7);
    mode_reward<> reward;
    host_backend backend;
    auto recipe = branch_method();
    const int iterations = train_loop(backend, policy, reward, recipe, shifted_linear_schedule(20), toy_latent_shape(),
                                      prompt_schedule{.prompt_count = 8, .per_iteration = 2},
                                      training_options{.seed = 3, .total_iterations = 3}, first, hook);
    return std::pair{iterations, std::vector<double>(policy.parameters().begin(), policy.parameters().end())};
  };
  std::vector<int> seen;
  const auto [count, looped] = run(0, [&](int i, const iteration_stats& stats) {
    seen.push_back(i);
    CHECK(stats.iteration == i);
  });
  CHECK(count == 3);
  CHECK(seen == std::vector<int>{0, 1, 2});
  {
    auto policy = make_toy_policy(7);
    mode_reward<> reward;
    host_backend backend;
    auto recipe = branch_method();
    for (int i = 0; i < 3; ++i)
      train_iteration(backend, policy, reward, recipe, shifted_linear_schedule(20), toy_latent_shape(),
                      std::vector<std::int64_t>{2 * i, 2 * i + 1}, i,
                      training_options{.seed = 3, .total_iterations = 3});
    CHECK(std::vector<double>(policy.parameters().begin(), policy.parameters().end()) == looped);
  }
  // A hook returning false stops the loop; first_iteration resumes.
  CHECK(run(0, [](int i, const iteration_stats&) { return i < 1; }).first == 2);
  CHECK(run(2, [](int, const iteration_stats&) {}).first == 1);
  CHECK_THROWS_WITH(run(4, [](int, const iteration_stats&) {}), "first iteration 4 is not in [0, 3]");
}

TEST_CASE("the iteration's stages, each on its own", "[trainer][stages]") {
  // keep_finite_trees: the doc example.
  const rollout_tree two(split_schedule{.split_steps = {0}, .branching = {2}}(1),
                         {{.key = 0, .prompt = 0}, {.key = 1, .prompt = 1}});
  const scored_leaves kept = keep_finite_trees(two, {0.1, 0.5, std::nan(""), 0.3});
  CHECK(kept.kept_trees == std::vector<std::int32_t>{0});
  CHECK(kept.kept_scores == std::vector<double>{0.1, 0.5});
  CHECK(kept.mean == Approx(0.3));
  CHECK(kept.std == Approx(0.2));
  CHECK(kept.min == 0.1);
  CHECK(kept.max == 0.5);
  CHECK(std::isnan(keep_finite_trees(two, {std::nan(""), 0.5, 0.2, -INFINITY}).mean));
  CHECK_THROWS_WITH(keep_finite_trees(two, {0.1}), "reward returned 1 scores for 4 leaves");

  // assign_credit on one dense tree: every edge trains, by step; Parent-Top1 drops the worse child of each of the
  // 8 last-split parents with its chain: 8 * (1 split edge + 10 chain edges) = 88 of the 218 edges.
  const rollout_tree dense(split_schedule::dense()(20), {{.key = 0, .prompt = 0}});
  std::vector<double> scores(16);
  for (std::size_t i = 0; i < scores.size(); ++i) scores[i] = 0.1 * static_cast<double>(i % 5);
  const scored_leaves all = keep_finite_trees(dense, scores);
  auto branch = branch_method();
  const edge_credit credit = assign_credit(branch, dense, all, 0, 1);
  CHECK(credit.trained.size() == 218);
  for (std::size_t i = 1; i < credit.trained.size(); ++i)
    CHECK(dense.step(credit.trained[i - 1]) <= dense.step(credit.trained[i]));
  CHECK(credit.fused == uniform_mean{}(dense, scores));
  auto widpru = branch_method(parent_top_k{.k = 1});
  CHECK(assign_credit(widpru, dense, all, 0, 1).trained.size() == 218 - 88);

  // update_policy: 2 groups over the 218 edges, one evaluation per edge, the first group's ratio exactly 1.
  host_backend backend;
  auto policy = make_toy_policy(7);
  const auto schedule = shifted_linear_schedule(20);
  const auto result =
      rollout(backend, policy, dance_sde{}, correlated{}, schedule, dense, toy_latent_shape(), {.seed = 4});
  const edge_credit toy_credit = assign_credit(branch, result.tree, all, 0, 1);
  const update_report update = update_policy(backend, policy, result, toy_credit, dance_sde{}, schedule,
                                             training_options{.max_batch = 64, .updates_per_iteration = 2});
  CHECK(update.evaluations == 218);
  CHECK(update.first_update_log_prob_gap == 0.0);
  CHECK(policy.optimizer_state().steps == 2);
  CHECK(update.kl == 0.0);
}

TEST_CASE("an observer sees the iteration between credit and update, and changes nothing", "[trainer][stages]") {
  // branch, 2 prompts, 20 steps: 21 steps of latents (2 roots, 32 leaves), 32 rewards, every one of the 2 x 218
  // edges trained; the statistics and parameters equal those of the run without an observer.
  const auto run = [](auto&& observe) {
    auto policy = make_toy_policy(7);
    mode_reward<> reward;
    host_backend backend;
    auto recipe = branch_method();
    single_process one;
    const std::vector<std::int64_t> prompts = {3, 5};
    const iteration_stats stats =
        train_iteration(backend, policy, reward, recipe, shifted_linear_schedule(20), toy_latent_shape(), prompts, 0,
                        training_options{.max_batch = 16, .seed = 11}, one, observe);
    return std::pair{stats, std::vector<double>(policy.parameters().begin(), policy.parameters().end())};
  };
  int calls = 0;
  const auto [stats, parameters] = run([&](const iteration_view<host_backend>& view) {
    ++calls;
    CHECK(view.iteration == 0);
    CHECK(std::ranges::equal(view.forest.log_probs(), view.result.tree.log_probs()));  // one process: a copy
    CHECK((view.share.first == 0 && view.share.last == 2));
    CHECK(view.result.latents.size() == 21);
    CHECK(view.result.latents.front().rows == 2);
    CHECK(view.result.latents.back().rows == 32);
    CHECK(view.forest.info(1).prompt == 5);
    CHECK(view.leaves.scores.size() == 32);
    CHECK(view.leaves.kept_trees == std::vector<std::int32_t>{0, 1});
    REQUIRE(view.credit != nullptr);
    CHECK(view.credit->trained.size() == 436);
    CHECK(view.credit->edge_advantage.size() == 438);
  });
  CHECK(calls == 1);
  const auto [plain, plain_parameters] = run(ignore_iteration{});
  CHECK(stats.reward_mean == plain.reward_mean);
  CHECK(stats.loss == plain.loss);
  CHECK(parameters == plain_parameters);
}

namespace {

// Every number of a run that its rollouts, rewards, advantages, losses and parameters decide: per iteration the
// reward statistics, loss, clip fraction, KL, first-update gap and the counts (exact as doubles); then the
// parameters W[0], W[137], W[511] and their sum (any parameter that moves by an ulp moves the next iteration's
// rollout, hence its reward statistics).
template <class Recipe, class Score>
std::vector<double> one_process_numbers(Recipe recipe, Score reward, int iterations, int updates, double kl_beta) {
  auto policy = make_toy_policy(7);
  host_backend backend;
  const auto schedule = shifted_linear_schedule(20);
  const std::vector<std::int64_t> prompts = {0, 1, 2, 3, 4};
  std::vector<double> numbers;
  for (int i = 0; i < iterations; ++i) {
    const iteration_stats s = train_iteration(backend, policy, reward, recipe, schedule, toy_latent_shape(), prompts, i,
                                              training_options{.max_batch = 16,
                                                               .seed = 11,
                                                               .updates_per_iteration = updates,
                                                               .total_iterations = iterations,
                                                               .loss = {.kl_beta = kl_beta}});
    numbers.insert(numbers.end(), {s.reward_mean, s.reward_std, s.reward_min, s.reward_max, s.loss, s.clip_fraction,
                                   s.kl, s.first_update_log_prob_gap, static_cast<double>(s.rollout_evaluations),
                                   static_cast<double>(s.update_evaluations), static_cast<double>(s.edges),
                                   static_cast<double>(s.edges_trained), static_cast<double>(s.trees_dropped)});
  }
  const std::span<const double> w = policy.parameters();
  double sum = 0;
  for (const double x : w) sum += x;
  numbers.insert(numbers.end(), {w[0], w[137], w[511], sum});
  return numbers;
}

void check_pinned(const std::vector<double>& actual, const std::vector<double>& pinned) {
  std::string hex;
  for (const double x : actual) {
    char text[40];
    std::snprintf(text, sizeof text, "%a, ", x);
    hex += text;
  }
  INFO("actual: {" << hex << "}");
  REQUIRE(actual.size() == pinned.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    INFO("number " << i);
    CHECK(actual[i] == pinned[i]);
  }
}

}  // namespace

TEST_CASE("one process: rollouts, rewards, losses and parameters are pinned bit for bit", "[trainer][pinned]") {
  // Recorded (as hex floats) from the trainer before its one-process path became the one-rank case of the
  // data-parallel path (issue 24): a single_process gathers nothing, owns every edge and sums nothing, so every
  // number must stay what it was. 5 prompts, 3 iterations, max_batch 16 (several chunks per step); per iteration
  // reward mean, std, min, max, loss, clip fraction, KL, first-update gap, rollout and update evaluations, edges,
  // edges trained, trees dropped (13 numbers); then W[0], W[137], W[511] and the sum of W.
  SECTION("branch-widpru, 2 optimizer steps per iteration, KL term") {
    const std::vector<double> pinned = {0x1.7178944c9ef7fp-4,
                                        0x1.e66b5c9808058p-3,
                                        0x1.81244b385e8ccp-50,
                                        0x1.efce3c63df04bp-1,
                                        -0x1.50562124dd45bp-4,
                                        0x1.f68c359025cf3p-2,
                                        0x1.3a8e6c2dc0471p-6,
                                        0x0p+0,
                                        0x1.fb8p+9,
                                        0x1.45p+10,
                                        0x1.108p+10,
                                        0x1.45p+9,
                                        0x0p+0,
                                        0x1.a61ff3e6cbd0dp-30,
                                        0x1.8b815566e9dbcp-28,
                                        0x1.9084c1a261013p-108,
                                        0x1.806a1be3a9c41p-25,
                                        0x0p+0,
                                        0x1.f81f81f81f82p-2,
                                        0x1.57b8a55a053f6p-7,
                                        0x0p+0,
                                        0x1.fb8p+9,
                                        0x1.45p+10,
                                        0x1.108p+10,
                                        0x1.45p+9,
                                        0x0p+0,
                                        0x1.43efa03fa3786p-3,
                                        0x1.5636c785d56fdp-2,
                                        0x1.4078e7c0aba22p-50,
                                        0x1.ff46858f80a01p-1,
                                        -0x1.75885c1bfbfedp-4,
                                        0x1.fcd967300c9a6p-2,
                                        0x1.daa4e847656a9p-5,
                                        0x0p+0,
                                        0x1.fb8p+9,
                                        0x1.45p+10,
                                        0x1.108p+10,
                                        0x1.45p+9,
                                        0x0p+0,
                                        0x1.9d223e6dd702ep-1,
                                        -0x1.c9fcc047a85d1p-2,
                                        -0x1.8edf75b72b164p-2,
                                        0x1.83d0903f39f09p+4};
    check_pinned(with_method("branch-widpru",
                             [](auto recipe) { return one_process_numbers(recipe, mode_reward<>{}, 3, 2, 0.05); }),
                 pinned);
  }
  SECTION("branch-mix, 3 optimizer steps per iteration") {
    const std::vector<double> pinned = {0x1.ffafff025ccebp-4,
                                        0x1.30271a28c3c79p-2,
                                        0x1.1259e6c4bad7ep-45,
                                        0x1.de54048ed8c8ap-1,
                                        0x1.711eff182d676p-7,
                                        0x1.5454545454545p-1,
                                        0x0p+0,
                                        0x0p+0,
                                        0x1.fb8p+9,
                                        0x1.54p+7,
                                        0x1.108p+10,
                                        0x1.54p+7,
                                        0x0p+0,
                                        0x1.5f848a88756cbp-36,
                                        0x1.9bf61a5597275p-35,
                                        0x1.1e52ab716c1acp-113,
                                        0x1.1420da6e818f6p-32,
                                        0x0p+0,
                                        0x1.286bca1af286cp-1,
                                        0x0p+0,
                                        0x0p+0,
                                        0x1.fb8p+9,
                                        0x1.7cp+7,
                                        0x1.108p+10,
                                        0x1.7cp+7,
                                        0x0p+0,
                                        0x1.0ccb868a6fe4dp-8,
                                        0x1.c8c2a6a8e2fcep-8,
                                        0x1.4683435e0a744p-41,
                                        0x1.3b10c28147b58p-5,
                                        0x1.bdcefe883d392p-9,
                                        0x1.4cccccccccccdp-1,
                                        0x0p+0,
                                        0x0p+0,
                                        0x1.fb8p+9,
                                        0x1.9p+7,
                                        0x1.108p+10,
                                        0x1.9p+7,
                                        0x0p+0,
                                        0x1.a9f64dc56e21dp-1,
                                        -0x1.74acf400db2fep-4,
                                        -0x1.4c67875931e28p-7,
                                        0x1.b5f6e1ff3b7b6p+4};
    check_pinned(
        with_method("branch-mix", [](auto recipe) { return one_process_numbers(recipe, mode_reward<>{}, 3, 3, 0.0); }),
        pinned);
  }
  SECTION("dance") {
    const std::vector<double> pinned = {0x1.e15f751ae3466p-4,
                                        0x1.2c32fd15aec41p-2,
                                        0x1.891f15a3535b5p-52,
                                        0x1.fa757ab49b24fp-1,
                                        -0x1.999999999999ap-63,
                                        0x0p+0,
                                        0x0p+0,
                                        0x0p+0,
                                        0x1.7d4p+10,
                                        0x1.9p+10,
                                        0x1.9p+10,
                                        0x1.9p+10,
                                        0x0p+0,
                                        0x1.086383c2e8ff7p-29,
                                        0x1.295943c69815ep-27,
                                        0x1.f5f0e755c5cd2p-106,
                                        0x1.f4d3330810a3fp-25,
                                        0x0p+0,
                                        0x0p+0,
                                        0x0p+0,
                                        0x0p+0,
                                        0x1.7d4p+10,
                                        0x1.9p+10,
                                        0x1.9p+10,
                                        0x1.9p+10,
                                        0x0p+0,
                                        0x1.387e20a015aadp-3,
                                        0x1.40fb88cc344fap-2,
                                        0x1.e3e1da987b2fap-46,
                                        0x1.eb4d33c262a9bp-1,
                                        -0x1.a3d70a3d70a3ep-57,
                                        0x0p+0,
                                        0x0p+0,
                                        0x0p+0,
                                        0x1.7d4p+10,
                                        0x1.9p+10,
                                        0x1.9p+10,
                                        0x1.9p+10,
                                        0x0p+0,
                                        0x1.1e56912f0bd82p+0,
                                        -0x1.21b83523db445p-3,
                                        -0x1.3a52fce89de22p-1,
                                        0x1.2e465f3235513p+4};
    check_pinned(
        with_method("dance", [](auto recipe) { return one_process_numbers(recipe, mode_reward<>{}, 3, 1, 0.0); }),
        pinned);
  }
  SECTION("per-reward advantages of two parts, a tree dropped every iteration") {
    const auto recipe = branch_method();
    auto separate = method{recipe.topology,
                           recipe.stepper,
                           recipe.correlator,
                           recipe.fusion,
                           per_reward<decltype(recipe.fusion), per_prompt_running>{.fusion = recipe.fusion},
                           recipe.pruner};
    const std::vector<double> pinned = {0x1.398a3921060d4p-3,
                                        0x1.7a99e284f68d3p-2,
                                        0x1.81244b385e8d1p-50,
                                        0x1.6fef04a7de702p+0,
                                        0x1.918b5ca220321p-6,
                                        0x1.f8f441c2ef8f5p-2,
                                        0x0p+0,
                                        0x0p+0,
                                        0x1.fb8p+9,
                                        0x1.b4p+9,
                                        0x1.108p+10,
                                        0x1.b4p+9,
                                        0x1p+0,
                                        0x1.af1698ffd7b0dp-32,
                                        0x1.87c51189553a3p-30,
                                        0x1.59c3ea92fb6fbp-110,
                                        0x1.757c444f6d6aap-27,
                                        0x1.3aefc5715e046p-2,
                                        0x1.ef8f441c2ef9p-2,
                                        0x0p+0,
                                        0x0p+0,
                                        0x1.fb8p+9,
                                        0x1.b4p+9,
                                        0x1.108p+10,
                                        0x1.b4p+9,
                                        0x1p+0,
                                        0x1.c6a6e86f4d282p-4,
                                        0x1.2266b21b9ae3dp-2,
                                        0x1.44afd0af63e6ap-45,
                                        0x1.3b799eb68b313p+0,
                                        -0x1.9a87f2b788268p-2,
                                        0x1.f441c2ef8f442p-2,
                                        0x0p+0,
                                        0x0p+0,
                                        0x1.fb8p+9,
                                        0x1.b4p+9,
                                        0x1.108p+10,
                                        0x1.b4p+9,
                                        0x1p+0,
                                        0x1.286ada2bd7834p+0,
                                        -0x1.cf57d285ff198p-2,
                                        -0x1.f55f8f48c749ep-2,
                                        0x1.6cd780d4b0907p+4};
    check_pinned(one_process_numbers(separate, two_part_reward{.failed_tree = 2}, 3, 2, 0.0), pinned);
  }
}

namespace {

// The toy policy, recording every weight d loss / d log-prob the trainer returns to accumulate, with the row's step
// and std.
// make_toy_policy(7), fitted once.
const fourier_policy<host_backend>& toy_seven() {
  static const fourier_policy<host_backend> fitted = make_toy_policy(7);
  return fitted;
}

struct recording_policy {
  fourier_policy<host_backend> inner = toy_seven();
  std::vector<double> weights = {}, stds = {};
  std::vector<int> steps = {};
  std::vector<edge_batch<host_tensor>> calls = {};
  std::vector<std::vector<double>> gradients = {}, parameters = {};  // at each apply_update, before the step

  host_tensor operator()(const host_tensor& x, const denoise_batch& batch) { return inner(x, batch); }
  std::vector<double> accumulate(const edge_batch<host_tensor>& edges, const loss_gradient_fn& gradient) {
    calls.push_back(edges);
    return inner.accumulate(edges, loss_gradient_fn([&](std::span<const double> log_probs) {
                              std::vector<double> w = gradient(log_probs);
                              for (std::size_t i = 0; i < w.size(); ++i) {
                                weights.push_back(w[i]);
                                steps.push_back(edges.step);
                                stds.push_back(edges.std[i]);
                              }
                              return w;
                            }));
  }
  void apply_update() {
    gradients.emplace_back(inner.gradient().begin(), inner.gradient().end());
    parameters.emplace_back(inner.parameters().begin(), inner.parameters().end());
    inner.apply_update();
  }
};

// The toy's transition mean a x + c v(x) of a batch's rows.
host_tensor toy_mean(fourier_policy<host_backend>& policy, const edge_batch<host_tensor>& edges) {
  const denoise_batch batch{.step = edges.step, .sigma = edges.sigma, .trees = edges.trees, .prompts = edges.prompts};
  return host_backend{}.affine(edges.coeffs.x_coeff, edges.x, edges.coeffs.velocity_coeff, policy(edges.x, batch));
}

// Calls body(edges, at_old_mean) for each chunk after the first 109 rows (the second of two groups), whose accumulate
// calls come in pairs with RatioNorm: at `next`, then at the old mean. Returns the first group's rows.
template <class Body>
std::size_t for_each_second_group_chunk(const std::vector<edge_batch<host_tensor>>& calls, Body&& body) {
  std::size_t rows = 0;
  for (std::size_t c = 0; c < calls.size(); ++c) {
    if (rows < 109) {
      rows += calls[c].std.size();
      continue;
    }
    REQUIRE(c + 1 < calls.size());
    body(calls[c], calls[c + 1]);
    ++c;
  }
  return rows;
}

// One update of the toy over one dense tree's 218 edges (as in the stages test) with the given loss options.
struct recorded_update {
  update_report report;
  recording_policy policy;
  std::vector<std::int32_t> trained = {};  // the trained nodes, in update order
  std::vector<double> advantage = {};      // per node
};

recorded_update update_with(ppo_options loss, int updates = 1) {
  host_backend backend;
  const auto schedule = shifted_linear_schedule(20);
  const rollout_tree dense(split_schedule::dense()(20), {{.key = 0, .prompt = 0}});
  std::vector<double> scores(16);
  for (std::size_t i = 0; i < scores.size(); ++i) scores[i] = 0.1 * static_cast<double>(i % 5);
  recorded_update out;
  const auto result =
      rollout(backend, out.policy, dance_sde{}, correlated{}, schedule, dense, toy_latent_shape(), {.seed = 4});
  auto branch = branch_method();
  const edge_credit credit = assign_credit(branch, result.tree, keep_finite_trees(result.tree, scores), 0, 1);
  out.trained = credit.trained;
  out.advantage = credit.edge_advantage;
  out.report = update_policy(backend, out.policy, result, credit, dance_sde{}, schedule,
                             training_options{.max_batch = 64, .updates_per_iteration = updates, .loss = loss});
  return out;
}

}  // namespace

TEST_CASE("step weights and RatioNorm scale each edge's gradient weight as their formulas say", "[trainer][guard]") {
  // One optimizer step: every ratio is exactly 1, so each option only multiplies the plain weight -A / edges.
  const recorded_update plain = update_with({});
  REQUIRE(plain.policy.weights.size() == 218);
  const auto schedule = shifted_linear_schedule(20);
  const auto check_scaled = [&](const recorded_update& run, auto factor) {
    REQUIRE(run.policy.weights.size() == plain.policy.weights.size());
    for (std::size_t i = 0; i < plain.policy.weights.size(); ++i) {
      INFO("row " << i << " at step " << plain.policy.steps[i]);
      CHECK(run.policy.steps[i] == plain.policy.steps[i]);
      CHECK(run.policy.weights[i] ==
            Approx(plain.policy.weights[i] * factor(plain.policy.steps[i], plain.policy.stds[i])).epsilon(1e-12));
    }
  };
  // GRPO-Guard's reweighting: 1 / (sigma_t - sigma_{t+1}).
  check_scaled(update_with({.step_weight = step_weighting::inverse_dt}),
               [&](int t, double) { return 1.0 / (schedule.sigma(t) - schedule.sigma(t + 1)); });
  // TempFlow-GRPO: dance_sde's std eta sqrt(dt) of the step over its mean over the 20 steps.
  double mean_std = 0;
  for (int t = 0; t < 20; ++t) mean_std += 0.3 * std::sqrt(schedule.sigma(t) - schedule.sigma(t + 1)) / 20;
  check_scaled(update_with({.step_weight = step_weighting::noise_std}),
               [&](int t, double) { return 0.3 * std::sqrt(schedule.sigma(t) - schedule.sigma(t + 1)) / mean_std; });
  // RatioNorm: d log r_hat / d log p = the edge's std.
  check_scaled(update_with({.ratio_norm = true}), [](int, double std) { return std; });
  // They compose: both factors.
  check_scaled(update_with({.ratio_norm = true, .step_weight = step_weighting::inverse_dt}),
               [&](int t, double std) { return std / (schedule.sigma(t) - schedule.sigma(t + 1)); });
  CHECK(update_with({.ratio_norm = true}).report.evaluations == 218);
  // equal_steps: the dense tree trains 2 edges at steps 0-2, 4 at 3-5, 8 at 6-8 and 16 at 9-19 (218 over 20 steps),
  // so w_t = (218 / 20) / E_t: 5.45 at steps 0-2, 2.725, 1.3625, 0.68125 at 9-19.
  check_scaled(update_with({.step_weight = step_weighting::equal_steps}), [](int t, double) {
    const double edges_at_step = t < 3 ? 2 : t < 6 ? 4 : t < 9 ? 8 : 16;
    return 218.0 / 20.0 / edges_at_step;
  });
}

TEST_CASE("RatioNorm after the first optimizer step: the old means and the gap's gradient", "[trainer][guard]") {
  // Two groups [0, 109), [109, 218): the second group's edges cost three more evaluations each (their old mean
  // before the first step, their current mean, the accumulate at the old mean); that accumulate's weights are the
  // first's, negated (the gap is -log p(old mean) + const).
  const recorded_update guarded = update_with({.ratio_norm = true}, 2);
  CHECK(guarded.report.evaluations == 218 + 3 * 109);
  CHECK(guarded.policy.inner.optimizer_state().steps == 2);
  const std::vector<double>& w = guarded.policy.weights;
  REQUIRE(w.size() == 218 + 109);
  // After the first group's 109 rows, each chunk of the second group appears twice: at next, then at the old mean.
  std::size_t row = 109, moved = 0;
  while (row < w.size()) {
    std::size_t chunk = 0;
    while (row + chunk < w.size() && guarded.policy.steps[row + chunk] == guarded.policy.steps[row] && chunk < 2 * 64)
      ++chunk;
    REQUIRE(chunk % 2 == 0);
    const std::size_t half = chunk / 2;
    for (std::size_t i = 0; i < half; ++i) {
      CHECK(w[row + half + i] == -w[row + i]);
      if (w[row + i] != 0.0) ++moved;
    }
    row += chunk;
  }
  CHECK(moved > 0);
  CHECK(std::isfinite(guarded.report.loss));

  // The old means are the rollout policy's (the toy's base weights): each second-group chunk's second call has the
  // same parents and, as `next`, the base policy's transition mean a x + c v_base(x).
  auto base = toy_seven();
  std::size_t pairs = 0;
  const std::size_t first_rows =
      for_each_second_group_chunk(guarded.policy.calls, [&](const auto& edges, const auto& at_old) {
        CHECK(at_old.x == edges.x);
        CHECK(at_old.step == edges.step);
        CHECK(at_old.next == toy_mean(base, edges));
        CHECK_FALSE(edges.next == at_old.next);
        ++pairs;
      });
  CHECK(first_rows == 109);

  // The second group's gradient is that of its RatioNorm loss, sum_i ratio_norm_loss(log p(next_i), log p_old(next_i),
  // b_i, A_i, eps, s_i) / 218 with b_i = mean (mu_i - mu_old_i)^2 / (2 s_i^2), by central differences in the weights
  // the second step started from.
  host_backend backend;
  auto at = toy_seven();
  const auto second_group_loss = [&](std::span<const double> weights) {
    std::copy(weights.begin(), weights.end(), at.parameters().begin());
    double total = 0;
    std::size_t k = 109;
    for_each_second_group_chunk(guarded.policy.calls, [&](const auto& edges, const auto& at_old) {
      const host_tensor mean = toy_mean(at, edges);
      const std::vector<double> log_new = backend.row_log_prob(edges.next, mean, edges.std);
      const std::vector<double> log_old = backend.row_log_prob(edges.next, at_old.next, edges.std);
      const std::vector<double> old_under_new = backend.row_log_prob(at_old.next, mean, edges.std);
      for (std::size_t i = 0; i < edges.std.size(); ++i, ++k) {
        const double gap = std::max(0.0, kl_from_log_prob_at_reference(old_under_new[i], edges.std[i]));
        const double a = clip_advantage(guarded.advantage[static_cast<std::size_t>(guarded.trained[k])], 5.0);
        total += ratio_norm_loss(log_new[i], log_old[i], gap, a, 1e-3, edges.std[i]) / 218.0;
      }
    });
    CHECK(k == 218);
    return total;
  };
  REQUIRE(guarded.policy.parameters.size() == 2);
  std::vector<double> weights = guarded.policy.parameters[1];
  const std::vector<double>& gradient = guarded.policy.gradients[1];
  const double h = 1e-6;
  int nonzero = 0;
  for (std::size_t j = 0; j < weights.size(); j += 41) {
    const double original = weights[j];
    weights[j] = original + h;
    const double up = second_group_loss(weights);
    weights[j] = original - h;
    const double down = second_group_loss(weights);
    weights[j] = original;
    INFO("weight " << j);
    CHECK(gradient[j] == Approx((up - down) / (2 * h)).epsilon(1e-4).margin(1e-10));
    if (std::abs(gradient[j]) > 1e-8) ++nonzero;
  }
  CHECK(nonzero >= 5);
  // Edges per step 2, 2, 2, 4, 4, 4, 8, 8, 8, then 16: the first group ends 3 edges into step 13, so the second
  // group is 13 edges of step 13 and 16 of each of steps 14 - 19: 7 chunks.
  CHECK(pairs == 7);
}
