// `branchgrpo compare`: dance and every BranchGRPO variant, each trained from the same base model with N seeds, and
// per method the held-out reward gain, the reward reached at a fixed budget of training time, the reward against
// dance's at equal time and the time per iteration, each as a mean over the seeds with its 95 % Student-t interval
// (docs/cli.md, docs/results.md). Times are kept on two clocks, wall and process CPU, because a shared machine's
// load moves the first. The toy trains as `toy --compare` does, the shapes model as `demo` does
// (cli/runs/method_runs.hpp); with the first seed both reproduce those commands' rewards. One per-seed loop
// (run_seed) drives both kinds of run (toy_run, shapes_run), and --methods' overrides are one table
// (cli/runs/method_overrides.hpp) that both apply to their run's recipe and settings.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <time.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/evaluation/statistics.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/rollout/host_backend.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/toy.hpp"
#include "branchgrpo/training/loop.hpp"
#include "branchgrpo/training/methods.hpp"
#include "branchgrpo/training/trainer.hpp"
#include "cli/commands.hpp"
#include "cli/images/plot.hpp"
#include "cli/images/png.hpp"
#include "cli/options/memory_budget.hpp"
#include "cli/options/number_options.hpp"
#include "cli/output/output_file.hpp"
#include "cli/output/progress_bar.hpp"
#include "cli/runs/method_runs.hpp"
#include "cli/runs/method_variant.hpp"
#include "cli/runs/signals.hpp"

namespace branchgrpo::cli {
namespace {

struct compare_options {
  std::string model = "toy";  // toy | shapes
  int seeds = 5;
  int iters = 0;           // 0 = the model's default: toy 30 (toy's), shapes 16 (demo's)
  std::uint64_t seed = 0;  // the first seed; not given: toy 7, shapes 0 (the defaults of toy and demo)
  bool seed_given = false;
  int eval_every = 0;     // 0 = toy 1, shapes a quarter of the run (demo's)
  int budget_iters = 0;   // K: the budget is dance's mean time for K iterations; 0 = --iters
  std::string model_dir;  // shapes: "" = models/shapes-tiny, as demo
  std::string out = "out/compare";
  bool json = false;
  bool quiet = false;
  std::string remote_reward, remote_scorer;  // shapes: the alignment term from a reward server (as demo's)
  // --methods' entries (cli/runs/method_variant.hpp); none: dance and the four BranchGRPO variants.
  std::vector<std::string> methods;
};

constexpr double confidence = 0.95;
constexpr int toy_prompts = 8;         // toy's --prompts: every mode in every iteration
constexpr int toy_default_iters = 30;  // toy's --iters
constexpr std::uint64_t toy_default_seed = 7;
constexpr int shapes_default_iters = 16;   // demo's --iters
constexpr int shapes_max_iters = 100'000;  // demo's --iters limit

// --- One method trained with one seed --------------------------------------------------------------------------------

// The time axis of curves and budgets: wall seconds (the paper's), or CPU seconds of the process (all threads),
// which a shared machine's other load moves much less.
enum class clock_kind { wall, cpu };

struct run_record {
  std::string method;
  std::uint64_t seed = 0;
  std::vector<iteration_stats> stats;
  std::vector<double> cumulative;    // training seconds after iteration i + 1 (held-out evaluation excluded)
  std::vector<double> cpu_seconds;   // the process's CPU seconds in iteration i (all its threads)
  std::vector<int> eval_iterations;  // iterations done at each held-out evaluation; 0 (the base model) first
  std::vector<double> eval_rewards;  // the held-out reward at each

  [[nodiscard]] double base() const { return eval_rewards.front(); }
  [[nodiscard]] double final_reward() const { return eval_rewards.back(); }
  [[nodiscard]] double total_seconds() const { return cumulative.empty() ? 0.0 : cumulative.back(); }
  // Training time after iteration i + 1 on `clock`: wall seconds, or the process's CPU seconds summed.
  [[nodiscard]] std::vector<double> times(clock_kind clock) const {
    if (clock == clock_kind::wall) return cumulative;
    std::vector<double> t;
    for (const double c : cpu_seconds) t.push_back((t.empty() ? 0.0 : t.back()) + c);
    return t;
  }
  // The held-out reward against training time: (0, base), then each evaluation at its cumulative time.
  [[nodiscard]] std::vector<double> eval_times(clock_kind clock) const {
    const std::vector<double> t = times(clock);
    std::vector<double> out;
    for (const int done : eval_iterations) out.push_back(done == 0 ? 0.0 : t[static_cast<std::size_t>(done - 1)]);
    return out;
  }
};

// CPU seconds of this process, every thread: next to the wall time, a cost the machine's other load barely moves.
double process_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Whether `done` iterations end with a held-out evaluation: every eval_every iterations and after the last.
bool evaluates_after(int done, int eval_every, int iters) { return done % eval_every == 0 || done == iters; }

// splitmix64: a fixed, portable stream for the prompt shuffle (std::shuffle's draws are the library's choice).
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The order in which a seed visits the prompts: position i of the run is prompt order[i]. The first seed keeps
// the identity (so it reproduces `toy --compare` and `demo`); the others shuffle (Fisher-Yates on splitmix64(seed)).
// Example: prompt_order(4, 9, true) == {0, 1, 2, 3}; prompt_order(4, 9, false) is a fixed permutation of it.
std::vector<std::int64_t> prompt_order(std::int64_t count, std::uint64_t seed, bool identity) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) order[static_cast<std::size_t>(i)] = i;
  if (identity) return order;
  std::uint64_t state = seed;
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[splitmix64(state) % i]);
  return order;
}

// The progress line: every run of every seed.
struct progress {
  run_progress bar;
  int runs_done = 0;
  int iters = 0;
  void update(const run_record& run, int seed_index, int seeds, int done, double reward) {
    bar.update(runs_done * iters + done,
               "seed " + std::to_string(seed_index + 1) + "/" + std::to_string(seeds) + " " + run.method + " " +
                   std::to_string(done) + "/" + std::to_string(iters),
               reward, run.cumulative.back() / done);
  }
};

struct seed_setup {
  int index = 0;  // k: the seed is first seed + k
  std::uint64_t seed = 0;
  std::vector<std::int64_t> order;
};

// --- One run of one method with one seed: the toy's or the shapes model's --------------------------------------------
// Both kinds have one shape, the one the per-seed loop (run_seed) drives: step() trains an iteration, iteration()
// counts those done, done() is true after --iters, evaluate() is the held-out reward now.

// The toy (as `toy --compare`): a copy of the base model trained on the variant's recipe with the table's
// overrides applied (make_variant_run), visiting the prompts in the seed's order.
class toy_run {
 public:
  toy_run(const method_variant& variant, const fourier_policy<host_backend>& base, const seed_setup& setup, int iters)
      : policy_(base),
        run_(make_variant_run(variant, base.options().optimizer.lr)),
        seed_(setup.seed),
        order_(setup.order),
        iters_(iters) {
    adam optimizer = policy_.options().optimizer;
    optimizer.lr = run_.lr;
    policy_.set_optimizer(optimizer);
  }

  iteration_stats step() {
    std::vector<std::int64_t> trained = prompts_(iteration_);
    for (std::int64_t& p : trained) p = order_[static_cast<std::size_t>(p)];
    const training_options training{.max_batch = 64,
                                    .seed = seed_,
                                    .updates_per_iteration = run_.updates,
                                    .total_iterations = iters_,
                                    .loss = run_.loss};
    return train_iteration(backend_, policy_, reward_, run_.recipe, schedule_, toy_latent_shape(), trained,
                           iteration_++, training);
  }
  [[nodiscard]] int iteration() const { return iteration_; }
  [[nodiscard]] bool done() const { return iteration_ >= iters_; }
  double evaluate() { return toy_runs::evaluate(policy_, schedule_, seed_).reward; }

 private:
  fourier_policy<host_backend> policy_;
  variant_run run_;
  std::uint64_t seed_;
  std::vector<std::int64_t> order_;
  int iters_;
  int iteration_ = 0;
  sigma_schedule schedule_ = shifted_linear_schedule(20);
  prompt_schedule prompts_{.prompt_count = toy_runs::eval_modes, .per_iteration = toy_prompts};
  mode_reward<> reward_;
  host_backend backend_;
};

#ifdef BRANCHGRPO_CLI_TORCH
// The demo's settings with this seed and its prompt order (demo's default rows 1, 5, 6, 11, reordered).
demo_runs::demo_options shapes_options(const compare_options& options, const seed_setup& setup) {
  demo_runs::demo_options d;
  d.out = options.out;
  d.model = options.model_dir;
  d.seed = setup.seed;
  d.remote_reward = options.remote_reward;
  d.remote_scorer = options.remote_scorer;
  const std::vector<std::int64_t> rows = demo_runs::parse_prompt_rows(demo_runs::prompt_rows(d));
  d.prompt_rows.clear();
  for (const std::int64_t i : setup.order) d.prompt_rows.push_back(std::to_string(rows[static_cast<std::size_t>(i)]));
  return d;
}

// The demo's configuration of the variant's method, with the table's overrides applied to its recipe and settings.
run_config shapes_config(const method_variant& variant, const demo_runs::demo_options& d, int iterations) {
  run_config config = demo_runs::demo_config(d, iterations, variant.method);
  // demo_config writes each method's files under its name; a variant keeps its own.
  if (!variant.plain()) config.run.output_dir = (std::filesystem::path(d.out) / ("variant-" + variant.label)).string();
  run_recipe& recipe = config.recipe;
  apply_overrides(variant,
                  {recipe.topology, recipe.stepper, recipe.correlator, recipe.fusion, recipe.normalizer.normalizer,
                   recipe.pruner, recipe.objective, config.run.updates_per_iteration, config.optimizer.lr, config.loss},
                  {.label = variant.label, .method = variant.method});
  recipe.normalizer.use_fusion(recipe.fusion);  // a per-reward stage fuses with the run's fusion, as in a config
  return config;
}

// The shapes model (as `demo`): the demo's trainer on shapes_config.
class shapes_run {
 public:
  shapes_run(const method_variant& variant, const demo_runs::demo_options& d, int iters)
      : d_(d), trainer_(demo_runs::make_run(shapes_config(variant, d, iters), d)) {}

  iteration_stats step() { return trainer_->step(); }
  [[nodiscard]] int iteration() const { return trainer_->iteration(); }
  [[nodiscard]] bool done() const { return trainer_->done(); }
  double evaluate() { return demo_runs::evaluate(*trainer_, d_).reward; }

 private:
  const demo_runs::demo_options& d_;
  std::unique_ptr<training_run> trainer_;
};
#endif

// --- The per-seed loop -----------------------------------------------------------------------------------------------

// One run trained to the end and recorded: per iteration its statistics and times, and the held-out reward after
// every eval_every iterations and the last, from `base_reward` at iteration 0.
template <class Run>
run_record record_run(Run& run, const method_variant& variant, const seed_setup& setup, double base_reward,
                      const compare_options& options, progress& bar) {
  run_record record{.method = variant.label,
                    .seed = setup.seed,
                    .stats = {},
                    .cumulative = {},
                    .cpu_seconds = {},
                    .eval_iterations = {0},
                    .eval_rewards = {base_reward}};
  while (!run.done()) {
    const double cpu = process_cpu_seconds();
    const iteration_stats stats = run.step();
    record.cpu_seconds.push_back(process_cpu_seconds() - cpu);
    record.stats.push_back(stats);
    record.cumulative.push_back(record.total_seconds() + stats.seconds);
    const int done = run.iteration();
    if (evaluates_after(done, options.eval_every, options.iters)) {
      record.eval_iterations.push_back(done);
      record.eval_rewards.push_back(run.evaluate());
    }
    bar.update(record, setup.index, options.seeds, done, stats.reward_mean);
  }
  return record;
}

// Seed k: each method's run, made by start(variant) (a toy_run or a shapes_run), trained and passed to each(record)
// in turn. Every run starts from the same base model, whose held-out reward is read once, from the first run before
// it trains (for the shapes model also the warm-up before the seed's first timing).
template <class Start, class Each>
void run_seed(const seed_setup& setup, const compare_options& options, const std::vector<method_variant>& methods,
              progress& bar, Start&& start, Each&& each) {
  std::optional<double> base_reward;
  for (const method_variant& variant : methods) {
    auto run = start(variant);
    if (!base_reward) base_reward = run.evaluate();
    each(record_run(run, variant, setup, *base_reward, options, bar));
    ++bar.runs_done;
  }
}

// --- Statistics over the seeds ---------------------------------------------------------------------------------------

// The t interval, or NaN everywhere when a value is not finite (a run whose reward became NaN): the summary still
// prints, and the JSON holds null.
mean_interval interval_of(const std::vector<double>& values) {
  for (const double v : values)
    if (!std::isfinite(v)) {
      constexpr double nan = std::numeric_limits<double>::quiet_NaN();
      return {.mean = nan,
              .low = nan,
              .high = nan,
              .half_width = nan,
              .t = nan,
              .standard_deviation = nan,
              .count = values.size()};
    }
  return t_interval(values, confidence);
}

// The training reward against training time, without iterations whose reward is NaN (every tree dropped).
double train_reward_at(const run_record& run, double seconds, clock_kind clock) {
  const std::vector<double> at = run.times(clock);
  std::vector<double> times, values;
  for (std::size_t i = 0; i < run.stats.size(); ++i)
    if (std::isfinite(run.stats[i].reward_mean)) {
      times.push_back(at[i]);
      values.push_back(run.stats[i].reward_mean);
    }
  return times.empty() ? std::numeric_limits<double>::quiet_NaN() : curve_at(times, values, seconds);
}

double heldout_at(const run_record& run, double seconds, clock_kind clock) {
  const std::vector<double> times = run.eval_times(clock);
  for (const double r : run.eval_rewards)
    if (!std::isfinite(r)) return std::numeric_limits<double>::quiet_NaN();
  return curve_at(times, run.eval_rewards, seconds);
}

struct method_summary {
  std::string name;
  mean_interval base, final_reward, gain, gain_vs_dance, seconds_per_iter, time_ratio, cpu_seconds_per_iter,
      cpu_time_ratio;
  // Per clock (wall, cpu): the held-out and training reward at the budget, and the final reward minus dance's at
  // the time the run ended.
  std::array<mean_interval, 2> at_budget, train_at_budget, equal_time;
  std::array<double, 2> total_seconds{};
  double evaluations = 0, update_evaluations = 0, edges = 0, edges_trained = 0;  // per iteration
  int trees_dropped = 0;
};

constexpr std::array<clock_kind, 2> clocks = {clock_kind::wall, clock_kind::cpu};

// The summary of one method's runs, one per seed (runs[k]: seed k), against dance's runs of the same seeds.
// budgets[c]: the budget on clock c.
method_summary summarize_method(const std::vector<run_record>& runs, const std::vector<run_record>& dance,
                                const std::array<double, 2>& budgets) {
  method_summary s;
  s.name = runs.front().method;
  std::vector<double> base, final_reward, gain, vs_dance, per_iter, ratio, cpu, cpu_ratio;
  std::array<std::vector<double>, 2> at_budget, train_at_budget, equal_time, total;
  double iterations = 0;
  const auto cpu_per_iter = [](const run_record& run) {
    double sum = 0;
    for (const double c : run.cpu_seconds) sum += c;
    return sum / static_cast<double>(run.cpu_seconds.size());
  };
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const run_record& r = runs[k];
    base.push_back(r.base());
    final_reward.push_back(r.final_reward());
    gain.push_back(r.final_reward() - r.base());
    vs_dance.push_back(gain.back() - (dance[k].final_reward() - dance[k].base()));
    for (std::size_t c = 0; c < clocks.size(); ++c) {
      const double end = r.times(clocks[c]).back();
      // At equal time: this run's final reward against dance's (same seed) when this run ended.
      equal_time[c].push_back(r.final_reward() - heldout_at(dance[k], end, clocks[c]));
      at_budget[c].push_back(heldout_at(r, budgets[c], clocks[c]));
      train_at_budget[c].push_back(train_reward_at(r, budgets[c], clocks[c]));
      total[c].push_back(end);
    }
    const auto n = static_cast<double>(r.stats.size());
    per_iter.push_back(r.total_seconds() / n);
    ratio.push_back(per_iter.back() / (dance[k].total_seconds() / static_cast<double>(dance[k].stats.size())));
    cpu.push_back(cpu_per_iter(r));
    cpu_ratio.push_back(cpu.back() / cpu_per_iter(dance[k]));
    for (const iteration_stats& it : r.stats) {
      s.evaluations += static_cast<double>(it.rollout_evaluations);
      s.update_evaluations += static_cast<double>(it.update_evaluations);
      s.edges += static_cast<double>(it.edges);
      s.edges_trained += static_cast<double>(it.edges_trained);
      s.trees_dropped += it.trees_dropped;
    }
    iterations += n;
  }
  s.base = interval_of(base);
  s.final_reward = interval_of(final_reward);
  s.gain = interval_of(gain);
  s.gain_vs_dance = interval_of(vs_dance);
  for (std::size_t c = 0; c < clocks.size(); ++c) {
    s.at_budget[c] = interval_of(at_budget[c]);
    s.train_at_budget[c] = interval_of(train_at_budget[c]);
    s.equal_time[c] = interval_of(equal_time[c]);
    s.total_seconds[c] = sample_mean(total[c]);
  }
  s.seconds_per_iter = interval_of(per_iter);
  s.time_ratio = interval_of(ratio);
  s.cpu_seconds_per_iter = interval_of(cpu);
  s.cpu_time_ratio = interval_of(cpu_ratio);
  s.evaluations /= iterations;
  s.update_evaluations /= iterations;
  s.edges /= iterations;
  s.edges_trained /= iterations;
  return s;
}

// runs[m][k]: method m, seed k. Method 0 is dance. budgets[c]: the budget on clock c.
std::vector<method_summary> summarize(const std::vector<std::vector<run_record>>& runs,
                                      const std::array<double, 2>& budgets) {
  std::vector<method_summary> out;
  for (const std::vector<run_record>& method : runs) out.push_back(summarize_method(method, runs.front(), budgets));
  return out;
}

// --- Files -----------------------------------------------------------------------------------------------------------

std::string csv_number(double value) {
  if (!std::isfinite(value)) return "nan";
  std::ostringstream out;
  out << std::setprecision(9) << value;
  return out.str();
}

// One row per run and iteration done, 0 (before training: the base model's held-out reward) first.
void write_csv(const std::filesystem::path& path, const std::vector<std::vector<run_record>>& runs) {
  std::ostringstream out;
  out << "method,seed,iteration,seconds,cumulative_seconds,cpu_seconds,train_reward,heldout_reward\n";
  for (const std::vector<run_record>& method : runs)
    for (const run_record& r : method) {
      std::size_t next_eval = 0;
      for (int done = 0; done <= static_cast<int>(r.stats.size()); ++done) {
        double heldout = std::numeric_limits<double>::quiet_NaN();
        if (next_eval < r.eval_iterations.size() && r.eval_iterations[next_eval] == done)
          heldout = r.eval_rewards[next_eval++];
        const auto i = static_cast<std::size_t>(done > 0 ? done - 1 : 0);
        out << r.method << ',' << r.seed << ',' << done << ',' << csv_number(done > 0 ? r.stats[i].seconds : 0.0) << ','
            << csv_number(done > 0 ? r.cumulative[i] : 0.0) << ',' << csv_number(done > 0 ? r.cpu_seconds[i] : 0.0)
            << ',' << csv_number(done > 0 ? r.stats[i].reward_mean : std::numeric_limits<double>::quiet_NaN()) << ','
            << csv_number(heldout) << '\n';
      }
    }
  write_file(path, out.str());
}

// A line chart whose lines carry a shaded band (the interval) and a dashed vertical marker (the budget).
struct band_series {
  std::string name;
  rgb colour;
  std::vector<double> x, mean, low, high;
};

struct band_chart {
  std::string title, caption, x_label, y_label;
  int width = 960, height = 580;
  std::vector<band_series> bands;
  double marker = std::numeric_limits<double>::quiet_NaN();
  std::string marker_label;
};

rgb blend(rgb under, rgb over, double alpha) {
  const auto mix = [alpha](std::uint8_t a, std::uint8_t b) {
    return static_cast<std::uint8_t>(std::lround((1 - alpha) * a + alpha * b));
  };
  return {mix(under.r, over.r), mix(under.g, over.g), mix(under.b, over.b)};
}

rgb_image render(const band_chart& chart) {
  double x_high = 0, y_low = std::numeric_limits<double>::infinity(), y_high = -y_low;
  for (const band_series& s : chart.bands)
    for (std::size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.low[i]) && std::isfinite(s.high[i])) {
        x_high = std::max(x_high, s.x[i]);
        y_low = std::min(y_low, s.low[i]);
        y_high = std::max(y_high, s.high[i]);
      }
  if (std::isfinite(chart.marker)) x_high = std::max(x_high, chart.marker);
  if (!std::isfinite(y_low)) y_low = y_high = 0;
  const std::vector<double> x_ticks = nice_ticks(0, x_high, 8), y_ticks = nice_ticks(y_low, y_high, 6);

  canvas c(chart.width, chart.height);
  int legend_width = 0;
  for (const band_series& s : chart.bands) legend_width = std::max(legend_width, canvas::text_width(s.name, 2));
  const int left = 80, right = chart.width - (legend_width + 60), top = 64, bottom = chart.height - 60;
  const double x0 = x_ticks.front(), x1 = x_ticks.back(), y0 = y_ticks.front(), y1 = y_ticks.back();
  const auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (right - left); };
  const auto py = [&](double y) { return bottom - (y - y0) / (y1 - y0) * (bottom - top); };

  draw_grid(c, x_ticks, y_ticks, left, right, top, bottom, px, py);
  // Bands: every pixel column under a series, shaded between its interpolated low and high, blended so that
  // overlapping bands stay visible.
  for (const band_series& s : chart.bands) {
    if (s.x.size() < 2) continue;
    const int first = static_cast<int>(std::ceil(px(s.x.front()))), last = static_cast<int>(std::floor(px(s.x.back())));
    for (int column = first; column <= last; ++column) {
      const double x = x0 + (column - left) / static_cast<double>(right - left) * (x1 - x0);
      const double low = curve_at(s.x, s.low, x), high = curve_at(s.x, s.high, x);
      const int y_top = static_cast<int>(std::lround(py(high))), y_bottom = static_cast<int>(std::lround(py(low)));
      for (int y = std::max(top, y_top); y <= std::min(bottom, y_bottom); ++y)
        c.set(column, y, blend(c.at(column, y), s.colour, 0.22));
    }
  }
  c.line(left, top, left, bottom, axis_grey);
  c.line(left, bottom, right, bottom, axis_grey);
  if (std::isfinite(chart.marker)) {
    const double at = px(chart.marker);
    for (int y = top; y < bottom; y += 8) c.line(at, y, at, std::min(y + 4, bottom), axis_grey, 2);
    c.text(static_cast<int>(std::lround(at)) - canvas::text_width(chart.marker_label) - 4, top + 4, chart.marker_label,
           axis_grey);
  }
  for (const band_series& s : chart.bands)
    for (std::size_t i = 1; i < s.x.size(); ++i)
      c.line(px(s.x[i - 1]), py(s.mean[i - 1]), px(s.x[i]), py(s.mean[i]), s.colour, 2);
  c.text((chart.width - canvas::text_width(chart.title, 2)) / 2, 10, chart.title, black, 2);
  c.text((chart.width - canvas::text_width(chart.caption)) / 2, 32, chart.caption, axis_grey);
  c.text((left + right - canvas::text_width(chart.x_label)) / 2, bottom + 26, chart.x_label, black);
  c.text(8, top - 16, chart.y_label, black);
  for (std::size_t i = 0; i < chart.bands.size(); ++i) {
    const int y = top + 10 + static_cast<int>(i) * 24;
    c.fill_rect(right + 15, y, right + 35, y + 14, blend(white, chart.bands[i].colour, 0.22));
    c.line(right + 15, y + 7, right + 35, y + 7, chart.bands[i].colour, 3);
    c.text(right + 42, y, chart.bands[i].name, black, 2);
  }
  return c.image();
}

// Each method's held-out reward against training time: at 60 times from 0 to its mean total time, the mean over
// the seeds of each seed's curve read at that time (curve_at) and its interval.
void write_plot(const std::filesystem::path& path, const std::vector<std::vector<run_record>>& runs,
                const std::vector<method_summary>& summaries, double budget, clock_kind clock, const std::string& model,
                int seeds) {
  const bool cpu = clock == clock_kind::cpu;
  band_chart chart{.title = (model == "toy" ? "TOY" : "SHAPES") + std::string(": HELD-OUT REWARD VS TRAINING ") +
                            (cpu ? "CPU TIME" : "TIME"),
                   .caption = "MEAN OVER " + std::to_string(seeds) + " SEEDS; BANDS: 95% STUDENT-T INTERVAL",
                   .x_label = cpu ? "CUMULATIVE TRAINING CPU TIME, ALL THREADS (S)" : "CUMULATIVE TRAINING TIME (S)",
                   .y_label = "HELD-OUT MEAN REWARD",
                   .width = 960,
                   .height = 580,
                   .bands = {},
                   .marker = budget,
                   .marker_label = "BUDGET"};
  constexpr int points = 60;
  for (std::size_t m = 0; m < runs.size(); ++m) {
    band_series s{
        .name = summaries[m].name, .colour = palette[m % palette.size()], .x = {}, .mean = {}, .low = {}, .high = {}};
    for (int j = 0; j <= points; ++j) {
      const double t = summaries[m].total_seconds[cpu ? 1 : 0] * j / points;
      std::vector<double> at;
      for (const run_record& r : runs[m]) at.push_back(heldout_at(r, t, clock));
      const mean_interval ci = interval_of(at);
      if (!std::isfinite(ci.mean)) continue;
      s.x.push_back(t);
      s.mean.push_back(ci.mean);
      s.low.push_back(ci.low);
      s.high.push_back(ci.high);
    }
    chart.bands.push_back(std::move(s));
  }
  write_png(path.string(), render(chart));
}

// --- Output ----------------------------------------------------------------------------------------------------------

nlohmann::json summary_json(const std::vector<method_summary>& summaries, const compare_options& options,
                            const std::array<double, 2>& budgets) {
  nlohmann::json result = nlohmann::json::object();
  const auto put = [](nlohmann::json& j, const std::string& key, const mean_interval& ci) {
    j[key + "_mean"] = ci.mean;
    j[key + "_ci_low"] = ci.low;
    j[key + "_ci_high"] = ci.high;
  };
  for (const method_summary& s : summaries) {
    nlohmann::json j = {{"model", options.model},
                        {"seeds", options.seeds},
                        {"first_seed", options.seed},
                        {"iterations", options.iters},
                        {"eval_every", options.eval_every},
                        {"interval", "student-t"},
                        {"confidence", confidence},
                        {"t_quantile", s.gain.t},
                        {"gain_std", s.gain.standard_deviation},
                        {"budget_iterations", options.budget_iters},
                        {"budget_seconds", budgets[0]},
                        {"cpu_budget_seconds", budgets[1]},
                        {"total_seconds_mean", s.total_seconds[0]},
                        {"total_cpu_seconds_mean", s.total_seconds[1]},
                        {"time_ratio_vs_dance", s.time_ratio.mean},
                        {"time_ratio_ci_low", s.time_ratio.low},
                        {"time_ratio_ci_high", s.time_ratio.high},
                        {"evaluations", s.evaluations},
                        {"update_evaluations", s.update_evaluations},
                        {"edges", s.edges},
                        {"edges_trained", s.edges_trained},
                        {"trees_dropped", s.trees_dropped}};
    put(j, "gain", s.gain);
    put(j, "base_reward", s.base);
    put(j, "final_reward", s.final_reward);
    put(j, "gain_vs_dance", s.gain_vs_dance);
    put(j, "reward_at_budget", s.at_budget[0]);
    put(j, "train_reward_at_budget", s.train_at_budget[0]);
    put(j, "vs_dance_at_equal_time", s.equal_time[0]);
    put(j, "reward_at_cpu_budget", s.at_budget[1]);
    put(j, "train_reward_at_cpu_budget", s.train_at_budget[1]);
    put(j, "vs_dance_at_equal_cpu_time", s.equal_time[1]);
    put(j, "seconds_per_iter", s.seconds_per_iter);
    put(j, "cpu_seconds_per_iter", s.cpu_seconds_per_iter);
    put(j, "cpu_time_ratio_vs_dance", s.cpu_time_ratio);
    result[s.name] = std::move(j);
  }
  return result;
}

std::string fixed(double value, int digits, bool sign = false) {
  if (!std::isfinite(value)) return "nan";
  std::ostringstream out;
  if (sign) out << std::showpos;
  out << std::fixed << std::setprecision(digits) << value;
  return out.str();
}

std::string with_interval(const mean_interval& ci, int digits, bool sign) {
  return fixed(ci.mean, digits, sign) + " [" + fixed(ci.low, digits, sign) + ", " + fixed(ci.high, digits, sign) + "]";
}

void print_table(const std::vector<method_summary>& summaries, const compare_options& options,
                 const std::array<double, 2>& budgets) {
  const method_summary& dance = summaries.front();
  // The method column fits the longest label (a --methods variant such as branch:scope=per_batch), at least 15.
  int name_width = 15;
  for (const method_summary& s : summaries) name_width = std::max(name_width, static_cast<int>(s.name.size()) + 1);
  std::cout << "compare: " << options.model << " model, " << summaries.size() << " methods x " << options.seeds
            << " seeds (" << options.seed << " to " << options.seed + static_cast<std::uint64_t>(options.seeds - 1)
            << ") x " << options.iters << " iterations, from one base model\n"
            << "held-out reward: "
            << (options.model == "toy" ? "ODE mean mode_reward (8 prompts x 64 samples)"
                                       : "ODE samples' alignment + 0.1 x JPEG compressibility (4 prompts x 8 samples)")
            << ", evaluated every " << options.eval_every << " iterations; gain = after - before, per seed\n"
            << "intervals: 95% Student-t over the " << options.seeds << " seeds (t_{0.975, " << options.seeds - 1
            << "} = " << fixed(dance.gain.t, 3) << ")\n\n";
  std::cout << std::left << std::setw(name_width) << "method" << std::right << std::setw(8) << "base" << std::setw(28)
            << "gain [95% CI]" << std::setw(28) << "gain - dance [95% CI]" << std::setw(9) << "s/iter" << std::setw(21)
            << "vs dance [95% CI]" << std::setw(21) << "cpu vs dance" << '\n';
  for (const method_summary& s : summaries)
    std::cout << std::left << std::setw(name_width) << s.name << std::right << std::setw(8) << fixed(s.base.mean, 4)
              << std::setw(28) << with_interval(s.gain, 4, true) << std::setw(28)
              << with_interval(s.gain_vs_dance, 4, true) << std::setw(9) << fixed(s.seconds_per_iter.mean, 3)
              << std::setw(21) << with_interval(s.time_ratio, 2, false) << std::setw(21)
              << with_interval(s.cpu_time_ratio, 2, false) << '\n';
  std::cout << "(vs dance: seconds per iteration over dance's, per seed; cpu: the same in process CPU seconds)\n\n"
            << "budget: dance's mean training time for " << options.budget_iters << " iterations, "
            << fixed(budgets[0], 3) << " s wall, " << fixed(budgets[1], 3)
            << " s CPU; each seed's held-out curve read there (its last value after a run ends)\n";
  std::cout << std::left << std::setw(name_width) << "method" << std::right << std::setw(26) << "reward@budget [95% CI]"
            << std::setw(28) << "- dance at equal time" << std::setw(26) << "reward@cpu budget" << std::setw(28)
            << "- dance at equal cpu time" << '\n';
  for (const method_summary& s : summaries)
    std::cout << std::left << std::setw(name_width) << s.name << std::right << std::setw(26)
              << with_interval(s.at_budget[0], 4, false) << std::setw(28) << with_interval(s.equal_time[0], 4, true)
              << std::setw(26) << with_interval(s.at_budget[1], 4, false) << std::setw(28)
              << with_interval(s.equal_time[1], 4, true) << '\n';
  std::cout
      << "(- dance at equal time: final reward - dance's held-out reward at the time the run ended, per seed)\n\n";
}

// --- The command -----------------------------------------------------------------------------------------------------

// Bytes a run keeps per iteration (its statistics, its time, a possible evaluation): small, but the product of
// --seeds and --iters is not.
constexpr double bytes_per_iteration = sizeof(iteration_stats) + 4 * sizeof(double);

// What runs without --methods: DanceGRPO and the paper's four BranchGRPO variants.
constexpr std::array<std::string_view, 5> default_compared_methods = {"dance", "branch", "branch-widpru",
                                                                      "branch-deppru", "branch-mix"};

// --methods' entries parsed, plain dance first (every difference is taken to it: added when missing), each label
// once. Example: {"branch:s=1", "dance"} -> {dance, branch:s=1}.
std::vector<method_variant> compared_methods(const compare_options& options) {
  std::vector<method_variant> out;
  if (options.methods.empty())
    for (const std::string_view name : default_compared_methods) out.push_back(parse_method_variant(name));
  for (const std::string& entry : options.methods) {
    method_variant variant = parse_method_variant(entry);
    (void)make_variant_run(variant, 1.0);  // refuses an override the method cannot take, before any run
    for (const method_variant& earlier : out)
      require(earlier.label != variant.label, "--methods: '", entry, "' is listed twice");
    out.push_back(std::move(variant));
  }
  const auto dance =
      std::find_if(out.begin(), out.end(), [](const method_variant& m) { return m.plain() && m.method == "dance"; });
  if (dance == out.end())
    out.insert(out.begin(), parse_method_variant("dance"));
  else
    std::rotate(out.begin(), dance, dance + 1);
  return out;
}

void validate(compare_options& options) {
  // Ranges are checked as the flags are parsed (number_options.hpp); here what depends on the model.
  require(options.model == "toy" || options.model == "shapes", "--model = ", options.model,
          ": unknown model (expected toy or shapes)");
#ifndef BRANCHGRPO_CLI_TORCH
  if (options.model == "shapes")
    fail(
        "branchgrpo compare --model shapes needs the LibTorch adapter (not built): install LibTorch, toml++ and "
        "TurboJPEG (scripts/setup.sh) and rebuild");
#endif
  const bool toy = options.model == "toy";
  require(toy || options.iters <= shapes_max_iters, "--iters = ", options.iters, ": must be at most ", shapes_max_iters,
          " with --model shapes");
  require(!toy || options.model_dir.empty(), "--model-dir = ", options.model_dir,
          ": only --model shapes loads a model");
  require(!toy || options.remote_reward.empty(), "--remote-reward = ", options.remote_reward,
          ": only --model shapes scores with a reward server (the toy's reward is closed-form)");
  require(options.remote_scorer.empty() || !options.remote_reward.empty(), "--remote-scorer = ", options.remote_scorer,
          ": needs --remote-reward");
  if (options.iters == 0) options.iters = toy ? toy_default_iters : shapes_default_iters;
  if (!options.seed_given) options.seed = toy ? toy_default_seed : 0;
  if (options.eval_every == 0) options.eval_every = toy ? 1 : std::max(1, options.iters / 4);
  require(options.budget_iters <= options.iters, "--budget-iters = ", options.budget_iters,
          ": must be at most --iters = ", options.iters);
  if (options.budget_iters == 0) options.budget_iters = options.iters;
  const std::uint64_t last = std::numeric_limits<std::uint64_t>::max();
  require(options.seed <= last - static_cast<std::uint64_t>(options.seeds - 1), "--seed = ", options.seed,
          ": with --seeds = ", options.seeds, " the last seed would exceed 2^64 - 1");
  require_fits(static_cast<double>(options.seeds) * static_cast<double>(compared_methods(options).size()) *
                   options.iters * bytes_per_iteration,
               setting_text("--seeds", options.seeds) + ", " + setting_text("--iters", options.iters),
               "the record of every iteration");
}

// Every seed's run of every method: runs[m][k] is method m with seed k. Seed k starts with method k mod M, so no
// method always runs first (or right after the base evaluation).
std::vector<std::vector<run_record>> run_all_seeds(const compare_options& options,
                                                   const std::vector<method_variant>& methods) {
  std::vector<std::vector<run_record>> runs(methods.size());
  progress bar{.bar = run_progress(!options.quiet, options.seeds * static_cast<int>(methods.size()) * options.iters),
               .runs_done = 0,
               .iters = options.iters};
  const bool toy = options.model == "toy";
  std::optional<fourier_policy<host_backend>> toy_base;  // fitted once, copied per run
  if (toy) toy_base.emplace(make_toy_policy(options.seed));
  for (int k = 0; k < options.seeds; ++k) {
    const std::uint64_t seed = options.seed + static_cast<std::uint64_t>(k);
    const seed_setup setup{
        .index = k, .seed = seed, .order = prompt_order(toy ? toy_runs::eval_modes : 4, seed, k == 0)};
    std::vector<method_variant> rotated;
    for (std::size_t j = 0; j < methods.size(); ++j)
      rotated.push_back(methods[(j + static_cast<std::size_t>(k)) % methods.size()]);
    const auto keep = [&](run_record run) {
      const auto m = static_cast<std::size_t>(
          std::find_if(methods.begin(), methods.end(), [&](const method_variant& v) { return v.label == run.method; }) -
          methods.begin());
      runs[m].push_back(std::move(run));
    };
    if (toy)
      run_seed(
          setup, options, rotated, bar,
          [&](const method_variant& v) { return toy_run(v, *toy_base, setup, options.iters); }, keep);
#ifdef BRANCHGRPO_CLI_TORCH
    else {
      const demo_runs::demo_options d = shapes_options(options, setup);
      run_seed(
          setup, options, rotated, bar, [&](const method_variant& v) { return shapes_run(v, d, options.iters); }, keep);
    }
#endif
  }
  bar.bar.clear();
  return runs;
}

void run_compare(compare_options options) {
  validate(options);
  // Created and written once before any training (make_directory), not found unwritable when the runs are done.
  const std::filesystem::path out = make_directory(options.out);
  const std::vector<std::vector<run_record>> runs = run_all_seeds(options, compared_methods(options));  // dance first

  // The budget on each clock: dance's mean (over the seeds) training time for its first budget_iters iterations.
  std::array<double, 2> budgets{};
  for (std::size_t c = 0; c < clocks.size(); ++c) {
    std::vector<double> dance_times;
    for (const run_record& r : runs.front())
      dance_times.push_back(r.times(clocks[c])[static_cast<std::size_t>(options.budget_iters - 1)]);
    budgets[c] = sample_mean(dance_times);
  }
  const std::vector<method_summary> summaries = summarize(runs, budgets);
  const nlohmann::json summary = summary_json(summaries, options, budgets);
  const std::vector<std::filesystem::path> files = {out / "runs.csv", out / "reward_vs_time.png",
                                                    out / "reward_vs_cpu_time.png", out / "summary.json"};
  write_csv(files[0], runs);
  write_plot(files[1], runs, summaries, budgets[0], clock_kind::wall, options.model, options.seeds);
  write_plot(files[2], runs, summaries, budgets[1], clock_kind::cpu, options.model, options.seeds);
  write_file(files[3], summary.dump(2) + "\n");
  if (options.json) {
    std::cout << summary.dump() << '\n';
    return;
  }
  print_table(summaries, options, budgets);
  std::cout << "wrote";
  for (const auto& file : files) std::cout << ' ' << file.string();
  std::cout << '\n';
}

}  // namespace

void add_compare_command(CLI::App& app) {
  auto options = std::make_shared<compare_options>();
  CLI::App* compare = app.add_subcommand(
      "compare", "Train dance and every BranchGRPO variant with N seeds; means and 95% Student-t intervals");
  compare->add_option("--model", options->model, "toy (2-D, no LibTorch) or shapes (the shipped model, as demo)")
      ->type_name("toy|shapes")
      ->capture_default_str();
  // --seeds: at least 2 for an interval; the product with --iters is checked against memory (validate).
  add_integer(compare, "--seeds", options->seeds, "Seeds per method (first seed, first seed + 1, ...)", 2, 10'000)
      ->type_name("N")
      ->capture_default_str();
  add_integer(compare, "--iters", options->iters,
              "Iterations per run (default: toy 30, shapes 16; shapes at most 100000)", 1,
              static_cast<int>(max_noise_iteration))
      ->type_name("N");
  CLI::Option* seed = add_integer(compare, "--seed", options->seed,
                                  "First seed (default: toy 7, shapes 0): keys the noise and the held-out set; the "
                                  "toy's base model is fitted with it")
                          ->type_name("S");
  add_integer(compare, "--eval-every", options->eval_every,
              "Held-out evaluation every N iterations, and after the last (default: toy 1, shapes a quarter)", 1,
              static_cast<int>(max_noise_iteration))
      ->type_name("N");
  add_integer(compare, "--budget-iters", options->budget_iters,
              "The budget: dance's mean training time for its first K iterations (default: --iters)", 1,
              static_cast<int>(max_noise_iteration))
      ->type_name("K");
  compare->add_option("--model-dir", options->model_dir, "--model shapes: the model (default models/shapes-tiny)")
      ->type_name("DIR");
  compare->add_option("--out", options->out, "Directory for runs.csv, the two PNG plots and summary.json (created)")
      ->type_name("DIR")
      ->capture_default_str();
  add_text_list(compare, "--methods", options->methods,
                "Methods to compare, comma-separated, each a name with optional :key=value overrides (" +
                    name_list(override_keys(), ", ") +
                    "; e.g. branch:scope=per_batch); dance is always included, first (default: dance, branch, "
                    "branch-widpru, branch-deppru, branch-mix)");
  compare->add_flag("--json", options->json, "One JSON object keyed by method, nothing else");
  compare->add_flag("--quiet", options->quiet, "No progress bar");
#ifdef BRANCHGRPO_CLI_TORCH
  demo_runs::add_remote_reward_options(compare, options->remote_reward, options->remote_scorer);
#endif
  compare->callback([options, seed] {
    const stop_signals stop;  // SIGINT / SIGTERM: one line and exit 128 + signal within a rollout step
    options->seed_given = seed->count() > 0;
    run_compare(*options);
  });
}

}  // namespace branchgrpo::cli
