#pragma once
// The Wan2.2 (video, two experts) family's entry: its spec (model_specs/wan22/spec.hpp), its transformer and denoiser
// (torch/wan22/), its run loader, its latent shape and its size for the memory estimate. Listed in
// app/model_families.hpp beside Wan2.1's; nothing outside this file tests for Wan2.2.
//
//   model.config = "wan2.2-t2v-a14b", model.weights = the release directory (official high_noise_model/ +
//                  low_noise_model/, or diffusers transformer/ + transformer_2/) or one safetensors file of prefixed
//                  names (load_wan22_checkpoint), loaded one expert at a time
//   model.config = "wan22-tiny"      random init from run.seed (or model.weights as above)
//   model.dir                        a directory whose model.safetensors holds both experts' official prefixed names
//                                    and "branchgrpo.wan22_config" (format_wan22_config), with prompts.safetensors
//   model.decoder                    as Wan2.1's: a TorchScript file or the Wan2.1 VAE's safetensors (A14B's VAE)
//
// The config's metadata text is Wan's (format_wan_config) for the expert, then ";boundary=...;experts=2":
//   format_wan22_config(wan22_config::tiny()) == "in_dim=4;out_dim=4;dim=40;ffn_dim=56;heads=2;layers=2;freq_dim=32;
//   text_dim=24;text_len=8;patch=1,2,2;eps=1e-06;rope_theta=10000;boundary=0.875;experts=2".
// Memory: the weights of both experts are held (size() counts both, and LoRA on both), the activations are one
// expert's (one runs per call).
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "branchgrpo/app/families/wan.hpp"
#include "branchgrpo/app/moving_shapes.hpp"
#include "branchgrpo/app/run_model.hpp"
#include "branchgrpo/app/shapes.hpp"
#include "branchgrpo/app/transformer_size.hpp"
#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/wan/spec.hpp"
#include "branchgrpo/model_specs/wan22/config.hpp"
#include "branchgrpo/model_specs/wan22/spec.hpp"
#include "branchgrpo/torch/wan22/denoiser.hpp"
#include "branchgrpo/torch/wan22/transformer.hpp"

namespace branchgrpo {

// ---- wan22_config as metadata text ------------------------------------------------------------------------------

/// A wan22_config as its metadata text (see the file comment): format_wan_config of the expert, then boundary
/// (shortest round-trip) and experts.
inline std::string format_wan22_config(const wan22_config& c) {
  return format_wan_config(c.expert) + ";boundary=" + detail::shortest_text(c.boundary) +
         ";experts=" + std::to_string(c.experts);
}

/// Inverse of format_wan22_config: boundary and experts once each, the other keys parse_wan_config's; `source`
/// prefixes errors ("m: wan22_config boundary = x: ...", "m: wan22_config: boundary 1.2 is outside (0, 1)").
/// @post the result passes validate().
inline wan22_config parse_wan22_config(std::string_view text, std::string_view source) {
  detail::config_fields f(text, source, "wan22_config");
  wan22_config c;
  c.boundary = f.number("boundary");
  c.experts = f.integer("experts", 1, 2);
  std::string expert;
  for (const auto& [key, value] : f.fields) expert += (expert.empty() ? "" : ";") + key + "=" + value;
  c.expert = parse_wan_config(expert, source);
  try {
    validate(c);
  } catch (const invalid_input& error) {
    fail(source, ": ", error.what());
  }
  return c;
}

struct wan22_family {
  static constexpr const model_spec& spec = wan22_spec;
  using config_type = wan22_config;
  using transformer = wan22_transformer;

  /// model.config's shape (named_wan22_config) and a model directory's ("branchgrpo.wan22_config" metadata).
  static wan22_config named(std::string_view name) { return named_wan22_config(name); }
  static wan22_config parse(std::string_view text, std::string_view source) { return parse_wan22_config(text, source); }

  /// [C, F, h, w] of one expert, as Wan2.1's (wan_family::latent).
  static latent_shape latent(const run_config& config, const wan22_config& c) {
    return wan_family::latent(config, c.expert);
  }

  /// One expert's widths and tokens (the activations of the one that runs), both experts' parameters and linear
  /// sides (the weights held, and LoRA on both).
  static transformer_size size(const wan22_config& c, const latent_shape& shape, std::int64_t text_tokens) {
    transformer_size out = wan_family::size(c.expert, shape, text_tokens);
    out.count(wan_expected_tensors(c.expert, wan_layout::official));  // the second expert
    return out;
  }

  static void load_weights(wan22_transformer& model, const std::map<std::string, torch::Tensor>& tensors) {
    load_wan22_weights(model, tensors);
  }

  static wan22_denoiser denoiser(std::shared_ptr<wan22_transformer> model, prompt_table table, const run_config&) {
    return wan22_denoiser(std::move(model), std::move(table));
  }

  /// load_run_model for Wan2.2 (see the file comment). Errors are one line naming the file or the key.
  static run_model load(const run_config& config) {
    run_model out;
    const model_section& m = config.model;
    wan22_config shape;
    if (!m.dir.empty()) {
      shape = load_dir(config, out);
    } else {
      shape = named(m.config);
      torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));  // random init (wan22-tiny without weights)
      auto model = detail::make_in_place<wan22_transformer>(config, shape);
      if (!m.weights.empty()) load_run_weights(*model, config);
      out.hold<wan22_family>(model);
    }
    // Wan2.2's prompts are Wan2.1's: the same umT5 features, exported for "wan" (check_prompt_source).
    detail::load_run_prompts(config, wan_spec.name, shape.expert, out);
    detail::require_guidance_negatives(config, out);
    require(shape.expert.in_dim == shape.expert.out_dim, config.source, ": the Wan2.2 experts have in_dim ",
            shape.expert.in_dim, " and out_dim ", shape.expert.out_dim, ": sampling needs them equal");
    out.shape = latent(config, shape);
    out.decode = wan_family::decoder(config, shape.expert);
    // model.guidance_scale_2 guides the low-noise expert's noise levels (the module's own switch).
    out.second_expert_at = [model = std::static_pointer_cast<wan22_transformer>(out.transformer)](double sigma) {
      return model->expert_for(1000.0 * sigma) == wan22_expert::low_noise;
    };
    return out;
  }

  /// The transformer export-lora merges into, as load() made it before training, in the default dtype.
  static std::shared_ptr<torch::nn::Module> base_transformer(const run_config& config, const wan22_config& shape) {
    const model_section& m = config.model;
    if (m.dir.empty()) torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));
    auto model = std::make_shared<wan22_transformer>(shape);
    if (!m.dir.empty())
      load_wan22_weights(*model, read_dir_weights(config).second);
    else if (!m.weights.empty())
      load_run_weights(*model, config);
    return model;
  }

 private:
  /// model.weights (a release directory or a file, load_wan22_checkpoint) into `model`, one expert at a time in
  /// model.dtype. Errors: one line naming the key and the path.
  static void load_run_weights(wan22_transformer& model, const run_config& config) {
    const std::filesystem::path path = config.input_path(config.model.weights);
    const std::string key = config.source + ": model.weights = \"" + path_text(path) + "\"";
    const safetensors_load_options options{
        .dtype = run_dtype(config), .allowed_dtypes = model_weight_dtypes, .finite = true};
    try {
      for (const wan22_expert which : {wan22_expert::high_noise, wan22_expert::low_noise})
        load_wan22_expert_weights(model, which, load_wan22_checkpoint(path, which, options));
    } catch (const invalid_input& error) {
      fail(key, ": ", error.what());
    }
  }

  /// DIR/model.safetensors' config and weights (float32, CPU; require_one_model_family, finite weights).
  static std::pair<wan22_config, std::map<std::string, torch::Tensor>> read_dir_weights(const run_config& config) {
    const std::filesystem::path path = config.input_path(config.model.dir) / "model.safetensors";
    require(std::filesystem::is_regular_file(path), path.string(), ": no such file");
    std::map<std::string, torch::Tensor> weights;
    std::map<std::string, std::string> metadata;
    const wan22_config shape = detail::read_model_file(path, spec.metadata_key, parse_wan22_config, weights, metadata);
    return {shape, std::move(weights)};
  }

  /// model.dir: its transformer into out.hold, its prompts.safetensors into out.embeddings / out.prompts.
  static wan22_config load_dir(const run_config& config, run_model& out) {
    auto [shape, weights] = read_dir_weights(config);
    const std::filesystem::path model_path = config.input_path(config.model.dir) / "model.safetensors";
    auto model = std::make_shared<wan22_transformer>(shape);
    try {
      load_wan22_weights(*model, weights);
    } catch (const invalid_input& error) {
      fail(model_path.string(), ": ", error.what());
    }
    out.hold<wan22_family>(model);
    const std::filesystem::path prompts_path = config.input_path(config.model.dir) / "prompts.safetensors";
    prompt_file prompts = load_prompt_file(prompts_path);
    check_prompt_file(prompts, shape.expert, prompts_path.string());
    out.embeddings = std::move(prompts.embeddings);
    out.prompts = std::move(prompts.prompts);
    return shape;
  }
};

}  // namespace branchgrpo
