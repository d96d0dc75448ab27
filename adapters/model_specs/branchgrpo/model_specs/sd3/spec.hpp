#pragma once
// Stable Diffusion 3.5's model_spec (model_specs/spec.hpp): an image family, the MMDiT-X transformers of SD3.5.
//   model.config  sd3.5-medium, sd3.5-large (released: need model.weights; prompts from CLIP-L + CLIP-G + T5-XXL;
//                 guidance 7, StableDiffusion3Pipeline's default), sd3-tiny (random init allowed)
//   layouts       stability (native), diffusers   LoRA formats  diffusers, kohya, comfyui
// Example: named_sd3_config("sd3.5-large") == sd3_config::large(); sd3_spec.find("sd3.5-medium")->guidance_scale == 7.
#include <array>
#include <set>
#include <string>
#include <string_view>

#include "branchgrpo/model_specs/sd3/config.hpp"
#include "branchgrpo/model_specs/sd3/layout.hpp"
#include "branchgrpo/model_specs/sd3/lora_keys.hpp"
#include "branchgrpo/model_specs/spec.hpp"

namespace branchgrpo {

inline constexpr std::array sd3_named_configs = {
    named_model_config{
        .name = "sd3.5-medium", .weights_name = "medium", .text_encoder = "clip-l+clip-g+t5", .guidance_scale = 7},
    named_model_config{
        .name = "sd3.5-large", .weights_name = "large", .text_encoder = "clip-l+clip-g+t5", .guidance_scale = 7},
    named_model_config{.name = "sd3-tiny", .weights_name = "tiny", .released = false}};
inline constexpr std::array<std::string_view, 2> sd3_layout_names = {"stability", "diffusers"};
inline constexpr std::array<std::string_view, 2> sd3_bench_models = {"sd3-tiny", "sd3"};
inline constexpr std::array<std::string_view, 3> sd3_lora_formats = {"diffusers", "kohya", "comfyui"};

/// The shape of an SD3 model.config name (sd3_named_configs). sd3-tiny is sd3_config::tiny()'s blocks on the
/// shapes data's terms: 3 latent channels in and out (the latents are the images, model.decoder = "pixels") and
/// prompt features 32 wide with pooled vectors of 32 (the shipped models' prompts.safetensors), so that a run of it
/// needs no file but a prompt file.
/// Example: named_sd3_config("sd3.5-medium") == sd3_config::medium(); named_sd3_config("sd3-tiny").in_channels == 3,
///   .context_in == 32, .hidden == sd3_config::tiny().hidden.
/// @pre `name` is one of sd3_named_configs (else invalid_input naming it).
inline sd3_config named_sd3_config(std::string_view name) {
  if (name == "sd3.5-medium") return sd3_config::medium();
  if (name == "sd3.5-large") return sd3_config::large();
  require(name == "sd3-tiny", "'", name, "' is not an SD3 config (sd3.5-medium, sd3.5-large or sd3-tiny)");
  sd3_config tiny = sd3_config::tiny();
  tiny.in_channels = tiny.out_channels = 3;
  tiny.context_in = tiny.pooled_in = 32;
  return tiny;
}

/// The patterns of every name SD3's configs have, in either layout, and the stability names under the released
/// single file's prefix (model.diffusion_model.): medium() has every kind of block (dual, plain, pre only); large()
/// names its tensors as medium's plain blocks, tiny() as medium.
inline const std::set<std::string>& sd3_name_patterns() {
  static const std::set<std::string> patterns = [] {
    std::set<std::string> out;
    for (const sd3_layout layout : {sd3_layout::stability, sd3_layout::diffusers})
      for (const sd3_tensor_spec& spec : sd3_expected_tensors(sd3_config::medium(), layout)) {
        out.insert(name_pattern(spec.name));
        if (layout == sd3_layout::stability) out.insert(name_pattern(std::string(sd3_released_prefix) + spec.name));
      }
    return out;
  }();
  return patterns;
}

inline constexpr model_spec sd3_spec = {.name = "sd3",
                                        .label = "SD3",
                                        .title = "Stable Diffusion 3.5 MMDiT-X transformer",
                                        .video = false,
                                        .metadata_key = "branchgrpo.sd3_config",
                                        .configs = sd3_named_configs,
                                        .layouts = sd3_layout_names,
                                        .lora_formats = sd3_lora_formats,
                                        .bench_models = sd3_bench_models,
                                        .patterns = sd3_name_patterns,
                                        .lora_parts = sd3_lora_diffusers_parts,
                                        .lora_layer = sd3_lora_layer};

}  // namespace branchgrpo
