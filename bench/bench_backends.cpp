// The backend operations the rollout engine and the trainer use, on every CPU backend built here, at the
// size of one dense tree's latents: 219 rows (the 203 + 16 nodes of a 16-leaf tree) x 4096 elements
// (a 16 x 16 x 16 latent), and 16 x 4096 (one frontier). docs/performance.md.
//
//   host          std::vector<double> reference (rollout/host_backend.hpp)
//   eigen         Eigen, double and float (branchgrpo::eigen), when built
//   xtensor       xtensor, double (branchgrpo::xtensor), when built
//   torch         LibTorch CPU, float32 storage (branchgrpo::torch), when built
#if defined(BRANCHGRPO_BENCH_TORCH)
#include "branchgrpo/torch/backend.hpp"  // before Google Benchmark: LibTorch's logging macros come first
#endif
#include <benchmark/benchmark.h>

#include <cstdint>
#include <span>
#include <vector>

#include "bench_support.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/rollout/host_backend.hpp"
#if defined(BRANCHGRPO_BENCH_EIGEN)
#include "branchgrpo/eigen/backend.hpp"
#endif
#if defined(BRANCHGRPO_BENCH_XTENSOR)
#include "branchgrpo/xtensor/backend.hpp"
#endif

namespace branchgrpo::bench {
namespace {

template <Backend B>
struct operands {
  B backend{};
  typename B::tensor x, v;
  std::vector<std::int64_t> index;  ///< a split's gather: child row j reads parent row j / 2
  std::vector<double> stds;

  explicit operands(const benchmark::State& state) {
    const std::int64_t rows = state.range(0);
    const std::int64_t elements = state.range(1);
    const auto count = static_cast<std::size_t>(rows * elements);
    const latent_shape shape{{elements}};
    x = backend.from_host(keyed_values(count, 3, 1.0, 0.0), rows, shape);
    v = backend.from_host(keyed_values(count, 4, 1.0, 0.0), rows, shape);
    for (std::int64_t j = 0; j < rows; ++j) index.push_back(j / 2);
    stds.assign(static_cast<std::size_t>(rows), 0.3);
  }
};

void element_counters(benchmark::State& state, std::int64_t tensors_touched) {
  const std::int64_t elements = state.range(0) * state.range(1);
  state.SetItemsProcessed(state.iterations() * elements);
  // In doubles as the host sees them; a float backend moves half as many bytes.
  state.SetBytesProcessed(state.iterations() * elements * tensors_touched * static_cast<std::int64_t>(sizeof(double)));
}

template <Backend B>
void BM_affine(benchmark::State& state) {
  operands<B> o(state);
  for (auto _ : state) {
    auto out = o.backend.affine(0.98, o.x, -0.05, o.v);
    benchmark::DoNotOptimize(out);
  }
  element_counters(state, 3);
}

template <Backend B>
void BM_gather_rows(benchmark::State& state) {
  operands<B> o(state);
  for (auto _ : state) {
    auto out = o.backend.gather_rows(o.x, o.index);
    benchmark::DoNotOptimize(out);
  }
  element_counters(state, 2);
}

template <Backend B>
void BM_row_log_prob(benchmark::State& state) {
  operands<B> o(state);
  for (auto _ : state) {
    std::vector<double> out = o.backend.row_log_prob(o.x, o.v, o.stds);
    benchmark::DoNotOptimize(out.data());
  }
  element_counters(state, 2);
}

template <Backend B>
void BM_host_round_trip(benchmark::State& state) {
  operands<B> o(state);
  const std::vector<double> host = o.backend.to_host(o.x);
  for (auto _ : state) {
    std::vector<double> back = o.backend.to_host(o.backend.from_host(host, state.range(0), {{state.range(1)}}));
    benchmark::DoNotOptimize(back.data());
  }
  element_counters(state, 4);
}

void backend_sizes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "elements"})->Args({219, 4096})->Args({16, 4096});
}

#define BACKEND_BENCHMARKS(B)                                   \
  BENCHMARK_TEMPLATE(BM_affine, B)->Apply(backend_sizes);       \
  BENCHMARK_TEMPLATE(BM_gather_rows, B)->Apply(backend_sizes);  \
  BENCHMARK_TEMPLATE(BM_row_log_prob, B)->Apply(backend_sizes); \
  BENCHMARK_TEMPLATE(BM_host_round_trip, B)->Apply(backend_sizes)

BACKEND_BENCHMARKS(host_backend);
#if defined(BRANCHGRPO_BENCH_EIGEN)
BACKEND_BENCHMARKS(eigen_backend);
BACKEND_BENCHMARKS(basic_eigen_backend<float>);
#endif
#if defined(BRANCHGRPO_BENCH_XTENSOR)
BACKEND_BENCHMARKS(xtensor_backend);
#endif
#if defined(BRANCHGRPO_BENCH_TORCH)
BACKEND_BENCHMARKS(torch_backend);
#endif

}  // namespace
}  // namespace branchgrpo::bench

BENCHMARK_MAIN();
