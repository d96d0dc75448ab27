#pragma once
// The FLUX.1 (image) family's entry: its spec (model_specs/flux/spec.hpp), its transformer and denoiser, its run
// loader (a model directory of the shapes format, or model.config dev / schnell / tiny with its checkpoint; the
// decoder "pixels", a TorchScript file or an ae.safetensors-layout autoencoder), its latent shape [C, h, w] and its
// size for the memory estimate. Listed in app/model_families.hpp; nothing outside this file tests for FLUX.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "branchgrpo/app/run_model.hpp"
#include "branchgrpo/app/shapes.hpp"
#include "branchgrpo/app/transformer_size.hpp"
#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/flux/spec.hpp"
#include "branchgrpo/torch/flux/autoencoder.hpp"
#include "branchgrpo/torch/flux/denoiser.hpp"
#include "branchgrpo/torch/flux/transformer.hpp"

namespace branchgrpo {

struct flux_family {
  static constexpr const model_spec& spec = flux_spec;
  using config_type = flux_config;
  using transformer = flux_transformer;

  /// model.config's shape (dev, schnell, tiny) and a model directory's ("branchgrpo.flux_config" metadata).
  static flux_config named(std::string_view name) { return named_flux_config(name); }
  static flux_config parse(std::string_view text, std::string_view source) { return parse_flux_config(text, source); }

  /// [C, h, w]: the latent channels, model.latent_height and latent_width (0: the shapes model's 16).
  static latent_shape latent(const run_config& config, const flux_config& c) {
    return latent_shape{{c.latent_channels(), side(config.model.latent_height), side(config.model.latent_width)}};
  }

  /// One row's tokens are the 2x2 patches and the prompt's tokens, attended jointly.
  static transformer_size size(const flux_config& c, const latent_shape& shape, std::int64_t text_tokens) {
    transformer_size out{.layers = static_cast<double>(c.depth_double + c.depth_single),
                         .hidden = static_cast<double>(c.hidden),
                         .mlp = static_cast<double>(c.mlp_hidden()),
                         .heads = static_cast<double>(c.heads),
                         .tokens = static_cast<double>(shape.dims[1] / 2 * (shape.dims[2] / 2) + text_tokens),
                         .prompt_width = static_cast<double>(c.context_in + c.vec_in)};
    out.keys = out.tokens;
    out.count(flux_expected_tensors(c, flux_layout::bfl));
    return out;
  }

  static void load_weights(flux_transformer& model, const std::map<std::string, torch::Tensor>& tensors) {
    load_flux_weights(model, tensors);
  }

  /// FLUX's denoiser over the run's prompt table, with model.guidance as its embedded guidance.
  static flux_denoiser denoiser(std::shared_ptr<flux_transformer> model, prompt_table table, const run_config& config) {
    return flux_denoiser(std::move(model), std::move(table), {.guidance = config.model.guidance});
  }

  /// load_run_model for FLUX (see the file comment). Errors are one line naming the file or the key.
  static run_model load(const run_config& config) {
    run_model out;
    const model_section& m = config.model;
    require(m.latent_frames == 0, config.source, ": model.latent_frames = ", m.latent_frames,
            ": is for video models; model.dir = \"", m.dir, "\" makes images");
    flux_config flux;
    if (!m.dir.empty()) {
      const shapes_model loaded = load_shapes_model(config.input_path(m.dir));
      flux = loaded.config;
      auto model = std::make_shared<flux_transformer>(flux);
      load_flux_weights(*model, loaded.weights);
      out.hold<flux_family>(model);
      out.embeddings = loaded.embeddings;
      out.prompts = loaded.prompts;
    } else {
      flux = named(m.config);
      torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));  // random init (tiny without weights)
      auto model = detail::make_in_place<flux_transformer>(config, flux);
      if (!m.weights.empty()) detail::load_run_weights<flux_family>(*model, config);
      out.hold<flux_family>(model);
    }
    detail::load_run_prompts(config, spec.name, flux, out);
    detail::require_guidance_negatives(config, out);
    out.shape = latent(config, flux);
    out.decode = decoder(config, flux);
    return out;
  }

  /// The transformer export-lora merges into, as load() made it before training (model.dir's weights, or
  /// model.config's random initialization from run.seed with model.weights over it), in the default dtype.
  static std::shared_ptr<torch::nn::Module> base_transformer(const run_config& config, const flux_config& shape) {
    const model_section& m = config.model;
    if (m.dir.empty()) torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));
    auto model = std::make_shared<flux_transformer>(shape);
    if (!m.dir.empty())
      load_flux_weights(*model, load_shapes_model(config.input_path(m.dir)).weights);
    else if (!m.weights.empty())
      detail::load_run_weights<flux_family>(*model, config);
    return model;
  }

 private:
  static std::int64_t side(std::int64_t configured) { return configured > 0 ? configured : shapes_image_size; }

  /// model.decoder: "pixels" (3 latent channels: the latents are the images; empty decoder), a TorchScript file or
  /// an ae.safetensors-layout autoencoder.
  static latent_decoder_fn decoder(const run_config& config, const flux_config& flux) {
    const model_section& m = config.model;
    const torch::Device device = run_device(config);
    if (m.decoder == "pixels") {
      require(flux.latent_channels() == 3, config.source, ": model.decoder = \"pixels\": the model's latents have ",
              flux.latent_channels(), " channels, pixels need 3 (set model.decoder to an autoencoder)");
      return {};
    }
    const std::filesystem::path path = config.input_path(m.decoder);
    if (detail::is_torchscript_decoder_path(path)) return detail::torchscript_latent_decoder(path, device);
    auto ae = std::make_shared<flux_autoencoder>(flux_autoencoder_config::dev());
    load_flux_autoencoder_weights(*ae, path);
    ae->to(device);
    return [ae](const torch::Tensor& z) { return ae->decode(z, /*clamp=*/true); };
  }
};

}  // namespace branchgrpo
