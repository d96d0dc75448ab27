#pragma once
// The rollout's SDE transition on the CUDA adapter's fused kernel (adapters/cuda: kernels.hpp sde_step), for torch
// latents on a CUDA device in float32 or float64: the keyed noise is drawn on the device, next and each row's
// log-prob written in one launch on torch's current stream, as the LibTorch adapter's torch/cuda_kernels.hpp does;
// bit for bit the host engine's next (keyed_sde_step_on_host), the log-probs within 1e-12 relative. Compiled when
// the package is built with a CUDA compiler (BRANCHGRPO_PYTHON_CUDA_KERNELS, python/CMakeLists.txt); the buffers
// are torch tensors made by branchgrpo._torch_ops, the kernel gets their raw device pointers.
// Example: x = [[1, 1]], v = [[0, 0]] (cuda, float64), {x_coeff 1, velocity_coeff 0, branching 2, keys {k0, k1},
//   stds {0.5, 0.5}} -> next = [[1 + 0.5 eps_0], [1 + 0.5 eps_1]] on the device, log-probs on the host.
#include <nanobind/nanobind.h>

#include <cstdint>
#include <span>
#include <vector>

#include "branchgrpo/cuda/kernels.hpp"
#include "branchgrpo/cuda/sde_keys.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/rollout/keyed_sde_step.hpp"
#include "numpy_arrays.hpp"

namespace branchgrpo::python {

namespace nb = nanobind;

/// The key bytes of `keys`, as a uint8 numpy array.
inline nb::object key_bytes(std::span<const noise_key> keys) {
  const std::span<const std::byte> bytes = std::as_bytes(keys);
  return numpy_copy(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()));
}

/// A tensor's device address.
template <class T>
T* device_pointer(const nb::handle& tensor) {
  return reinterpret_cast<T*>(nb::cast<std::uintptr_t>(tensor.attr("data_ptr")()));
}

/// keyed_sde_step on the fused kernel. @pre _torch_ops.fused_rows(x, v) (CUDA, one device, float32 or float64).
inline keyed_sde_result<nb::object> cuda_keyed_sde_step(const nb::object& ops, const nb::object& x, const nb::object& v,
                                                        const sde_transition& transition) {
  const auto parents = nb::cast<std::int64_t>(x.attr("shape")[0]);
  const cuda::sde_step_keys keys = cuda::sde_step_keys_of(transition, parents);
  const std::int64_t children = parents * transition.branching;
  const std::int64_t elements = parents > 0 ? nb::cast<std::int64_t>(x.attr("numel")()) / parents : 1;
  const bool correlated = !keys.shared.empty();
  // (device guard, x, v, next, own keys, shared keys or None, stds, log_prob, workspace, stream handle)
  const nb::tuple b = nb::cast<nb::tuple>(ops.attr("fused_sde_buffers")(
      x, v, children, key_bytes(keys.own), correlated ? key_bytes(keys.shared) : nb::none(),
      numpy_copy(transition.stds), cuda::reduction_workspace(children, elements)));
  if (children == 0) return {.next = b[3], .log_probs = {}};
  const cuda::noise_rows noise =
      keys.rows(device_pointer<const noise_key>(b[4]), correlated ? device_pointer<const noise_key>(b[5]) : nullptr);
  const auto stream = reinterpret_cast<cuda::stream_t>(nb::cast<std::uintptr_t>(b[9]));
  const auto launch = [&]<class T>(const T*) {
    cuda::sde_step<T>({.x = device_pointer<const T>(b[1]),
                       .v = device_pointer<const T>(b[2]),
                       .parents = parents,
                       .branching = transition.branching,
                       .elements = elements,
                       .x_coeff = transition.x_coeff,
                       .velocity_coeff = transition.velocity_coeff,
                       .stds = device_pointer<const double>(b[6]),
                       .noise = noise,
                       .next = device_pointer<T>(b[3]),
                       .squares = nullptr,
                       .log_prob = device_pointer<double>(b[7]),
                       .workspace = device_pointer<double>(b[8])},
                      stream);
  };
  const nb::object guard = b[0];
  guard.attr("__enter__")();
  try {
    if (nb::cast<bool>(ops.attr("is_float32")(x)))
      launch(static_cast<const float*>(nullptr));
    else
      launch(static_cast<const double*>(nullptr));
  } catch (...) {
    guard.attr("__exit__")(nb::none(), nb::none(), nb::none());
    throw;
  }
  guard.attr("__exit__")(nb::none(), nb::none(), nb::none());
  return {.next = b[3], .log_probs = from_numpy<double>(ops.attr("to_host")(b[7]))};
}

}  // namespace branchgrpo::python
