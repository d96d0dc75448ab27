#pragma once
// The Wan2.1 (video) family's run loader: a model directory of the moving-shapes format (load_video_model) or a
// Wan shape (model.config wan-t2v-1.3b, wan-t2v-14b, wan-tiny) with its checkpoint, the prompts, and the decoder:
// "pixels" (the latents are the frames), a TorchScript file or the Wan VAE's safetensors.
#include <cstdint>
#include <filesystem>
#include <memory>

#include "branchgrpo/app/moving_shapes.hpp"
#include "branchgrpo/app/run_memory.hpp"
#include "branchgrpo/app/run_model.hpp"
#include "branchgrpo/app/shapes.hpp"
#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/torch/wan/autoencoder.hpp"
#include "branchgrpo/torch/wan/transformer.hpp"

namespace branchgrpo::detail {

/// load_run_model for Wan (video) models: a model directory (load_video_model) or model.config's Wan shape with
/// its checkpoint (official or diffusers names); the decoder is "pixels" (3 channels: the latents are the frames),
/// a TorchScript file (*.pt, *.ptl: latents -> frames [rows, F, 3, H, W] in [-1, 1]) or the Wan VAE's
/// safetensors (its decoder; frames 1 + 4 (F - 1)).
inline run_model load_video_run_model(const run_config& config) {
  run_model out;
  const model_section& m = config.model;
  wan_config wan;
  std::int64_t frames = m.latent_frames;
  if (!m.dir.empty()) {
    const video_model loaded = load_video_model(config.input_path(m.dir));
    wan = loaded.config;
    out.video_transformer = std::make_shared<wan_transformer>(wan);
    load_wan_weights(*out.video_transformer, loaded.weights, wan_layout::official);
    out.embeddings = loaded.embeddings;
    out.prompts = loaded.prompts;
    if (frames == 0) frames = moving_shapes_frames;
  } else {
    wan = named_wan_config(m.config);
    torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));  // random init (wan-tiny without weights)
    out.video_transformer = make_in_place<wan_transformer>(config, wan);
    if (!m.weights.empty()) load_run_weights(*out.video_transformer, config);
  }
  load_run_prompts(config, "wan", wan, out);
  require_guidance_negatives(config, out);
  // The rollout adds the velocity to the latent: a Wan shape whose out_dim differs (the reference tests' tiny one)
  // can be loaded and checked, not sampled.
  require(wan.in_dim == wan.out_dim, config.source, ": the Wan model has in_dim ", wan.in_dim, " and out_dim ",
          wan.out_dim, ": sampling needs them equal");
  const std::int64_t h = m.latent_height > 0 ? m.latent_height : shapes_image_size;
  const std::int64_t w = m.latent_width > 0 ? m.latent_width : shapes_image_size;
  out.shape = latent_shape{{wan.in_dim, frames, h, w}};
  const torch::Device device = run_device(config);
  if (m.decoder == "pixels") {
    require(wan.in_dim == 3, config.source, ": model.decoder = \"pixels\": the model's latents have ", wan.in_dim,
            " channels, pixels need 3 (set model.decoder to the Wan VAE or a TorchScript decoder)");
    out.decode = [](const torch::Tensor& z) { return clip_frames(z); };
  } else {
    const std::filesystem::path path = config.input_path(m.decoder);
    if (is_torchscript_decoder_path(path)) {
      out.decode = torchscript_latent_decoder(path, device);
    } else {
      auto vae = std::make_shared<wan_vae_decoder>(wan_vae_config::wan21());
      load_wan_vae_decoder_weights(*vae, path);
      vae->to(device);
      require(wan.out_dim == vae->config().z_dim, config.source, ": model.decoder = \"", m.decoder,
              "\": the VAE's latents have ", vae->config().z_dim, " channels, the model's ", wan.out_dim);
      // [rows, 3, F', H, W] -> frames [rows, F', 3, H, W].
      out.decode = [vae](const torch::Tensor& z) { return clip_frames(vae->decode(z, /*clamp=*/true)); };
    }
  }
  return out;
}

}  // namespace branchgrpo::detail
