#pragma once
// Checkpoints of a training run: one directory per checkpoint, written atomically and verified on reading.
//
//   <root>/iter-000010/weights.safetensors   the trainable tensors by name (LoRA A/B, or every weight)
//   <root>/iter-000010/state.safetensors     optimizer state (AdamW exp_avg, exp_avg_sq, step per parameter, and
//                                            adamw.state.<name> = 1 / 0: whether the parameter has state), EMA
//                                            shadows, stateful normalizer buffers
//   <root>/iter-000010/config.toml           the canonical text of the run's config (config/config_text.hpp)
//   <root>/iter-000010/manifest.txt          written last: the format, iteration and seed, each file's size and
//                                            XXH64, and the XXH64 of the manifest's own lines above it
//
// manifest.txt, e.g.
//   format branchgrpo-checkpoint-2
//   iteration 10
//   seed 5
//   ranks 2                                  (only for a multi-process run: the processes that wrote it)
//   file weights.safetensors 73824 9c1d5e0a77f3b2e1
//   file state.safetensors 221904 03f7aa91c2d45e68
//   file config.toml 1893 5be0c6d7e8f90a1b
//   manifest 4e7d0f1a2b3c4d5e
//
// A sharded run (optimizer.sharding, docs/distributed.md) writes no weights.safetensors: each rank writes its own
// range of the flat buffer of trainable tensors, and rank 0 the rest, into the same staging directory:
//
//   <root>/iter-000010/layout.txt                         the flat buffer (checkpoint_layout.hpp): tensors, offsets,
//                                                         shapes, shards, AdamW step, EMA
//   <root>/iter-000010/shard-00000-of-00002.safetensors   rank 0's range [lo, hi): "master" (the float32 masters),
//   <root>/iter-000010/shard-00001-of-00002.safetensors   "adamw.exp_avg", "adamw.exp_avg_sq" (after a step) and "ema"
//                                                         (with an EMA), each 1-D of hi - lo elements
//   <root>/iter-000010/state.safetensors                  the normalizer's buffers
//   <root>/iter-000010/config.toml, manifest.txt          as above; the manifest says "shards 2" and lists every file,
//                                                         the shards with the sizes and XXH64 their ranks reported
//
// read_checkpoint assembles the shards into the unsharded contents (full tensors by name, as an unsharded run
// writes them: export-lora, sample and a resume without sharding read it so); read_checkpoint_range reads only the
// shards that overlap one rank's range (a sharded resume at any world size: resharding is reading other ranges).
//
// Atomicity: the files are written (each fsync'ed) into <dir>.tmp, the manifest last, then the directory is renamed
// to <dir> (rename(2) of a directory is atomic on POSIX file systems). A crash before the rename leaves <dir>.tmp
// behind and every earlier checkpoint intact. Pruning renames a directory to <dir>.deleted before deleting it, so a
// kill in the middle never leaves a half-deleted "iter-N". recover_checkpoints (called at every start) removes
// what a crash left: *.tmp, *.deleted, *.old beside its committed directory (a *.old without one is renamed back),
// and "iter-N" directories without a manifest that are not whole checkpoints of the old format.
//
// Integrity: read_checkpoint verifies the manifest's own checksum, its format, and every file's size and XXH64
// (core/hash.hpp) before loading, so a flipped byte, a truncated or missing file is an error naming the file, never
// a silently different run. latest_checkpoint returns the newest checkpoint that verifies; find_checkpoint also
// says why each newer one was skipped.
//
// RNG state: none to save. Every random draw of a run is keyed by (seed, iteration, tree, node, step, stream)
// (noise/keyed_normal.hpp), and the prompts of an iteration are a function of the iteration, so the seed and the
// iteration number restore the whole random state.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/hash.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/files/input_file.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/safetensors.hpp"
#include "branchgrpo/training/checkpoint_layout.hpp"

namespace branchgrpo {

/// What a checkpoint holds.
struct checkpoint_contents {
  int iteration = 0;  ///< iterations completed; a resumed run continues with this iteration
  std::uint64_t seed = 0;
  std::map<std::string, torch::Tensor> weights;  ///< trainable tensors by name
  std::map<std::string, torch::Tensor> state;    ///< optimizer, EMA and normalizer tensors by name
  std::string config_text = {};                  ///< the run's canonical config (config/config_text.hpp); may be ""
  int ranks = 1;  ///< processes of the run that wrote it (data parallel: same experiment, rounding may differ)
  /// Read from a sharded checkpoint: its layout (the writer's shards); nullopt for an unsharded one.
  std::optional<checkpoint_layout> layout = std::nullopt;
};

/// What read_checkpoint_range reads of a sharded checkpoint: one range [lo, hi) of its flat buffer, by kind:
/// "master", "adamw.exp_avg" and "adamw.exp_avg_sq" (when layout.step > 0), "ema" (when layout.ema), each 1-D of
/// hi - lo elements in layout.dtype.
struct checkpoint_range {
  checkpoint_layout layout;
  std::int64_t lo = 0, hi = 0;
  std::map<std::string, torch::Tensor> tensors;
};

inline constexpr std::string_view checkpoint_format = "branchgrpo-checkpoint-2";
/// The format of checkpoints written before manifests (read no more; named in the refusal).
inline constexpr std::string_view checkpoint_format_1 = "branchgrpo-checkpoint-1";
inline constexpr std::string_view checkpoint_manifest = "manifest.txt";

/// "<root>/iter-<iteration, 6 digits>". Example: checkpoint_path("out/checkpoints", 10) == ".../iter-000010".
inline std::filesystem::path checkpoint_path(const std::filesystem::path& root, int iteration) {
  require(iteration >= 0, "checkpoint iteration ", iteration, " is negative");
  return root / ("iter-" + zero_padded(iteration, 6));
}

namespace detail {
// The iteration of a directory named "iter-<digits>" (nothing else: no suffix), else nullopt.
inline std::optional<int> checkpoint_name_iteration(const std::filesystem::path& dir) {
  const std::string name = dir.filename().string();
  if (name.size() <= 5 || name.rfind("iter-", 0) != 0) return std::nullopt;
  const std::string digits = name.substr(5);
  if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return parse_integer<int>(digits, name);
}

// Writes `bytes` as `path` (created or replaced), then fsync and a checked close: a full disk is an error naming
// the path and the system's reason.
inline void write_checked(const std::filesystem::path& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), path.string() + ": cannot create");
  int error = 0;
  while (!bytes.empty() && error == 0) {
    const ::ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) error = written < 0 ? errno : EIO;
    if (written > 0) bytes.remove_prefix(static_cast<std::size_t>(written));
  }
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0 && errno != EINTR) error = errno;
  if (error != 0) throw std::system_error(error, std::generic_category(), path.string() + ": cannot write");
}

// fsync of a directory, so that the renames and new entries in it are on disk.
inline void sync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), dir.string() + ": cannot open to sync");
  const int error = ::fsync(fd) != 0 && errno != EINVAL ? errno : 0;
  ::close(fd);
  if (error != 0) throw std::system_error(error, std::generic_category(), dir.string() + ": cannot sync");
}

// The parsed manifest.txt of a checkpoint directory.
struct manifest {
  std::string format;
  int iteration = 0;
  std::uint64_t seed = 0;
  int ranks = 1;
  int shards = 0;  // a sharded checkpoint's shard files (0: unsharded, weights.safetensors)
  struct file {
    std::string name;
    std::uint64_t size = 0;
    std::string xxh64;  // 16 hex digits
  };
  std::vector<file> files;
};

// The text of a manifest: the lines, then "manifest <xxh64 of the lines before it>".
inline std::string manifest_text(const manifest& m) {
  std::string text =
      "format " + m.format + "\niteration " + std::to_string(m.iteration) + "\nseed " + std::to_string(m.seed) + "\n";
  if (m.ranks != 1) text += "ranks " + std::to_string(m.ranks) + "\n";     // absent: one process
  if (m.shards != 0) text += "shards " + std::to_string(m.shards) + "\n";  // absent: unsharded
  for (const auto& f : m.files) text += "file " + f.name + " " + std::to_string(f.size) + " " + f.xxh64 + "\n";
  return text + "manifest " + hex_digest(xxh64_digest(text)) + "\n";
}

// Reads and checks <dir>/manifest.txt (its own checksum, format, fields); throws invalid_input naming the problem.
inline manifest read_manifest(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / checkpoint_manifest;
  std::error_code error;
  if (std::filesystem::symlink_status(path, error).type() == std::filesystem::file_type::not_found) {
    // A checkpoint of the first format (no manifest) is named as such; anything else is no checkpoint at all.
    if (std::filesystem::is_regular_file(dir / "state.safetensors", error)) {
      std::string format;
      try {
        const safetensors_checkpoint state(dir / "state.safetensors");
        const auto it = state.metadata().find("format");
        if (it != state.metadata().end()) format = it->second;
      } catch (const std::exception&) {
      }
      if (format == checkpoint_format_1)
        fail(dir.string(), ": a checkpoint of the old format ", checkpoint_format_1, " (no ", checkpoint_manifest,
             "), which this version does not read: continue it with the version that wrote it");
    }
    fail(dir.string(), ": not a valid checkpoint (no ", checkpoint_manifest, ")");
  }
  // A FIFO, a device, a link loop or a huge file in its place is one line here, never a hang or a 9 GB read.
  const std::string text = read_input_file(path, input_kinds::manifest);
  const std::string::size_type tail = text.rfind("manifest ");
  require(tail != std::string::npos && (tail == 0 || text[tail - 1] == '\n'), path.string(),
          ": not a valid checkpoint manifest (no checksum line)");
  const std::string body = text.substr(0, tail);
  std::string stated = text.substr(tail + 9);
  if (!stated.empty() && stated.back() == '\n') stated.pop_back();
  const std::string actual = hex_digest(xxh64_digest(body));
  require(stated == actual, path.string(), ": checksum mismatch (xxh64 ", actual, ", the manifest says ",
          echo_text(stated), ")");
  manifest m;
  std::istringstream lines(body);
  bool has_iteration = false, has_seed = false;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string key;
    words >> key;
    const auto rest = [&] {
      std::string value;
      std::getline(words >> std::ws, value);
      return value;
    };
    if (key == "format") {
      m.format = rest();
    } else if (key == "iteration") {
      m.iteration = parse_integer<int>(rest(), path.string() + ": iteration", 0);
      has_iteration = true;
    } else if (key == "seed") {
      m.seed = parse_integer<std::uint64_t>(rest(), path.string() + ": seed");
      has_seed = true;
    } else if (key == "ranks") {
      m.ranks = parse_integer<int>(rest(), path.string() + ": ranks", 1);
    } else if (key == "shards") {
      m.shards = parse_integer<int>(rest(), path.string() + ": shards", 1);
    } else if (key == "file") {
      manifest::file f;
      std::string size;
      words >> f.name >> size >> f.xxh64;
      require(!f.name.empty() && f.name.find('/') == std::string::npos && f.xxh64.size() == 16, path.string(),
              ": malformed line '", echo_text(line), "'");
      f.size = parse_integer<std::uint64_t>(size, path.string() + ": size of " + f.name);
      m.files.push_back(std::move(f));
    } else {
      fail(path.string(), ": unknown line '", echo_text(line), "'");
    }
  }
  require(m.format == checkpoint_format, path.string(), ": format '", echo_text(m.format), "' is not ",
          checkpoint_format, ": not a valid checkpoint");
  require(has_iteration && has_seed, path.string(), ": no ", has_iteration ? "seed" : "iteration", " line");
  std::vector<std::string> needed = {"state.safetensors"};
  if (m.shards == 0) {
    needed.emplace_back("weights.safetensors");
  } else {  // every shard of the layout: a manifest that lost one names it
    needed.emplace_back(checkpoint_layout_file);
    checkpoint_layout names;
    names.shards = m.shards;
    for (int r = 0; r < m.shards; ++r) needed.push_back(names.shard_file(r));
  }
  for (const std::string& name : needed)
    require(std::any_of(m.files.begin(), m.files.end(), [&](const auto& f) { return f.name == name; }), path.string(),
            ": does not list ", name);
  if (const auto named = checkpoint_name_iteration(dir))
    require(*named == m.iteration, path.string(), ": says iteration ", m.iteration, ", the directory ",
            dir.filename().string());
  return m;
}

// Checks each file the manifest lists: present, a regular file, its size, and (when `hashes`) its XXH64. Only a
// name that leads nowhere is "missing": a FIFO, a directory or a device in a file's place (a shard included) is
// named as what it is, "<dir>/shard-00001-of-00002.safetensors: is a FIFO, not a checkpoint file" (open_input_file,
// which never blocks on the FIFO).
inline void verify_files(const std::filesystem::path& dir, const manifest& m, bool hashes) {
  for (const auto& f : m.files) {
    const std::filesystem::path path = dir / f.name;
    std::error_code error;
    require(std::filesystem::status(path, error).type() != std::filesystem::file_type::not_found, path.string(),
            ": missing (", checkpoint_manifest, " lists it)");
    const std::uint64_t size = open_input_file(path, input_kinds::checkpoint_file).size();
    require(size == f.size, path.string(), ": size ", size, " bytes, the manifest says ", f.size);
    if (!hashes) continue;
    const std::string actual = hex_digest(file_digest(path, input_kinds::checkpoint_file).xxh64);
    require(actual == f.xxh64, path.string(), ": checksum mismatch (xxh64 ", actual, ", manifest says ", f.xxh64, ")");
  }
}
}  // namespace detail

/// Throws invalid_input naming the first problem of checkpoint directory `dir`: no or a damaged manifest, another
/// format, a listed file missing, of another size, or whose XXH64 differs ("<dir>/weights.safetensors: checksum
/// mismatch (xxh64 ..., manifest says ...)"). Returns normally for a checkpoint exactly as written.
inline void verify_checkpoint(const std::filesystem::path& dir) {
  detail::verify_files(dir, detail::read_manifest(dir), /*hashes=*/true);
}

/// "" when verify_checkpoint(dir) passes, else its message.
inline std::string checkpoint_problem(const std::filesystem::path& dir) {
  try {
    verify_checkpoint(dir);
    return {};
  } catch (const std::exception& error) {
    return error.what();
  }
}

/// Phase 1 of write_checkpoint: writes the files into "<dir>.tmp" (deleted first if a crash left one), the manifest
/// last, and returns that path. Until commit_checkpoint renames it, `dir` and every other checkpoint are untouched.
/// Write failures throw std::system_error naming the file and the system's reason.
inline std::filesystem::path stage_checkpoint(const std::filesystem::path& dir, const checkpoint_contents& contents) {
  std::filesystem::path staging = dir;
  staging += ".tmp";
  std::error_code error;
  std::filesystem::remove_all(staging, error);
  std::filesystem::create_directories(staging, error);
  require(!error, staging.string(), ": cannot create the checkpoint directory: ", error.message());
  const std::map<std::string, std::string> metadata = {{"format", std::string(checkpoint_format)},
                                                       {"iteration", std::to_string(contents.iteration)},
                                                       {"seed", std::to_string(contents.seed)}};
  save_safetensors(staging / "weights.safetensors", contents.weights, metadata);
  save_safetensors(staging / "state.safetensors", contents.state, metadata);
  detail::write_checked(staging / "config.toml", contents.config_text);
  detail::manifest m{.format = std::string(checkpoint_format),
                     .iteration = contents.iteration,
                     .seed = contents.seed,
                     .ranks = contents.ranks,
                     .files = {}};
  for (const char* name : {"weights.safetensors", "state.safetensors", "config.toml"}) {
    const file_digest_result digest = file_digest(staging / name);
    m.files.push_back({.name = name, .size = digest.size, .xxh64 = hex_digest(digest.xxh64)});
  }
  detail::write_checked(staging / checkpoint_manifest, detail::manifest_text(m));
  detail::sync_directory(staging);
  return staging;
}

/// Phase 2: renames the staged directory to `dir` (an existing `dir` is moved aside to "<dir>.old" first, then
/// deleted), and syncs the parent directory.
inline void commit_checkpoint(const std::filesystem::path& staging, const std::filesystem::path& dir) {
  std::error_code error;
  std::filesystem::path aside = dir;
  aside += ".old";
  std::filesystem::remove_all(aside, error);
  if (std::filesystem::exists(std::filesystem::symlink_status(dir, error))) {
    std::filesystem::rename(dir, aside, error);
    require(!error, dir.string(), ": cannot move the previous checkpoint aside: ", error.message());
  }
  std::filesystem::rename(staging, dir, error);
  require(!error, staging.string(), ": cannot rename to ", dir.string(), ": ", error.message());
  detail::sync_directory(dir.parent_path().empty() ? std::filesystem::path(".") : dir.parent_path());
  std::filesystem::remove_all(aside, error);
}

/// Writes `contents` to `dir` atomically (stage_checkpoint, then commit_checkpoint).
inline void write_checkpoint(const std::filesystem::path& dir, const checkpoint_contents& contents) {
  commit_checkpoint(stage_checkpoint(dir, contents), dir);
}

namespace detail {
// The kinds of tensors a shard file holds under `layout`, in a fixed order.
inline std::vector<std::string> shard_kinds(const checkpoint_layout& layout) {
  std::vector<std::string> kinds = {"master"};
  if (layout.step > 0) kinds.insert(kinds.end(), {"adamw.exp_avg", "adamw.exp_avg_sq"});
  if (layout.ema) kinds.emplace_back("ema");
  return kinds;
}

// Shard r's tensors, checked against the layout: every kind there, 1-D of the shard's length, in the layout's dtype.
inline std::map<std::string, torch::Tensor> load_shard(const std::filesystem::path& dir,
                                                       const checkpoint_layout& layout, int r) {
  const std::filesystem::path path = dir / layout.shard_file(r);
  std::map<std::string, torch::Tensor> tensors = load_safetensors(path);
  const std::int64_t count = layout.shard(r).count();
  const torch::Dtype dtype = layout.dtype == "float64" ? torch::kFloat64 : torch::kFloat32;
  for (const std::string& kind : shard_kinds(layout)) {
    const auto it = tensors.find(kind);
    require(it != tensors.end(), path.string(), ": no tensor '", kind, "' (", checkpoint_layout_file,
            " says it is there)");
    require(it->second.dim() == 1 && it->second.size(0) == count && it->second.scalar_type() == dtype, path.string(),
            ": tensor '", kind, "' is ", it->second.scalar_type(), " ", it->second.sizes(), ", the layout says ",
            layout.dtype, " [", count, "]");
  }
  return tensors;
}

// The layout of a sharded checkpoint whose manifest is `m` (shards > 0), checked against the manifest.
inline checkpoint_layout read_layout(const std::filesystem::path& dir, const manifest& m) {
  const std::filesystem::path path = dir / checkpoint_layout_file;
  checkpoint_layout layout = parse_checkpoint_layout(read_input_file(path, input_kinds::manifest), path.string());
  require(layout.shards == m.shards, path.string(), ": ", layout.shards, " shards, ", checkpoint_manifest, " says ",
          m.shards);
  return layout;
}

// The parts of a checkpoint that both formats share: iteration, seed, ranks, state.safetensors, config.toml.
inline checkpoint_contents read_common(const std::filesystem::path& dir, const manifest& m) {
  checkpoint_contents out;
  out.iteration = m.iteration;
  out.seed = m.seed;
  out.ranks = m.ranks;
  out.state = load_safetensors(dir / "state.safetensors");
  if (std::any_of(m.files.begin(), m.files.end(), [](const auto& f) { return f.name == "config.toml"; }))
    out.config_text = read_input_file(dir / "config.toml", input_kinds::config);
  return out;
}
}  // namespace detail

/// Reads a checkpoint directory written by write_checkpoint or write_sharded_checkpoint, after verify_checkpoint.
/// Errors name the file. A sharded checkpoint's shards are assembled into full tensors named as an unsharded run
/// names them: weights[name] (the masters), state "adamw.exp_avg.<name>", "adamw.exp_avg_sq.<name>",
/// "adamw.step.<name>", "adamw.state.<name>" and "ema.<name>"; `layout` says it was sharded.
/// Example: a checkpoint of 2 ranks with tensors w [4, 8], b [17] -> weights {w [4, 8], b [17]} whatever the shards.
inline checkpoint_contents read_checkpoint(const std::filesystem::path& dir) {
  const detail::manifest m = detail::read_manifest(dir);
  detail::verify_files(dir, m, /*hashes=*/true);
  checkpoint_contents out = detail::read_common(dir, m);
  if (m.shards == 0) {
    out.weights = load_safetensors(dir / "weights.safetensors");
    return out;
  }
  const checkpoint_layout layout = detail::read_layout(dir, m);
  std::map<std::string, std::vector<torch::Tensor>> parts;
  for (int r = 0; r < layout.shards; ++r)
    for (auto& [kind, tensor] : detail::load_shard(dir, layout, r)) parts[kind].push_back(std::move(tensor));
  for (const std::string& kind : detail::shard_kinds(layout)) {
    const torch::Tensor flat = torch::cat(parts.at(kind));
    for (const auto& t : layout.tensors) {
      torch::Tensor full = flat.narrow(0, t.offset, t.numel()).view(t.shape).clone();
      if (kind == "master")
        out.weights[t.name] = std::move(full);
      else
        out.state[(kind == "ema" ? "ema." : kind + ".") + t.name] = std::move(full);
    }
  }
  for (const auto& t : layout.tensors) {
    out.state["adamw.state." + t.name] = torch::tensor({std::int64_t{layout.step > 0 ? 1 : 0}}, torch::kInt64);
    if (layout.step > 0) out.state["adamw.step." + t.name] = torch::tensor({layout.step}, torch::kInt64);
  }
  out.layout = layout;
  return out;
}

/// Whether `dir`'s manifest says it is sharded (no verification of the other files: read_checkpoint* do that).
inline bool is_sharded_checkpoint(const std::filesystem::path& dir) { return detail::read_manifest(dir).shards > 0; }

/// Reads range [lo, hi) of a sharded checkpoint's flat buffer, loading only the shards that overlap it (every
/// file's checksum verified, as read_checkpoint does); contents.state and config_text as read_checkpoint's, no
/// weights. What a rank of a sharded run reads on resume, at any world size.
/// Example: written by 2 ranks (total 49: [0, 25), [25, 49)), read as rank 1 of 3 ([17, 34)) -> shard 0's last 8
///   elements then shard 1's first 9, for every kind.
/// @pre 0 <= lo <= hi <= the layout's total (else invalid_input naming both).
inline std::pair<checkpoint_contents, checkpoint_range> read_checkpoint_range(const std::filesystem::path& dir,
                                                                              std::int64_t lo, std::int64_t hi) {
  const detail::manifest m = detail::read_manifest(dir);
  require(m.shards > 0, dir.string(), ": not a sharded checkpoint (it has weights.safetensors: read_checkpoint)");
  detail::verify_files(dir, m, /*hashes=*/true);
  checkpoint_range range{.layout = detail::read_layout(dir, m), .lo = lo, .hi = hi, .tensors = {}};
  require(0 <= lo && lo <= hi && hi <= range.layout.total, dir.string(), ": range [", lo, ", ", hi,
          ") is not within the flat buffer of ", range.layout.total, " elements");
  std::map<std::string, std::vector<torch::Tensor>> parts;
  for (int r = 0; r < range.layout.shards; ++r) {
    const flat_shard shard = range.layout.shard(r);
    const std::int64_t first = std::max(lo, shard.lo), last = std::min(hi, shard.hi);
    if (first >= last) continue;
    for (auto& [kind, tensor] : detail::load_shard(dir, range.layout, r))
      parts[kind].push_back(tensor.narrow(0, first - shard.lo, last - first));
  }
  const torch::Dtype dtype = range.layout.dtype == "float64" ? torch::kFloat64 : torch::kFloat32;
  for (const std::string& kind : detail::shard_kinds(range.layout))
    range.tensors[kind] = parts.contains(kind) ? torch::cat(parts.at(kind)).clone() : torch::empty({0}, dtype);
  checkpoint_contents contents = detail::read_common(dir, m);
  contents.layout = range.layout;
  return {std::move(contents), std::move(range)};
}

/// Writes a sharded checkpoint to `dir` atomically, as one rank of `communicator` (every rank calls it; a
/// collective): rank 0 creates "<dir>.tmp"; every rank writes its shard file there (`shard`: its range of the flat
/// buffer by kind, as checkpoint_range holds them); rank 0 writes `contents`' state.safetensors and config.toml,
/// layout.txt, then the manifest with every shard's size and XXH64 as its rank reported them, and renames the
/// directory to `dir`. `layout` is the same on every rank.
/// A rank that fails (a full disk) rethrows its error after the others learned of it; they throw "<dir>: rank 1
/// could not write its shard (see its message)". A rank that dies leaves "<dir>.tmp" without a manifest (or none
/// committed) and every earlier checkpoint intact; the survivors' next collective names it.
/// @pre shard holds detail::shard_kinds(layout), each 1-D of layout.shard(rank).count() elements.
template <Communicator C>
void write_sharded_checkpoint(const std::filesystem::path& dir, const checkpoint_contents& contents,
                              const checkpoint_layout& layout, const std::map<std::string, torch::Tensor>& shard,
                              C& communicator) {
  require(layout.shards == communicator.size(), "a sharded checkpoint of ", layout.shards, " shards written by ",
          communicator.size(), " ranks");
  std::filesystem::path staging = dir;
  staging += ".tmp";
  const bool lead = communicator.rank() == 0;
  // Runs `body`, then tells every rank whether it failed on any: the failing rank rethrows its error, the others
  // name it. Returns the ranks' reports (two 64-bit words each, from body's return).
  const auto everywhere = [&](const char* what, auto&& body) {
    std::exception_ptr error;
    std::array<std::uint64_t, 3> mine = {0, 0, 0};
    try {
      const std::array<std::uint64_t, 2> report = body();
      mine = {1, report[0], report[1]};
    } catch (...) {
      error = std::current_exception();
    }
    const std::vector<std::uint64_t> all = all_gather_values(communicator, std::span<const std::uint64_t>(mine));
    if (error) std::rethrow_exception(error);
    for (int r = 0; r < communicator.size(); ++r)
      require(all[3 * static_cast<std::size_t>(r)] == 1, dir.string(), ": rank ", r, " could not ", what,
              " (see its message)");
    return all;
  };
  everywhere("create the staging directory", [&]() -> std::array<std::uint64_t, 2> {
    if (lead) {
      std::error_code error;
      std::filesystem::remove_all(staging, error);
      std::filesystem::create_directories(staging, error);
      require(!error, staging.string(), ": cannot create the checkpoint directory: ", error.message());
    }
    return {0, 0};
  });
  const flat_shard mine = layout.shard(communicator.rank());
  const std::vector<std::uint64_t> reports = everywhere("write its shard", [&]() -> std::array<std::uint64_t, 2> {
    for (const std::string& kind : detail::shard_kinds(layout)) {
      const auto it = shard.find(kind);
      require(it != shard.end() && it->second.numel() == mine.count(), "rank ", communicator.rank(),
              "'s shard has no '", kind, "' of ", mine.count(), " elements");
    }
    const std::filesystem::path path = staging / layout.shard_file(communicator.rank());
    save_safetensors(path, shard,
                     {{"format", std::string(checkpoint_format)},
                      {"iteration", std::to_string(contents.iteration)},
                      {"range", std::to_string(mine.lo) + " " + std::to_string(mine.hi)}});
    const file_digest_result digest = file_digest(path);
    return {digest.size, digest.xxh64};
  });
  everywhere("commit the checkpoint", [&]() -> std::array<std::uint64_t, 2> {
    if (!lead) return {0, 0};
    const std::map<std::string, std::string> metadata = {{"format", std::string(checkpoint_format)},
                                                         {"iteration", std::to_string(contents.iteration)},
                                                         {"seed", std::to_string(contents.seed)}};
    save_safetensors(staging / "state.safetensors", contents.state, metadata);
    detail::write_checked(staging / "config.toml", contents.config_text);
    detail::write_checked(staging / checkpoint_layout_file, checkpoint_layout_text(layout));
    detail::manifest m{.format = std::string(checkpoint_format),
                       .iteration = contents.iteration,
                       .seed = contents.seed,
                       .ranks = contents.ranks,
                       .shards = layout.shards,
                       .files = {}};
    for (const std::string_view name :
         {std::string_view("state.safetensors"), std::string_view("config.toml"), checkpoint_layout_file}) {
      const file_digest_result digest = file_digest(staging / name);
      m.files.push_back({.name = std::string(name), .size = digest.size, .xxh64 = hex_digest(digest.xxh64)});
    }
    for (int r = 0; r < layout.shards; ++r)
      m.files.push_back({.name = layout.shard_file(r),
                         .size = reports[3 * static_cast<std::size_t>(r) + 1],
                         .xxh64 = hex_digest(reports[3 * static_cast<std::size_t>(r) + 2])});
    detail::write_checked(staging / checkpoint_manifest, detail::manifest_text(m));
    detail::sync_directory(staging);
    commit_checkpoint(staging, dir);
    return {0, 0};
  });
}

/// One "iter-<digits>" directory under a checkpoint root.
struct checkpoint_entry {
  int iteration = 0;
  std::filesystem::path dir;
};

/// Every directory named "iter-<digits>" under `root` (valid or not), the newest first; none when root is absent.
inline std::vector<checkpoint_entry> list_checkpoints(const std::filesystem::path& root) {
  std::vector<checkpoint_entry> out;
  std::error_code error;
  if (!std::filesystem::is_directory(root, error)) return out;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    // A link counts whatever it points to (nothing, itself, a file): verifying it names the problem, so that a
    // link loop as the newest checkpoint is skipped with a warning like any damaged one.
    std::error_code type_error;
    if (!entry.is_directory(type_error) && !entry.is_symlink(type_error)) continue;
    if (const auto iteration = detail::checkpoint_name_iteration(entry.path()))
      out.push_back({.iteration = *iteration, .dir = entry.path()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.iteration > b.iteration; });
  return out;
}

/// The newest checkpoint under `root` that verifies, and for each newer one the reason it was skipped.
struct checkpoint_search {
  std::optional<std::filesystem::path> found;
  std::vector<std::string> skipped;  ///< one line per skipped directory (verify_checkpoint's message)
};

/// Example: iter-000004 valid, iter-000006 with a flipped byte -> {found = iter-000004, skipped =
/// {".../iter-000006/weights.safetensors: checksum mismatch (xxh64 ..., manifest says ...)"}}.
inline checkpoint_search find_checkpoint(const std::filesystem::path& root) {
  checkpoint_search out;
  for (const checkpoint_entry& entry : list_checkpoints(root)) {
    std::string problem = checkpoint_problem(entry.dir);
    if (problem.empty()) {
      out.found = entry.dir;
      break;
    }
    out.skipped.push_back(std::move(problem));
  }
  return out;
}

/// The newest checkpoint under `root` that verifies (nullopt when there is none). Staged ("*.tmp"), moved-aside
/// ("*.old") and half-deleted ("*.deleted") directories never count.
inline std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& root) {
  return find_checkpoint(root).found;
}

namespace detail {
// Renames `dir` to "<dir>.deleted", then deletes it: a kill in between leaves a name that never counts.
inline void delete_checkpoint_dir(const std::filesystem::path& dir) {
  std::error_code error;
  std::filesystem::path doomed = dir;
  doomed += ".deleted";
  std::filesystem::remove_all(doomed, error);
  std::filesystem::rename(dir, doomed, error);
  if (!error) std::filesystem::remove_all(doomed, error);
}

// Whether "iter-N" is what a crash or a half-finished deletion left: no manifest, and not both files of the old
// format (those are kept, and refused with their format's name).
inline bool checkpoint_incomplete(const std::filesystem::path& dir) {
  std::error_code error;
  if (std::filesystem::exists(std::filesystem::symlink_status(dir / checkpoint_manifest, error))) return false;
  return !(std::filesystem::is_regular_file(dir / "weights.safetensors", error) &&
           std::filesystem::is_regular_file(dir / "state.safetensors", error));
}
}  // namespace detail

/// Cleans what an interrupted write or prune left under `root` and returns one line per change: "*.tmp" and
/// "*.deleted" directories are removed; "iter-N.old" is removed when "iter-N" exists, else renamed back to it (a
/// kill between commit_checkpoint's two renames); "iter-N" directories without a manifest that are not whole
/// old-format checkpoints are removed. A checkpoint that verifies is never removed.
inline std::vector<std::string> recover_checkpoints(const std::filesystem::path& root) {
  std::vector<std::string> done;
  std::error_code error;
  if (!std::filesystem::is_directory(root, error)) return done;
  std::vector<std::filesystem::path> entries;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) entries.push_back(entry.path());
  std::sort(entries.begin(), entries.end());
  for (const std::filesystem::path& path : entries) {
    const std::string name = path.filename().string();
    if (name.rfind("iter-", 0) != 0) continue;
    if (name.ends_with(".tmp") || name.ends_with(".deleted")) {
      std::filesystem::remove_all(path, error);
      done.push_back("removed the interrupted " + path.string());
    } else if (name.ends_with(".old")) {
      const std::filesystem::path committed = path.parent_path() / name.substr(0, name.size() - 4);
      if (std::filesystem::exists(committed, error)) {
        std::filesystem::remove_all(path, error);
        done.push_back("removed the replaced " + path.string());
      } else {
        std::filesystem::rename(path, committed, error);
        done.push_back("restored " + committed.string() + " from " + path.string());
      }
    } else if (detail::checkpoint_name_iteration(path) && std::filesystem::is_directory(path, error) &&
               detail::checkpoint_incomplete(path)) {
      detail::delete_checkpoint_dir(path);
      done.push_back("removed the incomplete " + path.string());
    }
  }
  return done;
}

/// Deletes all but the `keep` newest intact checkpoints under `root` (intact: the manifest verifies and every file
/// has its listed size; hashes are not read here), and what recover_checkpoints removes.
inline void prune_checkpoints(const std::filesystem::path& root, int keep) {
  (void)recover_checkpoints(root);
  int kept = 0;
  for (const checkpoint_entry& entry : list_checkpoints(root)) {
    bool intact = true;
    try {
      detail::verify_files(entry.dir, detail::read_manifest(entry.dir), /*hashes=*/false);
    } catch (const std::exception&) {
      intact = false;
    }
    if (!intact) continue;  // a damaged one neither counts nor is deleted here: resume names it
    if (kept++ >= std::max(keep, 1)) detail::delete_checkpoint_dir(entry.dir);
  }
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

/// Which parameters have optimizer state, stated explicitly so that a lost tensor is an error, never a silently
/// reset parameter: "adamw.state.<name>" = int64 {1} when `tensors` (adamw_state_tensors' output) holds the
/// parameter's moments, else {0}, for every parameter. A checkpoint stores these beside the state.
/// Example: {adamw.exp_avg.w, adamw.exp_avg_sq.w, adamw.step.w} over parameters w, v ->
///   {adamw.state.w {1}, adamw.state.v {0}}.
inline std::map<std::string, torch::Tensor> adamw_state_presence(
    const std::map<std::string, torch::Tensor>& tensors,
    const std::vector<std::pair<std::string, torch::Tensor>>& parameters) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, parameter] : parameters)
    out["adamw.state." + name] =
        torch::tensor({std::int64_t{tensors.contains("adamw.exp_avg." + name) ? 1 : 0}}, torch::kInt64);
  return out;
}

/// Checks `tensors` against the presence markers of adamw_state_presence: each parameter's "adamw.state.<name>"
/// exists, and its moments and step are there exactly when it says 1. Throws invalid_input naming the parameter,
/// e.g. "optimizer state of 'w' is incomplete: adamw.state.w = 1 but no adamw.exp_avg_sq.w".
inline void check_adamw_state(const std::map<std::string, torch::Tensor>& tensors,
                              const std::vector<std::pair<std::string, torch::Tensor>>& parameters) {
  for (const auto& [name, parameter] : parameters) {
    const auto marker = tensors.find("adamw.state." + name);
    require(marker != tensors.end(), "optimizer state of '", name, "' is missing (no adamw.state.", name, ")");
    const std::int64_t has = marker->second.to(torch::kCPU, torch::kInt64).reshape({-1})[0].item<std::int64_t>();
    require(has == 0 || has == 1, "optimizer state of '", name, "': adamw.state.", name, " = ", has, " is not 0 or 1");
    for (const char* what : {"exp_avg", "exp_avg_sq", "step"}) {
      const bool present = tensors.contains(std::string("adamw.") + what + "." + name);
      require(present == (has == 1), "optimizer state of '", name, "' is ", has == 1 ? "incomplete" : "inconsistent",
              ": adamw.state.", name, " = ", has, present ? " but it has adamw." : " but no adamw.", what, ".", name);
    }
  }
}

/// Restores what adamw_state_tensors saved (every parameter's state replaced; a parameter absent from `tensors`
/// gets none, as before its first step: check_adamw_state first to refuse a lost tensor). Throws invalid_input
/// naming a tensor whose shape does not match, or a step / exp_avg_sq without its exp_avg.
inline void load_adamw_state(torch::optim::AdamW& optimizer,
                             const std::vector<std::pair<std::string, torch::Tensor>>& parameters,
                             const std::map<std::string, torch::Tensor>& tensors) {
  auto& states = optimizer.state();
  for (const auto& [name, parameter] : parameters) {
    const auto key = detail::optimizer_state_key<torch::optim::AdamW>(parameter);
    states.erase(key);
    const auto avg = tensors.find("adamw.exp_avg." + name);
    const auto squares = tensors.find("adamw.exp_avg_sq." + name);
    const auto step = tensors.find("adamw.step." + name);
    if (avg == tensors.end()) {
      require(squares == tensors.end() && step == tensors.end(), "optimizer state of '", name,
              "' is incomplete (exp_avg_sq or step without exp_avg)");
      continue;
    }
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
