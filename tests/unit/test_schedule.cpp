#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <numbers>
#include <vector>

#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/schedule/stepper_catalog.hpp"
#include "branchgrpo/schedule/steppers.hpp"
#include "branchgrpo/tree/tree_plan.hpp"

using namespace branchgrpo;

TEST_CASE("shifted linear schedule", "[schedule]") {
  const auto two = shifted_linear_schedule(2, 3.0);
  REQUIRE(two.steps() == 2);
  CHECK(two.sigma(0) == 1.0);
  CHECK(two.sigma(1) == Approx(0.75));  // 3 * 0.5 / (1 + 2 * 0.5)
  CHECK(two.sigma(2) == 0.0);

  const auto twenty = shifted_linear_schedule(20);
  REQUIRE(twenty.steps() == 20);
  CHECK(twenty.sigma(10) == Approx(0.75));
  CHECK(twenty.sigma(19) == Approx(3 * 0.05 / (1 + 2 * 0.05)));
  // shift 1 is the plain linear schedule
  CHECK(shifted_linear_schedule(4, 1.0).sigma(1) == Approx(0.75));
}

TEST_CASE("user schedules are validated", "[schedule]") {
  CHECK(sigma_schedule({1.0, 0.5, 0.0}).steps() == 2);
  CHECK_THROWS_WITH(sigma_schedule({1.0, 0.5, 0.5}), "sigma schedule does not decrease at index 2: 0.5 then 0.5");
  CHECK_THROWS_WITH(sigma_schedule({1.2, 0.5}), "sigma[0] = 1.2 is outside [0, 1]");
  CHECK_THROWS_WITH(sigma_schedule({1.0, NAN}), "sigma[1] = nan is outside [0, 1]");
  CHECK_THROWS_WITH(sigma_schedule({1.0}), "a sigma schedule needs at least 2 values, got 1");
  CHECK_THROWS_WITH(shifted_linear_schedule(0), "the number of steps must be at least 1, got 0");
  // Checked before the schedule is allocated (2^31 steps would be 16 GiB).
  CHECK(shifted_linear_schedule(max_steps).steps() == max_steps);
  CHECK_THROWS_WITH(shifted_linear_schedule(2147483647), "at most 255 steps are supported, got 2147483647");
  CHECK_THROWS_AS(shifted_linear_schedule(4, -1.0), invalid_input);
}

TEST_CASE("dance_sde coefficients match the DanceGRPO formulas", "[stepper]") {
  const sigma_schedule schedule({1.0, 0.5, 0.0});
  // The doc comment's example.
  const auto step0 = dance_sde{}(schedule, 0);
  CHECK(step0.x_coeff == Approx(0.9775));
  CHECK(step0.velocity_coeff == Approx(-0.5));
  CHECK(step0.noise_std == Approx(0.3 * std::sqrt(0.5)));

  // Against the unsimplified form on arbitrary values: x0 = x - sig v; score = -(x - (1-sig) x0)/sig^2;
  // mean = x + d v - 0.5 eta^2 score d.
  const auto schedule20 = shifted_linear_schedule(20);
  const double eta = 0.7, x = 0.37, v = -1.3;
  for (int i = 0; i < 20; ++i) {
    const double sig = schedule20.sigma(i), d = schedule20.sigma(i + 1) - sig;
    const double x0 = x - sig * v;
    const double score = -(x - (1 - sig) * x0) / (sig * sig);
    const double mean = x + d * v - 0.5 * eta * eta * score * d;
    const auto step = dance_sde{.eta = eta}(schedule20, i);
    CHECK(step.x_coeff * x + step.velocity_coeff * v == Approx(mean).epsilon(1e-12));
    CHECK(step.noise_std == Approx(eta * std::sqrt(-d)));
  }
}

TEST_CASE("flow_grpo_sde coefficients match the Flow-GRPO formulas", "[stepper]") {
  const sigma_schedule schedule({1.0, 0.5, 0.0});
  const auto step1 = flow_grpo_sde{}(schedule, 1);  // the doc comment's example
  CHECK(step1.x_coeff == Approx(0.755));
  CHECK(step1.velocity_coeff == Approx(-0.6225));
  CHECK(step1.noise_std == Approx(0.7 * std::sqrt(0.5)));
  // At sigma 1 the denominator uses sigma[1]: std_t = 0.7 sqrt(1 / 0.5).
  const auto step0 = flow_grpo_sde{}(schedule, 0);
  const double std_t = 0.7 * std::sqrt(2.0);
  CHECK(step0.noise_std == Approx(std_t * std::sqrt(0.5)));
  CHECK(step0.x_coeff == Approx(1 + std_t * std_t / 2 * -0.5));
  CHECK(step0.velocity_coeff == Approx(-0.5));
}

TEST_CASE("cps coefficients match the Flow-CPS formulas", "[stepper]") {
  const sigma_schedule schedule({1.0, 0.5, 0.0});
  // The doc comment's example: c = 0.5 cos(pi / 4).
  const auto step0 = cps{.eta = 0.5}(schedule, 0);
  CHECK(step0.x_coeff == Approx(0.8535533906));
  CHECK(step0.velocity_coeff == Approx(-0.5));
  CHECK(step0.noise_std == Approx(0.3535533906));
  CHECK(step0.log_prob_std == Approx(0.7071067812));
  CHECK(cps{.eta = 0.5}(schedule, 1) == affine_step{1.0, -0.5, 0.0, 1.0 / std::sqrt(2.0)});

  // Against Flow-CPS's unsimplified form on arbitrary values: std = nxt sin(eta pi / 2); x0 = x - sig v;
  // x1 = x + (1 - sig) v; mean = (1 - nxt) x0 + sqrt(nxt^2 - std^2) x1. And the @post: std^2 + c^2 == nxt^2.
  const auto schedule20 = shifted_linear_schedule(20);
  const double eta = 0.8, x = 0.37, v = -1.3;
  for (int i = 0; i < 20; ++i) {
    const double sig = schedule20.sigma(i), nxt = schedule20.sigma(i + 1);
    const double std_dev = nxt * std::sin(eta * std::numbers::pi / 2);
    const double c = std::sqrt(nxt * nxt - std_dev * std_dev);
    const double mean = (1 - nxt) * (x - sig * v) + c * (x + (1 - sig) * v);
    const auto step = cps{.eta = eta}(schedule20, i);
    CHECK(step.x_coeff * x + step.velocity_coeff * v == Approx(mean).epsilon(1e-12));
    CHECK(step.noise_std == Approx(std_dev).margin(1e-15));
    CHECK(step.noise_std * step.noise_std + (step.x_coeff - 1 + nxt) * (step.x_coeff - 1 + nxt) ==
          Approx(nxt * nxt).margin(1e-15));
    CHECK(step.log_prob_std == 1.0 / std::numbers::sqrt2);
  }
  // eta = 1: all fresh noise (c = 0): mean = (1 - nxt) x0.
  const auto full = cps{.eta = 1.0}(schedule, 0);
  CHECK(full.x_coeff == Approx(0.5));
  CHECK(full.velocity_coeff == Approx(-0.5));
  CHECK(full.noise_std == Approx(0.5));
  // Scored with log_prob_std, an edge's log-prob is Flow-CPS's -mean_i (next_i - mean_i)^2 less 0.5 log pi.
  const std::vector<double> next{0.4, -1.1, 2.0}, mean{0.1, -0.5, 1.5};
  const double flow_cps = -(0.09 + 0.36 + 0.25) / 3;
  CHECK(gaussian_log_prob_mean(next, mean, full.log_prob_std) ==
        Approx(flow_cps - 0.5 * std::log(std::numbers::pi)).epsilon(1e-14));
  CHECK_THROWS_WITH(cps{.eta = 1.5}(schedule, 0), "cps eta must be in (0, 1], got 1.5");
  CHECK_THROWS_WITH(cps{.eta = 0.0}(schedule, 0), "cps eta must be in (0, 1], got 0");
}

TEST_CASE("per_layer_eta, tree_plan::layer, step_coefficients and scoring_std", "[stepper]") {
  const sigma_schedule schedule = shifted_linear_schedule(4);
  // tree_plan::layer's example: branching {2, 1, 2, 1} -> layers 0, 1, 1, 2.
  const tree_plan plan{
      .steps = 4, .roots = 1, .branching = {2, 1, 2, 1}, .kinds = std::vector<edge_kind>(4, edge_kind::sde)};
  CHECK(plan.layer(0) == 0);
  CHECK(plan.layer(1) == 1);
  CHECK(plan.layer(2) == 1);
  CHECK(plan.layer(3) == 2);
  CHECK_THROWS_WITH(plan.layer(5), "step 5 is outside [0, 4]");

  // per_layer_eta's example: a layer beyond the list takes the last eta.
  const per_layer_eta layered{.etas = {0.5, 0.3}};
  CHECK(layered(schedule, 3, 2) == dance_sde{.eta = 0.3}(schedule, 3));
  CHECK(layered(schedule, 0, 0) == dance_sde{.eta = 0.5}(schedule, 0));
  CHECK(layered(schedule, 1, 1) == dance_sde{.eta = 0.3}(schedule, 1));
  const per_layer_eta layered_cps{.etas = {1.0, 0.5}, .sampler = layer_sampler::cps};
  CHECK(layered_cps(schedule, 2, 7) == cps{.eta = 0.5}(schedule, 2));
  CHECK(layered_cps(schedule, 0, 0) == cps{.eta = 1.0}(schedule, 0));

  // step_coefficients: the layer reaches a layered stepper and any_stepper holding one; a plain one ignores it.
  static_assert(LayeredStepper<per_layer_eta> && !PlainStepper<per_layer_eta> && Stepper<per_layer_eta>);
  static_assert(LayeredStepper<any_stepper> && Stepper<any_stepper> && PlainStepper<cps>);
  CHECK(step_coefficients(layered, schedule, 3, 0) == dance_sde{.eta = 0.5}(schedule, 3));
  CHECK(step_coefficients(cps{}, schedule, 1, 3) == cps{}(schedule, 1));
  CHECK(any_stepper{layered}(schedule, 3, 1) == dance_sde{.eta = 0.3}(schedule, 3));
  CHECK(any_stepper{cps{.eta = 0.5}}(schedule, 0, 3) == cps{.eta = 0.5}(schedule, 0));  // any_stepper's example

  // scoring_std's example.
  CHECK(scoring_std({.noise_std = 0.2}, 0.8) == 0.8);
  CHECK(scoring_std({.noise_std = 0.2, .log_prob_std = 0.5}, 0.8) == 0.5);

  // Bad lists: one line naming the value.
  CHECK_THROWS_WITH((per_layer_eta{.etas = {}}(schedule, 0, 0)), "per_layer_eta needs at least one eta");
  CHECK_THROWS_WITH((per_layer_eta{.etas = {0.3, -0.2}}(schedule, 0, 0)),
                    "per_layer_eta etas[1] = -0.2 is not positive and finite");
  CHECK_THROWS_WITH((per_layer_eta{.etas = {0.5, 1.5}, .sampler = layer_sampler::cps}(schedule, 0, 0)),
                    "per_layer_eta etas[1] = 1.5 is not in (0, 1] (cps)");
  CHECK_THROWS_WITH(layered(schedule, 0, -1), "per_layer_eta layer -1 is negative");
  CHECK_THROWS_WITH(validate_parameters(per_layer_eta{.etas = {}}, "rollout"), "rollout.etas = []: must not be empty");
  CHECK_THROWS_WITH(validate_parameters(cps{.eta = 2.0}, "rollout"), "rollout.eta = 2.0: must be in [0.0001, 1]");
}

TEST_CASE("euler_ode and bad stepper input", "[stepper]") {
  const sigma_schedule schedule({1.0, 0.5, 0.0});
  CHECK(euler_ode{}(schedule, 0) == affine_step{1.0, -0.5, 0.0});
  CHECK_THROWS_WITH(euler_ode{}(schedule, 2), "step 2 is outside [0, 2)");
  CHECK_THROWS_WITH(dance_sde{.eta = NAN}(schedule, 0), "dance_sde eta must be positive and finite, got nan");
  CHECK_THROWS_AS(flow_grpo_sde{.noise_level = 0.0}(schedule, 0), invalid_input);
}

TEST_CASE("ode_step: Euler and DPM-Solver++(2M), the doc examples", "[stepper][ode]") {
  const sigma_schedule schedule({1.0, 0.75, 0.5, 0.25, 0.0});
  // r = (0 - (-ln 3)) / (ln 3 - 0) = 1, rho = 0.5: x_coeff 0.5 + 0.5 * 1.5, velocity -0.5 * 1.5 * 0.5, prev -0.25.
  const affine_step second = ode_step(ode_solver::dpm_solver_2m, schedule, {.from = 2, .to = 3, .previous = 1});
  CHECK(second.x_coeff == Approx(1.25).margin(1e-15));
  CHECK(second.velocity_coeff == Approx(-0.375).margin(1e-15));
  CHECK(second.previous_x0_coeff == Approx(-0.25).margin(1e-15));
  CHECK(second.noise_std == 0.0);
  CHECK(second.x_coeff + second.previous_x0_coeff == Approx(1.0).margin(1e-15));  // @post
  // Exact on a straight path x_t = (1 - t) x0 + t eps (x0 2, eps -1): x(0.5) = 0.5, v = eps - x0 = -3.
  const double x = 0.5, v = -3.0, x0 = 2.0;
  CHECK(second.x_coeff * x + second.velocity_coeff * v + second.previous_x0_coeff * x0 ==
        Approx(0.75 * 2.0 + 0.25 * -1.0).margin(1e-15));
  // Landing on sigma 0 (lambda infinite), no previous prediction, or the Euler solver: first order.
  CHECK(ode_step(ode_solver::dpm_solver_2m, schedule, {.from = 2, .to = 4, .previous = 1}) ==
        affine_step{.x_coeff = 1.0, .velocity_coeff = -0.5});
  CHECK(ode_step(ode_solver::dpm_solver_2m, schedule, {.from = 2, .to = 3}) ==
        affine_step{.x_coeff = 1.0, .velocity_coeff = -0.25});
  CHECK(ode_step(ode_solver::dpm_solver_2m, schedule, {.from = 1, .to = 2, .previous = 0}) ==
        affine_step{.x_coeff = 1.0, .velocity_coeff = -0.25});  // previous at sigma 1: lambda -inf
  CHECK(ode_step(ode_solver::euler, schedule, {.from = 1, .to = 3}) ==
        affine_step{.x_coeff = 1.0, .velocity_coeff = -0.5});
  CHECK(ode_step(ode_solver::euler, schedule, {.from = 0, .to = 1}) == euler_ode{}(schedule, 0));
  CHECK_THROWS_WITH(ode_step(ode_solver::euler, schedule, {.from = 2, .to = 2}),
                    "ODE edge from step 2 to 2 is outside [0, 4]");
  CHECK_THROWS_WITH(ode_step(ode_solver::euler, schedule, {.from = 3, .to = 5}),
                    "ODE edge from step 3 to 5 is outside [0, 4]");
  CHECK_THROWS_WITH(ode_step(ode_solver::dpm_solver_2m, schedule, {.from = 2, .to = 3, .previous = 2}),
                    "ODE edge from step 2 has its previous data prediction at step 2");
}

TEST_CASE("ode_step against MixGRPO's DPM-Solver++", "[stepper][ode][reference]") {
  // Rows printed by tests/reference/dpm_solver_reference.py, which runs MixGRPO's own ODE updates
  // (fastvideo/utils/sampling_utils.py: multistep_dpm_solver_second_order_update, "dpmsolver++" / "midpoint", and
  // dpm_solver_first_order_update; float64) from a checkout of Tencent-Hunyuan/MixGRPO:
  //   {sigma_prev (-1: first order), sigma_from, sigma_to, x, v, x0_prev, MixGRPO's next}.
  struct row {
    double sigma_prev, sigma_from, sigma_to, x, v, x0_prev, next;
  };
  const row rows[] = {
      {0.9, 0.8, 0.7, 0.7, -1.3, 0.4, 0.8856656491935683},
      {0.75, 0.5, 0.25, 0.7, -1.3, 0.4, 1.2625},
      {0.8571428571428571, 0.7826086956521738, 0.6923076923076923, 0.7, -1.3, 0.4, 0.8873209360640542},
      {0.6, 0.45, 0.2, 0.7, -1.3, 0.4, 1.505858936381434},
      {0.95, 0.5, 0.45, 0.7, -1.3, 0.4, 0.7682372408129005},
      {0.3, 0.2, 0.05, 0.7, -1.3, 0.4, 1.5020732729154656},
      {-1, 0.5, 0.25, 0.7, -1.3, 0.4, 1.025},
      {-1, 0.8, 0.4, 0.7, -1.3, 0.4, 1.2199999999999998},
  };
  for (const row& r : rows) {
    // The three sigmas as steps 1, 2, 3 of a schedule from 1 to 0 (the steps between are what a skip edge spans).
    const bool second = r.sigma_prev >= 0;
    const sigma_schedule schedule(second ? std::vector<double>{1.0, r.sigma_prev, r.sigma_from, r.sigma_to, 0.0}
                                         : std::vector<double>{1.0, 0.99, r.sigma_from, r.sigma_to, 0.0});
    const affine_step step =
        ode_step(ode_solver::dpm_solver_2m, schedule, {.from = 2, .to = 3, .previous = second ? 1 : -1});
    CHECK(step.x_coeff * r.x + step.velocity_coeff * r.v + step.previous_x0_coeff * r.x0_prev ==
          Approx(r.next).epsilon(1e-13));
  }
}

TEST_CASE("cps against Flow-GRPO's sde_step_with_logprob", "[stepper][reference]") {
  // Rows printed by tests/reference/cps_reference.py, which runs Flow-GRPO's own step (yifan123/flow_grpo 54809b5f,
  // flow_grpo/diffusers_patch/sd3_sde_with_logprob.py: sde_step_with_logprob, sde_type "cps", float64, batch 1 of 3
  // elements): {sigma, sigma_next, eta (its noise_level), x, v, eps, sample = its prev_sample drawn with eps, next,
  // mean = its prev_sample_mean, std = its std_dev_t, log_prob = its log_prob of the given next}.
  struct row {
    double sigma, sigma_next, eta;
    std::array<double, 3> x, v, eps, sample, next, mean;
    double std, log_prob;
  };
  // clang-format off
  const row rows[] = {
      {1.0, 0.9642857142857144, 0.8, {0.375, -1.25, 0.8125}, {-0.6875, 1.5, 0.09375}, {0.5, -1.125, 0.25}, {0.6082342870725327, -1.5024166158078487, 0.49705149282473915}, {0.25, -0.75, 0.5625}, {0.14968918100165501, -0.4706901271483739, 0.26777893978930034}, 0.9170902121417553, -0.058312256270743046},
      {0.8749999999999999, 0.818181818181818, 0.5, {-0.90625, 0.140625, 1.75}, {1.125, -0.4375, -2.0}, {-1.5, 0.625, 0.046875}, {-1.6545090191029042, 0.5064775950225726, 1.531295656302861}, {-1.0, 0.3125, 1.4375}, {-0.7866961512830506, 0.14488890009763372, 1.5041765041834907}, 0.5785419118799023, -0.026012589632691763},
      {0.6666666666666667, 0.5625, 1.0, {1.3125, 0.5625, -0.296875}, {0.21875, -1.0625, 0.828125}, {0.875, 1.25, -0.6875}, {1.0026041666666667, 1.2591145833333335, -0.7581380208333334}, {1.0, 0.9375, -0.5}, {0.5104166666666667, 0.5559895833333334, -0.37141927083333337}, 0.5625, -0.13392501407199434},
      {0.4285714285714285, 0.24999999999999994, 0.1, {0.375, -1.25, 0.8125}, {-0.6875, 1.5, 0.09375}, {0.5, -1.125, 0.25}, {0.5173771280380862, -1.5606451553153018, 0.8028703885242294}, {0.25, -0.75, 0.5625}, {0.4978228199080573, -1.5166479620227369, 0.793093234459215}, 0.03910861626005771, -0.23411282917305323},
      {0.24999999999999994, 0.0, 0.8, {-0.90625, 0.140625, 1.75}, {1.125, -0.4375, -2.0}, {-1.5, 0.625, 0.046875}, {-1.1875, 0.24999999999999997, 2.25}, {-1.0, 0.3125, 1.4375}, {-1.1875, 0.24999999999999997, 2.25}, 0.0, -0.23307291666666666},
      {0.75, 0.5, 0.3, {1.3125, 0.5625, -0.296875}, {0.21875, -1.0625, 0.828125}, {0.875, 1.25, -0.6875}, {1.381926084780444, 1.0956903432714276, -0.6550692929892435}, {1.0, 0.9375, -0.5}, {1.1833052411443923, 0.8119462809342108, -0.49901005870377435}, 0.22699524986977337, -0.016455175928674962},
      {0.5, 0.25, 0.7, {0.375, -1.25, 0.8125}, {-0.6875, 1.5, 0.09375}, {0.5, -1.125, 0.25}, {0.6539851163027612, -1.8073443973954217, 0.7274436791901913}, {0.25, -0.75, 0.5625}, {0.5426093007792152, -1.5567488124674433, 0.6717557714284182}, 0.22275163104709195, -0.24946689097018337},
      {1.0, 0.5, 0.5, {-0.90625, 0.140625, 1.75}, {1.125, -0.4375, -2.0}, {-1.5, 0.625, 0.046875}, {-1.8663628461150648, 0.5597518146729752, 2.510291248722289}, {-1.0, 0.3125, 1.4375}, {-1.3360327602251543, 0.33878094555217914, 2.493718433538229}, 0.35355339059327373, -0.40973536112986775},
  };
  // clang-format on
  for (const row& r : rows) {
    const sigma_schedule schedule({r.sigma, r.sigma_next});
    const affine_step step = cps{.eta = r.eta}(schedule, 0);
    std::array<double, 3> mean{};
    for (std::size_t k = 0; k < 3; ++k) {
      mean[k] = step.x_coeff * r.x[k] + step.velocity_coeff * r.v[k];
      CHECK(mean[k] == Approx(r.mean[k]).epsilon(1e-12));
      CHECK(mean[k] + step.noise_std * r.eps[k] == Approx(r.sample[k]).epsilon(1e-12));
    }
    CHECK(step.noise_std == Approx(r.std).epsilon(1e-12));
    // Flow-GRPO's log-prob is -mean_k (next_k - mean_k)^2 (constants removed); ours is log N(next; mean, 1/2)
    // averaged over the elements, the same less 0.5 log pi.
    CHECK(gaussian_log_prob_mean(r.next, mean, step.log_prob_std) ==
          Approx(r.log_prob - 0.5 * std::log(std::numbers::pi)).epsilon(1e-12));
    // per_layer_eta with sampler cps is cps at its layer's eta.
    CHECK(per_layer_eta{.etas = {0.3, r.eta}, .sampler = layer_sampler::cps}(schedule, 0, 1) == step);
  }
}

TEST_CASE("gaussian_log_prob_mean", "[stepper]") {
  const std::vector<double> next{1, 3}, mean{1, 1};
  // The doc comment's example: -0.25 - log 2 - 0.5 log(2 pi).
  CHECK(gaussian_log_prob_mean(next, mean, 2.0) ==
        Approx(-0.25 - std::log(2.0) - 0.5 * std::log(2 * std::numbers::pi)));
  CHECK_THROWS_AS(gaussian_log_prob_mean(next, std::vector<double>{1}, 2.0), invalid_input);
  CHECK_THROWS_WITH(gaussian_log_prob_mean(next, mean, 0.0), "log-prob standard deviation must be positive, got 0");
}
