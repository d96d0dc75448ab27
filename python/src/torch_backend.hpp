#pragma once
// A Backend (rollout/backend.hpp) whose tensors are Python torch tensors: each operation calls its twin in
// branchgrpo/_torch_ops.py, which mirrors the LibTorch adapter's torch_backend. Latents stay on the device the caller
// chose; only the engine's keyed host draws (initial latents, noise) cross, as float64 numpy arrays, and per-row
// log-probs come back. No LibTorch: the package runs on whatever torch the interpreter imports. Built with a CUDA
// compiler, the SDE transition of CUDA latents runs on the fused kernel instead (cuda_step.hpp), the noise drawn on
// the device.
//
// Example: python_torch_backend b(device "cpu", dtype torch.float32); b.affine(2, x, 1, v) == (2 x + v) in float32.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/rollout/keyed_sde_step.hpp"
#include "numpy_arrays.hpp"
#ifdef BRANCHGRPO_PYTHON_CUDA_KERNELS
#include "cuda_step.hpp"
#endif

namespace branchgrpo::python {

namespace nb = nanobind;

struct python_torch_backend {
  using tensor = nb::object;

  nb::object ops;     ///< the module branchgrpo._torch_ops
  nb::object device;  ///< torch.device of the latents
  nb::object dtype;   ///< torch.dtype of the latents

  [[nodiscard]] tensor from_host(std::span<const double> values, std::int64_t rows, const latent_shape& shape) const {
    validate(shape);
    require(static_cast<std::int64_t>(values.size()) == rows * shape.elements(), "from_host got ", values.size(),
            " values for ", rows, " rows of ", shape.elements(), " elements");
    return ops.attr("from_host")(numpy_copy(values), rows, shape.dims, device, dtype);
  }
  [[nodiscard]] std::vector<double> to_host(const tensor& x) const {
    return from_numpy<double>(ops.attr("to_host")(x));
  }
  [[nodiscard]] std::int64_t rows(const tensor& x) const { return nb::cast<std::int64_t>(x.attr("shape")[0]); }
  [[nodiscard]] tensor gather_rows(const tensor& x, std::span<const std::int64_t> index) const {
    return ops.attr("gather_rows")(x, numpy_copy(index), dtype);
  }
  [[nodiscard]] tensor slice_rows(const tensor& x, std::int64_t begin, std::int64_t end) const {
    require(begin >= 0 && begin <= end && end <= rows(x), "slice_rows [", begin, ", ", end,
            ") is not a range inside [0, ", rows(x), ")");
    return ops.attr("slice_rows")(x, begin, end, dtype);
  }
  [[nodiscard]] tensor concat_rows(std::span<const tensor> parts) const {
    require(!parts.empty(), "concat_rows needs at least one part");
    nb::list all;
    for (const tensor& part : parts) all.append(part);
    return ops.attr("concat_rows")(all, dtype);
  }
  [[nodiscard]] tensor affine(double a, const tensor& x, double c, const tensor& v) const {
    return ops.attr("affine")(a, x, c, v, dtype);
  }
  [[nodiscard]] std::vector<double> row_log_prob(const tensor& next, const tensor& mean,
                                                 std::span<const double> std) const {
    return from_numpy<double>(ops.attr("row_log_prob")(next, mean, numpy_copy(std)));
  }
#ifdef BRANCHGRPO_PYTHON_CUDA_KERNELS
  /// The SDE transition (KeyedSdeBackend): CUDA float32 / float64 latents on the fused kernel (cuda_step.hpp),
  /// others by the engine's host path. Same numbers either way.
  [[nodiscard]] keyed_sde_result<tensor> keyed_sde_step(const tensor& x, const tensor& v,
                                                        const sde_transition& transition, const latent_shape& shape) {
    if (nb::cast<bool>(ops.attr("fused_rows")(x, v))) return cuda_keyed_sde_step(ops, x, v, transition);
    return keyed_sde_step_on_host(*this, x, v, transition, shape);
  }
#endif
};

#ifdef BRANCHGRPO_PYTHON_CUDA_KERNELS
static_assert(KeyedSdeBackend<python_torch_backend>);
#endif
/// Whether the package was built with the CUDA kernels.
inline constexpr bool cuda_kernels =
#ifdef BRANCHGRPO_PYTHON_CUDA_KERNELS
    true;
#else
    false;
#endif

static_assert(Backend<python_torch_backend>);

/// The caller's velocity as the engine's Denoiser: velocity(latents, sigma, step, prompts, trees) once per frontier
/// batch, checked by _torch_ops.call_velocity (shape, dtype, device, finite; a ValueError names the iteration, the
/// step and the rows).
struct python_velocity {
  nb::object ops;
  nb::object velocity;
  std::uint32_t iteration = 0;

  nb::object operator()(const nb::object& x, const denoise_batch& batch) {
    return ops.attr("call_velocity")(velocity, x, batch.sigma, batch.step, numpy_copy(batch.prompts),
                                     numpy_copy(batch.trees), iteration);
  }
};

static_assert(Denoiser<python_velocity, python_torch_backend>);

}  // namespace branchgrpo::python
