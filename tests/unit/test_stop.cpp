// <branchgrpo/core/stop.hpp>: the doc examples, and the checks of the core's long loops (the rollout engine before
// each denoiser call, the ODE sampler likewise), with a denoiser that asks for the stop itself mid-loop.
#include <catch2/catch.hpp>

#include <csignal>
#include <cstdint>
#include <vector>

#include "branchgrpo/core/stop.hpp"
#include "branchgrpo/correlator/independent.hpp"
#include "branchgrpo/rollout.hpp"
#include "branchgrpo/topology.hpp"
#include "gaussian_denoiser.hpp"

using namespace branchgrpo;
using branchgrpo::testing::gaussian_denoiser;

namespace {

// The Gaussian oracle, which requests a stop (as a signal handler would) during its `at`-th call.
struct stopping_denoiser {
  int at = 3;
  int calls = 0;
  gaussian_denoiser exact{};
  host_tensor operator()(const host_tensor& x, const denoise_batch& batch) {
    if (++calls == at) request_stop(SIGTERM);
    return exact(x, batch);
  }
};

// Clears the request on both ends of a test, whatever it does in between.
struct clean_stop {
  clean_stop() { clear_stop(); }
  ~clean_stop() { clear_stop(); }
};

}  // namespace

TEST_CASE("stop requests: the first wins, clear forgets, check throws naming where", "[stop]") {
  const clean_stop clean;
  CHECK(stop_signal() == 0);
  CHECK_NOTHROW(check_stop("the rollout"));
  CHECK(stop_signal_name(SIGTERM) == "SIGTERM");
  CHECK(stop_signal_name(SIGINT) == "SIGINT");
  CHECK(stop_signal_name(SIGHUP) == "signal " + std::to_string(SIGHUP));
  request_stop(SIGTERM);
  request_stop(SIGINT);  // ignored: the first request wins
  CHECK(stop_signal() == SIGTERM);
  CHECK_THROWS_WITH(check_stop("the rollout"), "stopped by SIGTERM during the rollout");
  try {
    check_stop("x");
  } catch (const stop_requested& stop) {
    CHECK(stop.signal() == SIGTERM);
  }
  CHECK(stop_signal() == SIGTERM);  // checking does not clear
  clear_stop();
  CHECK(stop_signal() == 0);
  CHECK_NOTHROW(check_stop("the rollout"));
  // Not an invalid_input: the CLI gives it exit 128 + signal, not 2.
  request_stop(SIGINT);
  CHECK_THROWS_AS(check_stop("x"), stop_requested);
  bool as_input = false;
  try {
    check_stop("x");
  } catch (const invalid_input&) {
    as_input = true;
  } catch (const stop_requested&) {
  }
  CHECK_FALSE(as_input);
}

TEST_CASE("a stop ends the rollout before its next denoiser call", "[stop][rollout]") {
  const clean_stop clean;
  host_backend backend;
  stopping_denoiser denoiser{.at = 3};
  const rollout_tree forest(split_schedule::dense()(20), std::vector<tree_info>{{.key = 1, .prompt = 0}});
  CHECK_THROWS_WITH(rollout(backend, denoiser, dance_sde{}, independent{}, shifted_linear_schedule(20), forest,
                            latent_shape{{3}}, {.max_batch = 64}),
                    "stopped by SIGTERM during the rollout");
  CHECK(denoiser.calls == 3);  // the call that asked finished; no fourth one was made
  clear_stop();
  stopping_denoiser fine{.at = 1000};
  CHECK(rollout(backend, fine, dance_sde{}, independent{}, shifted_linear_schedule(20), forest, latent_shape{{3}},
                {.max_batch = 64})
            .denoiser_calls == 20);
}

TEST_CASE("a stop ends ODE sampling before its next denoiser call", "[stop][ode]") {
  const clean_stop clean;
  host_backend backend;
  stopping_denoiser denoiser{.at = 5};
  const std::vector<std::int64_t> prompts = {0, 1, 2};
  const auto key = [](std::int64_t r) {
    return noise_key{.seed = 1, .iteration = 0, .tree = static_cast<std::uint32_t>(r), .node = 0, .step = 0};
  };
  CHECK_THROWS_WITH(sample_ode(backend, denoiser, shifted_linear_schedule(20), latent_shape{{2}}, prompts, key, 2),
                    "stopped by SIGTERM during ODE sampling");
  CHECK(denoiser.calls == 5);
}
