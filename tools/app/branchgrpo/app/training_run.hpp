#pragma once
// A training run of a transformer of any model family (app/model_families.hpp: FLUX for images, Wan2.1 for videos)
// from a run_config (config/run_config.hpp): what `branchgrpo train`, `sample` and `demo` drive. Video latents
// [C, F, H, W] go through the same rollout, trainer and checkpoints as image latents; only the model, its decoder
// (to frames [rows, F, 3, H, W]) and the rewards differ, and the run sees the model only as a run_model.
//
//   run_model m = load_run_model(config);              transformer + prompt table + latent shape + decoder
//   weighted_sum r = make_run_reward(config, m);       the [[rewards]] entries
//   training_run run(config, std::move(m), std::move(r));
//   run.resume();                                      from the latest checkpoint, if any
//   while (!run.done()) { iteration_stats s = run.step(); ... if (...) run.save_checkpoint(); }
//
// One iteration: prompts (data.prompts_per_iteration of them, cycling through the table epoch by epoch: iteration
// i uses positions i P + t, t < P, in file order or, with data.shuffle, in a new seeded order each epoch, so every
// prompt is trained equally often; training/loop.hpp's prompt_schedule), one tree per prompt, train_iteration with
// the config's recipe (one typed method for every configuration, see config/run_config.hpp), the autograd policy
// (policy.hpp: AdamW, gradient clipping, optional EMA and KL) over the LoRA adapters (or every weight when LoRA
// is off). Rewards score decoded images or clips: the leaves pass through the run's decoder first.
//
// Resume equality: a run resumed from the checkpoint written after iteration k continues exactly as the
// uninterrupted run (bit-identical on CPU): the checkpoint restores the trainable weights, AdamW's moments and
// step counts, the EMA shadows and the stateful normalizer's buffers, and every random draw is keyed by the seed
// and the iteration (checkpoint.hpp).
//
// Resuming (resume()): the newest checkpoint that verifies (checksums, checkpoint.hpp) wins; each newer one that
// does not is named in a warning; when checkpoints exist but none verifies, resume fails instead of starting
// afresh. The checkpoint's stored config (config_text.hpp) is compared with this run's: a change of a key that
// changes the experiment is refused naming the keys; the keys that may change are listed in the log.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "branchgrpo/app/model_families.hpp"
#include "branchgrpo/app/moving_shapes.hpp"
#include "branchgrpo/app/remote_reward.hpp"
#include "branchgrpo/app/reward_builds.hpp"
#include "branchgrpo/app/rewards.hpp"
#include "branchgrpo/app/run_group.hpp"
#include "branchgrpo/app/run_memory.hpp"
#include "branchgrpo/app/run_model.hpp"
#include "branchgrpo/app/shapes.hpp"
#include "branchgrpo/app/video_rewards.hpp"
#include "branchgrpo/app/vlm_judge.hpp"
#include "branchgrpo/config/config_text.hpp"
#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/stop.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/rollout/ode_sampler.hpp"
#include "branchgrpo/torch/backend.hpp"
#include "branchgrpo/torch/checkpoint.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/flux/prompt_embeddings.hpp"
#include "branchgrpo/torch/guidance.hpp"
#include "branchgrpo/torch/lora.hpp"
#include "branchgrpo/torch/policy.hpp"
#include "branchgrpo/torch/policy_state.hpp"
#include "branchgrpo/torch/safetensors.hpp"
#include "branchgrpo/torch/torchscript.hpp"
#include "branchgrpo/training/loop.hpp"
#include "branchgrpo/training/trainer.hpp"

namespace branchgrpo {

/// The [[rewards]] entries as one weighted_sum over images in [-1, 1] (image models):
///   alignment               shape_alignment{colour_weight, colour_width, fill_width} over the run's prompts
///   jpeg_compressibility    {quality}          jpeg_incompressibility {quality}
///   torchscript             {file, batch}: a TorchScript reward module on images in [0, 1] (torchscript.hpp),
///                           refused when exported for another prompt list (check_torchscript_prompts)
/// or over clips [rows, F, 3, H, W] in [-1, 1] (video models, video_rewards.hpp):
///   alignment               moving_shape_alignment{colour_weight, shape_weight, motion_weight, colour_width,
///                           fill_width, travel} over the run's prompts
///   smoothness              temporal_smoothness{flicker_scale}
///   torchscript             {file, batch}: a TorchScript video reward module on frames in [0, 1]
/// and for either:
///   remote                  {url, scorer, connect_timeout, timeout, retries, backoff, batch}: a reward server
///                           (remote_reward.hpp), checked here (it must answer /info and run the scorer)
///   vlm_judge               {url, model, question, top_logprobs, connect_timeout, timeout, retries, backoff}:
///                           P(yes) of a VLM behind an OpenAI-compatible chat endpoint (vlm_judge.hpp; a video's
///                           middle frame), checked here (the server must list the model at /v1/models)
/// Any entry with win_rate = true scores each leaf by the fraction of its tree's leaves it beats under that reward
/// (Pref-GRPO's win rate, core reward/win_rate.hpp).
/// The rewards are a table: reward_table (config/reward_table.hpp: names, media, params and their ranges) and
/// reward_builders (reward_builds.hpp: one build per medium); build_run_reward goes through it.
/// Errors: "<file>: rewards[i].params.<key> = <value>: <reason>" (list.key names the list: "eval.rewards[i]..."
/// for [[eval.rewards]]); an image reward for a video model (or the reverse) names the entry; a name the table does
/// not hold lists those it does ("rewards[0].name = 'hps': must be alignment, ... or vlm_judge").
inline weighted_sum make_run_reward(const run_config& config, const run_model& model, const reward_list& list) {
  return build_run_reward(config, model, list);
}

/// make_run_reward of the run's [[rewards]].
inline weighted_sum make_run_reward(const run_config& config, const run_model& model) {
  return make_run_reward(config, model, {.entries = config.rewards, .key = "rewards"});
}

/// The held-out evaluation's reward ([eval]): config.eval_rewards() over the held-out prompts (a sample of held-out
/// prompt j is scored as prompt j of model.heldout.prompts, so a TorchScript reward is one exported for
/// eval.embeddings), built as make_run_reward builds the run's. Errors of an [[eval.rewards]] entry name it:
/// "<file>: eval.rewards[0].params.quality = 0: ...".
/// @pre model.heldout holds the held-out prompts (config.eval.enabled()).
inline weighted_sum make_eval_reward(const run_config& config, const run_model& model) {
  run_config scored = config;
  scored.data.embeddings = config.eval.embeddings;  // where the scored prompts come from, for messages
  run_model heldout = model;
  heldout.prompts = model.heldout.prompts;
  if (config.eval.rewards.empty()) return make_run_reward(scored, heldout);  // the run's entries, as named
  return make_run_reward(scored, heldout, {.entries = config.eval.rewards, .key = "eval.rewards"});
}

/// The trainable tensors of `model` by name, in the order of the denoisers' trainable_parameters(): the LoRA
/// factors ("<layer>.lora_A.weight", "<layer>.lora_B.weight") when it has adapters, else every weight.
inline std::vector<std::pair<std::string, torch::Tensor>> named_trainable(torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& [name, layer] : lora_layers(model))
    if (layer->has_adapter()) {
      out.emplace_back(name + ".lora_A.weight", layer->lora_A);
      out.emplace_back(name + ".lora_B.weight", layer->lora_B);
    }
  if (!out.empty()) return out;
  for (const auto& item : model.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

/// lora_options of the [lora] section (seeded with the run's seed).
inline lora_options run_lora_options(const run_config& config) {
  lora_options options{.rank = config.lora.rank,
                       .alpha = config.lora.alpha,
                       .attention = false,
                       .mlp = false,
                       .modulation = false,
                       .embedding = false,
                       .seed = config.run.seed};
  for (const std::string& t : config.lora.targets) {
    options.attention = options.attention || t == "attention";
    options.mlp = options.mlp || t == "mlp";
    options.modulation = options.modulation || t == "modulation";
    options.embedding = options.embedding || t == "embedding";
  }
  return options;
}

/// The run's velocity model: its denoiser under classifier-free guidance (model.guidance_scale; 1 = one pass).
using run_velocity_model = classifier_free_guidance<run_denoiser>;
/// The run's policy: over its model, for its group (run_group: whatever communicator drives the run).
using run_policy = autograd_policy<run_velocity_model, run_group>;

/// The tree key of held-out (evaluation / sample) roots: far from the rollout's tree keys 0, 1, ... so that
/// evaluation never reuses a training draw.
inline constexpr std::uint32_t heldout_tree_key = 0xFFFE0000u;

/// One held-out evaluation (training_run::evaluate): every held-out prompt's eval.samples samples, in prompt order
/// (sample k of held-out prompt j is row j * samples + k), scored by the [eval] rewards.
struct heldout_evaluation {
  int iteration = 0;                    ///< the iterations done when it ran (the weights of checkpoint iter-<it>)
  std::int64_t samples_per_prompt = 0;  ///< eval.samples
  std::vector<double> rewards;          ///< every row's weighted reward (NaN where a reward failed)
  std::map<std::string, std::vector<double>> components;  ///< every row's unweighted score per [eval] reward
  torch::Tensor images;        ///< this rank's rows, decoded ([rows, 3, H, W] or clips; all rows on one process)
  std::int64_t first_row = 0;  ///< the row of images' first
  bool ema = false;            ///< under the EMA's weights
  double seconds = 0;

  /// The held-out prompt (index into model().heldout.prompts) of row `row`.
  [[nodiscard]] std::int64_t prompt_of(std::int64_t row) const { return row / samples_per_prompt; }
};

/// One training run (see the file comment).
/// @pre config validated (parse_run_config); model.transformer (set by run_model::hold) has no adapters; the model's
/// prompts index
///      model.embeddings' rows.
class training_run {
 public:
  training_run(run_config config, run_model model, weighted_sum reward)
      : training_run(std::move(config), std::move(model), std::move(reward), detail::one_process()) {}

  /// The run as rank communicator.rank() of its group: with optimizer.sharding, the policy keeps this rank's shard
  /// of the optimizer state (autograd_policy's collectives go over `communicator`, which must outlive the run).
  template <Communicator C>
  training_run(run_config config, run_model model, weighted_sum reward, C& communicator)
      : config_(std::move(config)),
        model_(std::move(model)),
        reward_(std::move(reward)),
        schedule_(config_.schedule()),
        backend_{.device = run_device(config_), .dtype = run_dtype(config_)},
        recipe_(config_.recipe),
        group_(communicator) {
    require(model_.transformer != nullptr && model_.make_denoiser,
            "training_run needs a transformer (run_model::hold)");
    require(!model_.prompts.empty() && static_cast<std::int64_t>(model_.prompts.size()) == model_.embeddings.size(),
            "training_run: ", model_.prompts.size(), " prompts for ", model_.embeddings.size(), " embedding rows");
    model_.network().to(backend_.device, backend_.dtype);
    model_.set_gradient_checkpointing(config_.model.gradient_checkpointing);
    if (config_.lora.enabled) add_lora(model_.network(), run_lora_options(config_));
    if (backend_.device.is_cuda()) allow_tf32(config_.model.tf32);
    // The prompt table stays where it is (in memory on the host, or in its mapped files): each call copies only
    // its batch's rows to the device, so the device holds no 8 MiB per FLUX prompt (docs/prompt_embeddings.md).
    // Rows: the N training prompts, the E held-out ones ([eval]: row N + j is held-out prompt j), then each set's
    // negatives, so that negative_rows[p] is prompt row p's negative for p < N + E.
    prompt_table table = model_.embeddings;
    if (!model_.heldout.empty()) table.append(model_.heldout.embeddings);
    std::vector<std::int64_t> negative_rows;
    const auto append_negatives = [&](const prompt_embeddings& negatives, const std::vector<std::int64_t>& index) {
      if (index.empty()) return;
      const std::int64_t first = table.size();
      table.append(prompt_table(negatives));
      for (const std::int64_t j : index) negative_rows.push_back(first + j);
    };
    append_negatives(model_.negative_embeddings, model_.negative_index);
    append_negatives(model_.heldout.negative_embeddings, model_.heldout.negative_index);
    const model_section& m = config_.model;
    require(m.guidance_scale_2 == 0 || model_.second_expert_at, config_.source,
            ": model.guidance_scale_2 = ", m.guidance_scale_2, ": is a second expert's scale, and the ",
            model_.family->label, " model has one expert");
    denoiser_ =
        std::make_unique<run_velocity_model>(model_.make_denoiser(std::move(table), config_),
                                             classifier_free_guidance_options{.scale = m.guidance_scale,
                                                                              .negative_rows = negative_rows,
                                                                              .second_scale = m.guidance_scale_2,
                                                                              .second_at = model_.second_expert_at});
    policy_ = std::make_unique<run_policy>(
        *denoiser_, backend_,
        autograd_policy_options{
            .optimizer = config_.optimizer,
            .bf16_autocast = config_.model.autocast && backend_.dtype != torch::kFloat32,
            .master_weights = config_.model.master_weights,
            .autocast_dtype = backend_.dtype == torch::kFloat16 ? torch::kFloat16 : torch::kBFloat16,
            .sharding = config_.sharding},
        group_);
    if (config_.eval.enabled()) {
      require(!model_.heldout.empty(), config_.source, ": eval.embeddings = \"", config_.eval.embeddings,
              "\": the run model holds no held-out prompts (load it with load_run_model)");
      eval_reward_.emplace(make_eval_reward(config_, model_));
    }
  }
  training_run(const training_run&) = delete;
  training_run& operator=(const training_run&) = delete;

  /// Iterations completed (the next one to run).
  [[nodiscard]] int iteration() const { return iteration_; }
  [[nodiscard]] bool done() const { return iteration_ >= config_.run.iterations; }

  /// The prompt rows of iteration `i` (prompt_schedule: (i P + t) mod N for t < P, or shuffled per epoch).
  [[nodiscard]] std::vector<std::int64_t> prompts_of(int i) const {
    return prompt_schedule{.prompt_count = static_cast<std::int64_t>(model_.prompts.size()),
                           .per_iteration = config_.data.prompts_per_iteration,
                           .shuffle = config_.data.shuffle,
                           .seed = config_.run.seed}(i);
  }

  /// Runs the next iteration. With `keep_images`, last_images() holds its leaves' images afterwards.
  iteration_stats step(bool keep_images = false) {
    single_process one;
    return step(one, keep_images);
  }

  /// Runs the next iteration as one rank of `communicator` (every rank calls it; each rolls out its tree_share of
  /// the iteration's prompts, training/trainer.hpp). The statistics and last_components() are the whole
  /// iteration's, equal on every rank; last_images() holds this rank's trees' leaves. `observe`, when given, sees
  /// the iteration's rollout, rewards and credit before its update (train_iteration's observer; e.g.
  /// `[&](const iteration_view<torch_backend>& v) { write_iteration_trace(dir, v); }`, app/iteration_trace.hpp).
  template <Communicator Comm, class Observe = ignore_iteration>
  iteration_stats step(Comm& communicator, bool keep_images = false, Observe&& observe = {}) {
    require(!done(), "the run has done its ", config_.run.iterations, " iterations");
    keep_images_ = keep_images;
    last_images_ = torch::Tensor();
    const std::vector<std::int64_t> prompts = prompts_of(iteration_);
    scorer score{this};
    const iteration_stats stats = train_iteration(backend_, *policy_, score, recipe_, schedule_, model_.shape, prompts,
                                                  iteration_, config_.training(), communicator, observe);
    // Each reward's mean over every rank's finite scores: the ranks' sums and counts, summed, then divided. On one
    // rank that is weighted_sum::last_components() bit for bit (the same sum in the same order, the same division).
    std::vector<double> sums;
    for (const auto& [name, rows] : reward_.last_rows()) {
      const finite_sum mine = finite_sum::of(rows);
      sums.insert(sums.end(), {mine.sum, mine.count});
    }
    communicator.all_reduce_sum(sums);
    last_components_.clear();
    std::size_t at = 0;
    for (const auto& [name, rows] : reward_.last_rows()) {
      last_components_[name] = finite_sum{.sum = sums[at], .count = sums[at + 1]}.mean();
      at += 2;
    }
    last_memory_ = policy_->memory();
    policy_->reset_memory_peak();
    ranks_ = communicator.size();
    last_tree_count_ =
        tree_share::of(static_cast<std::int64_t>(prompts.size()), communicator.rank(), communicator.size()).count();
    ++iteration_;
    return stats;
  }

  /// The mean unweighted score of each reward over the last iteration's leaves (weighted_sum::last_components; with
  /// several ranks over all of them).
  [[nodiscard]] const std::map<std::string, double>& last_components() const { return last_components_; }
  /// This rank's training-state bytes after the last step, its gradient peak during it (policy_memory).
  [[nodiscard]] const policy_memory& last_memory() const { return last_memory_; }
  /// Processes of the last step, or of the checkpoint the run resumed from (before its first step).
  [[nodiscard]] int ranks() const { return ranks_; }
  /// The trees whose leaves last_images() holds (this rank's share of the last iteration).
  [[nodiscard]] std::int64_t last_tree_count() const { return last_tree_count_; }
  /// The last iteration's decoded leaves (images [leaves, 3, H, W] or clips [leaves, F, 3, H, W], in [-1, 1], CPU)
  /// and prompts, when step kept them.
  [[nodiscard]] const torch::Tensor& last_images() const { return last_images_; }
  [[nodiscard]] const std::vector<std::int64_t>& last_prompts() const { return last_prompts_; }

  /// Deterministic Euler ODE samples under the current weights (the core's sample_ode): row r starts at the keyed
  /// normals
  /// {seed, iteration 0, tree heldout_tree_key + first + r, node 0, step 0, root_latent}. Returns decoded images
  /// [rows, 3, H, W] or clips [rows, F, 3, H, W] in [-1, 1] on the CPU (float32). With `use_ema` and a run that
  /// keeps an EMA (optimizer.ema_decay > 0), under the EMA's weights (swapped in for the call, then back).
  torch::Tensor sample(std::span<const std::int64_t> prompts, std::uint64_t seed, std::uint32_t first = 0,
                       bool use_ema = true) {
    return sample(schedule_, prompts, seed, first, use_ema);
  }

  /// sample on `schedule` (evaluate's eval.steps) instead of the rollout's.
  torch::Tensor sample(const sigma_schedule& schedule, std::span<const std::int64_t> prompts, std::uint64_t seed,
                       std::uint32_t first, bool use_ema) {
    torch::NoGradGuard no_grad;
    ema_swap swapped(use_ema && config_.optimizer.ema_decay > 0 ? policy_.get() : nullptr);
    const auto root_key = [&](std::int64_t r) {
      return noise_key{.seed = seed,
                       .iteration = 0,
                       .tree = heldout_tree_key + first + static_cast<std::uint32_t>(r),
                       .node = 0,
                       .step = 0,
                       .stream = noise_stream::root_latent};
    };
    std::vector<torch::Tensor> images;
    for (const torch::Tensor& x :
         sample_ode(backend_, *denoiser_, schedule, model_.shape, prompts, root_key, config_.rollout.max_batch))
      images.push_back(decode(x));
    swapped.restore();
    return torch::cat(images, 0);
  }

  /// Whether the run evaluates on held-out prompts ([eval]), and whether it does after `done` iterations: before
  /// the first (done = 0), after every eval.every, and after the last.
  [[nodiscard]] bool evaluates() const { return eval_reward_.has_value(); }
  [[nodiscard]] bool evaluates_after(int done) const {
    return evaluates() && (done % config_.eval.every == 0 || done == config_.run.iterations);
  }

  /// The held-out evaluation ([eval]) of the current weights, as one rank of `communicator` (every rank calls it):
  /// each rank samples and scores its tree_share of the held-out prompts, and every rank gets every row's scores.
  /// Row j * S + k (S = eval.samples) is sample k of held-out prompt j: the deterministic Euler ODE on eval.steps
  /// from the keyed normals {eval.seed, iteration 0, tree heldout_tree_key + j * S + k} (the same noises at every
  /// evaluation, in every run with that seed, on any number of ranks), under the EMA's weights when eval.ema and
  /// the run keeps an EMA. The rewards see each prompt's S samples as one group (win rates rank within it), and
  /// prompt j as its index in model().heldout.prompts.
  /// Example: 2 held-out prompts, samples = 2 -> rows {p0 k0, p0 k1, p1 k0, p1 k1}, rewards.size() == 4.
  /// @pre evaluates().
  template <Communicator Comm>
  heldout_evaluation evaluate(Comm& communicator) {
    require(evaluates(), config_.source, ": evaluate: the run has no [eval] section");
    const auto start = std::chrono::steady_clock::now();
    const std::int64_t prompts = static_cast<std::int64_t>(model_.heldout.prompts.size());
    const std::int64_t samples = config_.eval.samples, rows = prompts * samples;
    const std::int64_t first_table_row = static_cast<std::int64_t>(model_.prompts.size());
    const tree_share share = tree_share::of(prompts, communicator.rank(), communicator.size());
    heldout_evaluation out{.iteration = iteration_,
                           .samples_per_prompt = samples,
                           .rewards = {},
                           .components = {},
                           .images = {},
                           .first_row = share.first * samples,
                           .ema = config_.eval.ema && config_.optimizer.ema_decay > 0,
                           .seconds = 0};
    std::vector<std::int64_t> table_rows, heldout_rows;  // the denoiser's prompt rows, the reward's
    std::vector<std::uint32_t> groups_keys;
    for (std::int64_t j = share.first; j < share.last; ++j) {
      groups_keys.push_back(static_cast<std::uint32_t>(j));
      table_rows.insert(table_rows.end(), static_cast<std::size_t>(samples), first_table_row + j);
      heldout_rows.insert(heldout_rows.end(), static_cast<std::size_t>(samples), j);
    }
    // Every rank's rows in one buffer of zeros, this rank's filled in: one all_reduce_sum gives all of them
    // everywhere (a NaN stays NaN). Part 0 is the weighted sum, part 1 + t reward t's.
    const std::span<const named_reward> terms = eval_reward_->terms();
    std::vector<double> all(static_cast<std::size_t>(rows) * (1 + terms.size()), 0.0);
    // Every rank swaps the EMA in, even one without held-out prompts: with sharding the swap is a collective.
    ema_swap swapped(out.ema ? policy_.get() : nullptr);
    if (!table_rows.empty()) {
      out.images = sample(eval_schedule_, table_rows, config_.eval.seed, static_cast<std::uint32_t>(out.first_row),
                          /*use_ema=*/false);
      const leaf_groups groups{.leaves_per_tree = static_cast<std::int32_t>(samples), .keys = groups_keys};
      const std::vector<double> total = (*eval_reward_)(out.images, heldout_rows, groups);
      const auto put = [&](std::size_t part, const std::vector<double>& values) {
        std::copy(values.begin(), values.end(),
                  all.begin() + static_cast<std::ptrdiff_t>(part * static_cast<std::size_t>(rows) +
                                                            static_cast<std::size_t>(out.first_row)));
      };
      put(0, total);
      for (std::size_t t = 0; t < terms.size(); ++t) put(1 + t, eval_reward_->last_rows().at(terms[t].name));
    }
    communicator.all_reduce_sum(all);
    swapped.restore();  // the same point on every rank (sharded: a collective)
    const auto part = [&](std::size_t p) {
      const auto begin = all.begin() + static_cast<std::ptrdiff_t>(p * static_cast<std::size_t>(rows));
      return std::vector<double>(begin, begin + rows);
    };
    out.rewards = part(0);
    for (std::size_t t = 0; t < terms.size(); ++t) out.components[terms[t].name] = part(1 + t);
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out;
  }

  /// Scores decoded samples (images [rows, 3, H, W] or clips [rows, F, 3, H, W], in [-1, 1]) with the run's reward;
  /// rows [g S, (g + 1) S) are one group (S = rows_per_group: a prompt's samples), which a groupwise reward (a
  /// win rate, a reward server) sees together.
  /// Example: 2 prompts x 4 samples, rows_per_group 4 -> groups {0, 1} of 4 rows each.
  /// @pre prompts.size() is a multiple of rows_per_group >= 1 (else invalid_input naming both).
  std::vector<double> score_images(const torch::Tensor& images, std::span<const std::int64_t> prompts,
                                   std::int64_t rows_per_group) {
    const auto rows = static_cast<std::int64_t>(prompts.size());
    require(rows_per_group >= 1 && rows % rows_per_group == 0, "score_images: ", rows, " rows in groups of ",
            rows_per_group);
    std::vector<std::uint32_t> keys(static_cast<std::size_t>(rows / rows_per_group));
    for (std::size_t g = 0; g < keys.size(); ++g) keys[g] = static_cast<std::uint32_t>(g);
    return reward_(images, prompts,
                   leaf_groups{.leaves_per_tree = static_cast<std::int32_t>(rows_per_group), .keys = keys});
  }
  /// The mean unweighted score of each reward over the rows of the last score_images call (held-out scores; the
  /// training iterations' are last_components()).
  [[nodiscard]] const std::map<std::string, double>& last_score_components() const { return reward_.last_components(); }

  /// The checkpoint of the current state (see checkpoint.hpp).
  [[nodiscard]] checkpoint_contents checkpoint() {
    require(!policy_->sharded() || policy_->shard().size == 1, "a run sharded over ", policy_->shard().size,
            " ranks has no checkpoint of its own: every rank calls save_checkpoint(communicator)");
    checkpoint_contents out = checkpoint_common();
    policy_state trained = policy_state_tensors(*policy_, trainable_names());
    out.weights = std::move(trained.weights);
    out.state.merge(trained.state);
    out.state.merge(adamw_state_presence(out.state, named_masters()));
    return out;
  }

  /// What a sharded checkpoint holds beside the shards (rank 0 writes it): iteration, seed, ranks, the normalizer's
  /// buffers, the topology's records (adaptive_branching) and the canonical config.
  [[nodiscard]] checkpoint_contents checkpoint_common() {
    checkpoint_contents out{.iteration = iteration_, .seed = config_.run.seed, .weights = {}, .state = {}};
    out.ranks = ranks_;
    for (const auto& [name, values] : recipe_.normalizer.save_state())
      out.state["normalizer." + name] = torch::tensor(values, torch::kFloat64);
    for (const auto& [name, values] : recipe_.topology.save_state())
      out.state["topology." + name] = torch::tensor(values, torch::kFloat64);
    out.config_text = canonical_config();
    return out;
  }

  /// The canonical text of this run's config with its input files' checksums (config_text.hpp), computed once.
  [[nodiscard]] const std::string& canonical_config() {
    if (!config_text_) config_text_ = config_text(config_);
    return *config_text_;
  }

  /// Restores a checkpoint of this configuration (weights, optimizer, EMA, normalizer, iteration). With `range` (a
  /// sharded run reading its own range of a sharded checkpoint: read_checkpoint_range), the policy's state comes
  /// from it, and every rank must call restore (a collective); otherwise from contents' full tensors.
  /// @pre the checkpoint's trainable tensors match this run's by name and shape (else invalid_input naming them).
  void restore(const checkpoint_contents& contents, const checkpoint_range* range = nullptr) {
    require(contents.seed == config_.run.seed, "the checkpoint was written with seed ", contents.seed,
            ", the config has run.seed = ", config_.run.seed);
    require(contents.iteration >= 0 && contents.iteration <= config_.run.iterations, "the checkpoint is at iteration ",
            contents.iteration, ", the config has run.iterations = ", config_.run.iterations);
    if (range) {
      require(config_.optimizer.ema_decay == 0 || range->layout.ema,
              "the checkpoint has no EMA (optimizer.ema_decay changed?)");
      load_policy_shard(*policy_, trainable_names(), *range);  // checks the names and shapes
      restore_normalizer(contents);
      iteration_ = contents.iteration;
      return;
    }
    const auto named = named_masters();
    {
      std::vector<std::string> problems;
      for (const auto& [name, tensor] : named) {
        const auto it = contents.weights.find(name);
        if (it == contents.weights.end())
          problems.push_back("missing " + name);
        else if (it->second.sizes() != tensor.sizes())
          problems.push_back("shape mismatch " + name);
      }
      if (contents.weights.size() != named.size() && problems.empty())
        problems.push_back(std::to_string(contents.weights.size()) + " tensors for " + std::to_string(named.size()) +
                           " trainable");
      if (!problems.empty()) {
        std::string line;
        for (std::size_t i = 0; i < problems.size() && i < 5; ++i) line += (i ? ", " : "") + problems[i];
        fail("the checkpoint does not match this config's trainable weights: ", line);
      }
    }
    // A checkpoint's optimizer state is all there or, when a caller dropped it on purpose, wholly absent.
    if (std::any_of(contents.state.begin(), contents.state.end(),
                    [](const auto& t) { return t.first.starts_with("adamw."); }))
      check_adamw_state(contents.state, named);
    torch::NoGradGuard no_grad;
    if (config_.optimizer.ema_decay > 0)
      for (const auto& item : named)
        require(contents.state.contains("ema." + item.first), "the checkpoint has no EMA of '", item.first,
                "' (optimizer.ema_decay changed?)");
    // Full tensors at any world size and sharding: a sharded rank keeps its pieces of them.
    load_policy_state(*policy_, trainable_names(), contents.weights, contents.state);
    restore_normalizer(contents);
    iteration_ = contents.iteration;
  }

  /// The stateful components' state from a checkpoint's "normalizer.*" and "topology.*" tensors (per_prompt_running's
  /// buffers, adaptive_branching's records).
  void restore_normalizer(const checkpoint_contents& contents) {
    const auto saved = [&](std::string_view prefix) {
      component_state state;
      for (const auto& [name, tensor] : contents.state)
        if (name.starts_with(prefix)) {
          const torch::Tensor values = tensor.to(torch::kCPU, torch::kFloat64).contiguous();
          state[name.substr(prefix.size())] =
              std::vector<double>(values.data_ptr<double>(), values.data_ptr<double>() + values.numel());
        }
      return state;
    };
    recipe_.normalizer.load_state(saved("normalizer."));
    recipe_.topology.load_state(saved("topology."));
  }

  /// <output_dir>/checkpoints.
  [[nodiscard]] std::filesystem::path checkpoint_root() const {
    return std::filesystem::path(config_.run.output_dir) / "checkpoints";
  }

  /// Writes the current state to checkpoint_root()/iter-<iteration> atomically and keeps the newest
  /// run.keep_checkpoints; returns the directory. Every rank of `communicator` calls it: a sharded run writes a
  /// sharded checkpoint, each rank its own shard (write_sharded_checkpoint, a collective: no rank gathers the
  /// state); otherwise rank 0 writes the checkpoint and the other ranks do nothing. Rank 0 prunes.
  template <Communicator Comm>
  std::filesystem::path save_checkpoint(Comm& communicator) {
    const std::filesystem::path dir = checkpoint_path(checkpoint_root(), iteration_);
    const bool lead = communicator.rank() == 0;
    if (policy_->sharded()) {
      const checkpoint_layout layout = policy_layout(*policy_, trainable_names());
      write_sharded_checkpoint(dir, checkpoint_common(), layout, policy_shard_tensors(*policy_, layout), communicator);
    } else if (lead) {
      write_checkpoint(dir, checkpoint());
    }
    if (lead) prune_checkpoints(checkpoint_root(), config_.run.keep_checkpoints);
    return dir;
  }
  /// One process: save_checkpoint of the group of one.
  std::filesystem::path save_checkpoint() { return save_checkpoint(detail::one_process()); }

  /// Continues from the newest checkpoint under checkpoint_root() that verifies; returns its directory, or nullopt
  /// (nothing changed) when there is no checkpoint at all. First cleans what an interrupted write or prune left
  /// (recover_checkpoints), one line each on `log`. Each newer checkpoint that does not verify gets one line
  /// "warning: skipping <dir>: <reason>" on `log`. Throws invalid_input when checkpoints exist but none verifies
  /// ("<root>: no valid checkpoint among 2 (newest: ...)"), and when the checkpoint's config differs from this
  /// run's in a key that changes the experiment ("<dir>: cannot resume: the config changes optimizer.lr (0.001 ->
  /// 0.002) ..."); keys that may change are listed on `log`.
  /// With several processes only one may `recover` (the others pass false, after it did): the rest only read. A
  /// sharded run reads only its own range of a sharded checkpoint (read_checkpoint_range: resharding when the world
  /// size changed), and then every rank must call resume at the same time (restore is a collective).
  std::optional<std::filesystem::path> resume(std::ostream& log = std::cerr, bool recover = true) {
    if (recover)
      for (const std::string& line : recover_checkpoints(checkpoint_root())) log << "checkpoints: " << line << '\n';
    const std::vector<checkpoint_entry> entries = list_checkpoints(checkpoint_root());
    if (entries.empty()) return std::nullopt;
    std::string newest_problem;
    for (const checkpoint_entry& entry : entries) {
      checkpoint_contents contents;
      std::optional<checkpoint_range> range;
      try {
        if (policy_->sharded() && is_sharded_checkpoint(entry.dir))
          std::tie(contents, range) = read_checkpoint_range(entry.dir, policy_->shard().lo, policy_->shard().hi);
        else
          contents = read_checkpoint(entry.dir);
      } catch (const std::exception& error) {
        if (newest_problem.empty()) newest_problem = error.what();
        log << "warning: skipping checkpoint " << entry.dir.string() << ": " << error.what() << '\n';
        continue;
      }
      check_resumable(entry.dir, contents.config_text, log);
      restore(contents, range ? &*range : nullptr);
      ranks_ = contents.ranks;
      return entry.dir;
    }
    fail(checkpoint_root().string(), ": no valid checkpoint among ", entries.size(), " (newest: ", newest_problem,
         "); move them aside to start afresh, or set another run.output_dir");
  }

  /// Throws invalid_input unless a checkpoint whose config is `stored` (config_text) may continue under this run's
  /// config: "<dir>: cannot resume: the config changes <keys> (...), which change the experiment; ...". Keys that
  /// may change are listed on `log` ("resume: changed run.iterations (2 -> 3)"); an empty `stored` is not compared.
  void check_resumable(const std::filesystem::path& dir, const std::string& stored, std::ostream& log = std::cerr) {
    if (stored.empty()) {
      log << "warning: " << dir.string() << " holds no config: not compared with " << config_.source << '\n';
      return;
    }
    const config_difference changes = compare_config_text(stored, canonical_config());
    require(changes.refused.empty(), dir.string(), ": cannot resume: the config changes ",
            config_changes_text(changes.refused),
            ", which change the experiment (restore them, or start a new run in another run.output_dir)");
    if (!changes.allowed.empty()) log << "resume: changed " << config_changes_text(changes.allowed) << '\n';
  }

  /// Loads a checkpoint's trainable weights for sampling (`branchgrpo sample --checkpoint DIR`): with `use_ema`
  /// and a run that keeps an EMA (optimizer.ema_decay > 0), the EMA's weights, else the trained ones. Returns
  /// whether the EMA's were loaded.
  /// @pre the checkpoint matches this config's trainable weights (restore's check); with use_ema and EMA on, it
  ///      holds every ema.<name> tensor (else invalid_input naming the first missing one).
  bool load_weights(const std::filesystem::path& checkpoint_dir, bool use_ema = true) {
    checkpoint_contents contents = read_checkpoint(checkpoint_dir);
    const bool ema = use_ema && config_.optimizer.ema_decay > 0;
    if (ema)
      for (auto& [name, tensor] : contents.weights) {
        const auto it = contents.state.find("ema." + name);
        require(it != contents.state.end(), checkpoint_dir.string(), ": no EMA of '", name,
                "' (was it written with optimizer.ema_decay = 0? sample with --no-ema)");
        tensor = it->second;
      }
    // The EMA's own tensors stay (restore puts them into the shadows, which sample() swaps in); optimizer and
    // normalizer state do not matter for sampling.
    std::erase_if(contents.state, [](const auto& item) { return !item.first.starts_with("ema."); });
    const int iterations = config_.run.iterations;
    config_.run.iterations = std::max(iterations, contents.iteration);
    const std::uint64_t seed = config_.run.seed;
    config_.run.seed = contents.seed;
    restore(contents);
    config_.run.seed = seed;
    config_.run.iterations = iterations;
    return ema;
  }

  [[nodiscard]] const run_config& config() const { return config_; }
  [[nodiscard]] const run_model& model() const { return model_; }
  [[nodiscard]] const sigma_schedule& schedule() const { return schedule_; }
  [[nodiscard]] run_policy& policy() { return *policy_; }
  [[nodiscard]] std::vector<std::pair<std::string, torch::Tensor>> trainable() {
    return named_trainable(model_.network());
  }
  /// The trainable tensors' names, in the policy's order (a checkpoint's keys).
  [[nodiscard]] std::vector<std::string> trainable_names() {
    std::vector<std::string> names;
    for (const auto& item : named_trainable(model_.network())) names.push_back(item.first);
    return names;
  }
  /// The trainable tensors by name as the optimizer holds them: float32 masters of a 16-bit model's tensors
  /// (model.master_weights), else the model's own (what checkpoints store).
  [[nodiscard]] std::vector<std::pair<std::string, torch::Tensor>> named_masters() {
    auto named = named_trainable(model_.network());
    const std::vector<torch::Tensor>& masters = policy_->master_parameters();
    for (std::size_t i = 0; i < named.size(); ++i) named[i].second = masters[i];
    return named;
  }

  /// Leaf latents -> images [rows, 3, H, W] or clips [rows, F, 3, H, W] in [-1, 1], float32 on the CPU, decoded
  /// rollout.decode_batch leaves at a time (the decoder's activations grow with its batch: a Wan VAE decode of
  /// 81 frames at 480p takes GBs per clip).
  torch::Tensor decode(const torch::Tensor& latents) const {
    torch::NoGradGuard no_grad;
    if (!model_.decode) return latents.to(torch::kCPU, torch::kFloat32);
    std::vector<torch::Tensor> chunks;
    const std::int64_t rows = latents.size(0), chunk = config_.rollout.decode_batch;
    for (std::int64_t at = 0; at < rows; at += chunk) {
      check_stop("decoding");  // between chunks (core/stop.hpp)
      chunks.push_back(
          model_.decode(latents.narrow(0, at, std::min(chunk, rows - at))).to(torch::kCPU, torch::kFloat32));
    }
    return chunks.empty() ? model_.decode(latents).to(torch::kCPU, torch::kFloat32) : torch::cat(chunks, 0);
  }

 private:
  // The EMA's weights in the model until restore() (nothing for a null policy). A sharded policy's swap is a
  // collective: every rank must hold one and call restore() at the same points. When the holder fails before
  // restore() (a rank died, a stop request), the destructor swaps an unsharded policy back (local copies) and leaves
  // a sharded one as it is: its swap is a collective the other ranks would not join while this rank unwinds, and the
  // run is ending with the failure. No exception leaves the destructor.
  struct ema_swap {
    run_policy* policy;
    explicit ema_swap(run_policy* p) : policy(p) {
      if (policy) policy->swap_ema();
    }
    void restore() {
      if (auto* const swapped = std::exchange(policy, nullptr)) swapped->swap_ema();
    }
    ~ema_swap() {
      if (policy == nullptr || policy->sharded()) return;
      try {
        policy->swap_ema();
      } catch (...) {  // NOLINT(bugprone-empty-catch): the failure in flight is the one to report
      }
    }
    ema_swap(const ema_swap&) = delete;
    ema_swap& operator=(const ema_swap&) = delete;
  };

  // The Reward the trainer calls: decode, score with the run's reward (groupwise: its win-rate and remote terms see
  // each tree; with its parts, for per-reward advantages), keep the images when asked.
  struct scorer {
    training_run* run;
    std::vector<double> operator()(const torch::Tensor& leaves, std::span<const std::int64_t> prompts,
                                   const leaf_groups& groups) {
      return run->reward_(images(leaves, prompts), prompts, groups);
    }
    // Without groups (rows of trees of different shapes: adaptive_branching): a groupwise term refuses in one line.
    std::vector<double> operator()(const torch::Tensor& leaves, std::span<const std::int64_t> prompts) {
      return run->reward_(images(leaves, prompts), prompts);
    }
    // The decoded rows, kept for the grids when asked (the last call's: the leaves, scored after any x0-hat values).
    torch::Tensor images(const torch::Tensor& leaves, std::span<const std::int64_t> prompts) {
      torch::Tensor decoded = run->decode(leaves);
      if (run->keep_images_) {
        run->last_images_ = decoded;
        run->last_prompts_.assign(prompts.begin(), prompts.end());
      }
      return decoded;
    }
    [[nodiscard]] std::span<const reward_component> last_component_rows() const {
      return run->reward_.last_component_rows();
    }
  };

  run_config config_;
  run_model model_;
  weighted_sum reward_;
  sigma_schedule schedule_;
  sigma_schedule eval_schedule_ = config_.eval_schedule();
  std::optional<weighted_sum> eval_reward_;  // [eval]: over the held-out prompts
  torch_backend backend_;
  run_recipe recipe_;
  std::unique_ptr<run_velocity_model> denoiser_;
  run_group group_;  // the communicator the policy's collectives go over (it outlives the run)
  std::unique_ptr<run_policy> policy_;
  int iteration_ = 0;
  std::map<std::string, double> last_components_;
  std::int64_t last_tree_count_ = 0;
  int ranks_ = 1;  // processes of the last step (recorded in checkpoints)
  policy_memory last_memory_;
  bool keep_images_ = false;
  torch::Tensor last_images_;
  std::vector<std::int64_t> last_prompts_;
  std::optional<std::string> config_text_;
};

}  // namespace branchgrpo
