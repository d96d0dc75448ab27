#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <vector>

#include "branchgrpo/correlator.hpp"
#include "branchgrpo/rollout.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/schedule/steppers.hpp"
#include "branchgrpo/topology.hpp"
#include "branchgrpo/toy.hpp"

using namespace branchgrpo;

namespace {

// The base fit costs ~1 s in an unoptimized build: fit once per executable and copy.
const fourier_policy<host_backend>& base_policy() {
  static const fourier_policy<host_backend> policy = make_toy_policy(7);
  return policy;
}

// Root i of the evaluation rollouts: the keyed N(0, I) draw {seed 5, node i}.
std::array<double, 2> root(std::uint32_t i) {
  std::array<double, 2> x{};
  fill_keyed_normal({.seed = 5, .node = i}, x);
  return x;
}

// Euler ODE from sigma 1 to 0 over the shifted 20-step schedule, prompt i mod 8.
std::vector<std::array<double, 2>> ode_samples(fourier_policy<host_backend>& policy, int count) {
  const sigma_schedule schedule = shifted_linear_schedule(20);
  std::vector<std::array<double, 2>> out;
  for (int i = 0; i < count; ++i) {
    auto x = root(static_cast<std::uint32_t>(i));
    for (int s = 0; s < schedule.steps(); ++s) {
      const auto v = policy.velocity(x, schedule.sigma(s), i % 8);
      const double d = schedule.sigma(s + 1) - schedule.sigma(s);
      x = {x[0] + d * v[0], x[1] + d * v[1]};
    }
    out.push_back(x);
  }
  return out;
}

// A small edge batch: rows at sigma(5) of the shifted 20-step schedule with dance_sde coefficients.
edge_batch<host_tensor> sample_edges(int rows) {
  const sigma_schedule schedule = shifted_linear_schedule(20);
  const int step = 5;
  edge_batch<host_tensor> edges{.step = step,
                                .sigma = schedule.sigma(step),
                                .coeffs = dance_sde{}(schedule, step),
                                .x = {.rows = rows, .shape = toy_latent_shape(), .values = {}},
                                .next = {.rows = rows, .shape = toy_latent_shape(), .values = {}},
                                .std = {},
                                .trees = {},
                                .prompts = {}};
  for (int r = 0; r < rows; ++r) {
    std::array<double, 4> draw{};
    fill_keyed_normal({.seed = 11, .node = static_cast<std::uint32_t>(r)}, draw);
    edges.x.values.insert(edges.x.values.end(), {draw[0], draw[1]});
    // next = x + 0.3 * noise: not the model's mean, so (next - mean) carries the model's velocity.
    edges.next.values.insert(edges.next.values.end(), {draw[0] + 0.3 * draw[2], draw[1] + 0.3 * draw[3]});
    edges.std.push_back(0.2 + 0.05 * r);
    edges.trees.push_back(static_cast<std::uint32_t>(r));
    edges.prompts.push_back(r);
  }
  return edges;
}

loss_gradient_fn fixed_weights(std::vector<double> weights) {
  return [weights](std::span<const double>) { return weights; };
}

double weighted_log_prob(fourier_policy<host_backend> policy, const edge_batch<host_tensor>& edges,
                         const std::vector<double>& weights) {
  const std::vector<double> log_probs = policy.accumulate(edges, fixed_weights(weights));
  double sum = 0.0;
  for (std::size_t r = 0; r < log_probs.size(); ++r) sum += weights[r] * log_probs[r];
  return sum;
}

}  // namespace

TEST_CASE("ring mixture: modes, prompts and keyed samples", "[toy][data]") {
  const ring_mixture ring{};
  CHECK(ring.mode(0)[0] == 2.0);
  CHECK(ring.mode(0)[1] == 0.0);
  CHECK(ring.mode(2)[0] == Approx(0.0).margin(1e-15));
  CHECK(ring.mode(2)[1] == Approx(2.0));
  CHECK(ring.mode(5)[0] == Approx(-std::numbers::sqrt2));
  CHECK(ring.mode(5)[1] == Approx(-std::numbers::sqrt2));
  CHECK(ring.mode(13) == ring.mode(5));
  // Neighbouring modes: 2 * 2 sin(pi / 8) = 1.530734 apart.
  CHECK(std::hypot(ring.mode(1)[0] - ring.mode(0)[0], ring.mode(1)[1] - ring.mode(0)[1]) == Approx(1.530734));

  CHECK(prompt_mode(10, 8) == 2);
  CHECK(prompt_mode(-1, 8) == 7);
  CHECK(prompt_mode(-8, 8) == 0);
  CHECK(normal_to_uniform(0.0) == 0.5);
  CHECK(normal_to_uniform(1.959964) == Approx(0.975).margin(1e-6));

  // Deterministic in (seed, index) and independent of the count.
  const std::vector<double> many = ring.sample(3, 4000);
  const std::vector<double> few = ring.sample(3, 5);
  CHECK(std::equal(few.begin(), few.end(), many.begin()));
  CHECK(ring.sample(4, 5) != few);

  // Every mode is drawn about equally; offsets are N(0, 0.15^2 I): the mean distance to the nearest mode
  // is 0.15 sqrt(pi / 2) = 0.188 (Rayleigh mean).
  std::array<int, 8> counts{};
  double distance = 0.0;
  for (std::size_t i = 0; i < many.size(); i += 2) {
    distance += ring.distance_to_nearest_mode(many[i], many[i + 1]);
    const double angle = std::atan2(many[i + 1], many[i]);
    ++counts[static_cast<std::size_t>(prompt_mode(std::lround(angle / (std::numbers::pi / 4)), 8))];
  }
  CHECK(distance / 4000 == Approx(0.15 * std::sqrt(std::numbers::pi / 2)).epsilon(0.03));
  for (int c : counts) CHECK(std::abs(c - 500) < 80);  // binomial std sqrt(4000 * 1/8 * 7/8) = 21

  CHECK_THROWS_WITH((ring_mixture{.modes = 8, .radius = -1.0}.sample(0, 1)),
                    "ring_mixture radius must be positive and finite, got -1");
  CHECK_THROWS_WITH(prompt_mode(3, 0), "the number of modes must be at least 1, got 0");
}

TEST_CASE("cholesky solve and ridge regression match hand solutions", "[toy][ridge]") {
  // 4 x + 2 y = 6, 2 x + 3 y = 7 -> x = 0.5, y = 2.
  const std::vector<double> x = cholesky_solve({4, 2, 2, 3}, 2, std::vector<double>{6, 7}, 1);
  CHECK(x[0] == Approx(0.5));
  CHECK(x[1] == Approx(2.0));
  // Two right-hand sides at once, 3 x 3: A = L L^T with L = {{2,0,0},{1,3,0},{1,1,1}} -> A =
  // {{4,2,2},{2,10,4},{2,4,3}}; X = {{1, 0}, {0, 1}, {2, -1}} gives B = A X = {{8, 0}, {10, 6}, {8, 1}}.
  const std::vector<double> two =
      cholesky_solve({4, 2, 2, 2, 10, 4, 2, 4, 3}, 3, std::vector<double>{8, 0, 10, 6, 8, 1}, 2);
  const std::vector<double> expected = {1, 0, 0, 1, 2, -1};
  for (std::size_t i = 0; i < 6; ++i) CHECK(two[i] == Approx(expected[i]).margin(1e-12));
  CHECK_THROWS_WITH(cholesky_solve({1, 2, 2, 1}, 2, std::vector<double>{1, 1}, 1),
                    "cholesky_solve: matrix is not positive definite (pivot 1 is -3)");

  // The doc example: (phi, y) = (1, 2), (2, 4), lambda 0.5 -> (5/2 + 1/2) w = 10/2 -> w = 5/3.
  ridge_regression ridge(1, 1);
  ridge.add(std::vector<double>{1}, std::vector<double>{2});
  ridge.add(std::vector<double>{2}, std::vector<double>{4});
  CHECK(ridge.solve(0.5)[0] == Approx(5.0 / 3.0));
  CHECK(ridge.solve(0.0)[0] == Approx(2.0));  // exact fit y = 2 phi
  CHECK_THROWS_WITH(ridge.add(std::vector<double>{NAN}, std::vector<double>{1}), "ridge_regression feature 0 is nan");
  CHECK_THROWS_WITH(ridge_regression(1, 1).solve(0.1), "ridge_regression has no samples");
}

TEST_CASE("adam steps a quadratic as computed by hand", "[toy][adam]") {
  const adam optimizer{.lr = 0.1};
  adam_state state;
  std::vector<double> p = {1.0};
  optimizer(state, p, std::vector<double>{p[0]});  // f = p^2 / 2, g = p
  CHECK(p[0] == Approx(0.900000001).epsilon(1e-12));
  CHECK(state.steps == 1);
  CHECK(state.first[0] == Approx(0.1));
  CHECK(state.second[0] == Approx(0.001));
  optimizer(state, p, std::vector<double>{p[0]});
  CHECK(p[0] == Approx(0.8004122297).epsilon(1e-10));
  CHECK(state.steps == 2);

  std::vector<double> q = {1.0, 2.0};
  CHECK_THROWS_WITH(optimizer(state, q, std::vector<double>{0.0, NAN}), "adam gradient[1] = nan is not finite");
  CHECK(q == std::vector<double>{1.0, 2.0});  // rejected before anything changed
  CHECK_THROWS_WITH(optimizer(state, q, std::vector<double>{1.0, 1.0}), "adam state holds 1 moments for 2 parameters");
  adam_state fresh;
  CHECK_THROWS_WITH((adam{.lr = -1.0}(fresh, q, std::vector<double>{1.0, 1.0})),
                    "adam.lr = -1.0: must be in [1e-12, 1]");
  CHECK_THROWS_WITH((adam{.beta2 = 1.0}(fresh, q, std::vector<double>{1.0, 1.0})),
                    "adam.beta2 = 1.0: must be in [0, 1)");
}

TEST_CASE("mode_reward scores the doc comment's points", "[toy][reward]") {
  mode_reward<> reward{};
  const host_backend backend;
  const host_tensor leaves =
      backend.from_host(std::vector<double>{2.0, 0.5, 2.0, 0.0, 0.0, 0.0}, 3, toy_latent_shape());
  const std::vector<std::int64_t> prompts = {0, 8, 3};
  const std::vector<double> r = reward(leaves, prompts);
  REQUIRE(r.size() == 3);
  CHECK(r[0] == Approx(std::exp(-0.5)));  // |{0, 0.5}|^2 = 0.25, / (2 * 0.25)
  CHECK(r[0] == Approx(0.606531));
  CHECK(r[1] == 1.0);
  CHECK(r[2] == Approx(std::exp(-8.0)));  // |m_3|^2 = 4, / 0.5
  // The neighbouring mode scores exp(-1.530734^2 / 0.5) = 0.0093.
  CHECK(reward.score(ring_mixture{}.mode(1)[0], ring_mixture{}.mode(1)[1], 0) == Approx(0.0093).epsilon(0.01));

  // A non-finite leaf is a failed leaf: NaN, not an exception.
  const host_tensor broken = backend.from_host(std::vector<double>{NAN, 0.0, 2.0, 0.0}, 2, toy_latent_shape());
  const std::vector<double> partly = reward(broken, std::vector<std::int64_t>{0, 0});
  CHECK(std::isnan(partly[0]));
  CHECK(partly[1] == 1.0);

  CHECK_THROWS_WITH(reward(leaves, std::vector<std::int64_t>{0}), "mode_reward got 1 prompts for 3 rows");
  mode_reward<> zero{.width = 0.0};
  CHECK_THROWS_WITH(zero(leaves, prompts), "mode_reward width must be positive and finite, got 0");
}

TEST_CASE("fourier features follow their formula", "[toy][policy]") {
  // The doc example: F 1, w = {1, 0, 0, 0, 0}, b = 0, z = {pi / 3, ...} -> sqrt 2 cos(pi / 3).
  const fourier_features one{.frequencies = {1, 0, 0, 0, 0}, .phases = {0}};
  std::array<double, 1> phi{};
  one.evaluate({std::numbers::pi / 3, 5, 6, 7, 8}, phi);
  CHECK(phi[0] == Approx(0.707107).epsilon(1e-6));

  const fourier_options options{.features = 4, .x_frequency = 2.0};
  const fourier_features drawn = fourier_features::draw(3, options);
  REQUIRE(drawn.size() == 4);
  // Feature 1 from its keyed draws: frequencies x_frequency * n_0.., phase 2 pi Phi(n_5).
  std::array<double, 6> n{};
  toy_normals(3, toy_draw::feature, 1, n);
  CHECK(drawn.frequencies[5] == 2.0 * n[0]);
  CHECK(drawn.frequencies[7] == 3.0 * n[2]);
  CHECK(drawn.frequencies[8] == 1.0 * n[3]);
  CHECK(drawn.phases[1] == 2.0 * std::numbers::pi * normal_to_uniform(n[5]));
}

TEST_CASE("the base fit is deterministic in the seed", "[toy][policy]") {
  const fourier_options small{.features = 32, .fit_samples = 500};
  const auto a = make_toy_policy(1, small);
  const auto b = make_toy_policy(1, small);
  const auto c = make_toy_policy(2, small);
  REQUIRE(a.parameters().size() == 64);
  CHECK(std::equal(a.parameters().begin(), a.parameters().end(), b.parameters().begin()));
  CHECK(!std::equal(a.parameters().begin(), a.parameters().end(), c.parameters().begin()));
  CHECK(a.features() == b.features());
  CHECK(base_policy().parameters().size() == 512);
  CHECK(std::equal(base_policy().parameters().begin(), base_policy().parameters().end(),
                   base_policy().base_parameters().begin()));
  CHECK_THROWS_WITH(make_toy_policy(1, {.features = 0}), "fourier_options features must be at least 1, got 0");
  CHECK_THROWS_WITH(make_toy_policy(1, {.ridge = 0.0}), "fourier_options ridge must be positive and finite, got 0");
}

TEST_CASE("base ODE samples land on the ring and cover every mode", "[toy][policy]") {
  auto policy = base_policy();
  const ring_mixture ring{};
  const int count = 800;
  const auto samples = ode_samples(policy, count);
  double distance = 0.0;
  std::array<int, 9> near{};  // per mode: samples within 0.5 of it; [8]: farther from every mode
  for (const auto& x : samples) {
    distance += ring.distance_to_nearest_mode(x[0], x[1]);
    std::size_t bin = 8;
    for (int k = 0; k < 8; ++k)
      if (std::hypot(x[0] - ring.mode(k)[0], x[1] - ring.mode(k)[1]) < 0.5) bin = static_cast<std::size_t>(k);
    ++near[bin];
  }
  // Measured (seed 7, these 800 samples): mean distance 0.40; 67% within 0.5 of a mode, 6.5-10.8% per mode;
  // the far third mostly sits between neighbouring modes at radius 1.5-2. The roots themselves
  // (W = 0 leaves them unchanged) are ~1 from the nearest mode.
  CHECK(distance / count < 0.45);
  CHECK(near[8] < count * 0.4);
  for (std::size_t k = 0; k < 8; ++k) CHECK(near[k] > count * 0.04);

  // The same check fails for an untrained model: W = 0 keeps the N(0, I) roots.
  std::fill(policy.parameters().begin(), policy.parameters().end(), 0.0);
  double untrained = 0.0;
  for (const auto& x : ode_samples(policy, 200)) untrained += ring.distance_to_nearest_mode(x[0], x[1]);
  CHECK(untrained / 200 > 0.8);
}

TEST_CASE("the accumulated gradient is the exact gradient of the weighted log-prob", "[toy][policy]") {
  auto policy = base_policy();
  const auto edges = sample_edges(5);
  const std::vector<double> weights = {0.7, -1.3, 0.2, 2.0, -0.4};
  std::vector<double> seen;
  const std::vector<double> log_probs = policy.accumulate(edges, [&](std::span<const double> lp) {
    seen.assign(lp.begin(), lp.end());
    return weights;
  });
  CHECK(seen == log_probs);

  // The log-probs are the stepper formula: mean = a x + c v, gaussian_log_prob_mean(next, mean, std).
  for (std::size_t r = 0; r < 5; ++r) {
    const std::array<double, 2> x = {edges.x.values[2 * r], edges.x.values[2 * r + 1]};
    const auto v = policy.velocity(x, edges.sigma, edges.prompts[r]);
    const std::array<double, 2> mean = {edges.coeffs.x_coeff * x[0] + edges.coeffs.velocity_coeff * v[0],
                                        edges.coeffs.x_coeff * x[1] + edges.coeffs.velocity_coeff * v[1]};
    CHECK(log_probs[r] ==
          gaussian_log_prob_mean(std::span<const double>(edges.next.values).subspan(2 * r, 2), mean, edges.std[r]));
  }

  // Central differences: the weighted log-prob is quadratic in W, so they are exact up to rounding.
  const std::span<const double> g = policy.gradient();
  double largest = 0.0;
  for (double value : g) largest = std::max(largest, std::abs(value));
  REQUIRE(largest > 1e-3);
  const double h = 1e-3;
  const fourier_policy<host_backend>& base = base_policy();
  for (std::size_t i = 0; i < g.size(); ++i) {
    auto plus = base, minus = base;
    plus.parameters()[i] += h;
    minus.parameters()[i] -= h;
    const double numeric =
        (weighted_log_prob(plus, edges, weights) - weighted_log_prob(minus, edges, weights)) / (2 * h);
    CHECK(numeric == Approx(g[i]).epsilon(1e-6).margin(1e-6 * largest));
  }

  // Gradients add up over batches until apply_update.
  std::vector<double> once(g.begin(), g.end());
  policy.accumulate(edges, fixed_weights(weights));
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(policy.gradient()[i] == Approx(2.0 * once[i]));
}

TEST_CASE("apply_update is one Adam step; reset_to_base undoes training", "[toy][policy]") {
  auto policy = base_policy();
  const auto edges = sample_edges(4);
  policy.accumulate(edges, fixed_weights({1.0, -1.0, 0.5, 0.25}));
  std::vector<double> expected(policy.parameters().begin(), policy.parameters().end());
  adam_state state;
  policy.options().optimizer(state, expected, policy.gradient());
  policy.apply_update();
  CHECK(std::equal(expected.begin(), expected.end(), policy.parameters().begin()));
  CHECK(policy.optimizer_state() == state);
  CHECK(std::all_of(policy.gradient().begin(), policy.gradient().end(), [](double x) { return x == 0.0; }));
  CHECK(!std::equal(expected.begin(), expected.end(), policy.base_parameters().begin()));

  policy.reset_to_base();
  CHECK(std::equal(policy.parameters().begin(), policy.parameters().end(), policy.base_parameters().begin()));
  CHECK(policy.optimizer_state().steps == 0);
}

TEST_CASE("update log-probs are bit-identical to the rollout's for unchanged W", "[toy][policy]") {
  auto policy = base_policy();
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  const dance_sde stepper{};
  const auto result = rollout(backend, policy, stepper, correlated{}, schedule,
                              rollout_tree(split_schedule::dense()(20), numbered_trees(2)), toy_latent_shape(),
                              {.max_batch = 64, .seed = 1, .iteration = 0});
  const rollout_tree& tree = result.tree;
  std::int64_t compared = 0;
  for (int s = 0; s < schedule.steps(); ++s) {
    const std::vector<std::int32_t> nodes = tree.nodes_at_step(s + 1);
    edge_batch<host_tensor> edges;
    edges.step = s;
    edges.sigma = schedule.sigma(s);
    edges.coeffs = stepper(schedule, s);
    std::vector<std::int64_t> parents;
    for (const std::int32_t n : nodes) {
      parents.push_back(tree.row_at_step(tree.parent(n)));
      edges.std.push_back(result.edge_std[static_cast<std::size_t>(n)]);
      edges.trees.push_back(tree.info(tree.tree(n)).key);
      edges.prompts.push_back(tree.info(tree.tree(n)).prompt);
    }
    edges.x = backend.gather_rows(result.latents[static_cast<std::size_t>(s)], parents);
    edges.next = result.latents[static_cast<std::size_t>(s) + 1];
    const std::vector<double> log_probs =
        policy.accumulate(edges, [](std::span<const double> lp) { return std::vector<double>(lp.size(), 0.0); });
    for (std::size_t j = 0; j < nodes.size(); ++j, ++compared) CHECK(log_probs[j] == tree.log_prob(nodes[j]));
  }
  CHECK(compared == 2 * 218);
}

TEST_CASE("a few policy-gradient updates move samples to the prompted mode", "[toy][policy]") {
  // Plain group-relative REINFORCE: one sequential group of 8 chains per prompt 0..7, leaf advantage
  // (r - group mean) / group std on every edge of its chain, loss = -mean(A log-prob), one Adam step per
  // iteration. Measured with the defaults (lr 0.1): held-out mean reward 0.14 -> 0.30 after 20 updates.
  auto policy = base_policy();
  host_backend backend;
  mode_reward<> reward{};
  const sigma_schedule schedule = shifted_linear_schedule(20);
  const dance_sde stepper{};
  std::vector<tree_info> trees;
  for (std::uint32_t t = 0; t < 8; ++t) trees.push_back({.key = t, .prompt = t});
  const rollout_tree shape(sequential{.group_size = 8}(20), trees);
  auto mean_reward = [&](std::uint32_t iteration) {
    auto result = rollout(backend, policy, stepper, independent{}, schedule, shape, toy_latent_shape(),
                          {.max_batch = 256, .seed = 21, .iteration = iteration});
    std::vector<std::int64_t> prompts;
    for (const std::int32_t leaf : result.tree.leaves())
      prompts.push_back(result.tree.info(result.tree.tree(leaf)).prompt);
    return std::pair{reward(leaf_latents(backend, result), prompts), std::move(result)};
  };
  auto average = [](const std::vector<double>& r) {
    double sum = 0.0;
    for (double x : r) sum += x;
    return sum / static_cast<double>(r.size());
  };
  const double before = average(mean_reward(1000).first);
  for (std::uint32_t iteration = 0; iteration < 20; ++iteration) {
    auto [r, result] = mean_reward(iteration);
    const rollout_tree& tree = result.tree;
    std::vector<double> advantage(r.size());
    for (std::size_t first = 0; first < r.size(); first += 8) {
      double m = 0.0, v = 0.0;
      for (std::size_t i = first; i < first + 8; ++i) m += r[i] / 8;
      for (std::size_t i = first; i < first + 8; ++i) v += (r[i] - m) * (r[i] - m) / 8;
      for (std::size_t i = first; i < first + 8; ++i) advantage[i] = (r[i] - m) / (std::sqrt(v) + 1e-8);
    }
    for (int s = 0; s < 20; ++s) {
      const std::vector<std::int32_t> nodes = tree.nodes_at_step(s + 1);
      edge_batch<host_tensor> edges;
      edges.step = s;
      edges.sigma = schedule.sigma(s);
      edges.coeffs = stepper(schedule, s);
      std::vector<std::int64_t> parents;
      std::vector<double> weights;
      for (const std::int32_t n : nodes) {
        parents.push_back(tree.row_at_step(tree.parent(n)));
        edges.std.push_back(result.edge_std[static_cast<std::size_t>(n)]);
        edges.trees.push_back(tree.info(tree.tree(n)).key);
        edges.prompts.push_back(tree.info(tree.tree(n)).prompt);
        // Each chain (one leaf under it) takes its leaf's advantage.
        const auto leaf = static_cast<std::size_t>(tree.leaf_positions_under(n).begin);
        weights.push_back(-advantage[leaf] / static_cast<double>(tree.edge_count()));
      }
      edges.x = backend.gather_rows(result.latents[static_cast<std::size_t>(s)], parents);
      edges.next = result.latents[static_cast<std::size_t>(s) + 1];
      policy.accumulate(edges, fixed_weights(weights));
    }
    policy.apply_update();
  }
  const double after = average(mean_reward(1000).first);
  INFO("mean reward before " << before << ", after " << after);
  CHECK(before < 0.2);
  CHECK(after > before + 0.1);
}

TEST_CASE("invalid inputs are rejected naming the value", "[toy][policy]") {
  auto policy = base_policy();
  const host_backend backend;
  const std::vector<std::int64_t> prompts = {0, 1};
  const std::vector<std::uint32_t> keys = {0, 1};
  const host_tensor x = backend.from_host(std::vector<double>{0.0, 1.0, NAN, 0.0}, 2, toy_latent_shape());
  CHECK_THROWS_WITH(policy(x, {.step = 0, .sigma = 0.5, .trees = keys, .prompts = prompts}),
                    "fourier_policy denoiser input row 1 element 0 is nan");
  const host_tensor good = backend.from_host(std::vector<double>{0.0, 1.0, 2.0, 0.0}, 2, toy_latent_shape());
  CHECK_THROWS_WITH(policy(good, {.step = 0, .sigma = 1.5, .trees = keys, .prompts = prompts}),
                    "fourier_policy sigma 1.5 is outside [0, 1]");
  CHECK_THROWS_WITH(policy(good, {.step = 0, .sigma = 0.5, .trees = keys, .prompts = std::span(prompts).first(1)}),
                    "fourier_policy got 1 prompts for 2 rows");
  const host_tensor wide = backend.from_host(std::vector<double>{0.0, 1.0, 2.0}, 1, {{3}});
  CHECK_THROWS_WITH(
      policy(wide,
             {.step = 0, .sigma = 0.5, .trees = std::span(keys).first(1), .prompts = std::span(prompts).first(1)}),
      "fourier_policy denoiser input has 3 values for 1 rows; the toy's latents have 2 elements");

  auto edges = sample_edges(2);
  CHECK_THROWS_WITH(policy.accumulate(edges, fixed_weights({1.0, NAN})), "loss gradient weight[1] = nan is not finite");
  CHECK_THROWS_WITH(policy.accumulate(edges, fixed_weights({1.0})), "loss gradient returned 1 weights for 2 rows");
  CHECK(std::all_of(policy.gradient().begin(), policy.gradient().end(), [](double g) { return g == 0.0; }));
  edges.next.values[3] = INFINITY;
  CHECK_THROWS_WITH(policy.accumulate(edges, fixed_weights({1.0, 1.0})),
                    "fourier_policy edge batch next row 1 element 1 is inf");
  edges = sample_edges(2);
  edges.std[0] = 0.0;
  CHECK_THROWS_WITH(policy.accumulate(edges, fixed_weights({1.0, 1.0})),
                    "row_log_prob std[0] = 0 must be positive and finite");
  edges = sample_edges(2);
  edges.prompts.pop_back();
  CHECK_THROWS_WITH(policy.accumulate(edges, fixed_weights({1.0, 1.0})),
                    "edge batch of 2 rows has 2 stds and 1 prompts");

  // An empty batch is fine: nothing to add.
  edge_batch<host_tensor> empty;
  empty.x = empty.next = {.rows = 0, .shape = toy_latent_shape(), .values = {}};
  CHECK(policy.accumulate(empty, fixed_weights({})).empty());
}
