#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "branchgrpo/loss.hpp"

using namespace branchgrpo;

namespace {
constexpr double not_a_number = std::numeric_limits<double>::quiet_NaN();
constexpr double eps = 1e-3;
}  // namespace

TEST_CASE("ppo_options: defaults and validation") {
  const ppo_options defaults{};
  CHECK(defaults.clip_range == 1e-3);
  CHECK(defaults.advantage_clip == 5.0);
  CHECK(defaults.kl_beta == 0.0);
  CHECK_NOTHROW(validate(defaults));
  CHECK_NOTHROW(validate(ppo_options{.advantage_clip = std::numeric_limits<double>::infinity()}));
  CHECK_THROWS_WITH(validate(ppo_options{.clip_range = 0}), "ppo clip_range 0 is not in (0, 1)");
  CHECK_THROWS_AS(validate(ppo_options{.clip_range = -1e-3}), invalid_input);
  CHECK_THROWS_AS(validate(ppo_options{.clip_range = 1.0}), invalid_input);
  CHECK_THROWS_AS(validate(ppo_options{.clip_range = not_a_number}), invalid_input);
  CHECK_THROWS_AS(validate(ppo_options{.advantage_clip = 0.0}), invalid_input);
  CHECK_THROWS_AS(validate(ppo_options{.advantage_clip = not_a_number}), invalid_input);
  CHECK_THROWS_AS(validate(ppo_options{.kl_beta = -0.01}), invalid_input);
  CHECK_THROWS_AS(validate(ppo_options{.kl_beta = not_a_number}), invalid_input);
}

TEST_CASE("clip_advantage and importance_ratio: doc examples") {
  CHECK(clip_advantage(7.0, 5.0) == 5.0);
  CHECK(clip_advantage(-6.0, 5.0) == -5.0);
  CHECK(clip_advantage(0.3, 5.0) == 0.3);
  CHECK(clip_advantage(2.5f, 1.0) == 1.0f);
  CHECK_THROWS_AS(clip_advantage(1.0, 0.0), invalid_input);
  CHECK_THROWS_AS(clip_advantage(1.0, not_a_number), invalid_input);
  CHECK_THROWS_WITH(clip_advantage(not_a_number, 5.0), "advantage nan is not finite");
  CHECK(importance_ratio(0.01, 0.0) == Approx(1.010050167).margin(1e-9));
  CHECK(importance_ratio(-2.0, -2.0) == 1.0);
  CHECK_THROWS_AS(importance_ratio(not_a_number, 0.0), invalid_input);
  CHECK_THROWS_AS(importance_ratio(0.0, -std::numeric_limits<double>::infinity()), invalid_input);
}

TEST_CASE("ppo_clipped_loss: hand values on both sides of the clip") {
  // r = e^0.01 = 1.010050 > 1 + eps. A = 1: max(-1.010050, -1.001) = -1.001 = -(1 + 1e-3).
  CHECK(ppo_clipped_loss(0.01, 0.0, 1.0, eps) == Approx(-(1.0 + 1e-3)).margin(1e-12));
  // A = -2: max(2.020100, 2.002) = 2 e^0.01.
  CHECK(ppo_clipped_loss(0.01, 0.0, -2.0, eps) == Approx(2.0 * std::exp(0.01)).margin(1e-12));
  // r = e^-0.01 = 0.990050 < 1 - eps. A = 1: max(-0.990050, -0.999) = -e^-0.01.
  CHECK(ppo_clipped_loss(-0.01, 0.0, 1.0, eps) == Approx(-std::exp(-0.01)).margin(1e-12));
  // A = -2: max(1.980100, 1.998) = 1.998.
  CHECK(ppo_clipped_loss(-0.01, 0.0, -2.0, eps) == Approx(1.998).margin(1e-12));
  // Inside the clip both terms are -A r: A = 3, r = e^0.0005.
  CHECK(ppo_clipped_loss(0.0005, 0.0, 3.0, eps) == Approx(-3.0 * std::exp(0.0005)).margin(1e-12));
  // Only the difference of log-probs matters.
  CHECK(ppo_clipped_loss(-4.99, -5.0, 1.0, eps) == Approx(-(1.0 + 1e-3)).margin(1e-12));
  // Zero advantage: zero loss.
  CHECK(ppo_clipped_loss(0.3, 0.0, 0.0, eps) == 0.0);
  // A wider clip (code default 1e-4 is narrower): eps 0.1 lets r = e^0.01 through for A = 1.
  CHECK(ppo_clipped_loss(0.01, 0.0, 1.0, 0.1) == Approx(-std::exp(0.01)).margin(1e-12));
}

TEST_CASE("ppo_clipped_loss rejects bad clip ranges and NaN") {
  CHECK_THROWS_AS(ppo_clipped_loss(0.0, 0.0, 1.0, 0.0), invalid_input);
  CHECK_THROWS_AS(ppo_clipped_loss(0.0, 0.0, 1.0, -1e-3), invalid_input);
  CHECK_THROWS_AS(ppo_clipped_loss(0.0, 0.0, 1.0, not_a_number), invalid_input);
  CHECK_THROWS_AS(ppo_clipped_loss(0.0, 0.0, 1.0, 1.0), invalid_input);
  CHECK_THROWS_WITH(ppo_clipped_loss(not_a_number, 0.0, 1.0, eps), "log_new nan is not finite");
  CHECK_THROWS_WITH(ppo_clipped_loss(0.0, not_a_number, 1.0, eps), "log_old nan is not finite");
  CHECK_THROWS_WITH(ppo_clipped_loss(0.0, 0.0, not_a_number, eps), "advantage nan is not finite");
  CHECK_THROWS_AS(ppo_clipped_loss_gradient(not_a_number, 0.0, 1.0, eps), invalid_input);
  CHECK_THROWS_AS(ppo_clipped_loss_gradient(0.0, 0.0, 1.0, 0.0), invalid_input);
}

TEST_CASE("ppo_clipped_loss_gradient: doc examples") {
  CHECK(ppo_clipped_loss_gradient(0.01, 0.0, 1.0, eps) == 0.0);
  CHECK(ppo_clipped_loss_gradient(0.01, 0.0, -2.0, eps) == Approx(2.020100334).margin(1e-9));
  CHECK(ppo_clipped_loss_gradient(-0.01, 0.0, 1.0, eps) == Approx(-0.990049834).margin(1e-9));
  CHECK(ppo_clipped_loss_gradient(-0.01, 0.0, -2.0, eps) == 0.0);
  CHECK(ppo_clipped_loss_gradient(0.0005, 0.0, 3.0, eps) == Approx(-3.001500250).margin(1e-9));
  CHECK(ppo_clipped_loss_gradient(0.3, 0.0, 0.0, eps) == 0.0);
}

TEST_CASE("ppo_clipped_loss_gradient matches a central finite difference away from the kinks") {
  // Kinks at log r = log(1 - eps) = -0.0010005 and log(1 + eps) = 0.0009995; stay 1e-4 away (h = 1e-7).
  const std::vector<double> log_olds = {0.0, -3.0, 1.5};
  const std::vector<double> deltas = {-0.5, -0.02, -0.0012, -0.0005, 0.0, 0.0004, 0.0012, 0.02, 0.7};
  const std::vector<double> advantages = {-5.0, -2.0, -0.3, 0.0, 0.4, 1.0, 5.0};
  const double h = 1e-7;
  for (const double log_old : log_olds)
    for (const double delta : deltas)
      for (const double a : advantages) {
        const double log_new = log_old + delta;
        const double numeric =
            (ppo_clipped_loss(log_new + h, log_old, a, eps) - ppo_clipped_loss(log_new - h, log_old, a, eps)) / (2 * h);
        INFO("log_old " << log_old << " delta " << delta << " A " << a);
        CHECK(ppo_clipped_loss_gradient(log_new, log_old, a, eps) == Approx(numeric).margin(1e-6));
      }
}

TEST_CASE("kl_flow: by hand, gradient, finite difference") {
  CHECK(kl_flow_element(2.0, 1.5, 0.5) == Approx(0.5).margin(1e-15));
  CHECK(kl_flow_element(1.0, 1.0, 0.1) == 0.0);
  const std::vector<double> mu = {1.0, 2.0, 3.0};
  const std::vector<double> ref = {1.0, 1.5, 4.0};
  // squares {0, 0.25, 1}; / (2 * 0.25) -> {0, 0.5, 2}; mean 2.5 / 3.
  CHECK(kl_flow(mu, ref, 0.5) == Approx(2.5 / 3.0).margin(1e-15));
  const auto gradient = kl_flow_gradient(mu, ref, 0.5);
  REQUIRE(gradient.size() == 3);
  CHECK(gradient[0] == 0.0);
  CHECK(gradient[1] == Approx(0.5 / 0.75).margin(1e-15));
  CHECK(gradient[2] == Approx(-1.0 / 0.75).margin(1e-15));
  const double h = 1e-6;
  for (std::size_t i = 0; i < mu.size(); ++i) {
    auto up = mu, down = mu;
    up[i] += h, down[i] -= h;
    CHECK(gradient[i] == Approx((kl_flow(up, ref, 0.5) - kl_flow(down, ref, 0.5)) / (2 * h)).margin(1e-8));
  }
}

TEST_CASE("kl_flow rejects bad input") {
  const std::vector<double> mu = {1.0, 2.0};
  const std::vector<double> ref = {1.0, 2.0};
  const std::vector<double> shorter = {1.0};
  const std::vector<double> bad = {1.0, not_a_number};
  CHECK_THROWS_AS(kl_flow(mu, shorter, 1.0), invalid_input);
  CHECK_THROWS_AS(kl_flow(std::vector<double>{}, std::vector<double>{}, 1.0), invalid_input);
  CHECK_THROWS_AS(kl_flow(mu, ref, 0.0), invalid_input);
  CHECK_THROWS_AS(kl_flow(mu, ref, not_a_number), invalid_input);
  CHECK_THROWS_WITH(kl_flow(bad, ref, 1.0), "kl mean 1 is nan");
  CHECK_THROWS_WITH(kl_flow_gradient(mu, bad, 1.0), "kl reference mean 1 is nan");
  CHECK_THROWS_AS(kl_flow_element(1.0, 2.0, -0.5), invalid_input);
  CHECK_THROWS_AS(kl_flow_element(not_a_number, 2.0, 0.5), invalid_input);
}

TEST_CASE("edge_loss: doc example and the KL switch") {
  const ppo_options options{.clip_range = 1e-3, .advantage_clip = 5.0, .kl_beta = 0.04};
  // A 7 -> 5; r = e^0.01 clipped: -5 * 1.001 = -5.005; + 0.04 * 0.833333 = -4.971667.
  CHECK(edge_loss(0.01, 0.0, 7.0, 2.5 / 3.0, options) == Approx(-5.005 + 0.04 * 2.5 / 3.0).margin(1e-12));
  // BranchGRPO defaults: no KL, the kl argument is not read.
  CHECK(edge_loss(0.01, 0.0, 1.0, not_a_number, ppo_options{}) == Approx(-1.001).margin(1e-12));
  CHECK_THROWS_AS(edge_loss(0.01, 0.0, 1.0, not_a_number, options), invalid_input);
  CHECK_THROWS_AS(edge_loss(0.01, 0.0, 1.0, 0.0, ppo_options{.clip_range = 0.0}), invalid_input);
  // Negative clipped advantage: A -9 -> -5, r = e^-0.01 < 1 - eps: max(4.950249, 4.995) = 4.995.
  CHECK(edge_loss(-0.01, 0.0, -9.0, 0.0, ppo_options{}) == Approx(4.995).margin(1e-12));
}

TEST_CASE("ppo_options: ratio_norm and step_weight are off by default and validated") {
  const ppo_options defaults{};
  CHECK_FALSE(defaults.ratio_norm);
  CHECK(defaults.step_weight == step_weighting::none);
  CHECK_NOTHROW(validate(ppo_options{.ratio_norm = true, .step_weight = step_weighting::noise_std}));
  CHECK_THROWS_WITH(validate(ppo_options{.step_weight = step_weighting{7}}),
                    "ppo step_weight 7 is not none, inverse_dt, noise_std or equal_steps");
  CHECK(step_weighting_name(step_weighting::inverse_dt) == "inverse_dt");
  CHECK(parse_step_weighting("noise_std") == step_weighting::noise_std);
  CHECK(parse_step_weighting("none") == step_weighting::none);
  CHECK_THROWS_WITH(parse_step_weighting("dt"),
                    "ppo step_weight \"dt\" is not none, inverse_dt, noise_std or equal_steps");
}

TEST_CASE("RatioNorm: doc examples") {
  CHECK(ratio_norm_log_ratio(-0.02, 0.0, 0.03, 0.1) == Approx(0.001).epsilon(1e-12));
  CHECK(ratio_norm_loss(0.01, 0.0, 0.0, 1.0, eps, 0.05) == Approx(-std::exp(0.0005)).epsilon(1e-12));
  CHECK(ratio_norm_loss(0.01, 0.0, 0.0, 1.0, eps, 0.05) == Approx(-1.000500125).epsilon(1e-9));
  CHECK(ppo_clipped_loss(0.01, 0.0, 1.0, eps) == Approx(-1.001).epsilon(1e-12));
  CHECK(ratio_norm_loss_gradient(0.01, 0.0, 0.0, 1.0, eps, 0.05) == Approx(-0.050025006).epsilon(1e-8));
  CHECK(ppo_clipped_loss_gradient(0.01, 0.0, 1.0, eps) == 0.0);
  CHECK(ratio_norm_loss_gradient(0.01, 0.0, 0.0, -2.0, eps, 0.1) == Approx(0.200200100).epsilon(1e-8));
  CHECK(ratio_norm_loss_gradient(-0.02, 0.0, 0.03, 1.0, eps, 0.1) == 0.0);
  CHECK(ppo_clipped_loss_gradient(-0.02, 0.0, 1.0, eps) == Approx(-0.980198673).epsilon(1e-8));
  CHECK_THROWS_WITH(ratio_norm_log_ratio(0.0, 0.0, 0.0, 0.0), "ratio_norm std 0 is not finite and positive");
  CHECK_THROWS_WITH(ratio_norm_log_ratio(0.0, 0.0, -1.0, 0.1), "ratio_norm mean gap -1 is not finite and >= 0");
  CHECK_THROWS_AS(ratio_norm_log_ratio(not_a_number, 0.0, 0.0, 0.1), invalid_input);
}

TEST_CASE("RatioNorm: the gradient matches central differences in log_new") {
  const double h = 1e-7;
  for (const double log_new : {-0.03, -0.004, 0.002, 0.05})
    for (const double advantage : {-1.5, 0.7})
      for (const double gap : {0.0, 0.02}) {
        const double up = ratio_norm_loss(log_new + h, 0.0, gap, advantage, eps, 0.08);
        const double down = ratio_norm_loss(log_new - h, 0.0, gap, advantage, eps, 0.08);
        INFO("log_new " << log_new << ", A " << advantage << ", gap " << gap);
        CHECK(ratio_norm_loss_gradient(log_new, 0.0, gap, advantage, eps, 0.08) ==
              Approx((up - down) / (2 * h)).epsilon(1e-6).margin(1e-9));
      }
}

TEST_CASE("step weights: doc examples") {
  CHECK(inverse_dt_weight(1.0, 0.75) == 4.0);
  CHECK(inverse_dt_weight(0.75, 0.0) == Approx(1.333333).epsilon(1e-6));
  CHECK_THROWS_WITH(inverse_dt_weight(0.5, 0.5),
                    "inverse_dt weight of the step from sigma 0.5 to 0.5 is undefined (needs 0 <= next < sigma <= 1)");
  const std::vector<double> noise = noise_aware_weights(std::vector<double>{0.3, 0.2, 0.1});
  REQUIRE(noise.size() == 3);
  CHECK(noise[0] == Approx(1.5).epsilon(1e-12));
  CHECK(noise[1] == Approx(1.0).epsilon(1e-12));
  CHECK(noise[2] == Approx(0.5).epsilon(1e-12));
  CHECK_THROWS_WITH(noise_aware_weights(std::vector<double>{0.0, 0.0}),
                    "noise_std weights: every step has std 0 (an ODE stepper)");
  CHECK_THROWS_WITH(noise_aware_weights(std::vector<double>{0.1, -0.2}), "noise_std weight: step 1 has std -0.2");

  const sigma_schedule schedule({1.0, 0.75, 0.0});
  const std::vector<double> stds = {0.3, 0.1};
  CHECK(step_loss_weights(step_weighting::none, schedule, stds) == std::vector<double>{1.0, 1.0});
  const std::vector<double> inverse = step_loss_weights(step_weighting::inverse_dt, schedule, stds);
  CHECK(inverse[0] == 4.0);
  CHECK(inverse[1] == Approx(1.333333).epsilon(1e-6));
  const std::vector<double> tempflow = step_loss_weights(step_weighting::noise_std, schedule, stds);
  CHECK(tempflow[0] == Approx(1.5).epsilon(1e-12));
  CHECK(tempflow[1] == Approx(0.5).epsilon(1e-12));
  CHECK_THROWS_WITH(step_loss_weights(step_weighting::none, schedule, std::vector<double>{0.3}),
                    "step weights got 1 noise stds for 2 steps");
}

TEST_CASE("equal_step_weights: every trained step weighs as much in total (the doc example)") {
  const std::vector<double> weights = equal_step_weights(std::vector<double>{2, 4, 0, 10});
  REQUIRE(weights.size() == 4);
  CHECK(weights[0] == Approx(16.0 / 3 / 2));  // 2.666667
  CHECK(weights[1] == Approx(16.0 / 3 / 4));  // 1.333333
  CHECK(weights[2] == 0.0);
  CHECK(weights[3] == Approx(16.0 / 3 / 10));                                           // 0.533333
  CHECK(weights[0] * 2 + weights[1] * 4 + weights[3] * 10 == Approx(16));               // @post: the weights sum to E
  CHECK(equal_step_weights(std::vector<double>{16, 16}) == std::vector<double>{1, 1});  // DanceGRPO's chains
  CHECK_THROWS_WITH(equal_step_weights(std::vector<double>{0, 0}), "equal_steps weights: no step has a trained edge");
  CHECK(parse_step_weighting("equal_steps") == step_weighting::equal_steps);
}
