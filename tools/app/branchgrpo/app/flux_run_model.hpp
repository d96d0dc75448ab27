#pragma once
// The FLUX (image) family's run loader: a model directory of the shapes format (load_shapes_model) or a FLUX shape
// (model.config dev, schnell, tiny) with its checkpoint, the prompts, and the decoder: "pixels" (the latents are
// the images), a TorchScript file or an ae.safetensors-layout autoencoder.
#include <cstdint>
#include <filesystem>
#include <memory>

#include "branchgrpo/app/run_model.hpp"
#include "branchgrpo/app/shapes.hpp"
#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/torch/flux/autoencoder.hpp"
#include "branchgrpo/torch/flux/transformer.hpp"

namespace branchgrpo::detail {

/// load_run_model for FLUX (image) models (see the file comment). Errors are one line naming the file or the key.
inline run_model load_image_run_model(const run_config& config) {
  run_model out;
  const model_section& m = config.model;
  require(m.latent_frames == 0, config.source, ": model.latent_frames = ", m.latent_frames,
          ": is for video models; model.dir = \"", m.dir, "\" makes images");
  flux_config flux;
  if (!m.dir.empty()) {
    const shapes_model loaded = load_shapes_model(config.input_path(m.dir));
    flux = loaded.config;
    out.transformer = std::make_shared<flux_transformer>(flux);
    load_flux_weights(*out.transformer, loaded.weights);
    out.embeddings = loaded.embeddings;
    out.prompts = loaded.prompts;
  } else {
    flux = m.config == "dev"       ? flux_config::dev()
           : m.config == "schnell" ? flux_config::schnell()
                                   : flux_config::tiny();
    torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));  // random init (tiny without weights)
    out.transformer = make_in_place<flux_transformer>(config, flux);
    if (!m.weights.empty()) load_run_weights(*out.transformer, config);
  }
  load_run_prompts(config, "flux", flux, out);
  require_guidance_negatives(config, out);
  const std::int64_t h = m.latent_height > 0 ? m.latent_height : shapes_image_size;
  const std::int64_t w = m.latent_width > 0 ? m.latent_width : shapes_image_size;
  out.shape = latent_shape{{flux.latent_channels(), h, w}};
  const torch::Device device = run_device(config);
  if (m.decoder != "pixels") {
    const std::filesystem::path path = config.input_path(m.decoder);
    if (is_torchscript_decoder_path(path)) {
      out.decode = torchscript_latent_decoder(path, device);
    } else {
      auto ae = std::make_shared<flux_autoencoder>(flux_autoencoder_config::dev());
      load_flux_autoencoder_weights(*ae, path);
      ae->to(device);
      out.decode = [ae](const torch::Tensor& z) { return ae->decode(z, /*clamp=*/true); };
    }
  } else {
    require(flux.latent_channels() == 3, config.source, ": model.decoder = \"pixels\": the model's latents have ",
            flux.latent_channels(), " channels, pixels need 3 (set model.decoder to an autoencoder)");
  }
  return out;
}

}  // namespace branchgrpo::detail
