// Cross-backend conformance: every backend gives host_backend's numbers (the reference) for every Backend
// operation, rejects the inputs host_backend rejects, and reproduces a whole rollout (latents, log-probs,
// edge stds) for the same keys.
//
// Adding a backend: include its header under its CMake flag, append it to `conformance_backends`, give it
// a `tolerance` if it does not compute in double, and link its target in tests/CMakeLists.txt.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "branchgrpo/correlator/correlated.hpp"
#include "branchgrpo/correlator/independent.hpp"
#include "branchgrpo/correlator/scaled.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/rollout/engine.hpp"
#include "branchgrpo/rollout/host_backend.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/schedule/steppers.hpp"
#include "branchgrpo/topology/flow_grpo_fast.hpp"
#include "branchgrpo/topology/split_schedule.hpp"
#include "branchgrpo/training/methods.hpp"
#include "branchgrpo/training/trainer.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"
#include "gaussian_denoiser.hpp"

#if defined(BRANCHGRPO_CONFORMANCE_EIGEN)
#include <branchgrpo/eigen/backend.hpp>
#endif
#if defined(BRANCHGRPO_CONFORMANCE_XTENSOR)
#include <branchgrpo/xtensor/backend.hpp>
#endif
#if defined(BRANCHGRPO_CONFORMANCE_TORCH)
#include <branchgrpo/torch/backend.hpp>
#endif

using namespace branchgrpo;

// ---- The backends under test: the one list to extend. ------------------------------------------------------
using conformance_backends = std::tuple<host_backend
#if defined(BRANCHGRPO_CONFORMANCE_EIGEN)
                                        ,
                                        eigen_backend, basic_eigen_backend<float>
#endif
#if defined(BRANCHGRPO_CONFORMANCE_XTENSOR)
                                        ,
                                        xtensor_backend
#endif
#if defined(BRANCHGRPO_CONFORMANCE_TORCH)
                                        ,
                                        torch_backend
#endif
                                        >;

/// Difference from host_backend allowed: absolute 1e-6 (and no relative slack) for double backends.
template <class B>
constexpr double tolerance = 1e-6;
template <class B>
constexpr double relative_tolerance = 0.0;
#if defined(BRANCHGRPO_CONFORMANCE_EIGEN)
// float rounds at 6e-8 relative; 20 rollout steps amplify it, and a log-prob of -1737 (std 0.05) is off
// by 1e-4 absolute: float backends get 1e-4 absolute or 1e-5 relative, whichever is larger.
template <>
constexpr double tolerance<basic_eigen_backend<float>> = 1e-4;
template <>
constexpr double relative_tolerance<basic_eigen_backend<float>> = 1e-5;
#endif
#if defined(BRANCHGRPO_CONFORMANCE_TORCH)
// torch_backend stores float32 (affine in float32, log-probs in float64): 1e-5 absolute or 1e-5 relative.
template <>
constexpr double tolerance<torch_backend> = 1e-5;
template <>
constexpr double relative_tolerance<torch_backend> = 1e-5;
#endif

// ---- Static checks: every adapter models Backend; things that are not backends do not. ----------------------
#if defined(BRANCHGRPO_CONFORMANCE_EIGEN)
static_assert(Backend<eigen_backend>);
static_assert(Backend<basic_eigen_backend<float>>);
static_assert(!KeyedSdeBackend<eigen_backend>);  // its SDE steps take keyed_sde_step_on_host
static_assert(!Backend<eigen_tensor>);           // a tensor is not a backend
#endif
#if defined(BRANCHGRPO_CONFORMANCE_XTENSOR)
static_assert(Backend<xtensor_backend>);
static_assert(!Backend<xtensor_tensor>);
#endif
#if defined(BRANCHGRPO_CONFORMANCE_TORCH)
static_assert(Backend<torch_backend>);
static_assert(KeyedSdeBackend<torch_backend>);  // the fused CUDA kernel on CUDA tensors, the host path otherwise
static_assert(!Backend<torch::Tensor>);
#endif
static_assert(std::tuple_size_v<conformance_backends> >= 1);

namespace {

/// The exact Gaussian-data denoiser of tests/support/gaussian_denoiser.hpp, written once for every backend
/// through to_host / from_host (the velocity is evaluated in double on the host, like the noise).
template <Backend B>
struct analytic_denoiser {
  B* backend = nullptr;
  latent_shape shape;
  double data_std = 0.5;

  typename B::tensor operator()(const typename B::tensor& x, const denoise_batch& batch) {
    std::vector<double> values = backend->to_host(x);
    const auto elements = static_cast<std::size_t>(shape.elements());
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = testing::gaussian_denoiser::velocity(values[i], batch.sigma,
                                                       static_cast<double>(batch.prompts[i / elements]), data_std);
    return backend->from_host(values, backend->rows(x), shape);
  }
};

static_assert(Denoiser<analytic_denoiser<host_backend>, host_backend>);
#if defined(BRANCHGRPO_CONFORMANCE_EIGEN)
static_assert(Denoiser<analytic_denoiser<eigen_backend>, eigen_backend>);
#endif
#if defined(BRANCHGRPO_CONFORMANCE_XTENSOR)
static_assert(Denoiser<analytic_denoiser<xtensor_backend>, xtensor_backend>);
#endif
#if defined(BRANCHGRPO_CONFORMANCE_TORCH)
static_assert(Denoiser<analytic_denoiser<torch_backend>, torch_backend>);
#endif

/// rows * shape.elements() keyed N(0, 1) values: test data that is the same for every backend.
std::vector<double> keyed_values(std::uint32_t tree, std::int64_t rows, const latent_shape& shape) {
  std::vector<double> values(static_cast<std::size_t>(rows * shape.elements()));
  fill_keyed_normal({.seed = 2024, .iteration = 0, .tree = tree, .node = 0, .step = 0, .stream = noise_stream::edge},
                    values);
  return values;
}

template <class B>
void check_close(const std::vector<double>& actual, const std::vector<double>& expected) {
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    INFO("element " << i);
    CHECK(actual[i] == Approx(expected[i]).margin(tolerance<B>).epsilon(relative_tolerance<B>));
  }
}

/// Throws invalid_input with a one-line message.
template <class F>
void check_rejects(F&& call) {
  try {
    call();
    FAIL("no invalid_input thrown");
  } catch (const invalid_input& error) {
    const std::string message = error.what();
    CHECK(!message.empty());
    CHECK(message.find('\n') == std::string::npos);
  }
}

// Rows of 1 to 4 dims: a vector, a matrix, an image latent {C, H, W} and a video latent {C, F, H, W}.
const std::vector<latent_shape> shapes{latent_shape{{2}}, latent_shape{{3, 4}}, latent_shape{{2, 3, 5}},
                                       latent_shape{{2, 3, 2, 2}}};

/// A video latent [C, F, H, W] = {4, 3, 4, 4} per row (Wan's layout, small): 192 elements.
const latent_shape video_shape{{4, 3, 4, 4}};

}  // namespace

TEMPLATE_LIST_TEST_CASE("backend: from_host, to_host and rows round-trip row-major values", "[conformance]",
                        conformance_backends) {
  TestType backend;
  for (const latent_shape& shape : shapes)
    for (const std::int64_t rows : {0, 1, 4}) {
      INFO("rows " << rows << ", elements " << shape.elements());
      const std::vector<double> values = keyed_values(1, rows, shape);
      const auto x = backend.from_host(values, rows, shape);
      CHECK(backend.rows(x) == rows);
      check_close<TestType>(backend.to_host(x), values);
    }
}

TEMPLATE_LIST_TEST_CASE("backend: the host_backend doc example", "[conformance]", conformance_backends) {
  // Rows {1, 2}, {3, 4}, {5, 6} of shape {2}.
  TestType backend;
  const std::vector<double> values{1, 2, 3, 4, 5, 6};
  const auto x = backend.from_host(values, 3, latent_shape{{2}});
  const std::vector<std::int64_t> index{2, 0, 2};
  check_close<TestType>(backend.to_host(backend.gather_rows(x, index)), {5, 6, 1, 2, 5, 6});
  check_close<TestType>(backend.to_host(backend.slice_rows(x, 1, 3)), {3, 4, 5, 6});
  // 2 x - x = x.
  check_close<TestType>(backend.to_host(backend.affine(2, x, -1, x)), values);
  // next {1, 3}, mean {1, 1}, std 2: mean of {-log 2 - 0.5 log 2 pi, -0.5 - log 2 - 0.5 log 2 pi}.
  const std::vector<double> next{1, 3}, mean{1, 1}, std{2};
  const auto log_prob = backend.row_log_prob(backend.from_host(next, 1, latent_shape{{2}}),
                                             backend.from_host(mean, 1, latent_shape{{2}}), std);
  check_close<TestType>(log_prob, {-0.25 - std::log(2.0) - 0.5 * std::log(2.0 * std::numbers::pi)});
}

TEMPLATE_LIST_TEST_CASE("backend: every operation gives host_backend's numbers", "[conformance]",
                        conformance_backends) {
  TestType backend;
  host_backend host;
  for (const latent_shape& shape : shapes) {
    INFO("elements " << shape.elements());
    const std::int64_t rows = 5;
    const std::vector<double> xs = keyed_values(1, rows, shape), vs = keyed_values(2, rows, shape);
    const auto x = backend.from_host(xs, rows, shape), v = backend.from_host(vs, rows, shape);
    const host_tensor hx = host.from_host(xs, rows, shape), hv = host.from_host(vs, rows, shape);

    SECTION("gather_rows with repeats, every row, and no row") {
      for (const std::vector<std::int64_t>& index :
           {std::vector<std::int64_t>{4, 0, 4, 2, 1, 3, 3}, std::vector<std::int64_t>{0, 1, 2, 3, 4},
            std::vector<std::int64_t>{}}) {
        const auto gathered = backend.gather_rows(x, index);
        CHECK(backend.rows(gathered) == static_cast<std::int64_t>(index.size()));
        check_close<TestType>(backend.to_host(gathered), host.to_host(host.gather_rows(hx, index)));
      }
    }
    SECTION("slice_rows: inner, empty and whole ranges") {
      const std::vector<std::pair<std::int64_t, std::int64_t>> ranges{{1, 4}, {2, 2}, {0, 5}, {5, 5}};
      for (const auto& [begin, end] : ranges) {
        const auto slice = backend.slice_rows(x, begin, end);
        CHECK(backend.rows(slice) == end - begin);
        check_close<TestType>(backend.to_host(slice), host.to_host(host.slice_rows(hx, begin, end)));
      }
    }
    SECTION("concat_rows: one part, and parts with an empty one") {
      const std::vector parts{backend.slice_rows(x, 3, 5), backend.slice_rows(x, 0, 0), backend.slice_rows(v, 0, 2),
                              backend.slice_rows(x, 1, 4)};
      const std::vector host_parts{host.slice_rows(hx, 3, 5), host.slice_rows(hx, 0, 0), host.slice_rows(hv, 0, 2),
                                   host.slice_rows(hx, 1, 4)};
      const auto joined = backend.concat_rows(std::span(parts));
      CHECK(backend.rows(joined) == 7);
      check_close<TestType>(backend.to_host(joined), host.to_host(host.concat_rows(std::span(host_parts))));
      const auto single = backend.concat_rows(std::span(parts).first(1));
      check_close<TestType>(backend.to_host(single), host.to_host(host_parts.front()));
    }
    SECTION("affine") {
      // dance_sde's coefficients at step 0 of {1, 0.5, 0}, and a pure copy and a pure velocity.
      const std::vector<std::pair<double, double>> coefficients{{0.9775, -0.5}, {1.0, 0.0}, {0.0, -2.5}};
      for (const auto& [a, c] : coefficients)
        check_close<TestType>(backend.to_host(backend.affine(a, x, c, v)), host.to_host(host.affine(a, hx, c, hv)));
    }
    SECTION("row_log_prob with a different std per row") {
      const std::vector<double> std{0.05, 0.3, 1.0, 2.5, 0.7};
      const std::vector<double> expected = host.row_log_prob(hx, hv, std);
      check_close<TestType>(backend.row_log_prob(x, v, std), expected);
      // log N(x; x, 1) = -0.5 log 2 pi for every row.
      const std::vector<double> ones(5, 1.0);
      check_close<TestType>(backend.row_log_prob(x, x, ones),
                            std::vector<double>(5, -0.5 * std::log(2.0 * std::numbers::pi)));
      // The reference is not trivially constant: the rows differ.
      CHECK(expected[0] != Approx(expected[1]).margin(1e-3));
    }
    SECTION("zero-row batches") {
      const auto none = backend.slice_rows(x, 2, 2);
      CHECK(backend.rows(backend.affine(1.0, none, 1.0, none)) == 0);
      CHECK(backend.row_log_prob(none, none, std::span<const double>()).empty());
    }
  }
}

TEMPLATE_LIST_TEST_CASE("backend: rejects what host_backend rejects, with a one-line invalid_input", "[conformance]",
                        conformance_backends) {
  TestType backend;
  const std::vector<double> six{1, 2, 3, 4, 5, 6}, four{1, 2, 3, 4};
  const auto x = backend.from_host(six, 3, latent_shape{{2}});
  const auto y = backend.from_host(four, 2, latent_shape{{2}});
  const auto z = backend.from_host(six, 2, latent_shape{{3}});
  const std::vector<std::int64_t> past{0, 3}, negative{-1};

  check_rejects([&] { (void)backend.from_host(six, 2, latent_shape{{2}}); });     // 6 values for 2 x 2
  check_rejects([&] { (void)backend.from_host(six, -3, latent_shape{{2}}); });    // negative rows
  check_rejects([&] { (void)backend.from_host(six, 3, latent_shape{{}}); });      // no dimension
  check_rejects([&] { (void)backend.from_host(six, 3, latent_shape{{2, 0}}); });  // empty dimension
  check_rejects([&] { (void)backend.gather_rows(x, past); });                     // index 3 of 3 rows
  check_rejects([&] { (void)backend.gather_rows(x, negative); });
  check_rejects([&] { (void)backend.slice_rows(x, 2, 1); });  // reversed
  check_rejects([&] { (void)backend.slice_rows(x, 1, 4); });  // past the end
  check_rejects([&] { (void)backend.slice_rows(x, -1, 1); });
  check_rejects([&] { (void)backend.concat_rows(std::span<const typename TestType::tensor>()); });
  const std::vector mixed{x, z};
  check_rejects([&] { (void)backend.concat_rows(std::span(mixed)); });  // shapes {2} and {3}
  check_rejects([&] { (void)backend.affine(1.0, x, 1.0, y); });         // 3 rows vs 2
  check_rejects([&] { (void)backend.affine(1.0, y, 1.0, z); });         // shape {2} vs {3}
  const std::vector<double> two_stds{1.0, 1.0}, zero_std{1.0, 0.0, 1.0},
      nan_std{1.0, 1.0, std::numeric_limits<double>::quiet_NaN()};
  check_rejects([&] { (void)backend.row_log_prob(x, x, two_stds); });  // 2 stds for 3 rows
  check_rejects([&] { (void)backend.row_log_prob(x, x, zero_std); });
  check_rejects([&] { (void)backend.row_log_prob(x, x, nan_std); });
  check_rejects([&] { (void)backend.row_log_prob(x, y, four); });  // 3 rows vs 2
}

namespace {

/// One rollout on backend B and the same on host_backend agree in every latent, log-prob and edge std.
template <class B, class Correlator, class S = dance_sde>
void check_rollout_matches_host(const tree_plan& given, const Correlator& correlator, std::int64_t max_batch,
                                const latent_shape& shape = latent_shape{{2, 3}}, double shift = 3.0,
                                const S& stepper = {}) {
  const sigma_schedule schedule = shifted_linear_schedule(given.steps, shift);
  const tree_plan plan = ode_where_noiseless(given, stepper, schedule);  // cps: its last step an ODE edge
  const std::vector<tree_info> trees{{.key = 0, .prompt = 1}, {.key = 7, .prompt = -2}};
  const rollout_options options{.max_batch = max_batch, .seed = 42, .iteration = 3};

  host_backend host;
  analytic_denoiser<host_backend> host_denoiser{.backend = &host, .shape = shape, .data_std = 0.5};
  const auto expected =
      rollout(host, host_denoiser, stepper, correlator, schedule, rollout_tree(plan, trees), shape, options);
  B backend;
  analytic_denoiser<B> denoiser{.backend = &backend, .shape = shape, .data_std = 0.5};
  const auto actual =
      rollout(backend, denoiser, stepper, correlator, schedule, rollout_tree(plan, trees), shape, options);

  CHECK(actual.evaluations == expected.evaluations);
  CHECK(actual.denoiser_calls == expected.denoiser_calls);
  REQUIRE(actual.latents.size() == expected.latents.size());
  for (std::size_t s = 0; s < actual.latents.size(); ++s) {
    INFO("latents at step " << s);
    CHECK(backend.rows(actual.latents[s]) == host.rows(expected.latents[s]));
    check_close<B>(backend.to_host(actual.latents[s]), host.to_host(expected.latents[s]));
  }
  {
    INFO("edge log-probs");
    const std::span<const double> got = actual.tree.log_probs(), want = expected.tree.log_probs();
    check_close<B>({got.begin(), got.end()}, {want.begin(), want.end()});
  }
  {
    INFO("edge stds");
    check_close<B>(actual.edge_std, expected.edge_std);
  }
  {
    INFO("leaf latents");
    check_close<B>(backend.to_host(leaf_latents(backend, actual)), host.to_host(leaf_latents(host, expected)));
  }

  // The reference is not degenerate: trained edges have non-zero log-probs and the leaves differ.
  int trained = 0;
  for (std::int32_t n = 0; n < expected.tree.node_count(); ++n)
    if (!expected.tree.is_root(n) && expected.tree.kind(n) == edge_kind::sde) {
      CHECK(expected.tree.log_prob(n) != 0.0);
      ++trained;
    }
  CHECK(trained > 0);
  const std::span<const std::int32_t> leaves = expected.tree.leaves();
  CHECK(latent_of(host, expected, leaves.front()) != latent_of(host, expected, leaves.back()));
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("backend: a full rollout reproduces host_backend's latents and log-probs",
                        "[conformance][rollout]", conformance_backends) {
  // Dense BranchGRPO tree over 20 steps: splits at 0, 3, 6, 9 (16 leaves per tree), 2 trees.
  const tree_plan dense = split_schedule::dense()(20);
  SECTION("independent siblings, one denoiser call per step") {
    check_rollout_matches_host<TestType>(dense, independent{}, 64);
  }
  SECTION("correlated siblings (s = 4), chunks of 5 rows (slice_rows + concat_rows)") {
    check_rollout_matches_host<TestType>(dense, correlated{4.0}, 5);
  }
  SECTION("Flow-GRPO-Fast: ODE prefix, a split into 4, ODE suffix") {
    const tree_plan fast = flow_grpo_fast{.group_size = 4, .split_step = 2, .sde_steps = 2}(6);
    check_rollout_matches_host<TestType>(fast, correlated{4.0}, 3);
  }
  SECTION("video latents [C, F, H, W] = {4, 3, 4, 4} with Wan's time shift 5: no special case") {
    check_rollout_matches_host<TestType>(dense, correlated{4.0}, 7, video_shape, 5.0);
  }
  SECTION("cps (scored with its own std: keyed steps carry log_prob_stds) and per_layer_eta on scaled splits") {
    check_rollout_matches_host<TestType>(dense, correlated{4.0}, 64, latent_shape{{2, 3}}, 3.0, cps{});
    check_rollout_matches_host<TestType>(dense, scaled{}, 64, latent_shape{{2, 3}}, 3.0,
                                         per_layer_eta{.etas = {0.8, 0.5}, .sampler = layer_sampler::cps});
  }
}

namespace {

/// A policy every backend can run: v(x) = theta x, in double on the host. accumulate takes the rows' log-probs
/// from the backend's row_log_prob and the gradient in closed form: with mean = a x + c theta x,
///   d log-prob_r / d theta = mean_i (next_i - mean_i) c x_i / std_r^2.
template <Backend B>
struct linear_policy {
  B* backend = nullptr;
  latent_shape shape;
  double theta = -0.5;
  double lr = 0.05;
  double gradient = 0;

  typename B::tensor operator()(const typename B::tensor& x, const denoise_batch&) {
    std::vector<double> values = backend->to_host(x);
    for (double& value : values) value *= theta;
    return backend->from_host(values, backend->rows(x), shape);
  }
  std::vector<double> accumulate(const edge_batch<typename B::tensor>& edges, const loss_gradient_fn& grad_fn) {
    const auto mean = backend->affine(edges.coeffs.x_coeff, edges.x, edges.coeffs.velocity_coeff * theta, edges.x);
    std::vector<double> log_probs = backend->row_log_prob(edges.next, mean, edges.std);
    const std::vector<double> weights = grad_fn(log_probs);
    const std::vector<double> xs = backend->to_host(edges.x), nexts = backend->to_host(edges.next),
                              means = backend->to_host(mean);
    const auto n = static_cast<std::size_t>(shape.elements());
    for (std::size_t r = 0; r < weights.size(); ++r) {
      double sum = 0;
      for (std::size_t i = r * n; i < (r + 1) * n; ++i)
        sum += (nexts[i] - means[i]) * edges.coeffs.velocity_coeff * xs[i];
      gradient += weights[r] * sum / (static_cast<double>(n) * edges.std[r] * edges.std[r]);
    }
    return log_probs;
  }
  void apply_update() {
    theta -= lr * gradient;
    gradient = 0;
  }
};

/// Per row: -(mean of the latent - 0.1 prompt)^2, from the host values.
template <Backend B>
struct mean_reward {
  B* backend = nullptr;
  std::vector<double> operator()(const typename B::tensor& leaves, std::span<const std::int64_t> prompts) {
    const std::vector<double> values = backend->to_host(leaves);
    const std::size_t n = prompts.empty() ? 0 : values.size() / prompts.size();
    std::vector<double> out(prompts.size());
    for (std::size_t r = 0; r < out.size(); ++r) {
      double sum = 0;
      for (std::size_t i = r * n; i < (r + 1) * n; ++i) sum += values[i];
      const double gap = sum / static_cast<double>(n) - 0.1 * static_cast<double>(prompts[r]);
      out[r] = -gap * gap;
    }
    return out;
  }
};

static_assert(Policy<linear_policy<host_backend>, host_backend>);
static_assert(Reward<mean_reward<host_backend>, host_backend>);

/// One BranchGRPO iteration (dense tree over 20 steps, 2 prompts, 2 updates) on `shape` with backend B.
template <class B>
std::pair<double, iteration_stats> train_once(const latent_shape& shape) {
  B backend;
  linear_policy<B> policy{.backend = &backend, .shape = shape};
  mean_reward<B> reward{.backend = &backend};
  auto recipe = branch_method();
  const std::vector<std::int64_t> prompts{1, 3};
  const iteration_stats stats =
      train_iteration(backend, policy, reward, recipe, shifted_linear_schedule(20, 5.0), shape, prompts, 0,
                      training_options{.max_batch = 16, .seed = 9, .updates_per_iteration = 2});
  return {policy.theta, stats};
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("backend: a training iteration on video latents gives host_backend's update",
                        "[conformance][train]", conformance_backends) {
  const auto [theta, stats] = train_once<TestType>(video_shape);
  const auto [host_theta, host_stats] = train_once<host_backend>(video_shape);
  CHECK(stats.rollout_evaluations == host_stats.rollout_evaluations);
  CHECK(stats.edges_trained == host_stats.edges_trained);
  CHECK(stats.edges_trained > 0);
  check_close<TestType>({stats.reward_mean, stats.loss, theta}, {host_stats.reward_mean, host_stats.loss, host_theta});
  CHECK(host_theta != -0.5);  // the update moved the parameter
}

// ---- Adapter-specific: a hand-assembled tensor that disagrees with its shape throws, never reads past. -------
#if defined(BRANCHGRPO_CONFORMANCE_EIGEN)
TEST_CASE("eigen_backend rejects a tensor whose columns disagree with its shape", "[conformance][eigen]") {
  eigen_backend backend;
  // 2 rows of 3 columns claiming latents of shape {2}.
  const eigen_tensor bad{.values = eigen_tensor::array::Zero(2, 3), .shape = latent_shape{{2}}};
  check_rejects([&] { (void)backend.to_host(bad); });
  check_rejects([&] { (void)backend.slice_rows(bad, 0, 1); });
  const eigen_tensor good{.values = eigen_tensor::array::Zero(2, 3), .shape = latent_shape{{3}}};
  CHECK(backend.to_host(good) == std::vector<double>(6, 0.0));
}
#endif
#if defined(BRANCHGRPO_CONFORMANCE_XTENSOR)
TEST_CASE("xtensor_backend keeps the latent's shape and rejects a tensor without a batch axis",
          "[conformance][xtensor]") {
  xtensor_backend backend;
  const std::vector<double> values = keyed_values(3, 2, latent_shape{{2, 3, 5}});
  const xtensor_tensor x = backend.from_host(values, 2, latent_shape{{2, 3, 5}});
  CHECK(x.values.dimension() == 4);
  CHECK(x.shape() == latent_shape{{2, 3, 5}});
  CHECK(x.values(1, 0, 2, 4) == values[30 + 2 * 5 + 4]);  // row 1, element (0, 2, 4) of a {2, 3, 5} latent
  const xtensor_tensor scalar{};                          // a 0-d array: no batch axis
  check_rejects([&] { (void)backend.to_host(scalar); });
  const xtensor_tensor no_latent{.values = xtensor_tensor::array::from_shape(std::vector<std::size_t>{3})};
  check_rejects([&] { (void)backend.rows(backend.slice_rows(no_latent, 0, 1)); });
}
#endif
#if defined(BRANCHGRPO_CONFORMANCE_TORCH)
TEST_CASE("torch_backend rejects tensors without a batch axis or of another kind", "[conformance][torch]") {
  torch_backend backend;
  check_rejects([&] { (void)backend.rows(torch::zeros({3})); });                       // no latent axis
  check_rejects([&] { (void)backend.to_host(torch::Tensor()); });                      // undefined
  check_rejects([&] { (void)backend.to_host(torch::zeros({2, 3}, torch::kInt64)); });  // not floating point
  const std::vector<double> stds{1.0, 1.0};
  check_rejects([&] { (void)backend.row_log_prob(torch::zeros({2, 3}), torch::zeros({2, 4}), stds); });
  // A [rows, dims...] tensor made by LibTorch itself is a valid operand.
  const torch::Tensor ones = torch::ones({2, 3});
  CHECK(backend.to_host(ones) == std::vector<double>(6, 1.0));
}

TEST_CASE("torch_backend in bfloat16: round trip and log-probs within bfloat16 rounding", "[conformance][torch]") {
  torch_backend backend{.device = torch::kCPU, .dtype = torch::kBFloat16};
  const latent_shape shape{{3, 4}};
  const std::vector<double> xs = keyed_values(1, 4, shape), vs = keyed_values(2, 4, shape);
  const auto x = backend.from_host(xs, 4, shape), v = backend.from_host(vs, 4, shape);
  CHECK(x.scalar_type() == torch::kBFloat16);
  // bfloat16 keeps 8 significant bits: relative rounding error at most 2^-8.
  const std::vector<double> round_trip = backend.to_host(x);
  for (std::size_t i = 0; i < xs.size(); ++i) CHECK(round_trip[i] == Approx(xs[i]).epsilon(0x1p-8).margin(1e-30));
  // affine in float32, rounded once to bfloat16: within 2^-8 relative of 0.9775 x - 0.5 v (plus the inputs'
  // own rounding, so 2^-7 of the magnitudes).
  host_backend host;
  const auto hx = host.from_host(xs, 4, shape), hv = host.from_host(vs, 4, shape);
  const std::vector<double> got = backend.to_host(backend.affine(0.9775, x, -0.5, v));
  const std::vector<double> want = host.to_host(host.affine(0.9775, hx, -0.5, hv));
  for (std::size_t i = 0; i < got.size(); ++i)
    CHECK(got[i] == Approx(want[i]).margin(0x1p-7 * (std::abs(xs[i]) + std::abs(vs[i]))));
  // Log-probs in float64 of the bfloat16 values: equal to the host's on the rounded values (to 1e-12), and
  // within bfloat16 tolerance of the host's on the exact values (std 1: the log-prob moves by about
  // |x - v| * |dx| per element, at most ~4 * 2^-8 here).
  const std::vector<double> stds{0.3, 1.0, 1.0, 2.0};
  const std::vector<double> log_prob = backend.row_log_prob(x, v, stds);
  const std::vector<double> rounded = host.row_log_prob(host.from_host(backend.to_host(x), 4, shape),
                                                        host.from_host(backend.to_host(v), 4, shape), stds);
  const std::vector<double> exact = host.row_log_prob(hx, hv, stds);
  for (std::size_t r = 0; r < stds.size(); ++r) {
    CHECK(log_prob[r] == Approx(rounded[r]).margin(1e-12));
    CHECK(log_prob[r] == Approx(exact[r]).epsilon(0.02));
    CHECK(log_prob[r] != exact[r]);  // the rounding is real: bfloat16 is not float64 in disguise
  }
}
#endif
