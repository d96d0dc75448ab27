#pragma once
// The configuration of a training run (`branchgrpo train --config FILE.toml`), torch-free: the schema, its
// defaults, the TOML reader and the validation. docs/config.md documents every key.
//
//   load_run_config("run.toml")            parse + validate a file; every error is one line
//   parse_run_config(text, "run.toml")     the same from a string (tests)
//   make_recipe(config) / config.recipe    the run's components as one typed `method`
//   preset_recipe("branch-widpru")         with_preset's recipe as the run's component types
//
// Run-time choices, compile-time policies: each family's choice is a std::variant of that family's policies,
// held by a small wrapper (any_topology, any_stepper, ...) that models the family's concept by visiting the
// variant. So `train_iteration` is instantiated once for every configuration (the sum of the families'
// alternatives is compiled, not their product) and the policies below it stay fully typed; the cost is one
// std::visit per component call (a few per iteration, or per split group for the correlator).
//
// Errors: "<file>: <key path> = <value>: <reason>", e.g. "run.toml: rollout.steps = 0: must be at least 1";
// unknown keys: "run.toml: unknown key rollout.stepz (rollout has: steps, shift, ...)". Relative input paths
// (model.dir, model.weights, model.decoder, data.embeddings, reward files) are resolved against the config
// file's directory; run.output_dir against the working directory.
#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "branchgrpo/advantage/concept.hpp"
#include "branchgrpo/advantage/depth_wise.hpp"
#include "branchgrpo/advantage/leaf_group.hpp"
#include "branchgrpo/advantage/per_prompt_running.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/correlator/antithetic.hpp"
#include "branchgrpo/correlator/concept.hpp"
#include "branchgrpo/correlator/correlated.hpp"
#include "branchgrpo/correlator/independent.hpp"
#include "branchgrpo/correlator/orthogonal.hpp"
#include "branchgrpo/correlator/scaled.hpp"
#include "branchgrpo/fusion/concept.hpp"
#include "branchgrpo/fusion/max_reward.hpp"
#include "branchgrpo/fusion/path_softmax.hpp"
#include "branchgrpo/fusion/split_softmax.hpp"
#include "branchgrpo/fusion/uniform_mean.hpp"
#include "branchgrpo/loss/ppo.hpp"
#include "branchgrpo/pruning/combinators.hpp"
#include "branchgrpo/pruning/concept.hpp"
#include "branchgrpo/pruning/depth_window.hpp"
#include "branchgrpo/pruning/extreme.hpp"
#include "branchgrpo/pruning/keep_all.hpp"
#include "branchgrpo/pruning/parent_top_k.hpp"
#include "branchgrpo/pruning/sde_window.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/schedule/steppers.hpp"
#include "branchgrpo/topology/concept.hpp"
#include "branchgrpo/topology/flow_grpo_fast.hpp"
#include "branchgrpo/topology/sequential.hpp"
#include "branchgrpo/topology/split_schedule.hpp"
#include "branchgrpo/training/presets.hpp"
#include "branchgrpo/training/trainer.hpp"

namespace branchgrpo {

// ---- Run-time choices as policies ---------------------------------------------------------------------------

/// One of the topologies, chosen at run time. Example: any_topology{sequential{.group_size = 4}}(20) is
/// sequential{.group_size = 4}(20). Default: split_schedule::dense().
struct any_topology {
  std::variant<split_schedule, sequential, flow_grpo_fast> policy = split_schedule::dense();
  tree_plan operator()(int steps) const {
    return std::visit([&](const auto& p) { return p(steps); }, policy);
  }
  friend bool operator==(const any_topology&, const any_topology&) = default;
};

/// One of the SDE steppers. Default: dance_sde{.eta = 0.3}.
struct any_stepper {
  std::variant<dance_sde, flow_grpo_sde> policy = dance_sde{};
  affine_step operator()(const sigma_schedule& schedule, int step) const {
    return std::visit([&](const auto& p) { return p(schedule, step); }, policy);
  }
  friend bool operator==(const any_stepper&, const any_stepper&) = default;
};

/// One of the noise correlators. Default: correlated{.s = 4} (paper Eq. 2).
struct any_correlator {
  std::variant<independent, correlated, antithetic, orthogonal, scaled> policy = correlated{};
  double operator()(const sibling_group& group, std::span<double> out) const {
    return std::visit([&](const auto& p) { return p(group, out); }, policy);
  }
  friend bool operator==(const any_correlator&, const any_correlator&) = default;
};

/// One of the fusion weightings. Default: uniform_mean.
struct any_fusion {
  std::variant<uniform_mean, path_softmax, split_softmax, max_reward> policy = uniform_mean{};
  std::vector<double> operator()(const rollout_tree& tree, std::span<const double> leaf_rewards) const {
    return std::visit([&](const auto& p) { return p(tree, leaf_rewards); }, policy);
  }
  friend bool operator==(const any_fusion&, const any_fusion&) = default;
};

/// One of the advantage normalizers (per_prompt_running keeps state: a checkpoint saves it). Default:
/// depth_wise per tree.
struct any_normalizer {
  std::variant<depth_wise, leaf_group, per_prompt_running> policy = depth_wise{};
  std::vector<double> operator()(const rollout_tree& tree, const reward_view& rewards) {
    return std::visit([&](auto& p) { return p(tree, rewards); }, policy);
  }
  friend bool operator==(const any_normalizer&, const any_normalizer&) = default;
};

/// One pruner of a run's list.
using pruner_choice = std::variant<keep_all, parent_top_k, depth_window, sde_window, extreme>;

/// Every pruner of the list at once (masks intersected, like all_of; an empty list keeps every SDE edge),
/// active for the first `active_fraction` of the run (like active_for). Always a RolloutShaper: members that
/// shape rollouts (sde_window) do so, in order, for the whole run.
/// Example: {parent_top_k{.k = 1}} with active_fraction 0.5 over 10 iterations = active_for{parent_top_k{}, 0.5}.
struct any_pruner {
  std::vector<pruner_choice> pruners = {};
  double active_fraction = 1.0;

  edge_mask operator()(const rollout_tree& tree, const prune_context& context) const {
    const active_for<keep_all> gate{.pruner = {}, .fraction = active_fraction};
    edge_mask mask = trainable_edges(tree);
    if (!gate.active(context)) return mask;
    for (const pruner_choice& choice : pruners) {
      const edge_mask member = std::visit([&](const auto& p) { return p(tree, context); }, choice);
      require(member.size() == mask.size(), "pruner returned ", member.size(), " flags for ", mask.size(), " nodes");
      for (std::size_t n = 0; n < mask.size(); ++n) mask[n] = mask[n] && member[n] ? 1 : 0;
    }
    return mask;
  }

  tree_plan shape(const tree_plan& plan, int iteration) const {
    tree_plan shaped = plan;
    for (const pruner_choice& choice : pruners)
      shaped = std::visit([&](const auto& p) { return shape_plan(p, std::move(shaped), iteration); }, choice);
    return shaped;
  }

  friend bool operator==(const any_pruner&, const any_pruner&) = default;
};

/// The run's recipe: one method type for every configuration.
using run_recipe = method<any_topology, any_stepper, any_correlator, any_fusion, any_normalizer, any_pruner>;

/// Whether two run recipes hold equal components (method itself has no operator==).
inline bool same_recipe(const run_recipe& a, const run_recipe& b) {
  return a.topology == b.topology && a.stepper == b.stepper && a.correlator == b.correlator && a.fusion == b.fusion &&
         a.normalizer == b.normalizer && a.pruner == b.pruner;
}

/// with_preset's recipe `name` as a run_recipe (same components, same parameters).
/// Example: preset_recipe("dance").topology(20).evaluations() == 305.
/// @pre name is one of preset_names (else invalid_input naming it).
inline run_recipe preset_recipe(std::string_view name) {
  return with_preset(name, [](auto recipe) {
    run_recipe out;
    out.topology.policy = recipe.topology;
    out.stepper.policy = recipe.stepper;
    out.correlator.policy = recipe.correlator;
    out.fusion.policy = recipe.fusion;
    out.normalizer.policy = recipe.normalizer;
    if constexpr (!std::is_same_v<decltype(recipe.pruner), keep_all>) out.pruner.pruners = {recipe.pruner};
    return out;
  });
}

// ---- The schema ---------------------------------------------------------------------------------------------

/// [model]: which transformer, from where, on what. Either `dir` (a model directory: model.safetensors with its
/// FLUX config in the metadata, prompts.safetensors) or `config` (dev, schnell, tiny) with `weights`.
struct model_section {
  std::string dir = "models/shapes-tiny";
  std::string config = "";         ///< dev, schnell or tiny; used when dir is ""
  std::string weights = "";        ///< FLUX transformer checkpoint for `config` (bfl or diffusers); "" = random (tiny)
  std::string decoder = "pixels";  ///< "pixels" (latents are RGB in [-1, 1]) or a decoder file
  std::string dtype = "float32";   ///< float32, bfloat16, float16
  std::string device = "cpu";      ///< cpu, cuda, cuda:N
  double guidance = 3.5;
  std::int64_t latent_height = 0;  ///< 0: the model directory's (16 for shapes-tiny)
  std::int64_t latent_width = 0;
  bool gradient_checkpointing = false;
  friend bool operator==(const model_section&, const model_section&) = default;
};

/// [data]: the prompt embeddings and how many prompts (trees) each iteration trains.
struct data_section {
  std::string embeddings = "";  ///< "" = <model.dir>/prompts.safetensors
  int prompts_per_iteration = 2;
  friend bool operator==(const data_section&, const data_section&) = default;
};

/// [rollout] (the stepper and its eta / noise_level live in the recipe).
struct rollout_section {
  int steps = 20;
  double shift = 3.0;
  std::int64_t max_batch = 64;
  friend bool operator==(const rollout_section&, const rollout_section&) = default;
};

/// [optimizer]
struct optimizer_section {
  double lr = 1e-5;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-4;
  double max_grad_norm = 1.0;
  double ema_decay = 0.0;
  int updates_per_iteration = 1;
  friend bool operator==(const optimizer_section&, const optimizer_section&) = default;
};

/// [lora]
struct lora_section {
  bool enabled = true;
  std::int64_t rank = 16;
  double alpha = 16;
  std::vector<std::string> targets = {"attention", "mlp"};  ///< of attention, mlp, modulation, embedding
  friend bool operator==(const lora_section&, const lora_section&) = default;
};

/// One [[rewards]] entry: a reward by name, its weight in the sum, and its own parameters (numbers, strings or
/// booleans, checked by the reward when it is built).
struct reward_entry {
  std::string name;
  double weight = 1.0;
  std::map<std::string, std::variant<double, std::string, bool>> params = {};
  friend bool operator==(const reward_entry&, const reward_entry&) = default;
};

/// [run]
struct run_section {
  int iterations = 100;
  std::uint64_t seed = 0;
  std::string output_dir = "out/train";
  int grid_every = 10;        ///< 0: no grids
  int checkpoint_every = 10;  ///< 0: only the final checkpoint
  int keep_checkpoints = 2;   ///< complete checkpoints kept (the newest)
  friend bool operator==(const run_section&, const run_section&) = default;
};

/// Reward names a config may use (adapters/torch rewards; see docs/config.md).
inline constexpr std::array<std::string_view, 4> reward_names = {"alignment", "jpeg_compressibility",
                                                                 "jpeg_incompressibility", "torchscript"};

/// A whole run. Defaults: the shipped shapes model, BranchGRPO's dense tree (branch preset), LoRA rank 16.
struct run_config {
  std::string source = "config";         ///< the file name errors start with
  std::filesystem::path base_dir = ".";  ///< relative input paths are resolved against it
  model_section model;
  data_section data;
  rollout_section rollout;
  run_recipe recipe = preset_recipe("branch");
  ppo_options loss;
  optimizer_section optimizer;
  lora_section lora;
  std::vector<reward_entry> rewards = {{.name = "alignment", .weight = 1.0, .params = {}}};
  run_section run;

  /// An input path as given, or resolved against base_dir when relative; "" stays "".
  [[nodiscard]] std::filesystem::path input_path(const std::string& path) const {
    if (path.empty()) return {};
    const std::filesystem::path p(path);
    return p.is_absolute() ? p : base_dir / p;
  }
  [[nodiscard]] sigma_schedule schedule() const { return shifted_linear_schedule(rollout.steps, rollout.shift); }
  [[nodiscard]] training_options training() const {
    return {.max_batch = rollout.max_batch,
            .seed = run.seed,
            .updates_per_iteration = optimizer.updates_per_iteration,
            .total_iterations = run.iterations,
            .loss = loss};
  }
};

// ---- Reading ------------------------------------------------------------------------------------------------

namespace config_detail {

/// A TOML value on one line, as written in TOML (strings quoted, floats in their shortest exact form).
inline std::string node_text(const toml::node& node) {
  std::ostringstream out;
  if (const auto* number = node.as_floating_point()) {
    const double value = number->get();
    char buffer[64];
    const auto end = std::to_chars(buffer, buffer + sizeof buffer, value).ptr;
    std::string text(buffer, end);
    if (std::isfinite(value) && text.find_first_of(".e") == std::string::npos) text += ".0";
    return text;
  }
  node.visit([&](const auto& value) { out << value; });
  std::string text = out.str();
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

/// Reads one table, remembering the keys it consumed so that the rest can be rejected as unknown.
class table_reader {
 public:
  table_reader(std::string file, std::string path, const toml::table* table)
      : file_(std::move(file)), path_(std::move(path)), table_(table) {}

  [[nodiscard]] std::string key_path(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }
  [[nodiscard]] const toml::node* find(std::string_view key) const {
    return table_ == nullptr ? nullptr : table_->get(key);
  }
  [[nodiscard]] bool has(std::string_view key) const { return find(key) != nullptr; }

  [[noreturn]] void bad(std::string_view key, std::string_view why) const {
    fail(file_, ": ", key_path(key), " = ", node_text(*find(key)), ": ", why);
  }

  /// Reads `key` into `out` when present (type-checked); returns whether it was present.
  template <class T>
  bool read(std::string_view key, T& out) {
    known_.insert(std::string(key));
    const toml::node* node = find(key);
    if (node == nullptr) return false;
    out = convert<T>(key, *node);
    return true;
  }

  /// read, then `check(value)` must return "" (else the reason).
  template <class T, class Check>
  bool read(std::string_view key, T& out, Check check) {
    if (!read(key, out)) return false;
    const std::string why = check(out);
    if (!why.empty()) bad(key, why);
    return true;
  }

  /// Marks `key` as known but rejects it when present and `used` is false (a key of another kind).
  void only_if(bool used, std::string_view key, std::string_view why) {
    known_.insert(std::string(key));
    if (!used && has(key)) bad(key, why);
  }

  /// A sub-table (absent: an empty reader); rejects a non-table value.
  table_reader table(std::string_view key) {
    known_.insert(std::string(key));
    const toml::node* node = find(key);
    if (node != nullptr && !node->is_table()) bad(key, "must be a table");
    return table_reader(file_, key_path(key), node == nullptr ? nullptr : node->as_table());
  }

  /// The tables of an array of tables (absent: none).
  std::vector<table_reader> tables(std::string_view key) {
    known_.insert(std::string(key));
    std::vector<table_reader> out;
    const toml::node* node = find(key);
    if (node == nullptr) return out;
    if (!node->is_array()) bad(key, "must be an array of tables ([[" + key_path(key) + "]])");
    const toml::array& array = *node->as_array();
    for (std::size_t i = 0; i < array.size(); ++i) {
      const std::string where = key_path(key) + "[" + std::to_string(i) + "]";
      if (!array[i].is_table()) fail(file_, ": ", where, " = ", node_text(array[i]), ": must be a table");
      out.emplace_back(file_, where, array[i].as_table());
    }
    return out;
  }

  /// Rejects every key that was not read. `names` lists the known keys in the message.
  void finish() const {
    if (table_ == nullptr) return;
    for (const auto& [key, node] : *table_) {
      if (known_.contains(std::string(key.str()))) continue;
      std::string names;
      for (const std::string& k : order_or_known()) names += (names.empty() ? "" : ", ") + k;
      fail(file_, ": unknown key ", key_path(key.str()),
           path_.empty() ? " (sections: " + names + ")" : " (" + path_ + " has: " + names + ")");
    }
  }

  [[nodiscard]] const std::string& file() const { return file_; }
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] const toml::table* raw() const { return table_; }

 private:
  [[nodiscard]] std::vector<std::string> order_or_known() const { return {known_.begin(), known_.end()}; }

  template <class T>
  T convert(std::string_view key, const toml::node& node) {
    if constexpr (std::is_same_v<T, bool>) {
      if (!node.is_boolean()) bad(key, "must be true or false");
      return node.as_boolean()->get();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!node.is_string()) bad(key, "must be a string");
      return node.as_string()->get();
    } else if constexpr (std::is_same_v<T, double>) {
      if (node.is_integer()) return static_cast<double>(node.as_integer()->get());
      if (!node.is_floating_point()) bad(key, "must be a number");
      return node.as_floating_point()->get();
    } else if constexpr (std::is_integral_v<T>) {
      if (!node.is_integer()) bad(key, "must be an integer");
      const std::int64_t value = node.as_integer()->get();
      if constexpr (std::is_unsigned_v<T>) {
        if (value < 0) bad(key, "must be non-negative");
      } else {
        if (value < std::numeric_limits<T>::min() || value > std::numeric_limits<T>::max()) bad(key, "is out of range");
      }
      return static_cast<T>(value);
    } else if constexpr (std::is_same_v<T, std::vector<int>>) {
      if (!node.is_array()) bad(key, "must be an array of integers");
      std::vector<int> out;
      for (const toml::node& item : *node.as_array()) {
        if (!item.is_integer() || item.as_integer()->get() < std::numeric_limits<int>::min() ||
            item.as_integer()->get() > std::numeric_limits<int>::max())
          bad(key, "must be an array of integers");
        out.push_back(static_cast<int>(item.as_integer()->get()));
      }
      return out;
    } else {
      static_assert(std::is_same_v<T, std::vector<std::string>>);
      if (!node.is_array()) bad(key, "must be an array of strings");
      std::vector<std::string> out;
      for (const toml::node& item : *node.as_array()) {
        if (!item.is_string()) bad(key, "must be an array of strings");
        out.push_back(item.as_string()->get());
      }
      return out;
    }
  }

  std::string file_, path_;
  const toml::table* table_;
  std::set<std::string> known_;
};

// Checks returning "" when fine, else the reason.
inline auto at_least(double low) {
  return [low](auto value) {
    std::ostringstream out;
    if (!(static_cast<double>(value) >= low)) out << "must be at least " << low;
    return out.str();
  };
}
inline auto positive() {
  return [](auto value) {
    return std::isfinite(static_cast<double>(value)) && value > 0 ? std::string() : std::string("must be positive");
  };
}
inline auto non_negative() {
  return [](auto value) {
    return std::isfinite(static_cast<double>(value)) && value >= 0 ? std::string()
                                                                   : std::string("must be non-negative");
  };
}
inline auto in_unit_interval(bool closed_right) {
  return [closed_right](double value) {
    const bool ok = value >= 0 && (closed_right ? value <= 1 : value < 1);
    return ok ? std::string() : std::string(closed_right ? "must be in [0, 1]" : "must be in [0, 1)");
  };
}
inline auto one_of(std::vector<std::string_view> names) {
  return [names](const std::string& value) {
    if (std::find(names.begin(), names.end(), value) != names.end()) return std::string();
    std::string list;
    for (std::size_t i = 0; i < names.size(); ++i)
      list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + std::string(names[i]);
    return "must be " + list;
  };
}

/// Runs `body`; an invalid_input it throws becomes "<file>: <key> = <value>, ...: <its message>", naming
/// those of `keys` that the table sets (or "<section> (defaults)").
template <class Body>
void checked(const table_reader& r, std::initializer_list<std::string_view> keys, Body&& body) {
  try {
    body();
  } catch (const invalid_input& error) {
    std::string named;
    for (std::string_view key : keys)
      if (r.has(key)) named += (named.empty() ? "" : ", ") + r.key_path(key) + " = " + node_text(*r.find(key));
    fail(r.file(), ": ", named.empty() ? r.path() + " (defaults)" : named, ": ", error.what());
  }
}

inline void read_model(table_reader r, model_section& m) {
  r.read("dir", m.dir);
  r.read("config", m.config, one_of({"", "dev", "schnell", "tiny"}));
  r.read("weights", m.weights);
  r.read("decoder", m.decoder, [](const std::string& v) { return v.empty() ? "must not be empty" : ""; });
  r.read("dtype", m.dtype, one_of({"float32", "bfloat16", "float16"}));
  r.read("device", m.device, [](const std::string& v) {
    const bool ok =
        v == "cpu" || v == "cuda" ||
        (v.rfind("cuda:", 0) == 0 && v.size() > 5 && v.find_first_not_of("0123456789", 5) == std::string::npos);
    return ok ? "" : "must be cpu, cuda or cuda:N";
  });
  r.read("guidance", m.guidance, [](double v) { return std::isfinite(v) ? "" : "must be finite"; });
  r.read("latent_height", m.latent_height, non_negative());
  r.read("latent_width", m.latent_width, non_negative());
  r.read("gradient_checkpointing", m.gradient_checkpointing);
  if (m.dir.empty() && m.config.empty())
    fail(r.file(), ": model.dir = \"\": give a model directory or model.config (dev, schnell or tiny)");
  if (!m.dir.empty() && r.has("config") && !m.config.empty())
    r.bad("config", "model.config is for weights without a model directory: set model.dir = \"\" to use it");
  if (!m.dir.empty() && r.has("weights")) r.bad("weights", "is used with model.config; model.dir has its own weights");
  if (!m.config.empty() && m.config != "tiny" && m.weights.empty())
    fail(r.file(), ": model.weights = \"\": model.config = \"", m.config, "\" needs its checkpoint");
  if (m.dir.empty() && (m.latent_height == 0 || m.latent_width == 0))
    fail(r.file(), ": model.latent_height = ", m.latent_height, ", model.latent_width = ", m.latent_width,
         ": both must be set with model.config");
  r.finish();
}

inline void read_data(table_reader r, data_section& d, const model_section& m) {
  r.read("embeddings", d.embeddings);
  r.read("prompts_per_iteration", d.prompts_per_iteration, at_least(1));
  if (m.dir.empty() && d.embeddings.empty())
    fail(r.file(), ": data.embeddings = \"\": needed when there is no model.dir");
  r.finish();
}

inline void read_topology(table_reader r, any_topology& topology) {
  std::string kind = "split";
  r.read("kind", kind, one_of({"split", "sequential", "flow_grpo_fast"}));
  const std::string why = "is not used by topology.kind = \"" + kind + "\"";
  r.only_if(kind == "split", "split_steps", why);
  r.only_if(kind == "split", "branching", why);
  r.only_if(kind != "split", "group_size", why);
  r.only_if(kind == "sequential", "shared_root", why);
  r.only_if(kind == "flow_grpo_fast", "split_step", why);
  r.only_if(kind == "flow_grpo_fast", "sde_steps", why);
  if (kind == "split") {
    split_schedule p = split_schedule::dense();
    r.read("split_steps", p.split_steps,
           [](const std::vector<int>& v) { return v.empty() ? "must not be empty" : ""; });
    r.read("branching", p.branching, [](const std::vector<int>& v) { return v.empty() ? "must not be empty" : ""; });
    topology.policy = p;
  } else if (kind == "sequential") {
    sequential p;
    r.read("group_size", p.group_size, at_least(1));
    r.read("shared_root", p.shared_root);
    topology.policy = p;
  } else {
    flow_grpo_fast p;
    r.read("group_size", p.group_size, at_least(1));
    r.read("split_step", p.split_step, at_least(0));
    r.read("sde_steps", p.sde_steps, at_least(1));
    topology.policy = p;
  }
  r.finish();
}

inline void read_rollout(table_reader r, rollout_section& rollout, any_stepper& stepper) {
  r.read("steps", rollout.steps, at_least(1));
  r.read("shift", rollout.shift, positive());
  r.read("max_batch", rollout.max_batch, at_least(1));
  std::string kind = "dance_sde";
  r.read("stepper", kind, one_of({"dance_sde", "flow_grpo_sde"}));
  const std::string why = "is not used by rollout.stepper = \"" + kind + "\"";
  r.only_if(kind == "dance_sde", "eta", why);
  r.only_if(kind == "flow_grpo_sde", "noise_level", why);
  if (kind == "dance_sde") {
    dance_sde p;
    r.read("eta", p.eta, positive());
    stepper.policy = p;
  } else {
    flow_grpo_sde p;
    r.read("noise_level", p.noise_level, positive());
    stepper.policy = p;
  }
  r.finish();
}

inline void read_correlator(table_reader r, any_correlator& correlator) {
  std::string kind = "correlated";
  r.read("kind", kind, one_of({"independent", "correlated", "antithetic", "orthogonal", "scaled"}));
  const std::string why = "is not used by correlator.kind = \"" + kind + "\"";
  r.only_if(kind == "correlated", "s", why);
  r.only_if(kind == "scaled", "scale", why);
  if (kind == "independent") correlator.policy = independent{};
  if (kind == "antithetic") correlator.policy = antithetic{};
  if (kind == "orthogonal") correlator.policy = orthogonal{};
  if (kind == "correlated") {
    correlated p;
    r.read("s", p.s, non_negative());
    correlator.policy = p;
  }
  if (kind == "scaled") {
    scaled p;
    r.read("scale", p.scale, positive());
    correlator.policy = p;
  }
  r.finish();
}

inline void read_fusion(table_reader r, any_fusion& fusion) {
  std::string kind = "uniform_mean";
  r.read("kind", kind, one_of({"uniform_mean", "path_softmax", "split_softmax", "max_reward"}));
  const std::string why = "is not used by fusion.kind = \"" + kind + "\"";
  r.only_if(kind == "path_softmax", "beta", why);
  r.only_if(kind == "split_softmax", "alpha", why);
  const auto finite = [](double v) { return std::isfinite(v) ? "" : "must be finite"; };
  if (kind == "uniform_mean") fusion.policy = uniform_mean{};
  if (kind == "max_reward") fusion.policy = max_reward{};
  if (kind == "path_softmax") {
    path_softmax p;
    r.read("beta", p.beta, finite);
    fusion.policy = p;
  }
  if (kind == "split_softmax") {
    split_softmax p;
    r.read("alpha", p.alpha, finite);
    fusion.policy = p;
  }
  r.finish();
}

inline void read_advantage(table_reader r, any_normalizer& normalizer) {
  std::string kind = "depth_wise";
  r.read("kind", kind, one_of({"depth_wise", "leaf_group", "per_prompt_running"}));
  const std::string why = "is not used by advantage.kind = \"" + kind + "\"";
  r.only_if(kind == "depth_wise", "scope", why);
  r.only_if(kind != "per_prompt_running", "min_std", why);
  r.only_if(kind == "per_prompt_running", "history", why);
  r.only_if(kind == "per_prompt_running", "global_std", why);
  if (kind == "depth_wise") {
    depth_wise p;
    std::string scope = "per_tree";
    r.read("scope", scope, one_of({"per_tree", "per_batch"}));
    p.scope = scope == "per_tree" ? normalization_scope::per_tree : normalization_scope::per_batch;
    r.read("epsilon", p.epsilon, non_negative());
    r.read("min_std", p.min_std, non_negative());
    normalizer.policy = p;
  } else if (kind == "leaf_group") {
    leaf_group p;
    r.read("epsilon", p.epsilon, non_negative());
    r.read("min_std", p.min_std, non_negative());
    normalizer.policy = p;
  } else {
    per_prompt_running p;
    r.read("history", p.history, at_least(1));
    r.read("epsilon", p.epsilon, positive());
    r.read("global_std", p.global_std);
    normalizer.policy = p;
  }
  r.finish();
}

inline pruner_choice read_pruner(table_reader r) {
  std::string kind;
  if (!r.read("kind", kind, one_of({"keep_all", "parent_top_k", "depth_window", "sde_window", "extreme"})))
    fail(r.file(), ": ", r.path(), ": needs a kind (keep_all, parent_top_k, depth_window, sde_window or extreme)");
  const std::string why = "is not used by kind \"" + kind + "\"";
  for (const char* key : {"depths", "direction", "stop", "keep_window"}) r.only_if(kind == "depth_window", key, why);
  for (const char* key : {"stride", "train_splits"}) r.only_if(kind == "sde_window", key, why);
  for (const char* key : {"width", "start", "every"})
    r.only_if(kind == "depth_window" || kind == "sde_window", key, why);
  r.only_if(kind == "parent_top_k", "k", why);
  r.only_if(kind == "extreme", "b", why);
  pruner_choice out;
  if (kind == "keep_all") out = keep_all{};
  if (kind == "parent_top_k") {
    parent_top_k p;
    r.read("k", p.k, at_least(1));
    out = p;
  }
  if (kind == "extreme") {
    extreme p;
    r.read("b", p.b, at_least(1));
    out = p;
  }
  if (kind == "depth_window") {
    depth_window p;
    r.read("depths", p.depths, [](const std::vector<int>& v) {
      return std::all_of(v.begin(), v.end(), [](int d) { return d >= 0; }) ? "" : "depths must be non-negative";
    });
    r.read("width", p.width, at_least(1));
    r.read("start", p.start, at_least(-1));
    r.read("every", p.every, at_least(1));
    r.read("direction", p.direction, [](int v) { return v == 1 || v == -1 ? "" : "must be 1 or -1"; });
    r.read("stop", p.stop, at_least(-1));
    r.read("keep_window", p.keep_window);
    out = p;
  }
  if (kind == "sde_window") {
    sde_window p;
    r.read("width", p.width, at_least(1));
    r.read("start", p.start, at_least(0));
    r.read("every", p.every, at_least(1));
    r.read("stride", p.stride, at_least(0));
    r.read("train_splits", p.train_splits);
    out = p;
  }
  r.finish();
  return out;
}

inline void read_pruning(table_reader r, any_pruner& pruner) {
  r.read("active_fraction", pruner.active_fraction, in_unit_interval(true));
  std::vector<table_reader> list = r.tables("pruners");
  if (r.has("pruners")) {
    pruner.pruners.clear();
    for (table_reader& entry : list) pruner.pruners.push_back(read_pruner(entry));
  }
  r.finish();
}

inline void read_loss(table_reader r, ppo_options& loss) {
  r.read("clip_range", loss.clip_range, [](double v) { return v > 0 && v < 1 ? "" : "must be in (0, 1)"; });
  r.read("advantage_clip", loss.advantage_clip, [](double v) { return v > 0 ? "" : "must be positive"; });
  r.read("kl_beta", loss.kl_beta, non_negative());
  r.finish();
}

inline void read_optimizer(table_reader r, optimizer_section& o) {
  r.read("lr", o.lr, positive());
  r.read("beta1", o.beta1, in_unit_interval(false));
  r.read("beta2", o.beta2, in_unit_interval(false));
  r.read("eps", o.eps, positive());
  r.read("weight_decay", o.weight_decay, non_negative());
  r.read("max_grad_norm", o.max_grad_norm, non_negative());
  r.read("ema_decay", o.ema_decay, in_unit_interval(false));
  r.read("updates_per_iteration", o.updates_per_iteration, at_least(1));
  r.finish();
}

inline void read_lora(table_reader r, lora_section& l) {
  r.read("enabled", l.enabled);
  r.read("rank", l.rank, at_least(1));
  r.read("alpha", l.alpha, positive());
  r.read("targets", l.targets, [](const std::vector<std::string>& v) {
    if (v.empty()) return std::string("must name at least one of attention, mlp, modulation, embedding");
    for (const std::string& t : v)
      if (t != "attention" && t != "mlp" && t != "modulation" && t != "embedding")
        return "unknown target \"" + t + "\" (attention, mlp, modulation or embedding)";
    return std::string();
  });
  r.finish();
}

inline reward_entry read_reward(table_reader r) {
  reward_entry entry;
  std::vector<std::string_view> names(reward_names.begin(), reward_names.end());
  if (!r.read("name", entry.name, one_of(names)))
    fail(
        r.file(), ": ", r.path(), ": needs a name (",
        [&] {
          std::string list;
          for (std::string_view n : reward_names) list += (list.empty() ? "" : ", ") + std::string(n);
          return list;
        }(),
        ")");
  r.read("weight", entry.weight, [](double v) { return std::isfinite(v) ? "" : "must be finite"; });
  table_reader params = r.table("params");
  if (params.raw() != nullptr)
    for (const auto& [key, node] : *params.raw()) {
      const std::string name(key.str());
      if (node.is_boolean()) {
        bool v = false;
        params.read(name, v);
        entry.params[name] = v;
      } else if (node.is_string()) {
        std::string v;
        params.read(name, v);
        entry.params[name] = v;
      } else if (node.is_number()) {
        double v = 0;
        params.read(name, v);
        entry.params[name] = v;
      } else {
        params.bad(name, "must be a number, a string or a boolean");
      }
    }
  r.finish();
  return entry;
}

inline void read_run(table_reader r, run_section& run) {
  r.read("iterations", run.iterations, at_least(1));
  r.read("seed", run.seed);
  r.read("output_dir", run.output_dir, [](const std::string& v) { return v.empty() ? "must not be empty" : ""; });
  r.read("grid_every", run.grid_every, at_least(0));
  r.read("checkpoint_every", run.checkpoint_every, at_least(0));
  r.read("keep_checkpoints", run.keep_checkpoints, at_least(1));
  r.finish();
}

}  // namespace config_detail

/// Parses and validates a run configuration from TOML text; `source` names it in errors and `base_dir`
/// resolves its relative input paths. Absent keys keep their defaults (run_config{}).
/// Example: parse_run_config("[rollout]\nsteps = 0\n", "run.toml") throws
///   "run.toml: rollout.steps = 0: must be at least 1";
///   parse_run_config("[rollout]\nstepz = 3\n", "run.toml") throws "run.toml: unknown key rollout.stepz (...)".
/// @post every value in its domain, the topology and pruners valid for rollout.steps, kl_beta > 0 only with LoRA.
inline run_config parse_run_config(std::string_view text, const std::string& source,
                                   const std::filesystem::path& base_dir = ".") {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& error) {
    fail(source, ":", error.source().begin.line, ":", error.source().begin.column, ": ", error.description());
  }
  using namespace config_detail;
  run_config config;
  config.source = source;
  config.base_dir = base_dir;
  table_reader top(source, "", &root);
  read_model(top.table("model"), config.model);
  read_data(top.table("data"), config.data, config.model);
  read_topology(top.table("topology"), config.recipe.topology);
  read_rollout(top.table("rollout"), config.rollout, config.recipe.stepper);
  read_correlator(top.table("correlator"), config.recipe.correlator);
  read_fusion(top.table("fusion"), config.recipe.fusion);
  read_advantage(top.table("advantage"), config.recipe.normalizer);
  read_pruning(top.table("pruning"), config.recipe.pruner);
  read_loss(top.table("loss"), config.loss);
  read_optimizer(top.table("optimizer"), config.optimizer);
  read_lora(top.table("lora"), config.lora);
  if (top.has("rewards")) {
    config.rewards.clear();
    for (table_reader& entry : top.tables("rewards")) config.rewards.push_back(read_reward(entry));
    if (config.rewards.empty()) fail(source, ": rewards = []: needs at least one [[rewards]] entry");
  } else {
    top.tables("rewards");
  }
  read_run(top.table("run"), config.run);
  top.finish();

  // Cross-checks, in the words of the library's own validation.
  const table_reader topology(source, "topology", root["topology"].as_table());
  checked(topology, {"split_steps", "branching", "group_size", "shared_root", "split_step", "sde_steps"},
          [&] { (void)config.recipe.topology(config.rollout.steps); });
  const tree_plan plan = config.recipe.topology(config.rollout.steps);
  for (std::size_t i = 0; i < config.recipe.pruner.pruners.size(); ++i) {
    const std::string where = "pruning.pruners[" + std::to_string(i) + "]";
    try {
      std::visit(
          [&](const auto& p) {
            using P = std::decay_t<decltype(p)>;
            if constexpr (std::is_same_v<P, sde_window>) (void)p.window(plan.steps, 0);
            if constexpr (std::is_same_v<P, depth_window>)
              require(p.width <= plan.steps, "depth_window width ", p.width, " exceeds the ", plan.steps, " steps");
          },
          config.recipe.pruner.pruners[i]);
    } catch (const invalid_input& error) {
      fail(source, ": ", where, ": ", error.what());
    }
  }
  if (config.loss.kl_beta > 0 && !config.lora.enabled)
    fail(source, ": loss.kl_beta = ", config.loss.kl_beta,
         ": needs lora.enabled = true (the frozen base without the adapters is the KL reference)");
  return config;
}

/// Reads and validates `path` (parse_run_config with the file's name and directory).
/// @post throws invalid_input "<path>: cannot read" when the file cannot be opened.
inline run_config load_run_config(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  require(static_cast<bool>(in), path.string(), ": cannot read the config file");
  std::ostringstream text;
  text << in.rdbuf();
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  return parse_run_config(text.str(), path.string(), dir);
}

}  // namespace branchgrpo
