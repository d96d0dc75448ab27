#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numbers>
#include <numeric>
#include <vector>

#include "branchgrpo/loss.hpp"
#include "branchgrpo/schedule/steppers.hpp"

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
  // One rule set with the run config's [loss] (ppo_options::parameters()): advantage_clip in [1e-3, 1e3].
  CHECK_THROWS_WITH(validate(ppo_options{.advantage_clip = std::numeric_limits<double>::infinity()}),
                    "loss.advantage_clip = inf: must be in [0.001, 1000]");
  CHECK_NOTHROW(validate(ppo_options{.advantage_clip = 1e3}));
  CHECK_THROWS_WITH(validate(ppo_options{.clip_range = 0}), "loss.clip_range = 0.0: must be in (0, 1)");
  CHECK_THROWS_WITH(validate(ppo_options{.kl_beta = 1e4}), "loss.kl_beta = 10000.0: must be in [0, 1000]");
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
                    "loss.step_weight = 7: must be none, inverse_dt, noise_std or equal_steps");
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

namespace {
// The schedules of the reference rows below (tests/reference/guard_reference.py): 0 the shift-3 schedule of 10 steps,
// 1 a linear one of 4.
// clang-format off
const std::vector<double> reference_schedules[] = {
      {1.0, 0.9642857142857144, 0.9230769230769231, 0.8749999999999999, 0.818181818181818, 0.75, 0.6666666666666667, 0.5625, 0.4285714285714285, 0.24999999999999994, 0.0},
      {1.0, 0.75, 0.5, 0.25, 0.0},
};
// clang-format on

// The constant log(sqrt(2 pi)) both authors' step functions subtract from their log-probs, as they compute it: in
// float32 (torch.as_tensor(math.pi) is float32), 1.5634e-8 below ours (0.5 log(2 pi) = 0.9189385332046727). It
// cancels in every ratio; the reference tests add the difference to our log-probs.
constexpr double their_log_sqrt_2pi = 0.9189385175704956;
double their_log_prob(double ours) { return ours + 0.5 * std::log(2.0 * std::numbers::pi) - their_log_sqrt_2pi; }

// d log N(next; mean, s) / d mean_k, averaged over the N elements as gaussian_log_prob_mean is.
double log_prob_mean_gradient(double next, double mean, double s, std::size_t n) {
  return (next - mean) / (s * s * static_cast<double>(n));
}
}  // namespace

TEST_CASE("RatioNorm and inverse_dt against GRPO-Guard's trainer", "[loss][reference]") {
  // Rows printed by tests/reference/guard_reference.py from the GRPO-Guard authors' trainer in Flow-GRPO
  // (yifan123/flow_grpo 9745241c, scripts/train_sd3_GRPO_Guard.py: its policy-loss lines, run on the output of
  // flow_grpo/diffusers_patch/sd3_sde_with_logprob.py's sde_step_with_logprob, sde_type "sde", float64, batch 1 of 3
  // elements): {schedule, step, a (noise_level), A, eps, x, v_old, v_new, next, mean_old, mean_new, std_dev_t
  // (Flow-GRPO's sigma_t), sqrt_dt, log_old, log_new, bias (ratio_mean_bias), ratio, loss (policy_loss before the
  // division by sqrt_dt^2), weighted_loss (after it), d_log_new, d_mean_new (autograd of weighted_loss)}.
  struct row {
    int schedule, step;
    double a, advantage, clip;
    std::array<double, 3> x, v_old, v_new, next, mean_old, mean_new;
    double std_dev_t, sqrt_dt, log_old, log_new, bias, ratio, loss, weighted_loss, d_log_new;
    std::array<double, 3> d_mean_new;
  };
  // clang-format off
  const row rows[] = {
      {0, 0, 0.7, 1.0, 0.001, {0.375, -1.25, 0.8125}, {-0.6875, 1.5, 0.09375}, {-0.6796875, 1.49609375, 0.10546875}, {0.6576785445213318, -1.7848213911056519, 0.7850893139839172}, {0.30767857142857136, -0.9973214285714284, 0.6100892857142857}, {0.3073995535714285, -0.997181919642857, 0.6096707589285714}, 3.704051835490433, 0.18898223650461327, -0.8252843838530923, -0.8254754708986946, 9.267971976737128e-08, 0.9998663128808017, -0.9998663128808017, -27.996256760662554, -19.597379732463782, {-4.666042434728528, 10.498595785771554, -2.3330217735999104}},
      {0, 2, 0.7, -1.5, 0.001, {-0.90625, 0.140625, 1.75}, {1.125, -0.4375, -2.0}, {1.109375, -0.4306640625, -1.9970703125}, {-1.6323504447937012, 0.47758379578590393, 1.626665711402893}, {-0.834818209134615, 0.14527869591346154, 1.6017427884615378}, {-0.8338829627403843, 0.14486952561598557, 1.6015674297626197}, 2.424871130596429, 0.21926450482675766, -0.7277107670432935, -0.7287563861137727, 6.325232973277508e-07, 0.9994445473384156, 1.4991668210076234, 31.182669876958467, 16.579456611464195, {-15.591334627265256, 6.496389460892913, 0.4872300003611627}},
      {0, 4, 0.7, 2.0, 2e-06, {1.3125, 0.5625, -0.296875}, {0.21875, -1.0625, 0.828125}, {0.2197265625, -1.0517578125, 0.822265625}, {1.5126160383224487, 1.0856847763061523, -0.6064661145210266}, {1.173345170454546, 0.6010120738636363, -0.3398961292613636}, {1.1732622736150573, 0.6001002086292613, -0.3393987482244318}, 1.4849242404917489, 0.2611164839335464, -0.4383103724358115, -0.43964780039295553, 1.203662168117141e-06, 0.999482028994955, -1.99896405798991, -29.31813951718542, -11.367762543617888, {-8.551122661181038, -12.215890374430078, 6.718739678621998}},
      {0, 6, 0.9, -0.75, 0.01, {0.375, -1.25, 0.8125}, {-0.6875, 1.5, 0.09375}, {-0.6796875, 1.49609375, 0.10546875}, {0.6335535049438477, -1.773469090461731, 0.7986452579498291}, {0.4281575520833334, -1.311328125, 0.6959472656249999}, {0.42701416015625004, -1.3107564290364584, 0.694232177734375}, 1.272792206135786, 0.3227486121839515, -0.2922909289181471, -0.29362915338402146, 4.51921762589362e-06, 0.9994522747191407, 0.7495892060393555, 7.196056377977809, 2.9560818024730273, {1.1993426934371816, -2.6985214778839253, 0.5996714395297619}},
      {0, 8, 0.7, 1.25, 0.001, {-0.90625, 0.140625, 1.75}, {1.125, -0.4375, -2.0}, {1.109375, -0.4306640625, -1.9970703125}, {-1.4712375402450562, 0.38723263144493103, 2.072666645050049}, {-1.0869768415178571, 0.2271240234375, 2.060658482142857}, {-1.0835030691964285, 0.22560424804687496, 2.060007149832589}, 0.6062177826491069, 0.4225771273642583, 0.0024902930943982624, -0.005603091686785004, 3.758995595548425e-05, 0.9979384446065179, -1.2474230557581474, -6.985569112245625, -1.789519569134725, {3.492784965189618, -1.455326919193492, -0.10914967625029988}},
      {0, 9, 0.7, -2.0, 2e-06, {1.3125, 0.5625, -0.296875}, {0.21875, -1.0625, 0.828125}, {0.2197265625, -1.0517578125, 0.822265625}, {1.3140400648117065, 1.0998563766479492, -0.6693090200424194}, {1.1372265625, 0.847265625, -0.5303841145833332}, {1.136922607421875, 0.843922119140625, -0.5285603841145834}, 0.404145188432738, 0.49999999999999994, 0.21339288687601723, 0.20393213332913215, 5.9581277321794697e-05, 0.9981020840553476, 1.999996, 7.999984000000002, 0.0, {0.0, 0.0, 0.0}},
      {1, 1, 0.5, 0.5, 0.001, {0.375, -1.25, 0.8125}, {-0.6875, 1.5, 0.09375}, {-0.6796875, 1.49609375, 0.10546875}, {0.7379907369613647, -2.0027642250061035, 0.7928234934806824}, {0.521484375, -1.515625, 0.6845703125}, {0.519287109375, -1.5145263671875, 0.6812744140625}, 0.8660254037844386, 0.5, -0.3449710834528634, -0.34741757158090714, 1.502037048339844e-05, 0.9989476976355938, -0.4994738488177969, -1.9978953952711875, -0.8651140832044004, {-0.3329825828197799, 0.7492106738383244, -0.16649129140988994}},
      {1, 2, 1.0, -1.0, 0.0001, {-0.90625, 0.140625, 1.75}, {1.125, -0.4375, -2.0}, {1.109375, -0.4306640625, -1.9970703125}, {-1.8515625, 0.58203125, 2.0859375}, {-1.1015625, 0.26953125, 2.0625}, {-1.095703125, 0.2669677734375, 2.0614013671875}, 1.0, 0.5, -0.6662617146147168, -0.6732516109121717, 2.8073787689208984e-05, 0.9965251400932611, 0.9999, 3.9996, 0.0, {0.0, 0.0, 0.0}},
      {1, 3, 0.7, 3.0, 0.001, {1.3125, 0.5625, -0.296875}, {0.21875, -1.0625, 0.828125}, {0.2197265625, -1.0517578125, 0.822265625}, {1.3140400648117065, 1.0998563766479492, -0.6693090200424194}, {1.1372265625, 0.847265625, -0.5303841145833333}, {1.136922607421875, 0.843922119140625, -0.5285603841145834}, 0.404145188432738, 0.5, 0.2133928868760173, 0.20393213332913207, 5.9581277321796336e-05, 0.9981020840553476, -2.9943062521660426, -11.97722500866417, -2.4202689290139414, {-3.4933569459196585, -4.990510595671907, 2.744780670602656}},
      {0, 3, 0.7, 1.0, 0.0001, {0.375, -1.25, 0.8125}, {-0.6875, 1.5, 0.09375}, {-0.6953125, 1.50390625, 0.08203125}, {0.6026011109352112, -1.7135452032089233, 0.8257501125335693}, {0.38187144886363644, -1.2169034090909092, 0.7153852982954546}, {0.38242409446022735, -1.2171797318892048, 0.7162142666903409}, 1.8520259177452125, 0.2383656473113982, -0.3642900347391438, -0.36369109906121483, 9.141737985699589e-07, 1.0002648443947584, -1.0001, -17.60175999999998, 0.0, {0.0, -0.0, 0.0}},
      {0, 7, 0.7, -1.0, 0.001, {-0.90625, 0.140625, 1.75}, {1.125, -0.4375, -2.0}, {1.140625, -0.4443359375, -2.0029296875}, {-1.4615756273269653, 0.38457342982292175, 1.9658480882644653}, {-1.025864955357143, 0.20302734375000003, 1.952232142857143}, {-1.0284702845982143, 0.2041671752929688, 1.952720642089844}, 0.7937253933193772, 0.36596252735570006, -0.12316690207059071, -0.11785494041262856, 1.6445605730522414e-05, 1.0015489608470503, 1.0015489608470503, 7.4782322409913045, 2.1722301696323028, {-3.7391165111451286, 1.5579649791457304, 0.11684727862460047}},
      {1, 0, 0.7, 2.0, 2e-06, {1.3125, 0.5625, -0.296875}, {0.21875, -1.0625, 0.828125}, {0.2177734375, -1.0732421875, 0.833984375}, {1.5487500429153442, 1.5653125047683716, -0.9124218821525574}, {0.93625, 0.6903125, -0.431171875}, {0.936494140625, 0.692998046875, -0.43263671875}, 1.4, 0.5, -1.0290604716930847, -1.0268838479040043, 3.2032428144597684e-06, 1.001527043667914, -2.000004, -8.000016, 0.0, {0.0, 0.0, -0.0}},
      {0, 5, 0.7, 1.0, 0.001, {0.375, -1.25, 0.8125}, {-0.6875, 1.5, 0.09375}, {-0.6875, 1.5, 0.09375}, {0.5907031297683716, -1.697291612625122, 0.8239192962646484}, {0.41570312499999995, -1.3035416666666666, 0.7364192708333334}, {0.41570312499999995, -1.3035416666666666, 0.7364192708333334}, 1.212435565298214, 0.28867513459481275, -0.13213717682922912, -0.13213717682922912, 0.0, 1.0, -1.0, -12.00000000000001, -4.200000000000001, {-2.000000054495678, 4.499999382382354, -1.000000290643602}},
  };
  // clang-format on
  for (const row& r : rows) {
    CAPTURE(r.schedule, r.step);
    const sigma_schedule schedule(reference_schedules[r.schedule]);
    const affine_step step = flow_grpo_sde{.noise_level = r.a}(schedule, r.step);
    // Their normaliser sqrt_dt * sigma_t is our edge std s.
    const double s = step.noise_std;
    CHECK(r.sqrt_dt * r.std_dev_t == Approx(s).epsilon(1e-12));
    for (std::size_t k = 0; k < 3; ++k) {
      CHECK(step.x_coeff * r.x[k] + step.velocity_coeff * r.v_old[k] == Approx(r.mean_old[k]).epsilon(1e-12));
      CHECK(step.x_coeff * r.x[k] + step.velocity_coeff * r.v_new[k] == Approx(r.mean_new[k]).epsilon(1e-12));
    }
    CHECK(their_log_prob(gaussian_log_prob_mean(r.next, r.mean_old, s)) == Approx(r.log_old).epsilon(1e-12));
    CHECK(their_log_prob(gaussian_log_prob_mean(r.next, r.mean_new, s)) == Approx(r.log_new).epsilon(1e-12));
    // Their bias is our mean gap b = kl_flow(mean_new, mean_old, s); their ratio exp((log r + b) s) is r_hat.
    const double gap = kl_flow(r.mean_new, r.mean_old, s);
    CHECK(gap == Approx(r.bias).epsilon(1e-12));
    const double log_ratio = ratio_norm_log_ratio(r.log_new, r.log_old, gap, s);
    CHECK(std::exp(log_ratio) == Approx(r.ratio).epsilon(1e-12));
    const double loss = ratio_norm_loss(r.log_new, r.log_old, gap, r.advantage, r.clip, s);
    CHECK(loss == Approx(r.loss).epsilon(1e-12));
    // Their gradient reweighting divides by sqrt_dt^2 = sigma_t - sigma_{t+1}: our raw inverse_dt weight.
    const double w = inverse_dt_weight(schedule.sigma(r.step), schedule.sigma(r.step + 1));
    CHECK(step_loss_weights(step_weighting::inverse_dt, schedule,
                            std::vector<double>(static_cast<std::size_t>(schedule.steps()), 1.0))[r.step] == w);
    CHECK(loss * w == Approx(r.weighted_loss).epsilon(1e-12));
    const double gradient = ratio_norm_loss_gradient(r.log_new, r.log_old, gap, r.advantage, r.clip, s);
    CHECK(gradient * w == Approx(r.d_log_new).epsilon(1e-12));
    // At the mean their autograd adds the bias's path; ours goes through -log p(mean_old) (the trainer's second
    // accumulate, at next = mean_old, with the weight negated).
    for (std::size_t k = 0; k < 3; ++k)
      CHECK(gradient * w *
                (log_prob_mean_gradient(r.next[k], r.mean_new[k], s, 3) -
                 log_prob_mean_gradient(r.mean_old[k], r.mean_new[k], s, 3)) ==
            Approx(r.d_mean_new[k]).epsilon(1e-12));
  }
}

TEST_CASE("noise_std against TempFlow-GRPO's trainer", "[loss][reference]") {
  // Rows printed by tests/reference/guard_reference.py from TempFlow-GRPO's process-reward trainer
  // (Shredded-Pork/TempFlow-GRPO e66824ec, scripts/train_sd3_pr.py: its policy-loss lines, run on the output of its
  // sde_step_with_logprob, noise level 0.7, float64, batch 1 of 3 elements), one per step of each schedule:
  // {schedule, step, A, eps, x, v_old, v_new, next, std (its returned std_dev_t * sqrt(-dt)), log_old, log_new, loss
  // (policy_loss), d_log_new (autograd)}.
  struct row {
    int schedule, step;
    double advantage, clip;
    std::array<double, 3> x, v_old, v_new, next;
    double std, log_old, log_new, loss, d_log_new;
  };
  // clang-format off
  const row rows[] = {
      {0, 0, 1.0, 0.001, {0.375, -1.25, 0.8125}, {-0.6875, 1.5, 0.09375}, {-0.6796875, 1.49609375, 0.10546875}, {0.6576785445213318, -1.7848213911056519, 0.7850893139839172}, 0.6999999999999998, -0.8252843838530923, -0.8254754708986946, -1.5746990666563236, -1.5746990666563236},
      {0, 1, -1.5, 0.0001, {-0.90625, 0.140625, 1.75}, {1.125, -0.4375, -2.0}, {1.109375, -0.4306640625, -1.9970703125}, {-1.8153352737426758, 0.5847994089126587, 1.3925094604492188}, 0.7383713887281323, -1.0561005663919916, -1.0567457870671828, 2.491754236613751, 0.0},
      {0, 2, 0.75, 0.01, {1.3125, 0.5625, -0.296875}, {0.21875, -1.0625, 0.828125}, {0.2197265625, -1.0517578125, 0.822265625}, {1.5636571645736694, 1.2045741081237793, -0.6665197014808655}, 0.531688167718926, -0.754037267214033, -0.7547246999133789, -0.8966072140077378, -0.8966072140077378},
      {0, 3, -0.5, 0.001, {0.375, -1.25, 0.8125}, {-0.6875, 1.5, 0.09375}, {-0.6796875, 1.49609375, 0.10546875}, {0.6026011109352112, -1.7135452032089233, 0.8257501125335693}, 0.4414593567208239, -0.3642900347391438, -0.36489079876466973, 0.4963435014035341, 0.4963435014035341},
      {0, 4, 1.0, 0.0001, {-0.90625, 0.140625, 1.75}, {1.125, -0.4375, -2.0}, {1.109375, -0.4306640625, -1.9970703125}, {-1.5000927448272705, 0.40717923641204834, 1.777166724205017}, 0.3877381965848974, -0.4119839908693714, -0.41401855763650075, -0.8706377684374912, -0.8706377684374912},
      {0, 5, -1.5, 0.01, {1.3125, 0.5625, -0.296875}, {0.21875, -1.0625, 0.828125}, {0.2197265625, -1.0517578125, 0.822265625}, {1.488867163658142, 1.064296841621399, -0.5991731882095337}, 0.3499999999999998, -0.33591321575218763, -0.33772467879417883, 1.1791121461878278, 1.1791121461878278},
      {0, 6, 0.75, 0.001, {0.375, -1.25, 0.8125}, {-0.6875, 1.5, 0.09375}, {-0.6796875, 1.49609375, 0.10546875}, {0.5952016115188599, -1.7082710266113281, 0.8180109858512878}, 0.31950482521134704, -0.040976409894081946, -0.042501763981767415, -0.5383426028535169, -0.5383426028535169},
      {0, 7, -0.5, 0.0001, {-0.90625, 0.140625, 1.75}, {1.125, -0.4375, -2.0}, {1.109375, -0.4306640625, -1.9970703125}, {-1.4615756273269653, 0.38457342982292175, 1.9658480882644653}, 0.2904737509655564, -0.12316690207059071, -0.12851175494001424, 0.3267502915392673, 0.0},
      {0, 8, 1.0, 0.01, {1.3125, 0.5625, -0.296875}, {0.21875, -1.0625, 0.828125}, {0.2197265625, -1.0517578125, 0.822265625}, {1.3875309228897095, 1.0758672952651978, -0.6343749165534973}, 0.25617376914898987, -0.023836041065476543, -0.029151915856633053, -0.5733350878694586, -0.5733350878694586},
      {0, 9, -1.5, 0.001, {0.375, -1.25, 0.8125}, {-0.6875, 1.5, 0.09375}, {-0.6796875, 1.49609375, 0.10546875}, {0.659395694732666, -1.8421233892440796, 0.7674843072891235}, 0.20207259421636897, 0.4171687935805692, 0.41131827032001417, 0.681313010474765, 0.0},
      {1, 0, 0.75, 0.0001, {-0.90625, 0.140625, 1.75}, {1.125, -0.4375, -2.0}, {1.109375, -0.4306640625, -1.9970703125}, {-2.0154688358306885, 0.6530468463897705, 1.854062557220459}, 0.7, -1.0027340053058615, -1.0060555250435195, -1.1773329636678591, -1.1773329636678591},
      {1, 1, -0.5, 0.01, {1.3125, 0.5625, -0.296875}, {0.21875, -1.0625, 0.828125}, {0.2197265625, -1.0517578125, 0.822265625}, {1.4532921314239502, 1.5131628513336182, -0.8986692428588867}, 0.606217782649107, -0.885219410149475, -0.8883597543036913, 0.679856665770201, 0.679856665770201},
      {1, 2, 1.0, 0.001, {0.375, -1.25, 0.8125}, {-0.6875, 1.5, 0.09375}, {-0.6796875, 1.49609375, 0.10546875}, {0.7180469036102295, -1.9574999809265137, 0.771289050579071}, 0.35, -0.1321372167548771, -0.1354944051237964, -0.7848606470409527, -0.7848606470409527},
      {1, 3, -1.5, 0.0001, {-0.90625, 0.140625, 1.75}, {1.125, -0.4375, -2.0}, {1.109375, -0.4306640625, -1.9970703125}, {-1.4855047464370728, 0.3916078805923462, 2.2390553951263428}, 0.202072594216369, 0.23971931731731275, 0.2253032926819664, 0.6819268059796973, 0.0},
  };
  // clang-format on
  for (const row& r : rows) {
    CAPTURE(r.schedule, r.step);
    const sigma_schedule schedule(reference_schedules[r.schedule]);
    const auto steps = static_cast<std::size_t>(schedule.steps());
    std::vector<double> stds(steps);
    for (std::size_t t = 0; t < steps; ++t)
      stds[t] = flow_grpo_sde{.noise_level = 0.7}(schedule, static_cast<int>(t)).noise_std;
    const double mean_std = std::accumulate(stds.begin(), stds.end(), 0.0) / static_cast<double>(steps);
    const std::vector<double> weights = step_loss_weights(step_weighting::noise_std, schedule, stds);
    const auto t = static_cast<std::size_t>(r.step);
    CHECK(stds[t] == Approx(r.std).epsilon(1e-12));
    const affine_step step = flow_grpo_sde{.noise_level = 0.7}(schedule, r.step);
    std::array<double, 3> mean_old{}, mean_new{};
    for (std::size_t k = 0; k < 3; ++k) {
      mean_old[k] = step.x_coeff * r.x[k] + step.velocity_coeff * r.v_old[k];
      mean_new[k] = step.x_coeff * r.x[k] + step.velocity_coeff * r.v_new[k];
    }
    CHECK(their_log_prob(gaussian_log_prob_mean(r.next, mean_old, stds[t])) == Approx(r.log_old).epsilon(1e-12));
    CHECK(their_log_prob(gaussian_log_prob_mean(r.next, mean_new, stds[t])) == Approx(r.log_new).epsilon(1e-12));
    // Their weight is 2.25 std_t, a hand-tuned constant times the raw std; ours std_t / mean_s std_s: theirs is ours
    // times 2.25 mean_s std_s.
    const double theirs = 2.25 * mean_std * weights[t];
    CHECK(theirs * ppo_clipped_loss(r.log_new, r.log_old, r.advantage, r.clip) == Approx(r.loss).epsilon(1e-12));
    CHECK(theirs * ppo_clipped_loss_gradient(r.log_new, r.log_old, r.advantage, r.clip) ==
          Approx(r.d_log_new).epsilon(1e-12));
  }
}
