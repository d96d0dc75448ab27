#pragma once
// Shared by the LibTorch subcommands (`train`, `sample`, `demo`): images to PNG cells, the progress bar
// (progress_bar.hpp), and the per-iteration metrics (JSON lines and CSV).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/training/trainer.hpp"
#include "cli/image_grid.hpp"
#include "cli/png.hpp"
#include "cli/progress_bar.hpp"

namespace branchgrpo::cli {

/// One image [3, H, W] in [-1, 1] as 8-bit RGB: byte = round(255 clamp((x + 1) / 2, 0, 1)); NaN -> magenta.
inline rgb_image to_rgb(const torch::Tensor& image) {
  const torch::Tensor x = image.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  const auto h = static_cast<int>(x.size(1)), w = static_cast<int>(x.size(2));
  const float* data = x.data_ptr<float>();
  rgb_image out{.width = w, .height = h, .pixels = std::vector<std::uint8_t>(static_cast<std::size_t>(w * h * 3))};
  for (int k = 0; k < 3; ++k)
    for (int i = 0; i < h * w; ++i) {
      const float v = data[k * h * w + i];
      out.pixels[static_cast<std::size_t>(i * 3 + k)] =
          std::isnan(v) ? (k == 1 ? 0 : 255)
                        : static_cast<std::uint8_t>(std::lround(255.0 * std::clamp((v + 1.0) / 2.0, 0.0, 1.0)));
    }
  return out;
}

/// Images [n, 3, H, W] in [-1, 1] as grid cells.
inline std::vector<rgb_image> to_cells(const torch::Tensor& images) {
  std::vector<rgb_image> cells;
  for (std::int64_t i = 0; i < images.size(0); ++i) cells.push_back(to_rgb(images[i]));
  return cells;
}

/// "a red circle" -> "RED\nCIRCLE" (a column label): the words after an article, one per line, at most 2 lines.
inline std::string prompt_label(const std::string& prompt) {
  std::istringstream words(prompt);
  std::vector<std::string> kept;
  for (std::string word; words >> word;)
    if (word != "a" && word != "an" && word != "the") kept.push_back(word);
  std::string out;
  for (std::size_t i = 0; i < kept.size(); ++i) out += (i == 0 ? "" : i < 2 ? "\n" : " ") + kept[i];
  return out;
}

/// A double for a CSV cell / table ("nan" when not finite).
inline std::string number_text(double value, int precision = 9) {
  if (!std::isfinite(value)) return "nan";
  std::ostringstream out;
  out << std::setprecision(precision) << value;
  return out.str();
}

/// Creates `dir` (and parents); throws std::runtime_error naming it when it cannot.
inline std::filesystem::path make_directory(const std::filesystem::path& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error || !std::filesystem::is_directory(dir))
    throw std::runtime_error("cannot create the directory " + dir.string() + (error ? ": " + error.message() : ""));
  return dir;
}

/// The metrics of one iteration as a JSON object (keys sorted by nlohmann): the trainer's stats, the optimizer's
/// gradient norm and each reward's mean unweighted score ("reward/<name>").
inline nlohmann::json iteration_metrics(const iteration_stats& s, const std::map<std::string, double>& components,
                                        double grad_norm) {
  nlohmann::json j = {{"iteration", s.iteration},
                      {"reward_mean", s.reward_mean},
                      {"reward_std", s.reward_std},
                      {"reward_min", s.reward_min},
                      {"reward_max", s.reward_max},
                      {"evaluations", s.rollout_evaluations},
                      {"update_evaluations", s.update_evaluations},
                      {"edges", s.edges},
                      {"edges_trained", s.edges_trained},
                      {"trees_dropped", s.trees_dropped},
                      {"loss", s.loss},
                      {"clip_fraction", s.clip_fraction},
                      {"grad_norm", grad_norm},
                      {"seconds", s.seconds},
                      {"rollout_seconds", s.rollout_seconds},
                      {"reward_seconds", s.reward_seconds},
                      {"update_seconds", s.update_seconds}};
  for (const auto& [name, value] : components) j["reward/" + name] = value;
  return j;
}

/// metrics.jsonl and metrics.csv in a run's output directory. Opening keeps the lines of iterations below
/// `first_iteration` (a resumed run rewrites what came after its checkpoint) and drops the rest.
class metrics_files {
 public:
  metrics_files(const std::filesystem::path& dir, int first_iteration)
      : jsonl_(dir / "metrics.jsonl"), csv_(dir / "metrics.csv") {
    std::vector<nlohmann::json> kept;
    if (first_iteration > 0) {
      std::ifstream in(jsonl_);
      for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (!j.is_discarded() && j.contains("iteration") && j["iteration"].get<int>() < first_iteration)
          kept.push_back(std::move(j));
      }
    }
    std::ofstream(jsonl_, std::ios::trunc);
    std::ofstream(csv_, std::ios::trunc);
    for (const nlohmann::json& j : kept) append(j);
  }

  void append(const nlohmann::json& j) {
    std::ofstream jsonl(jsonl_, std::ios::app);
    jsonl << j.dump() << '\n';
    if (columns_.empty()) {
      for (const auto& item : j.items()) columns_.push_back(item.key());
      std::ofstream csv(csv_, std::ios::app);
      for (std::size_t i = 0; i < columns_.size(); ++i) csv << (i ? "," : "") << columns_[i];
      csv << '\n';
    }
    std::ofstream csv(csv_, std::ios::app);
    for (std::size_t i = 0; i < columns_.size(); ++i) {
      csv << (i ? "," : "");
      const auto it = j.find(columns_[i]);
      if (it == j.end() || it->is_null()) {
        csv << "nan";
      } else if (it->is_number_float()) {
        csv << number_text(it->get<double>());
      } else {
        csv << it->dump();
      }
    }
    csv << '\n';
    if (!jsonl || !csv) throw std::runtime_error("cannot write " + jsonl_.string() + " or " + csv_.string());
  }

 private:
  std::filesystem::path jsonl_, csv_;
  std::vector<std::string> columns_;
};

}  // namespace branchgrpo::cli
