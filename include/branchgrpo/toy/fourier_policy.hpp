#pragma once
// The toy model: a velocity linear in fixed random Fourier features, v = W phi(x, sigma, c(prompt)).
// Its log-prob is quadratic in W, so the policy gradient is exact and closed-form: the whole BranchGRPO
// method trains on a CPU in seconds (docs/toy.md).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <span>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/schedule/steppers.hpp"
#include "branchgrpo/toy/adam.hpp"
#include "branchgrpo/toy/ridge.hpp"
#include "branchgrpo/toy/ring_data.hpp"
#include "branchgrpo/training/concepts.hpp"

namespace branchgrpo {

/// Elements of one toy latent: a point in the plane (latent shape {2}).
inline constexpr std::int64_t toy_dimension = 2;

/// The toy's latent shape, {2}.
inline latent_shape toy_latent_shape() { return {{toy_dimension}}; }

/// Hyperparameters of the toy model and of its base fit. Defaults are tuned so that the base model's
/// 20-step ODE samples land on the ring and GRPO moves them to the prompted mode in a few dozen updates.
struct fourier_options {
  int features = 256;             ///< F, random Fourier features
  double x_frequency = 2.0;       ///< std of the frequencies on the latent's two coordinates
  double sigma_frequency = 3.0;   ///< std of the frequency on the noise level sigma
  double prompt_frequency = 1.0;  ///< std of the frequencies on the prompt embedding's two coordinates
  double prompt_scale = 1.0;      ///< |c|: the prompt embedding is prompt_scale * (cos, sin)(2 pi p / modes)
  ring_mixture ring{};            ///< the data of the base fit; its modes name the prompts' targets
  std::int64_t fit_samples = 8192;
  double ridge = 1e-5;        ///< lambda of the base fit (per-sample mean squared error + lambda |W|^2)
  adam optimizer{.lr = 0.1};  ///< base W: rms 1.6, max 7.4 (seed 7); Adam moves each entry ~lr per update

  void validate() const {
    require(features >= 1, "fourier_options features must be at least 1, got ", features);
    require(std::isfinite(x_frequency) && x_frequency >= 0.0, "fourier_options x_frequency must be >= 0, got ",
            x_frequency);
    require(std::isfinite(sigma_frequency) && sigma_frequency >= 0.0,
            "fourier_options sigma_frequency must be >= 0, got ", sigma_frequency);
    require(std::isfinite(prompt_frequency) && prompt_frequency >= 0.0,
            "fourier_options prompt_frequency must be >= 0, got ", prompt_frequency);
    require(std::isfinite(prompt_scale), "fourier_options prompt_scale must be finite, got ", prompt_scale);
    ring.validate();
    require(fit_samples >= 1 && fit_samples <= std::int64_t{0xFFFFFFFF},
            "fourier_options fit_samples must be in [1, 2^32), got ", fit_samples);
    require(std::isfinite(ridge) && ridge > 0.0, "fourier_options ridge must be positive and finite, got ", ridge);
  }
  friend bool operator==(const fourier_options&, const fourier_options&) = default;
};

/// phi_j(z) = sqrt(2 / F) cos(w_j . z + b_j), z = (x_0, x_1, sigma, c_0, c_1), j < F. Feature j is drawn from
/// toy_normals(seed, feature, j) (6 elements): w_j = (x_frequency n_0, x_frequency n_1, sigma_frequency n_2,
/// prompt_frequency n_3, prompt_frequency n_4), b_j = 2 pi Phi(n_5).
/// Example: F 1, w_0 = {1, 0, 0, 0, 0}, b_0 = 0, z = {pi / 3, ...} -> phi = {sqrt 2 cos(pi / 3)} = {0.707107}.
struct fourier_features {
  static constexpr std::size_t inputs = 5;
  std::vector<double> frequencies;  ///< F x 5, row-major
  std::vector<double> phases;       ///< F

  [[nodiscard]] static fourier_features draw(std::uint64_t seed, const fourier_options& options) {
    options.validate();
    const auto count = static_cast<std::size_t>(options.features);
    fourier_features out{.frequencies = std::vector<double>(count * inputs), .phases = std::vector<double>(count)};
    const std::array<double, inputs> scale = {options.x_frequency, options.x_frequency, options.sigma_frequency,
                                              options.prompt_frequency, options.prompt_frequency};
    std::array<double, inputs + 1> draws{};
    for (std::size_t j = 0; j < count; ++j) {
      toy_normals(seed, toy_draw::feature, static_cast<std::uint32_t>(j), draws);
      for (std::size_t i = 0; i < inputs; ++i) out.frequencies[j * inputs + i] = scale[i] * draws[i];
      out.phases[j] = 2.0 * std::numbers::pi * normal_to_uniform(draws[inputs]);
    }
    return out;
  }

  [[nodiscard]] std::size_t size() const { return phases.size(); }

  /// phi(z) into `out` (size() values); no allocation.
  void evaluate(const std::array<double, inputs>& z, std::span<double> out) const {
    const double amplitude = std::sqrt(2.0 / static_cast<double>(phases.size()));
    const double* w = frequencies.data();
    for (std::size_t j = 0; j < phases.size(); ++j, w += inputs)
      out[j] = amplitude * std::cos(w[0] * z[0] + w[1] * z[1] + w[2] * z[2] + w[3] * z[3] + w[4] * z[4] + phases[j]);
  }

  friend bool operator==(const fourier_features&, const fourier_features&) = default;
};

/// The toy flow-matching model on backend B (models Denoiser<B> and Policy<B>):
///   v(x, sigma, p) = W phi(x, sigma, c(p)),  W: 2 x F,  c(p) = prompt_scale (cos, sin)(2 pi (p mod M) / M).
/// The base W is the ridge fit of flow-matching targets: x0 from options.ring, eps ~ N(0, I),
/// sigma ~ U(0, 1), x = (1 - sigma) x0 + sigma eps, target eps - x0, and a prompt embedding drawn
/// independently of x0 (so the base ignores the prompt); sample i uses toy_normals(seed, fit_sample, i).
/// Training: accumulate() adds the exact gradient of sum_rows w_row * log-prob_row, where
///   log-prob = gaussian log-prob averaged over the D = 2 elements, mean = a x + c v, and
///   d log-prob / d W[k, :] = c (next_k - mean_k) / (D std^2) phi;
/// apply_update() takes one Adam step (options.optimizer) and zeroes the gradient.
/// Reference (ReferencePolicy<B>, the KL term): reference_velocity() is v with the fitted base W.
/// Tensors cross to the host (to_host / from_host) for the features; the mean and log-prob are computed by
/// the backend's own affine and row_log_prob, exactly as the rollout engine does, so for unchanged W an
/// edge's log-prob in accumulate() is bit-identical to the one the rollout recorded (ratio exactly 1).
/// Example: make_toy_policy(7), then Euler ODE over shifted_linear_schedule(20) from 800 keyed N(0, I) roots:
///   mean distance to the nearest mode 0.40 (the roots: ~1), two thirds within 0.5 of a mode, every mode
///   6.5-11% of the samples. 20 group-relative policy-gradient updates (8 prompts x 8 chains, lr 0.1) raise
///   the held-out mean mode_reward from 0.14 to 0.30 (tests/unit/test_toy.cpp).
/// @pre latents of 2 elements per row; finite latents, sigma in [0, 1], one prompt per row.
/// @post accumulate() returns one log-prob per row, equal to the backend's row_log_prob of the same edge.
template <Backend B>
class fourier_policy {
 public:
  using tensor = typename B::tensor;

  /// Draws the features and fits the base W from `seed` (deterministic: same seed and options, same W).
  explicit fourier_policy(std::uint64_t seed, fourier_options options = {}, B backend = {})
      : options_(std::move(options)), backend_(std::move(backend)), features_(fourier_features::draw(seed, options_)) {
    base_ = fit_base(seed);
    reset_to_base();
  }

  /// Denoiser: v for every row of x at noise level batch.sigma, conditioned on batch.prompts.
  tensor operator()(const tensor& x, const denoise_batch& batch) { return velocities(weights_, x, batch); }

  /// The reference model's velocity: v with the fitted base W (the KL term's reference).
  tensor reference_velocity(const tensor& x, const denoise_batch& batch) { return velocities(base_, x, batch); }

  /// Policy: the rows' log-probs under the current W; adds the gradient of sum_rows w_row log-prob_row
  /// (w = gradient(log-probs)) to the gradient buffer. O(rows * F), no per-row allocation.
  std::vector<double> accumulate(const edge_batch<tensor>& edges, const loss_gradient_fn& gradient) {
    const std::int64_t rows = backend_.rows(edges.x);
    const std::vector<double> x = backend_.to_host(edges.x);
    check_rows(x, rows, "edge batch x");
    require(backend_.rows(edges.next) == rows, "edge batch has ", rows, " rows of x and ", backend_.rows(edges.next),
            " rows of next");
    const std::vector<double> next_host = backend_.to_host(edges.next);
    check_rows(next_host, rows, "edge batch next");
    require(
        static_cast<std::int64_t>(edges.std.size()) == rows && static_cast<std::int64_t>(edges.prompts.size()) == rows,
        "edge batch of ", rows, " rows has ", edges.std.size(), " stds and ", edges.prompts.size(), " prompts");
    check_sigma(edges.sigma);
    require(std::isfinite(edges.coeffs.x_coeff) && std::isfinite(edges.coeffs.velocity_coeff),
            "edge batch coefficients must be finite, got x_coeff ", edges.coeffs.x_coeff, " and velocity_coeff ",
            edges.coeffs.velocity_coeff);
    if (rows == 0) {
      (void)gradient(std::span<const double>());
      return {};
    }

    // Features of every row are kept for the gradient pass (one buffer, reused across calls).
    const auto count = static_cast<std::size_t>(rows);
    const std::size_t f = features_.size();
    batch_phi_.resize(count * f);
    std::vector<double> v(count * dim);
    for (std::size_t r = 0; r < count; ++r)
      velocity_row(weights_, &x[r * dim], edges.sigma, edges.prompts[r],
                   std::span<double>(batch_phi_).subspan(r * f, f), &v[r * dim]);
    const tensor mean = backend_.affine(edges.coeffs.x_coeff, edges.x, edges.coeffs.velocity_coeff,
                                        backend_.from_host(v, rows, toy_latent_shape()));
    std::vector<double> log_probs = backend_.row_log_prob(edges.next, mean, edges.std);

    const std::vector<double> weights = gradient(log_probs);
    require(weights.size() == count, "loss gradient returned ", weights.size(), " weights for ", count, " rows");
    for (std::size_t r = 0; r < count; ++r)
      require(std::isfinite(weights[r]), "loss gradient weight[", r, "] = ", weights[r], " is not finite");

    const std::vector<double> mean_host = backend_.to_host(mean);
    const double d = static_cast<double>(dim);
    for (std::size_t r = 0; r < count; ++r) {
      const double scale = weights[r] * edges.coeffs.velocity_coeff / (d * edges.std[r] * edges.std[r]);
      const double* phi = batch_phi_.data() + r * f;
      for (std::size_t k = 0; k < dim; ++k) {
        const double g = scale * (next_host[r * dim + k] - mean_host[r * dim + k]);
        double* row = gradient_.data() + k * f;
        for (std::size_t j = 0; j < f; ++j) row[j] += g * phi[j];
      }
    }
    return log_probs;
  }

  /// One Adam step on the accumulated gradient, then zeroes it.
  /// DataParallelPolicy: the gradient buffer becomes its sum over the communicator's ranks.
  template <Communicator C>
  void all_reduce_gradients(C& communicator) {
    communicator.all_reduce_sum(gradient_);
  }

  void apply_update() {
    options_.optimizer(optimizer_state_, weights_, gradient_);
    std::fill(gradient_.begin(), gradient_.end(), 0.0);
  }

  /// Replaces the optimizer's options for the next updates (its moments are kept), e.g. another learning rate for
  /// an ablation; the base W does not depend on them.
  /// Example: policy.set_optimizer({.lr = 0.2}) -> policy.options().optimizer.lr == 0.2.
  /// @pre the options are valid (else invalid_input naming the value, before anything changes).
  void set_optimizer(const adam& optimizer) {
    validate_parameters(optimizer, "adam");
    options_.optimizer = optimizer;
  }

  /// Back to the fitted base: W = base, zero gradient, fresh Adam state.
  void reset_to_base() {
    weights_ = base_;
    gradient_.assign(base_.size(), 0.0);
    optimizer_state_ = {};
  }

  /// v of one point (host doubles), as the denoiser computes it.
  [[nodiscard]] std::array<double, 2> velocity(std::array<double, 2> x, double sigma, std::int64_t prompt) {
    check_sigma(sigma);
    std::array<double, 2> v{};
    velocity_row(weights_, x.data(), sigma, prompt, phi_scratch(), v.data());
    return v;
  }

  /// W, 2 x F row-major (mutable for tests and checkpoints).
  [[nodiscard]] std::span<const double> parameters() const { return weights_; }
  [[nodiscard]] std::span<double> parameters() { return weights_; }
  [[nodiscard]] std::span<const double> base_parameters() const { return base_; }
  [[nodiscard]] std::span<const double> gradient() const { return gradient_; }
  [[nodiscard]] const adam_state& optimizer_state() const { return optimizer_state_; }
  [[nodiscard]] const fourier_features& features() const { return features_; }
  [[nodiscard]] const fourier_options& options() const { return options_; }
  [[nodiscard]] B& backend() { return backend_; }

 private:
  static constexpr std::size_t dim = toy_dimension;

  fourier_options options_;
  B backend_;
  fourier_features features_;
  std::vector<double> base_;
  std::vector<double> weights_;
  std::vector<double> gradient_;
  adam_state optimizer_state_;
  std::vector<double> scratch_;    // phi of one row
  std::vector<double> batch_phi_;  // phi of every row of an edge batch

  std::span<double> phi_scratch() {
    scratch_.resize(features_.size());
    return scratch_;
  }

  [[nodiscard]] std::array<double, fourier_features::inputs> inputs(const double* x, double sigma,
                                                                    std::int64_t prompt) const {
    const auto c = options_.ring.direction(prompt);
    return {x[0], x[1], sigma, options_.prompt_scale * c[0], options_.prompt_scale * c[1]};
  }

  // Every row of x under weights w (the current ones or the base).
  tensor velocities(std::span<const double> w, const tensor& x, const denoise_batch& batch) {
    const std::vector<double> host = backend_.to_host(x);
    const std::int64_t rows = check_rows(host, backend_.rows(x), "denoiser input");
    check_sigma(batch.sigma);
    require(static_cast<std::int64_t>(batch.prompts.size()) == rows, "fourier_policy got ", batch.prompts.size(),
            " prompts for ", rows, " rows");
    std::vector<double> v(host.size());
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto at = static_cast<std::size_t>(r) * dim;
      velocity_row(w, &host[at], batch.sigma, batch.prompts[static_cast<std::size_t>(r)], phi_scratch(), &v[at]);
    }
    return backend_.from_host(v, rows, toy_latent_shape());
  }

  // The one velocity computation shared by the denoiser and accumulate(): bit-identical results.
  void velocity_row(std::span<const double> weights, const double* x, double sigma, std::int64_t prompt,
                    std::span<double> phi, double* v) const {
    features_.evaluate(inputs(x, sigma, prompt), phi);
    const std::size_t f = features_.size();
    for (std::size_t k = 0; k < dim; ++k) {
      const double* w = weights.data() + k * f;
      double sum = 0.0;
      for (std::size_t j = 0; j < f; ++j) sum += w[j] * phi[j];
      v[k] = sum;
    }
  }

  std::vector<double> fit_base(std::uint64_t seed) const {
    const std::size_t f = features_.size();
    ridge_regression ridge(f, dim);
    std::vector<double> phi(f);
    std::array<double, 8> draws{};
    const ring_mixture& ring = options_.ring;
    for (std::int64_t i = 0; i < options_.fit_samples; ++i) {
      toy_normals(seed, toy_draw::fit_sample, static_cast<std::uint32_t>(i), draws);
      const auto x0 = ring.point(std::span<const double, 3>(draws.data(), 3));
      const double eps[2] = {draws[3], draws[4]};
      const double sigma = normal_to_uniform(draws[5]);
      const auto prompt = static_cast<std::int64_t>(
          std::min(ring.modes - 1, static_cast<int>(normal_to_uniform(draws[6]) * ring.modes)));
      const double x[2] = {(1.0 - sigma) * x0[0] + sigma * eps[0], (1.0 - sigma) * x0[1] + sigma * eps[1]};
      const std::array<double, 2> target = {eps[0] - x0[0], eps[1] - x0[1]};
      features_.evaluate(inputs(x, sigma, prompt), phi);
      ridge.add(phi, target);
    }
    return ridge.solve(options_.ridge);
  }

  std::int64_t check_rows(const std::vector<double>& host, std::int64_t rows, const char* what) const {
    require(static_cast<std::int64_t>(host.size()) == rows * toy_dimension, "fourier_policy ", what, " has ",
            host.size(), " values for ", rows, " rows; the toy's latents have ", toy_dimension, " elements");
    for (std::size_t i = 0; i < host.size(); ++i)
      require(std::isfinite(host[i]), "fourier_policy ", what, " row ", i / dim, " element ", i % dim, " is ", host[i]);
    return rows;
  }

  static void check_sigma(double sigma) {
    require(std::isfinite(sigma) && sigma >= 0.0 && sigma <= 1.0, "fourier_policy sigma ", sigma, " is outside [0, 1]");
  }
};

}  // namespace branchgrpo
