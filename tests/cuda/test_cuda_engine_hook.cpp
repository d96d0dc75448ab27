// The rollout engine's device hook (rollout/keyed_sde_step.hpp) on the CPU. A backend whose keyed_sde_step is the
// CUDA kernel's host reference (sde_step_reference: the fused kernel's arithmetic and summation order) must give the
// host backend's rollout: latents bit for bit, log-probs within 1e-12 relative, the same edge stds; the engine hands
// it every chain step and every split with independent or correlated{s} siblings, and no split of another
// correlator (antithetic).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "branchgrpo/correlator/antithetic.hpp"
#include "branchgrpo/correlator/correlated.hpp"
#include "branchgrpo/correlator/independent.hpp"
#include "branchgrpo/cuda/reference.hpp"
#include "branchgrpo/cuda/sde_keys.hpp"
#include "branchgrpo/rollout.hpp"
#include "branchgrpo/rollout/keyed_sde_step.hpp"
#include "branchgrpo/topology.hpp"
#include "gaussian_denoiser.hpp"

using namespace branchgrpo;

namespace {

/// host_backend whose keyed_sde_step runs the fused kernel's host reference, counting its calls.
struct kernel_reference_backend : host_backend {
  int steps_taken = 0;

  keyed_sde_result<host_tensor> keyed_sde_step(const host_tensor& x, const host_tensor& v,
                                               const sde_transition& transition, const latent_shape& shape) {
    ++steps_taken;
    const std::int64_t children = x.rows * transition.branching, elements = shape.elements();
    host_tensor next{
        .rows = children, .shape = shape, .values = std::vector<double>(static_cast<std::size_t>(children * elements))};
    std::vector<double> log_probs(static_cast<std::size_t>(children));
    // The keys as every caller of the kernel takes them (cuda/sde_keys.hpp).
    const cuda::sde_step_keys keys = cuda::sde_step_keys_of(transition, x.rows);
    const cuda::noise_rows noise = keys.rows(keys.own.data(), keys.shared.data());
    cuda::sde_step_reference<double>({.x = x.values.data(),
                                      .v = v.values.data(),
                                      .parents = x.rows,
                                      .branching = transition.branching,
                                      .elements = elements,
                                      .x_coeff = transition.x_coeff,
                                      .velocity_coeff = transition.velocity_coeff,
                                      .stds = transition.stds.data(),
                                      .noise = noise,
                                      .next = next.values.data(),
                                      .squares = nullptr,
                                      .log_prob = log_probs.data(),
                                      .workspace = nullptr});
    return {.next = std::move(next), .log_probs = std::move(log_probs)};
  }
};

static_assert(KeyedSdeBackend<kernel_reference_backend>);
static_assert(!KeyedSdeBackend<host_backend>, "the plain host backend takes keyed_sde_step_on_host");

template <class Correlator>
void check_same_rollout(const Correlator& correlator, int expected_hook_calls) {
  const sigma_schedule schedule = shifted_linear_schedule(20);
  const latent_shape shape{{2, 3}};
  const std::vector<tree_info> trees = {{.key = 7, .prompt = 0}, {.key = 11, .prompt = 1}};
  const rollout_options options{.max_batch = 64, .seed = 5, .iteration = 3};
  host_backend host;
  kernel_reference_backend kernel;
  testing::gaussian_denoiser first, second;
  const auto expected = rollout(host, first, dance_sde{}, correlator, schedule,
                                rollout_tree(split_schedule::dense()(20), trees), shape, options);
  const auto actual = rollout(kernel, second, dance_sde{}, correlator, schedule,
                              rollout_tree(split_schedule::dense()(20), trees), shape, options);
  CHECK(kernel.steps_taken == expected_hook_calls);
  REQUIRE(actual.latents.size() == expected.latents.size());
  for (std::size_t s = 0; s < expected.latents.size(); ++s) CHECK(actual.latents[s] == expected.latents[s]);
  CHECK(actual.edge_std == expected.edge_std);
  const std::span<const double> want = expected.tree.log_probs(), got = actual.tree.log_probs();
  REQUIRE(got.size() == want.size());
  for (std::size_t n = 0; n < want.size(); ++n) CHECK(std::abs(got[n] - want[n]) <= 1e-12 * std::abs(want[n]));
}

}  // namespace

TEST_CASE("engine hook: the fused kernel's reference gives the host rollout (independent siblings)", "[cuda]") {
  // split_schedule::dense over 20 SDE steps: every step, splits included, goes through keyed_sde_step.
  check_same_rollout(independent{}, 20);
}

TEST_CASE("engine hook: correlated{s} splits take the hook too (shared keys per child row)", "[cuda]") {
  check_same_rollout(correlated{}, 20);
  check_same_rollout(correlated{.s = 1.0}, 20);
}

TEST_CASE("engine hook: another correlator's splits stay with it, chain steps take the hook", "[cuda]") {
  // The 4 split steps (0, 3, 6, 9) draw through antithetic on the host; the 16 chain steps take the hook.
  check_same_rollout(antithetic{}, 16);
}
