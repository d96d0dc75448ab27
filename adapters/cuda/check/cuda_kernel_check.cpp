// cuda_kernel_check: the CUDA kernels (branchgrpo/cuda/kernels.hpp) against the host, on a GPU.
//
//   cuda_kernel_check [--allow-no-device] [--reps N]
//
// With a CUDA device it checks, printing one line per check:
//   noise       draw_noise_rows == fill_keyed_normal bit for bit (keys with every field at its extremes), and the
//               correlated{4} combination == the host correlator's rows bit for bit (K = 2 and 3);
//   sde_step    next == the host engine's (host_backend affine + keyed noise; float64) and == reference.hpp's
//               (float32, float64) bit for bit; log-probs == reference.hpp's bit for bit and within 1e-9 relative of
//               the host's gaussian_log_prob_mean (host_backend's row_log_prob for float64);
//   row_log_prob  the same for the log-prob alone;
//   argument checks: bad launches throw invalid_input before touching the device.
// Then the bandwidth on a 16 x 16 x 128 x 128 latent (16 rows of 262144 elements): bytes each kernel must move /
// its median time over N launches (default 20), in GB/s and as a fraction of the H200's 4.8 TB/s.
// Without a device it runs only the argument checks and says so; it exits 0 then only with --allow-no-device (the
// CI test: there the build is the check, nothing ran on a GPU). Exit status: 0 all passed, 1 a check failed,
// 2 no device (without --allow-no-device), 3 usage.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/correlator/correlated.hpp"
#include "branchgrpo/cuda/kernels.hpp"
#include "branchgrpo/cuda/reference.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/rollout/host_backend.hpp"

namespace bg = branchgrpo;
namespace bc = branchgrpo::cuda;

namespace {

constexpr double peak_bytes_per_second = 4.8e12;  // H200 HBM3e

void cuda_ok(cudaError_t status, const char* what) {
  bg::require(status == cudaSuccess, what, ": ", cudaGetErrorString(status));
}

/// Device memory for `count` values of T, freed on scope exit.
template <class T>
class device_buffer {
 public:
  explicit device_buffer(std::size_t count) : count_(count) {
    cuda_ok(cudaMalloc(reinterpret_cast<void**>(&data_), std::max<std::size_t>(count, 1) * sizeof(T)), "cudaMalloc");
  }
  explicit device_buffer(const std::vector<T>& host) : device_buffer(host.size()) {
    cuda_ok(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { cudaFree(data_); }

  T* get() const { return data_; }
  std::vector<T> to_host() const {
    std::vector<T> host(count_);
    cuda_ok(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    return host;
  }

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

int failures = 0;

void report(bool passed, const std::string& what) {
  std::printf("%s  %s\n", passed ? "PASS" : "FAIL", what.c_str());
  if (!passed) ++failures;
}

/// Whether `device` and `host` hold the same bits; when not, prints how many values differ and the first three
/// (index, device value, host value, their difference), so that a failure on a GPU says where to look.
template <class T>
bool bitwise_equal(const std::vector<T>& device, const std::vector<T>& host) {
  if (device.size() != host.size()) {
    std::printf("      sizes differ: device %zu, host %zu\n", device.size(), host.size());
    return false;
  }
  std::size_t differing = 0;
  for (std::size_t i = 0; i < host.size(); ++i) {
    if (std::memcmp(&device[i], &host[i], sizeof(T)) == 0) continue;
    if (++differing <= 3)
      std::printf("      [%zu] device %.17g host %.17g (difference %.3g)\n", i, static_cast<double>(device[i]),
                  static_cast<double>(host[i]), static_cast<double>(device[i]) - static_cast<double>(host[i]));
  }
  if (differing > 0) std::printf("      %zu of %zu values differ\n", differing, host.size());
  return differing == 0;
}

double max_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = a.size() == b.size() ? 0.0 : INFINITY;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(std::fabs(b[i]), 1e-300));
  return worst;
}

/// Keys with every field at an extreme somewhere.
std::vector<bg::noise_key> varied_keys(std::size_t count) {
  std::vector<bg::noise_key> keys;
  for (std::size_t i = 0; i < count; ++i)
    keys.push_back({.seed = i % 2 == 0 ? 0x9e3779b97f4a7c15ull * (i + 1) : i,
                    .iteration = static_cast<std::uint32_t>(i % 3 == 0 ? bg::max_noise_iteration : i),
                    .tree = static_cast<std::uint32_t>(i % 4 == 1 ? 0xffffffffu : 7 * i),
                    .node = static_cast<std::uint32_t>(i % 5 == 2 ? 0xffffffffu : 3 * i + 1),
                    .step = static_cast<std::uint32_t>(i % 2 == 1 ? bg::max_noise_step : i % 20),
                    .stream = static_cast<bg::noise_stream>(i % 4)});
  return keys;
}

void check_noise() {
  const std::int64_t elements = 1029;  // not a multiple of 4 or of a chunk: partial Philox blocks and chunks
  const std::vector<bg::noise_key> keys = varied_keys(9);
  const auto rows = static_cast<std::int64_t>(keys.size());
  std::vector<double> host(static_cast<std::size_t>(rows * elements));
  for (std::int64_t r = 0; r < rows; ++r)
    bg::fill_keyed_normal(
        keys[static_cast<std::size_t>(r)],
        std::span<double>(host).subspan(static_cast<std::size_t>(r * elements), static_cast<std::size_t>(elements)));
  const device_buffer<bg::noise_key> device_keys(keys);
  device_buffer<double> out(host.size());
  bc::draw_noise_rows({.own = device_keys.get()}, rows, elements, out.get());
  report(bitwise_equal(out.to_host(), host), "draw_noise_rows == fill_keyed_normal bit for bit (9 keys x 1029)");

  for (const std::size_t k : {std::size_t{2}, std::size_t{3}}) {
    const std::size_t parents = 4;
    std::vector<bg::noise_key> own, shared;
    std::vector<double> expected(parents * k * static_cast<std::size_t>(elements));
    for (std::size_t p = 0; p < parents; ++p) {
      const bg::noise_key parent{.seed = 11,
                                 .iteration = 5,
                                 .tree = 2,
                                 .node = static_cast<std::uint32_t>(p),
                                 .step = 3,
                                 .stream = bg::noise_stream::shared};
      std::vector<bg::noise_key> children;
      for (std::size_t b = 0; b < k; ++b) {
        bg::noise_key child = parent;
        child.node = static_cast<std::uint32_t>(parents + p * k + b);
        child.stream = bg::noise_stream::edge;
        children.push_back(child);
        own.push_back(child);
        shared.push_back(parent);
      }
      bg::correlated{.s = 4.0}({.parent = parent, .children = children, .elements = static_cast<std::size_t>(elements)},
                               std::span<double>(expected).subspan(p * k * static_cast<std::size_t>(elements),
                                                                   k * static_cast<std::size_t>(elements)));
    }
    const device_buffer<bg::noise_key> device_own(own), device_shared(shared);
    device_buffer<double> rows_out(expected.size());
    bc::draw_noise_rows(
        {.own = device_own.get(), .shared = device_shared.get(), .s = 4.0, .norm = bc::correlated_norm(4.0)},
        static_cast<std::int64_t>(own.size()), elements, rows_out.get());
    report(bitwise_equal(rows_out.to_host(), expected),
           "correlated{4} rows == the host correlator bit for bit (K = " + std::to_string(k) + ")");
  }
}

/// Values of a keyed normal vector as T (latents and velocities for the step checks).
template <class T>
std::vector<T> keyed_values(std::uint64_t seed, std::size_t count, double scale) {
  std::vector<double> values(count);
  bg::fill_keyed_normal({.seed = seed}, values);
  std::vector<T> out(count);
  for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<T>(scale * values[i]);
  return out;
}

template <class T>
void check_step(const char* type) {
  const std::int64_t parents = 3, branching = 2, rows = parents * branching, elements = 3001;
  const auto count = static_cast<std::size_t>(rows * elements);
  const std::vector<T> x = keyed_values<T>(1, static_cast<std::size_t>(parents * elements), 1.0);
  const std::vector<T> v = keyed_values<T>(2, static_cast<std::size_t>(parents * elements), 0.7);
  std::vector<bg::noise_key> own, shared;
  for (std::int64_t j = 0; j < rows; ++j) {
    own.push_back({.seed = 5, .iteration = 4, .tree = 1, .node = static_cast<std::uint32_t>(3 + j), .step = 6});
    shared.push_back({.seed = 5,
                      .iteration = 4,
                      .tree = 1,
                      .node = static_cast<std::uint32_t>(j / branching),
                      .step = 6,
                      .stream = bg::noise_stream::shared});
  }
  std::vector<double> stds(static_cast<std::size_t>(rows));
  for (std::int64_t j = 0; j < rows; ++j) stds[static_cast<std::size_t>(j)] = 0.3 * std::sqrt(0.05) * (1.0 + 0.1 * j);
  const double x_coeff = 0.9775, velocity_coeff = -0.05;

  // Host: reference.hpp (the kernel's order).
  std::vector<T> next_reference(count);
  std::vector<double> squares_reference(static_cast<std::size_t>(rows)), log_prob_reference(squares_reference.size());
  bc::sde_step_args<T> args{
      .x = x.data(),
      .v = v.data(),
      .parents = parents,
      .branching = branching,
      .elements = elements,
      .x_coeff = x_coeff,
      .velocity_coeff = velocity_coeff,
      .stds = stds.data(),
      .noise = {.own = own.data(), .shared = shared.data(), .s = 4.0, .norm = bc::correlated_norm(4.0)},
      .next = next_reference.data(),
      .squares = squares_reference.data(),
      .log_prob = log_prob_reference.data(),
      .workspace = nullptr};
  std::vector<double> host_workspace(static_cast<std::size_t>(bc::reduction_workspace(rows, elements)));
  args.workspace = host_workspace.data();
  bc::sde_step_reference(args);

  // Device.
  const device_buffer<T> device_x(x), device_v(v);
  const device_buffer<double> device_stds(stds);
  const device_buffer<bg::noise_key> device_own(own), device_shared(shared);
  device_buffer<T> device_next(count);
  device_buffer<double> device_squares(stds.size()), device_log_prob(stds.size()), workspace(host_workspace.size());
  args.x = device_x.get();
  args.v = device_v.get();
  args.stds = device_stds.get();
  args.noise.own = device_own.get();
  args.noise.shared = device_shared.get();
  args.next = device_next.get();
  args.squares = device_squares.get();
  args.log_prob = device_log_prob.get();
  args.workspace = workspace.get();
  bc::sde_step(args);
  const std::vector<T> next = device_next.to_host();
  const std::vector<double> log_prob = device_log_prob.to_host();
  report(bitwise_equal(next, next_reference), std::string("sde_step<") + type + "> next == reference bit for bit");
  report(bitwise_equal(device_squares.to_host(), squares_reference),
         std::string("sde_step<") + type + "> squares == reference (same tree) bit for bit");

  // Host: the core's log-prob of the device's rows, and for float64 the host engine's step itself.
  std::vector<double> host_log_prob(stds.size());
  for (std::int64_t j = 0; j < rows; ++j) {
    std::vector<double> row_next(static_cast<std::size_t>(elements)), row_mean(row_next.size());
    const std::int64_t p = j / branching;
    for (std::int64_t i = 0; i < elements; ++i) {
      const auto at = static_cast<std::size_t>(p * elements + i);
      row_mean[static_cast<std::size_t>(i)] = bc::affine_element<T>(x_coeff, x[at], velocity_coeff, v[at]);
      row_next[static_cast<std::size_t>(i)] = next[static_cast<std::size_t>(j * elements + i)];
    }
    host_log_prob[static_cast<std::size_t>(j)] =
        bg::gaussian_log_prob_mean(row_next, row_mean, stds[static_cast<std::size_t>(j)]);
  }
  const double gap = max_relative(log_prob, host_log_prob);
  report(gap <= 1e-9, std::string("sde_step<") + type + "> log_prob within 1e-9 of gaussian_log_prob_mean (max " +
                          std::to_string(gap) + ")");

  if constexpr (std::is_same_v<T, double>) {
    // The rollout engine's arithmetic: host_backend affine, gather, correlated noise * std, affine(1, mean, 1, noise).
    const bg::host_backend backend;
    const bg::latent_shape shape{{elements}};
    const auto mean_parents = backend.affine(x_coeff, backend.from_host(x, parents, shape), velocity_coeff,
                                             backend.from_host(v, parents, shape));
    std::vector<std::int64_t> index(static_cast<std::size_t>(rows));
    for (std::int64_t j = 0; j < rows; ++j) index[static_cast<std::size_t>(j)] = j / branching;
    const auto mean = backend.gather_rows(mean_parents, index);
    std::vector<double> noise(count);
    for (std::int64_t p = 0; p < parents; ++p) {
      const auto first = static_cast<std::size_t>(p * branching);
      bg::correlated{.s = 4.0}({.parent = shared[first],
                                .children = std::span<const bg::noise_key>(own).subspan(first, branching),
                                .elements = static_cast<std::size_t>(elements)},
                               std::span<double>(noise).subspan(first * static_cast<std::size_t>(elements),
                                                                static_cast<std::size_t>(branching * elements)));
    }
    for (std::size_t i = 0; i < count; ++i) noise[i] *= stds[i / static_cast<std::size_t>(elements)];
    const auto engine_next = backend.affine(1.0, mean, 1.0, backend.from_host(noise, rows, shape));
    report(bitwise_equal(next, engine_next.values), "sde_step<double> next == the host engine's step bit for bit");
    const double engine_gap = max_relative(log_prob, backend.row_log_prob(engine_next, mean, stds));
    report(engine_gap <= 1e-9, "sde_step<double> log_prob within 1e-9 of host_backend.row_log_prob (max " +
                                   std::to_string(engine_gap) + ")");
  }

  // row_log_prob alone, on the device's rows against their means.
  std::vector<T> means(count);
  for (std::int64_t j = 0; j < rows; ++j)
    for (std::int64_t i = 0; i < elements; ++i) {
      const auto at = static_cast<std::size_t>((j / branching) * elements + i);
      means[static_cast<std::size_t>(j * elements + i)] = bc::affine_element<T>(x_coeff, x[at], velocity_coeff, v[at]);
    }
  const device_buffer<T> device_means(means);
  device_buffer<double> row_log_prob_out(stds.size());
  bc::row_log_prob<T>(device_next.get(), device_means.get(), device_stds.get(), rows, elements, nullptr,
                      row_log_prob_out.get(), workspace.get());
  report(bitwise_equal(row_log_prob_out.to_host(), log_prob),
         std::string("row_log_prob<") + type + "> == sde_step's log_prob bit for bit");
}

/// Bad launches throw before any CUDA call, so this runs without a device too.
void check_arguments() {
  auto throws = [](auto&& launch) {
    try {
      launch();
    } catch (const bg::invalid_input&) {
      return true;
    }
    return false;
  };
  const bg::noise_key key{};
  bool all = throws([&] { bc::draw_noise_rows({.own = &key}, 1, 0, nullptr); }) &&
             throws([&] { bc::draw_noise_rows({}, 1, 4, nullptr); }) &&
             throws([&] { bc::draw_noise_rows({.own = &key}, 1, (std::int64_t{1} << 34) + 1, nullptr); }) &&
             throws([&] { bc::draw_noise_rows({.own = &key, .shared = &key, .s = 0.0}, 1, 4, nullptr); }) &&
             throws([&] { bc::sde_step<float>({.parents = 1, .branching = 0, .elements = 4}); }) &&
             throws([&] { bc::row_log_prob<double>(nullptr, nullptr, nullptr, -1, 4, nullptr, nullptr, nullptr); });
  report(all, "invalid launches throw invalid_input before touching the device");
}

/// Median seconds of `launch` over `reps` runs (after 3 warm-ups), timed with CUDA events.
template <class Launch>
double median_seconds(int reps, Launch launch) {
  cudaEvent_t start = nullptr, stop = nullptr;
  cuda_ok(cudaEventCreate(&start), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) launch();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    cuda_ok(cudaEventRecord(start), "cudaEventRecord");
    launch();
    cuda_ok(cudaEventRecord(stop), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    cuda_ok(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(1e-3 * ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void bandwidth(int reps) {
  const std::int64_t rows = 16, elements = 16 * 128 * 128;
  const auto count = static_cast<std::size_t>(rows * elements);
  std::printf("\nbandwidth: %lld rows x 16 x 128 x 128 (%zu elements), median of %d launches, peak 4.8 TB/s\n",
              static_cast<long long>(rows), count, reps);
  std::printf("%-44s %10s %10s %9s %7s\n", "kernel", "MB moved", "time (us)", "GB/s", "of peak");
  const std::vector<bg::noise_key> keys = varied_keys(static_cast<std::size_t>(rows));
  const device_buffer<bg::noise_key> device_keys(keys);
  const std::vector<double> stds(static_cast<std::size_t>(rows), 0.05);
  const device_buffer<double> device_stds(stds);
  device_buffer<double> workspace(static_cast<std::size_t>(bc::reduction_workspace(rows, elements)));
  device_buffer<double> squares(stds.size()), log_prob(stds.size()), noise(count);
  auto line = [&](const char* name, double bytes, double seconds) {
    std::printf("%-44s %10.1f %10.1f %9.0f %6.1f%%\n", name, bytes / 1e6, seconds * 1e6, bytes / seconds / 1e9,
                100.0 * bytes / seconds / peak_bytes_per_second);
  };
  const auto n = static_cast<double>(count);
  line("draw_noise_rows (write f64)", 8 * n,
       median_seconds(reps, [&] { bc::draw_noise_rows({.own = device_keys.get()}, rows, elements, noise.get()); }));

  auto step = [&]<class T>(const char* keyed_name, const char* given_name, T) {
    const device_buffer<T> x(keyed_values<T>(1, count, 1.0)), v(keyed_values<T>(2, count, 1.0));
    device_buffer<T> next(count);
    bc::sde_step_args<T> args{.x = x.get(),
                              .v = v.get(),
                              .parents = rows,
                              .branching = 1,
                              .elements = elements,
                              .x_coeff = 0.9775,
                              .velocity_coeff = -0.05,
                              .stds = device_stds.get(),
                              .noise = {.own = device_keys.get()},
                              .next = next.get(),
                              .squares = squares.get(),
                              .log_prob = log_prob.get(),
                              .workspace = workspace.get()};
    line(keyed_name, 3 * sizeof(T) * n, median_seconds(reps, [&] { bc::sde_step(args); }));
    args.noise = {.values = noise.get()};
    line(given_name, (3 * sizeof(T) + 8) * n, median_seconds(reps, [&] { bc::sde_step(args); }));
    line(sizeof(T) == 4 ? "row_log_prob<float> (read 2 x f32)" : "row_log_prob<double> (read 2 x f64)",
         2 * sizeof(T) * n, median_seconds(reps, [&] {
           bc::row_log_prob<T>(next.get(), x.get(), device_stds.get(), rows, elements, squares.get(), log_prob.get(),
                               workspace.get());
         }));
  };
  step("sde_step<float>, keyed noise (x, v, next f32)", "sde_step<float>, given f64 noise", 0.0f);
  step("sde_step<double>, keyed noise (x, v, next f64)", "sde_step<double>, given f64 noise", 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  bool allow_no_device = false;
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--allow-no-device") {
      allow_no_device = true;
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: cuda_kernel_check [--allow-no-device] [--reps N]\n");
      return 3;
    }
  }
  try {
    check_arguments();
    int devices = 0;
    const cudaError_t status = cudaGetDeviceCount(&devices);
    if (status != cudaSuccess || devices == 0) {
      std::printf(
          "cuda_kernel_check: no CUDA device (%s): only the argument checks ran; the kernels were compiled, "
          "not run\n",
          status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
      if (failures > 0) return 1;
      return allow_no_device ? 0 : 2;
    }
    cudaDeviceProp properties{};
    cuda_ok(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
    std::printf("device 0: %s (sm_%d%d, %.0f GiB)\n", properties.name, properties.major, properties.minor,
                static_cast<double>(properties.totalGlobalMem) / (1u << 30));
    check_noise();
    check_step<float>("float");
    check_step<double>("double");
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    bandwidth(reps);
  } catch (const std::exception& error) {
    std::printf("FAIL  %s\n", error.what());
    ++failures;
  }
  if (failures > 0) {
    std::printf("cuda_kernel_check: %d check(s) failed\n", failures);
    return 1;
  }
  std::printf("cuda_kernel_check: all checks passed\n");
  return 0;
}
