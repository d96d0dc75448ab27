#pragma once
// The canonical text of a run configuration, and what differs between two of them (what `train --resume` checks).
//
//   config_text(config)                      every key with its effective value (defaults included), one
//                                            "key.path = value" per line in TOML, then one "# input" line per
//                                            input file with its size and XXH64 (the model's identity)
//   compare_config_text(stored, current)     the keys whose values differ, split into those that change the
//                                            experiment (refused on resume) and those that may change
//
// Example (the default config, abridged):
//   # branchgrpo run config: every key with its effective value
//   model.dir = "models/shapes-tiny"
//   model.dtype = "float32"
//   ...
//   topology.kind = "split_schedule"
//   topology.split_steps = [0, 3, 6, 9]
//   ...
//   pruning.pruners = []
//   rewards = [{ name = "alignment", weight = 1.0, params = {} }]
//   run.iterations = 100
//   ...
//   # input model.dir/model.safetensors = "1857704 bytes, xxh64 3f1c...."
//
// The text is a valid config: parse_run_config(config_text(c), ...) gives c back (the "# input" lines are
// comments to TOML; model.weights is written only without model.dir, where the reader accepts it). Policies are written
// through their described parameters (core/parameters.hpp), the held policy's only, so every family's choice
// round-trips.
//
// What may change on resume (resume_may_change): the run's length and bookkeeping, and what changes speed or
// memory but not the experiment:
//   run.iterations, run.grid_every, run.checkpoint_every, run.keep_checkpoints, run.output_dir
//   rollout.max_batch, rollout.decode_batch, model.gradient_checkpointing, model.device (the results agree up to
//   floating-point
//     rounding: a resumed run stays bit-identical to an uninterrupted one only when these are unchanged)
//   model.dir, model.weights, model.decoder, data.embeddings, eval.embeddings (paths: a moved file may be named
//     anew; its content is compared through its "# input" line, which is an experiment key)
//   optimizer.sharding, optimizer.bucket_mb (which rank keeps which share of the optimizer state: the same
//     experiment up to rounding, and checkpoints hold full tensors at any world size)
//   eval.every (when evaluations happen; what each one measures stays: its prompts, samples, steps, seed, EMA and
//     rewards are refused, so that every evaluation of a run is comparable with the others)
// Every other key changes the experiment (the learning rate, steps, topology, rewards, advantage, dtype, seed, the
// base model's bytes, ...) and is refused.
#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/core/hash.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/files/input_file.hpp"

namespace branchgrpo {

namespace config_text_detail {

// A TOML basic string: quoted, with \, " and control characters escaped.
inline std::string toml_string(std::string_view text) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7F) {
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 0xF];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// A value as TOML writes it: strings and enumeration names quoted, numbers and lists as value_text.
template <class V>
std::string toml_value(const V& value) {
  if constexpr (NamedEnum<V>) {
    return toml_string(value_text(value));
  } else if constexpr (std::is_convertible_v<const V&, std::string_view>) {
    return toml_string(value);
  } else if constexpr (requires {
                         value.size();
                         value[0];
                       }) {
    std::string text = "[";
    for (std::size_t i = 0; i < value.size(); ++i) text += (i == 0 ? "" : ", ") + toml_value(value[i]);
    return text + "]";
  } else {
    return value_text(value);
  }
}

// "key = value" for each described parameter of `owner` that its description writes (parameter_of::written),
// keys prefixed with `prefix`: a policy's parameters, or a section's.
template <class Owner>
void add_parameters(std::string& out, std::string_view prefix, const Owner& owner) {
  std::apply(
      [&](const auto&... p) {
        ((p.is_written(owner)
              ? void(out += std::string(prefix) + std::string(p.name) + " = " + toml_value(owner.*(p.member)) + "\n")
              : void()),
         ...);
      },
      parameters_of<Owner>());
}

// "<prefix><name>" of each described parameter of Owner that resume may change (parameter_of::resumable).
template <class Owner>
void add_resumable(std::vector<std::string>& out, std::string_view prefix) {
  std::apply(
      [&](const auto&... p) {
        ((p.may_change_on_resume ? out.push_back(std::string(prefix) + std::string(p.name)) : void()), ...);
      },
      Owner::parameters());
}

// "<prefix><kind_key> = "<name>"" and the held policy's parameters.
template <class AnyPolicy>
void add_policy(std::string& out, std::string_view prefix, std::string_view kind_key, const AnyPolicy& any) {
  out += std::string(prefix) + std::string(kind_key) + " = " + toml_string(any.name()) + "\n";
  std::visit([&](const auto& p) { add_parameters(out, prefix, p); }, any.policy);
}

// The held policy as an inline table: { kind = "parent_top_k", k = 1 }.
template <class AnyPolicy>
std::string inline_policy(const AnyPolicy& any) {
  std::string body = "kind = " + toml_string(any.name());
  std::visit(
      [&](const auto& p) {
        using P = std::decay_t<decltype(p)>;
        std::apply(
            [&](const auto&... d) { ((body += ", " + std::string(d.name) + " = " + toml_value(p.*(d.member))), ...); },
            parameters_of<P>());
      },
      any.policy);
  return "{ " + body + " }";
}

// "1857704 bytes, xxh64 3f1c..." of a file ("3 shards, 1857704 bytes, xxh64 ..." of a prompt dataset's shard
// directory), or why it has none.
inline std::string input_identity(const std::filesystem::path& path) {
  try {
    if (std::filesystem::is_directory(path)) {
      // A prompt dataset's shard directory: its *.safetensors files in name order, each by name, size and XXH64.
      std::vector<std::filesystem::path> files;
      for (const auto& entry : std::filesystem::directory_iterator(path))
        if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
      if (files.empty()) return "a directory without *.safetensors files";
      std::sort(files.begin(), files.end());
      xxh64 hash;
      std::uint64_t size = 0;
      for (const std::filesystem::path& file : files) {
        const file_digest_result digest = file_digest(file);
        const std::string entry =
            file.filename().string() + " " + std::to_string(digest.size) + " " + hex_digest(digest.xxh64) + "\n";
        hash.update(entry.data(), entry.size());
        size += digest.size;
      }
      return std::to_string(files.size()) + " shards, " + std::to_string(size) + " bytes, xxh64 " +
             hex_digest(hash.digest());
    }
    const file_digest_result digest = file_digest(path);
    return std::to_string(digest.size) + " bytes, xxh64 " + hex_digest(digest.xxh64);
  } catch (const invalid_input&) {
    return "not a readable file";
  }
}

// The keys resume may change (see the file comment): the sections' resumable parameters, and the sharding keys
// (read by read_optimizer beside optimizer_options: which rank keeps which share of the optimizer state).
inline const std::vector<std::string>& resumable() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    for_each_described_section([&]<class Section>(std::type_identity<Section>, std::string_view name) {
      add_resumable<Section>(out, std::string(name) + ".");
    });
    out.insert(out.end(), {"optimizer.sharding", "optimizer.bucket_mb"});
    return out;
  }();
  return keys;
}

}  // namespace config_text_detail

/// The input files a config names, as "# input" keys: "model.dir/model.safetensors" (and
/// "model.dir/prompts.safetensors" without data.embeddings), "model.weights", "data.embeddings", "model.decoder"
/// (unless "pixels") and "rewards[i].params.file", each with its resolved path.
inline std::vector<std::pair<std::string, std::filesystem::path>> config_inputs(const run_config& config) {
  std::vector<std::pair<std::string, std::filesystem::path>> out;
  const model_section& m = config.model;
  if (!m.dir.empty()) {
    out.emplace_back("model.dir/model.safetensors", config.input_path(m.dir) / "model.safetensors");
    if (config.data.embeddings.empty())
      out.emplace_back("model.dir/prompts.safetensors", config.input_path(m.dir) / "prompts.safetensors");
  }
  if (!m.weights.empty()) out.emplace_back("model.weights", config.input_path(m.weights));
  if (!config.data.embeddings.empty()) out.emplace_back("data.embeddings", config.input_path(config.data.embeddings));
  if (m.decoder != "pixels") out.emplace_back("model.decoder", config.input_path(m.decoder));
  const auto reward_files = [&](std::string_view section, const std::vector<reward_entry>& rewards) {
    for (std::size_t i = 0; i < rewards.size(); ++i) {
      const auto it = rewards[i].params.find("file");
      if (it != rewards[i].params.end() && std::holds_alternative<std::string>(it->second))
        out.emplace_back(std::string(section) + "[" + std::to_string(i) + "].params.file",
                         config.input_path(std::get<std::string>(it->second)));
    }
  };
  reward_files("rewards", config.rewards);
  if (config.eval.enabled()) {
    out.emplace_back("eval.embeddings", config.input_path(config.eval.embeddings));
    reward_files("eval.rewards", config.eval.rewards);
  }
  return out;
}

/// The canonical text of `config` (see the file comment): every key with its effective value, then, with
/// `inputs`, each input file's size and XXH64 (read whole: a large base model takes a while to hash).
/// @post parse_run_config(config_text(c), ...) holds the same values as c; equal configs give equal texts.
inline std::string config_text(const run_config& config, bool inputs = true) {
  using namespace config_text_detail;
  std::string out = "# branchgrpo run config: every key with its effective value\n";
  const auto line = [&](std::string_view key, const std::string& value) {
    out += std::string(key) + " = " + value + "\n";
  };
  add_parameters(out, "model.", config.model);
  add_parameters(out, "data.", config.data);
  add_policy(out, "topology.", "kind", config.recipe.topology);
  add_parameters(out, "rollout.", config.rollout);
  add_policy(out, "rollout.", "stepper", config.recipe.stepper);
  add_policy(out, "correlator.", "kind", config.recipe.correlator);
  add_policy(out, "fusion.", "kind", config.recipe.fusion);
  add_policy(out, "advantage.", "kind", config.recipe.normalizer.normalizer);
  line("advantage.per_reward", toml_value(config.recipe.normalizer.per_reward));
  line("pruning.active_fraction", toml_value(config.recipe.pruner.fraction));
  {
    std::string list = "[";
    const auto& pruners = config.recipe.pruner.pruner.pruners;
    for (std::size_t i = 0; i < pruners.size(); ++i) list += (i ? ", " : "") + inline_policy(pruners[i]);
    line("pruning.pruners", list + "]");
  }
  add_parameters(out, "loss.", config.loss);  // ratio_norm and step_weight only when on (ppo_options)
  // The objective only when it is not PPO, so that the text of a PPO run reads as it did before the key existed (its
  // checkpoints resume).
  if (config.recipe.objective.name() != ppo_ratio::name) add_policy(out, "objective.", "kind", config.recipe.objective);
  add_parameters(out, "optimizer.", config.optimizer);
  // Sharding only when on, so that the text of an unsharded run reads as it did before the keys existed (its
  // checkpoints resume).
  if (config.sharding.sharded()) {
    line("optimizer.sharding", toml_string(std::string(sharding_name(config.sharding.mode))));
    line("optimizer.bucket_mb", toml_value(config.sharding.bucket_megabytes));
  }
  add_parameters(out, "lora.", config.lora);
  const auto reward_list = [&](const std::vector<reward_entry>& rewards) {
    std::string list = "[";
    for (std::size_t i = 0; i < rewards.size(); ++i) {
      const reward_entry& r = rewards[i];
      std::string params;
      for (const auto& [key, value] : r.params)  // a std::map: sorted, so equal entries give equal text
        params +=
            (params.empty() ? "" : ", ") + key + " = " + std::visit([](const auto& v) { return toml_value(v); }, value);
      // win_rate only when set, so that the text of a config without it reads as it did before the key existed.
      list += std::string(i ? ", " : "") + "{ name = " + toml_string(r.name) + ", weight = " + toml_value(r.weight) +
              (r.win_rate ? ", win_rate = true" : "") + ", params = {" + (params.empty() ? "" : " " + params + " ") +
              "} }";
    }
    return list + "]";
  };
  line("rewards", reward_list(config.rewards));
  add_parameters(out, "run.", config.run);
  add_parameters(out, "eval.", config.eval);  // only when on (eval_section)
  if (config.eval.enabled() && !config.eval.rewards.empty())
    line("eval.rewards", reward_list(config.eval.rewards));  // none: the run's [[rewards]]
  if (inputs)
    for (const auto& [key, path] : config_inputs(config))
      out += "# input " + key + " = " + toml_string(input_identity(path)) + "\n";
  return out;
}

/// Whether resume accepts a change of `key` (see the file comment). Example: resume_may_change("run.iterations")
/// is true, resume_may_change("optimizer.lr") false, resume_may_change("input model.dir/model.safetensors") false.
inline bool resume_may_change(std::string_view key) {
  const auto& keys = config_text_detail::resumable();
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

/// One key whose value differs; "" for a side that has no such key.
struct config_change {
  std::string key;
  std::string before;
  std::string after;
  friend bool operator==(const config_change&, const config_change&) = default;
};

/// The differing keys of two canonical texts, in the order of `current` (then keys only `stored` has).
struct config_difference {
  std::vector<config_change> refused;  ///< keys that change the experiment
  std::vector<config_change> allowed;  ///< keys resume may change (resume_may_change)
  [[nodiscard]] bool empty() const { return refused.empty() && allowed.empty(); }
};

/// The "key = value" entries of a canonical text, in order: "# input <key> = <value>" lines give key
/// "input <key>"; other comments and blank lines are skipped.
inline std::vector<std::pair<std::string, std::string>> config_entries(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> out;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    std::string prefix;
    if (line.starts_with("# input ")) {
      line.remove_prefix(8);
      prefix = "input ";
    } else if (line.empty() || line.starts_with("#")) {
      continue;
    }
    const std::size_t equals = line.find(" = ");
    if (equals == std::string_view::npos) continue;
    out.emplace_back(prefix + std::string(line.substr(0, equals)), std::string(line.substr(equals + 3)));
  }
  return out;
}

/// What differs between the config a checkpoint stored and the current one (both config_text).
/// Example: stored "optimizer.lr = 0.001\nrun.iterations = 2\n", current "optimizer.lr = 0.002\nrun.iterations =
/// 3\n" -> refused {{"optimizer.lr", "0.001", "0.002"}}, allowed {{"run.iterations", "2", "3"}}.
inline config_difference compare_config_text(std::string_view stored, std::string_view current) {
  const auto before = config_entries(stored), after = config_entries(current);
  std::map<std::string, std::string> old(before.begin(), before.end());
  config_difference out;
  const auto add = [&](config_change change) {
    (resume_may_change(change.key) ? out.allowed : out.refused).push_back(std::move(change));
  };
  for (const auto& [key, value] : after) {
    const auto it = old.find(key);
    if (it == old.end()) {
      add({.key = key, .before = "", .after = value});
      continue;
    }
    if (it->second != value) add({.key = key, .before = it->second, .after = value});
    old.erase(it);
  }
  for (const auto& [key, value] : before)
    if (old.contains(key)) add({.key = key, .before = value, .after = ""});
  return out;
}

/// The changes as one line: "optimizer.lr (0.001 -> 0.002), rewards ([...] -> [...])", values cut to 32
/// characters (echo_text), "(none)" for a missing side.
inline std::string config_changes_text(const std::vector<config_change>& changes) {
  std::string text;
  for (const config_change& c : changes)
    text += (text.empty() ? "" : ", ") + c.key + " (" + (c.before.empty() ? "(none)" : echo_text(c.before)) + " -> " +
            (c.after.empty() ? "(none)" : echo_text(c.after)) + ")";
  return text;
}

}  // namespace branchgrpo
