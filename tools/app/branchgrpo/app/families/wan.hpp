#pragma once
// The Wan2.1 (video) family's entry: its spec (model_specs/wan/spec.hpp), its transformer and denoiser, its run
// loader (a model directory of the moving-shapes format, or model.config wan-t2v-1.3b / wan-t2v-14b / wan-tiny
// with its checkpoint in official or diffusers names; the decoder "pixels", a TorchScript file or the Wan VAE's
// safetensors), its latent shape [C, F, h, w] and its size for the memory estimate. Listed in
// app/model_families.hpp; nothing outside this file tests for Wan.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "branchgrpo/app/moving_shapes.hpp"
#include "branchgrpo/app/run_model.hpp"
#include "branchgrpo/app/shapes.hpp"
#include "branchgrpo/app/transformer_size.hpp"
#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/wan/spec.hpp"
#include "branchgrpo/torch/wan/autoencoder.hpp"
#include "branchgrpo/torch/wan/denoiser.hpp"
#include "branchgrpo/torch/wan/transformer.hpp"

namespace branchgrpo {

struct wan_family {
  static constexpr const model_spec& spec = wan_spec;
  using config_type = wan_config;
  using transformer = wan_transformer;

  /// model.config's shape (named_wan_config) and a model directory's ("branchgrpo.wan_config" metadata).
  static wan_config named(std::string_view name) { return named_wan_config(name); }
  static wan_config parse(std::string_view text, std::string_view source) { return parse_wan_config(text, source); }

  /// [C, F, h, w]: in_dim, model.latent_frames (0: 8) and model.latent_height / latent_width (0: 16).
  static latent_shape latent(const run_config& config, const wan_config& c) {
    const model_section& m = config.model;
    return latent_shape{{c.in_dim, m.latent_frames > 0 ? m.latent_frames : moving_shapes_frames, side(m.latent_height),
                         side(m.latent_width)}};
  }

  /// One row's tokens are the patches of the clip; each attends to them all and to the padded text.
  static transformer_size size(const wan_config& c, const latent_shape& shape, std::int64_t /*text_tokens*/) {
    const auto cells = [&](std::size_t a) {
      return static_cast<double>((shape.dims[a + 1] + c.patch[a] - 1) / c.patch[a]);
    };
    const double tokens = cells(0) * cells(1) * cells(2);
    transformer_size out{.layers = static_cast<double>(c.layers),
                         .hidden = static_cast<double>(c.dim),
                         .mlp = static_cast<double>(c.ffn_dim),
                         .heads = static_cast<double>(c.heads),
                         .tokens = tokens,
                         .keys = tokens + static_cast<double>(c.text_len),
                         .prompt_width = static_cast<double>(c.text_dim)};
    out.count(wan_expected_tensors(c, wan_layout::official));
    return out;
  }

  static void load_weights(wan_transformer& model, const std::map<std::string, torch::Tensor>& tensors) {
    load_wan_weights(model, tensors);
  }

  static wan_denoiser denoiser(std::shared_ptr<wan_transformer> model, prompt_table table, const run_config&) {
    return wan_denoiser(std::move(model), std::move(table));
  }

  /// load_run_model for Wan (see the file comment). Errors are one line naming the file or the key.
  static run_model load(const run_config& config) {
    run_model out;
    const model_section& m = config.model;
    wan_config wan;
    if (!m.dir.empty()) {
      const video_model loaded = load_video_model(config.input_path(m.dir));
      wan = loaded.config;
      auto model = std::make_shared<wan_transformer>(wan);
      load_wan_weights(*model, loaded.weights, wan_layout::official);
      out.hold<wan_family>(model);
      out.embeddings = loaded.embeddings;
      out.prompts = loaded.prompts;
    } else {
      wan = named(m.config);
      torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));  // random init (wan-tiny without weights)
      auto model = detail::make_in_place<wan_transformer>(config, wan);
      if (!m.weights.empty()) detail::load_run_weights<wan_family>(*model, config);
      out.hold<wan_family>(model);
    }
    detail::load_run_prompts(config, spec.name, wan, out);
    detail::require_guidance_negatives(config, out);
    // The rollout adds the velocity to the latent: a Wan shape whose out_dim differs (the reference tests' tiny one)
    // can be loaded and checked, not sampled.
    require(wan.in_dim == wan.out_dim, config.source, ": the Wan model has in_dim ", wan.in_dim, " and out_dim ",
            wan.out_dim, ": sampling needs them equal");
    out.shape = latent(config, wan);
    out.decode = decoder(config, wan);
    return out;
  }

  /// The transformer export-lora merges into, as load() made it before training, in the default dtype.
  static std::shared_ptr<torch::nn::Module> base_transformer(const run_config& config, const wan_config& shape) {
    const model_section& m = config.model;
    if (m.dir.empty()) torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));
    auto model = std::make_shared<wan_transformer>(shape);
    if (!m.dir.empty())
      load_wan_weights(*model, load_video_model(config.input_path(m.dir)).weights, wan_layout::official);
    else if (!m.weights.empty())
      detail::load_run_weights<wan_family>(*model, config);
    return model;
  }

  /// model.decoder: "pixels" (3 channels: the latents are the frames), a TorchScript file (latents -> frames
  /// [rows, F, 3, H, W] in [-1, 1]) or the Wan VAE's safetensors (its decoder; frames 1 + 4 (F - 1)). Wan2.2's
  /// family decodes its experts' latents with it too (families/wan22.hpp).
  static latent_decoder_fn decoder(const run_config& config, const wan_config& wan) {
    const model_section& m = config.model;
    const torch::Device device = run_device(config);
    if (m.decoder == "pixels") {
      require(wan.in_dim == 3, config.source, ": model.decoder = \"pixels\": the model's latents have ", wan.in_dim,
              " channels, pixels need 3 (set model.decoder to the Wan VAE or a TorchScript decoder)");
      return [](const torch::Tensor& z) { return clip_frames(z); };
    }
    const std::filesystem::path path = config.input_path(m.decoder);
    if (detail::is_torchscript_decoder_path(path)) return detail::torchscript_latent_decoder(path, device);
    auto vae = std::make_shared<wan_vae_decoder>(wan_vae_config::wan21());
    load_wan_vae_decoder_weights(*vae, path);
    vae->to(device);
    require(wan.out_dim == vae->config().z_dim, config.source, ": model.decoder = \"", m.decoder,
            "\": the VAE's latents have ", vae->config().z_dim, " channels, the model's ", wan.out_dim);
    // [rows, 3, F', H, W] -> frames [rows, F', 3, H, W].
    return [vae](const torch::Tensor& z) { return clip_frames(vae->decode(z, /*clamp=*/true)); };
  }

 private:
  static std::int64_t side(std::int64_t configured) { return configured > 0 ? configured : shapes_image_size; }
};

}  // namespace branchgrpo
