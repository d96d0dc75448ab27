#pragma once
// Each kernel of kernels.hpp on the host: the same per-element functions (elementwise.hpp) in the same summation
// order (tree_sum), on host pointers. cuda_kernel_check compares the device against these bit for bit; the CPU
// tests (tests/cuda) compare these against the core (fill_keyed_normal, correlated, host_backend), so together
// they tie the device to the host.
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/cuda/elementwise.hpp"
#include "branchgrpo/cuda/kernels.hpp"

namespace branchgrpo::cuda {

/// The kernels' sum of one block's per-thread values: for stride = 128, 64, ..., 1: v[t] += v[t + stride].
/// Example: v[t] = 1 for all t -> 256; v[t] = t -> 32640.
inline double tree_sum(std::array<double, block_threads> v) {
  for (int stride = block_threads / 2; stride > 0; stride /= 2)
    for (int t = 0; t < stride; ++t) v[static_cast<std::size_t>(t)] += v[static_cast<std::size_t>(t + stride)];
  return v[0];
}

/// The sum over i < elements of summand(i) in the kernels' order: per chunk of chunk_elements, thread t adds the
/// elements chunk * chunk_elements + k * block_threads + t for k = 0..3, tree_sum over the threads; then thread t
/// adds chunks t, t + block_threads, ..., tree_sum again.
/// Example: elements 3, summand(i) = i -> 3.
template <class Summand>
double kernel_order_sum(std::int64_t elements, Summand summand) {
  const std::int64_t chunks = (elements + chunk_elements - 1) / chunk_elements;
  std::vector<double> partial(static_cast<std::size_t>(chunks));
  for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
    std::array<double, block_threads> sums{};
    for (int t = 0; t < block_threads; ++t)
      for (int k = 0; k < 4; ++k) {
        const std::int64_t element = chunk * chunk_elements + k * block_threads + t;
        if (element < elements) sums[static_cast<std::size_t>(t)] += summand(element);
      }
    partial[static_cast<std::size_t>(chunk)] = tree_sum(sums);
  }
  std::array<double, block_threads> sums{};
  for (int t = 0; t < block_threads; ++t)
    for (std::int64_t chunk = t; chunk < chunks; chunk += block_threads)
      sums[static_cast<std::size_t>(t)] += partial[static_cast<std::size_t>(chunk)];
  return tree_sum(sums);
}

/// Element i of row r's standardized noise (noise_rows), i < elements.
inline double noise_element(const noise_rows& source, std::int64_t row, std::int64_t elements, std::int64_t i) {
  if (source.values != nullptr) return source.values[row * elements + i];
  return noise_quad(source, row, static_cast<std::uint32_t>(i / 4)).value[i % 4];
}

/// draw_noise_rows on the host (host pointers).
/// Example: source {own = keys} with keys[0] = {seed 42}, rows 1, elements 6 -> fill_keyed_normal(keys[0]) of 6.
inline void draw_noise_rows_reference(const noise_rows& source, std::int64_t rows, std::int64_t elements, double* out) {
  detail::check_rows(rows, elements, "draw_noise_rows");
  detail::check_noise_rows(source, "draw_noise_rows");
  require(source.own != nullptr, "draw_noise_rows: needs keys (own), not values");
  for (std::int64_t row = 0; row < rows; ++row) {
    branchgrpo::detail::check_noise_key(source.own[row]);
    if (source.shared != nullptr) branchgrpo::detail::check_noise_key(source.shared[row]);
    for (std::int64_t block = 0; 4 * block < elements; ++block) {
      const normal_quad quad = noise_quad(source, row, static_cast<std::uint32_t>(block));
      for (std::int64_t lane = 0; lane < 4 && 4 * block + lane < elements; ++lane)
        out[row * elements + 4 * block + lane] = quad.value[lane];
    }
  }
}

/// sde_step on the host (host pointers in `args`), in the kernel's order.
/// Example: see kernels.hpp's sde_step.
template <class T>
void sde_step_reference(const sde_step_args<T>& args) {
  detail::check_sde_step(args);
  const std::int64_t rows = args.parents * args.branching, elements = args.elements;
  std::vector<T> mean(static_cast<std::size_t>(elements));
  for (std::int64_t row = 0; row < rows; ++row) {
    if (args.noise.own != nullptr) branchgrpo::detail::check_noise_key(args.noise.own[row]);
    if (args.noise.shared != nullptr) branchgrpo::detail::check_noise_key(args.noise.shared[row]);
    const std::int64_t parent = row / args.branching;
    for (std::int64_t i = 0; i < elements; ++i) {
      mean[static_cast<std::size_t>(i)] = affine_element<T>(args.x_coeff, args.x[parent * elements + i],
                                                            args.velocity_coeff, args.v[parent * elements + i]);
      args.next[row * elements + i] = sde_element<T>(mean[static_cast<std::size_t>(i)], args.stds[row],
                                                     noise_element(args.noise, row, elements, i));
    }
    const double squares = kernel_order_sum(elements, [&](std::int64_t i) {
      return squared_deviation<T>(args.next[row * elements + i], mean[static_cast<std::size_t>(i)]);
    });
    if (args.squares != nullptr) args.squares[row] = squares;
    if (args.log_prob != nullptr) args.log_prob[row] = log_prob_from_squares(squares, args.stds[row], elements);
  }
}

/// row_log_prob on the host (host pointers), in the kernel's order.
/// Example: next {1, 3}, mean {1, 1}, stds {2} -> squares {4}, log_prob {-0.25 - log 2 - 0.5 log(2 pi)}.
template <class T>
void row_log_prob_reference(const T* next, const T* mean, const double* stds, std::int64_t rows, std::int64_t elements,
                            double* squares, double* log_prob) {
  detail::check_rows(rows, elements, "row_log_prob");
  for (std::int64_t row = 0; row < rows; ++row) {
    const double sum = kernel_order_sum(elements, [&](std::int64_t i) {
      return squared_deviation<T>(next[row * elements + i], mean[row * elements + i]);
    });
    if (squares != nullptr) squares[row] = sum;
    if (log_prob != nullptr) log_prob[row] = log_prob_from_squares(sum, stds[row], elements);
  }
}

}  // namespace branchgrpo::cuda
