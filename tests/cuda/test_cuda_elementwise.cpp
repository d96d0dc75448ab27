// The CUDA kernels' arithmetic on the CPU (branchgrpo/cuda/elementwise.hpp, reference.hpp, compiled by the C++
// compiler with the __host__ __device__ annotations defined away): the doc comments' examples, and equality with the
// host implementation the kernels must reproduce (fill_keyed_normal, correlated, host_backend, the engine's SDE step).
// cuda_kernel_check ties the device to reference.hpp on a GPU.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <span>
#include <vector>

#include "branchgrpo/correlator/correlated.hpp"
#include "branchgrpo/cuda/elementwise.hpp"
#include "branchgrpo/cuda/kernels.hpp"
#include "branchgrpo/cuda/reference.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/rollout/host_backend.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/schedule/steppers.hpp"

using namespace branchgrpo;
namespace bc = branchgrpo::cuda;

namespace {

/// Keys with every field at an extreme somewhere (as cuda_kernel_check's).
std::vector<noise_key> varied_keys(std::size_t count) {
  std::vector<noise_key> keys;
  for (std::size_t i = 0; i < count; ++i)
    keys.push_back({.seed = i % 2 == 0 ? 0x9e3779b97f4a7c15ull * (i + 1) : i,
                    .iteration = static_cast<std::uint32_t>(i % 3 == 0 ? max_noise_iteration : i),
                    .tree = static_cast<std::uint32_t>(i % 4 == 1 ? 0xffffffffu : 7 * i),
                    .node = static_cast<std::uint32_t>(i % 5 == 2 ? 0xffffffffu : 3 * i + 1),
                    .step = static_cast<std::uint32_t>(i % 2 == 1 ? max_noise_step : i % 20),
                    .stream = static_cast<noise_stream>(i % 4)});
  return keys;
}

std::vector<double> keyed(const noise_key& key, std::size_t count) {
  std::vector<double> out(count);
  fill_keyed_normal(key, out);
  return out;
}

/// The children of `parents` splits of K, as the engine keys them: child own keys (stream edge) and, per child row,
/// its parent's shared key.
struct split_keys {
  std::vector<noise_key> own, shared;
  split_keys(std::size_t parents, std::size_t k) {
    for (std::size_t p = 0; p < parents; ++p)
      for (std::size_t b = 0; b < k; ++b) {
        own.push_back(
            {.seed = 7, .iteration = 2, .tree = 1, .node = static_cast<std::uint32_t>(parents + p * k + b), .step = 3});
        shared.push_back({.seed = 7,
                          .iteration = 2,
                          .tree = 1,
                          .node = static_cast<std::uint32_t>(p),
                          .step = 3,
                          .stream = noise_stream::shared});
      }
  }
};

/// correlated{s}'s rows for the splits of `keys`, as the engine calls it.
std::vector<double> host_correlated(const split_keys& keys, std::size_t k, std::size_t elements, double s) {
  std::vector<double> out(keys.own.size() * elements);
  for (std::size_t first = 0; first < keys.own.size(); first += k)
    correlated{.s = s}({.parent = keys.shared[first],
                        .children = std::span<const noise_key>(keys.own).subspan(first, k),
                        .elements = elements},
                       std::span<double>(out).subspan(first * elements, k * elements));
  return out;
}

}  // namespace

TEST_CASE("keyed_normal_quad is fill_keyed_normal bit for bit", "[cuda]") {
  // The doc comment's example: block 1 of {seed 42, iteration 1, node 5, step 2} is elements 4..7.
  const noise_key key{.seed = 42, .iteration = 1, .node = 5, .step = 2};
  const std::vector<double> whole = keyed(key, 8);
  const bc::normal_quad quad = bc::keyed_normal_quad(key, 1);
  for (int lane = 0; lane < 4; ++lane) CHECK(quad.value[lane] == whole[static_cast<std::size_t>(4 + lane)]);

  for (const noise_key& k : varied_keys(12)) {
    const std::vector<double> expected = keyed(k, 64);
    for (std::uint32_t block = 0; block < 16; ++block)
      for (std::uint32_t lane = 0; lane < 4; ++lane)
        REQUIRE(bc::keyed_normal_quad(k, block).value[lane] == expected[4 * block + lane]);
    // A block far out: element 2^34 - 4 .. 2^34 - 1.
    std::vector<double> tail(4);
    fill_keyed_normal(k, tail, (std::uint64_t{1} << 34) - 4);
    const bc::normal_quad last = bc::keyed_normal_quad(k, 0xffffffffu);
    for (int lane = 0; lane < 4; ++lane) CHECK(last.value[lane] == tail[static_cast<std::size_t>(lane)]);
  }
}

TEST_CASE("correlated_element and noise_quad are correlated's combination bit for bit", "[cuda]") {
  CHECK(bc::correlated_element(-0.5, 1.0, 1.0, std::sqrt(2.0)) == 0.5 / std::sqrt(2.0));
  CHECK(bc::correlated_norm(4.0) == std::sqrt(17.0));
  for (const std::size_t k : {std::size_t{2}, std::size_t{3}, std::size_t{4}}) {
    const std::size_t elements = 1029;  // partial Philox block and partial chunk
    const split_keys keys(3, k);
    const std::vector<double> expected = host_correlated(keys, k, elements, 4.0);
    std::vector<double> got(expected.size());
    bc::draw_noise_rows_reference(
        {.own = keys.own.data(), .shared = keys.shared.data(), .s = 4.0, .norm = bc::correlated_norm(4.0)},
        static_cast<std::int64_t>(keys.own.size()), static_cast<std::int64_t>(elements), got.data());
    CHECK(got == expected);
  }
}

TEST_CASE("draw_noise_rows_reference is fill_keyed_normal row by row", "[cuda]") {
  const std::vector<noise_key> keys = varied_keys(5);
  const std::int64_t elements = 6;  // the doc comment's example, and one more row each
  std::vector<double> got(keys.size() * 6);
  bc::draw_noise_rows_reference({.own = keys.data()}, static_cast<std::int64_t>(keys.size()), elements, got.data());
  for (std::size_t r = 0; r < keys.size(); ++r)
    CHECK(std::vector<double>(got.begin() + static_cast<std::ptrdiff_t>(6 * r),
                              got.begin() + static_cast<std::ptrdiff_t>(6 * r + 6)) == keyed(keys[r], 6));
}

TEST_CASE("affine_element, sde_element and squared_deviation give the doc comments' values", "[cuda]") {
  STATIC_REQUIRE(bc::affine_element<double>(2.0, 1.0, -1.0, 3.0) == -1.0);
  STATIC_REQUIRE(bc::affine_element<float>(0.1, 1.0f, 0.0, 5.0f) == 0.1f);
  STATIC_REQUIRE(bc::sde_element<double>(1.0, 0.5, -2.0) == 0.0);
  STATIC_REQUIRE(bc::sde_element<float>(1.0f, 0.1, 1.0) == 1.0f + 0.1f);
  STATIC_REQUIRE(bc::squared_deviation<float>(3.0f, 1.0f) == 4.0);
  // host_backend's doc example: row_log_prob({1, 3}, {1, 1}, {2}) == -0.25 - log 2 - 0.5 log(2 pi).
  const double expected = -0.25 - std::log(2.0) - 0.5 * std::log(2.0 * std::numbers::pi);
  CHECK(bc::log_prob_from_squares(4.0, 2.0, 2) == Approx(expected).epsilon(1e-15));
  const host_backend backend;
  const std::vector<double> host =
      backend.row_log_prob(backend.from_host(std::vector<double>{1, 3}, 1, {{2}}),
                           backend.from_host(std::vector<double>{1, 1}, 1, {{2}}), std::vector<double>{2.0});
  CHECK(bc::log_prob_from_squares(4.0, 2.0, 2) == host[0]);
}

TEST_CASE("the kernels' reduction order: tree_sum and kernel_order_sum", "[cuda]") {
  std::array<double, bc::block_threads> ones{}, counting{};
  for (int t = 0; t < bc::block_threads; ++t) {
    ones[static_cast<std::size_t>(t)] = 1.0;
    counting[static_cast<std::size_t>(t)] = t;
  }
  CHECK(bc::tree_sum(ones) == 256.0);
  CHECK(bc::tree_sum(counting) == 32640.0);
  CHECK(bc::kernel_order_sum(3, [](std::int64_t i) { return static_cast<double>(i); }) == 3.0);
  // Integers sum exactly in any order: every element is counted once, over many chunks (> block_threads of them).
  const std::int64_t elements = 300 * bc::chunk_elements + 17;
  CHECK(bc::kernel_order_sum(elements, [](std::int64_t i) { return static_cast<double>(i % 1000); }) == [&] {
    double sum = 0.0;
    for (std::int64_t i = 0; i < elements; ++i) sum += static_cast<double>(i % 1000);
    return sum;
  }());
  STATIC_REQUIRE(bc::reduction_workspace(16, 16 * 128 * 128) == 4096);
  STATIC_REQUIRE(bc::reduction_workspace(3, 1) == 3);
}

TEST_CASE("row_log_prob_reference is host_backend's row_log_prob to 1e-12", "[cuda]") {
  // The doc comment's example.
  const std::vector<double> next{1, 3}, mean{1, 1}, stds{2};
  double squares = 0.0, log_prob = 0.0;
  bc::row_log_prob_reference(next.data(), mean.data(), stds.data(), 1, 2, &squares, &log_prob);
  CHECK(squares == 4.0);
  CHECK(log_prob == Approx(-0.25 - std::log(2.0) - 0.5 * std::log(2.0 * std::numbers::pi)).epsilon(1e-15));

  const std::int64_t rows = 3, elements = 5 * bc::chunk_elements + 3;
  const std::vector<double> a = keyed({.seed = 1}, static_cast<std::size_t>(rows * elements));
  const std::vector<double> b = keyed({.seed = 2}, a.size());
  const std::vector<double> row_stds{0.1, 0.2, 0.3};
  std::vector<double> got(3);
  bc::row_log_prob_reference(a.data(), b.data(), row_stds.data(), rows, elements, nullptr, got.data());
  const host_backend backend;
  const std::vector<double> host = backend.row_log_prob(backend.from_host(a, rows, {{elements}}),
                                                        backend.from_host(b, rows, {{elements}}), row_stds);
  for (std::size_t r = 0; r < 3; ++r) CHECK(got[r] == Approx(host[r]).epsilon(1e-12));
}

TEST_CASE("sde_step_reference<double> is the host engine's SDE step", "[cuda]") {
  // One split step of the rollout engine (engine.hpp) with host_backend, dance_sde and correlated{4}, written out:
  // mean = affine(a, x, c, v) gathered to the children, noise = correlated rows * std, next = affine(1, mean, 1,
  // noise), log-prob = row_log_prob(next, mean, stds).
  const std::size_t parents = 2, k = 2, elements = 2 * bc::chunk_elements + 5;
  const auto rows = static_cast<std::int64_t>(parents * k);
  const latent_shape shape{{static_cast<std::int64_t>(elements)}};
  const sigma_schedule schedule = shifted_linear_schedule(20);
  const affine_step step = dance_sde{}(schedule, 3);
  const std::vector<double> x = keyed({.seed = 3}, parents * elements), v = keyed({.seed = 4}, parents * elements);
  const split_keys keys(parents, k);
  const std::vector<double> stds(static_cast<std::size_t>(rows), step.noise_std);

  const host_backend backend;
  const host_tensor parent_mean =
      backend.affine(step.x_coeff, backend.from_host(x, 2, shape), step.velocity_coeff, backend.from_host(v, 2, shape));
  const host_tensor mean = backend.gather_rows(parent_mean, std::vector<std::int64_t>{0, 0, 1, 1});
  std::vector<double> noise = host_correlated(keys, k, elements, 4.0);
  for (std::size_t i = 0; i < noise.size(); ++i) noise[i] *= stds[i / elements];
  const host_tensor next = backend.affine(1.0, mean, 1.0, backend.from_host(noise, rows, shape));
  const std::vector<double> log_probs = backend.row_log_prob(next, mean, stds);

  std::vector<double> got_next(next.values.size()), squares(stds.size()), got_log_probs(stds.size());
  bc::sde_step_reference<double>(
      {.x = x.data(),
       .v = v.data(),
       .parents = static_cast<std::int64_t>(parents),
       .branching = static_cast<std::int64_t>(k),
       .elements = static_cast<std::int64_t>(elements),
       .x_coeff = step.x_coeff,
       .velocity_coeff = step.velocity_coeff,
       .stds = stds.data(),
       .noise = {.own = keys.own.data(), .shared = keys.shared.data(), .s = 4.0, .norm = bc::correlated_norm(4.0)},
       .next = got_next.data(),
       .squares = squares.data(),
       .log_prob = got_log_probs.data()});
  CHECK(got_next == next.values);
  for (std::size_t r = 0; r < stds.size(); ++r) CHECK(got_log_probs[r] == Approx(log_probs[r]).epsilon(1e-12));

  // Given noise values instead of keys: the same next.
  std::vector<double> standardized = host_correlated(keys, k, elements, 4.0), from_values(got_next.size());
  bc::sde_step_reference<double>({.x = x.data(),
                                  .v = v.data(),
                                  .parents = static_cast<std::int64_t>(parents),
                                  .branching = static_cast<std::int64_t>(k),
                                  .elements = static_cast<std::int64_t>(elements),
                                  .x_coeff = step.x_coeff,
                                  .velocity_coeff = step.velocity_coeff,
                                  .stds = stds.data(),
                                  .noise = {.values = standardized.data()},
                                  .next = from_values.data()});
  CHECK(from_values == next.values);
}

TEST_CASE("sde_step_reference<float> follows LibTorch's float32 affine", "[cuda]") {
  // torch_backend.affine on float32: x * float(a) + v * float(c) in float; the noise scaled in double, stored as
  // float, added in float.
  const std::vector<float> x{1.5f, -2.25f}, v{0.5f, 4.0f};
  const std::vector<double> stds{0.1};
  const noise_key own{.seed = 9, .node = 1};
  std::vector<float> next(2);
  bc::sde_step_reference<float>({.x = x.data(),
                                 .v = v.data(),
                                 .parents = 1,
                                 .elements = 2,
                                 .x_coeff = 0.9,
                                 .velocity_coeff = -0.05,
                                 .stds = stds.data(),
                                 .noise = {.own = &own},
                                 .next = next.data()});
  const std::vector<double> eps = keyed(own, 2);
  for (std::size_t i = 0; i < 2; ++i) {
    const float mean = x[i] * 0.9f + v[i] * -0.05f;
    CHECK(next[i] == mean + static_cast<float>(eps[i] * 0.1));
  }
}

TEST_CASE("the kernels' argument checks throw invalid_input", "[cuda]") {
  const noise_key key{};
  double out[4] = {};
  CHECK_THROWS_WITH(bc::draw_noise_rows_reference({.own = &key}, 1, 0, out),
                    "draw_noise_rows: elements per row must be in [1, 2^34], got 0");
  CHECK_THROWS_WITH(bc::draw_noise_rows_reference({}, 1, 4, out),
                    "draw_noise_rows: noise needs exactly one of own keys and values");
  CHECK_THROWS_WITH(bc::draw_noise_rows_reference({.own = &key, .shared = &key, .s = 0.0}, 1, 4, out),
                    "draw_noise_rows: correlated noise needs s and norm positive and finite, got s 0, norm 1");
  CHECK_THROWS_WITH(bc::sde_step_reference<double>({.parents = 1, .branching = 0, .elements = 4}),
                    "sde_step: parents 1 and branching 0 must be >= 0 and >= 1");
  CHECK_THROWS_WITH(bc::row_log_prob_reference<double>(nullptr, nullptr, nullptr, -1, 4, nullptr, nullptr),
                    "row_log_prob: rows must be non-negative, got -1");
  const noise_key bad{.step = 256};
  CHECK_THROWS_WITH(bc::draw_noise_rows_reference({.own = &bad}, 1, 4, out), "noise key step 256 exceeds 255");
}
