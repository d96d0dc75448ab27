#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "branchgrpo/app/run_memory.hpp"
#include "branchgrpo/app/training_run.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/limits.hpp"
#include "branchgrpo/training/methods.hpp"
#include "cli/commands.hpp"
#if defined(BRANCHGRPO_CLI_GIF)
#include "cli/images/gif.hpp"
#endif
#include "cli/images/image_grid.hpp"
#include "cli/images/plot.hpp"
#include "cli/images/png.hpp"
#include "cli/options/memory_budget.hpp"
#include "cli/options/number_options.hpp"
#include "cli/output/output_file.hpp"
#include "cli/runs/method_runs.hpp"
#include "cli/runs/run_support.hpp"
#include "cli/runs/shipped_model.hpp"
#include "cli/runs/signals.hpp"

namespace branchgrpo::cli {
namespace {

#if defined(BRANCHGRPO_CLI_GIF)
constexpr bool gif_enabled = true;
#else
constexpr bool gif_enabled = false;  // a tool built without giflib writes frame strips only
#endif

// The run configuration, the run and the held-out evaluation: cli/runs/method_runs.hpp, shared with `compare`.
using demo_runs::demo_config;
using demo_runs::demo_options;
using demo_runs::evaluate;
using demo_runs::evaluation;
using demo_runs::make_run;
using demo_runs::parse_prompt_rows;
using demo_runs::prompt_rows;

struct method_result {
  std::string name;
  std::vector<iteration_stats> stats;
  std::vector<std::pair<double, double>> curve;  // (cumulative training seconds, held-out reward)
  evaluation after;
  double evaluations = 0, update_evaluations = 0, edges = 0, edges_trained = 0, seconds_per_iter = 0;
};

std::string fixed(double value, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << value;
  return out.str();
}

std::string signed_fixed(double value, int digits) { return (value >= 0 ? "+" : "") + fixed(value, digits); }

void write_report(const std::filesystem::path& path, const demo_options& options, int iterations,
                  const std::vector<std::string>& prompts, const evaluation& before,
                  const std::vector<method_result>& results, double total_seconds) {
  double dance = 0;  // the ratio column needs dance among the methods
  for (const method_result& r : results)
    if (r.name == "dance") dance = r.seconds_per_iter;
  std::ostringstream out;
  if (options.video)
    out << "# branchgrpo demo: aligning the shipped video model\n\n"
        << "Model: the tiny Wan2.1-architecture text-to-video transformer of `models/moving-shapes-tiny` (8 frames "
        << "of 3 x 16 x 16 pixels, pretrained by `branchgrpo pretrain --video`), Wan's flow shift 5, LoRA rank "
        << options.rank << ", AdamW lr " << options.lr << ".\n"
        << "Reward: prompt alignment (colour, shape and direction of motion of the clip against \"a <colour> <shape> "
        << "moving <direction>\", in [0, 1]) + 0.25 x temporal smoothness (no frame-to-frame flicker, in [0, 1]).\n";
  else
    out << "# branchgrpo demo: aligning the shipped shapes model\n\n"
        << "Model: the tiny FLUX-architecture transformer of `models/shapes-tiny` (3 x 16 x 16 pixels, "
        << "pretrained by `branchgrpo pretrain`), LoRA rank " << options.rank << ", AdamW lr " << options.lr << ".\n"
        << "Reward: prompt alignment (colour and shape of the image against \"a <colour> <shape>\", in [0, 1]) + 0.1 "
        << "x JPEG compressibility (-kB at quality 95).\n";
  if (!options.remote_reward.empty())
    out << "The alignment term was scored by the reward server at " << options.remote_reward
        << (options.remote_scorer.empty() ? std::string() : " (scorer " + options.remote_scorer + ")")
        << " (`--remote-reward`; docs/rewards.md), logged as `remote`.\n";
  out << "Each method: " << iterations << " iterations x " << options.prompts << " prompts, " << options.steps
      << " denoising steps, seed " << options.seed << ", from the same base model, " << options.updates
      << " optimizer steps per iteration.\n"
      << "Prompts (trained and held out): ";
  for (std::size_t p = 0; p < prompts.size(); ++p) out << (p > 0 ? ", " : "") << '"' << prompts[p] << '"';
  out << ".\n"
      << "Held-out reward: deterministic ODE samples, every prompt x " << options.eval_samples
      << " keyed noises never used in training.\n\n";
  out << "| method | reward before | reward after | gain | alignment after | evaluations / iter | edges / iter | "
         "trained edges / iter | s / iter | vs dance |\n"
      << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const method_result& r : results) {
    const auto align = r.after.components.find("alignment");
    out << "| " << r.name << " | " << fixed(before.reward, 4) << " | " << fixed(r.after.reward, 4) << " | "
        << signed_fixed(r.after.reward - before.reward, 4) << " | "
        << (align == r.after.components.end() ? std::string("-") : fixed(align->second, 4)) << " | "
        << fixed(r.evaluations, 0) << " | " << fixed(r.edges, 0) << " | " << fixed(r.edges_trained, 0) << " | "
        << fixed(r.seconds_per_iter, 3) << " | " << (dance > 0 ? fixed(r.seconds_per_iter / dance, 2) : "-") << " |\n";
  }
  const auto align = before.components.find("alignment");
  out << "\nBase model: held-out reward " << fixed(before.reward, 4)
      << (align == before.components.end() ? std::string() : ", alignment " + fixed(align->second, 4)) << ".\n"
      << "Evaluations and edges are per iteration over all trees (denoiser rows in the rollout; edges of the "
      << "rollout and those the pruner kept for the update). Seconds per iteration: rollout + reward + update, "
      << "wall time on this machine (total for the demo: " << fixed(total_seconds, 1) << " s).\n\n"
      << "![held-out reward against training time](reward_vs_time.png)\n\n"
      << "![held-out samples before and after](before_after.png)\n\n"
      << (options.video && gif_enabled ? "Animated: ![held-out clips before and after](before_after.gif)\n\n" : "")
      << "Every iteration of every method: `demo.csv`.\n";
  write_file(path, out.str());
}

void write_csv(const std::filesystem::path& path, const std::vector<method_result>& results) {
  std::ostringstream out;
  out << "method,iteration,reward_mean,reward_std,evaluations,edges,edges_trained,update_evaluations,loss,seconds,"
         "cumulative_seconds\n";
  for (const method_result& r : results) {
    double cumulative = 0;
    for (const iteration_stats& s : r.stats) {
      cumulative += s.seconds;
      out << r.name << ',' << s.iteration << ',' << number_text(s.reward_mean) << ',' << number_text(s.reward_std)
          << ',' << s.rollout_evaluations << ',' << s.edges << ',' << s.edges_trained << ',' << s.update_evaluations
          << ',' << number_text(s.loss) << ',' << number_text(s.seconds) << ',' << number_text(cumulative) << '\n';
    }
  }
  write_file(path, out.str());
}

void write_plot(const std::filesystem::path& path, const std::vector<method_result>& results, bool video) {
  line_chart chart{.title = video ? "MOVING SHAPES DEMO: HELD-OUT REWARD VS TRAINING TIME"
                                  : "SHAPES DEMO: HELD-OUT REWARD VS TRAINING TIME",
                   .x_label = "CUMULATIVE TRAINING TIME (S)",
                   .y_label = "HELD-OUT MEAN REWARD",
                   .width = 900,
                   .height = 520,
                   .lines = {}};
  for (std::size_t m = 0; m < results.size(); ++m) {
    series s{.name = results[m].name, .colour = palette[m % palette.size()], .x = {}, .y = {}};
    for (const auto& [x, y] : results[m].curve) {
      s.x.push_back(x);
      s.y.push_back(y);
    }
    chart.lines.push_back(std::move(s));
  }
  write_png(path.string(), render(chart));
}

// The held-out grid: one row for the base model and one per method, one column per prompt (its first sample).
// Images are cells as they are; a clip is its frame strip, or with `frame` its frame `frame` alone (an animation's
// frame).
image_grid held_out_grid(const std::vector<std::string>& prompts, const demo_options& options, const evaluation& before,
                         const std::vector<method_result>& results, std::optional<std::int64_t> frame = {}) {
  image_grid grid{.title = "HELD-OUT SAMPLES: BASE MODEL, THEN EACH METHOD",
                  .columns = static_cast<int>(prompts.size()),
                  .scale = 4,
                  .row_labels = {"BASE " + fixed(before.reward, 3)},
                  .column_labels = {},
                  .cells = {}};
  for (const std::string& p : prompts) grid.column_labels.push_back(prompt_label(p));
  const auto add_row = [&](const torch::Tensor& images) {
    for (std::size_t p = 0; p < prompts.size(); ++p) {
      const torch::Tensor sample = images[static_cast<std::int64_t>(p) * options.eval_samples];
      grid.cells.push_back(frame ? to_rgb(sample[*frame]) : to_cells(sample.unsqueeze(0)).front());
    }
  };
  add_row(before.images);
  for (const method_result& r : results) {
    grid.row_labels.push_back(r.name + " " + fixed(r.after.reward, 3));
    add_row(r.after.images);
  }
  return grid;
}

// before_after.png (clips as frame strips) and, for clips when the tool has giflib, before_after.gif: the grid
// animated over the frames, 4 frames per second.
void write_grid(const std::filesystem::path& dir, const std::vector<std::string>& prompts, const demo_options& options,
                const evaluation& before, const std::vector<method_result>& results) {
  write_png((dir / "before_after.png").string(), render(held_out_grid(prompts, options, before, results)));
  if (before.images.dim() != 5 || !gif_enabled) return;
#if defined(BRANCHGRPO_CLI_GIF)
  std::vector<rgb_image> frames;
  for (std::int64_t f = 0; f < before.images.size(1); ++f)
    frames.push_back(render(held_out_grid(prompts, options, before, results, f)));
  write_gif((dir / "before_after.gif").string(), frames, 25);
#endif
}

// Host bytes per image of the shipped model's latent (3 x 16 x 16 float32) that the sizes multiply: a rollout
// keeps each node's latent with its noise, mean and update copies (x 4); an evaluation keeps each sample's
// image, ODE state and the transformer's activations for it (x 16: 72 tokens x 64-wide layers, no gradient).
// A lower-bound-ish estimate (the model's activations in the update are chunked): a refusal never hits a run
// that would fit, and the sizes that cannot fit are refused before anything is loaded.
// The video model's clips are 8 such frames (128 tokens per clip, so the same x 16 per latent byte holds).
constexpr double demo_latent_bytes = 3.0 * 16 * 16 * 4;

void check_memory(const demo_options& options, std::int64_t nodes) {
  const double latent = demo_latent_bytes * (options.video ? 8 : 1);
  require_fits(static_cast<double>(options.prompts) * static_cast<double>(nodes) * 4 * latent,
               setting_text("--prompts", options.prompts), "the rollout of " + std::to_string(nodes) + "-node trees");
  const double rows = (options.video ? 48.0 : 12.0) * options.eval_samples;  // the shipped model's prompts at most
  require_fits(rows * 16 * latent, setting_text("--eval-samples", options.eval_samples), "the held-out evaluation");
}

void run_demo(demo_options options) {
  // The counts' ranges are checked as the flags are parsed (add_demo_command).
  const int iterations = options.iters > 0 ? options.iters : options.quick ? 2 : 16;
  (void)parse_prompt_rows(prompt_rows(options));  // a bad list fails here, before any work
  require(options.remote_scorer.empty() || !options.remote_reward.empty(), "--remote-scorer = ", options.remote_scorer,
          ": needs --remote-reward");
  // --quick's 1 held-out sample per prompt is a default, as its 2 iterations are: an explicit --eval-samples is kept.
  if (options.quick && !options.eval_samples_given) options.eval_samples = 1;
  const int eval_every = options.eval_every > 0 ? options.eval_every : std::max(1, iterations / 4);
  if (options.methods.empty()) options.methods.assign(method_names.begin(), method_names.end());
  std::int64_t nodes = 0;                          // of the largest tree of the methods run
  for (const std::string& name : options.methods)  // a bad name or --steps fails here, before any work
    nodes = std::max(nodes, demo_config(options, iterations, name).recipe.topology(options.steps).node_count());
  check_memory(options, nodes);
  const std::filesystem::path out = make_directory(options.out);
  const auto start = std::chrono::steady_clock::now();

  run_progress bar(!options.quiet, static_cast<int>(options.methods.size()) * iterations);
  evaluation before;
  std::vector<std::string> prompts;
  std::vector<method_result> results;
  for (std::size_t m = 0; m < options.methods.size(); ++m) {
    const std::string name = options.methods[m];
    auto run = make_run(demo_config(options, iterations, name), options);
    if (m == 0) {  // the base model (LoRA B = 0), also the warm-up before any timing
      before = evaluate(*run, options);
      prompts = run->model().prompts;
      std::cout << "base model: held-out reward " << fixed(before.reward, 4) << '\n' << std::flush;
    }
    method_result result;
    result.name = name;
    result.curve.emplace_back(0.0, before.reward);
    double cumulative = 0;
    while (!run->done()) {
      const iteration_stats stats = run->step();
      result.stats.push_back(stats);
      cumulative += stats.seconds;
      const int done = run->iteration();
      if (done % eval_every == 0 && !run->done() && !options.quick)
        result.curve.emplace_back(cumulative, evaluate(*run, options).reward);
      bar.update(static_cast<int>(m) * iterations + done,
                 name + " " + std::to_string(done) + "/" + std::to_string(iterations), stats.reward_mean,
                 cumulative / done);
    }
    result.after = evaluate(*run, options);
    result.curve.emplace_back(cumulative, result.after.reward);
    for (const iteration_stats& s : result.stats) {
      result.evaluations += static_cast<double>(s.rollout_evaluations);
      result.update_evaluations += static_cast<double>(s.update_evaluations);
      result.edges += static_cast<double>(s.edges);
      result.edges_trained += static_cast<double>(s.edges_trained);
    }
    const auto n = static_cast<double>(result.stats.size());
    result.evaluations /= n;
    result.update_evaluations /= n;
    result.edges /= n;
    result.edges_trained /= n;
    result.seconds_per_iter = cumulative / n;
    bar.clear();
    std::cout << std::left << std::setw(14) << name << std::right << " held-out reward " << fixed(before.reward, 4)
              << " -> " << fixed(result.after.reward, 4) << " (" << signed_fixed(result.after.reward - before.reward, 4)
              << "), " << fixed(result.seconds_per_iter, 3) << " s/iter\n"
              << std::flush;
    results.push_back(std::move(result));
  }
  bar.clear();
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  write_report(out / "report.md", options, iterations, prompts, before, results, total);
  write_csv(out / "demo.csv", results);
  write_plot(out / "reward_vs_time.png", results, options.video);
  write_grid(out, prompts, options, before, results);
  std::cout << "wrote " << (out / "report.md").string() << ", " << (out / "reward_vs_time.png").string() << ", "
            << (out / "before_after.png").string()
            << (options.video && gif_enabled ? ", " + (out / "before_after.gif").string() : std::string()) << ", "
            << (out / "demo.csv").string() << '\n';
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto options = std::make_shared<demo_options>();
  CLI::App* demo = app.add_subcommand(
      "demo",
      "Align the shipped shapes model (or with --video the shipped video model) with dance and every "
      "BranchGRPO variant; write a report");
  demo->add_option("--out", options->out, "Directory for report.md and its PNG files (created)")
      ->type_name("DIR")
      ->capture_default_str();
  demo->add_flag("--quick", options->quick,
                 "2 iterations per method and 1 held-out sample per prompt (CI); an explicit --iters or --eval-samples "
                 "is kept");
  demo->add_flag("--video", options->video,
                 "The video model models/moving-shapes-tiny (Wan2.1 architecture, 8 frames of 16 x 16) with the video "
                 "rewards; writes before_after.gif too");
  // Hard limits: --iters and --updates far beyond a demo's minutes, --steps the core's max_steps, --rank that of
  // `bench iteration`; --prompts and --eval-samples are checked against the memory they imply (check_memory).
  add_integer(demo, "--iters", options->iters, "Iterations per method (default 16; 2 with --quick)", 1, 100'000)
      ->type_name("N");
  demo->add_option("--model", options->model,
                   "Model directory (default models/shapes-tiny, with --video models/moving-shapes-tiny)")
      ->type_name("DIR");
  add_text_list(demo, "--prompt-rows", options->prompt_rows,
                "Rows of the model's prompt table to train and evaluate on, or all (default 1,5,6,11; with --video "
                "5,14,32,43)")
      ->type_name("ROW,...|all");
  add_integer(demo, "--prompts", options->prompts, "Prompts (trees) per iteration", 1, std::numeric_limits<int>::max())
      ->type_name("P")
      ->capture_default_str();
  add_integer(demo, "--steps", options->steps, "Denoising steps", 1, max_steps)->type_name("N")->capture_default_str();
  CLI::Option* eval_samples =
      add_integer(demo, "--eval-samples", options->eval_samples,
                  "Held-out samples per prompt (1 with --quick, unless given)", 1, std::numeric_limits<int>::max())
          ->type_name("K")
          ->capture_default_str();
  add_number(demo, "--lr", options->lr, "AdamW learning rate of the LoRA factors", 1e-12, 1)
      ->type_name("LR")
      ->capture_default_str();
  add_number(demo, "--eta", options->eta, "SDE noise scale of every method (dance_sde)", 1e-4, 10)
      ->type_name("ETA")
      ->capture_default_str();
  add_integer(demo, "--updates", options->updates, "Optimizer steps per iteration (PPO-clipped after the first)", 1,
              1024)
      ->type_name("N")
      ->capture_default_str();
  add_integer(demo, "--rank", options->rank, "LoRA rank", std::int64_t{1}, std::int64_t{4096})
      ->type_name("R")
      ->capture_default_str();
  add_integer(demo, "--seed", options->seed, "Seed of every method's rollouts and of the held-out set")
      ->type_name("S")
      ->capture_default_str();
  add_text_list(demo, "--methods", options->methods,
                "Comma-separated subset of dance, branch, branch-widpru, "
                "branch-deppru, branch-mix (default: all, in that order)");
  demo->add_flag("--quiet", options->quiet, "No progress bar");
  demo_runs::add_remote_reward_options(demo, options->remote_reward, options->remote_scorer);
  demo->callback([options, eval_samples] {
    options->eval_samples_given = eval_samples->count() > 0;
    const stop_signals stop;  // SIGINT / SIGTERM: one line and exit 128 + signal within a rollout step
    run_demo(*options);
  });
}

}  // namespace branchgrpo::cli
