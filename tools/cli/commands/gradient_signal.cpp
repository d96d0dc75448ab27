// `branchgrpo gradient-signal`: how much of one iteration's policy gradient is signal, per method and per band of
// denoising steps, on the toy's base model. It explains per-iteration differences between methods that reward
// curves only show: an iteration whose gradient is mostly noise moves the policy less far in the useful direction.
//
// For each method, D draws (iteration keys 0 .. D - 1, the same prompts) each give one iteration's gradient g_d at
// the base weights (train_iteration with a policy that records its gradient instead of stepping), split by the
// step of the edges that produced it. Per band b of steps, over the draws:
//   mean gradient   m_b = (1/D) sum_d g_d,b
//   noise energy    S_b = (1/(D-1)) sum_d |g_d,b - m_b|^2          (the trace of the gradient's covariance)
//   signal energy   |G_b|^2 ~ |m_b|^2 - S_b / D                     (unbiased for the squared norm of E g)
//   signal fraction rho_b = |G_b|^2 / (|G_b|^2 + S_b)               (1: every draw points the same way)
//   alignment       cos(m_b, dance's m_b)                           (1: the same expected direction as dance)
//   |A|             the mean |advantage| of the band's trained edges (read off the update's weights)
// Bands follow the dense tree's depths: steps 0-2 (2 nodes per tree), 3-5 (4), 6-8 (8), 9-19 (16).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/rollout/host_backend.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/toy.hpp"
#include "branchgrpo/training/loop.hpp"
#include "branchgrpo/training/trainer.hpp"
#include "cli/commands.hpp"
#include "cli/options/number_options.hpp"
#include "cli/runs/method_runs.hpp"
#include "cli/runs/method_variant.hpp"

namespace branchgrpo::cli {
namespace {

struct signal_options {
  std::vector<std::string> methods;  // none: dance, branch and branch:scope=per_batch
  int draws = 64;
  std::uint64_t seed = 7;
  bool json = false;
};

constexpr int toy_steps = 20;
constexpr int toy_trees = 8;  // every ring mode once per iteration, as `toy` and `compare` train
// The dense tree's depth bands: [first step, end step) and the nodes per tree at those depths.
struct step_band {
  int first, end, nodes_per_tree;
};
constexpr std::array<step_band, 4> bands = {{{0, 3, 2}, {3, 6, 4}, {6, 9, 8}, {9, toy_steps, 16}}};

std::size_t band_of(int step) {
  for (std::size_t b = 0; b < bands.size(); ++b)
    if (step < bands[b].end) return b;
  fail("step ", step, " is past the toy's ", toy_steps, " steps");
}

// The toy policy at its base weights, recording each update's gradient per band instead of stepping: apply_update()
// moves the accumulated gradient into `gradients` and resets the policy to its base (weights, zero gradient).
struct gradient_recorder {
  fourier_policy<host_backend> policy;
  std::array<std::vector<double>, bands.size()> gradients{};
  std::array<double, bands.size()> weight_sums{};  // sum of |d loss / d log-prob| over the band's edges
  std::array<std::int64_t, bands.size()> edges{};

  host_backend::tensor operator()(const host_backend::tensor& x, const denoise_batch& batch) {
    return policy(x, batch);
  }

  std::vector<double> accumulate(const edge_batch<host_backend::tensor>& batch, const loss_gradient_fn& gradient) {
    const std::size_t b = band_of(batch.step);
    const std::vector<double> before(policy.gradient().begin(), policy.gradient().end());
    std::vector<double> log_probs = policy.accumulate(batch, loss_gradient_fn([&](std::span<const double> values) {
                                                        std::vector<double> weights = gradient(values);
                                                        for (const double w : weights) weight_sums[b] += std::abs(w);
                                                        edges[b] += static_cast<std::int64_t>(weights.size());
                                                        return weights;
                                                      }));
    std::vector<double>& band = gradients[b];
    band.resize(before.size(), 0.0);
    for (std::size_t i = 0; i < before.size(); ++i) band[i] += policy.gradient()[i] - before[i];
    return log_probs;
  }

  void apply_update() { policy.reset_to_base(); }

  void clear() {
    for (std::size_t b = 0; b < bands.size(); ++b) {
      gradients[b].assign(policy.parameters().size(), 0.0);
      weight_sums[b] = 0;
      edges[b] = 0;
    }
  }
};

double dot(std::span<const double> a, std::span<const double> b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// One band's draws, summarized.
struct band_signal {
  std::vector<double> mean;
  double signal = 0, noise = 0, fraction = 0, alignment = 1, advantage = 0;
};

struct method_signal {
  std::string label;
  std::array<band_signal, bands.size()> band;
  band_signal all;
};

// The statistics of D gradient draws (draws[d]: one vector).
band_signal summarize(const std::vector<std::vector<double>>& draws) {
  band_signal out;
  const auto d = static_cast<double>(draws.size());
  out.mean.assign(draws.front().size(), 0.0);
  for (const auto& g : draws)
    for (std::size_t i = 0; i < g.size(); ++i) out.mean[i] += g[i] / d;
  for (const auto& g : draws)
    for (std::size_t i = 0; i < g.size(); ++i) out.noise += (g[i] - out.mean[i]) * (g[i] - out.mean[i]) / (d - 1);
  out.signal = std::max(0.0, dot(out.mean, out.mean) - out.noise / d);
  out.fraction = out.signal + out.noise > 0 ? out.signal / (out.signal + out.noise) : 0.0;
  return out;
}

method_signal measure(const method_variant& variant, const fourier_policy<host_backend>& base,
                      const signal_options& options) {
  method_signal out{.label = variant.label, .band = {}, .all = {}};
  gradient_recorder recorder{.policy = base};
  // The variant's recipe and settings (method_overrides.hpp's table); its lr has no effect: nothing steps.
  variant_run run = make_variant_run(variant, base.options().optimizer.lr);
  std::array<std::vector<std::vector<double>>, bands.size()> draws;
  std::vector<std::vector<double>> totals;
  std::array<double, bands.size()> advantage_sums{};
  std::array<std::int64_t, bands.size()> edge_counts{};
  mode_reward<> reward;
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(toy_steps);
  const prompt_schedule prompts{.prompt_count = toy_runs::eval_modes, .per_iteration = toy_trees};
  for (int d = 0; d < options.draws; ++d) {
    recorder.clear();
    const training_options training{.max_batch = 64,
                                    .seed = options.seed,
                                    .updates_per_iteration = run.updates,
                                    .total_iterations = options.draws,
                                    .loss = run.loss};
    const iteration_stats stats =
        train_iteration(backend, recorder, reward, run.recipe, schedule, toy_latent_shape(), prompts(0), d, training);
    std::vector<double> total(recorder.gradients.front().size(), 0.0);
    for (std::size_t b = 0; b < bands.size(); ++b) {
      draws[b].push_back(recorder.gradients[b]);
      for (std::size_t i = 0; i < total.size(); ++i) total[i] += recorder.gradients[b][i];
      // |w| = |A| / (trained edges) at ratio 1, the first update's.
      advantage_sums[b] += recorder.weight_sums[b] * static_cast<double>(stats.edges_trained);
      edge_counts[b] += recorder.edges[b];
    }
    totals.push_back(std::move(total));
  }
  for (std::size_t b = 0; b < bands.size(); ++b) {
    out.band[b] = summarize(draws[b]);
    out.band[b].advantage = edge_counts[b] > 0 ? advantage_sums[b] / static_cast<double>(edge_counts[b]) : 0.0;
  }
  out.all = summarize(totals);
  return out;
}

double cosine(std::span<const double> a, std::span<const double> b) {
  const double norms = std::sqrt(dot(a, a) * dot(b, b));
  return norms > 0 ? dot(a, b) / norms : 0.0;
}

void run_gradient_signal(const signal_options& options) {
  std::vector<std::string> entries = options.methods;
  if (entries.empty()) entries = {"branch", "branch:scope=per_batch"};
  std::vector<method_variant> methods = {parse_method_variant("dance")};
  for (const std::string& entry : entries) {
    method_variant variant = parse_method_variant(entry);
    if (variant.plain() && variant.method == "dance") continue;  // dance is the reference, measured first
    for (const method_variant& earlier : methods)
      require(earlier.label != variant.label, "--methods: '", entry, "' is listed twice");
    methods.push_back(std::move(variant));
  }
  const fourier_policy<host_backend> base = make_toy_policy(options.seed);
  std::vector<method_signal> results;
  for (const method_variant& variant : methods) results.push_back(measure(variant, base, options));
  for (method_signal& m : results) {
    for (std::size_t b = 0; b < bands.size(); ++b)
      m.band[b].alignment = cosine(m.band[b].mean, results.front().band[b].mean);
    m.all.alignment = cosine(m.all.mean, results.front().all.mean);
  }

  if (options.json) {
    nlohmann::json out;
    for (const method_signal& m : results) {
      nlohmann::json j;
      j["signal_fraction"] = m.all.fraction;
      j["alignment_with_dance"] = m.all.alignment;
      j["gradient_norm"] = std::sqrt(m.all.signal + m.all.noise);
      for (std::size_t b = 0; b < bands.size(); ++b) {
        const std::string key = "steps_" + std::to_string(bands[b].first) + "_" + std::to_string(bands[b].end - 1);
        j[key] = {{"signal_fraction", m.band[b].fraction},
                  {"alignment_with_dance", m.band[b].alignment},
                  {"mean_abs_advantage", m.band[b].advantage},
                  {"signal_energy", m.band[b].signal},
                  {"noise_energy", m.band[b].noise}};
      }
      j["draws"] = options.draws;
      out[m.label] = j;
    }
    std::cout << out.dump() << '\n';
    return;
  }
  std::cout << "gradient signal on the toy's base model (seed " << options.seed << "): " << options.draws
            << " draws of one iteration (8 trees) per method\n"
            << "per band of steps: signal fraction |E g|^2 / E|g - E g|^2 + |E g|^2, alignment cos(E g, dance's E g), "
               "mean |advantage| of the trained edges\n\n";
  int width = 8;
  for (const method_signal& m : results) width = std::max(width, static_cast<int>(m.label.size()) + 1);
  std::cout << std::left << std::setw(width) << "method" << std::right;
  for (const step_band& b : bands)
    std::cout << std::setw(24) << ("steps " + std::to_string(b.first) + "-" + std::to_string(b.end - 1));
  std::cout << std::setw(16) << "all steps" << '\n';
  std::cout << std::left << std::setw(width) << "" << std::right;
  for (std::size_t b = 0; b < bands.size(); ++b) std::cout << std::setw(24) << "rho  cos   |A|";
  std::cout << std::setw(16) << "rho  cos" << '\n';
  const auto fixed = [](double v, int digits) {
    std::ostringstream text;
    text << std::fixed << std::setprecision(digits) << v;
    return text.str();
  };
  for (const method_signal& m : results) {
    std::cout << std::left << std::setw(width) << m.label << std::right;
    for (const band_signal& b : m.band)
      std::cout << std::setw(24) << (fixed(b.fraction, 2) + " " + fixed(b.alignment, 2) + " " + fixed(b.advantage, 2));
    std::cout << std::setw(16) << (fixed(m.all.fraction, 2) + " " + fixed(m.all.alignment, 2)) << '\n';
  }
}

}  // namespace

void add_gradient_signal_command(CLI::App& app) {
  auto options = std::make_shared<signal_options>();
  CLI::App* command = app.add_subcommand(
      "gradient-signal", "How much of one iteration's gradient is signal, per method and band of steps (the toy)");
  add_text_list(command, "--methods", options->methods,
                "Methods beside dance (the reference), comma-separated, with compare's :key=value overrides "
                "(default: branch, branch:scope=per_batch)");
  add_integer(command, "--draws", options->draws, "Iterations drawn per method (their gradients, never applied)", 2,
              100'000)
      ->type_name("D")
      ->capture_default_str();
  add_integer(command, "--seed", options->seed, "The toy's base model and the noise keys")
      ->type_name("S")
      ->capture_default_str();
  command->add_flag("--json", options->json, "One JSON object keyed by method");
  command->callback([options] { run_gradient_signal(*options); });
}

}  // namespace branchgrpo::cli
