#pragma once
// LibTorch's CUDA tensors through the CUDA adapter's kernels (adapters/cuda, branchgrpo/cuda/kernels.hpp). Compiled
// only against a CUDA build of LibTorch: adapters/cuda/CMakeLists.txt then links the kernels into branchgrpo::torch
// and defines BRANCHGRPO_TORCH_CUDA_KERNELS, and backend.hpp includes this header. Without it (a CPU LibTorch, or
// no nvcc) the backend keeps its LibTorch path.
//
// Design. The rollout engine (core, rollout/engine.hpp) draws every noise row on the host (fill_keyed_normal or
// the correlator), hands it over with from_host, and calls affine and row_log_prob: the backend operations it
// already calls are the hook, so the engine is unchanged.
//   cuda_row_log_prob  torch_backend's row_log_prob_tensor (and so row_log_prob) for CUDA float32 / float64 rows:
//                      each row's float64 sum of (next - mean)^2 in the kernels' fixed order, then the host formula,
//                      in two launches instead of one LibTorch reduction per row. It is an autograd function
//                      (backward: d/dnext = -(next - mean) / (std^2 n), d/dmean = -d/dnext), so the policy's update
//                      recomputes an edge's log-prob with the rollout's code: the log-probs stay bit-identical
//                      between the two (torch/policy.hpp), batch-invariant (a row's sum depends on that row only).
//   cuda_keyed_sde_step  torch_backend's keyed_sde_step (rollout/keyed_sde_step.hpp: every chain step of the rollout,
//                      and splits with independent or correlated{s} siblings) for CUDA float32 / float64 rows: the
//                      fused sde_step kernel draws the keyed noise on the device and writes next and each row's
//                      log-prob, so no noise is drawn on the host or copied over.
//   cuda_keyed_noise   keyed N(0, 1) rows drawn on the device, plain or combined as correlated{s}, bit for bit the
//                      host's.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/memory.hpp"
#include "branchgrpo/correlator/sibling_rows.hpp"
#include "branchgrpo/cuda/kernels.hpp"
#include "branchgrpo/cuda/sde_keys.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/rollout/keyed_sde_step.hpp"
#include "branchgrpo/torch/compat.hpp"

namespace branchgrpo {

/// A CUDA device's free memory (cudaMemGetInfo) as the budget of a run's pre-flight memory check
/// (app/run_memory.hpp): taken before the run allocates anything, so it is what the run may use.
/// Example: an idle 80 GB H100 -> {about 84.5e9, "cudaMemGetInfo on cuda:0"}.
inline memory_budget cuda_free_memory(torch::Device device) {
  require(device.is_cuda(), "cuda_free_memory of ", device.str(), ": not a CUDA device");
  const c10::cuda::CUDAGuard guard(device);
  std::size_t free = 0, total = 0;
  const cudaError_t status = cudaMemGetInfo(&free, &total);
  require(status == cudaSuccess, "cudaMemGetInfo on ", device.str(), ": ", cudaGetErrorString(status));
  return {.bytes = static_cast<double>(free), .source = "cudaMemGetInfo on " + device.str()};
}

namespace detail {

/// Whether the kernels take these rows: both on one CUDA device, both float32 or both float64.
inline bool cuda_kernels_apply(const torch::Tensor& next, const torch::Tensor& mean) {
  const auto type = next.scalar_type();
  return next.is_cuda() && mean.device() == next.device() && mean.scalar_type() == type &&
         (type == torch::kFloat32 || type == torch::kFloat64);
}

/// A host span as a float64 / byte tensor on `device` (copied).
inline torch::Tensor cuda_copy_of(std::span<const double> values, torch::Device device) {
  return torch::from_blob(const_cast<double*>(values.data()), {static_cast<std::int64_t>(values.size())},
                          torch::TensorOptions().dtype(torch::kFloat64))
      .to(device, torch::kFloat64, /*non_blocking=*/false, /*copy=*/true);
}
inline torch::Tensor cuda_copy_of(std::span<const noise_key> keys, torch::Device device) {
  return torch::from_blob(const_cast<noise_key*>(keys.data()),
                          {static_cast<std::int64_t>(keys.size() * sizeof(noise_key))},
                          torch::TensorOptions().dtype(torch::kUInt8))
      .to(device, torch::kUInt8, /*non_blocking=*/false, /*copy=*/true);
}

/// The log-prob kernels as an autograd function of next and mean (stds: float64 on the device).
struct cuda_row_log_prob_function : torch::autograd::Function<cuda_row_log_prob_function> {
  static torch::Tensor forward(torch::autograd::AutogradContext* context, const torch::Tensor& next,
                               const torch::Tensor& mean, const torch::Tensor& stds) {
    context->save_for_backward({next, mean, stds});
    const torch::Tensor rows_next = next.contiguous(), rows_mean = mean.contiguous();
    const std::int64_t rows = next.size(0), elements = next.numel() / rows;
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(next.device());
    const torch::Tensor workspace = torch::empty({cuda::reduction_workspace(rows, elements)}, f64);
    torch::Tensor log_prob = torch::empty({rows}, f64);
    const c10::cuda::CUDAGuard guard(next.device());
    const cuda::stream_t stream = at::cuda::getCurrentCUDAStream(next.device().index()).stream();
    if (next.scalar_type() == torch::kFloat32)
      cuda::row_log_prob<float>(rows_next.data_ptr<float>(), rows_mean.data_ptr<float>(), stds.data_ptr<double>(), rows,
                                elements, nullptr, log_prob.data_ptr<double>(), workspace.data_ptr<double>(), stream);
    else
      cuda::row_log_prob<double>(rows_next.data_ptr<double>(), rows_mean.data_ptr<double>(), stds.data_ptr<double>(),
                                 rows, elements, nullptr, log_prob.data_ptr<double>(), workspace.data_ptr<double>(),
                                 stream);
    return log_prob;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list grad) {
    const torch::autograd::variable_list saved = context->get_saved_variables();
    const torch::Tensor &next = saved[0], &mean = saved[1], &stds = saved[2];
    const std::int64_t rows = next.size(0);
    std::vector<std::int64_t> per_row(static_cast<std::size_t>(next.dim()), 1);
    per_row[0] = rows;
    const auto n = static_cast<double>(next.numel() / rows);
    // d logp_r / d next_ri = -(next_ri - mean_ri) / (std_r^2 n), in float64 as the forward.
    const torch::Tensor scale = (grad[0] / (stds * stds * n)).view(per_row);
    const torch::Tensor grad_next = -scale * (next.to(torch::kFloat64) - mean.to(torch::kFloat64));
    return {grad_next.to(next.scalar_type()), (-grad_next).to(mean.scalar_type()), torch::Tensor()};
  }
};

/// torch_backend::row_log_prob_tensor on the kernels. Example: next {{1, 3}}, mean {{1, 1}} (CUDA float32), std
///   {2} -> {-0.25 - log 2 - 0.5 log(2 pi)} (float64, on the device, differentiable).
/// @pre cuda_kernels_apply(next, mean); next and mean of equal shape with >= 1 row; stds checked by the caller.
inline torch::Tensor cuda_row_log_prob(const torch::Tensor& next, const torch::Tensor& mean,
                                       std::span<const double> std) {
  return cuda_row_log_prob_function::apply(next, mean, cuda_copy_of(std, next.device()));
}

/// torch_backend::keyed_sde_step on the fused kernel: mean, keyed noise (drawn on the device; with parent_keys
/// combined as correlated{s}), next and the per-row log-probs in one pass over the parents' rows; next is
/// keyed_sde_step_on_host's bit for bit, the log-probs its within 1e-12 relative.
/// Example: x = {{1, 1}}, v = {{0, 0}} (CUDA float64), {x_coeff 1, velocity_coeff 0, branching 2, keys {k0, k1},
///   stds {0.5, 0.5}} -> next = {{1 + 0.5 eps_0}, {1 + 0.5 eps_1}} on the device, log_probs on the host.
/// @pre cuda_kernels_apply(x, v); x and v of equal shape (checked by the caller).
/// @post rows(next) == rows(x) * branching, in x's dtype on x's device; invalid_input for wrong counts, a std or s
///       that is not positive and finite, or an invalid key.
inline keyed_sde_result<torch::Tensor> cuda_keyed_sde_step(const torch::Tensor& x, const torch::Tensor& v,
                                                           const sde_transition& transition) {
  const std::int64_t parents = x.size(0), children = parents * transition.branching;
  const cuda::sde_step_keys keys = cuda::sde_step_keys_of(transition, parents);
  const bool correlated_siblings = !keys.shared.empty();
  std::vector<std::int64_t> sizes = x.sizes().vec();
  sizes[0] = children;
  torch::Tensor next = torch::empty(sizes, x.options());
  if (children == 0) return {.next = next, .log_probs = {}};
  const std::int64_t elements = x.numel() / parents;
  const torch::Tensor rows_x = x.contiguous(), rows_v = v.contiguous();
  const torch::Tensor own_keys = cuda_copy_of(std::span<const noise_key>(keys.own), x.device());
  const torch::Tensor shared_keys =
      correlated_siblings ? cuda_copy_of(std::span<const noise_key>(keys.shared), x.device()) : torch::Tensor();
  const torch::Tensor stds = cuda_copy_of(transition.stds, x.device());
  const cuda::noise_rows noise = keys.rows(
      reinterpret_cast<const noise_key*>(own_keys.data_ptr<std::uint8_t>()),
      correlated_siblings ? reinterpret_cast<const noise_key*>(shared_keys.data_ptr<std::uint8_t>()) : nullptr);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(x.device());
  const torch::Tensor log_prob = torch::empty({children}, f64);
  const torch::Tensor workspace = torch::empty({cuda::reduction_workspace(children, elements)}, f64);
  const c10::cuda::CUDAGuard guard(x.device());
  const cuda::stream_t stream = at::cuda::getCurrentCUDAStream(x.device().index()).stream();
  const auto launch = [&]<class T>(const T*) {
    cuda::sde_step<T>({.x = rows_x.data_ptr<T>(),
                       .v = rows_v.data_ptr<T>(),
                       .parents = parents,
                       .branching = transition.branching,
                       .elements = elements,
                       .x_coeff = transition.x_coeff,
                       .velocity_coeff = transition.velocity_coeff,
                       .stds = stds.data_ptr<double>(),
                       .noise = noise,
                       .next = next.data_ptr<T>(),
                       .squares = nullptr,
                       .log_prob = log_prob.data_ptr<double>(),
                       .workspace = workspace.data_ptr<double>()},
                      stream);
  };
  if (x.scalar_type() == torch::kFloat32)
    launch(static_cast<const float*>(nullptr));
  else
    launch(static_cast<const double*>(nullptr));
  const torch::Tensor host = log_prob.to(torch::kCPU);
  const double* data = host.data_ptr<double>();
  return {.next = next, .log_probs = std::vector<double>(data, data + children)};
}

}  // namespace detail

/// Keyed N(0, 1) rows on a CUDA device: row r is element 0.. of fill_keyed_normal(own[r]), or with `shared`
/// (one key per row, stream shared) correlated{s}'s row: (keyed(shared[r]) + s keyed(own[r])) / sqrt(1 + s^2).
/// Drawn in float64, returned as [own.size(), shape...] in `dtype`.
/// Example: own = {k0, k1}, shape {2}, float64 -> [[fill_keyed_normal(k0) 0..1], [fill_keyed_normal(k1) 0..1]],
///   bit for bit.
/// @pre device is CUDA; shape valid; shared empty or of own's size, then s > 0; every key valid (checked here).
inline torch::Tensor cuda_keyed_noise(std::span<const noise_key> own, std::span<const noise_key> shared, double s,
                                      const latent_shape& shape, torch::Device device,
                                      torch::Dtype dtype = torch::kFloat64) {
  validate(shape);
  require(device.is_cuda(), "cuda_keyed_noise needs a CUDA device, got ", device.str());
  require(shared.empty() || shared.size() == own.size(), "cuda_keyed_noise got ", shared.size(), " shared keys for ",
          own.size(), " rows");
  for (const noise_key& key : own) detail::check_noise_key(key);
  for (const noise_key& key : shared) detail::check_noise_key(key);
  const auto rows = static_cast<std::int64_t>(own.size());
  std::vector<std::int64_t> sizes{rows};
  sizes.insert(sizes.end(), shape.dims.begin(), shape.dims.end());
  torch::Tensor out = torch::empty(sizes, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  if (rows == 0) return out.to(dtype);
  const torch::Tensor own_keys = detail::cuda_copy_of(own, device);
  const torch::Tensor shared_keys = shared.empty() ? torch::Tensor() : detail::cuda_copy_of(shared, device);
  const cuda::noise_rows source{
      .own = reinterpret_cast<const noise_key*>(own_keys.data_ptr<std::uint8_t>()),
      .shared = shared.empty() ? nullptr : reinterpret_cast<const noise_key*>(shared_keys.data_ptr<std::uint8_t>()),
      .s = s,
      .norm = shared.empty() ? 1.0 : cuda::correlated_norm(s)};
  const c10::cuda::CUDAGuard guard(device);
  cuda::draw_noise_rows(source, rows, shape.elements(), out.data_ptr<double>(),
                        at::cuda::getCurrentCUDAStream(device.index()).stream());
  return out.to(dtype);
}

}  // namespace branchgrpo
