#include <catch2/catch.hpp>

#include <cmath>
#include <numbers>

#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/schedule/steppers.hpp"

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

TEST_CASE("euler_ode and bad stepper input", "[stepper]") {
  const sigma_schedule schedule({1.0, 0.5, 0.0});
  CHECK(euler_ode{}(schedule, 0) == affine_step{1.0, -0.5, 0.0});
  CHECK_THROWS_WITH(euler_ode{}(schedule, 2), "step 2 is outside [0, 2)");
  CHECK_THROWS_WITH(dance_sde{.eta = NAN}(schedule, 0), "dance_sde eta must be positive and finite, got nan");
  CHECK_THROWS_AS(flow_grpo_sde{.noise_level = 0.0}(schedule, 0), invalid_input);
}

TEST_CASE("gaussian_log_prob_mean", "[stepper]") {
  const std::vector<double> next{1, 3}, mean{1, 1};
  // The doc comment's example: -0.25 - log 2 - 0.5 log(2 pi).
  CHECK(gaussian_log_prob_mean(next, mean, 2.0) ==
        Approx(-0.25 - std::log(2.0) - 0.5 * std::log(2 * std::numbers::pi)));
  CHECK_THROWS_AS(gaussian_log_prob_mean(next, std::vector<double>{1}, 2.0), invalid_input);
  CHECK_THROWS_WITH(gaussian_log_prob_mean(next, mean, 0.0), "log-prob standard deviation must be positive, got 0");
}
