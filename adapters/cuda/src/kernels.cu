// The CUDA adapter's kernels (branchgrpo/cuda/kernels.hpp): the only translation unit nvcc compiles. The
// arithmetic is elementwise.hpp's; this file adds the thread layout and the fixed reduction tree.
//
// Layout: one block of block_threads threads per (row, chunk of chunk_elements elements), blocks numbered
// row * chunks + chunk. Thread t draws Philox block chunk * block_threads + t of its row (4 elements) into shared
// memory, then handles the elements chunk * chunk_elements + k * block_threads + t for k = 0..3 (coalesced loads and
// stores), accumulating its squared deviations in that order. block_tree_sum adds the block's 256 sums in
// reference.hpp's tree_sum order; finish_rows adds a row's chunk sums the same way. No atomics: the result does
// not depend on scheduling.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/cuda/elementwise.hpp"
#include "branchgrpo/cuda/kernels.hpp"

namespace branchgrpo::cuda {

namespace {

void check_launch(const char* operation) {
  const cudaError_t status = cudaGetLastError();
  require(status == cudaSuccess, operation, ": CUDA launch failed: ", cudaGetErrorString(status));
}

std::int64_t chunks_of(std::int64_t elements) { return (elements + chunk_elements - 1) / chunk_elements; }

/// tree_sum (reference.hpp) over the block's threads; every thread gets the total.
__device__ double block_tree_sum(double* scratch, double value) {
  const int t = static_cast<int>(threadIdx.x);
  scratch[t] = value;
  __syncthreads();
  for (int stride = block_threads / 2; stride > 0; stride /= 2) {
    if (t < stride) scratch[t] += scratch[t + stride];
    __syncthreads();
  }
  return scratch[0];
}

/// Row `row`'s keyed noise for the elements of chunk `chunk` into eps[0, chunk_elements): thread t draws its
/// Philox block, elements 4t .. 4t + 3 of the chunk.
__device__ void stage_noise(const noise_rows& source, std::int64_t row, std::int64_t chunk, std::int64_t elements,
                            double* eps) {
  const int t = static_cast<int>(threadIdx.x);
  const std::int64_t block = chunk * block_threads + t;
  if (4 * block < elements) {
    const normal_quad quad = noise_quad(source, row, static_cast<std::uint32_t>(block));
    for (int lane = 0; lane < 4; ++lane) eps[4 * t + lane] = quad.value[lane];
  }
  __syncthreads();
}

__global__ void draw_noise_kernel(noise_rows source, std::int64_t elements, std::int64_t chunks, double* out) {
  __shared__ double eps[chunk_elements];
  const std::int64_t row = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  stage_noise(source, row, chunk, elements, eps);
  for (int k = 0; k < 4; ++k) {
    const int offset = k * block_threads + static_cast<int>(threadIdx.x);
    const std::int64_t element = chunk * chunk_elements + offset;
    if (element < elements) out[row * elements + element] = eps[offset];
  }
}

template <class T>
__global__ void sde_step_kernel(sde_step_args<T> args, std::int64_t chunks) {
  __shared__ double eps[chunk_elements];
  __shared__ double scratch[block_threads];
  const std::int64_t row = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  const std::int64_t elements = args.elements;
  const bool keyed = args.noise.values == nullptr;  // the same for the whole launch: no divergent barrier
  if (keyed) stage_noise(args.noise, row, chunk, elements, eps);
  const std::int64_t parent = row / args.branching;
  const T* x = args.x + parent * elements;
  const T* v = args.v + parent * elements;
  const double noise_std = args.stds[row];
  double squares = 0.0;
  for (int k = 0; k < 4; ++k) {
    const int offset = k * block_threads + static_cast<int>(threadIdx.x);
    const std::int64_t element = chunk * chunk_elements + offset;
    if (element >= elements) break;
    const double noise = keyed ? eps[offset] : args.noise.values[row * elements + element];
    const T mean = affine_element<T>(args.x_coeff, x[element], args.velocity_coeff, v[element]);
    const T next = sde_element<T>(mean, noise_std, noise);
    args.next[row * elements + element] = next;
    squares += squared_deviation<T>(next, mean);
  }
  const double total = block_tree_sum(scratch, squares);
  if (threadIdx.x == 0) args.workspace[blockIdx.x] = total;
}

template <class T>
__global__ void row_squares_kernel(const T* next, const T* mean, std::int64_t elements, std::int64_t chunks,
                                   double* workspace) {
  __shared__ double scratch[block_threads];
  const std::int64_t row = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  double squares = 0.0;
  for (int k = 0; k < 4; ++k) {
    const std::int64_t element = chunk * chunk_elements + k * block_threads + static_cast<int>(threadIdx.x);
    if (element >= elements) break;
    squares += squared_deviation<T>(next[row * elements + element], mean[row * elements + element]);
  }
  const double total = block_tree_sum(scratch, squares);
  if (threadIdx.x == 0) workspace[blockIdx.x] = total;
}

/// One block per row: the row's chunk sums (thread t: chunks t, t + 256, ... in order), then tree_sum.
__global__ void finish_rows_kernel(const double* workspace, std::int64_t chunks, const double* stds,
                                   std::int64_t elements, double* squares, double* log_prob) {
  __shared__ double scratch[block_threads];
  const std::int64_t row = blockIdx.x;
  double sum = 0.0;
  for (std::int64_t c = threadIdx.x; c < chunks; c += block_threads) sum += workspace[row * chunks + c];
  const double total = block_tree_sum(scratch, sum);
  if (threadIdx.x == 0) {
    if (squares != nullptr) squares[row] = total;
    if (log_prob != nullptr) log_prob[row] = log_prob_from_squares(total, stds[row], elements);
  }
}

void finish_rows(const double* workspace, std::int64_t rows, std::int64_t elements, const double* stds, double* squares,
                 double* log_prob, stream_t stream, const char* operation) {
  finish_rows_kernel<<<static_cast<unsigned>(rows), block_threads, 0, stream>>>(workspace, chunks_of(elements), stds,
                                                                                elements, squares, log_prob);
  check_launch(operation);
}

}  // namespace

void draw_noise_rows(const noise_rows& source, std::int64_t rows, std::int64_t elements, double* out, stream_t stream) {
  detail::check_rows(rows, elements, "draw_noise_rows");
  detail::check_noise_rows(source, "draw_noise_rows");
  require(source.own != nullptr, "draw_noise_rows: needs keys (own), not values");
  if (rows == 0) return;
  require(out != nullptr, "draw_noise_rows: out must be set");
  const std::int64_t chunks = chunks_of(elements);
  draw_noise_kernel<<<static_cast<unsigned>(rows * chunks), block_threads, 0, stream>>>(source, elements, chunks, out);
  check_launch("draw_noise_rows");
}

template <class T>
void sde_step(const sde_step_args<T>& args, stream_t stream) {
  detail::check_sde_step(args);
  const std::int64_t rows = args.parents * args.branching;
  if (rows == 0) return;
  require(args.workspace != nullptr, "sde_step: workspace must be set");
  const std::int64_t chunks = chunks_of(args.elements);
  sde_step_kernel<T><<<static_cast<unsigned>(rows * chunks), block_threads, 0, stream>>>(args, chunks);
  check_launch("sde_step");
  finish_rows(args.workspace, rows, args.elements, args.stds, args.squares, args.log_prob, stream, "sde_step");
}

template <class T>
void row_log_prob(const T* next, const T* mean, const double* stds, std::int64_t rows, std::int64_t elements,
                  double* squares, double* log_prob, double* workspace, stream_t stream) {
  detail::check_rows(rows, elements, "row_log_prob");
  if (rows == 0) return;
  require(next != nullptr && mean != nullptr && workspace != nullptr && (log_prob == nullptr || stds != nullptr),
          "row_log_prob: next, mean, workspace (and stds for log_prob) must be set");
  const std::int64_t chunks = chunks_of(elements);
  row_squares_kernel<T>
      <<<static_cast<unsigned>(rows * chunks), block_threads, 0, stream>>>(next, mean, elements, chunks, workspace);
  check_launch("row_log_prob");
  finish_rows(workspace, rows, elements, stds, squares, log_prob, stream, "row_log_prob");
}

template void sde_step<float>(const sde_step_args<float>&, stream_t);
template void sde_step<double>(const sde_step_args<double>&, stream_t);
template void row_log_prob<float>(const float*, const float*, const double*, std::int64_t, std::int64_t, double*,
                                  double*, double*, stream_t);
template void row_log_prob<double>(const double*, const double*, const double*, std::int64_t, std::int64_t, double*,
                                   double*, double*, stream_t);

}  // namespace branchgrpo::cuda
