#pragma once
// Shared by the LibTorch subcommands (`train`, `sample`, `demo`): images to PNG cells, the progress bar
// (progress_bar.hpp), and the per-iteration metrics (JSON lines and CSV, appended and cut in place on resume).
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
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
#include <string_view>
#include <system_error>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/files/input_file.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/training/trainer.hpp"
#include "cli/images/image_grid.hpp"
#include "cli/images/png.hpp"
#include "cli/output/iteration_json.hpp"
#include "cli/output/output_file.hpp"
#include "cli/output/progress_bar.hpp"

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

/// A clip [F, 3, H, W] in [-1, 1] as one image: its frames left to right (to_rgb each), 1-pixel white gaps.
/// Example: 8 frames of 16 x 16 -> an image of 8 * 16 + 7 = 135 x 16.
inline rgb_image frame_strip(const torch::Tensor& clip) {
  const auto frames = static_cast<int>(clip.size(0)), h = static_cast<int>(clip.size(2)),
             w = static_cast<int>(clip.size(3));
  rgb_image out{.width = frames * (w + 1) - 1,
                .height = h,
                .pixels = std::vector<std::uint8_t>(static_cast<std::size_t>((frames * (w + 1) - 1) * h * 3), 255)};
  for (int f = 0; f < frames; ++f) {
    const rgb_image frame = to_rgb(clip[f]);
    for (int y = 0; y < h; ++y)
      std::copy_n(frame.pixels.begin() + static_cast<std::ptrdiff_t>(y * w * 3), w * 3,
                  out.pixels.begin() + static_cast<std::ptrdiff_t>((y * out.width + f * (w + 1)) * 3));
  }
  return out;
}

/// Images [n, 3, H, W] or clips [n, F, 3, H, W] in [-1, 1] as grid cells (a clip: its frame_strip).
inline std::vector<rgb_image> to_cells(const torch::Tensor& images) {
  std::vector<rgb_image> cells;
  for (std::int64_t i = 0; i < images.size(0); ++i)
    cells.push_back(images.dim() == 5 ? frame_strip(images[i]) : to_rgb(images[i]));
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

/// Runs `body`; a LibTorch error (c10::Error, whose message carries a backtrace) becomes one invalid_input line
/// naming `context`, the config keys involved, and the error's first line. Example:
///   with_torch_context("run.toml: loading the model (model.dtype = \"float16\")", ...) on a kernel error ->
///   "run.toml: loading the model (model.dtype = \"float16\"): \"addmm_impl_cpu_\" not implemented for 'Half'".
template <class Body>
decltype(auto) with_torch_context(const std::string& context, Body&& body) {
  try {
    return body();
  } catch (const c10::Error& error) {
    std::string first = error.what_without_backtrace();
    if (const auto end = first.find('\n'); end != std::string::npos) first.resize(end);
    fail(context, ": ", first);
  }
}

/// The metrics of one iteration as a JSON object (keys sorted by nlohmann): the trainer's stats, the optimizer's
/// gradient norm and each reward's mean unweighted score ("reward/<name>").
inline nlohmann::json iteration_metrics(const iteration_stats& s, const std::map<std::string, double>& components,
                                        double grad_norm) {
  nlohmann::json j = iteration_stats_json(s);
  j["grad_norm"] = grad_norm;
  for (const auto& [name, value] : components) j["reward/" + name] = value;
  return j;
}

namespace detail {
// The byte length of the prefix of `text` made of whole lines ('\n'-terminated) that `keep` accepts, up to the
// first line it refuses or a torn last line.
template <class Keep>
std::size_t kept_prefix(const std::string& text, Keep&& keep) {
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = text.find('\n', at);
    if (end == std::string::npos || !keep(std::string_view(text).substr(at, end - at))) break;
    at = end + 1;
  }
  return at;
}

// Cuts the regular file `path` to `size` bytes in place (the kept lines are never rewritten); a missing file or a
// device (/dev/null, /dev/full) is left alone.
inline void cut_file(const std::filesystem::path& path, std::uintmax_t size) {
  struct ::stat info {};
  if (::stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) return;
  if (static_cast<std::uintmax_t>(info.st_size) == size) return;
  if (::truncate(path.c_str(), static_cast<::off_t>(size)) != 0) throw write_error(path, "cannot truncate", errno);
}

// A metrics file is regular, absent, or a character device (/dev/null, /dev/full): a FIFO, a directory or a socket
// there is refused when the run starts, not when the first iteration's line is written (a FIFO would block it).
inline void check_metrics_target(const std::filesystem::path& path) {
  std::error_code error;
  using enum std::filesystem::file_type;
  const std::filesystem::file_type type = std::filesystem::status(path, error).type();
  if (type != not_found && type != regular && type != character)
    fail(path_text(path), ": is ", file_type_text(type), ", not a metrics file");
}

// The whole of a metrics file ("" when it is missing; a device such as /dev/null is written, never read). Anything
// else that is not a regular file, or is over 256 MiB, is one line (read_input_file): a FIFO would block the read.
inline std::string metrics_text(const std::filesystem::path& path) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  using enum std::filesystem::file_type;
  if (status.type() == not_found || status.type() == character) return {};
  return read_input_file(path, input_kinds::metrics);
}
}  // namespace detail

/// A CSV file of rows with an "iteration" column, appended one row per call (append_to_file: one write, then
/// fsync), its columns the first row's keys. Opening cuts it in place after its last whole row of an iteration
/// below `first_iteration` (the header stays while a row under it does, and its columns are reused); a fresh run
/// (first_iteration 0) starts it empty. Missing keys and nulls are written "nan".
/// Example: rows of iterations 0..5, first_iteration 4 -> the header and rows 0..3 kept.
class csv_rows {
 public:
  csv_rows(std::filesystem::path path, int first_iteration) : path_(std::move(path)) {
    detail::check_metrics_target(path_);
    const std::string csv = first_iteration > 0 ? detail::metrics_text(path_) : std::string();
    std::size_t iteration_column = std::string::npos;
    bool header = true;
    detail::cut_file(path_, detail::kept_prefix(csv, [&](std::string_view line) {
                       std::vector<std::string> cells;
                       std::string cell;
                       std::istringstream row{std::string(line)};
                       while (std::getline(row, cell, ',')) cells.push_back(cell);
                       if (header) {  // the header stays when a row under it does; its columns are reused
                         header = false;
                         const auto it = std::find(cells.begin(), cells.end(), "iteration");
                         if (it == cells.end()) return false;
                         iteration_column = static_cast<std::size_t>(it - cells.begin());
                         columns_ = cells;
                         return true;
                       }
                       if (cells.size() != columns_.size()) return false;
                       const std::string& text = cells[iteration_column];
                       long long iteration = 0;
                       const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), iteration);
                       return error == std::errc() && end == text.data() + text.size() && iteration < first_iteration;
                     }));
  }

  void append(const nlohmann::json& j) {
    std::string lines;
    if (columns_.empty()) {
      for (const auto& item : j.items()) columns_.push_back(item.key());
      for (std::size_t i = 0; i < columns_.size(); ++i) lines += (i ? "," : "") + columns_[i];
      lines += '\n';
    }
    for (std::size_t i = 0; i < columns_.size(); ++i) {
      lines += (i ? "," : "");
      const auto it = j.find(columns_[i]);
      if (it == j.end() || it->is_null()) {
        lines += "nan";
      } else if (it->is_number_float()) {
        lines += number_text(it->get<double>());
      } else {
        lines += it->dump();
      }
    }
    append_to_file(path_, lines + '\n');
  }

 private:
  std::filesystem::path path_;
  std::vector<std::string> columns_;
};

/// metrics.jsonl, metrics.csv and eval.csv in a run's output directory, appended one line per iteration or held-out
/// evaluation (append_to_file: one write, then fsync; a kill loses at most the line being written). metrics.jsonl
/// holds both kinds of rows in the order they happened, an evaluation's marked {"kind": "eval"}; the CSVs one kind
/// each (their columns differ). Opening cuts each file in place after its last whole line of an iteration below
/// `first_iteration` (a resumed run continues from its checkpoint; a fresh run, first_iteration 0, starts them
/// empty): the kept lines are never rewritten, and a torn last line from a kill is cut too. An evaluation row's
/// iteration is the iterations done before it ran, so a run resumed from checkpoint iter-k keeps the evaluations
/// after 0..k-1 iterations and runs the one after k again: none is repeated or skipped. Write failures throw
/// write_error naming the file and the system's reason.
/// Example: metrics.jsonl with iterations 0..5 and a torn line, first_iteration 4 -> iterations 0..3 kept (and the
///   evaluations after 0..3 iterations).
class metrics_files {
 public:
  metrics_files(const std::filesystem::path& dir, int first_iteration)
      : jsonl_(dir / "metrics.jsonl"),
        csv_(dir / "metrics.csv", first_iteration),
        eval_csv_(dir / "eval.csv", first_iteration) {
    const auto below = [&](const nlohmann::json& j) {
      return j.is_object() && j.contains("iteration") && j["iteration"].is_number_integer() &&
             j["iteration"].get<long long>() < first_iteration;
    };
    detail::check_metrics_target(jsonl_);
    const std::string jsonl = first_iteration > 0 ? detail::metrics_text(jsonl_) : std::string();
    detail::cut_file(jsonl_, detail::kept_prefix(jsonl, [&](std::string_view line) {
                       return below(nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false));
                     }));
  }

  /// An iteration's row: metrics.jsonl and metrics.csv.
  void append(const nlohmann::json& j) {
    append_to_file(jsonl_, j.dump() + "\n");
    csv_.append(j);
  }

  /// A held-out evaluation's row ({"kind": "eval", ...}): metrics.jsonl and eval.csv.
  void append_evaluation(const nlohmann::json& j) {
    append_to_file(jsonl_, j.dump() + "\n");
    eval_csv_.append(j);
  }

 private:
  std::filesystem::path jsonl_;
  csv_rows csv_, eval_csv_;
};

}  // namespace branchgrpo::cli
