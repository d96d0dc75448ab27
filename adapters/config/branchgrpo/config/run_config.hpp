#pragma once
// The configuration of a training run (`branchgrpo train --config FILE.toml`), torch-free: the schema, its
// defaults, the TOML reader and the validation. docs/config.md documents every key.
//
//   load_run_config("run.toml")            parse + validate a file; every error is one line
//   parse_run_config(text, "run.toml")     the same from a string (tests)
//   config.recipe                          the run's components as one typed `method`
//   method_recipe("branch-widpru")         with_method's recipe as the run's component types
//
// Run-time choices, compile-time policies: each family's choice is its catalog's any_policy (a std::variant of
// the family's policies that models the family's concept by visiting; core/policy_list.hpp). The [topology],
// [correlator], [fusion], [advantage], [objective], [[pruning.pruners]] tables and rollout.stepper name a catalog
// entry and set its described parameters (config/toml_reader.hpp: read_policy), so a policy added to a catalog is
// readable here without a line of this file. So `train_iteration` is instantiated once for every configuration (the
// sum of the families' alternatives is compiled, not their product; the objective, visited once per iteration, is
// the one family whose alternatives each compile their own update) and the policies below it stay fully typed; the
// cost is one std::visit per component call (a few per iteration, or per split group for the correlator).
//
// Errors: "<file>: <key path> = <value>: <reason>", e.g. "run.toml: rollout.steps = 0: must be at least 1";
// unknown keys: "run.toml: unknown key rollout.stepz (rollout has: steps, shift, ...)". Relative input paths
// (model.dir, model.weights, model.decoder, data.embeddings, reward files) are resolved against the config
// file's directory; run.output_dir against the working directory.
#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "branchgrpo/advantage/catalog.hpp"
#include "branchgrpo/advantage/per_reward.hpp"
#include "branchgrpo/config/reward_table.hpp"
#include "branchgrpo/config/toml_reader.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/correlator/catalog.hpp"
#include "branchgrpo/files/input_file.hpp"
#include "branchgrpo/fusion/catalog.hpp"
#include "branchgrpo/loss/objective.hpp"
#include "branchgrpo/loss/ppo.hpp"
#include "branchgrpo/loss/step_weights.hpp"
#include "branchgrpo/model_specs/registry.hpp"
#include "branchgrpo/pruning/catalog.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/schedule/stepper_catalog.hpp"
#include "branchgrpo/topology/catalog.hpp"
#include "branchgrpo/training/methods.hpp"
#include "branchgrpo/training/optimizer_options.hpp"
#include "branchgrpo/training/run_recipe.hpp"
#include "branchgrpo/training/sharding.hpp"
#include "branchgrpo/training/trainer.hpp"

namespace branchgrpo {

// ---- The schema ---------------------------------------------------------------------------------------------
// Each section is described once, in its parameters(): the reader (read_parameters), the canonical text
// (config/config_text.hpp), what resume may change (parameter(...).resumable()) and the checks of a section built
// in C++ (validate_parameters) all come from it. What relates several keys is checked after them, in read_*.

namespace config_rules {

/// model.config's values: "", then every family's named configs (model_specs/registry.hpp).
inline constexpr const auto& model_configs = model_config_names;
inline constexpr std::array<std::string_view, 3> dtypes = {"float32", "bfloat16", "float16"};
inline constexpr std::array<std::string_view, 4> lora_targets = {"attention", "mlp", "modulation", "embedding"};

/// cpu, cuda or cuda:N. Example: device{}.why("cuda:1") == ""; device{}.why("gpu") == "must be cpu, cuda or cuda:N".
struct device {
  std::string why(const std::string& v) const {
    const bool ok =
        v == "cpu" || v == "cuda" ||
        (v.rfind("cuda:", 0) == 0 && v.size() > 5 && v.find_first_not_of("0123456789", 5) == std::string::npos);
    return ok ? "" : "must be cpu, cuda or cuda:N";
  }
  std::string text() const { return "cpu, cuda or cuda:N"; }
};

/// A non-empty list of lora_targets. Example: targets{}.why({"attn"}) == "unknown target \"attn\" (attention,
/// mlp, modulation or embedding)".
struct targets {
  std::string why(const std::vector<std::string>& v) const {
    if (v.empty()) return "must name at least one of attention, mlp, modulation, embedding";
    for (const std::string& t : v)
      if (std::find(lora_targets.begin(), lora_targets.end(), t) == lora_targets.end())
        return "unknown target \"" + t + "\" (attention, mlp, modulation or embedding)";
    return {};
  }
  std::string text() const { return "non-empty, of attention, mlp, modulation, embedding"; }
};

}  // namespace config_rules

/// [model]: which transformer, from where, on what. Either `dir` (a model directory: model.safetensors with its
/// family's config in the metadata, prompts.safetensors) or `config` with `weights`: one of the named configs of
/// model_spec_table (model_specs/registry.hpp), e.g. FLUX's dev, schnell, tiny or Wan2.1's wan-t2v-1.3b,
/// wan-t2v-14b, wan-tiny (a video family's latents are [C, latent_frames, latent_height, latent_width]).
struct model_section {
  std::string dir = "models/shapes-tiny";
  std::string config = "";         ///< one of model_config_names (dev, ..., wan22-tiny); used when dir is ""
  std::string weights = "";        ///< checkpoint for `config` in a layout of its family (model_spec::layouts);
                                   ///< "" = random (the configs not released: tiny, wan-tiny, sd3-tiny, wan22-tiny)
  std::string decoder = "pixels";  ///< "pixels" (latents are RGB in [-1, 1]) or a decoder file
  std::string dtype = "float32";   ///< float32, bfloat16, float16
  std::string device = "cpu";      ///< cpu, cuda, cuda:N
  double guidance = 3.5;           ///< FLUX.1-dev's embedded (distilled) guidance, not classifier-free guidance
  /// Classifier-free guidance: v = v_u + guidance_scale (v_c - v_u) with the embeddings file's negative prompts;
  /// 1 = off (one conditional pass). Default: the named config's guidance_scale (5 for wan-t2v-*, Wan2.1's
  /// sample_guide_scale; 7 for sd3.5-*, the SD3 pipeline's; 4 for wan2.2-t2v-a14b), else 1.
  double guidance_scale = 1.0;
  /// A two-expert model's (Wan2.2 A14B's) low-noise expert's scale; 0 = guidance_scale on both. Default: the named
  /// config's (3 for wan2.2-t2v-a14b, diffusers' guidance_scale_2), else 0.
  double guidance_scale_2 = 0.0;
  std::string negative_prompt = "";  ///< "" = each prompt's own negative in the file; else one of the file's
  bool master_weights = true;        ///< bfloat16 / float16 models: float32 master copies of the trainable weights
  bool autocast = true;              ///< CUDA, bfloat16 / float16 models: the forward under autocast in model.dtype
  bool tf32 = true;                  ///< CUDA: float32 matmuls and convolutions may use TF32 tensor cores
  std::int64_t latent_height = 0;    ///< 0: the model directory's (16 for shapes-tiny)
  std::int64_t latent_width = 0;
  std::int64_t latent_frames = 0;  ///< video models: 0 = the model directory's (8 for moving-shapes-tiny)
  bool gradient_checkpointing = false;
  friend bool operator==(const model_section&, const model_section&) = default;
  /// Whether some noise level is guided: a scale other than 1 (the negative prompts are needed then).
  [[nodiscard]] bool guided() const {
    return guidance_scale != 1.0 || (guidance_scale_2 != 0 && guidance_scale_2 != 1.0);
  }

  static constexpr auto parameters() {
    using self = model_section;
    using namespace config_rules;
    const auto latent_size = rules::in_range{.low = 0, .high = 4096};  // 4096 latent rows: 32768 pixels
    return std::tuple{
        parameter("dir", &self::dir, "model directory (model.safetensors, prompts.safetensors)").resumable(),
        parameter("config", &self::config, "transformer shape of `weights` without `dir`",
                  rules::one_of_names{.names = model_configs}),
        parameter("weights", &self::weights, "checkpoint for `config`").resumable().written_if(+[](const self& m) {
          return m.dir.empty();
        }),  // refused beside dir (always "" there)
        parameter("decoder", &self::decoder, "pixels or a decoder file", rules::not_empty{}).resumable(),
        parameter("dtype", &self::dtype, "storage dtype", rules::one_of_names{.names = dtypes}),
        parameter("device", &self::device, "cpu, cuda or cuda:N", config_rules::device{}).resumable(),
        parameter("guidance", &self::guidance, "FLUX.1-dev's embedded guidance",
                  rules::in_range{.low = 0, .high = 100}),
        parameter("guidance_scale", &self::guidance_scale, "classifier-free guidance scale",
                  rules::above_up_to{.low = 0, .high = 100, .note = "(1 = no classifier-free guidance)"}),
        parameter("guidance_scale_2", &self::guidance_scale_2,
                  "a second (low-noise) expert's classifier-free guidance scale; 0 = guidance_scale on both",
                  rules::in_range{.low = 0, .high = 100}),
        parameter("negative_prompt", &self::negative_prompt, "one negative prompt of the file for every prompt"),
        parameter("master_weights", &self::master_weights, "float32 master copies of low-precision weights"),
        parameter("autocast", &self::autocast, "CUDA: the forward under autocast in dtype"),
        parameter("tf32", &self::tf32, "CUDA: TF32 tensor cores for float32"),
        parameter("latent_height", &self::latent_height, "latent rows; 0 = the model directory's", latent_size),
        parameter("latent_width", &self::latent_width, "latent columns; 0 = the model directory's", latent_size),
        // Wan's VAE makes 4 + 1 latent frames of a 17-frame clip, 21 of 81: 1024 is far beyond any released length.
        parameter("latent_frames", &self::latent_frames, "video latent frames; 0 = the model directory's",
                  rules::in_range{.low = 0, .high = 1024}),
        parameter("gradient_checkpointing", &self::gradient_checkpointing, "recompute blocks in the backward")
            .resumable()};
  }
};

/// [data]: the prompt embeddings, how many prompts (trees) each iteration trains and in which order.
struct data_section {
  std::string embeddings = "";  ///< a prompt file or a directory of its shards; "" = <model.dir>/prompts.safetensors
  int prompts_per_iteration = 2;
  bool shuffle = false;  ///< a new order each epoch keyed by run.seed (prompt_schedule); false: file order
  friend bool operator==(const data_section&, const data_section&) = default;
  static constexpr auto parameters() {
    using self = data_section;
    return std::tuple{
        parameter("embeddings", &self::embeddings, "prompt embeddings file or shard directory").resumable(),
        parameter("prompts_per_iteration", &self::prompts_per_iteration, "trees per iteration", rules::at_least{1}),
        parameter("shuffle", &self::shuffle, "a new prompt order each epoch")};
  }
};

/// [rollout] (the stepper and its eta / noise_level live in the recipe).
struct rollout_section {
  int steps = 20;
  double shift = 3.0;
  std::int64_t max_batch = 64;
  std::int64_t decode_batch = 16;  ///< leaves decoded (and scored) per call: bounds the decoder's memory
  friend bool operator==(const rollout_section&, const rollout_section&) = default;
  static constexpr auto parameters() {
    using self = rollout_section;
    return std::tuple{
        parameter("steps", &self::steps, "denoising steps", rules::at_least{1}),
        parameter("shift", &self::shift, "time shift of the sigma schedule", rules::in_range{.low = 1e-3, .high = 1e3}),
        parameter("max_batch", &self::max_batch, "rows per transformer call", rules::at_least{1}).resumable(),
        parameter("decode_batch", &self::decode_batch, "leaves per decoder call", rules::at_least{1}).resumable()};
  }
};

/// [lora]
struct lora_section {
  bool enabled = true;
  std::int64_t rank = 16;
  double alpha = 16;
  std::vector<std::string> targets = {"attention", "mlp"};  ///< of attention, mlp, modulation, embedding
  friend bool operator==(const lora_section&, const lora_section&) = default;
  static constexpr auto parameters() {
    using self = lora_section;
    return std::tuple{parameter("enabled", &self::enabled, "train LoRA adapters (base frozen)"),
                      parameter("rank", &self::rank, "adapter rank", rules::at_least{1}),
                      parameter("alpha", &self::alpha, "scale alpha / rank", rules::in_range{.low = 1e-6, .high = 1e6}),
                      parameter("targets", &self::targets, "layer roles with adapters", config_rules::targets{})};
  }
};

/// One [[rewards]] entry: a reward by name (one of reward_names: reward_table.hpp), its weight in the sum, and its
/// own parameters (numbers, strings or booleans, checked as reward_table declares them when the reward is built).
struct reward_entry {
  std::string name;
  double weight = 1.0;
  bool win_rate = false;  ///< score each leaf by the fraction of its tree's leaves it beats (Pref-GRPO)
  std::map<std::string, std::variant<double, std::string, bool>> params = {};
  friend bool operator==(const reward_entry&, const reward_entry&) = default;
};

/// [run]
struct run_section {
  int iterations = 100;
  std::uint64_t seed = 0;
  std::string output_dir = "out/train";
  int grid_every = 10;            ///< 0: no grids
  int checkpoint_every = 10;      ///< 0: only the final checkpoint
  int keep_checkpoints = 2;       ///< complete checkpoints kept (the newest)
  int updates_per_iteration = 1;  ///< optimizer steps per iteration (training_options)
  friend bool operator==(const run_section&, const run_section&) = default;
  static constexpr auto parameters() {
    using self = run_section;
    return std::tuple{
        parameter("iterations", &self::iterations, "training iterations", rules::at_least{1}).resumable(),
        parameter("seed", &self::seed, "the run's seed"),
        parameter("output_dir", &self::output_dir, "where the run writes", rules::not_empty{}).resumable(),
        parameter("grid_every", &self::grid_every, "iterations between grids; 0 = none", rules::at_least{0})
            .resumable(),
        parameter("checkpoint_every", &self::checkpoint_every, "iterations between checkpoints; 0 = the final only",
                  rules::at_least{0})
            .resumable(),
        parameter("keep_checkpoints", &self::keep_checkpoints, "complete checkpoints kept", rules::at_least{1})
            .resumable(),
        parameter("updates_per_iteration", &self::updates_per_iteration, "optimizer steps per iteration",
                  rules::at_least{1})};
  }
};

/// [eval]: held-out evaluation inside `train` (docs/config.md "[eval]"). On when `embeddings` names a prompt file
/// (or a shard directory) of prompts the run does not train on: after every `every` iterations (and before the
/// first, and after the last) each held-out prompt gets `samples` deterministic ODE samples of `steps` Euler steps
/// from keyed noise (seed `seed`: the same noises at every evaluation and in every run with that seed), under the
/// EMA's weights when the run keeps an EMA and `ema` is true, scored by `rewards` (the run's [[rewards]] when
/// empty). metrics.jsonl gets one {"kind": "eval"} row per evaluation.
struct eval_section {
  std::string embeddings = "";             ///< "" = no evaluation
  int every = 10;                          ///< iterations between evaluations
  int samples = 4;                         ///< samples per held-out prompt
  int steps = 0;                           ///< ODE steps; 0 = rollout.steps
  std::uint64_t seed = 0;                  ///< the evaluation noises' seed (independent of run.seed: runs compare)
  bool ema = true;                         ///< the EMA's weights when the run keeps one (optimizer.ema_decay > 0)
  std::vector<reward_entry> rewards = {};  ///< [[eval.rewards]]; empty = the run's [[rewards]]

  [[nodiscard]] bool enabled() const { return !embeddings.empty(); }
  friend bool operator==(const eval_section&, const eval_section&) = default;
  // The section is written to a canonical text only when on, so that the text of a run without it reads as it did
  // before the section existed (its checkpoints resume); eval.rewards is read and written beside these.
  static constexpr auto parameters() {
    using self = eval_section;
    constexpr auto on = +[](const self& e) { return e.enabled(); };
    return std::tuple{
        parameter("embeddings", &self::embeddings, "held-out prompt embeddings; \"\" = no evaluation")
            .resumable()
            .written_if(on),
        parameter("every", &self::every, "iterations between evaluations", rules::at_least{1})
            .resumable()
            .written_if(on),
        // Every sample is a whole ODE solve kept until the grid is drawn: bounded as `sample --samples` is.
        parameter("samples", &self::samples, "samples per held-out prompt", rules::in_range{.low = 1, .high = 4096})
            .written_if(on),
        parameter("steps", &self::steps, "ODE steps; 0 = rollout.steps", rules::in_range{.low = 0, .high = 10000})
            .written_if(on),
        parameter("seed", &self::seed, "the evaluation noises' seed").written_if(on),
        parameter("ema", &self::ema, "the EMA's weights when the run keeps one").written_if(on)};
  }
};

/// Calls `body(std::type_identity<Section>{}, "name")` for each section of a run config described by its
/// parameters(), in the order of the canonical text: model, data, rollout, loss, optimizer, lora, run, eval. The
/// one list that what resume may change (config_text.hpp) and the docs' key tables (`branchgrpo policies
/// --sections`) walk. Example: the first call is body(std::type_identity<model_section>{}, "model").
template <class Body>
void for_each_described_section(Body&& body) {
  body(std::type_identity<model_section>{}, "model");
  body(std::type_identity<data_section>{}, "data");
  body(std::type_identity<rollout_section>{}, "rollout");
  body(std::type_identity<ppo_options>{}, "loss");
  body(std::type_identity<optimizer_options>{}, "optimizer");
  body(std::type_identity<lora_section>{}, "lora");
  body(std::type_identity<run_section>{}, "run");
  body(std::type_identity<eval_section>{}, "eval");
}

/// A whole run. Defaults: the shipped shapes model, BranchGRPO's dense tree (the branch method), LoRA rank 16.
struct run_config {
  std::string source = "config";         ///< the file name errors start with
  std::filesystem::path base_dir = ".";  ///< relative input paths are resolved against it
  model_section model;
  data_section data;
  rollout_section rollout;
  run_recipe recipe = method_recipe("branch");
  ppo_options loss;
  optimizer_options optimizer;
  /// [optimizer] sharding = "none" | "optimizer" | "gradients" (ZeRO-1, ZeRO-2 over the run's ranks) and
  /// bucket_mb: in [optimizer] because what is sharded is the optimizer's state (and, with gradients, its input).
  sharding_options sharding;
  lora_section lora;
  std::vector<reward_entry> rewards = {{.name = "alignment", .weight = 1.0, .params = {}}};
  run_section run;
  eval_section eval;

  /// An input path as given, or resolved against base_dir when relative; "" stays "".
  [[nodiscard]] std::filesystem::path input_path(const std::string& path) const {
    if (path.empty()) return {};
    const std::filesystem::path p(path);
    return p.is_absolute() ? p : base_dir / p;
  }
  [[nodiscard]] sigma_schedule schedule() const { return shifted_linear_schedule(rollout.steps, rollout.shift); }
  /// The held-out evaluation's ODE schedule: eval.steps (rollout.steps when 0) with the rollout's shift.
  [[nodiscard]] sigma_schedule eval_schedule() const {
    return shifted_linear_schedule(eval.steps > 0 ? eval.steps : rollout.steps, rollout.shift);
  }
  /// The held-out evaluation's rewards: [[eval.rewards]], or the run's [[rewards]] when it has none.
  [[nodiscard]] const std::vector<reward_entry>& eval_rewards() const {
    return eval.rewards.empty() ? rewards : eval.rewards;
  }
  [[nodiscard]] training_options training() const {
    return {.max_batch = rollout.max_batch,
            .seed = run.seed,
            .updates_per_iteration = run.updates_per_iteration,
            .total_iterations = run.iterations,
            .loss = loss};
  }
};

// ---- Reading ------------------------------------------------------------------------------------------------

namespace config_detail {

using config::checked;
using config::node_text;
using config::one_of;
using config::read_parameters;
using config::read_policy;
using config::table_reader;

// A check for read(): "" when fine, else the reason (the words of core/parameters.hpp's rules).
inline auto in_range(double low, double high) {
  return [low, high](auto value) { return rules::in_range{.low = low, .high = high}.why(value); };
}

inline void read_model(table_reader r, model_section& m) {
  read_parameters(r, m);
  // model.config, when given, is one of model_config_names (read_parameters checked it): its family and named
  // config (model_specs/registry.hpp) say its default guidance, whether it needs a checkpoint and whether it is
  // a video model.
  const named_model_config* named = find_named_config(m.config);
  const model_spec* family = spec_of_config(m.config);
  // Each named config's default classifier-free guidance: Wan2.1's pipelines sample at 5 (its sample_guide_scale);
  // FLUX.1-dev's guidance is distilled into `guidance`, and the shipped shapes models were pretrained without an
  // unconditional branch (1).
  if (named != nullptr && !r.has("guidance_scale")) m.guidance_scale = named->guidance_scale;
  if (named != nullptr && !r.has("guidance_scale_2")) m.guidance_scale_2 = named->guidance_scale_2;
  if (family != nullptr && !family->second_expert && m.guidance_scale_2 != 0)
    r.bad("guidance_scale_2", "is a second expert's scale, and model.config = \"" + m.config + "\" (" +
                                  std::string(family->label) + ") has one expert");
  if (!m.negative_prompt.empty() && !m.guided())
    r.bad("negative_prompt", "needs classifier-free guidance: model.guidance_scale is 1 (off)");
  if (m.dtype == "float16" && m.device == "cpu")  // checked here, not as a kernel error in the first iteration
    fail(r.file(),
         ": model.dtype = \"float16\", model.device = \"cpu\": float16 needs a CUDA device (LibTorch's CPU "
         "kernels lack float16 matrix products); use bfloat16 or float32 on the CPU");
  if (m.dir.empty() && m.config.empty())
    fail(r.file(), ": model.dir = \"\": give a model directory or model.config (",
         name_list(std::span(model_config_names).subspan(1)), ")");
  if (!m.dir.empty() && r.has("config") && !m.config.empty())
    r.bad("config", "model.config is for weights without a model directory: set model.dir = \"\" to use it");
  if (!m.dir.empty() && r.has("weights")) r.bad("weights", "is used with model.config; model.dir has its own weights");
  if (!m.config.empty() && (named == nullptr || named->released) && m.weights.empty())
    fail(r.file(), ": model.weights = \"\": model.config = \"", m.config, "\" needs its checkpoint");
  if (m.dir.empty() && (m.latent_height == 0 || m.latent_width == 0))
    fail(r.file(), ": model.latent_height = ", m.latent_height, ", model.latent_width = ", m.latent_width,
         ": both must be set with model.config");
  const bool video_config = family != nullptr && family->video;
  if (m.dir.empty() && video_config && m.latent_frames == 0)
    fail(r.file(), ": model.latent_frames = 0: model.config = \"", m.config, "\" is a video model and needs it");
  if (m.dir.empty() && !video_config && m.latent_frames != 0)
    r.bad("latent_frames", "is for video models; model.config = \"" + m.config + "\" makes images");
  r.finish();
}

inline void read_data(table_reader r, data_section& d, const model_section& m) {
  read_parameters(r, d);
  if (m.dir.empty() && d.embeddings.empty())
    fail(r.file(), ": data.embeddings = \"\": needed when there is no model.dir");
  r.finish();
}

inline void read_topology(table_reader r, any_topology& topology) {
  read_policy(r, "kind", topology);
  r.finish();
}

inline void read_rollout(table_reader r, rollout_section& rollout, any_stepper& stepper) {
  read_parameters(r, rollout);
  read_policy(r, "stepper", stepper);
  r.finish();
}

template <class AnyPolicy>
void read_kind(table_reader r, AnyPolicy& policy) {
  read_policy(r, "kind", policy);
  r.finish();
}

inline void read_pruning(table_reader r, any_pruner& pruner) {
  r.read("active_fraction", pruner.fraction, [](double v) { return rules::unit_interval{}.why(v); });
  std::vector<table_reader> list = r.tables("pruners");
  if (r.has("pruners")) {
    pruner.pruner.pruners.clear();
    for (table_reader& entry : list) {
      any_pruner_choice choice;
      read_policy(entry, "kind", choice, /*required=*/true);
      entry.finish();
      pruner.pruner.pruners.push_back(std::move(choice));
    }
  }
  r.finish();
}

inline void read_loss(table_reader r, ppo_options& loss) {
  read_parameters(r, loss);
  r.finish();
}

inline void read_optimizer(table_reader r, optimizer_options& o, sharding_options& sharding) {
  read_parameters(r, o);
  std::string mode(sharding_name(sharding.mode));
  if (r.read("sharding", mode)) {
    try {
      sharding.mode = parse_sharding_mode(mode, r.key_path("sharding"));
      validate_sharding({.mode = sharding.mode}, r.path());
    } catch (const invalid_input& error) {
      fail(r.file(), ": ", error.what());
    }
  }
  r.read("bucket_mb", sharding.bucket_megabytes,
         [](double v) { return v > 0 && v <= 65536 ? "" : "must be in (0, 65536]"; });
  r.finish();
}

inline void read_lora(table_reader r, lora_section& l) {
  read_parameters(r, l);
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
  r.read("weight", entry.weight, in_range(-1e6, 1e6));
  r.read("win_rate", entry.win_rate);
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
        params.read(name, v, [](double x) { return rules::finite{}.why(x); });
        entry.params[name] = v;
      } else {
        params.bad(name, "must be a number, a string or a boolean");
      }
    }
  r.finish();
  return entry;
}

inline void read_run(table_reader r, run_section& run) {
  read_parameters(r, run);
  r.finish();
}

inline void read_eval(table_reader r, eval_section& e) {
  read_parameters(r, e);
  if (r.has("rewards")) {
    for (table_reader& entry : r.tables("rewards")) e.rewards.push_back(read_reward(entry));
    if (e.rewards.empty()) r.bad("rewards", "needs at least one [[eval.rewards]] entry, or none for the run's");
  } else {
    r.tables("rewards");
  }
  if (!e.enabled())
    for (const std::string_view key : {"every", "samples", "steps", "seed", "ema", "rewards"})
      if (r.has(key)) r.bad(key, "needs eval.embeddings: the held-out prompts to evaluate on");
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
  read_kind(top.table("correlator"), config.recipe.correlator);
  read_kind(top.table("fusion"), config.recipe.fusion);
  {
    table_reader advantage = top.table("advantage");
    read_policy(advantage, "kind", config.recipe.normalizer.normalizer);
    advantage.read("per_reward", config.recipe.normalizer.per_reward);
    advantage.finish();
    config.recipe.normalizer.use_fusion(config.recipe.fusion);
  }
  read_pruning(top.table("pruning"), config.recipe.pruner);
  read_loss(top.table("loss"), config.loss);
  read_kind(top.table("objective"), config.recipe.objective);
  read_optimizer(top.table("optimizer"), config.optimizer, config.sharding);
  read_lora(top.table("lora"), config.lora);
  if (top.has("rewards")) {
    config.rewards.clear();
    for (table_reader& entry : top.tables("rewards")) config.rewards.push_back(read_reward(entry));
    if (config.rewards.empty()) fail(source, ": rewards = []: needs at least one [[rewards]] entry");
  } else {
    top.tables("rewards");
  }
  read_run(top.table("run"), config.run);
  read_eval(top.table("eval"), config.eval);
  top.finish();

  // Cross-checks, in the words of the library's own validation.
  const table_reader topology(source, "topology", root["topology"].as_table());
  checked(topology, {"split_steps", "branching", "group_size", "shared_root", "split_step", "sde_steps"},
          [&] { (void)config.recipe.topology(config.rollout.steps); });
  const tree_plan plan = config.recipe.topology(config.rollout.steps);
  const std::vector<any_pruner_choice>& pruners = config.recipe.pruner.pruner.pruners;
  for (std::size_t i = 0; i < pruners.size(); ++i) {
    const std::string where = "pruning.pruners[" + std::to_string(i) + "]";
    try {
      std::visit(
          [&](const auto& p) {
            using P = std::decay_t<decltype(p)>;
            // The plan it shapes at iteration 0: a window with no room, or an ODE solver or stride the topology
            // cannot serve, is refused here rather than at the first iteration.
            if constexpr (std::is_same_v<P, sde_window>) (void)p.shape(plan, 0);
            if constexpr (std::is_same_v<P, depth_window>)
              require(p.width <= plan.steps, "depth_window width ", p.width, " exceeds the ", plan.steps, " steps");
            // A value step past the last split or a skip step, refused here rather than at the first iteration.
            if constexpr (std::is_same_v<P, value_prune>) (void)p.rollout_cut(config.recipe.pruner.shape(plan, 0), 0);
          },
          pruners[i].policy);
    } catch (const invalid_input& error) {
      fail(source, ": ", where, ": ", error.what());
    }
  }
  // adaptive_branching's budget against one chain of the plan the rollout runs (after the pruners' shapes pass).
  checked(topology, {"budget"}, [&] {
    (void)split_levels_of(config.recipe.topology, shape_plan(config.recipe.pruner, plan, 0), numbered_trees(1));
  });
  // The rollout's node values are the total reward's: the parts of per_reward have none for step_gain to read.
  if (config.recipe.normalizer.per_reward && needs_node_values(config.recipe.fusion))
    fail(source, ": advantage.per_reward = true: the fusion ", config.recipe.fusion.name(),
         " reads node values of the total reward; per-reward parts have none");
  if (rollout_cut_of(config.recipe.pruner, plan, 0).active() && !trains_transitions(config.recipe.objective))
    fail(source, ": pruning.pruners: the value pruner needs an objective that trains transitions (objective.kind = ",
         config.recipe.objective.name(), " trains on the leaves' samples)");
  // An objective that trains no transition refuses the loss options that act on one: here, rather than at the
  // first iteration, by the trainer's one rule in the config's words.
  const std::string conflict =
      transition_option_conflict(config.recipe.objective, config.loss, option_spelling::config);
  if (!conflict.empty()) fail(source, ": ", conflict);
  if (config.loss.kl_beta > 0 && !config.lora.enabled)
    fail(source, ": loss.kl_beta = ", config.loss.kl_beta,
         ": needs lora.enabled = true (the frozen base without the adapters is the KL reference)");
  return config;
}

/// Reads (read_input_file: a regular file of at most 4 MiB, never a blocking open) and validates `path`
/// (parse_run_config with the file's name and directory).
/// @post throws invalid_input "<path>: cannot open the config file: No such file or directory" when the file cannot
///       be opened, and "<path>: is a directory, not a config file" (or a FIFO, a device, ...) before reading.
inline run_config load_run_config(const std::filesystem::path& path) {
  const std::string text = read_input_file(path, input_kinds::config);
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  return parse_run_config(text, path_text(path), dir);
}

}  // namespace branchgrpo
