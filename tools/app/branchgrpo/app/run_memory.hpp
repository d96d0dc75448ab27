#pragma once
// What a training run's sizes imply in memory, estimated from the config and the model file's header before
// anything is loaded or built, so that `branchgrpo train` with topology.branching = [4096] on two split steps
// (2^24 leaves per tree) says "needs about 1.96 TB" in one line instead of growing until the kernel kills it.
//
//   run_transformer_config(config)          the transformer's shape (FLUX or Wan): model.config, or model.dir's
//                                           metadata; run_flux_config for image-only callers
//   estimate_run_memory(config, model, L)   bytes per part: weights, training state, rollout latents, activations
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
#include <variant>
#include <vector>

#include "branchgrpo/app/moving_shapes.hpp"
#include "branchgrpo/app/shapes.hpp"
#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/memory.hpp"
#include "branchgrpo/model_specs/flux/config.hpp"
#include "branchgrpo/model_specs/flux/layout.hpp"
#include "branchgrpo/model_specs/wan/config.hpp"
#include "branchgrpo/model_specs/wan/layout.hpp"
#include "branchgrpo/safetensors.hpp"

namespace branchgrpo {

/// The transformer of a run: a FLUX (image) or Wan2.1 (video) shape.
using run_transformer = std::variant<flux_config, wan_config>;

/// The Wan shape a model.config names: wan-t2v-1.3b, wan-t2v-14b, or wan-tiny = wan_config::tiny() with out_dim =
/// in_dim = 4 (tiny() itself predicts 3 channels from 4 for the reference check; sampling needs them equal).
inline wan_config named_wan_config(const std::string& name) {
  if (name == "wan-t2v-14b") return wan_config::t2v_14b();
  if (name == "wan-t2v-1.3b") return wan_config::t2v_1_3b();
  wan_config tiny = wan_config::tiny();
  tiny.out_dim = tiny.in_dim;
  return tiny;
}

/// The transformer shape of a run: model.config's named shape, or the "branchgrpo.flux_config" /
/// "branchgrpo.wan_config" metadata of model.dir's model.safetensors (only its header is read; the file is
/// mapped, not loaded). A file holding both is refused naming it and both keys (require_one_model_family).
inline run_transformer run_transformer_config(const run_config& config) {
  const model_section& m = config.model;
  if (m.dir.empty()) {
    if (m.config.starts_with("wan-")) return named_wan_config(m.config);
    return m.config == "dev"       ? flux_config::dev()
           : m.config == "schnell" ? flux_config::schnell()
                                   : flux_config::tiny();
  }
  const std::filesystem::path path = config.input_path(m.dir) / "model.safetensors";
  const safetensors_file file(path);
  require_one_model_family(file.metadata(), path.string());
  if (const auto wan = file.metadata().find(std::string(wan_config_metadata_key)); wan != file.metadata().end())
    return parse_wan_config(wan->second, path.string());
  const auto it = file.metadata().find(std::string(flux_config_metadata_key));
  require(it != file.metadata().end(), path.string(), ": no __metadata__ key '", flux_config_metadata_key, "' or '",
          wan_config_metadata_key, "'");
  return parse_flux_config(it->second, path.string());
}

/// The FLUX shape of an image run (run_transformer_config without video models).
inline flux_config run_flux_config(const run_config& config) {
  const run_transformer model = run_transformer_config(config);
  require(std::holds_alternative<flux_config>(model), config.source, ": model.",
          config.model.dir.empty() ? "config" : "dir",
          " is a Wan (video) model where a FLUX (image) model is expected");
  return std::get<flux_config>(model);
}

/// The run's latent shape: [C, h, w] for FLUX (the model's latent channels and model.latent_height /
/// latent_width, 0: the shapes model's 16), [C, F, h, w] for Wan (in_dim and model.latent_frames, 0: 8).
inline latent_shape run_latent_shape(const run_config& config, const run_transformer& model) {
  const std::int64_t h = config.model.latent_height > 0 ? config.model.latent_height : shapes_image_size;
  const std::int64_t w = config.model.latent_width > 0 ? config.model.latent_width : shapes_image_size;
  if (const auto* wan = std::get_if<wan_config>(&model)) {
    const std::int64_t f = config.model.latent_frames > 0 ? config.model.latent_frames : 8;
    return latent_shape{{wan->in_dim, f, h, w}};
  }
  return latent_shape{{std::get<flux_config>(model).latent_channels(), h, w}};
}
inline latent_shape run_latent_shape(const run_config& config, const flux_config& flux) {
  return run_latent_shape(config, run_transformer(flux));
}

/// Where the run's prompts come from: data.embeddings (a prompt file or a shard directory) when set, else the
/// model directory's prompts.safetensors.
/// Example: data.embeddings = "prompts/" in /runs/a.toml -> "/runs/prompts/".
inline std::filesystem::path run_prompt_path(const run_config& config) {
  return !config.data.embeddings.empty() ? config.input_path(config.data.embeddings)
                                         : config.input_path(config.model.dir) / "prompts.safetensors";
}

/// The text length of the run's prompt embeddings (the context tensor's second dimension, from the header of
/// data.embeddings (its first shard for a directory) or model.dir's prompts.safetensors); 512 (FLUX's T5 length) when
/// the file has no such tensor.
inline std::int64_t run_text_tokens(const run_config& config) {
  const std::filesystem::path path = run_prompt_path(config);
  const safetensors_file file(std::filesystem::is_directory(path) ? detail::prompt_shards(path).front() : path);
  const safetensors_tensor* context = file.find("context");
  return context != nullptr && context->shape.size() == 3 ? context->shape[1] : 512;
}

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

namespace detail {

// What the activation estimate needs of a transformer: the tensors (for the parameter and LoRA counts), blocks,
// width, MLP width, heads, tokens per row and attention keys per token.
struct transformer_size {
  std::vector<flux_tensor_spec> tensors;
  double layers = 0, hidden = 0, mlp = 0, heads = 0, tokens = 0, keys = 0;
};

inline transformer_size size_of(const run_transformer& model, const latent_shape& shape, std::int64_t text_tokens) {
  if (const auto* wan = std::get_if<wan_config>(&model)) {
    const auto cells = [&](std::size_t a) {
      return static_cast<double>((shape.dims[a + 1] + wan->patch[a] - 1) / wan->patch[a]);
    };
    const double tokens = cells(0) * cells(1) * cells(2);
    return {.tensors = wan_expected_tensors(*wan, wan_layout::official),
            .layers = static_cast<double>(wan->layers),
            .hidden = static_cast<double>(wan->dim),
            .mlp = static_cast<double>(wan->ffn_dim),
            .heads = static_cast<double>(wan->heads),
            .tokens = tokens,
            .keys = tokens + static_cast<double>(wan->text_len)};  // self- and cross-attention
  }
  const flux_config& flux = std::get<flux_config>(model);
  const double tokens = static_cast<double>(shape.dims[1] / 2 * (shape.dims[2] / 2) + text_tokens);
  return {.tensors = flux_expected_tensors(flux, flux_layout::bfl),
          .layers = static_cast<double>(flux.depth_double + flux.depth_single),
          .hidden = static_cast<double>(flux.hidden),
          .mlp = static_cast<double>(flux.mlp_hidden()),
          .heads = static_cast<double>(flux.heads),
          .tokens = tokens,
          .keys = tokens};
}

}  // namespace detail

/// Example: the shipped shapes model with the default run (dense tree of 20 steps: 219 nodes, 2 trees of
///   [3, 16, 16] latents in float32) -> rollout = 2 * 219 * 768 * 4 bytes = 1.35 MB; the video model's
///   [3, 8, 16, 16] latents -> 2 * 219 * 6144 * 4 bytes = 10.8 MB.
/// With `ranks` > 1 and [optimizer] sharding, each rank's training state: the gradient in full (ZeRO-1, and ZeRO-2 as
/// built, whose full gradient lives until the reduction after the last backward), AdamW's moments and the EMA divided
/// by the ranks (docs/distributed.md).
inline run_memory_estimate estimate_run_memory(const run_config& config, const run_transformer& model,
                                               std::int64_t text_tokens, int ranks = 1) {
  const double bytes = config.model.dtype == "float32" ? 4 : 2;
  const latent_shape shape = run_latent_shape(config, model);
  const detail::transformer_size size = detail::size_of(model, shape, text_tokens);
  double parameters = 0, lora = 0;
  for (const flux_tensor_spec& t : size.tensors) {
    double n = 1;
    for (const std::int64_t d : t.shape) n *= static_cast<double>(d);
    parameters += n;
    if (t.shape.size() == 2)  // every linear layer: an upper bound of the adapted ones
      lora += static_cast<double>(config.lora.rank) * static_cast<double>(t.shape[0] + t.shape[1]);
  }
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
  const double passes = config.model.guidance_scale == 1.0 ? 1 : 2;
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
  double width = 0;
  if (const auto* wan = std::get_if<wan_config>(&model))
    width = static_cast<double>(wan->text_dim);
  else
    width = static_cast<double>(std::get<flux_config>(model).context_in + std::get<flux_config>(model).vec_in);
  out.prompt_rows = passes * rows * static_cast<double>(text_tokens) * width * 4;
  return out;
}
inline run_memory_estimate estimate_run_memory(const run_config& config, const flux_config& flux,
                                               std::int64_t text_tokens) {
  return estimate_run_memory(config, run_transformer(flux), text_tokens);
}

/// Throws invalid_input when the estimate exceeds the budget, naming the config keys of the largest part. With a
/// `device` budget (a CUDA device's free memory) the device's parts are checked against it and the host's against
/// `host`; without one (the CPU) every part is checked against `host`.
/// Example: topology.branching = [4096] on split steps [0, 1] of the shapes model ->
///   "run.toml: the run needs about 1.96 TB, over the memory budget of 23.4 GB (physical memory): rollout latents
///   1.96 TB (data.prompts_per_iteration = 2 trees of 318771201 nodes, set by [topology] and rollout.steps = 20, each
///   [3, 16, 16] in model.dtype = float32), activations 2.11 GB (...), ...". On a CUDA device of 80 GB free the same
///   run says "... the run needs about 1.96 TB on cuda:0, over its 80 GB free (cudaMemGetInfo): rollout latents ...".
inline void check_run_memory(const run_config& config, const run_transformer& model, std::int64_t text_tokens,
                             const memory_budget& host, const std::optional<memory_budget>& device = std::nullopt,
                             int ranks = 1) {
  const run_memory_estimate e = estimate_run_memory(config, model, text_tokens, ranks);
  const bool device_fits = device ? e.device_total() <= device->bytes : true;
  const bool host_fits = (device ? e.host_total() : e.total()) <= host.bytes;
  if (device_fits && host_fits) return;
  const latent_shape shape = run_latent_shape(config, model);
  std::string dims;
  for (const std::int64_t d : shape.dims) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
  const std::string rollout = "rollout latents " + byte_text(e.rollout) +
                              " (data.prompts_per_iteration = " + std::to_string(config.data.prompts_per_iteration) +
                              " trees of " + std::to_string(e.nodes_per_tree) +
                              " nodes, set by [topology] and rollout.steps = " + std::to_string(config.rollout.steps) +
                              ", each [" + dims + "] in model.dtype = " + config.model.dtype + ")";
  const std::string activations =
      "activations " + byte_text(e.activations) + " (rollout.max_batch = " + std::to_string(config.rollout.max_batch) +
      " rows" + (config.model.guidance_scale == 1.0 ? "" : ", twice under model.guidance_scale") +
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
inline void check_run_memory(const run_config& config, const memory_budget& host,
                             const std::optional<memory_budget>& device = std::nullopt, int ranks = 1) {
  check_run_memory(config, run_transformer_config(config), run_text_tokens(config), host, device, ranks);
}

}  // namespace branchgrpo
