// The decoupled objectives (loss/objective.hpp): the matching rows' algebra and their update in train_iteration.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
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
                                      any_objective{advantage_weighted_matching{.times_per_sample = 2}},
                                      any_objective{flow_dppo{.kl_threshold = 1e-3}}}) {
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

TEST_CASE("Flow-DPPO's edge term: the worked examples of dppo_edge_loss", "[objective][dppo]") {
  const double ln2 = std::log(2.0);
  // kl past the bound and the ratio (2) moved with the advantage (+1): masked.
  const dppo_edge cut = dppo_edge_loss(ln2, 0.0, 0.1, 1.0, 0.01);
  CHECK((cut.masked && cut.loss == 0.0 && cut.loss_gradient == 0.0));
  // Inside the trust region: -A ratio = -2, its derivative in the log-prob the same.
  const dppo_edge inside = dppo_edge_loss(ln2, 0.0, 0.001, 1.0, 0.01);
  CHECK((!inside.masked && inside.loss == Approx(-2.0).epsilon(1e-15) && inside.loss_gradient == inside.loss));
  // Past the bound but against the advantage: kept, -(-1) 2 = 2.
  const dppo_edge against = dppo_edge_loss(ln2, 0.0, 0.1, -1.0, 0.01);
  CHECK((!against.masked && against.loss == Approx(2.0).epsilon(1e-15)));
  // Ratio below 1 with a negative advantage past the bound: masked; ratio exactly 1: never; kl at the bound counts.
  CHECK(dppo_edge_loss(-ln2, 0.0, 0.5, -1.0, 0.01).masked);
  CHECK(!dppo_edge_loss(0.3, 0.3, 1e9, 1.0, 0.01).masked);
  CHECK(dppo_edge_loss(ln2, 0.0, 0.01, 1.0, 0.01).masked);
  CHECK(!dppo_edge_loss(ln2, 0.0, 0.0099, 1.0, 0.01).masked);
}

TEST_CASE("Flow-DPPO's first optimizer step is PPO's; later steps are masked by the step KL", "[objective][dppo]") {
  // One optimizer step: the policy is the rollout's, every ratio 1 and KL 0, and PPO's clipped term has PPO's
  // unclipped gradient -A there: the same parameters, bit for bit, and the same evaluations.
  std::vector<double> ppo, dppo;
  const auto ppo_stats = train_toy(with_objective(branch_method(), ppo_ratio{}), 1, 64, 1, &ppo);
  const auto dppo_stats = train_toy(with_objective(branch_method(), flow_dppo{}), 1, 64, 1, &dppo);
  CHECK(ppo == dppo);
  CHECK(dppo_stats[0].update_evaluations == ppo_stats[0].update_evaluations);
  CHECK(dppo_stats[0].clip_fraction == 0.0);
  // Two optimizer steps: the second step's edges get two forwards more each (the old and the current means). A
  // bound no KL reaches masks nothing; a bound of 1e-30 masks every second-step edge whose ratio moved with its
  // advantage, and the parameters differ.
  std::vector<double> open_region, tight_region;
  const auto open_stats =
      train_toy(with_objective(branch_method(), flow_dppo{.kl_threshold = 1e9}), 1, 64, 2, &open_region);
  const auto tight_stats =
      train_toy(with_objective(branch_method(), flow_dppo{.kl_threshold = 1e-30}), 1, 64, 2, &tight_region);
  const std::int64_t edges = open_stats[0].edges_trained;
  const auto second_step = edges - static_cast<std::int64_t>(update_group_ends(edges, 2).front());
  CHECK(open_stats[0].update_evaluations == edges + 2 * second_step);
  CHECK(open_stats[0].clip_fraction == 0.0);
  CHECK(tight_stats[0].clip_fraction > 0.05);
  CHECK(tight_stats[0].clip_fraction <= 0.5);  // first-step edges are never masked
  CHECK(open_region != tight_region);
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

// Reference rows from the authors' code (tests/reference/objective_reference.py, which runs the loss lines of
// NVlabs/DiffusionNFT scripts/train_nft_sd3.py at 24af5554 and scxue/advantage_weighted_matching
// scripts/train_sd3_awm.py at be513723 on these inputs, float64). docs/loss.md lists the conventions mapped here.
namespace {

struct nft_reference_row {
  double beta, advantage_max, advantage, t;
  std::array<double, 4> v_theta, v_old, u;
  double r, loss;
  std::array<double, 4> gradient;  // d loss / d v_theta
};

struct awm_reference_row {
  time_weighting weighting;
  double t;
  std::array<double, 4> v, u;
  double lp, lp_old, advantage, advantage_clip, advantage_max, clip_range, loss, d_lp;
  std::array<double, 4> d_v;  // d loss / d v
};

double relative_gap(double ours, double theirs) {
  return ours == theirs ? 0.0 : std::abs(ours - theirs) / std::max(std::abs(theirs), 1e-300);
}

// The matching log-prob -w mean (v - target)^2 as the trainer computes it: the backend's Gaussian log-prob of a row
// with std matching_std(w), then matching_log_prob.
double trainer_log_prob(const std::array<double, 4>& v, const std::array<double, 4>& target, double weight) {
  host_backend backend;
  const latent_shape shape{{4}};
  const std::vector<double> stds = {matching_std(weight)};
  const double gaussian =
      backend.row_log_prob(backend.from_host(std::vector<double>(target.begin(), target.end()), 1, shape),
                           backend.from_host(std::vector<double>(v.begin(), v.end()), 1, shape), stds)[0];
  return matching_log_prob(gaussian, weight);
}

double mean_square(const std::array<double, 4>& a, const std::array<double, 4>& b) {
  double sum = 0;
  for (std::size_t i = 0; i < 4; ++i) sum += (a[i] - b[i]) * (a[i] - b[i]) / 4.0;
  return sum;
}

double mean_abs(const std::array<double, 4>& a, const std::array<double, 4>& b) {
  double sum = 0;
  for (std::size_t i = 0; i < 4; ++i) sum += std::abs(a[i] - b[i]) / 4.0;
  return sum;
}

// clang-format off
// {beta, a_max, A, t, v_theta, v_old, u = eps - x0, r, loss, d loss / d v_theta}: one sample of 4 elements each.
// Rows 6 and 7 (from 0) have upstream adaptive weights of 1; rows 8 - 10 are also one upstream batch (kNftBatchLoss).
const std::vector<nft_reference_row> kNftReference = {
    {1.0, 5.0, 2.5, 0.6, {-0.9, 1.7, 0.55, -0.2}, {-0.7, 2.05, 0.95, -0.45}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, 0.75, 0.9191999999999999, {-0.8400000000000005, -2.0999999999999996, -2.079999999999999, 0.9800000000000002}},
    {0.5, 5.0, -1.2, 0.3, {-0.9, 1.7, 0.55, -0.2}, {-0.7, 2.05, 0.95, -0.45}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, 0.38, 0.6003454838709681, {-0.4294408602150539, -1.005215053763441, -1.019956989247311, 0.5086129032258068}},
    {0.1, 5.0, 7.0, 0.85, {-0.9, 1.7, 0.55, -0.2}, {-0.7, 2.05, 0.95, -0.45}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, 1.0, 3.1875, {2.3800000000000017, -1.1899999999999984, 1.3599999999999977, -3.5700000000000034}},
    {2.0, 5.0, -9.0, 0.45, {-0.9, 1.7, 0.55, -0.2}, {-0.7, 2.05, 0.95, -0.45}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, 0.0, 0.7922499999999999, {-0.8166666666666675, -1.1666666666666659, -1.4666666666666666, 1.0500000000000003}},
    {1.0, 1.0, 0.3, 0.95, {-0.9, 1.7, 0.55, -0.2}, {-0.7, 2.05, 0.95, -0.45}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, 0.65, 0.30136533333333326, {-0.27951111111111127, -0.6354444444444443, -0.6519111111111111, 0.3331333333333334}},
    {0.5, 5.0, 0.0, 0.15, {-0.9, 1.7, 0.55, -0.2}, {-0.7, 2.05, 0.95, -0.45}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, 0.5, 0.28435887096774215, {-0.18252688172043038, -0.569220430107527, -0.523655913978494, 0.2004032258064519}},
    {0.5, 5.0, 1.5, 0.4, {-0.09000000000000008, 1.25, 1.27, 0.38}, {-1.09, 1.6500000000000004, 1.27, -0.22}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, 0.65, 1.9400000000000004, {1.0250000000000004, -0.8000000000000005, 0.29999999999999993, 0.8250000000000004}},
    {1.0, 5.0, -2.0, 0.7, {-1.49, 2.75, 1.2200000000000002, -1.3699999999999999}, {-1.0525, 3.0125, 0.6950000000000002, -1.1949999999999998}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, 0.3, 3.0242187499999993, {-0.83125, -1.6187500000000006, 1.4875000000000005, 0.4374999999999999}},
    {0.5, 5.0, 3.1, 0.25, {-0.9, 1.7, 0.55, -0.2}, {-0.7, 2.05, 0.95, -0.45}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, 0.81, 0.40584395161290415, {-0.16560035842293913, -1.2355062724014352, -0.931648745519712, 0.10192204301075287}},
    {0.5, 5.0, -0.8, 0.55, {-0.9, 1.7, 0.55, -0.2}, {-0.7, 2.05, 0.95, -0.45}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, 0.42, 1.0813053225806455, {-0.7479605734767036, -1.9243100358422938, -1.8866379928315409, 0.8665752688172058}},
    {0.5, 5.0, 1.0, 0.9, {-0.9, 1.7, 0.55, -0.2}, {-0.7, 2.05, 0.95, -0.45}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, 0.6, 1.6270838709677427, {-0.9341935483870986, -3.748387096774193, -3.2103225806451605, 0.9329032258064522}},
};
const double kNftBatchLoss = 1.0380777150537641;
// clang-format on

// clang-format off
// {w(t), t, v, u, lp, lp_old, A, adv_clip_max, advantage_max (0: None), clip_range, loss, d loss / d lp, d loss / d v},
// loss_type 'exp_first'.
const std::vector<awm_reference_row> kAwmReference = {
    {time_weighting::uniform, 0.6, {-0.9, 1.7, 0.55, -0.2}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, -0.06285000000000007, -0.06285000000000007, 1.3, 5.0, 0.0, 0.0001, -1.3, -1.3, {-0.0715, -0.2275000000000002, -0.20800000000000005, 0.078}},
    {time_weighting::uniform, 0.6, {-0.9, 1.7, 0.55, -0.2}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, -0.06285000000000007, -0.06290000000000007, -0.7, 5.0, 0.0, 0.0001, 0.7000350008750146, 0.7000350008750146, {0.038501925048125794, 0.12250612515312766, 0.11200560014000235, -0.04200210005250087}},
    {time_weighting::t, 0.3, {-0.9, 1.7, 0.55, -0.2}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, -0.01885500000000002, -0.019155000000000023, 2.0, 5.0, 0.0, 0.0001, -2.0002, 0.0, {0.0, 0.0, 0.0, -0.0}},
    {time_weighting::t, 0.3, {-0.5, 2.3, 0.4, -0.6}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, -0.033442499999999986, -0.03374249999999999, -2.0, 5.0, 0.0, 0.0001, 2.0006000900090006, 2.0006000900090006, {-0.08702610391539153, -0.07502250337533738, 0.14104230634563455, 0.084025203780378}},
    {time_weighting::t_squared, 0.85, {-0.5, 2.3, 0.4, -0.6}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, -0.08054068749999996, -0.08024068749999996, 1.5, 5.0, 0.0, 0.0001, -1.4995500674932505, -1.4995500674932505, {0.15709661394576166, 0.13542811547048392, -0.2546048570845103, -0.15167948932694225}},
    {time_weighting::t_squared, 0.85, {-0.9, 1.7, 0.55, -0.2}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, -0.04540912500000005, -0.04510912500000005, -1.5, 5.0, 0.0, 0.0001, 1.49985, 0.0, {0.0, 0.0, 0.0, -0.0}},
    {time_weighting::uniform, 0.45, {-0.5, 2.3, 0.4, -0.6}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, -0.11147499999999995, -0.011474999999999944, 8.0, 5.0, 0.0, 0.2, -4.524187090179797, -4.524187090179797, {0.6560071280760706, 0.5655233862724737, -1.0631839661922526, -0.6333861926251716}},
    {time_weighting::t, 0.95, {-0.9, 1.7, 0.55, -0.2}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, -0.059707500000000066, -0.3097075000000001, -6.0, 5.0, 0.0, 0.2, 6.420127083438707, 6.420127083438707, {0.3354516401096724, 1.067346127621686, 0.9758593166826837, -0.3659472437560063}},
    {time_weighting::t, 0.95, {-0.5, 2.3, 0.4, -0.6}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, -0.10590124999999995, -0.055901249999999944, 0.9, 5.0, 1.0, 0.2, -0.1712212964101285, -0.1712212964101285, {0.023585733580495205, 0.020332528948702727, -0.0382251544235612, -0.02277243242254709}},
    {time_weighting::t_squared, 0.15, {-0.9, 1.7, 0.55, -0.2}, {-0.79, 2.0500000000000003, 0.8700000000000001, -0.32}, -0.0014141250000000015, -0.9014141250000001, 2.0, 5.0, 1.0, 1.0, -0.8, 0.0, {0.0, 0.0, 0.0, -0.0}},
};
// clang-format on

}  // namespace

TEST_CASE("NFT's loss and gradient against DiffusionNFT's code", "[objective][reference]") {
  // Upstream trains x0_hat = x_t - t v+- against x0 with the adaptive weight 1 / max(mean |x0_hat - x0|, 1e-5)
  // (no gradient). As x_t - x0 = t u, x0_hat - x0 = t (u - v+-): its per-sample loss is the velocity form's with
  // each term weighted by k+- = t^2 / max(t mean |v+- - u|, 1e-5), i.e. our two matching rows with weights w = k+-
  // instead of 1. Where k+- = 1 (rows 6, 7) it is our loss as is.
  double worst = 0;
  int unit_rows = 0;
  std::vector<double> mapped_losses;
  for (std::size_t n = 0; n < kNftReference.size(); ++n) {
    const nft_reference_row& row = kNftReference[n];
    INFO("row " << n);
    const nft_targets to = nft_targets::of(row.beta);
    std::array<double, 4> u_plus{}, u_minus{}, v_plus{}, v_minus{};
    for (std::size_t i = 0; i < 4; ++i) {
      u_plus[i] = to.plus_u * row.u[i] + to.plus_old * row.v_old[i];
      u_minus[i] = to.minus_u * row.u[i] + to.minus_old * row.v_old[i];
      v_plus[i] = row.beta * row.v_theta[i] + (1 - row.beta) * row.v_old[i];
      v_minus[i] = (1 + row.beta) * row.v_old[i] - row.beta * row.v_theta[i];
    }
    const double r = nft_optimality(row.advantage, row.advantage_max);
    CHECK(relative_gap(r, row.r) < 1e-15);
    const double scale = row.advantage_max * row.beta;
    // Ours (update_matching): rows of weight 1, L = -a_max beta (r lp+ + (1 - r) lp-); equal to the v+- form.
    const double ours = -scale * (r * trainer_log_prob(row.v_theta, u_plus, 1.0) +
                                  (1 - r) * trainer_log_prob(row.v_theta, u_minus, 1.0));
    const double velocity_form =
        row.advantage_max * (r * mean_square(v_plus, row.u) + (1 - r) * mean_square(v_minus, row.u)) / row.beta;
    CHECK(relative_gap(ours, velocity_form) < 1e-12);
    // Upstream's adaptive weights as row weights.
    const double k_plus = row.t * row.t / std::max(row.t * mean_abs(v_plus, row.u), 1e-5);
    const double k_minus = row.t * row.t / std::max(row.t * mean_abs(v_minus, row.u), 1e-5);
    const double mapped = -scale * (r * trainer_log_prob(row.v_theta, u_plus, k_plus) +
                                    (1 - r) * trainer_log_prob(row.v_theta, u_minus, k_minus));
    mapped_losses.push_back(mapped);
    worst = std::max(worst, relative_gap(mapped, row.loss));
    CHECK(relative_gap(mapped, row.loss) < 1e-12);
    if (std::abs(k_plus - 1) < 1e-12 && std::abs(k_minus - 1) < 1e-12) {
      ++unit_rows;
      CHECK(relative_gap(ours, row.loss) < 1e-12);
    }
    // Gradient: d L / d lp+- (the trainer's weights) times d lp+- / d v = -2 k+- (v - u+-) / D.
    for (std::size_t i = 0; i < 4; ++i) {
      const double gradient = -scale * r * (-2 * k_plus * (row.v_theta[i] - u_plus[i]) / 4) -
                              scale * (1 - r) * (-2 * k_minus * (row.v_theta[i] - u_minus[i]) / 4);
      worst = std::max(worst, relative_gap(gradient, row.gradient[i]));
      CHECK(relative_gap(gradient, row.gradient[i]) < 1e-12);
    }
  }
  CHECK(unit_rows == 2);
  // The batch loss is the mean over samples, as ours is over rows.
  const double batch = (mapped_losses[8] + mapped_losses[9] + mapped_losses[10]) / 3;
  CHECK(relative_gap(batch, kNftBatchLoss) < 1e-12);
  INFO("largest relative difference " << worst);
  CHECK(worst < 1e-12);
}

TEST_CASE("AWM's log-prob, clipped loss and gradient against the authors' code", "[objective][reference]") {
  double worst = 0;
  for (std::size_t n = 0; n < kAwmReference.size(); ++n) {
    const awm_reference_row& row = kAwmReference[n];
    INFO("row " << n);
    const double w = weight_at(row.weighting, row.t);
    const double lp = trainer_log_prob(row.v, row.u, w);
    worst = std::max(worst, relative_gap(lp, row.lp));
    CHECK(relative_gap(lp, row.lp) < 1e-12);
    // Upstream's advantage_max (its recipes: 1) rescales the clipped advantage by advantage_max / adv_clip_max; the
    // loss is linear in A, so that is a factor on loss and gradient.
    const double scale = row.advantage_max > 0 ? row.advantage_max / row.advantage_clip : 1.0;
    const double advantage = clip_advantage(row.advantage, row.advantage_clip);
    if (row.clip_range >= 1.0) {
      // The authors' recipes clip at 1: clamp(rho, 0, 2). ppo_clipped_loss (and the objective) refuse it.
      CHECK_THROWS(ppo_clipped_loss(lp, row.lp_old, advantage, row.clip_range));
      const double rho = std::exp(lp - row.lp_old);
      const double theirs = scale * std::max(-advantage * rho, -advantage * std::min(rho, 1.0 + row.clip_range));
      CHECK(relative_gap(theirs, row.loss) < 1e-12);
      continue;
    }
    const double loss = scale * ppo_clipped_loss(lp, row.lp_old, advantage, row.clip_range);
    const double d_lp = scale * ppo_clipped_loss_gradient(lp, row.lp_old, advantage, row.clip_range);
    worst = std::max({worst, relative_gap(loss, row.loss), relative_gap(d_lp, row.d_lp)});
    CHECK(relative_gap(loss, row.loss) < 1e-12);
    CHECK(relative_gap(d_lp, row.d_lp) < 1e-12);
    for (std::size_t i = 0; i < 4; ++i) {
      const double d_v = d_lp * (-2 * w * (row.v[i] - row.u[i]) / 4);
      worst = std::max(worst, relative_gap(d_v, row.d_v[i]));
      CHECK(relative_gap(d_v, row.d_v[i]) < 1e-12);
    }
  }
  INFO("largest relative difference " << worst);
  CHECK(worst < 1e-12);
}
