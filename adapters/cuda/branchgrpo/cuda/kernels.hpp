#pragma once
// branchgrpo::cuda, the CUDA adapter: float64-exact kernels for the SDE step of the rollout on raw device pointers,
// usable without LibTorch.
//
//   draw_noise_rows  keyed N(0, 1) rows (Philox4x32-10 + Box-Muller), plain or combined as correlated{s} combines a
//                    split's shared and own draws: bit for bit the host's fill_keyed_normal / correlated
//   sde_step         the fused SDE transition of a frontier: mean = a x + c v (parent j / K of child row j),
//                    next = mean + std * eps with eps keyed in the kernel, and each row's Gaussian log-prob
//   row_log_prob     per row: mean over elements of log N(next; mean, std^2)
// `next` is the host engine's bit for bit (same T arithmetic, no fused multiply-add); the log-probs accumulate in
// float64 through a fixed two-stage tree (block partial sums, then one block per row), deterministic from run to
// run and within 1e-12 relative of the host's sequential sum (the check asks 1e-9).
//
// Files: annotations.hpp (the __host__ __device__ shim), elementwise.hpp (the per-element arithmetic, compiled by
// g++ in the CPU tests and by nvcc in the kernels), reference.hpp (each kernel on the host, in the kernel's order),
// sde_keys.hpp (a transition's host checks and the keys the fused step draws from, for every caller), this header
// (the launch API: no CUDA header, streams as CUstream_st*, i.e. cudaStream_t), src/kernels.cu (the
// kernels; the only nvcc translation unit, built as branchgrpo_cuda_kernels when CMake finds a CUDA compiler) and
// check/cuda_kernel_check.cpp (device against host, and the bandwidth on a 16 x 16 x 128 x 128 latent).
// torch/cuda_kernels.hpp wraps these for CUDA tensors. How to run the check on a GPU: bench/gpu_kernels.sh and
// docs/performance.md "CUDA kernels".
//
// Every launch checks its arguments (one-line invalid_input) and the launch status; pointers must be device
// memory of the sizes given; outputs must not alias inputs. Launches are asynchronous on `stream`.
#include <cmath>
#include <cstdint>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/cuda/elementwise.hpp"

struct CUstream_st;  // the CUDA runtime's stream type: cudaStream_t is CUstream_st*

namespace branchgrpo::cuda {

using stream_t = CUstream_st*;  ///< cudaStream_t; nullptr is the default stream

/// Device doubles that row_log_prob and sde_step need as `workspace`: one partial sum per row and chunk.
/// Example: rows 16, elements 262144 -> 16 * 256 = 4096.
constexpr std::int64_t reduction_workspace(std::int64_t rows, std::int64_t elements) {
  return rows * ((elements + chunk_elements - 1) / chunk_elements);
}

/// Writes out[r * elements + i] = element i of row r's standardized noise (noise_rows) for r < rows.
/// Example: source {own = keys} of 2 keys, elements 6 -> out = fill_keyed_normal(keys[0], 6 values), then
///   keys[1]'s, bit for bit.
/// @pre source.own set (keyed), rows >= 0, 1 <= elements <= 2^34; out holds rows * elements doubles.
void draw_noise_rows(const noise_rows& source, std::int64_t rows, std::int64_t elements, double* out,
                     stream_t stream = nullptr);

/// One SDE transition of a frontier and its log-probs (reference.hpp: sde_step_reference). For child row
/// j < parents * branching, parent p = j / branching, element i:
///   mean = affine_element(x_coeff, x[p, i], velocity_coeff, v[p, i]);  next[j, i] = sde_element(mean, stds[j], eps)
///   squares[j] = sum_i squared_deviation(next, mean);  log_prob[j] = log_prob_from_squares(squares[j], stds[j], n)
/// with eps element i of row j's noise (noise_rows: keyed in the kernel, or given values).
template <class T>
struct sde_step_args {
  const T* x = nullptr;  ///< parent latents, [parents, elements]
  const T* v = nullptr;  ///< parent velocities, [parents, elements]
  std::int64_t parents = 0;
  std::int64_t branching = 1;  ///< children per parent (K)
  std::int64_t elements = 0;   ///< per row
  double x_coeff = 1.0;        ///< the stepper's affine_step
  double velocity_coeff = 0.0;
  const double* stds = nullptr;  ///< per child row: noise_std times the correlator's factor
  noise_rows noise{};            ///< each child row's standardized noise
  T* next = nullptr;             ///< out, [parents * branching, elements]
  double* squares = nullptr;     ///< out, per child row
  double* log_prob = nullptr;    ///< out, per child row
  double* workspace = nullptr;   ///< reduction_workspace(parents * branching, elements) doubles
};

/// Launches the fused SDE step (sde_step_args).
/// Example: parents 1, branching 2, elements 4, x_coeff 1, velocity_coeff 0, stds {0.5, 0.5}, keyed noise of two
///   child keys -> next rows x + 0.5 eps_0 and x + 0.5 eps_1 (each element in T), log_prob = host_backend's
///   row_log_prob of those rows within 1e-12 relative.
/// @pre parents >= 0, branching >= 1, 1 <= elements <= 2^34; every std > 0 and finite (as row_log_prob's; checked
///      on the host by the caller: they live in device memory); buffers of the sizes above.
/// @post next is the host engine's bit for bit; log_prob deterministic.
template <class T>
void sde_step(const sde_step_args<T>& args, stream_t stream = nullptr);

/// Per row r < rows: squares[r] = sum_i squared_deviation(next[r, i], mean[r, i]) and
/// log_prob[r] = log_prob_from_squares(squares[r], stds[r], elements), through the fixed two-stage tree.
/// Example: next {1, 3}, mean {1, 1}, stds {2}, rows 1, elements 2 -> squares {4},
///   log_prob {-0.25 - log 2 - 0.5 log(2 pi)}.
/// @pre rows >= 0, elements >= 1; stds > 0 (device memory); workspace holds reduction_workspace(rows, elements).
template <class T>
void row_log_prob(const T* next, const T* mean, const double* stds, std::int64_t rows, std::int64_t elements,
                  double* squares, double* log_prob, double* workspace, stream_t stream = nullptr);

namespace detail {

/// Throws unless rows and elements fit a launch: rows >= 0, 1 <= elements <= 2^34, fewer than 2^31 blocks.
inline void check_rows(std::int64_t rows, std::int64_t elements, const char* operation) {
  require(rows >= 0, operation, ": rows must be non-negative, got ", rows);
  require(elements >= 1 && elements <= (std::int64_t{1} << 34), operation,
          ": elements per row must be in [1, 2^34], got ", elements);
  require(reduction_workspace(rows, elements) < (std::int64_t{1} << 31), operation, ": ", rows, " rows of ", elements,
          " elements exceed 2^31 blocks of ", chunk_elements);
}

/// Throws unless `source` names exactly one source, and correlated noise has s and norm > 0.
inline void check_noise_rows(const noise_rows& source, const char* operation) {
  require((source.own != nullptr) != (source.values != nullptr), operation,
          ": noise needs exactly one of own keys and values");
  require(source.shared == nullptr || source.own != nullptr, operation, ": shared keys need own keys");
  if (source.shared != nullptr)
    require(std::isfinite(source.s) && source.s > 0.0 && std::isfinite(source.norm) && source.norm > 0.0, operation,
            ": correlated noise needs s and norm positive and finite, got s ", source.s, ", norm ", source.norm);
}

/// Throws unless `args` describe a launch: branching >= 1, rows and noise as above, the input pointers set.
template <class T>
void check_sde_step(const sde_step_args<T>& args) {
  require(args.parents >= 0 && args.branching >= 1, "sde_step: parents ", args.parents, " and branching ",
          args.branching, " must be >= 0 and >= 1");
  check_rows(args.parents * args.branching, args.elements, "sde_step");
  check_noise_rows(args.noise, "sde_step");
  require(args.parents == 0 || (args.x != nullptr && args.v != nullptr && args.stds != nullptr && args.next != nullptr),
          "sde_step: x, v, stds and next must be set");
}

}  // namespace detail

extern template void sde_step<float>(const sde_step_args<float>&, stream_t);
extern template void sde_step<double>(const sde_step_args<double>&, stream_t);
extern template void row_log_prob<float>(const float*, const float*, const double*, std::int64_t, std::int64_t, double*,
                                         double*, double*, stream_t);
extern template void row_log_prob<double>(const double*, const double*, const double*, std::int64_t, std::int64_t,
                                          double*, double*, double*, stream_t);

}  // namespace branchgrpo::cuda
