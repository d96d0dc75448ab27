#pragma once
// The iteration harness behind `branchgrpo bench iteration` (docs/performance.md), generic over the backend,
// the model and the reward, and free of LibTorch: commands/bench.cpp runs it on the toy (host backend),
// bench/flux.cpp on the FLUX transformer (torch backend).
//
//   run_harness<B>(options, make_model, reward, shape, prompt_count, hook)
//     make_model(v)   a fresh Policy<B> for variant v (a copy of the toy; a FLUX transformer + LoRA + policy)
//     prompt rows     the core's prompt_schedule: iteration i, tree t: (i P + t) mod prompt_count, every variant
//     hook(run, b)    called before (b = true) and after (b = false) every training iteration of a variant
//   summarize(run, dance_seconds) -> variant_summary;  variant_json / print_table: the reports.
//
// Timing: the policy and the reward are wrapped in timed_policy / timed_reward, which add the time spent inside
// them to a model_clock; the library overhead is the iteration minus that time. A model on an asynchronous
// device must synchronize before returning from each call, or its time lands in the overhead.
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <limits>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/pruning/combinators.hpp"
#include "branchgrpo/rollout/engine.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/training/concepts.hpp"
#include "branchgrpo/training/loop.hpp"
#include "branchgrpo/training/methods.hpp"
#include "branchgrpo/training/trainer.hpp"
#include "cli/options/memory_budget.hpp"
#include "cli/output/output_file.hpp"

namespace branchgrpo::cli {

using bench_clock = std::chrono::steady_clock;

inline double seconds_since(bench_clock::time_point start) {
  return std::chrono::duration<double>(bench_clock::now() - start).count();
}

/// Every option of `bench iteration`; the ones below "FLUX models" only matter for the LibTorch models (flux-tiny,
/// flux, wan-tiny, wan), as each comment says.
struct bench_options {
  std::string model = "toy";
  int iters = 5;
  int warmup = 1;
  int prompts = 8;
  std::int64_t max_batch = 64;
  int steps = 20;
  int batching_repeats = 5;
  std::uint64_t seed = 7;
  bool json = false;
  std::string json_file;             ///< also write the JSON object there (e.g. with the table on stdout)
  std::vector<std::string> methods;  ///< empty = every method; else a subset holding dance (the ratios' base)
  // FLUX models (bench/flux.cpp)
  std::string model_dir;            ///< flux-tiny: "" = models/shapes-tiny, here or in the source tree
  std::string flux_config = "dev";  ///< flux: dev, schnell or tiny (random weights)
  std::string device = "cpu";
  std::string dtype = "float32";           ///< the transformer's weights: float32 or bfloat16
  std::vector<std::int64_t> latent;        ///< flux: C,H,W (default from --height / --width); wan: C,F,H,W
  std::int64_t height = 256, width = 256;  ///< flux: pixels; latent H, W = pixels / 8
  std::int64_t text_tokens = 256;          ///< flux: T5 tokens per prompt (random embeddings)
  std::int64_t lora_rank = 8;
  bool gradient_checkpointing = false;
  double peak_tflops = 989;  ///< dense bf16 peak of the device (H100 / H200 SXM: 989)
};

// --- Timing decorators ----------------------------------------------------------------------------------------

/// Seconds spent inside the model and the reward during one iteration.
struct model_clock {
  double denoiser = 0;       ///< policy(x, batch): the rollout's forwards
  double update = 0;         ///< policy.accumulate (minus the trainer's loss callback) + policy.apply_update
  double loss_callback = 0;  ///< the trainer's PPO loss gradient, called from inside accumulate: library time
  double reward = 0;         ///< reward(leaves, prompts)
  std::int64_t denoiser_calls = 0;
};

/// Wraps a policy: forwards every call and adds the time spent inside it to a model_clock. Models Policy<B>
/// when P does, so the trainer runs it unchanged.
template <Backend B, Policy<B> P>
class timed_policy {
 public:
  timed_policy(P& inner, model_clock& clock) : inner_(&inner), clock_(&clock) {}

  typename B::tensor operator()(const typename B::tensor& x, const denoise_batch& batch) {
    const auto start = bench_clock::now();
    typename B::tensor v = (*inner_)(x, batch);
    clock_->denoiser += seconds_since(start);
    ++clock_->denoiser_calls;
    return v;
  }

  std::vector<double> accumulate(const edge_batch<typename B::tensor>& edges, const loss_gradient_fn& gradient) {
    double inside = 0;  // the trainer's callback is library code: not model time
    const loss_gradient_fn timed = [&](std::span<const double> log_probs) {
      const auto start = bench_clock::now();
      std::vector<double> weights = gradient(log_probs);
      inside += seconds_since(start);
      return weights;
    };
    const auto start = bench_clock::now();
    std::vector<double> log_probs = inner_->accumulate(edges, timed);
    clock_->update += seconds_since(start) - inside;
    clock_->loss_callback += inside;
    return log_probs;
  }

  void apply_update() {
    const auto start = bench_clock::now();
    inner_->apply_update();
    clock_->update += seconds_since(start);
  }

 private:
  P* inner_;
  model_clock* clock_;
};

/// Wraps a reward the same way.
template <Backend B, Reward<B> R>
class timed_reward {
 public:
  timed_reward(R& inner, model_clock& clock) : inner_(&inner), clock_(&clock) {}

  std::vector<double> operator()(const typename B::tensor& leaves, std::span<const std::int64_t> prompts) {
    const auto start = bench_clock::now();
    std::vector<double> scores = (*inner_)(leaves, prompts);
    clock_->reward += seconds_since(start);
    return scores;
  }

 private:
  R* inner_;
  model_clock* clock_;
};

// --- Statistics -----------------------------------------------------------------------------------------------

/// Linear-interpolation quantile of `values` (q in [0, 1]); values not empty.
inline double quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const double at = q * static_cast<double>(values.size() - 1);
  const auto low = static_cast<std::size_t>(at);
  const std::size_t high = std::min(low + 1, values.size() - 1);
  return values[low] + (at - static_cast<double>(low)) * (values[high] - values[low]);
}

inline double median(const std::vector<double>& values) { return quantile(values, 0.5); }

inline double sum(const std::vector<double>& values) {
  double total = 0;
  for (double v : values) total += v;
  return total;
}

/// The paper's seconds per iteration on FLUX.1-dev (method.md), as a ratio to DanceGRPO's 698 s.
inline double paper_ratio(std::string_view variant) {
  if (variant == "dance") return 1.0;
  if (variant == "branch") return 493.0 / 698.0;
  if (variant == "branch-widpru" || variant == "branch-deppru") return 314.0 / 698.0;
  if (variant == "branch-mix") return 148.0 / 698.0;
  return std::numeric_limits<double>::quiet_NaN();
}

/// What the measured iterations of one variant gave.
struct variant_run {
  std::string name;
  std::vector<double> seconds, rollout, reward_phase, update_phase;    // trainer's phases
  std::vector<double> denoiser, model_update, reward_model, overhead;  // model / library split
  std::int64_t evaluations = 0, update_evaluations = 0, edges = 0, edges_trained = 0;
  std::int64_t denoiser_calls = 0;
  double batched_seconds = 0, unbatched_seconds = 0;  // one rollout of the same tree, medians
  std::int64_t batched_calls = 0, unbatched_calls = 0;
  // Set by a model that knows them (bench/flux.cpp); the toy leaves them empty and its reports omit them.
  std::optional<double> forward_flops;      ///< analytic FLOPs of one rollout row (one forward)
  double update_flops_factor = 2;           ///< FLOPs of one update row / forward_flops
  std::optional<std::int64_t> peak_memory;  ///< peak device memory over the variant's iterations, bytes
};

/// The variants to run: options.methods in method_names order (then flash_method_names'), or the five of
/// method_names; dance first.
/// @pre every name is one of method_names or flash_method_names and dance is among them (else invalid_input naming
///      the value).
inline std::vector<std::string> bench_variants(const bench_options& options) {
  const auto listed = [](const auto& names, std::string_view name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  for (const std::string& name : options.methods)
    require(listed(method_names, name) || listed(flash_method_names, name) || listed(adaptive_method_names, name),
            "unknown method '", name,
            "' (expected dance, branch, branch-widpru, branch-deppru, branch-mix, branch-mix-flash, branch-value, "
            "branch-dense, branch-adaptive or branch-value-dense)");
  require(options.methods.empty() || listed(options.methods, "dance"),
          "--methods must include dance (every ratio is to dance)");
  std::vector<std::string> out;
  for (const std::string_view name : method_names)
    if (options.methods.empty() || listed(options.methods, name)) out.emplace_back(name);
  for (const std::string_view name : flash_method_names)
    if (listed(options.methods, name)) out.emplace_back(name);
  for (const std::string_view name : adaptive_method_names)
    if (listed(options.methods, name)) out.emplace_back(name);
  return out;
}

// --- The harness, generic over the model ------------------------------------------------------------------------

/// Does nothing around an iteration (the toy's hook).
struct no_iteration_hook {
  void operator()(variant_run&, bool /*begin*/) const {}
};

/// Runs the variants alternately (A B C ... A B C ...), each on its own model make_model(v), then times the
/// frontier batching. Score must be a copyable Reward<B> (a fresh copy per iteration).
/// @pre options validated (validate_bench_options); prompt_count >= 1.
template <Backend B, class MakeModel, Reward<B> Score, class Hook = no_iteration_hook>
requires Policy<std::invoke_result_t<MakeModel&, std::size_t>, B> std::vector<variant_run> run_harness(
    const bench_options& options, MakeModel&& make_model, const Score& score, const latent_shape& shape,
    std::int64_t prompt_count, Hook hook = {}) {
  using Model = std::invoke_result_t<MakeModel&, std::size_t>;
  const sigma_schedule schedule = shifted_linear_schedule(options.steps);
  const prompt_schedule prompt_rows{.prompt_count = prompt_count, .per_iteration = options.prompts};
  std::vector<variant_run> runs;
  std::vector<Model> policies;
  for (const std::string& name : bench_variants(options)) {
    runs.emplace_back();
    runs.back().name = name;
    policies.push_back(make_model(policies.size()));
  }
  const int rounds = options.warmup + options.iters;
  for (int i = 0; i < rounds; ++i) {
    // Every variant sees the same prompts: the core's schedule, as `branchgrpo train` uses it.
    const std::vector<std::int64_t> prompts = prompt_rows(i);
    for (std::size_t v = 0; v < runs.size(); ++v) {
      variant_run& run = runs[v];
      with_method(run.name, [&](auto recipe) {
        B backend;
        if constexpr (requires { policies[v].backend(); }) backend = policies[v].backend();  // device and dtype
        Score inner_score = score;
        model_clock clock;
        timed_policy<B, Model> policy(policies[v], clock);
        timed_reward<B, Score> reward(inner_score, clock);
        hook(run, true);
        const iteration_stats stats = train_iteration(backend, policy, reward, recipe, schedule, shape, prompts, i,
                                                      training_options{.max_batch = options.max_batch,
                                                                       .seed = options.seed,
                                                                       .updates_per_iteration = 1,
                                                                       .total_iterations = rounds,
                                                                       .loss = {}});
        hook(run, false);
        if (i < options.warmup) return;
        run.seconds.push_back(stats.seconds);
        run.rollout.push_back(stats.rollout_seconds);
        run.reward_phase.push_back(stats.reward_seconds);
        run.update_phase.push_back(stats.update_seconds);
        run.denoiser.push_back(clock.denoiser);
        run.model_update.push_back(clock.update);
        run.reward_model.push_back(clock.reward);
        run.overhead.push_back(stats.seconds - clock.denoiser - clock.update - clock.reward);
        run.evaluations += stats.rollout_evaluations;
        run.update_evaluations += stats.update_evaluations;
        run.edges += stats.edges;
        run.edges_trained += stats.edges_trained;
        run.denoiser_calls += clock.denoiser_calls;
      });
    }
  }

  // Frontier batching: the iteration-0 tree of each variant, rolled out by the variant's model with every
  // frontier in one call vs one node per call (max_batch 1), alternately. (The weights do not change the cost.)
  for (std::size_t v = 0; v < runs.size(); ++v) {
    variant_run& run = runs[v];
    with_method(run.name, [&](auto recipe) {
      const tree_plan plan =
          ode_where_noiseless(shape_plan(recipe.pruner, recipe.topology(options.steps), 0), recipe.stepper, schedule);
      const std::vector<std::int64_t> first_prompts = prompt_rows(0);
      std::vector<tree_info> infos(static_cast<std::size_t>(options.prompts));
      for (int t = 0; t < options.prompts; ++t)
        infos[static_cast<std::size_t>(t)] = {.key = static_cast<std::uint32_t>(t),
                                              .prompt = first_prompts[static_cast<std::size_t>(t)]};
      const rollout_tree tree(plan, std::move(infos));
      std::vector<double> batched, unbatched;
      for (int r = 0; r < options.batching_repeats; ++r)
        for (const std::int64_t max_batch : {std::numeric_limits<std::int64_t>::max(), std::int64_t{1}}) {
          B backend;
          if constexpr (requires { policies[v].backend(); }) backend = policies[v].backend();
          const auto start = bench_clock::now();
          const auto result = rollout(backend, policies[v], recipe.stepper, recipe.correlator, schedule, tree, shape,
                                      {.max_batch = max_batch, .seed = options.seed, .iteration = 0});
          (max_batch == 1 ? unbatched : batched).push_back(seconds_since(start));
          (max_batch == 1 ? run.unbatched_calls : run.batched_calls) = result.denoiser_calls;
        }
      run.batched_seconds = median(batched);
      run.unbatched_seconds = median(unbatched);
    });
  }
  return runs;
}

// --- Reports --------------------------------------------------------------------------------------------------

struct variant_summary {
  double seconds = 0, seconds_min = 0, seconds_max = 0, seconds_q1 = 0, seconds_q3 = 0;
  double ratio = 0, overhead_fraction = 0, batching_speedup = 0;
  double rollout_fraction = 0, reward_fraction = 0, update_fraction = 0;  // model time, of the iteration
  double evaluations = 0, update_evaluations = 0, edges = 0, edges_trained = 0, denoiser_calls = 0;
  std::optional<double> model_tflops;  ///< analytic model FLOPs / iteration time, in TFLOP/s (FLUX only)
};

inline variant_summary summarize(const variant_run& run, double dance_seconds) {
  const double total = sum(run.seconds);
  const auto n = static_cast<double>(run.seconds.size());
  variant_summary s;
  s.seconds = median(run.seconds);
  s.seconds_min = quantile(run.seconds, 0.0);
  s.seconds_max = quantile(run.seconds, 1.0);
  s.seconds_q1 = quantile(run.seconds, 0.25);
  s.seconds_q3 = quantile(run.seconds, 0.75);
  s.ratio = s.seconds / dance_seconds;
  // Fractions of the summed iteration time, so the four add up to 1.
  s.rollout_fraction = sum(run.denoiser) / total;
  s.update_fraction = sum(run.model_update) / total;
  s.reward_fraction = sum(run.reward_model) / total;
  s.overhead_fraction = sum(run.overhead) / total;
  s.batching_speedup = run.unbatched_seconds / run.batched_seconds;
  s.evaluations = static_cast<double>(run.evaluations) / n;
  s.update_evaluations = static_cast<double>(run.update_evaluations) / n;
  s.edges = static_cast<double>(run.edges) / n;
  s.edges_trained = static_cast<double>(run.edges_trained) / n;
  s.denoiser_calls = static_cast<double>(run.denoiser_calls) / n;
  if (run.forward_flops) {
    const double flops = *run.forward_flops * (static_cast<double>(run.evaluations) +
                                               run.update_flops_factor * static_cast<double>(run.update_evaluations));
    s.model_tflops = flops / total / 1e12;
  }
  return s;
}

inline nlohmann::json variant_json(const variant_run& run, const variant_summary& s, const bench_options& options) {
  nlohmann::json out = {{"seconds_per_iter", s.seconds},
                        {"seconds_min", s.seconds_min},
                        {"seconds_max", s.seconds_max},
                        {"seconds_q1", s.seconds_q1},
                        {"seconds_q3", s.seconds_q3},
                        {"time_ratio_vs_dance", s.ratio},
                        {"paper_time_ratio_vs_dance", paper_ratio(run.name)},
                        {"overhead_fraction", s.overhead_fraction},
                        {"rollout_model_fraction", s.rollout_fraction},
                        {"reward_fraction", s.reward_fraction},
                        {"update_model_fraction", s.update_fraction},
                        {"rollout_seconds", median(run.rollout)},
                        {"reward_seconds", median(run.reward_phase)},
                        {"update_seconds", median(run.update_phase)},
                        {"overhead_seconds", median(run.overhead)},
                        {"rollout_evaluations", s.evaluations},
                        {"rollout_evaluations_per_tree", s.evaluations / options.prompts},
                        {"update_evaluations", s.update_evaluations},
                        {"edges", s.edges},
                        {"edges_trained", s.edges_trained},
                        {"denoiser_calls", s.denoiser_calls},
                        {"batching_speedup", s.batching_speedup},
                        {"batched_rollout_seconds", run.batched_seconds},
                        {"unbatched_rollout_seconds", run.unbatched_seconds},
                        {"batched_denoiser_calls", run.batched_calls},
                        {"unbatched_denoiser_calls", run.unbatched_calls},
                        {"iterations", options.iters},
                        {"prompts", options.prompts},
                        {"max_batch", options.max_batch},
                        {"model", options.model}};
  if (run.forward_flops) {  // FLUX models: analytic FLOPs, fraction of the bf16 peak, peak device memory
    out["forward_flops_per_row"] = *run.forward_flops;
    out["update_flops_per_row"] = *run.forward_flops * run.update_flops_factor;
    out["model_tflops_per_second"] = *s.model_tflops;
    out["peak_tflops"] = options.peak_tflops;
    out["bf16_peak_fraction"] = *s.model_tflops / options.peak_tflops;
    out["peak_memory_bytes"] = run.peak_memory ? nlohmann::json(*run.peak_memory) : nlohmann::json(nullptr);
    out["device"] = options.device;
    out["dtype"] = options.dtype;
  }
  return out;
}

/// The whole text on standard output in one write, checked at once: the system's reason for a failure (errno) is
/// known only right after the failing write. Example: print_checked("x\n") with stdout on /dev/full throws
/// write_error "standard output: cannot write: No space left on device".
inline void print_checked(std::string_view text) {
  std::cout << text << std::flush;
  if (!std::cout) throw write_error("standard output", "cannot write", errno);
}

inline void print_table(const std::vector<variant_run>& runs, const std::vector<variant_summary>& summaries,
                        const bench_options& options) {
  const bool flops = !runs.empty() && runs.front().forward_flops.has_value();
  std::ostringstream out;
  out << "model " << options.model << ", " << options.prompts << " prompts, " << options.steps << " steps, "
      << options.iters << " measured iterations per variant (+" << options.warmup
      << " warm-up), run alternately; max_batch " << options.max_batch << "\n";
  // The name column fits the longest variant name (branch-mix-flash), keeping the five's table as it was.
  int name_width = 15;
  for (const variant_run& run : runs) name_width = std::max(name_width, static_cast<int>(run.name.size()) + 1);
  out << std::left << std::setw(name_width) << "variant" << std::right << std::setw(11) << "s/iter" << std::setw(11)
      << "min" << std::setw(11) << "max" << std::setw(9) << "vs dance" << std::setw(8) << "paper" << std::setw(8)
      << "evals" << std::setw(9) << "trained" << std::setw(9) << "rollout" << std::setw(8) << "reward" << std::setw(8)
      << "update" << std::setw(10) << "overhead" << std::setw(10) << "batching";
  if (flops) out << std::setw(10) << "TFLOP/s" << std::setw(10) << "of peak" << std::setw(12) << "peak mem";
  out << '\n';
  for (std::size_t v = 0; v < runs.size(); ++v) {
    const variant_summary& s = summaries[v];
    const double paper = paper_ratio(runs[v].name);  // NaN: a method the paper did not time
    out << std::left << std::setw(name_width) << runs[v].name << std::right << std::scientific << std::setprecision(3)
        << std::setw(11) << s.seconds << std::setw(11) << s.seconds_min << std::setw(11) << s.seconds_max << std::fixed
        << std::setprecision(3) << std::setw(9) << s.ratio;
    if (std::isnan(paper))
      out << std::setw(8) << "-";
    else
      out << std::setw(8) << paper;
    out << std::setprecision(0) << std::setw(8) << s.evaluations << std::setw(9) << s.edges_trained
        << std::setprecision(1) << std::setw(8) << 100 * s.rollout_fraction << '%' << std::setw(7)
        << 100 * s.reward_fraction << '%' << std::setw(7) << 100 * s.update_fraction << '%' << std::setw(9)
        << 100 * s.overhead_fraction << '%' << std::setprecision(2) << std::setw(9) << s.batching_speedup << 'x';
    if (flops) {
      out << std::setprecision(3) << std::setw(10) << *s.model_tflops << std::setprecision(2) << std::setw(9)
          << 100 * *s.model_tflops / options.peak_tflops << '%';
      if (runs[v].peak_memory)
        out << std::setprecision(2) << std::setw(8) << static_cast<double>(*runs[v].peak_memory) / (1 << 30) << " GiB";
      else
        out << std::setw(12) << "-";
    }
    out << '\n';
  }
  out << "rollout / reward / update: time inside the model's forwards, the reward, the model's update; overhead:\n"
         "the rest of the iteration (library). paper: s/iter vs DanceGRPO on FLUX.1-dev (698, 493, 314, 314, 148 s).\n"
         "batching: one rollout of the same tree, one node per call (max_batch 1) vs whole frontiers.\n";
  if (flops)
    out << "TFLOP/s: analytic transformer FLOPs (rollout rows x forward + update rows x forward and activation\n"
           "gradient) / iteration time; of peak: of --peak-tflops "
        << std::defaultfloat << std::setprecision(6) << options.peak_tflops
        << "; peak mem: CUDA caching allocator, - when not on CUDA.\n";
  print_checked(out.str());
}

/// Fails with write_error naming `path` and the reason when `path` cannot be written: an existing file or device
/// that is not writable, or a directory to create it in that is missing or not writable. Nothing is created.
/// Example: check_writable("/nonexistent/x.json") throws "/nonexistent/x.json: cannot write: No such file or
/// directory".
inline void check_writable(const std::filesystem::path& path) {
  std::error_code error;
  if (std::filesystem::exists(path, error)) {
    if (std::filesystem::is_directory(path, error)) throw write_error(path, "cannot write", EISDIR);
    if (::access(path.c_str(), W_OK) != 0) throw write_error(path, "cannot write", errno);
    return;
  }
  const std::filesystem::path parent = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  if (::access(parent.c_str(), W_OK | X_OK) != 0) throw write_error(path, "cannot write", errno);
}

/// Checks that every variant's topology fits the steps, the memory the sizes imply (bytes_per_node: what one
/// rollout-tree node costs the model's iteration in host memory; 0 for a model on a device) and that --json-file
/// can be written, before any work. The counts' ranges are checked as the flags are parsed (commands/bench.cpp).
/// Returns the node count of the largest tree of the variants run.
inline std::int64_t validate_bench_options(const bench_options& options, double bytes_per_node) {
  require(options.iters + options.warmup <= static_cast<int>(max_noise_iteration),
          "--iters + --warmup = ", options.iters + options.warmup, ": at most ", max_noise_iteration,
          " iterations (a noise key field)");
  if (!options.json_file.empty()) check_writable(options.json_file);  // fail before a long run, not after it
  // Every method's topology must fit the steps (dense splits at 0, 3, 6, 9): fail before any work.
  std::int64_t nodes = 0;
  for (const std::string& name : bench_variants(options))
    with_method(name, [&](auto recipe) { nodes = std::max(nodes, recipe.topology(options.steps).node_count()); });
  require_fits(static_cast<double>(options.prompts) * static_cast<double>(nodes) * bytes_per_node,
               setting_text("--prompts", options.prompts), "the rollout of " + std::to_string(nodes) + "-node trees");
  return nodes;
}

/// Prints the table, or one JSON object keyed by variant with --json. runs.front() is dance.
inline void report_runs(const std::vector<variant_run>& runs, const bench_options& options) {
  const double dance_seconds = median(runs.front().seconds);
  std::vector<variant_summary> summaries;
  for (const variant_run& run : runs) summaries.push_back(summarize(run, dance_seconds));
  nlohmann::json out = nlohmann::json::object();
  for (std::size_t v = 0; v < runs.size(); ++v) out[runs[v].name] = variant_json(runs[v], summaries[v], options);
  if (!options.json_file.empty()) write_file(options.json_file, out.dump() + '\n');
  if (options.json)
    print_checked(out.dump() + '\n');
  else
    print_table(runs, summaries, options);
}

}  // namespace branchgrpo::cli
