#include "branchgrpo/toy.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/limits.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/rollout/host_backend.hpp"
#include "branchgrpo/rollout/ode_sampler.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/training/loop.hpp"
#include "branchgrpo/training/methods.hpp"
#include "branchgrpo/training/trainer.hpp"
#include "cli/commands.hpp"
#include "cli/images/plot.hpp"
#include "cli/images/png.hpp"
#include "cli/options/memory_budget.hpp"
#include "cli/options/number_options.hpp"
#include "cli/output/iteration_json.hpp"
#include "cli/output/output_file.hpp"
#include "cli/output/progress_bar.hpp"
#include "cli/runs/method_runs.hpp"

namespace branchgrpo::cli {
namespace {

struct toy_options {
  std::string method = "branch";
  bool compare = false;
  int iters = 30;
  std::uint64_t seed = 7;
  int prompts = 8;
  std::int64_t max_batch = 64;
  int steps = 20;
  std::string out = "out/toy";
  bool json = false;
  bool quiet = false;
  int nan_leaf_every = 0;
};

// --- The held-out evaluation (cli/runs/method_runs.hpp, shared with `compare`) -------------------------------------

using toy_runs::eval_modes;
using toy_runs::eval_samples_per_mode;
using toy_runs::evaluate;
using toy_runs::evaluation;
using toy_runs::sample;

// --- The training reward, with the NaN testing aid ------------------------------------------------------------

// mode_reward; with nan_leaf_every = K > 0, the first leaf (of the first tree) scores NaN on iterations
// K - 1, 2K - 1, ... so that the trainer's drop path runs.
struct toy_reward {
  mode_reward<> score{};
  int nan_leaf_every = 0;
  int iteration = 0;

  std::vector<double> operator()(const host_tensor& leaves, std::span<const std::int64_t> prompts) {
    std::vector<double> out = score(leaves, prompts);
    if (nan_leaf_every > 0 && (iteration + 1) % nan_leaf_every == 0 && !out.empty())
      out.front() = std::numeric_limits<double>::quiet_NaN();
    return out;
  }
};
static_assert(Reward<toy_reward, host_backend>);

// --- One training run -----------------------------------------------------------------------------------------

struct method_run {
  std::string name;
  std::vector<iteration_stats> stats;
  evaluation trained;
  int trees_dropped = 0;
};

std::string plural(int count, std::string_view word) {
  return std::to_string(count) + " " + std::string(word) + (count == 1 ? "" : "s");
}

nlohmann::json iteration_json(const std::string& method, const iteration_stats& s) {
  nlohmann::json j = iteration_stats_json(s);
  j["method"] = method;
  return j;
}

void print_iteration_header(std::ostream& out) {
  out << std::setw(5) << "iter" << std::setw(10) << "reward" << std::setw(9) << "std" << std::setw(8) << "evals"
      << std::setw(8) << "edges" << std::setw(9) << "trained" << std::setw(9) << "dropped" << std::setw(11) << "loss"
      << std::setw(10) << "seconds" << '\n';
}

void print_iteration_row(std::ostream& out, const iteration_stats& s) {
  std::ostringstream row;
  row << std::setw(5) << s.iteration << std::fixed << std::setprecision(4) << std::setw(10) << s.reward_mean
      << std::setw(9) << s.reward_std << std::setw(8) << s.rollout_evaluations << std::setw(8) << s.edges
      << std::setw(9) << s.edges_trained << std::setw(9) << s.trees_dropped << std::scientific << std::setprecision(2)
      << std::setw(11) << s.loss << std::fixed << std::setprecision(3) << std::setw(10) << s.seconds << '\n';
  out << row.str() << std::flush;
}

// Trains a copy of `base` with the recipe named `name`. With `stream` set (single-method runs) each
// iteration is printed as it ends.
method_run train_method(const std::string& name, const fourier_policy<host_backend>& base, const toy_options& options,
                        const sigma_schedule& schedule, run_progress& bar, int done_before,
                        const std::string& bar_prefix, bool stream) {
  method_run run{.name = name, .stats = {}, .trained = {}, .trees_dropped = 0};
  fourier_policy<host_backend> policy = base;
  with_method(name, [&](auto recipe) {
    toy_reward reward{.score = {}, .nan_leaf_every = options.nan_leaf_every, .iteration = 0};
    host_backend backend;
    double total_seconds = 0;
    // Prompts cycle through the 8 modes across iterations: every mode is trained equally often.
    const prompt_schedule prompts{.prompt_count = eval_modes, .per_iteration = options.prompts};
    const training_options training{.max_batch = options.max_batch,
                                    .seed = options.seed,
                                    .updates_per_iteration = 1,
                                    .total_iterations = options.iters,
                                    .loss = {}};
    train_loop(backend, policy, reward, recipe, schedule, toy_latent_shape(), prompts, training, 0,
               [&](int i, const iteration_stats& stats) {
                 reward.iteration = i + 1;
                 total_seconds += stats.seconds;
                 run.stats.push_back(stats);
                 if (stats.trees_dropped > 0) {
                   run.trees_dropped += stats.trees_dropped;
                   bar.clear();
                   std::cerr << "warning: iteration " << i << (options.compare ? " (" + name + ")" : std::string())
                             << ": dropped " << plural(stats.trees_dropped, "tree") << " with a non-finite reward\n";
                 }
                 if (stream) {
                   bar.clear();
                   if (options.json)
                     std::cout << iteration_json(name, stats).dump() << '\n';
                   else
                     print_iteration_row(std::cout, stats);
                   check_standard_output();  // a closed pipe or a full disk stops the run at this line
                 }
                 bar.update(done_before + i + 1,
                            bar_prefix + std::to_string(i + 1) + "/" + std::to_string(options.iters), stats.reward_mean,
                            total_seconds / (i + 1));
               });
  });
  run.trained = evaluate(policy, schedule, options.seed);
  return run;
}

// --- Summaries ------------------------------------------------------------------------------------------------

struct run_summary {
  double evaluations = 0, update_evaluations = 0, edges = 0, edges_trained = 0, seconds_per_iter = 0;
  double total_seconds = 0;
};

run_summary summarize(const method_run& run) {
  run_summary s;
  for (const iteration_stats& it : run.stats) {
    s.evaluations += static_cast<double>(it.rollout_evaluations);
    s.update_evaluations += static_cast<double>(it.update_evaluations);
    s.edges += static_cast<double>(it.edges);
    s.edges_trained += static_cast<double>(it.edges_trained);
    s.total_seconds += it.seconds;
  }
  const auto n = static_cast<double>(run.stats.size());
  s.evaluations /= n;
  s.update_evaluations /= n;
  s.edges /= n;
  s.edges_trained /= n;
  s.seconds_per_iter = s.total_seconds / n;
  return s;
}

// --- Files ----------------------------------------------------------------------------------------------------

std::string csv_number(double value) {
  if (!std::isfinite(value)) return "nan";
  std::ostringstream out;
  out << std::setprecision(9) << value;
  return out.str();
}

void write_csv(const std::string& path, const std::vector<method_run>& runs) {
  std::ostringstream out;
  out << "iteration,method,reward_mean,reward_std,evaluations,edges_trained,seconds,cumulative_seconds,loss,"
         "update_evaluations,trees_dropped\n";
  for (const method_run& run : runs) {
    double cumulative = 0;
    for (const iteration_stats& s : run.stats) {
      cumulative += s.seconds;
      out << s.iteration << ',' << run.name << ',' << csv_number(s.reward_mean) << ',' << csv_number(s.reward_std)
          << ',' << s.rollout_evaluations << ',' << s.edges_trained << ',' << csv_number(s.seconds) << ','
          << csv_number(cumulative) << ',' << csv_number(s.loss) << ',' << s.update_evaluations << ','
          << s.trees_dropped << '\n';
    }
  }
  write_file(path, out.str());
}

void write_reward_plot(const std::string& path, const std::vector<method_run>& runs) {
  line_chart chart{.title = "TOY: TRAINING REWARD VS WALL TIME",
                   .x_label = "CUMULATIVE TRAINING TIME (S)",
                   .y_label = "MEAN LEAF REWARD",
                   .width = 900,
                   .height = 520,
                   .lines = {}};
  for (std::size_t m = 0; m < runs.size(); ++m) {
    series s{.name = runs[m].name, .colour = palette[m % palette.size()], .x = {}, .y = {}};
    double cumulative = 0;
    for (const iteration_stats& it : runs[m].stats) {
      cumulative += it.seconds;
      s.x.push_back(cumulative);
      s.y.push_back(it.reward_mean);
    }
    chart.lines.push_back(std::move(s));
  }
  write_png(path, render(chart));
}

scatter_panel samples_panel(std::string title, const evaluation& eval) {
  scatter_panel panel{.title = std::move(title), .points = {}, .circles = {}};
  const ring_mixture ring;
  for (int k = 0; k < ring.modes; ++k) {
    const auto m = ring.mode(k);
    panel.circles.push_back({m[0], m[1], palette[static_cast<std::size_t>(k) % palette.size()]});
  }
  for (const sample& s : eval.samples)
    panel.points.push_back({s.x, s.y, palette[static_cast<std::size_t>(s.prompt) % palette.size()]});
  return panel;
}

std::string reward_text(double reward) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.3f", reward);
  return buffer;
}

void write_samples_plot(const std::string& path, const evaluation& base, const std::vector<method_run>& runs) {
  scatter_grid grid{.title = "HELD-OUT ODE SAMPLES BEFORE / AFTER TRAINING",
                    .caption = "COLOUR = PROMPTED MODE; CIRCLES = THE 8 RING MODES (RADIUS 0.5); NUMBER = MEAN REWARD",
                    .columns = runs.size() > 1 ? 3 : 2,
                    .panel_size = 300,
                    .extent = 3.0,
                    .circle_radius = 0.5,
                    .panels = {}};
  grid.panels.push_back(samples_panel("BASE " + reward_text(base.reward), base));
  for (const method_run& run : runs)
    grid.panels.push_back(samples_panel(run.name + " " + reward_text(run.trained.reward), run.trained));
  write_png(path, render(grid));
}

// --- The two modes --------------------------------------------------------------------------------------------

// Bytes one iteration's statistics keep (iteration_stats, printed at the end): tiny, but --iters is large.
constexpr double toy_bytes_per_iteration = sizeof(iteration_stats);

void validate(const toy_options& options) {
  // Ranges are checked as the flags are parsed (number_options.hpp). Unknown names and topologies that do not
  // fit the steps fail here, with the library's message, before anything is printed or fitted; so does a size
  // whose memory does not fit.
  std::int64_t nodes = 0;  // of the largest tree of the methods run
  const auto check_topology = [&](auto recipe) {
    nodes = std::max(nodes, recipe.topology(options.steps).node_count());
  };
  if (options.compare)
    for (const std::string_view name : method_names) with_method(name, check_topology);
  else
    with_method(options.method, check_topology);
  require_fits(static_cast<double>(options.prompts) * static_cast<double>(nodes) * toy_bytes_per_node,
               setting_text("--prompts", options.prompts), "the rollout of " + std::to_string(nodes) + "-node trees");
  const double methods = options.compare ? static_cast<double>(method_names.size()) : 1.0;
  require_fits(methods * options.iters * toy_bytes_per_iteration, setting_text("--iters", options.iters),
               "the per-iteration statistics");
}

std::filesystem::path prepare_out(const toy_options& options) { return make_directory(options.out); }

void print_files(const std::vector<std::filesystem::path>& files) {
  std::cout << "wrote";
  for (const auto& file : files) std::cout << ' ' << file.string();
  std::cout << '\n';
}

void run_single(const toy_options& options) {
  const std::filesystem::path out = prepare_out(options);
  const sigma_schedule schedule = shifted_linear_schedule(options.steps);
  run_progress bar(!options.quiet, options.iters);
  fourier_policy<host_backend> base = make_toy_policy(options.seed);
  const evaluation before = evaluate(base, schedule, options.seed);
  if (!options.json) print_iteration_header(std::cout);
  std::vector<method_run> runs;
  runs.push_back(train_method(options.method, base, options, schedule, bar, 0, options.method + " ", true));
  bar.clear();

  const std::vector<std::filesystem::path> files = {out / ("toy_" + options.method + ".csv"),
                                                    out / "reward_vs_time.png", out / "samples_before_after.png"};
  write_csv(files[0].string(), runs);
  write_reward_plot(files[1].string(), runs);
  write_samples_plot(files[2].string(), before, runs);
  if (options.json) return;
  const method_run& run = runs.front();
  const run_summary summary = summarize(run);
  std::cout << std::fixed << std::setprecision(4) << "\nheld-out reward (ODE, " << eval_modes << " prompts x "
            << eval_samples_per_mode << " samples): base " << before.reward << " -> trained " << run.trained.reward
            << " (gain " << std::showpos << run.trained.reward - before.reward << std::noshowpos << ")\n"
            << "hit rate (within 0.5 of the prompted mode): base " << before.hit_rate << " -> trained "
            << run.trained.hit_rate << '\n'
            << std::setprecision(3) << "seconds per iteration " << summary.seconds_per_iter << ", trees dropped "
            << run.trees_dropped << '\n'
            << std::defaultfloat;
  print_files(files);
}

void run_compare(const toy_options& options) {
  const std::filesystem::path out = prepare_out(options);
  const sigma_schedule schedule = shifted_linear_schedule(options.steps);
  run_progress bar(!options.quiet, static_cast<int>(method_names.size()) * options.iters);
  fourier_policy<host_backend> base = make_toy_policy(options.seed);  // fitted once, copied per method
  const evaluation before = evaluate(base, schedule, options.seed);
  std::vector<method_run> runs;
  for (std::size_t m = 0; m < method_names.size(); ++m) {
    const std::string name(method_names[m]);
    const std::string prefix = name + " (" + std::to_string(m + 1) + "/" + std::to_string(method_names.size()) + ") ";
    runs.push_back(
        train_method(name, base, options, schedule, bar, static_cast<int>(m) * options.iters, prefix, false));
  }
  bar.clear();

  const std::vector<std::filesystem::path> files = {out / "compare.csv", out / "reward_vs_time.png",
                                                    out / "samples_before_after.png"};
  write_csv(files[0].string(), runs);
  write_reward_plot(files[1].string(), runs);
  write_samples_plot(files[2].string(), before, runs);

  std::vector<run_summary> summaries;
  for (const method_run& run : runs) summaries.push_back(summarize(run));
  const double dance_seconds = summaries.front().seconds_per_iter;  // method_names[0] is dance
  const auto ratio = [&](double seconds) { return dance_seconds > 0 ? seconds / dance_seconds : 0.0; };

  if (options.json) {
    nlohmann::json result = nlohmann::json::object();
    for (std::size_t m = 0; m < runs.size(); ++m) {
      const method_run& run = runs[m];
      const run_summary& s = summaries[m];
      result[run.name] = {{"base_reward", before.reward},
                          {"final_reward", run.trained.reward},
                          {"reward_gain", run.trained.reward - before.reward},
                          {"base_hit_rate", before.hit_rate},
                          {"final_hit_rate", run.trained.hit_rate},
                          {"final_train_reward", run.stats.back().reward_mean},
                          {"evaluations", s.evaluations},
                          {"update_evaluations", s.update_evaluations},
                          {"edges", s.edges},
                          {"edges_trained", s.edges_trained},
                          {"seconds_per_iter", s.seconds_per_iter},
                          {"total_seconds", s.total_seconds},
                          {"time_ratio_vs_dance", ratio(s.seconds_per_iter)},
                          {"trees_dropped", run.trees_dropped},
                          {"iterations", options.iters},
                          {"prompts", options.prompts},
                          {"seed", options.seed}};
    }
    std::cout << result.dump() << '\n';
    return;
  }
  std::cout << "toy compare: " << options.iters << " iterations x " << options.prompts << " trees, seed "
            << options.seed << ", " << options.steps << " steps\n"
            << "final reward: held-out ODE mean reward (" << eval_modes << " prompts x " << eval_samples_per_mode
            << " samples); evaluations, edges and seconds are per iteration\n\n";
  std::cout << std::left << std::setw(15) << "method" << std::right << std::setw(8) << "final" << std::setw(9) << "gain"
            << std::setw(8) << "hits" << std::setw(9) << "evals" << std::setw(9) << "edges" << std::setw(9) << "trained"
            << std::setw(9) << "s/iter" << std::setw(10) << "vs dance" << std::setw(9) << "dropped" << '\n';
  std::cout << std::fixed << std::left << std::setw(15) << "base model" << std::right << std::setprecision(4)
            << std::setw(8) << before.reward << std::setw(9) << "" << std::setprecision(3) << std::setw(8)
            << before.hit_rate << '\n';
  for (std::size_t m = 0; m < runs.size(); ++m) {
    const method_run& run = runs[m];
    const run_summary& s = summaries[m];
    std::cout << std::left << std::setw(15) << run.name << std::right << std::setprecision(4) << std::setw(8)
              << run.trained.reward << std::showpos << std::setw(9) << run.trained.reward - before.reward
              << std::noshowpos << std::setprecision(3) << std::setw(8) << run.trained.hit_rate << std::setprecision(0)
              << std::setw(9) << s.evaluations << std::setw(9) << s.edges << std::setw(9) << s.edges_trained
              << std::setprecision(4) << std::setw(9) << s.seconds_per_iter << std::setprecision(2) << std::setw(10)
              << ratio(s.seconds_per_iter) << std::setw(9) << run.trees_dropped << '\n';
  }
  std::cout << std::defaultfloat << '\n';
  print_files(files);
}

}  // namespace

void add_toy_command(CLI::App& app) {
  auto options = std::make_shared<toy_options>();
  CLI::App* toy = app.add_subcommand("toy", "Train the 2-D toy with one method, or compare every method");

  auto* method =
      toy->add_option("--method", options->method,
                      "dance, branch, branch-widpru, branch-deppru, branch-mix, nft, awm, branch-nft or branch-awm")
          ->type_name("NAME")
          ->capture_default_str();
  toy->add_flag("--compare", options->compare, "Train every method from the same base model and print a table")
      ->excludes(method);
  // The limits: --iters is a noise-key field (max_noise_iteration); --prompts and --iters are also checked
  // against the memory they imply (validate).
  add_integer(toy, "--iters", options->iters, "Training iterations per method", 1,
              static_cast<int>(max_noise_iteration))
      ->type_name("N")
      ->capture_default_str();
  add_integer(toy, "--seed", options->seed, "Seed of the base model, the rollout noise and the held-out roots")
      ->type_name("S")
      ->capture_default_str();
  add_integer(toy, "--prompts", options->prompts, "Trees (prompts) per iteration", 1, std::numeric_limits<int>::max())
      ->type_name("P")
      ->capture_default_str();
  add_integer(toy, "--max-batch", options->max_batch, "Rows per denoiser call", std::int64_t{1},
              std::numeric_limits<std::int64_t>::max())
      ->type_name("B")
      ->capture_default_str();
  add_integer(toy, "--steps", options->steps, "Denoising steps", 1, max_steps)->type_name("N")->capture_default_str();
  toy->add_option("--out", options->out, "Directory for the CSV and PNG files (created)")
      ->type_name("DIR")
      ->capture_default_str();
  toy->add_flag("--json", options->json, "JSON lines per iteration; with --compare one JSON object");
  toy->add_flag("--quiet", options->quiet, "No progress bar");
  add_integer(toy, "--nan-leaf-every", options->nan_leaf_every,
              "Testing aid: one leaf scores NaN every K-th iteration, so its tree is dropped (0: never)", 0,
              std::numeric_limits<int>::max())
      ->type_name("K")
      ->capture_default_str();

  toy->callback([options] {
    validate(*options);
    if (options->compare)
      run_compare(*options);
    else
      run_single(*options);
  });
}

}  // namespace branchgrpo::cli
