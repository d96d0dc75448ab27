#pragma once
// What `train` writes of a held-out evaluation ([eval]; training_run::evaluate): its metrics row, its grid, and,
// for the run's last evaluation, every sample as its own file with its prompt and scores.
//
//   evaluation_metrics(e, prompts)       {"kind": "eval", "iteration": k, "reward_mean": ..., "reward/<name>": ...}
//   write_evaluation_grid(dir, e, ...)   <dir>/iter-<k>.png (clips: frame strips, and iter-<k>.gif when the tool
//                                        has giflib)
//   write_evaluation_samples(dir, ...)   <dir>/<j>-<k>.png per sample and <dir>/scores.jsonl
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "branchgrpo/app/training_run.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/evaluation/statistics.hpp"
#include "cli/images/image_grid.hpp"
#include "cli/images/png.hpp"
#include "cli/output/output_file.hpp"
#include "cli/runs/run_support.hpp"
#if defined(BRANCHGRPO_CLI_GIF)
#include "cli/images/gif.hpp"
#endif

namespace branchgrpo::cli {

namespace detail {
// `prefix`_mean, _low, _high (the 95 % Student-t interval of the mean over the finite values) and _failed (the
// non-finite count) of `values`; null mean and bounds when fewer than 2 are finite.
inline void add_interval(nlohmann::json& row, const std::string& mean_key, const std::string& prefix,
                         std::span<const double> values) {
  std::vector<double> finite;
  for (const double v : values)
    if (std::isfinite(v)) finite.push_back(v);
  row[prefix + "failed"] = values.size() - finite.size();
  if (finite.size() < 2) {
    row[mean_key] = nullptr;
    row[prefix + "low"] = nullptr;
    row[prefix + "high"] = nullptr;
    return;
  }
  const mean_interval interval = t_interval(finite);
  row[mean_key] = interval.mean;
  row[prefix + "low"] = interval.low;
  row[prefix + "high"] = interval.high;
}
}  // namespace detail

/// The metrics row of a held-out evaluation: its iteration (the iterations done before it), the counts, and for
/// the weighted reward and each [eval] reward the mean over every sample with its 95 % t interval and the count of
/// samples it failed on. Keys (sorted by nlohmann): kind = "eval", iteration, prompts, samples (per prompt), steps,
/// ema, seconds, reward_mean, reward_low, reward_high, reward_failed, and reward/<name>, reward/<name>/low,
/// reward/<name>/high, reward/<name>/failed.
/// Example: one reward "alignment" with scores {0.5, 0.7, 0.6, 0.6} of 2 prompts x 2 samples after 10 iterations ->
///   {"iteration": 10, "kind": "eval", "prompts": 2, "reward/alignment": 0.6, "reward/alignment/low": 0.47...,
///    "reward_mean": 0.6, ...}; the interval is t_interval's (mean 0.6, s = 0.0816, t_{0.975, 3} = 3.182).
inline nlohmann::json evaluation_metrics(const heldout_evaluation& e, std::int64_t prompts, int steps) {
  nlohmann::json row = {{"kind", "eval"},      {"iteration", e.iteration},
                        {"prompts", prompts},  {"samples", e.samples_per_prompt},
                        {"steps", steps},      {"ema", e.ema},
                        {"seconds", e.seconds}};
  detail::add_interval(row, "reward_mean", "reward_", e.rewards);
  for (const auto& [name, scores] : e.components)
    detail::add_interval(row, "reward/" + name, "reward/" + name + "/", scores);
  return row;
}

namespace detail {
// The grid of `e`'s images on this rank: one row per held-out prompt (its text and mean weighted reward), its
// samples side by side; clips as frame strips, or frame `frame` of each clip when frame >= 0.
inline image_grid evaluation_grid(const heldout_evaluation& e, const std::vector<std::string>& prompts, int frame) {
  const std::int64_t rows = e.images.size(0), per_prompt = e.samples_per_prompt;
  const torch::Tensor shown = frame >= 0 ? e.images.select(1, frame) : e.images;
  image_grid grid{.title = "HELD-OUT AFTER " + std::to_string(e.iteration) + " ITERATIONS" + (e.ema ? " (EMA)" : ""),
                  .columns = static_cast<int>(per_prompt),
                  .scale = e.images.size(-2) <= 32 ? 4 : 1,
                  .row_labels = {},
                  .column_labels = {},
                  .cells = to_cells(shown)};
  for (std::int64_t r = 0; r < rows; r += per_prompt) {
    const std::int64_t row = e.first_row + r;
    double sum = 0;
    int finite = 0;
    for (std::int64_t k = 0; k < per_prompt; ++k)
      if (const double v = e.rewards[static_cast<std::size_t>(row + k)]; std::isfinite(v)) {
        sum += v;
        ++finite;
      }
    grid.row_labels.push_back(prompts[static_cast<std::size_t>(e.prompt_of(row))] + " " +
                              (finite ? number_text(sum / finite, 3) : std::string("nan")));
  }
  return grid;
}
}  // namespace detail

/// Writes the grid of `e`'s images on this rank (all of them on one process) to `dir`/iter-<k>.png (k the
/// evaluation's iteration, 6 digits), and for clips, when the tool has giflib, the grid animated over the frames
/// to iter-<k>.gif (4 frames per second). Returns the PNG's path. Nothing is written for a rank without rows.
inline std::filesystem::path write_evaluation_grid(const std::filesystem::path& dir, const heldout_evaluation& e,
                                                   const std::vector<std::string>& prompts) {
  const std::filesystem::path png = checkpoint_path(dir, e.iteration).replace_extension(".png");
  if (!e.images.defined() || e.images.size(0) == 0) return png;
  write_png(png.string(), render(detail::evaluation_grid(e, prompts, -1)));
#if defined(BRANCHGRPO_CLI_GIF)
  if (e.images.dim() == 5) {
    std::vector<rgb_image> frames;
    for (std::int64_t f = 0; f < e.images.size(1); ++f)
      frames.push_back(render(detail::evaluation_grid(e, prompts, static_cast<int>(f))));
    write_gif(std::filesystem::path(png).replace_extension(".gif").string(), frames, 25);
  }
#endif
  return png;
}

/// Writes each of `e`'s samples on this rank to `dir`/<j>-<k>.png (held-out prompt j, sample k, 4 and 2 digits;
/// a clip as its frame strip) and one line per sample to `dir`/scores.jsonl: {"file", "prompt", "prompt_index",
/// "sample", "reward", "reward/<name>"...} (a NaN score is null). The run's last evaluation writes them.
inline void write_evaluation_samples(const std::filesystem::path& dir, const heldout_evaluation& e,
                                     const std::vector<std::string>& prompts) {
  (void)make_directory(dir);
  std::string lines;
  const auto number = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  const std::int64_t rows = e.images.defined() ? e.images.size(0) : 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t row = e.first_row + r, prompt = e.prompt_of(row), sample = row % e.samples_per_prompt;
    const std::string file = zero_padded(prompt, 4) + "-" + zero_padded(sample, 2) + ".png";
    write_png((dir / file).string(), e.images.dim() == 5 ? frame_strip(e.images[r]) : to_rgb(e.images[r]));
    nlohmann::json line = {{"file", file},
                           {"prompt", prompts[static_cast<std::size_t>(prompt)]},
                           {"prompt_index", prompt},
                           {"sample", sample},
                           {"reward", number(e.rewards[static_cast<std::size_t>(row)])}};
    for (const auto& [name, scores] : e.components)
      line["reward/" + name] = number(scores[static_cast<std::size_t>(row)]);
    lines += line.dump() + "\n";
  }
  write_file(dir / "scores.jsonl", lines);
}

}  // namespace branchgrpo::cli
