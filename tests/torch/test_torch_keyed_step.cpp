// torch_backend::keyed_sde_step (rollout/keyed_sde_step.hpp) against the host backend's, and on a CUDA device against
// the CPU's. On the CPU it is keyed_sde_step_on_host over LibTorch tensors: float64 gives the host backend's next
// bit for bit, float32 within its rounding. On a CUDA device (bench/gpu_kernels.sh runs this test there) the step is
// the fused kernel when the build links the CUDA kernels, LibTorch's ops otherwise; either way next must equal the
// CPU's bit for bit and the log-probs agree within 1e-12 relative. Also: the backend's other operations make their
// tensors on its device (checked on the meta device, which refuses a host tensor as CUDA does), and on a CUDA device
// row_log_prob_tensor (the kernels' autograd function when linked) gives the CPU's values and gradients.
#include <branchgrpo/torch/backend.hpp>  // before Catch2 on purpose: compat.hpp keeps Catch2's CHECK either way
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
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

TEST_CASE("torch_backend makes its tensors on its device (meta: devices checked as on CUDA)", "[torch]") {
  // A meta tensor holds no data; an operation mixing it with a CPU tensor that is not 0-dim throws "Expected all
  // tensors to be on the same device", as a CUDA tensor does: a tensor left on the host fails here on the CPU.
  // (gather_rows is not here: LibTorch 1.13 has no meta index_select; to_host and keyed_sde_step read values.)
  const step_case c;
  const torch_backend meta{.device = torch::kMeta, .dtype = torch::kFloat32};
  const torch::Tensor x = meta.from_host(c.x, 3, c.shape), v = meta.from_host(c.v, 3, c.shape);
  CHECK(x.device().type() == torch::kMeta);
  const torch::Tensor mean = meta.affine(0.9375, x, -0.0625, v);
  CHECK(mean.device().type() == torch::kMeta);
  const std::vector<torch::Tensor> parts{meta.slice_rows(x, 1, 3), mean};
  const torch::Tensor joined = meta.concat_rows(parts);
  CHECK(joined.device().type() == torch::kMeta);
  CHECK(joined.sizes() == torch::IntArrayRef({5, 4, 5, 6}));
  const torch::Tensor log_probs = meta.row_log_prob_tensor(x, mean, std::span<const double>(c.stds).first(3));
  CHECK(log_probs.device().type() == torch::kMeta);
  CHECK(log_probs.scalar_type() == torch::kFloat64);
  CHECK(log_probs.sizes() == torch::IntArrayRef({3}));
}

TEST_CASE("torch_backend::row_log_prob_tensor on a CUDA device: the CPU's values and gradients", "[torch][cuda]") {
  if (!torch::cuda::is_available()) {
    WARN("no CUDA device: this test runs on a GPU machine (bench/gpu_kernels.sh)");
    return;
  }
  const step_case c;
  const std::span<const double> stds = std::span<const double>(c.stds).first(3);
  // sum_r w_r logp_r, differentiated with respect to the means (as the policy's update does).
  const auto run = [&](const torch_backend& backend) {
    const torch::Tensor next = backend.from_host(c.x, 3, c.shape);
    torch::Tensor mean = backend.from_host(c.v, 3, c.shape);
    mean.set_requires_grad(true);
    const torch::Tensor log_probs = backend.row_log_prob_tensor(next, mean, stds);
    const torch::Tensor w = torch::tensor({1.0, -2.0, 0.5}, torch::kFloat64).to(log_probs.device());
    (w * log_probs).sum().backward();
    return std::pair{log_probs.detach().cpu(), mean.grad().cpu()};
  };
  for (const torch::Dtype dtype : {torch::kFloat32, torch::kFloat64}) {
    const auto [want, want_grad] = run({.device = torch::kCPU, .dtype = dtype});
    const auto [got, got_grad] = run({.device = torch::kCUDA, .dtype = dtype});
    const double relative = dtype == torch::kFloat64 ? 1e-12 : 1e-6;
    CHECK((got - want).abs().max().item<double>() <= 1e-12 * want.abs().max().item<double>());
    CHECK(got_grad.scalar_type() == dtype);
    CHECK((got_grad.to(torch::kFloat64) - want_grad.to(torch::kFloat64)).abs().max().item<double>() <=
          relative * want_grad.to(torch::kFloat64).abs().max().item<double>());
  }
}
