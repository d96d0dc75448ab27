// Static tier: the toy model is a Denoiser and Policy on host_backend, its reward a Reward; wrong types are not.
#include <cstdint>
#include <span>
#include <vector>

#include "branchgrpo/rollout/host_backend.hpp"
#include "branchgrpo/toy.hpp"
#include "branchgrpo/training/concepts.hpp"

namespace {

using namespace branchgrpo;

static_assert(Denoiser<fourier_policy<host_backend>, host_backend>);
static_assert(Policy<fourier_policy<host_backend>, host_backend>);
static_assert(Reward<mode_reward<host_backend>, host_backend>);
static_assert(std::regular<adam>);
static_assert(std::regular<mode_reward<>>);
static_assert(std::regular<ring_mixture>);

// Defaults documented in docs/toy.md.
static_assert(adam{}.lr == 1e-3 && adam{}.beta1 == 0.9 && adam{}.beta2 == 0.999 && adam{}.eps == 1e-8);
static_assert(fourier_options{}.features == 256);
static_assert(fourier_options{}.optimizer.lr == 0.1);
static_assert(ring_mixture{}.modes == 8 && ring_mixture{}.radius == 2.0 && ring_mixture{}.std == 0.15);
static_assert(mode_reward<>{}.width == 0.5);
static_assert(toy_dimension == 2);

// A denoiser without the policy's training members.
struct velocity_only {
  host_tensor operator()(const host_tensor& x, const denoise_batch&) { return x; }
};

struct accumulate_returns_void {
  host_tensor operator()(const host_tensor& x, const denoise_batch&) { return x; }
  void accumulate(const edge_batch<host_tensor>&, const loss_gradient_fn&) {}
  void apply_update() {}
};

struct no_apply_update {
  host_tensor operator()(const host_tensor& x, const denoise_batch&) { return x; }
  std::vector<double> accumulate(const edge_batch<host_tensor>&, const loss_gradient_fn&) { return {}; }
};

struct float_reward {
  std::vector<float> operator()(const host_tensor&, std::span<const std::int64_t>) { return {}; }
};

static_assert(Denoiser<velocity_only, host_backend>);
static_assert(!Policy<velocity_only, host_backend>);
static_assert(!Policy<accumulate_returns_void, host_backend>);
static_assert(!Policy<no_apply_update, host_backend>);
static_assert(!Policy<int, host_backend>);
static_assert(!Policy<mode_reward<>, host_backend>);
static_assert(!Reward<float_reward, host_backend>);
static_assert(!Reward<ring_mixture, host_backend>);
static_assert(!Reward<fourier_policy<host_backend>, host_backend>);
static_assert(!Reward<int, host_backend>);

}  // namespace
