#pragma once
// What a training run's sizes imply in memory, estimated from the config and the model file's header before
// anything is loaded or built, so that `branchgrpo train` with topology.branching = [4096] on two split steps
// (2^24 leaves per tree) says "needs about 1.96 TB" in one line instead of growing until the kernel kills it.
//
//   estimate_run_memory(config, model, L)   bytes per part: weights, training state, rollout latents, activations,
//                                           from the family's size (app/model_families.hpp: run_transformer_config)
//   check_run_memory(config, host, device)  throws invalid_input naming the keys of the largest part: on CUDA
//                                           the device's parts against its free memory, the host's against RAM
//
// The estimate covers what grows with the config's sizes; it is an upper bound for the rollout and training
// state (exact tensor sizes) and a rough one for the activations (attention scores stored, no fused kernels).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "branchgrpo/app/model_families.hpp"
#include "branchgrpo/app/run_model.hpp"
#include "branchgrpo/app/transformer_size.hpp"
#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/memory.hpp"
#include "branchgrpo/torch/backend.hpp"

namespace branchgrpo {

/// A run's memory by part, in bytes (see the file comment). The first four live on the model's device; the
/// last two on the host whatever the device.
struct run_memory_estimate {
  double weights = 0;      ///< every transformer parameter in model.dtype
  double training = 0;     ///< the trainable tensors' gradient, two AdamW moments and EMA shadow
  double rollout = 0;      ///< the latents of every node of every tree of one iteration (the rollout keeps them)
  double activations = 0;  ///< one model call of rollout.max_batch rows (2x under guidance) with autograd (rough)
  double decoded = 0;      ///< host: one chunk of rollout.decode_batch decoded images or clips, float32
  double prompt_rows = 0;  ///< host: the prompt rows of one model call, float32 (the table itself is mapped)
  std::int64_t nodes_per_tree = 0;
  [[nodiscard]] double device_total() const { return weights + training + rollout + activations; }
  [[nodiscard]] double host_total() const { return decoded + prompt_rows; }
  [[nodiscard]] double total() const { return device_total() + host_total(); }
};

/// Example: the shipped shapes model with the default run (dense tree of 20 steps: 219 nodes, 2 trees of
///   [3, 16, 16] latents in float32) -> rollout = 2 * 219 * 768 * 4 bytes = 1.35 MB; the video model's
///   [3, 8, 16, 16] latents -> 2 * 219 * 6144 * 4 bytes = 10.8 MB.
/// With `ranks` > 1 and [optimizer] sharding, each rank's training state: the gradient in full (ZeRO-1, and ZeRO-2 as
/// built, whose full gradient lives until the reduction after the last backward), AdamW's moments and the EMA divided
/// by the ranks (docs/distributed.md).
template <class Families = model_families>
run_memory_estimate estimate_run_memory(const run_config& config, const typename Families::configs& model,
                                        std::int64_t text_tokens, int ranks = 1) {
  const double bytes = config.model.dtype == "float32" ? 4 : 2;
  const latent_shape shape = run_latent_shape<Families>(config, model);
  const transformer_size size = Families::visit(
      model, [&]<class F>(std::type_identity<F>, const auto& c) { return F::size(c, shape, text_tokens); });
  const double parameters = size.parameters;
  const double lora = static_cast<double>(config.lora.rank) * size.linear_sides;  // every linear layer: a bound
  run_memory_estimate out;
  out.weights = parameters * bytes;
  const double trainable = config.lora.enabled ? lora : parameters;
  const double shared = config.sharding.sharded() ? static_cast<double>(std::max(ranks, 1)) : 1.0;
  out.training = trainable * bytes * (1 + (2 + (config.optimizer.ema_decay > 0 ? 1 : 0)) / shared);
  const tree_plan plan = config.recipe.topology(config.rollout.steps);
  out.nodes_per_tree = plan.node_count();
  out.rollout = static_cast<double>(config.data.prompts_per_iteration) * static_cast<double>(plan.node_count()) *
                static_cast<double>(shape.elements()) * bytes;
  // Per row and layer: the saved activations of a block (about 12 hidden-wide and 2 MLP-wide vectors per token)
  // and the attention scores (heads x keys per token).
  const double per_layer = size.tokens * (12 * size.hidden + 2 * size.mlp + 2 * size.heads * size.keys) * bytes;
  const double per_row = config.model.gradient_checkpointing
                             ? per_layer + size.layers * size.tokens * size.hidden * bytes
                             : size.layers * per_layer;
  const double rows =
      std::min(static_cast<double>(config.rollout.max_batch),
               static_cast<double>(config.data.prompts_per_iteration) * static_cast<double>(plan.leaf_count()));
  // Classifier-free guidance runs the conditional and unconditional rows in one call: twice the rows.
  const double passes = config.model.guided() ? 2 : 1;
  out.activations = passes * rows * per_row;
  // Host buffers: a decoded chunk (pixels: the latents themselves; a VAE: 8x the latent's height and width, and
  // Wan's 1 + 4 (F - 1) frames) and the prompt rows copied out of the table for one call.
  const bool pixels = config.model.decoder == "pixels";
  double pixels_per_sample = 3;
  for (std::size_t d = 1; d < shape.dims.size(); ++d) {
    const double extent = static_cast<double>(shape.dims[d]);
    const bool frames = shape.dims.size() == 4 && d == 1;
    pixels_per_sample *= pixels ? extent : frames ? 1 + 4 * (extent - 1) : 8 * extent;
  }
  const double leaves = static_cast<double>(config.data.prompts_per_iteration) * static_cast<double>(plan.leaf_count());
  out.decoded = std::min(static_cast<double>(config.rollout.decode_batch), leaves) * pixels_per_sample * 4;
  out.prompt_rows = passes * rows * static_cast<double>(text_tokens) * size.prompt_width * 4;
  return out;
}

/// Throws invalid_input when the estimate exceeds the budget, naming the config keys of the largest part. With a
/// `device` budget (a CUDA device's free memory) the device's parts are checked against it and the host's against
/// `host`; without one (the CPU) every part is checked against `host`.
/// Example: topology.branching = [4096] on split steps [0, 1] of the shapes model ->
///   "run.toml: the run needs about 1.96 TB, over the memory budget of 23.4 GB (physical memory): rollout latents
///   1.96 TB (data.prompts_per_iteration = 2 trees of 318771201 nodes, set by [topology] and rollout.steps = 20, each
///   [3, 16, 16] in model.dtype = float32), activations 2.11 GB (...), ...". On a CUDA device of 80 GB free the same
///   run says "... the run needs about 1.96 TB on cuda:0, over its 80 GB free (cudaMemGetInfo): rollout latents ...".
template <class Families = model_families>
void check_run_memory(const run_config& config, const typename Families::configs& model, std::int64_t text_tokens,
                      const memory_budget& host, const std::optional<memory_budget>& device = std::nullopt,
                      int ranks = 1) {
  const run_memory_estimate e = estimate_run_memory<Families>(config, model, text_tokens, ranks);
  const bool device_fits = device ? e.device_total() <= device->bytes : true;
  const bool host_fits = (device ? e.host_total() : e.total()) <= host.bytes;
  if (device_fits && host_fits) return;
  const latent_shape shape = run_latent_shape<Families>(config, model);
  std::string dims;
  for (const std::int64_t d : shape.dims) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
  const std::string rollout = "rollout latents " + byte_text(e.rollout) +
                              " (data.prompts_per_iteration = " + std::to_string(config.data.prompts_per_iteration) +
                              " trees of " + std::to_string(e.nodes_per_tree) +
                              " nodes, set by [topology] and rollout.steps = " + std::to_string(config.rollout.steps) +
                              ", each [" + dims + "] in model.dtype = " + config.model.dtype + ")";
  const std::string activations =
      "activations " + byte_text(e.activations) + " (rollout.max_batch = " + std::to_string(config.rollout.max_batch) +
      " rows" + (config.model.guided() ? ", twice under model.guidance_scale" : "") +
      ", model.gradient_checkpointing = " + (config.model.gradient_checkpointing ? "true" : "false") + ")";
  const std::string weights =
      "weights " + byte_text(e.weights) + " (the model in model.dtype = " + config.model.dtype + ")";
  const std::string training =
      "training state " + byte_text(e.training) +
      " (lora.enabled = " + (config.lora.enabled ? "true, lora.rank = " + std::to_string(config.lora.rank) : "false") +
      (config.sharding.sharded() && ranks > 1
           ? ", optimizer.sharding = \"" + std::string(sharding_name(config.sharding.mode)) + "\" over " +
                 std::to_string(ranks) + " ranks"
           : std::string()) +
      ")";
  const std::string decoded = "decoded samples " + byte_text(e.decoded) +
                              " (rollout.decode_batch = " + std::to_string(config.rollout.decode_batch) + " at a time)";
  const std::string prompt_rows = "prompt rows " + byte_text(e.prompt_rows) +
                                  " (one call's, rollout.max_batch = " + std::to_string(config.rollout.max_batch) + ")";
  // The largest part first: its keys are the ones to change.
  const auto listed = [](std::vector<std::pair<double, std::string>> parts) {
    std::stable_sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::string line;
    for (const auto& [size, text] : parts) line += (line.empty() ? "" : ", ") + text;
    return line;
  };
  std::vector<std::pair<double, std::string>> device_parts = {
      {e.rollout, rollout}, {e.activations, activations}, {e.weights, weights}, {e.training, training}};
  const std::vector<std::pair<double, std::string>> host_parts = {{e.decoded, decoded}, {e.prompt_rows, prompt_rows}};
  if (!device) {
    device_parts.insert(device_parts.end(), host_parts.begin(), host_parts.end());
    fail(config.source, ": the run needs about ", byte_text(e.total()), ", over the memory budget of ",
         byte_text(host.bytes), " (", host.source, "): ", listed(device_parts));
  }
  if (!device_fits)
    fail(config.source, ": the run needs about ", byte_text(e.device_total()), " on ", config.model.device,
         ", over its ", byte_text(device->bytes), " free (", device->source, "): ", listed(device_parts));
  fail(config.source, ": the run's host buffers need about ", byte_text(e.host_total()), ", over the memory budget of ",
       byte_text(host.bytes), " (", host.source, "): ", listed(host_parts));
}

/// check_run_memory with the run's transformer and text length, read from the model's headers.
template <class Families = model_families>
void check_run_memory(const run_config& config, const memory_budget& host,
                      const std::optional<memory_budget>& device = std::nullopt, int ranks = 1) {
  check_run_memory<Families>(config, run_transformer_config<Families>(config), run_text_tokens(config), host, device,
                             ranks);
}

/// The pre-flight memory check (app/run_memory.hpp) before anything is loaded: on a CUDA device its parts against
/// the device's free memory and the host buffers against `host`; on the CPU everything against `host`. A CUDA
/// LibTorch built without the CUDA adapter cannot ask the device: the host part is checked and stderr says so.
/// `ranks`: the processes of the run (each estimates its own share of a sharded training state).
template <class Families = model_families>
void check_run_memory_before_loading(const run_config& config, const memory_budget& host, int ranks = 1) {
  const torch::Device device = run_device(config);
  const std::optional<memory_budget> on_device = device_memory_budget(device);
  if (device.is_cuda() && !on_device)
    std::fprintf(stderr,
                 "%s: model.device = \"%s\": its free memory is not checked before loading (a build "
                 "without the CUDA adapter)\n",
                 config.source.c_str(), config.model.device.c_str());
  check_run_memory<Families>(config, host, on_device, ranks);
}

}  // namespace branchgrpo
