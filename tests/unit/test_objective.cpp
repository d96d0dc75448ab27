// The decoupled objectives (loss/objective.hpp): the matching rows' algebra and their update in train_iteration.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "branchgrpo/branchgrpo.hpp"
#include "branchgrpo/toy.hpp"

using namespace branchgrpo;

namespace {

double squared_norm(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += (a[i] - b[i]) * (a[i] - b[i]);
  return sum;
}

template <class Recipe>
std::vector<iteration_stats> train_toy(Recipe recipe, int iterations, std::int64_t max_batch, int updates,
                                       std::vector<double>* parameters = nullptr) {
  auto policy = make_toy_policy(7);
  mode_reward<> reward;
  host_backend backend;
  const auto schedule = shifted_linear_schedule(20);
  const std::vector<std::int64_t> prompts = {0, 1, 2, 3};
  std::vector<iteration_stats> stats;
  for (int i = 0; i < iterations; ++i)
    stats.push_back(train_iteration(
        backend, policy, reward, recipe, schedule, toy_latent_shape(), prompts, i,
        training_options{
            .max_batch = max_batch, .seed = 11, .updates_per_iteration = updates, .total_iterations = iterations}));
  if (parameters) parameters->assign(policy.parameters().begin(), policy.parameters().end());
  return stats;
}

// v = theta x on every element. accumulate evaluates theta + offset while the policy as a denoiser (the rollout,
// v_old and lp_old) uses theta, and apply_update records the gradient without stepping: the trainer's reported
// loss is then L(theta + offset) with the sampling policy at theta, and its gradient can be checked against
// central differences of that loss.
struct linear_policy {
  double theta = -0.8;
  double offset = 0;
  double gradient = 0, applied = 0;
  host_backend backend = {};

  host_tensor operator()(const host_tensor& x, const denoise_batch&) const { return backend.affine(theta, x, 0, x); }
  std::vector<double> accumulate(const edge_batch<host_tensor>& edges, const loss_gradient_fn& weights_of) {
    const double slope = theta + offset;
    const host_tensor mean =
        backend.affine(edges.coeffs.x_coeff + edges.coeffs.velocity_coeff * slope, edges.x, 0, edges.x);
    const std::vector<double> log_probs = backend.row_log_prob(edges.next, mean, edges.std);
    const std::vector<double> weights = weights_of(log_probs);
    const std::vector<double> x = backend.to_host(edges.x), next = backend.to_host(edges.next),
                              mu = backend.to_host(mean);
    const std::size_t dim = x.size() / log_probs.size();
    for (std::size_t r = 0; r < log_probs.size(); ++r)
      for (std::size_t i = 0; i < dim; ++i) {
        const std::size_t k = r * dim + i;
        gradient += weights[r] * (next[k] - mu[k]) * edges.coeffs.velocity_coeff * x[k] /
                    (edges.std[r] * edges.std[r] * static_cast<double>(dim));
      }
    return log_probs;
  }
  void apply_update() {
    applied += gradient;
    gradient = 0;
  }
};

template <class Objective>
std::pair<double, double> linear_loss_and_gradient(Objective objective, double offset, int updates) {
  linear_policy policy{.offset = offset};
  mode_reward<> reward;
  host_backend backend;
  auto recipe = with_objective(branch_method(), objective);
  const std::vector<std::int64_t> prompts = {0, 1};
  const iteration_stats stats =
      train_iteration(backend, policy, reward, recipe, shifted_linear_schedule(20), toy_latent_shape(), prompts, 0,
                      training_options{.max_batch = 7, .seed = 5, .updates_per_iteration = updates});
  return {stats.loss, policy.applied};
}

}  // namespace

TEST_CASE("matching rows: std, log-prob and weights", "[objective]") {
  CHECK(matching_std(0.5) == 1.0);
  CHECK(matching_std(2.0) == 0.5);
  CHECK(weight_at(time_weighting::t_squared, 0.5) == 0.25);
  CHECK(weight_at(time_weighting::t, 0.5) == 0.5);
  CHECK(weight_at(time_weighting::uniform, 0.5) == 1.0);
  // w 0.5 (std 1), v {1, 2}, target {0, 0}: the backend's Gaussian log-prob, then the matching log-prob.
  host_backend backend;
  const latent_shape shape{{2}};
  const std::vector<double> v = {1.0, 2.0}, target = {0.0, 0.0};
  const double gaussian = backend.row_log_prob(backend.from_host(target, 1, shape), backend.from_host(v, 1, shape),
                                               std::vector<double>{matching_std(0.5)})[0];
  CHECK(gaussian == Approx(-1.25 - 0.5 * std::log(2.0 * std::numbers::pi)));
  CHECK(matching_log_prob(gaussian, 0.5) == Approx(-1.25).epsilon(1e-14));
  // w 2 (std 0.5): -2 * (1 + 4) / 2 = -5.
  const double sharp = backend.row_log_prob(backend.from_host(target, 1, shape), backend.from_host(v, 1, shape),
                                            std::vector<double>{matching_std(2.0)})[0];
  CHECK(matching_log_prob(sharp, 2.0) == Approx(-5.0).epsilon(1e-14));
  CHECK(nft_optimality(2.5, 5) == 0.75);
  CHECK(nft_optimality(-9, 5) == 0.0);
  CHECK(nft_optimality(0, 5) == 0.5);
  CHECK_THROWS_WITH(matching_std(0.0), "matching weight 0 is not finite and positive");
}

TEST_CASE("NFT's v+ / v- form equals its two matching rows", "[objective]") {
  // beta 0.5 -> u+ = 2 u - v_old, u- = -2 u + 3 v_old.
  const nft_targets to = nft_targets::of(0.5);
  CHECK(to.plus_u == 2.0);
  CHECK(to.plus_old == -1.0);
  CHECK(to.minus_u == -2.0);
  CHECK(to.minus_old == 3.0);
  // v_theta {1, -2}, v_old {0.5, 1}, u {2, 0}: v+ = {0.75, -0.5}, ||v+ - u||^2 = 1.8125;
  // u+ = {3.5, -1}, beta^2 ||v_theta - u+||^2 = 0.25 * 7.25 = 1.8125. v- = {0.25, 2.5}, ||v- - u||^2 = 9.3125;
  // u- = {-2.5, 3}, 0.25 * 37.25 = 9.3125.
  const double beta = 0.5;
  const std::vector<double> v = {1.0, -2.0}, old = {0.5, 1.0}, u = {2.0, 0.0};
  std::vector<double> plus(2), minus(2), u_plus(2), u_minus(2);
  for (int i = 0; i < 2; ++i) {
    plus[i] = beta * v[i] + (1 - beta) * old[i];
    minus[i] = (1 + beta) * old[i] - beta * v[i];
    u_plus[i] = to.plus_u * u[i] + to.plus_old * old[i];
    u_minus[i] = to.minus_u * u[i] + to.minus_old * old[i];
  }
  CHECK(squared_norm(plus, u) == Approx(1.8125));
  CHECK(beta * beta * squared_norm(v, u_plus) == Approx(1.8125));
  CHECK(squared_norm(minus, u) == Approx(9.3125));
  CHECK(beta * beta * squared_norm(v, u_minus) == Approx(9.3125));
  // beta 1: u+ = u, u- = 2 v_old - u.
  const nft_targets one = nft_targets::of(1.0);
  CHECK(one.plus_u == 1.0);
  CHECK(one.plus_old == 0.0);
  CHECK(one.minus_u == -1.0);
  CHECK(one.minus_old == 2.0);
  CHECK_THROWS_WITH(nft_targets::of(0.0), "nft beta 0 is not finite and positive");
}

TEST_CASE("matching steps are keyed draws over the schedule", "[objective]") {
  CHECK(matching_step(3, 1, 2, 5, 0, 1) == 0);
  CHECK(matching_step(3, 1, 2, 5, 0, 20) == matching_step(3, 1, 2, 5, 0, 20));
  std::vector<int> counts(20, 0);
  for (std::uint32_t node = 0; node < 2000; ++node)
    ++counts[static_cast<std::size_t>(matching_step(3, 1, 2, node, 0, 20))];
  for (int c : counts) CHECK(c > 50);  // about 100 each
}

TEST_CASE("decoupled methods train on the leaves, deterministically and independent of max_batch", "[objective]") {
  for (const auto name : decoupled_method_names) {
    DYNAMIC_SECTION(name) {
      std::vector<double> a, b, c;
      const auto stats = with_method(name, [&](auto recipe) { return train_toy(recipe, 2, 64, 2, &a); });
      with_method(name, [&](auto recipe) { return train_toy(recipe, 2, 64, 2, &b); });
      with_method(name, [&](auto recipe) { return train_toy(recipe, 2, 5, 2, &c); });
      CHECK(a == b);
      REQUIRE(a.size() == c.size());
      for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(c[i]).margin(1e-12));
      // 4 trees of 16 leaves, one noise level each; NFT evaluates v_old then two rows, AWM lp_old then one row.
      const bool nft = name.ends_with("nft");
      CHECK(stats[0].edges_trained == 64);
      CHECK(stats[0].update_evaluations == (nft ? 3 : 2) * 64);
      CHECK(std::isfinite(stats[0].loss));
      // AWM with two optimizer steps: the pre-pass lp_old equals the first step's lp exactly on the toy.
      CHECK(stats[0].first_update_log_prob_gap == 0.0);
    }
  }
}

TEST_CASE("one optimizer step of AWM has ratio 1 and a loss of -mean clipped advantage", "[objective]") {
  const auto stats = with_method("branch-awm", [](auto recipe) { return train_toy(recipe, 1, 64, 1); });
  CHECK(stats[0].update_evaluations == 64);  // no pre-pass: the first log-prob is the old one
  CHECK(stats[0].clip_fraction == 0.0);
  // depth-wise advantages of a tree's 16 leaves are z-scores: their mean is 0, so is the loss.
  CHECK(stats[0].loss == Approx(0.0).margin(1e-12));
}

TEST_CASE("decoupled objectives refuse bad options, one line naming the value", "[objective]") {
  const auto run = [](auto objective) {
    auto recipe = with_objective(branch_method(), objective);
    (void)train_toy(recipe, 1, 64, 1);
  };
  CHECK_THROWS_WITH(run(diffusion_nft{.beta = 0}), "objective.beta = 0.0: must be in [1e-6, 1000000]");
  CHECK_THROWS_WITH(run(diffusion_nft{.times_per_sample = 0}), "objective.times_per_sample = 0: must be in [1, 256]");
  CHECK_THROWS_WITH(run(diffusion_nft{.advantage_max = -1}), "objective.advantage_max = -1.0: must be positive");
  CHECK_THROWS_WITH(run(advantage_weighted_matching{.clip_range = 1.5}),
                    "objective.clip_range = 1.5: must be in (0, 1)");
  CHECK_THROWS_WITH(run(advantage_weighted_matching{.times_per_sample = 300}),
                    "objective.times_per_sample = 300: must be in [1, 256]");
  auto policy = make_toy_policy(7);
  mode_reward<> reward;
  host_backend backend;
  auto recipe = with_objective(branch_method(), diffusion_nft{});
  const std::vector<std::int64_t> prompts = {0};
  training_options options{.max_batch = 64};
  options.loss.kl_beta = 0.01;
  CHECK_THROWS_WITH(train_iteration(backend, policy, reward, recipe, shifted_linear_schedule(20), toy_latent_shape(),
                                    prompts, 0, options),
                    Catch::StartsWith("kl_beta = 0.01 with objective nft:"));
  // A ratio-guard option with a loss that has no transition ratio: one line naming it.
  options.loss.kl_beta = 0.0;
  options.loss.ratio_norm = true;
  CHECK_THROWS_WITH(train_iteration(backend, policy, reward, recipe, shifted_linear_schedule(20), toy_latent_shape(),
                                    prompts, 0, options),
                    Catch::StartsWith("ratio_norm = on with objective nft: RatioNorm normalizes a transition's"));
  options.loss.ratio_norm = false;
  options.loss.step_weight = step_weighting::inverse_dt;
  CHECK_THROWS_WITH(train_iteration(backend, policy, reward, recipe, shifted_linear_schedule(20), toy_latent_shape(),
                                    prompts, 0, options),
                    Catch::StartsWith("step_weight = inverse_dt with objective nft: per-step weights"));
}

TEST_CASE("the decoupled objectives' gradient is that of their loss (central differences)", "[objective]") {
  const double h = 1e-5;
  const auto check = [&](auto objective, int updates) {
    const auto [loss, gradient] = linear_loss_and_gradient(objective, 0.0, updates);
    const double numeric = (linear_loss_and_gradient(objective, h, updates).first -
                            linear_loss_and_gradient(objective, -h, updates).first) /
                           (2 * h);
    INFO("loss " << loss << ", gradient " << gradient << ", central difference " << numeric);
    CHECK(std::abs(gradient) > 1e-3);  // a real signal, not 0 == 0
    CHECK(gradient == Approx(numeric).epsilon(1e-6));
  };
  SECTION("nft, beta 1") { check(diffusion_nft{}, 1); }
  SECTION("nft, beta 0.3, two draws") { check(diffusion_nft{.beta = 0.3, .times_per_sample = 2}, 1); }
  SECTION("nft with intermediate nodes") { check(diffusion_nft{.intermediate_nodes = true}, 1); }
  // Two optimizer steps: lp_old from the pre-pass at theta; a wide clip range keeps every ratio unclipped.
  SECTION("awm, t^2 weighting") {
    check(advantage_weighted_matching{.weighting = time_weighting::t_squared, .clip_range = 0.5}, 2);
  }
}

TEST_CASE("on-policy, NFT (any beta) and AWM with uniform weighting take the same step", "[objective]") {
  // At v_theta = v_old, v+ = v- = v_old for every beta: d NFT / d v = 2 a_max (r - (1 - r)) (v - u) / D
  // = 2 A (v - u) / D (r = A / (2 a_max) + 1/2), and d AWM / d v = -A d lp / d v = 2 A (v - u) / D: the same
  // gradient on the same keyed rows, so the same Adam step.
  std::vector<double> nft, nft_half, awm, weighted;
  (void)train_toy(with_objective(branch_method(), diffusion_nft{}), 1, 64, 1, &nft);
  (void)train_toy(with_objective(branch_method(), diffusion_nft{.beta = 0.5}), 1, 64, 1, &nft_half);
  (void)train_toy(with_objective(branch_method(), advantage_weighted_matching{}), 1, 64, 1, &awm);
  // w(t) = t weighs the rows differently: a different step.
  (void)train_toy(with_objective(branch_method(), advantage_weighted_matching{.weighting = time_weighting::t}), 1, 64,
                  1, &weighted);
  REQUIRE(nft.size() == awm.size());
  double largest = 0, moved = 0;
  for (std::size_t i = 0; i < nft.size(); ++i) {
    largest = std::max({largest, std::abs(nft[i] - awm[i]), std::abs(nft_half[i] - awm[i])});
    moved = std::max(moved, std::abs(weighted[i] - awm[i]));
  }
  CHECK(largest < 1e-12);
  CHECK(moved > 1e-9);
}

TEST_CASE("an any_objective trains as the objective it holds (a run config's [objective])", "[objective]") {
  for (const any_objective& chosen : {any_objective{ppo_ratio{}}, any_objective{diffusion_nft{.beta = 0.5}},
                                      any_objective{advantage_weighted_matching{.times_per_sample = 2}}}) {
    DYNAMIC_SECTION(chosen.name()) {
      std::vector<double> held, visited;
      const auto direct = std::visit(
          [&](const auto& objective) { return train_toy(with_objective(branch_method(), objective), 2, 64, 2, &held); },
          chosen.policy);
      const auto through = train_toy(with_objective(branch_method(), chosen), 2, 64, 2, &visited);
      CHECK(held == visited);
      CHECK(direct[1].edges_trained == through[1].edges_trained);
      CHECK(direct[1].loss == through[1].loss);
    }
  }
}

TEST_CASE("intermediate nodes add the trees' internal split nodes, one row each", "[objective]") {
  // Dense tree {0, 3, 6, 9} x 2: 2 + 4 + 8 = 14 split nodes below the root, 16 leaves; 4 trees.
  for (const bool nft : {true, false}) {
    const auto stats =
        nft ? train_toy(with_objective(branch_method(), diffusion_nft{.intermediate_nodes = true}), 1, 64, 1)
            : train_toy(with_objective(branch_method(), advantage_weighted_matching{.intermediate_nodes = true}), 1, 64,
                        1);
    CHECK(stats[0].edges_trained == 4 * (16 + 14));
    CHECK(std::isfinite(stats[0].loss));
  }
  // dance's chains split only at the root: nothing to add.
  const auto dance = train_toy(with_objective(dance_method(), diffusion_nft{.intermediate_nodes = true}), 1, 64, 1);
  CHECK(dance[0].edges_trained == 4 * 16);
}
