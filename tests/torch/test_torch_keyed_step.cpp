// torch_backend::keyed_sde_step (rollout/keyed_sde_step.hpp) against the host backend's, and on a CUDA device against
// the CPU's. On the CPU it is keyed_sde_step_on_host over LibTorch tensors: float64 gives the host backend's next
// bit for bit, float32 within its rounding. On a CUDA device (bench/gpu_kernels.sh runs this test there) the step is
// the fused kernel when the build links the CUDA kernels, LibTorch's ops otherwise; either way next must equal the
// CPU's bit for bit and the log-probs agree within 1e-12 relative.
#include <branchgrpo/torch/backend.hpp>  // before Catch2 on purpose: compat.hpp keeps Catch2's CHECK either way
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "branchgrpo/rollout/host_backend.hpp"
#include "branchgrpo/rollout/keyed_sde_step.hpp"

using namespace branchgrpo;

namespace {

// 3 parents x 2 children of a {4, 5, 6} latent (120 elements; not a multiple of the kernels' 4-element blocks),
// with distinct keys per child and one per parent, x and v drawn from keys too.
struct step_case {
  latent_shape shape{{4, 5, 6}};
  std::vector<double> x, v;
  std::vector<noise_key> children, parents;
  std::vector<double> stds;

  step_case() {
    x.resize(3 * 120);
    v.resize(3 * 120);
    fill_keyed_normal({.seed = 11, .node = 900}, x);
    fill_keyed_normal({.seed = 11, .node = 901}, v);
    for (std::uint32_t p = 0; p < 3; ++p) {
      parents.push_back({.seed = 5, .iteration = 2, .tree = 9, .node = p, .step = 4, .stream = noise_stream::shared});
      for (std::uint32_t b = 0; b < 2; ++b) {
        children.push_back({.seed = 5, .iteration = 2, .tree = 9, .node = 3 + 2 * p + b, .step = 4});
        stds.push_back(0.25 + 0.125 * (2 * p + b));
      }
    }
  }
  [[nodiscard]] sde_transition transition(bool correlated) const {
    return {.x_coeff = 0.9375,
            .velocity_coeff = -0.0625,
            .branching = 2,
            .keys = children,
            .stds = stds,
            .parent_keys = correlated ? std::span<const noise_key>(parents) : std::span<const noise_key>(),
            .s = 4.0};
  }
};

void check_log_probs(const std::vector<double>& got, const std::vector<double>& want, double relative) {
  REQUIRE(got.size() == want.size());
  for (std::size_t j = 0; j < want.size(); ++j) CHECK(std::abs(got[j] - want[j]) <= relative * std::abs(want[j]));
}

}  // namespace

TEST_CASE("torch_backend::keyed_sde_step on the CPU: the host backend's step", "[torch]") {
  static_assert(KeyedSdeBackend<torch_backend>);
  const step_case c;
  host_backend host;
  for (const bool correlated : {false, true}) {
    const auto want = keyed_sde_step(host, host.from_host(c.x, 3, c.shape), host.from_host(c.v, 3, c.shape),
                                     c.transition(correlated), c.shape);
    torch_backend f64{.device = torch::kCPU, .dtype = torch::kFloat64};
    const auto exact = f64.keyed_sde_step(f64.from_host(c.x, 3, c.shape), f64.from_host(c.v, 3, c.shape),
                                          c.transition(correlated), c.shape);
    CHECK(exact.next.sizes() == torch::IntArrayRef({6, 4, 5, 6}));
    CHECK(f64.to_host(exact.next) == want.next.values);  // float64: bit for bit
    check_log_probs(exact.log_probs, want.log_probs, 1e-12);

    torch_backend f32{.device = torch::kCPU, .dtype = torch::kFloat32};
    const auto rounded = f32.keyed_sde_step(f32.from_host(c.x, 3, c.shape), f32.from_host(c.v, 3, c.shape),
                                            c.transition(correlated), c.shape);
    const std::vector<double> next = f32.to_host(rounded.next);
    for (std::size_t i = 0; i < next.size(); ++i) CHECK(next[i] == Approx(want.next.values[i]).margin(1e-5));
    check_log_probs(rounded.log_probs, want.log_probs, 1e-4);
  }
}

TEST_CASE("torch_backend::keyed_sde_step on a CUDA device equals the CPU's", "[torch][cuda]") {
  if (!torch::cuda::is_available()) {
    WARN("no CUDA device: the device half of this test runs on a GPU machine (bench/gpu_kernels.sh)");
    return;
  }
  const step_case c;
  for (const torch::Dtype dtype : {torch::kFloat32, torch::kFloat64})
    for (const bool correlated : {false, true}) {
      torch_backend cpu{.device = torch::kCPU, .dtype = dtype}, gpu{.device = torch::kCUDA, .dtype = dtype};
      const auto want = cpu.keyed_sde_step(cpu.from_host(c.x, 3, c.shape), cpu.from_host(c.v, 3, c.shape),
                                           c.transition(correlated), c.shape);
      const auto got = gpu.keyed_sde_step(gpu.from_host(c.x, 3, c.shape), gpu.from_host(c.v, 3, c.shape),
                                          c.transition(correlated), c.shape);
      CHECK(got.next.is_cuda());
      CHECK(torch::equal(got.next.cpu(), want.next));
      check_log_probs(got.log_probs, want.log_probs, 1e-12);
    }
}
