#pragma once
// The LibTorch backend: a batch of latents is a plain torch::Tensor of shape [rows, latent dims...] on one
// device (CPU or CUDA) in one storage dtype (float32 by default; bfloat16, float16 or float64 also work).
//
// Numerics: affine computes in float32 at least (bf16/fp16 storage is upcast, the result rounded back to the
// storage dtype); row_log_prob computes in float64, reducing each row by its own call so that a row's
// log-prob does not depend on which other rows share the batch (batch invariance: the log-prob the policy
// recomputes for an edge in the update is bit-identical to the rollout's when the model is batch-invariant).
// The policy's autograd path (policy.hpp) calls the same two functions, so rollout and update share one code.
//
// Keyed noise: the rollout engine draws noise on the host (Philox, noise/keyed_normal.hpp) and hands it over
// with from_host, so the noise is the core's by construction on every device; keyed_sde_step (chain steps and
// independent splits) is where a device may draw it instead.
//
// CUDA kernels: built against a CUDA LibTorch with nvcc (BRANCHGRPO_TORCH_CUDA_KERNELS), CUDA float32 / float64
// rows run on the CUDA adapter's kernels (torch/cuda_kernels.hpp): keyed_sde_step on the fused SDE step (noise drawn
// on the device, bit for bit the host's), row_log_prob_tensor (and so row_log_prob) on the same per-row float64
// sums in a fixed order, differentiable; everything else stays LibTorch.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <optional>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/memory.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/rollout/host_backend.hpp"
#include "branchgrpo/rollout/keyed_sde_step.hpp"
#include "branchgrpo/torch/compat.hpp"
#if defined(BRANCHGRPO_TORCH_CUDA_KERNELS)
#include "branchgrpo/torch/cuda_kernels.hpp"
#endif

namespace branchgrpo {

/// What a run may allocate on `device`, for the pre-flight memory check: a CUDA device's free memory when the CUDA
/// adapter is built (cuda_free_memory), nullopt otherwise: on the CPU the host's budget covers everything, and a
/// CUDA LibTorch without the adapter's build cannot ask (the check then covers the host only, and says so).
inline std::optional<memory_budget> device_memory_budget(torch::Device device) {
#if defined(BRANCHGRPO_TORCH_CUDA_KERNELS)
  if (device.is_cuda()) return cuda_free_memory(device);
#endif
  (void)device;
  return std::nullopt;
}

namespace detail {
/// The latent shape of a [rows, dims...] tensor: its dims after the first.
inline latent_shape torch_latent_shape(const torch::Tensor& x) {
  const auto sizes = x.sizes();
  return latent_shape{std::vector<std::int64_t>(sizes.begin() + 1, sizes.end())};
}

/// float32 for half / bfloat16 storage, the storage dtype otherwise: the dtype arithmetic runs in.
inline torch::Dtype torch_compute_dtype(torch::Dtype storage) {
  return storage == torch::kHalf || storage == torch::kBFloat16 ? torch::kFloat32 : storage;
}
}  // namespace detail

/// The LibTorch backend (models Backend): tensors of shape [rows, latent...] on `device` in `dtype`.
/// Example: x = from_host({1, 2, 3, 4, 5, 6}, 3, {2}) (rows {1,2}, {3,4}, {5,6}; a [3, 2] float32 tensor) ->
///   to_host(gather_rows(x, {2, 0, 2})) == {5, 6, 1, 2, 5, 6};  to_host(slice_rows(x, 1, 3)) == {3, 4, 5, 6};
///   to_host(affine(2, x, -1, x)) == {1, 2, 3, 4, 5, 6};
///   row_log_prob(from_host({1, 3}, 1, {2}), from_host({1, 1}, 1, {2}), {2}) == {-0.25 - log 2 - 0.5 log(2 pi)}.
/// @pre shapes valid; operands of affine and row_log_prob have equal rows and shapes; gather indices in
///      [0, rows); 0 <= begin <= end <= rows; every std > 0 and finite; tensors on a device of `device`'s type.
/// @post results are fresh tensors (no aliasing) in `dtype` on `device` (row_log_prob_tensor: float64);
///       any violated precondition throws invalid_input with the message host_backend gives.
struct torch_backend {
  using tensor = torch::Tensor;

  torch::Device device = torch::kCPU;
  torch::Dtype dtype = torch::kFloat32;

  /// Tensor of `rows` rows from rows * shape.elements() row-major doubles (built in float64 on the CPU,
  /// then moved and cast).
  [[nodiscard]] tensor from_host(std::span<const double> values, std::int64_t rows, const latent_shape& shape) const {
    validate(shape);
    require(rows >= 0, "from_host row count must be non-negative, got ", rows);
    const std::int64_t expected = rows * shape.elements();
    require(static_cast<std::int64_t>(values.size()) == expected, "from_host got ", values.size(), " values for ", rows,
            " rows of ", shape.elements(), " elements");
    std::vector<std::int64_t> sizes{rows};
    sizes.insert(sizes.end(), shape.dims.begin(), shape.dims.end());
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
    if (values.empty()) return torch::empty(sizes, f64.device(device).dtype(dtype));
    // from_blob only views the caller's memory; copy = true makes the result own its storage on every path.
    return torch::from_blob(const_cast<double*>(values.data()), sizes, f64)
        .to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
  }

  [[nodiscard]] std::vector<double> to_host(const tensor& x) const {
    check(x, "to_host");
    const torch::Tensor host = x.detach().to(torch::kCPU, torch::kFloat64).contiguous();
    const double* data = host.data_ptr<double>();
    return std::vector<double>(data, data + host.numel());
  }

  [[nodiscard]] std::int64_t rows(const tensor& x) const {
    check(x, "rows");
    return x.size(0);
  }

  /// Rows x[index[0]], x[index[1]], ...; indices may repeat.
  [[nodiscard]] tensor gather_rows(const tensor& x, std::span<const std::int64_t> index) const {
    check(x, "gather_rows");
    const std::int64_t rows = x.size(0);
    for (std::size_t i = 0; i < index.size(); ++i)
      require(index[i] >= 0 && index[i] < rows, "gather_rows index[", i, "] = ", index[i], " is outside [0, ", rows,
              ")");
    const auto sizes = std::vector<std::int64_t>{static_cast<std::int64_t>(index.size())};
    const torch::Tensor positions = index.empty() ? torch::empty(sizes, torch::TensorOptions().dtype(torch::kInt64))
                                                  : torch::from_blob(const_cast<std::int64_t*>(index.data()), sizes,
                                                                     torch::TensorOptions().dtype(torch::kInt64));
    return x.index_select(0, positions.to(x.device(), torch::kInt64, false, /*copy=*/true)).to(dtype);
  }

  /// Rows [begin, end).
  [[nodiscard]] tensor slice_rows(const tensor& x, std::int64_t begin, std::int64_t end) const {
    check(x, "slice_rows");
    require(begin >= 0 && begin <= end && end <= x.size(0), "slice_rows [", begin, ", ", end,
            ") is not a range inside [0, ", x.size(0), ")");
    return x.slice(0, begin, end).to(dtype, /*non_blocking=*/false, /*copy=*/true);
  }

  /// The rows of parts[0], parts[1], ... one after another; all parts share one latent shape.
  [[nodiscard]] tensor concat_rows(std::span<const tensor> parts) const {
    require(!parts.empty(), "concat_rows needs at least one part");
    std::vector<torch::Tensor> all;
    all.reserve(parts.size());
    for (std::size_t p = 0; p < parts.size(); ++p) {
      check(parts[p], "concat_rows");
      if (parts[p].sizes().slice(1) != parts.front().sizes().slice(1))  // not require(): it would build the texts
        fail("concat_rows part ", p, " has rows of shape ", detail::shape_text(detail::torch_latent_shape(parts[p])),
             ", part 0 has ", detail::shape_text(detail::torch_latent_shape(parts.front())));
      all.push_back(parts[p].to(dtype));
    }
    return torch::cat(all, 0);
  }

  /// a * x + c * v, element-wise, in float32 at least; the result in `dtype`. Differentiable (the policy's
  /// update path uses it with autograd). Two separate products and a sum: no fused multiply-add, so every
  /// element is computed the same way whatever the batch.
  [[nodiscard]] tensor affine(double a, const tensor& x, double c, const tensor& v) const {
    check_pair(x, v, "affine");
    const torch::Dtype compute = detail::torch_compute_dtype(dtype);
    return (x.to(compute) * a + v.to(compute) * c).to(dtype);
  }

  /// Per row r: mean over elements of log N(next; mean, std[r]^2) (gaussian_log_prob_mean), as float64
  /// values on the host.
  [[nodiscard]] std::vector<double> row_log_prob(const tensor& next, const tensor& mean,
                                                 std::span<const double> std) const {
    const torch::Tensor log_probs = row_log_prob_tensor(next, mean, std).detach().to(torch::kCPU).contiguous();
    const double* data = log_probs.data_ptr<double>();
    return std::vector<double>(data, data + log_probs.numel());
  }

  /// row_log_prob as a differentiable float64 tensor [rows] on the tensors' device: per row r,
  ///   -sum_i (next_ri - mean_ri)^2 / (2 std_r^2 n) - log std_r - 0.5 log(2 pi),   n = elements per row,
  /// each row reduced by its own call (batch-invariant; see the file comment).
  [[nodiscard]] tensor row_log_prob_tensor(const tensor& next, const tensor& mean, std::span<const double> std) const {
    check_pair(next, mean, "row_log_prob");
    const std::int64_t rows = next.size(0);
    require(static_cast<std::int64_t>(std.size()) == rows, "row_log_prob got ", std.size(), " standard deviations for ",
            rows, " rows");
    for (std::size_t r = 0; r < std.size(); ++r)
      require(std::isfinite(std[r]) && std[r] > 0.0, "row_log_prob std[", r, "] = ", std[r],
              " must be positive and finite");
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(next.device());
    if (rows == 0) return torch::empty({0}, f64);
#if defined(BRANCHGRPO_TORCH_CUDA_KERNELS)
    if (detail::cuda_kernels_apply(next, mean)) return detail::cuda_row_log_prob(next, mean, std);
#endif
    const auto n = static_cast<double>(next[0].numel());
    const double half_log_two_pi = 0.5 * std::log(2.0 * std::numbers::pi);
    std::vector<torch::Tensor> out;
    out.reserve(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      const double s = std[static_cast<std::size_t>(r)];
      // Fresh tensors per row: the reduction sees the same length and alignment whatever the batch.
      const torch::Tensor squares = (next[r].to(torch::kFloat64) - mean[r].to(torch::kFloat64)).square().sum();
      out.push_back(-squares / (2.0 * s * s * n) - std::log(s) - half_log_two_pi);
    }
    return torch::stack(out);
  }

  /// The SDE transition with keyed noise (models KeyedSdeBackend; rollout/keyed_sde_step.hpp): on the CUDA
  /// adapter's fused kernel for CUDA float32 / float64 tensors when built with the kernels (noise drawn on the
  /// device), keyed_sde_step_on_host (host draw, from_host, affine, row_log_prob) otherwise. Same numbers either way:
  /// next bit for bit, the log-probs within 1e-12 relative. A transition scored with other stds than it is drawn
  /// with (log_prob_stds: cps) takes the host path, whose row_log_prob is the update's.
  [[nodiscard]] keyed_sde_result<tensor> keyed_sde_step(const tensor& x, const tensor& v,
                                                        const sde_transition& transition, const latent_shape& shape) {
#if defined(BRANCHGRPO_TORCH_CUDA_KERNELS)
    if (transition.log_prob_stds.empty() && x.scalar_type() == dtype && detail::cuda_kernels_apply(x, v)) {
      check_pair(x, v, "keyed_sde_step");
      return detail::cuda_keyed_sde_step(x, v, transition);
    }
#endif
    return keyed_sde_step_on_host(*this, x, v, transition, shape);
  }

  friend bool operator==(const torch_backend&, const torch_backend&) = default;

 private:
  // Shape errors as one-line invalid_input instead of c10::Error from deep inside LibTorch.
  void check(const tensor& x, const char* operation) const {
    require(x.defined(), operation, ": the tensor is undefined");
    require(x.dim() >= 2, operation, ": tensor has ", x.dim(), " dimensions, expected [rows, latent dims...]");
    require(x.is_floating_point(), operation, ": tensor dtype ", c10::toString(x.scalar_type()),
            " is not floating point");
    if (x.device().type() != device.type())  // not require(): the device texts would be built on every call
      fail(operation, ": tensor on ", x.device().str(), ", backend on ", device.str());
    for (std::int64_t d = 1; d < x.dim(); ++d)
      require(x.size(d) >= 1, operation, ": latent dimension ", d - 1, " is ", x.size(d), ", must be at least 1");
  }
  void check_pair(const tensor& x, const tensor& v, const char* operation) const {
    check(x, operation);
    check(v, operation);
    if (x.sizes() != v.sizes())  // not require(): it would build the shape texts on every call
      fail(operation, " operands differ: ", x.size(0), " rows of ", detail::shape_text(detail::torch_latent_shape(x)),
           " vs ", v.size(0), " rows of ", detail::shape_text(detail::torch_latent_shape(v)));
  }
};

}  // namespace branchgrpo
