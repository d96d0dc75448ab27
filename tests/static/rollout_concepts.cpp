// Static tier: host_backend models Backend, the analytic denoiser models Denoiser, and rollout accepts
// exactly Backend / Denoiser / Stepper / NoiseCorrelator arguments.
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "branchgrpo/correlator/independent.hpp"
#include "branchgrpo/rollout.hpp"
#include "gaussian_denoiser.hpp"

namespace {

using namespace branchgrpo;

// Every operation but affine.
struct no_affine_backend {
  using tensor = host_tensor;
  tensor from_host(std::span<const double>, std::int64_t, const latent_shape&) { return {}; }
  std::vector<double> to_host(const tensor&) { return {}; }
  std::int64_t rows(const tensor&) { return 0; }
  tensor gather_rows(const tensor&, std::span<const std::int64_t>) { return {}; }
  tensor slice_rows(const tensor&, std::int64_t, std::int64_t) { return {}; }
  tensor concat_rows(std::span<const tensor>) { return {}; }
  std::vector<double> row_log_prob(const tensor&, const tensor&, std::span<const double>) { return {}; }
};

// row_log_prob returns one double instead of one per row.
struct scalar_log_prob_backend : no_affine_backend {
  tensor affine(double, const tensor&, double, const tensor&) { return {}; }
  double row_log_prob(const tensor&, const tensor&, std::span<const double>) { return 0.0; }
};

// The complete set: the control that the two above fail for the reason they are named after.
struct complete_backend : no_affine_backend {
  tensor affine(double, const tensor&, double, const tensor&) { return {}; }
};

struct no_batch_denoiser {  // forgets the batch description
  host_tensor operator()(const host_tensor& x) { return x; }
};
struct host_vector_denoiser {  // returns host doubles instead of a tensor
  std::vector<double> operator()(const host_tensor& x, const denoise_batch&) { return x.values; }
};

template <class B, class D, class S, class C>
concept can_rollout = requires(B& backend, D& denoiser, const S& stepper, const C& correlator,
                               const sigma_schedule& schedule, rollout_tree tree, const latent_shape& shape,
                               const rollout_options& options) {
  rollout(backend, denoiser, stepper, correlator, schedule, std::move(tree), shape, options);
};

using testing::gaussian_denoiser;

static_assert(Backend<host_backend>);
static_assert(Backend<complete_backend>);
static_assert(!Backend<no_affine_backend>);
static_assert(!Backend<scalar_log_prob_backend>);
static_assert(!Backend<int>);
static_assert(std::regular<host_backend> && std::regular<host_tensor> && std::regular<rollout_options>);

static_assert(Denoiser<gaussian_denoiser, host_backend>);
static_assert(!Denoiser<no_batch_denoiser, host_backend>);
static_assert(!Denoiser<host_vector_denoiser, host_backend>);
static_assert(!Denoiser<gaussian_denoiser, int>);

static_assert(can_rollout<host_backend, gaussian_denoiser, dance_sde, independent>);
static_assert(can_rollout<host_backend, gaussian_denoiser, euler_ode, independent>);
static_assert(!can_rollout<int, gaussian_denoiser, dance_sde, independent>);
static_assert(!can_rollout<no_affine_backend, gaussian_denoiser, dance_sde, independent>);
static_assert(!can_rollout<host_backend, no_batch_denoiser, dance_sde, independent>);
static_assert(!can_rollout<host_backend, gaussian_denoiser, int, independent>);
static_assert(!can_rollout<host_backend, gaussian_denoiser, dance_sde, int>);
static_assert(!can_rollout<host_backend, gaussian_denoiser, dance_sde, double>);

static_assert(std::same_as<decltype(std::declval<rollout_result<host_backend>&>().latents), std::vector<host_tensor>>);
static_assert(std::same_as<decltype(leaf_latents(std::declval<host_backend&>(),
                                                 std::declval<const rollout_result<host_backend>&>())),
                           host_tensor>);

}  // namespace
