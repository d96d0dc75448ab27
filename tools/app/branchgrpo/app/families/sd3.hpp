#pragma once
// The Stable Diffusion 3.5 (image) family's entry: its spec (model_specs/sd3/spec.hpp), its MMDiT-X transformer and
// denoiser, its run loader (model.config sd3.5-medium / sd3.5-large with a checkpoint in Stability's or diffusers'
// names, or sd3-tiny, random init allowed; or a model directory whose model.safetensors declares
// "branchgrpo.sd3_config" beside its prompts.safetensors), its latent shape [C, h, w] and its size for the memory
// estimate. The decoder is "pixels", a TorchScript file or SD3's VAE (the FLUX decoder with SD3's latent scale and
// shift, torch/sd3/autoencoder.hpp). Listed in app/model_families.hpp; nothing outside this file tests for SD3.
//
// Example: model.config = "sd3.5-medium", model.weights = "sd3.5_medium.safetensors" (the released single file: the
//   transformer under model.diffusion_model.*, its VAE and text encoders skipped), data.embeddings from
//   `scripts/export_prompt_embeddings.py --model sd3` -> latents [16, h, w], 2 x 2 patches, guidance 7 by default.
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
#include "branchgrpo/model_specs/sd3/spec.hpp"
#include "branchgrpo/safetensors.hpp"
#include "branchgrpo/torch/flux/prompt_embeddings.hpp"
#include "branchgrpo/torch/sd3/autoencoder.hpp"
#include "branchgrpo/torch/sd3/denoiser.hpp"
#include "branchgrpo/torch/sd3/transformer.hpp"

namespace branchgrpo {

/// The prompt rows fit an SD3 model: pooled vectors of pooled_in, token features of context_in (CLIP-L and CLIP-G
/// padded to T5's width, then T5's tokens). A FLUX file (pooled 768) or a Wan one (no pooled) is refused here.
/// Example: a FLUX export ([N, 512, 4096], pooled 768) against sd3_config::medium() throws
///   "p.safetensors: pooled width 768 does not match the SD3 model's pooled_in 2048".
inline void check_prompt_dataset(const prompt_dataset& data, const sd3_config& config, std::string_view source) {
  require(data.rows.has_pooled(), source, ": tensor 'pooled' is missing (SD3 needs pooled CLIP vectors)");
  require(data.rows.width() == config.context_in, source, ": context width ", data.rows.width(),
          " does not match the SD3 model's context_in ", config.context_in);
  require(data.rows.pooled_width() == config.pooled_in, source, ": pooled width ", data.rows.pooled_width(),
          " does not match the SD3 model's pooled_in ", config.pooled_in);
}

struct sd3_family {
  static constexpr const model_spec& spec = sd3_spec;
  using config_type = sd3_config;
  using transformer = sd3_transformer;

  /// model.config's shape (named_sd3_config) and a model directory's ("branchgrpo.sd3_config" metadata).
  static sd3_config named(std::string_view name) { return named_sd3_config(name); }
  static sd3_config parse(std::string_view text, std::string_view source) { return parse_sd3_config(text, source); }

  /// [C, h, w]: the latent channels, model.latent_height and latent_width (0: 16 cells, the shapes images' side).
  static latent_shape latent(const run_config& config, const sd3_config& c) {
    return latent_shape{{c.in_channels, side(config.model.latent_height), side(config.model.latent_width)}};
  }

  /// One row's tokens are the patches and the prompt's tokens, attended jointly.
  static transformer_size size(const sd3_config& c, const latent_shape& shape, std::int64_t text_tokens) {
    const std::int64_t patches = (shape.dims[1] / c.patch) * (shape.dims[2] / c.patch);
    transformer_size out{.layers = static_cast<double>(c.depth),
                         .hidden = static_cast<double>(c.hidden),
                         .mlp = static_cast<double>(4 * c.hidden),
                         .heads = static_cast<double>(c.heads),
                         .tokens = static_cast<double>(patches + text_tokens),
                         .prompt_width = static_cast<double>(c.context_in + c.pooled_in)};
    out.keys = out.tokens;
    out.count(sd3_expected_tensors(c, sd3_layout::stability));
    return out;
  }

  static void load_weights(sd3_transformer& model, const std::map<std::string, torch::Tensor>& tensors) {
    load_sd3_weights(model, tensors);
  }

  static sd3_denoiser denoiser(std::shared_ptr<sd3_transformer> model, prompt_table table, const run_config&) {
    return sd3_denoiser(std::move(model), std::move(table));
  }

  /// load_run_model for SD3 (see the file comment). Errors are one line naming the file or the key.
  static run_model load(const run_config& config) {
    run_model out;
    const model_section& m = config.model;
    require(m.latent_frames == 0, config.source, ": model.latent_frames = ", m.latent_frames,
            ": is for video models; an SD3 model makes images");
    const sd3_config shape = m.dir.empty() ? named(m.config) : directory_config(config);
    std::shared_ptr<sd3_transformer> model = base(config, shape, /*in_place=*/true);
    out.hold<sd3_family>(model);
    if (!m.dir.empty() && config.data.embeddings.empty()) directory_prompts(config, shape, out);
    detail::load_run_prompts(config, spec.name, shape, out);
    detail::require_guidance_negatives(config, out);
    out.shape = latent(config, shape);
    out.decode = decoder(config, shape);
    return out;
  }

  /// The transformer export-lora merges into, as load() made it before training, in the default dtype.
  static std::shared_ptr<torch::nn::Module> base_transformer(const run_config& config, const sd3_config& shape) {
    return base(config, shape, /*in_place=*/false);
  }

 private:
  static std::int64_t side(std::int64_t configured) { return configured > 0 ? configured : shapes_image_size; }

  static std::filesystem::path directory_weights(const run_config& config) {
    return config.input_path(config.model.dir) / "model.safetensors";
  }

  /// A model directory's shape: its model.safetensors' "branchgrpo.sd3_config" metadata.
  static sd3_config directory_config(const run_config& config) {
    const std::filesystem::path path = directory_weights(config);
    const safetensors_file file(path);
    const auto it = file.metadata().find(std::string(spec.metadata_key));
    require(it != file.metadata().end(), path_text(path), ": no __metadata__ key '", spec.metadata_key, "'");
    return parse(it->second, path.string());
  }

  /// A model directory's prompts.safetensors (without data.embeddings): its rows and strings into `out`.
  static void directory_prompts(const run_config& config, const sd3_config& shape, run_model& out) {
    const std::filesystem::path path = config.input_path(config.model.dir) / "prompts.safetensors";
    prompt_file prompts = load_prompt_file(path);
    check_prompt_source(prompts, spec.name, "", path.string());
    prompt_dataset rows;
    rows.rows = prompt_table(std::move(prompts.embeddings));
    check_prompt_dataset(rows, shape, path.string());
    out.embeddings = std::move(rows.rows);
    out.prompts = std::move(prompts.prompts);
  }

  /// The transformer of `shape`: model.dir's weights, or model.config's random initialization from run.seed with
  /// model.weights over it (in place: created in model.dtype on model.device, as the run holds it).
  static std::shared_ptr<sd3_transformer> base(const run_config& config, const sd3_config& shape, bool in_place) {
    const model_section& m = config.model;
    if (m.dir.empty()) torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));
    auto model =
        in_place ? detail::make_in_place<sd3_transformer>(config, shape) : std::make_shared<sd3_transformer>(shape);
    if (!m.dir.empty())
      load_sd3_weights(*model, load_safetensors(directory_weights(config)), sd3_layout::stability);
    else if (!m.weights.empty())
      detail::load_run_weights<sd3_family>(*model, config);
    return model;
  }

  /// model.decoder: "pixels" (3 latent channels: the latents are the images), a TorchScript file or SD3's VAE
  /// (Stability's single file, its first_stage_model.*, or diffusers' vae/ weights).
  static latent_decoder_fn decoder(const run_config& config, const sd3_config& shape) {
    const model_section& m = config.model;
    const torch::Device device = run_device(config);
    if (m.decoder == "pixels") {
      require(shape.in_channels == 3, config.source, ": model.decoder = \"pixels\": the model's latents have ",
              shape.in_channels, " channels, pixels need 3 (set model.decoder to SD3's VAE or a TorchScript decoder)");
      return {};
    }
    const std::filesystem::path path = config.input_path(m.decoder);
    if (detail::is_torchscript_decoder_path(path)) return detail::torchscript_latent_decoder(path, device);
    auto vae = std::make_shared<flux_autoencoder>(sd3_autoencoder_config());
    load_sd3_autoencoder_weights(*vae, path);
    vae->to(device);
    return [vae](const torch::Tensor& z) { return vae->decode(z, /*clamp=*/true); };
  }
};

}  // namespace branchgrpo
