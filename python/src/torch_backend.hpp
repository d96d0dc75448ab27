#pragma once
// A Backend (rollout/backend.hpp) whose tensors are Python torch tensors: each operation calls its twin in
// branchgrpo/_torch_ops.py, which mirrors the LibTorch adapter's torch_backend. Latents stay on the device the caller
// chose; only the engine's keyed host draws (initial latents, noise) cross, as float64 numpy arrays, and per-row
// log-probs come back. No LibTorch: the package runs on whatever torch the interpreter imports.
//
// Example: python_torch_backend b(device "cpu", dtype torch.float32); b.affine(2, x, 1, v) == (2 x + v) in float32.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/rollout/backend.hpp"

namespace branchgrpo::python {

namespace nb = nanobind;

/// A numpy array owning a copy of `values`.
template <class T>
nb::object numpy_copy(std::span<const T> values) {
  auto* copy = new std::vector<T>(values.begin(), values.end());
  nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, T, nb::ndim<1>>(copy->data(), {copy->size()}, owner));
}

/// The values of a 1-D numpy array (float64 or int64), copied.
template <class T>
std::vector<T> from_numpy(const nb::handle& array) {
  const auto view = nb::cast<nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>>(array);
  return std::vector<T>(view.data(), view.data() + view.shape(0));
}

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
};

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
