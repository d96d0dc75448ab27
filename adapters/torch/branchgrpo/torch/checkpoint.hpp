#pragma once
// Checkpoints of a training run: one directory per checkpoint, written atomically.
//
//   <root>/iter-000010/weights.safetensors   the trainable tensors by name (LoRA A/B, or every weight)
//   <root>/iter-000010/state.safetensors     optimizer state (AdamW exp_avg, exp_avg_sq, step per parameter),
//                                            EMA shadows, stateful normalizer buffers; __metadata__ holds the
//                                            iteration (iterations completed), the seed and the format
//
// Atomicity: the files are written into <dir>.tmp, then the directory is renamed to <dir> (rename(2) of a
// directory is atomic on POSIX file systems). A crash before the rename leaves <dir>.tmp behind and every earlier
// checkpoint intact; latest_checkpoint ignores anything but complete "iter-<digits>" directories, and the next
// write of the same name starts by deleting the stale <dir>.tmp.
//
// RNG state: none to save. Every random draw of a run is keyed by (seed, iteration, tree, node, step, stream)
// (noise/keyed_normal.hpp), and the prompts of an iteration are a function of the iteration, so the seed and the
// iteration number restore the whole random state.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/safetensors.hpp"

namespace branchgrpo {

/// What a checkpoint holds.
struct checkpoint_contents {
  int iteration = 0;  ///< iterations completed; a resumed run continues with this iteration
  std::uint64_t seed = 0;
  std::map<std::string, torch::Tensor> weights;  ///< trainable tensors by name
  std::map<std::string, torch::Tensor> state;    ///< optimizer, EMA and normalizer tensors by name
};

inline constexpr std::string_view checkpoint_format = "branchgrpo-checkpoint-1";

/// "<root>/iter-<iteration, 6 digits>". Example: checkpoint_path("out/checkpoints", 10) == ".../iter-000010".
inline std::filesystem::path checkpoint_path(const std::filesystem::path& root, int iteration) {
  require(iteration >= 0, "checkpoint iteration ", iteration, " is negative");
  std::string digits = std::to_string(iteration);
  if (digits.size() < 6) digits.insert(0, 6 - digits.size(), '0');
  return root / ("iter-" + digits);
}

namespace detail {
// The iteration of a complete checkpoint directory name "iter-<digits>", else nullopt.
inline std::optional<int> checkpoint_iteration(const std::filesystem::path& dir) {
  const std::string name = dir.filename().string();
  if (name.size() <= 5 || name.rfind("iter-", 0) != 0) return std::nullopt;
  const std::string digits = name.substr(5);
  if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  if (!std::filesystem::is_regular_file(dir / "weights.safetensors") ||
      !std::filesystem::is_regular_file(dir / "state.safetensors"))
    return std::nullopt;
  return std::stoi(digits);
}
}  // namespace detail

/// Phase 1 of write_checkpoint: writes the files into "<dir>.tmp" (deleted first if a crash left one) and
/// returns that path. Until commit_checkpoint renames it, `dir` and every other checkpoint are untouched.
inline std::filesystem::path stage_checkpoint(const std::filesystem::path& dir, const checkpoint_contents& contents) {
  std::filesystem::path staging = dir;
  staging += ".tmp";
  std::error_code error;
  std::filesystem::remove_all(staging, error);
  std::filesystem::create_directories(staging, error);
  require(!error, staging.string(), ": cannot create the checkpoint directory: ", error.message());
  save_safetensors(staging / "weights.safetensors", contents.weights,
                   {{"format", std::string(checkpoint_format)}, {"iteration", std::to_string(contents.iteration)}});
  save_safetensors(staging / "state.safetensors", contents.state,
                   {{"format", std::string(checkpoint_format)},
                    {"iteration", std::to_string(contents.iteration)},
                    {"seed", std::to_string(contents.seed)}});
  return staging;
}

/// Phase 2: renames the staged directory to `dir` (an existing `dir` is moved aside first, then deleted).
inline void commit_checkpoint(const std::filesystem::path& staging, const std::filesystem::path& dir) {
  std::error_code error;
  std::filesystem::path aside = dir;
  aside += ".old";
  std::filesystem::remove_all(aside, error);
  if (std::filesystem::exists(dir)) {
    std::filesystem::rename(dir, aside, error);
    require(!error, dir.string(), ": cannot move the previous checkpoint aside: ", error.message());
  }
  std::filesystem::rename(staging, dir, error);
  require(!error, staging.string(), ": cannot rename to ", dir.string(), ": ", error.message());
  std::filesystem::remove_all(aside, error);
}

/// Writes `contents` to `dir` atomically (stage_checkpoint, then commit_checkpoint).
inline void write_checkpoint(const std::filesystem::path& dir, const checkpoint_contents& contents) {
  commit_checkpoint(stage_checkpoint(dir, contents), dir);
}

/// Reads a checkpoint directory written by write_checkpoint. Errors name the file.
inline checkpoint_contents read_checkpoint(const std::filesystem::path& dir) {
  checkpoint_contents out;
  const safetensors_checkpoint state(dir / "state.safetensors");
  const auto& metadata = state.metadata();
  const auto field = [&](const char* key) {
    const auto it = metadata.find(key);
    require(it != metadata.end(), (dir / "state.safetensors").string(), ": no '", key, "' in the metadata");
    return it->second;
  };
  require(field("format") == checkpoint_format, (dir / "state.safetensors").string(), ": format '", field("format"),
          "' is not ", checkpoint_format);
  out.iteration = std::stoi(field("iteration"));
  out.seed = std::stoull(field("seed"));
  out.state = load_safetensors(state);
  out.weights = load_safetensors(dir / "weights.safetensors");
  return out;
}

/// The complete checkpoint of the highest iteration under `root` (nullopt when there is none). Staged
/// ("*.tmp") and moved-aside ("*.old") directories never count.
inline std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& root) {
  std::optional<std::filesystem::path> best;
  int best_iteration = -1;
  std::error_code error;
  if (!std::filesystem::is_directory(root, error)) return std::nullopt;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    if (!entry.is_directory()) continue;
    const std::optional<int> iteration = detail::checkpoint_iteration(entry.path());
    if (iteration && *iteration > best_iteration) {
      best_iteration = *iteration;
      best = entry.path();
    }
  }
  return best;
}

/// Deletes all but the `keep` newest complete checkpoints under `root`, and stale staged / moved-aside ones.
inline void prune_checkpoints(const std::filesystem::path& root, int keep) {
  std::vector<std::pair<int, std::filesystem::path>> complete;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".tmp") || name.ends_with(".old")) {
      std::filesystem::remove_all(entry.path(), error);
    } else if (const auto iteration = detail::checkpoint_iteration(entry.path())) {
      complete.emplace_back(*iteration, entry.path());
    }
  }
  std::sort(complete.begin(), complete.end());
  for (std::size_t i = 0; i + static_cast<std::size_t>(std::max(keep, 1)) < complete.size(); ++i)
    std::filesystem::remove_all(complete[i].second, error);
}

// ---- AdamW state --------------------------------------------------------------------------------------------

namespace detail {
// torch::optim keys its per-parameter state by the parameter's TensorImpl: as a string (LibTorch 1.13 - 2.0)
// or as the pointer itself (later versions); the key type says which.
template <class Optimizer>
auto optimizer_state_key(const torch::Tensor& parameter) {
  using key_type = typename std::decay_t<decltype(std::declval<Optimizer&>().state())>::key_type;
  if constexpr (std::is_same_v<key_type, std::string>) {
    std::ostringstream key;  // the pointer as text, as torch::optim writes it (c10::guts::to_string / c10::str)
    key << parameter.unsafeGetTensorImpl();
    return key.str();
  } else
    return static_cast<key_type>(parameter.unsafeGetTensorImpl());
}
}  // namespace detail

/// AdamW's per-parameter state as tensors: "adamw.exp_avg.<name>", "adamw.exp_avg_sq.<name>" (the moments, in
/// the parameter's dtype) and "adamw.step.<name>" (int64 [1]). Parameters without state (no step yet) have none.
/// Example: after one step on parameter "w" [2] -> {adamw.exp_avg.w [2], adamw.exp_avg_sq.w [2], adamw.step.w {1}}.
inline std::map<std::string, torch::Tensor> adamw_state_tensors(
    torch::optim::AdamW& optimizer, const std::vector<std::pair<std::string, torch::Tensor>>& parameters) {
  std::map<std::string, torch::Tensor> out;
  auto& states = optimizer.state();
  for (const auto& [name, parameter] : parameters) {
    const auto found = states.find(detail::optimizer_state_key<torch::optim::AdamW>(parameter));
    if (found == states.end()) continue;
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*found->second);
    out["adamw.exp_avg." + name] = s.exp_avg().detach().clone();
    out["adamw.exp_avg_sq." + name] = s.exp_avg_sq().detach().clone();
    out["adamw.step." + name] = torch::tensor({static_cast<std::int64_t>(s.step())}, torch::kInt64);
    if (s.max_exp_avg_sq().defined()) out["adamw.max_exp_avg_sq." + name] = s.max_exp_avg_sq().detach().clone();
  }
  return out;
}

/// Restores what adamw_state_tensors saved (every parameter's state replaced; a parameter absent from `tensors`
/// gets none, as before its first step). Throws invalid_input naming a tensor whose shape does not match.
inline void load_adamw_state(torch::optim::AdamW& optimizer,
                             const std::vector<std::pair<std::string, torch::Tensor>>& parameters,
                             const std::map<std::string, torch::Tensor>& tensors) {
  auto& states = optimizer.state();
  for (const auto& [name, parameter] : parameters) {
    const auto key = detail::optimizer_state_key<torch::optim::AdamW>(parameter);
    states.erase(key);
    const auto avg = tensors.find("adamw.exp_avg." + name);
    if (avg == tensors.end()) continue;
    const auto squares = tensors.find("adamw.exp_avg_sq." + name);
    const auto step = tensors.find("adamw.step." + name);
    require(squares != tensors.end() && step != tensors.end(), "optimizer state of '", name,
            "' is incomplete (exp_avg without exp_avg_sq or step)");
    require(avg->second.sizes() == parameter.sizes() && squares->second.sizes() == parameter.sizes(),
            "optimizer state of '", name, "' has shape ", avg->second.sizes(), ", the parameter ", parameter.sizes());
    const auto like = torch::TensorOptions().dtype(parameter.dtype()).device(parameter.device());
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(step->second.to(torch::kCPU, torch::kInt64).item<std::int64_t>());
    state->exp_avg(avg->second.to(like).clone());
    state->exp_avg_sq(squares->second.to(like).clone());
    if (const auto max = tensors.find("adamw.max_exp_avg_sq." + name); max != tensors.end())
      state->max_exp_avg_sq(max->second.to(like).clone());
    states[key] = std::move(state);
  }
}

}  // namespace branchgrpo
