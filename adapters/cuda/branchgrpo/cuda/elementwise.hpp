#pragma once
// The per-element arithmetic of the CUDA kernels (src/kernels.cu) as __host__ __device__ functions: the kernels
// call them on the device, the CPU tests (tests/cuda) and the host references (reference.hpp) call them on the host,
// so a CI machine without a GPU tests the code the GPU runs. Each reproduces one host computation bit for bit:
//   keyed_normal_quad   four elements of fill_keyed_normal (noise/keyed_normal.hpp), through the core's constexpr
//                       Philox layout and Box-Muller (noise/box_muller.hpp): one definition for host and device
//   correlated_element  correlated's (shared + s own) / sqrt(1 + s^2) (correlator/correlated.hpp, paper Eq. 2)
//   affine_element      a x + c v in T: host_backend's affine (double), torch_backend's float32 affine (float)
//   sde_element         the engine's sample: mean + T(std * eps) (noise scaled in double, stored as T, added in T)
//   squared_deviation   gaussian_log_prob_mean's summand (next - mean)^2 in double
//   log_prob_from_squares  gaussian_log_prob_mean's formula from a row's sum of squares
// Only the summation order of the log-prob differs from the host's (a fixed two-stage tree: tree_sum, reference.hpp).
// The bits agree when neither side fuses a * b + c: the kernels are built with -fmad=false (adapters/cuda/CMakeLists).
#include <cmath>
#include <cstdint>
#include <numbers>

#include "branchgrpo/cuda/annotations.hpp"
#include "branchgrpo/noise/box_muller.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"

namespace branchgrpo::cuda {

/// Threads per block of every kernel; each thread draws one Philox block (4 elements), so a block covers
/// chunk_elements consecutive elements of one row.
inline constexpr int block_threads = 256;
inline constexpr int chunk_elements = 4 * block_threads;

/// Four consecutive elements of a keyed N(0, 1) vector.
struct normal_quad {
  double value[4] = {0.0, 0.0, 0.0, 0.0};
};

/// Elements 4 block, ..., 4 block + 3 of the keyed N(0, 1) vector of `key`: fill_keyed_normal's values.
/// Example: key {seed 42, iteration 1, node 5, step 2}, block 1 -> the values fill_keyed_normal writes at elements
///   4..7 of that key, bit for bit.
/// @pre the key's fields fit (check_noise_key); block < 2^32.
BRANCHGRPO_HOST_DEVICE inline normal_quad keyed_normal_quad(const noise_key& key, std::uint32_t block) {
  const r123::Philox4x32 philox;
  const r123::Philox4x32::ctr_type bits =
      philox(branchgrpo::detail::philox_counter(key, block), branchgrpo::detail::philox_key(key));
  const normal_pair low = box_muller(bits[0], bits[1]), high = box_muller(bits[2], bits[3]);
  return {{low.first, low.second, high.first, high.second}};
}

/// correlated's element: (shared + s own) / norm with norm = sqrt(1 + s^2) (correlated_norm).
/// Example: shared -0.5, own 1, s 1, norm sqrt(2) -> 0.5 / sqrt(2) = 0.35355339059327373.
BRANCHGRPO_HOST_DEVICE constexpr double correlated_element(double shared, double own, double s, double norm) {
  return (shared + s * own) / norm;
}

/// correlated's norm sqrt(1 + s^2), computed once per launch on the host. Example: s 4 -> sqrt(17).
inline double correlated_norm(double s) { return std::sqrt(1.0 + s * s); }

/// Where the standardized noise of each row comes from; the pointers are device pointers in a launch and host
/// pointers in reference.hpp. Exactly one of `own` and `values` is set.
///   own only          row r: keyed N(0, 1) of own[r] (independent, scaled, chain edges, roots)
///   own and shared    row r: correlated_element(keyed(shared[r]), keyed(own[r]), s, norm) (correlated{s})
///   values            row r: values[r * elements + i] (noise drawn elsewhere)
struct noise_rows {
  const noise_key* own = nullptr;
  const noise_key* shared = nullptr;
  double s = 0.0;
  double norm = 1.0;  ///< correlated_norm(s)
  const double* values = nullptr;
};

/// Elements 4 block .. 4 block + 3 of row `row`'s standardized noise (keyed sources only: own set).
/// Example: {own = keys, shared = parents, s = 4, norm = sqrt(17)}, row 1, block 0 -> correlated{4}'s row of child
///   keys[1] with parent key parents[1], elements 0..3.
BRANCHGRPO_HOST_DEVICE inline normal_quad noise_quad(const noise_rows& source, std::int64_t row, std::uint32_t block) {
  normal_quad out = keyed_normal_quad(source.own[row], block);
  if (source.shared != nullptr) {
    const normal_quad shared = keyed_normal_quad(source.shared[row], block);
    for (int lane = 0; lane < 4; ++lane)
      out.value[lane] = correlated_element(shared.value[lane], out.value[lane], source.s, source.norm);
  }
  return out;
}

/// a x + c v in T's arithmetic, the coefficients rounded to T first (LibTorch's float32 tensor-times-double-scalar
/// does the same; for T = double this is host_backend's a * x + c * v).
/// Example: T = double, a 2, x 1, c -1, v 3 -> -1; T = float, a 0.1 -> float(0.1) * x.
template <class T>
BRANCHGRPO_HOST_DEVICE constexpr T affine_element(double a, T x, double c, T v) {
  return static_cast<T>(x * static_cast<T>(a) + v * static_cast<T>(c));
}

/// The engine's SDE sample at one element: the noise scaled on the host in double, stored as T, then
/// affine(1, mean, 1, noise): mean + T(eps * std) in T.
/// Example: T = double, mean 1, std 0.5, eps -2 -> 0; T = float, mean 1, std 0.1, eps 1 -> 1.0f + float(0.1).
template <class T>
BRANCHGRPO_HOST_DEVICE constexpr T sde_element(T mean, double std, double eps) {
  return static_cast<T>(mean + static_cast<T>(eps * std));
}

/// (next - mean)^2 in double: gaussian_log_prob_mean's summand.
/// Example: next 3.0f, mean 1.0f -> 4.
template <class T>
BRANCHGRPO_HOST_DEVICE constexpr double squared_deviation(T next, T mean) {
  const double d = static_cast<double>(next) - static_cast<double>(mean);
  return d * d;
}

/// gaussian_log_prob_mean from the row's sum of squared deviations over n elements:
///   -squares / (2 std^2 n) - ln std - 0.5 ln(2 pi).
/// Example: squares 4, std 2, n 2 -> -0.25 - ln 2 - 0.5 ln(2 pi) (host_backend's doc example).
/// @pre std > 0, n >= 1.
BRANCHGRPO_HOST_DEVICE inline double log_prob_from_squares(double squares, double std, std::int64_t n) {
  return -squares / (2.0 * std * std * static_cast<double>(n)) - std::log(std) - 0.5 * std::log(2.0 * std::numbers::pi);
}

}  // namespace branchgrpo::cuda
