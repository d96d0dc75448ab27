#pragma once
// What `toy`, `demo` and `compare` share to train a method and score it on a held-out set: the toy's held-out ODE
// evaluation (toy_runs, torch-free), and the demo's run configuration, run and held-out evaluation on the shipped
// shapes model (demo_runs, only where BRANCHGRPO_CLI_TORCH is defined: tools/CMakeLists.txt sets it for the
// sources built with the application layer).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/rollout/host_backend.hpp"
#include "branchgrpo/rollout/ode_sampler.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/toy.hpp"

#ifdef BRANCHGRPO_CLI_TORCH
#include <CLI/CLI.hpp>

#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string_view>

#include "branchgrpo/app/run_memory.hpp"
#include "branchgrpo/app/training_run.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/training/methods.hpp"
#include "cli/options/memory_budget.hpp"
#include "cli/runs/shipped_model.hpp"
#endif

namespace branchgrpo::cli {

// --- The toy's held-out evaluation ------------------------------------------------------------------------------
namespace toy_runs {

inline constexpr int eval_modes = 8;              // prompts 0..7, one per ring mode
inline constexpr int eval_samples_per_mode = 64;  // E: held-out samples per prompt
// The `tree` field of the evaluation roots' noise keys: far from the rollout's tree keys (0, 1, ...) and from
// the toy's own draws (0xFFFF00xx), so evaluation never reuses a training draw.
inline constexpr std::uint32_t eval_tree_key = 0xFFFE0000u;

struct sample {
  double x = 0, y = 0;
  std::int64_t prompt = 0;
};

struct evaluation {
  double reward = 0;    // mean mode_reward over every sample
  double hit_rate = 0;  // fraction within mode_reward's width (0.5) of the prompted mode
  std::vector<sample> samples;
};

// The core's keyed Euler ODE sampler (sample_ode) from sigma 1 to 0 over the training schedule, for
// eval_modes x eval_samples_per_mode keyed N(0, I) roots; sample i has prompt i mod eval_modes.
inline evaluation evaluate(fourier_policy<host_backend>& policy, const sigma_schedule& schedule, std::uint64_t seed) {
  const mode_reward<> reward;
  evaluation out;
  double sum = 0;
  int hits = 0;
  const int count = eval_modes * eval_samples_per_mode;
  std::vector<std::int64_t> prompts(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) prompts[static_cast<std::size_t>(i)] = i % eval_modes;
  host_backend backend;
  const auto root_key = [seed](std::int64_t i) {
    return noise_key{.seed = seed,
                     .iteration = 0,
                     .tree = eval_tree_key,
                     .node = static_cast<std::uint32_t>(i),
                     .step = 0,
                     .stream = noise_stream::auxiliary};
  };
  const std::vector<double> samples =
      backend.to_host(sample_ode(backend, policy, schedule, toy_latent_shape(), prompts, root_key, count).front());
  for (int i = 0; i < count; ++i) {
    const double x = samples[2 * static_cast<std::size_t>(i)], y = samples[2 * static_cast<std::size_t>(i) + 1];
    const std::int64_t prompt = prompts[static_cast<std::size_t>(i)];
    const double r = reward.score(x, y, prompt);
    sum += r;
    const auto m = reward.ring.mode(prompt);
    if (std::hypot(x - m[0], y - m[1]) <= reward.width) ++hits;
    out.samples.push_back({x, y, prompt});
  }
  out.reward = sum / count;
  out.hit_rate = static_cast<double>(hits) / count;
  return out;
}

}  // namespace toy_runs

#ifdef BRANCHGRPO_CLI_TORCH
// --- The demo's runs on the shipped shapes model ----------------------------------------------------------------
namespace demo_runs {

struct demo_options {
  std::string out = "out/demo";
  bool video = false;      // the shipped video model (Wan2.1 architecture) and the video rewards
  std::string model = "";  // "" = models/shapes-tiny (models/moving-shapes-tiny with video), here or in the source tree
  bool quick = false;
  int iters = 0;  // 0 = 16, or 2 with --quick
  int prompts = 2;
  int steps = 20;
  int eval_samples = 8;
  bool eval_samples_given = false;  // --eval-samples on the command line: --quick keeps it (else 1)
  int eval_every = 0;               // 0 = a quarter of the run
  double lr = 2e-3;
  double eta = 0.3;  // dance_sde's noise scale, the methods' (every method uses dance_sde)
  int updates = 4;   // optimizer steps per iteration (the kept edges split into this many groups)
  std::int64_t rank = 8;
  std::uint64_t seed = 0;
  // The prompts trained and evaluated: "all", or rows of the model's prompt table. The default: one prompt
  // per colour, the shapes mixed, so 16 iterations x 2 prompts see each prompt 8 times; with video also every
  // direction: "a red square moving right", "a green circle moving up", "a blue triangle moving left", "a yellow
  // square moving down" (video_prompt_rows).
  std::vector<std::string> prompt_rows = {};  // --prompt-rows' elements; none: the model's default rows
  std::vector<std::string> methods;           // empty = every method, dance first
  bool quiet = false;
  // The alignment term scored by a reward server instead of in process ([[rewards]] name = "remote";
  // docs/rewards.md): its url ("" = in process) and scorer ("" = the server's only one).
  std::string remote_reward = "";
  std::string remote_scorer = "";
};

/// Adds --remote-reward URL and --remote-scorer NAME (demo_options' remote_reward, remote_scorer) to `command`.
inline void add_remote_reward_options(CLI::App* command, std::string& url, std::string& scorer) {
  command
      ->add_option("--remote-reward", url,
                   "Score the alignment term with a reward server (scripts/reward_server.py, docs/rewards.md) at URL "
                   "instead of in process; it is checked before the first method runs")
      ->type_name("URL");
  command->add_option("--remote-scorer", scorer, "With --remote-reward: the server's scorer (default: its only one)")
      ->type_name("NAME");
}

/// The alignment term's [[rewards]] entry: in process, or the server's with --remote-reward.
inline reward_entry alignment_entry(const demo_options& options) {
  if (options.remote_reward.empty()) return {.name = "alignment", .weight = 1.0, .params = {}};
  reward_entry remote{.name = "remote", .weight = 1.0, .params = {{"url", options.remote_reward}}};
  if (!options.remote_scorer.empty()) remote.params["scorer"] = options.remote_scorer;
  return remote;
}

inline constexpr std::string_view image_prompt_rows = "1,5,6,11";
inline constexpr std::string_view video_prompt_rows = "5,14,32,43";

/// --prompt-rows, or the model's default rows.
inline std::vector<std::string> prompt_rows(const demo_options& options) {
  if (!options.prompt_rows.empty()) return options.prompt_rows;
  std::vector<std::string> rows;
  std::istringstream in(std::string(options.video ? video_prompt_rows : image_prompt_rows));
  for (std::string row; std::getline(in, row, ',');) rows.push_back(row);
  return rows;
}

inline std::filesystem::path model_dir(const demo_options& options) {
  return shipped_model_dir(options.model, options.video ? "moving-shapes-tiny" : "shapes-tiny");
}

// Every method runs this configuration with its method's components.
inline run_config demo_config(const demo_options& options, int iterations, std::string_view method) {
  run_config config;
  config.source = "demo";
  config.model.dir = std::filesystem::absolute(model_dir(options)).string();
  config.data.prompts_per_iteration = options.prompts;
  config.rollout.steps = options.steps;
  config.recipe = method_recipe(method);
  config.recipe.stepper.policy = dance_sde{.eta = options.eta};
  config.optimizer.lr = options.lr;
  config.optimizer.weight_decay = 0;
  config.run.updates_per_iteration = options.updates;
  config.lora.rank = options.rank;
  config.lora.alpha = static_cast<double>(options.rank);
  // Images: alignment + 0.1 JPEG compressibility; videos: alignment (with the motion) + 0.25 smoothness, and
  // Wan's flow shift.
  if (options.video) {
    config.rewards = {alignment_entry(options), {.name = "smoothness", .weight = 0.25, .params = {}}};
    config.rollout.shift = 5.0;
  } else {
    config.rewards = {alignment_entry(options), {.name = "jpeg_compressibility", .weight = 0.1, .params = {}}};
  }
  config.run.iterations = iterations;
  config.run.seed = options.seed;
  config.run.output_dir = (std::filesystem::path(options.out) / std::string(method)).string();
  return config;
}

// "all" -> {} (every row); "1,5" -> {1, 5}. Anything else is one line naming the bad entry.
inline std::vector<std::int64_t> parse_prompt_rows(const std::vector<std::string>& elements) {
  if (elements.size() == 1 && elements.front() == "all") return {};
  require(!elements.empty(), "--prompt-rows is empty (expected all or rows like 1,5,6,11)");
  std::vector<std::int64_t> rows;
  for (std::size_t i = 0; i < elements.size(); ++i)
    rows.push_back(parse_integer<std::int64_t>(elements[i], "--prompt-rows[" + std::to_string(i) + "]", 0,
                                               std::numeric_limits<std::int64_t>::max()));
  return rows;
}

// Keeps the prompt table's `rows` (in that order), so prompt index i of the run is rows[i] of the table;
// no rows: the whole table.
inline void keep_prompt_rows(run_model& model, const std::vector<std::int64_t>& rows) {
  if (rows.empty()) return;
  const auto table = static_cast<std::int64_t>(model.prompts.size());
  std::vector<std::string> prompts;
  for (const std::int64_t row : rows) {
    require(row >= 0 && row < table, "--prompt-rows: row ", row, " is not in the model's ", table, " prompts");
    prompts.push_back(model.prompts[static_cast<std::size_t>(row)]);
  }
  model.embeddings = prompt_table(model.embeddings.rows(rows, torch::kCPU));
  model.prompts = std::move(prompts);
}

inline std::unique_ptr<training_run> make_run(const run_config& config, const demo_options& options) {
  check_run_memory_before_loading(config,
                                  available_memory());  // the whole run's estimate (app/run_memory.hpp), before loading
  run_model model = load_run_model(config);
  keep_prompt_rows(model, parse_prompt_rows(prompt_rows(options)));
  weighted_sum reward = make_run_reward(config, model);
  return std::make_unique<training_run>(config, std::move(model), std::move(reward));
}

// The held-out set: every prompt of the table, eval_samples keyed ODE samples each (never a training draw).
struct evaluation {
  double reward = 0;
  std::map<std::string, double> components;
  torch::Tensor images;  // [prompts * samples, 3, H, W], prompt-major
};

inline evaluation evaluate(training_run& run, const demo_options& options) {
  std::vector<std::int64_t> prompts;
  for (std::size_t p = 0; p < run.model().prompts.size(); ++p)
    for (int k = 0; k < options.eval_samples; ++k) prompts.push_back(static_cast<std::int64_t>(p));
  evaluation out;
  out.images = run.sample(prompts, options.seed);
  const std::vector<double> scores = run.score_images(out.images, prompts, options.eval_samples);
  double sum = 0;
  for (const double s : scores) sum += s;
  out.reward = sum / static_cast<double>(scores.size());
  out.components = run.last_score_components();  // the held-out samples' own, not the last iteration's
  return out;
}

}  // namespace demo_runs
#endif

}  // namespace branchgrpo::cli
