#pragma once
// Stable Diffusion 3 / 3.5's VAE decoder. It IS FLUX.1's decoder (torch/flux/autoencoder.hpp: flux_autoencoder,
// the same resnet / attention / upsample network, 16 latent channels, widths 128 256 512 512, 32 groups, 8x
// upscale); the two differ only in the latent normalization, which flux_autoencoder::decode undoes the way
// diffusers' StableDiffusion3Pipeline does before vae.decode:
//
//   z = latents / scale_factor + shift_factor        SD3: scale 1.5305, shift 0.0609 (FLUX: 0.3611, 0.1159)
//
// So this header holds only sd3_autoencoder_config() and a loader for the names SD3's VAE is published under:
//   ldm        decoder.* as in ae.safetensors (decoder.up.i.block.j, decoder.mid.attn_1.q, ... 1x1 convs);
//              in SD3.5's released single file prefixed "first_stage_model." next to the transformer's and text
//              encoders' tensors (model.diffusion_model.*, text_encoders.*), which are skipped;
//   diffusers  AutoencoderKL's vae/diffusion_pytorch_model.safetensors: decoder.up_blocks.k (k = L - 1 - i, the
//              lowest resolution first), resnets.j, conv_shortcut, mid_block.resnets.0 / 1,
//              mid_block.attentions.0.{group_norm, to_q, to_k, to_v, to_out.0} (linear [C, C] weights, reshaped to
//              the 1x1 convs' [C, C, 1, 1]), upsamplers.0.conv, conv_norm_out.
// encoder.* (and the encoder-side quant_conv.*) are skipped in every layout.
//
//   flux_autoencoder vae(sd3_autoencoder_config());
//   load_sd3_autoencoder_weights(vae, "sd3.5_medium.safetensors");    // or .../vae/diffusion_pytorch_model.safetensors
//   torch::Tensor images = vae.decode_images(latents);                 // [B, 16, 128, 128] -> [B, 3, 1024, 1024]
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/torch/flux/autoencoder.hpp"
#include "branchgrpo/torch/safetensors.hpp"

namespace branchgrpo {

/// SD3 / SD3.5 (medium and large share it)'s VAE: flux_autoencoder_config::dev()'s shape, SD3's normalization.
/// Example: sd3_autoencoder_config().scale_factor == 1.5305, .shift_factor == 0.0609, .upscale() == 8.
inline flux_autoencoder_config sd3_autoencoder_config() {
  flux_autoencoder_config config = flux_autoencoder_config::dev();
  config.scale_factor = 1.5305;
  config.shift_factor = 0.0609;
  return config;
}

/// For tests (tests/reference/sd3_vae_reference.py's fixture): 16 latent channels like SD3, widths 8, 16, 16
/// (4 groups), 2 blocks per level, two upsamples (4x), SD3's scale and shift.
/// Example: sd3_autoencoder_tiny_config().upscale() == 4; ch_mult == {1, 2, 2}.
inline flux_autoencoder_config sd3_autoencoder_tiny_config() {
  flux_autoencoder_config config = sd3_autoencoder_config();
  config.ch = 8;
  config.ch_mult = {1, 2, 2};
  config.num_res_blocks = 1;
  config.groups = 4;
  return config;
}

/// The two name sets of SD3's VAE decoder (see the file comment); the shapes differ only in the attention's
/// q / k / v / proj_out weights ([C, C, 1, 1] in ldm, [C, C] in diffusers).
enum class sd3_vae_layout { ldm, diffusers };

/// The diffusers AutoencoderKL name and shape of the ldm decoder tensor `ldm` of `config`.
/// Example: dev()'s shape, {"decoder.up.3.block.2.conv1.weight", [512, 512, 3, 3]} ->
///   {"decoder.up_blocks.0.resnets.2.conv1.weight", same shape}; {"decoder.mid.attn_1.proj_out.weight",
///   [512, 512, 1, 1]} -> {"decoder.mid_block.attentions.0.to_out.0.weight", [512, 512]};
///   "decoder.norm_out.bias" -> "decoder.conv_norm_out.bias".
/// @pre ldm is one of flux_decoder_expected_tensors(config).
inline flux_tensor_spec sd3_vae_diffusers_spec(const flux_autoencoder_config& config, const flux_tensor_spec& ldm) {
  const std::string& name = ldm.name;
  const auto after = [&](const std::string& prefix) { return name.substr(prefix.size()); };
  // A resnet's children keep their names but for the shortcut.
  const auto resnet_part = [](const std::string& part) {
    return part.starts_with("nin_shortcut.") ? "conv_shortcut." + part.substr(13) : part;
  };
  if (name.starts_with("decoder.conv_in.") || name.starts_with("decoder.conv_out.")) return ldm;
  if (name.starts_with("decoder.norm_out.")) return {"decoder.conv_norm_out." + after("decoder.norm_out."), ldm.shape};
  if (name.starts_with("decoder.mid.block_1."))
    return {"decoder.mid_block.resnets.0." + resnet_part(after("decoder.mid.block_1.")), ldm.shape};
  if (name.starts_with("decoder.mid.block_2."))
    return {"decoder.mid_block.resnets.1." + resnet_part(after("decoder.mid.block_2.")), ldm.shape};
  if (name.starts_with("decoder.mid.attn_1.")) {
    const std::string part = after("decoder.mid.attn_1.");
    const std::string base = "decoder.mid_block.attentions.0.";
    if (part.starts_with("norm.")) return {base + "group_norm." + part.substr(5), ldm.shape};
    const std::size_t dot = part.find('.');
    const std::string conv = part.substr(0, dot), field = part.substr(dot);
    const std::string linear = conv == "proj_out" ? "to_out.0" : "to_" + conv;
    std::vector<std::int64_t> shape = ldm.shape;
    if (shape.size() == 4) shape.resize(2);  // 1x1 conv [C, C, 1, 1] -> linear [C, C]
    return {base + linear + field, shape};
  }
  require(name.starts_with("decoder.up."), "sd3_vae_diffusers_spec: unknown decoder tensor ", name);
  const std::string rest = after("decoder.up.");
  const std::size_t dot = rest.find('.');
  const auto level = std::stoll(rest.substr(0, dot));
  const auto levels = static_cast<std::int64_t>(config.ch_mult.size());
  const std::string block = "decoder.up_blocks." + std::to_string(levels - 1 - level) + ".";
  const std::string part = rest.substr(dot + 1);
  if (part.starts_with("upsample.")) return {block + "upsamplers.0." + part.substr(9), ldm.shape};
  require(part.starts_with("block."), "sd3_vae_diffusers_spec: unknown decoder tensor ", name);
  const std::string inner = part.substr(6);
  const std::size_t inner_dot = inner.find('.');
  return {block + "resnets." + inner.substr(0, inner_dot) + "." + resnet_part(inner.substr(inner_dot + 1)), ldm.shape};
}

/// Every decoder tensor of `config` in `layout`, in flux_decoder_expected_tensors(config)'s order.
/// Example: sd3_autoencoder_config(), diffusers -> 138 tensors, the first decoder.conv_in.weight [512, 16, 3, 3].
inline std::vector<flux_tensor_spec> sd3_vae_decoder_expected_tensors(const flux_autoencoder_config& config,
                                                                      sd3_vae_layout layout) {
  std::vector<flux_tensor_spec> out = flux_decoder_expected_tensors(config);
  if (layout == sd3_vae_layout::diffusers)
    for (flux_tensor_spec& spec : out) spec = sd3_vae_diffusers_spec(config, spec);
  return out;
}

/// The prefix of the VAE's names in SD3.5's released single-file checkpoint.
inline constexpr std::string_view sd3_single_file_vae_prefix = "first_stage_model.";

/// The name a checkpoint tensor has for the VAE loader, or nullopt when the loader skips it: in a single file
/// (`single_file`: some name starts with first_stage_model.) only first_stage_model.* names count, the prefix
/// removed; then encoder.* and quant_conv.* (the encoder's half) are skipped.
/// Example: ("first_stage_model.decoder.conv_in.bias", true) -> "decoder.conv_in.bias";
///   ("model.diffusion_model.x_embedder.proj.weight", true) -> nullopt; ("encoder.conv_in.weight", false) ->
///   nullopt; ("decoder.conv_in.bias", false) -> "decoder.conv_in.bias".
inline std::optional<std::string> sd3_vae_decoder_name(const std::string& name, bool single_file) {
  std::string vae_name = name;
  if (single_file) {
    if (!name.starts_with(sd3_single_file_vae_prefix)) return std::nullopt;
    vae_name = name.substr(sd3_single_file_vae_prefix.size());
  }
  if (vae_name.starts_with("encoder.") || vae_name.starts_with("quant_conv.")) return std::nullopt;
  return vae_name;
}

/// diffusers when some name starts with decoder.up_blocks., decoder.mid_block. or decoder.conv_norm_out., else ldm
/// (so a file of neither layout is reported against the ldm names).
template <typename Map>
sd3_vae_layout detect_sd3_vae_layout(const Map& tensors) {
  for (const auto& [name, tensor] : tensors)
    if (name.starts_with("decoder.up_blocks.") || name.starts_with("decoder.mid_block.") ||
        name.starts_with("decoder.conv_norm_out."))
      return sd3_vae_layout::diffusers;
  return sd3_vae_layout::ldm;
}

/// Loads SD3's VAE decoder weights, in either layout and with or without the single file's first_stage_model.
/// prefix (the file comment), into `model`, converting each tensor to the model's dtype and device. Every
/// missing / unexpected name and shape mismatch (in the detected layout's names, prefix removed) is named in one
/// invalid_input line (the first 10, then a count).
/// Example: tiny config, a map {"foo": ...} -> "SD3 autoencoder weights (ldm names) do not match the config:
///   missing decoder.conv_in.weight, missing decoder.conv_in.bias, ... and 79 more"; diffusers names with
///   to_q.weight as [16, 16, 1, 1] -> "... shape mismatch decoder.mid_block.attentions.0.to_q.weight
///   [16, 16, 1, 1] (expected [16, 16])".
/// @post on success model's parameters equal the file's decoder tensors (attention weights reshaped).
inline void load_sd3_autoencoder_weights(flux_autoencoder& model, const std::map<std::string, torch::Tensor>& tensors) {
  bool single_file = false;
  for (const auto& [name, tensor] : tensors) single_file = single_file || name.starts_with(sd3_single_file_vae_prefix);
  std::map<std::string, torch::Tensor> vae;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const auto& [name, tensor] : tensors)
    if (const auto vae_name = sd3_vae_decoder_name(name, single_file)) {
      vae.emplace(*vae_name, tensor);
      shapes.emplace(*vae_name, tensor.sizes().vec());
    }
  const sd3_vae_layout layout = detect_sd3_vae_layout(vae);
  const std::vector<flux_tensor_spec> expected = sd3_vae_decoder_expected_tensors(model.config(), layout);
  const flux_key_report report = compare_tensors(expected, shapes, [](const std::string&) { return false; });
  require(report.ok(), "SD3 autoencoder weights (", single_file ? "first_stage_model." : "",
          layout == sd3_vae_layout::ldm ? "ldm" : "diffusers", " names) do not match the config: ", report.message());
  // expected[i] is the file's name of flux_decoder_expected_tensors(config)[i], the model's parameter name.
  std::map<std::string, std::string> file_name;
  const std::vector<flux_tensor_spec> ldm = flux_decoder_expected_tensors(model.config());
  for (std::size_t i = 0; i < ldm.size(); ++i) file_name.emplace(ldm[i].name, expected[i].name);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters())
    item.value().copy_(vae.at(file_name.at(item.key())).reshape(item.value().sizes()));
}

/// Loads SD3's VAE decoder out of a safetensors file: SD3.5's released single file (sd3.5_medium.safetensors:
/// only first_stage_model.decoder.* is read), diffusers' vae/diffusion_pytorch_model.safetensors, or an
/// ae.safetensors-style decoder.* file. Only the decoder's tensors are copied out of the mapping, each refused
/// unless of model_weight_dtypes and finite; errors name the file.
/// Example: a file holding only "foo" -> "<path>: SD3 autoencoder weights (ldm names) do not match the config:
///   missing decoder.conv_in.weight, ...".
inline void load_sd3_autoencoder_weights(flux_autoencoder& model, const std::filesystem::path& path) {
  const safetensors_checkpoint checkpoint(path);
  bool single_file = false;
  for (const safetensors_tensor& tensor : checkpoint.tensors())
    single_file = single_file || tensor.name.starts_with(sd3_single_file_vae_prefix);
  std::map<std::string, torch::Tensor> tensors;
  for (const safetensors_tensor& tensor : checkpoint.tensors())
    if (sd3_vae_decoder_name(tensor.name, single_file))
      tensors.emplace(tensor.name, to_torch(tensor, {.allowed_dtypes = model_weight_dtypes, .finite = true},
                                            safetensors_source(checkpoint, tensor)));
  try {
    load_sd3_autoencoder_weights(model, tensors);
  } catch (const invalid_input& e) {
    fail(path.string(), ": ", e.what());
  }
}

}  // namespace branchgrpo
