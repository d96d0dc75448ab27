#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "branchgrpo/app/iteration_trace.hpp"
#include "branchgrpo/app/run_memory.hpp"
#include "branchgrpo/app/training_run.hpp"
#include "branchgrpo/config/config_text.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/hash.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/distributed/consistency.hpp"
#include "branchgrpo/files/input_file.hpp"
#include "cli/commands.hpp"
#include "cli/images/image_grid.hpp"
#include "cli/images/png.hpp"
#include "cli/options/memory_budget.hpp"
#include "cli/options/number_options.hpp"
#include "cli/output/output_file.hpp"
#include "cli/runs/evaluation_output.hpp"
#include "cli/runs/run_support.hpp"
#include "cli/runs/signals.hpp"

#if defined(BRANCHGRPO_C10D_GLOO)
#include "branchgrpo/torch/distributed.hpp"
#endif

namespace branchgrpo::cli {
namespace {

struct train_options {
  std::string config;
  bool resume = false;
  bool json = false;
  bool quiet = false;
  bool memory = false;           // print the memory estimate and exit (nothing loaded)
  double timeout_seconds = 300;  // multi-process: the longest wait for a rank (distributed_options)
  std::string trace;             // a directory: every iteration's trace (app/iteration_trace.hpp); "" for none
};

// The run's memory is estimated from the config and the model files' headers and compared with what this process
// may use before anything is loaded (app/run_memory.hpp): a 2^24-leaf tree is one line, not an OOM kill.
// As rank communicator.rank() of its group (optimizer.sharding shards over it).
template <Communicator Comm>
std::unique_ptr<training_run> make_run(const run_config& config, Comm& communicator) {
  check_run_memory_before_loading(config, available_memory(), communicator.size());
  run_model model = load_run_model(config);
  weighted_sum reward = make_run_reward(config, model);
  return std::make_unique<training_run>(config, std::move(model), std::move(reward), communicator);
}
std::unique_ptr<training_run> make_run(const run_config& config) {
  return make_run(config, branchgrpo::detail::one_process());  // one rank, for the life of the process
}

// The leaf images of an iteration: one row per tree, its leaves side by side.
void write_leaf_grid(const std::filesystem::path& path, training_run& run, int iteration) {
  const torch::Tensor& images = run.last_images();
  const std::vector<std::int64_t>& prompts = run.last_prompts();
  if (!images.defined() || images.size(0) == 0) return;
  const std::int64_t trees = run.last_tree_count();  // this rank's trees (all of them on one process)
  const std::int64_t per_tree = images.size(0) / trees;
  image_grid grid{.title = "ITERATION " + std::to_string(iteration) + ": LEAVES",
                  .columns = static_cast<int>(per_tree),
                  .scale = images.size(-2) <= 32 ? 4 : 1,
                  .row_labels = {},
                  .column_labels = {},
                  .cells = to_cells(images)};
  for (std::int64_t t = 0; t < trees; ++t)
    grid.row_labels.push_back(
        run.model().prompts[static_cast<std::size_t>(prompts[static_cast<std::size_t>(t * per_tree)])]);
  write_png(path.string(), render(grid));
}

void print_header(std::ostream& out) {
  out << std::setw(5) << "iter" << std::setw(10) << "reward" << std::setw(9) << "std" << std::setw(8) << "evals"
      << std::setw(9) << "trained" << std::setw(9) << "dropped" << std::setw(11) << "loss" << std::setw(10) << "seconds"
      << '\n';
}

void print_row(std::ostream& out, const iteration_stats& s) {
  std::ostringstream row;
  row << std::setw(5) << s.iteration << std::fixed << std::setprecision(4) << std::setw(10) << s.reward_mean
      << std::setw(9) << s.reward_std << std::setw(8) << s.rollout_evaluations << std::setw(9) << s.edges_trained
      << std::setw(9) << s.trees_dropped << std::scientific << std::setprecision(2) << std::setw(11) << s.loss
      << std::fixed << std::setprecision(3) << std::setw(10) << s.seconds << '\n';
  out << row.str() << std::flush;
}

// One line of a held-out evaluation: "eval after 10 iterations: reward 0.6123 [0.5901, 0.6345] alignment 0.6123
// (2.1 s)" (the weighted reward's mean and 95 % interval, then each reward's mean).
void print_evaluation(std::ostream& out, const nlohmann::json& row) {
  const auto number = [](const nlohmann::json& v) {
    if (v.is_null()) return std::string("nan");
    std::ostringstream text;
    text << std::fixed << std::setprecision(4) << v.get<double>();
    return text.str();
  };
  std::ostringstream line;
  line << "eval after " << row["iteration"].get<int>() << " iterations: reward " << number(row["reward_mean"]) << " ["
       << number(row["reward_low"]) << ", " << number(row["reward_high"]) << "]";
  for (const auto& [key, value] : row.items())
    if (key.starts_with("reward/") && key.find('/', 7) == std::string::npos)
      line << " " << key.substr(7) << " " << number(value);
  line << std::fixed << std::setprecision(1) << " (" << row["seconds"].get<double>() << " s)\n";
  out << line.str() << std::flush;
}

// The config of every (re)start, kept: <out>/configs/config-<iteration>.toml (the file as given) and
// config-<iteration>.canonical.toml (every key's effective value and the inputs' checksums), never overwriting an
// earlier start's ("-2", "-3", ... when a run restarts twice from one iteration); <out>/config.toml is the latest.
void keep_config(const std::filesystem::path& out, const std::string& config_file, training_run& run) {
  const std::string text = read_input_file(config_file, input_kinds::config);
  const std::filesystem::path dir = make_directory(out / "configs");
  const std::string stem = "config-" + zero_padded(run.iteration(), 6);
  std::string name = stem;
  for (int n = 2;
       std::filesystem::exists(dir / (name + ".toml")) || std::filesystem::exists(dir / (name + ".canonical.toml"));
       ++n)
    name = stem + "-" + std::to_string(n);
  write_file(dir / (name + ".toml"), text);
  write_file(dir / (name + ".canonical.toml"), run.canonical_config());
  write_file(out / "config.toml", text);
}

// This process's peak resident set in bytes (VmHWM of /proc/self/status; 0 where there is none).
std::uint64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("VmHWM:")) return std::stoull(line.substr(6)) * 1024;  // "VmHWM:   123456 kB"
  return 0;
}

// Runs `body` on every rank; when it fails on any, every rank stops: a failing rank with its own error, the others
// with one line naming the failing ranks. One collective, so no rank waits for a peer that gave up. One process:
// body's error as it is.
template <Communicator Comm, class Body>
void on_every_rank(Comm& communicator, Body&& body) {
  if (communicator.size() == 1) {
    body();
    return;
  }
  std::exception_ptr error;
  try {
    body();
  } catch (...) {
    error = std::current_exception();
  }
  // A collective inside body failed: its error names the rank that died, and the group can gather nothing more.
  if constexpr (requires { communicator.broken(); })
    if (error && communicator.broken()) std::rethrow_exception(error);
  const double mine = error ? 1.0 : 0.0;
  const std::vector<double> failed = all_gather_values(communicator, std::span<const double>(&mine, 1));
  if (error) std::rethrow_exception(error);
  std::vector<int> ranks;
  for (std::size_t r = 0; r < failed.size(); ++r)
    if (failed[r] != 0) ranks.push_back(static_cast<int>(r));
  if (!ranks.empty())
    fail(ranks_text(ranks), ranks.size() == 1 ? " failed" : " failed", " (see ", ranks.size() == 1 ? "its" : "their",
         " message): this rank stops too");
}

// The largest of the ranks' values (a signal number, 0 for none): every rank stops after the same iteration.
template <Communicator Comm>
int largest_on_any_rank(Comm& communicator, int value) {
  if (communicator.size() == 1) return value;
  const double mine = value;
  const std::vector<double> all = all_gather_values(communicator, std::span<const double>(&mine, 1));
  return static_cast<int>(*std::max_element(all.begin(), all.end()));
}

// A debug check that a group's replicas did not drift. Only the c10d communicator (distributed.hpp, built with
// Gloo's headers) has replicas to compare; a single process has none, also in a build without that header.
template <class Comm>
void check_replicas_agree(Comm& communicator, std::span<const torch::Tensor> parameters) {
  if constexpr (requires { check_same_parameters(communicator, parameters); })
    if (communicator.size() > 1) check_same_parameters(communicator, parameters);
}

// `branchgrpo train` as one rank of `communicator` (single_process: the whole run). Every rank rolls out its share
// of each iteration's trees (training/trainer.hpp); rank 0 alone writes checkpoints, metrics, grids and configs and
// prints. `device` replaces a plain "cuda" (each rank's GPU from LOCAL_RANK).
template <Communicator Comm>
void train_on(const train_options& options, run_config config, Comm& communicator, const std::string& device) {
  const bool lead = communicator.rank() == 0;
  if (communicator.size() > 1) {
    // Every rank runs the same experiment: the canonical config, input files' checksums included.
    check_same_everywhere(communicator, xxh64_digest(config_text(config)), "configs");
    if (config.model.device == "cuda" && !device.empty()) config.model.device = device;
  }
  const std::filesystem::path out = config.run.output_dir;
  const std::filesystem::path checkpoints = out / "checkpoints";
  require(options.trace.empty() || communicator.size() == 1, "--trace ", options.trace,
          ": traces the rollout of one process; this run has ", communicator.size(), " ranks");
  on_every_rank(communicator, [&] {
    if (!lead) return;
    if (!options.trace.empty()) (void)make_directory(options.trace);
    (void)make_directory(out);
    // Before any work: a file or a dangling link where the checkpoints go would fail only at the first save.
    (void)make_directory(checkpoints);
    if (!options.resume) {
      for (const std::string& line : recover_checkpoints(checkpoints)) std::cerr << "checkpoints: " << line << '\n';
      const std::vector<checkpoint_entry> existing = list_checkpoints(checkpoints);
      require(existing.empty(), config.run.output_dir, " already holds checkpoint ",
              existing.empty() ? std::string() : existing.front().dir.filename().string(),
              ": pass --resume to continue it, or set another run.output_dir");
    }
  });

  std::unique_ptr<training_run> run;
  // A LibTorch error names the keys that chose what it was doing (the tool prints one line, not a backtrace).
  const std::string model_keys = "model.dir = \"" + config.model.dir + "\", model.dtype = \"" + config.model.dtype +
                                 "\", model.device = \"" + config.model.device + "\"";
  on_every_rank(communicator, [&] {
    run = with_torch_context(config.source + ": loading the model (" + model_keys + ")",
                             [&] { return make_run(config, communicator); });
  });
  if (options.resume) {
    // Rank 0 cleans up what a crash left, then every rank reads the same newest valid checkpoint, all at once (a
    // sharded run's restore gathers the working weights from every rank's range).
    std::optional<std::filesystem::path> from;
    on_every_rank(communicator, [&] {
      if (lead)
        for (const std::string& line : recover_checkpoints(checkpoints)) std::cerr << "checkpoints: " << line << '\n';
    });
    on_every_rank(communicator, [&] {
      std::ostringstream quiet;  // the other ranks' warnings repeat rank 0's
      from = run->resume(lead ? static_cast<std::ostream&>(std::cerr) : quiet, /*recover=*/false);
    });
    if (lead && from) {
      std::cerr << "resuming from " << from->string() << " (iteration " << run->iteration() << ")\n";
      if (run->ranks() != communicator.size())
        std::cerr << "note: the checkpoint was written by " << run->ranks()
                  << (run->ranks() == 1 ? " process" : " processes") << ", this run has " << communicator.size()
                  << ": the same experiment (the trees are keyed by their index in the iteration), but not bit for bit "
                     "(the gradients are summed in another order)\n";
    } else if (lead) {
      std::cerr << "no checkpoint in " << checkpoints.string() << ": starting from iteration 0\n";
    }
  }
  std::optional<metrics_files> metrics;
  std::filesystem::path grids;
  on_every_rank(communicator, [&] {
    if (!lead) return;
    keep_config(out, options.config, *run);
    metrics.emplace(out, run->iteration());
    grids = make_directory(out / "grids");
  });
  run_progress bar(lead && !options.quiet, config.run.iterations);
  if (lead && !options.json) print_header(std::cout);
  // [eval]: the held-out evaluation of the weights after `done` iterations, on every rank (each samples its share
  // of the prompts); rank 0 writes the row, the grid and, after the last iteration, every sample's file.
  const std::filesystem::path evaluations = out / "eval";
  const auto evaluate = [&] {
    const int done = run->iteration();
    const heldout_evaluation e = with_torch_context(
        config.source + ": held-out evaluation after " + std::to_string(done) + " iterations (" + model_keys + ")",
        [&] { return run->evaluate(communicator); });
    on_every_rank(communicator, [&] {
      if (!lead) return;
      const nlohmann::json row = evaluation_metrics(e, static_cast<std::int64_t>(run->model().heldout.prompts.size()),
                                                    config.eval_schedule().steps());
      metrics->append_evaluation(row);
      bar.clear();
      if (options.json)
        std::cout << row.dump() << '\n';
      else
        print_evaluation(std::cout, row);
      check_standard_output();
      (void)make_directory(evaluations);
      (void)write_evaluation_grid(evaluations, e, run->model().heldout.prompts);
      if (done == config.run.iterations)
        write_evaluation_samples(evaluations / "final", e, run->model().heldout.prompts);
    });
  };
  double seconds = 0;
  int timed = 0;
  int saved = run->iteration();  // the iterations the newest checkpoint holds (a resumed run's; 0: none)
  // A stop request during a long loop of iteration i (rollout, decoding, scoring, the held-out evaluation: they
  // check it between chunks, core/stop.hpp) ends the run within a chunk's time; nothing of iteration i is kept.
  // One process saves the state after the last finished iteration first, when no checkpoint holds it yet; several
  // ranks, which may have stopped at different points, save nothing (the newest checkpoint stays as it is).
  const auto stop_now = [&](const stop_requested& request, const std::string& phase) {
    std::filesystem::path dir;
    if (communicator.size() == 1 && run->iteration() > saved) {
      dir = run->save_checkpoint(communicator);
      saved = run->iteration();
    }
    if (lead) {
      bar.clear();
      const std::vector<checkpoint_entry> newest =
          dir.empty() ? list_checkpoints(checkpoints) : std::vector<checkpoint_entry>{};
      std::cerr << "train: " << request.what() << ", in " << phase << "; "
                << (!dir.empty() ? "checkpoint " + dir.string() + " is valid; continue with --resume"
                    : !newest.empty()
                        ? "the newest checkpoint is " + newest.front().dir.string() + "; continue with --resume"
                        : std::string("no checkpoint was written yet"))
                << '\n';
    }
    std::cerr.flush();
    std::exit(128 + request.signal());
  };
  // --trace: each iteration's rollout, rewards and credit, written before its update (app/iteration_trace.hpp).
  const auto trace = [&](const iteration_view<torch_backend>& view) {
    if (!options.trace.empty()) (void)write_iteration_trace(options.trace, view);
  };
  while (!run->done()) {
    const int i = run->iteration();
    const bool last = i + 1 == config.run.iterations;
    const bool grid = config.run.grid_every > 0 && ((i + 1) % config.run.grid_every == 0 || last);
    try {
      if (run->evaluates_after(i)) evaluate();
    } catch (const stop_requested& request) {
      stop_now(request, "the held-out evaluation before iteration " + std::to_string(i));
    }
    std::optional<iteration_stats> step;
    try {
      step = with_torch_context(config.source + ": iteration " + std::to_string(i) + " (" + model_keys +
                                    ", rollout.max_batch = " + std::to_string(config.rollout.max_batch) + ")",
                                [&] { return run->step(communicator, grid && lead, trace); });
    } catch (const stop_requested& request) {
      stop_now(request, "iteration " + std::to_string(i) + " (not kept)");
    }
    const iteration_stats& stats = *step;
    seconds += stats.seconds;
    ++timed;
    // Every rank's measured training-state bytes and peak resident set, for the metrics row (docs/distributed.md).
    const policy_memory& memory = run->last_memory();
    const std::array<double, 5> mine = {memory.parameters, memory.gradients, memory.gradients_peak, memory.optimizer,
                                        static_cast<double>(peak_resident_bytes())};
    const std::vector<double> memories = all_gather_values(communicator, std::span<const double>(mine));
    on_every_rank(communicator, [&] {
      if (!lead) return;
      nlohmann::json row = iteration_metrics(stats, run->last_components(), run->policy().last_update().grad_norm);
      const char* const parts[] = {"parameters", "gradients", "gradients_peak", "optimizer", "resident_peak"};
      for (std::size_t r = 0; r < memories.size() / mine.size(); ++r)
        for (std::size_t part = 0; part < mine.size(); ++part)
          row["memory/rank" + std::to_string(r) + "/" + parts[part]] = memories[r * mine.size() + part];
      metrics->append(row);
      bar.clear();
      if (stats.trees_dropped > 0)
        std::cerr << "warning: iteration " << i << ": dropped " << stats.trees_dropped
                  << (stats.trees_dropped == 1 ? " tree" : " trees") << " with a non-finite reward\n";
      if (options.json)
        std::cout << row.dump() << '\n';
      else
        print_row(std::cout, stats);
      check_standard_output();
      if (grid) write_leaf_grid(checkpoint_path(grids, i + 1).replace_extension(".png"), *run, i + 1);
    });
    const int signal = largest_on_any_rank(communicator, stop_signal());
    const bool checkpoint = (config.run.checkpoint_every > 0 && (i + 1) % config.run.checkpoint_every == 0) || last;
    if (checkpoint || signal != 0) {
      // Debug check that the replicas did not drift (cheap: the trainable tensors), then rank 0 writes.
      check_replicas_agree(communicator, std::span<const torch::Tensor>(run->policy().parameters()));
      std::filesystem::path dir;  // every rank: a sharded run's ranks write their shards
      on_every_rank(communicator, [&] { dir = run->save_checkpoint(communicator); });
      saved = i + 1;
      if (signal != 0) {
        // The iteration that was running when the signal came is finished and saved: say so, exit 128 + signal.
        if (lead) {
          bar.clear();
          std::cerr << "train: stopped by " << signal_name(signal) << " after " << i + 1
                    << (i == 0 ? " iteration" : " iterations") << "; checkpoint " << dir.string()
                    << " is valid; continue with --resume\n";
          check_standard_output();
        }
        std::cerr.flush();
        std::exit(128 + signal);
      }
    }
    bar.update(i + 1, std::to_string(i + 1) + "/" + std::to_string(config.run.iterations), stats.reward_mean,
               seconds / timed);
  }
  try {
    if (run->evaluates_after(config.run.iterations)) evaluate();
  } catch (const stop_requested& request) {  // the run is done and saved: only its last evaluation is missing
    bar.clear();
    if (lead)
      std::cerr << "train: " << request.what() << ", in the held-out evaluation after the last iteration; checkpoint "
                << checkpoint_path(checkpoints, config.run.iterations).string() << " is valid\n";
    std::cerr.flush();
    std::exit(128 + request.signal());
  }
  bar.clear();
  if (lead && !options.json)
    std::cout << "wrote " << (out / "metrics.jsonl").string() << ", " << (out / "metrics.csv").string() << ", "
              << (run->evaluates() ? (out / "eval.csv").string() + ", " + evaluations.string() + "/, " : std::string())
              << grids.string() << "/, " << checkpoints.string() << "/\n";
}

// One process, or one rank of the group torchrun's variables describe (docs/distributed.md). A rank's error is
// prefixed with its rank, since several ranks write to one terminal.
// `train --memory`: the pre-flight estimate by part (app/run_memory.hpp) and the budgets it is checked against,
// from the config and the model files' headers alone; nothing is loaded or built.
void print_memory_estimate(const run_config& config, bool json) {
  // Each rank's share of a sharded state: the world size torchrun (or the launcher) sets, one process without it.
  const char* world = std::getenv("WORLD_SIZE");
  const int ranks = world == nullptr ? 1 : parse_integer<int>(world, "WORLD_SIZE", 1);
  const run_memory_estimate e =
      estimate_run_memory(config, run_transformer_config(config), run_text_tokens(config), ranks);
  const memory_budget host = available_memory();
  const std::optional<memory_budget> device = device_memory_budget(run_device(config));
  if (json) {
    nlohmann::json out = {{"weights", e.weights},
                          {"training", e.training},
                          {"rollout", e.rollout},
                          {"activations", e.activations},
                          {"decoded", e.decoded},
                          {"prompt_rows", e.prompt_rows},
                          {"device_total", e.device_total()},
                          {"host_total", e.host_total()},
                          {"total", e.total()},
                          {"ranks", ranks},
                          {"host_budget", host.bytes},
                          {"host_budget_source", host.source}};
    if (device) out.update({{"device_budget", device->bytes}, {"device_budget_source", device->source}});
    std::cout << out.dump() << '\n';
    return;
  }
  const std::string where = config.model.device;
  const auto line = [](const char* part, double bytes, const std::string& on) {
    std::cout << "  " << std::left << std::setw(18) << part << std::right << std::setw(10) << byte_text(bytes) << "  "
              << on << '\n';
  };
  std::cout << config.source << ": memory estimate (nothing loaded; docs/reliability.md"
            << (ranks > 1 ? "; each of WORLD_SIZE = " + std::to_string(ranks) + " ranks" : std::string()) << ")\n";
  line("weights", e.weights, where);
  line("training state", e.training, where);
  line("rollout latents", e.rollout, where);
  line("activations", e.activations, where);
  line("decoded samples", e.decoded, "host");
  line("prompt rows", e.prompt_rows, "host");
  if (device)
    std::cout << "on " << where << ": " << byte_text(e.device_total()) << " of " << byte_text(device->bytes)
              << " free (" << device->source << "); host: " << byte_text(e.host_total()) << " of "
              << byte_text(host.bytes) << " (" << host.source << ")\n";
  else
    std::cout << "total " << byte_text(e.total()) << " of " << byte_text(host.bytes) << " (" << host.source << ")"
              << (run_device(config).is_cuda() ? "; the CUDA device's free memory is unknown to this build" : "")
              << '\n';
}

void run_train(const train_options& options) {
  const run_config config = load_run_config(options.config);
  if (options.memory) {
    print_memory_estimate(config, options.json);
    return;
  }
#if defined(BRANCHGRPO_C10D_GLOO)
  std::optional<c10d_communicator> group =
      communicator_from_environment({.timeout_seconds = options.timeout_seconds, .gloo_interface = {}, .nccl = true});
  if (group) {
    const std::string device = "cuda:" + std::to_string(group->local_rank());
    try {
      train_on(options, config, *group, device);
    } catch (const invalid_input& error) {
      fail("rank ", group->rank(), ": ", error.what());
    } catch (const system_failure& error) {  // a server or the file system failed on this rank: exit 1
      fail_system("rank ", group->rank(), ": ", error.what());
    }
    return;
  }
#else
  require(std::getenv("WORLD_SIZE") == nullptr,
          "WORLD_SIZE is set, but this build has no multi-process training (LibTorch's c10d with Gloo's headers: "
          "install libgloo-dev and rebuild)");
#endif
  single_process one;
  train_on(options, config, one, "");
}

/// The most samples per prompt `sample` draws (a grid of 4096 columns is already far wider than any screen).
constexpr int max_samples = 4096;

struct sample_options {
  std::string config;
  std::string checkpoint;
  std::vector<std::string> prompts;  // none: every prompt of the table
  int samples = 4;
  std::uint64_t seed = 0;
  std::string out = "grid.png";
  bool no_ema = false;  // the trained weights even when the run keeps an EMA
};

void run_sample(const sample_options& options) {
  const run_config config = load_run_config(options.config);
  auto run = make_run(config);
  const bool ema = run->load_weights(options.checkpoint, !options.no_ema);
  const std::vector<std::string>& table = run->model().prompts;
  std::vector<std::int64_t> rows;
  if (options.prompts.empty()) {
    for (std::size_t n = 0; n < table.size(); ++n) rows.push_back(static_cast<std::int64_t>(n));
  } else {
    for (std::string prompt : options.prompts) {
      const auto first = prompt.find_first_not_of(' '), last = prompt.find_last_not_of(' ');
      prompt = first == std::string::npos ? std::string() : prompt.substr(first, last - first + 1);
      const auto it = std::find(table.begin(), table.end(), prompt);
      if (it == table.end()) {
        std::string known;
        for (const std::string& p : table) known += (known.empty() ? "" : ", ") + p;
        fail("--prompts: '", echo_middle(prompt, 80), "' is not in the prompt embeddings (", echo_middle(known, 400),
             ")");
      }
      rows.push_back(it - table.begin());
    }
  }
  std::vector<std::int64_t> prompts;
  for (const std::int64_t row : rows) prompts.insert(prompts.end(), static_cast<std::size_t>(options.samples), row);
  const torch::Tensor images = run->sample(prompts, options.seed, 0, ema);
  const std::vector<double> scores = run->score_images(images, prompts, options.samples);
  image_grid grid{
      .title = "SAMPLES OF " + std::filesystem::path(options.checkpoint).filename().string() + (ema ? " (EMA)" : ""),
      .columns = options.samples,
      .scale = images.size(-2) <= 32 ? 4 : 1,
      .row_labels = {},
      .column_labels = {},
      .cells = to_cells(images)};
  for (const std::int64_t row : rows) grid.row_labels.push_back(table[static_cast<std::size_t>(row)]);
  write_png(options.out, render(grid));
  for (std::size_t r = 0; r < rows.size(); ++r) {
    double sum = 0;
    for (int k = 0; k < options.samples; ++k) sum += scores[r * static_cast<std::size_t>(options.samples) + k];
    std::cout << std::left << std::setw(24) << table[static_cast<std::size_t>(rows[r])] << std::right << " reward "
              << std::fixed << std::setprecision(4) << sum / options.samples << '\n';
  }
  std::cout << "weights: " << (ema ? "the EMA's (optimizer.ema_decay > 0; --no-ema for the trained ones)" : "trained")
            << "\nwrote " << options.out << '\n';
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto options = std::make_shared<train_options>();
  CLI::App* train = app.add_subcommand("train", "Align a model with the run a TOML config describes (docs/config.md)");
  train->add_option("--config", options->config, "The run's TOML file")->required()->type_name("FILE");
  train->add_flag("--resume", options->resume, "Continue from the latest checkpoint in run.output_dir");
  train->add_flag("--json", options->json, "One JSON object per iteration on stdout");
  train->add_flag("--quiet", options->quiet, "No progress bar");
  train->add_flag("--memory", options->memory,
                  "Print the run's memory estimate by part and the budget it is checked against, then exit "
                  "(nothing is loaded; --json: one JSON object)");
  train
      ->add_option("--trace", options->trace,
                   "Write every iteration's rollout latents, leaf rewards, log-probs and credit to "
                   "DIR/trace-NNNNNN.safetensors (one process; docs/cli.md)")
      ->type_name("DIR");
  add_number(train, "--timeout", options->timeout_seconds,
             "Multi-process runs: seconds before a rank that died or hangs ends the others (docs/distributed.md)", 1,
             86400)
      ->capture_default_str();
  train->callback([options] {
    // SIGINT / SIGTERM from the start: one line and exit 128 + signal within a chunk of work (see train_on).
    const stop_signals stop;
    run_train(*options);
  });
}

void add_sample_command(CLI::App& app) {
  auto options = std::make_shared<sample_options>();
  CLI::App* sample = app.add_subcommand("sample", "Render a grid of a checkpoint's samples");
  sample->add_option("--config", options->config, "The run's TOML file")->required()->type_name("FILE");
  sample->add_option("--checkpoint", options->checkpoint, "A checkpoint directory (run.output_dir/checkpoints/iter-N)")
      ->required()
      ->type_name("DIR");
  add_text_list(sample, "--prompts", options->prompts, "Comma-separated prompts of the embeddings file (default: all)")
      ->type_name("LIST");
  // Every sample is a whole ODE solve and an image held until the grid is drawn: the count is bounded here.
  add_integer(sample, "--samples", options->samples, "Samples per prompt", 1, max_samples)
      ->type_name("N")
      ->capture_default_str();
  add_integer(sample, "--seed", options->seed, "Seed of the samples' starting noise")
      ->type_name("S")
      ->capture_default_str();
  sample->add_option("--out", options->out, "The PNG to write")->type_name("FILE")->capture_default_str();
  sample->add_flag("--no-ema", options->no_ema,
                   "Sample the trained weights, not their EMA (the default when optimizer.ema_decay > 0)");
  sample->callback([options] {
    const stop_signals stop;  // SIGINT / SIGTERM: one line and exit 128 + signal within an ODE step
    run_sample(*options);
  });
}

}  // namespace branchgrpo::cli
