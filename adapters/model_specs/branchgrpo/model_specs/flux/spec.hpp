#pragma once
// FLUX.1's model_spec (model_specs/spec.hpp): the image family of the shapes models and FLUX.1-dev / -schnell.
//   model.config  dev, schnell (released: need model.weights; prompts from T5 + CLIP), tiny (random init allowed)
//   layouts       bfl (native), diffusers          LoRA formats  diffusers, kohya, comfyui
#include <array>
#include <set>
#include <string>
#include <string_view>

#include "branchgrpo/model_specs/flux/config.hpp"
#include "branchgrpo/model_specs/flux/layout.hpp"
#include "branchgrpo/model_specs/flux/lora_keys.hpp"
#include "branchgrpo/model_specs/spec.hpp"

namespace branchgrpo {

inline constexpr std::array flux_named_configs = {
    named_model_config{.name = "dev", .weights_name = "dev", .text_encoder = "t5+clip"},
    named_model_config{.name = "schnell", .weights_name = "schnell", .text_encoder = "t5+clip"},
    named_model_config{.name = "tiny", .weights_name = "tiny", .released = false}};
inline constexpr std::array<std::string_view, 2> flux_layout_names = {"bfl", "diffusers"};
inline constexpr std::array<std::string_view, 2> flux_bench_models = {"flux-tiny", "flux"};
inline constexpr std::array<std::string_view, 3> flux_lora_formats = {"diffusers", "kohya", "comfyui"};

/// The shape of a FLUX model.config name (flux_named_configs). Example: named_flux_config("schnell") ==
///   flux_config::schnell().
/// @pre `name` is one of flux_named_configs (else invalid_input naming it).
inline flux_config named_flux_config(std::string_view name) {
  if (name == "dev") return flux_config::dev();
  if (name == "schnell") return flux_config::schnell();
  require(name == "tiny", "'", name, "' is not a FLUX config (dev, schnell or tiny)");
  return flux_config::tiny();
}

/// The patterns of every name FLUX's configs have, in either layout (the configs differ in sizes and optional
/// tensors, e.g. dev's guidance_in, not in how a block's tensors are named).
inline const std::set<std::string>& flux_name_patterns() {
  static const std::set<std::string> patterns = [] {
    std::set<std::string> out;
    for (const flux_config& config : {flux_config::dev(), flux_config::schnell(), flux_config::tiny()})
      for (const flux_layout layout : {flux_layout::bfl, flux_layout::diffusers})
        for (const flux_tensor_spec& spec : flux_expected_tensors(config, layout)) out.insert(name_pattern(spec.name));
    return out;
  }();
  return patterns;
}

inline constexpr model_spec flux_spec = {.name = "flux",
                                         .label = "FLUX",
                                         .title = "FLUX.1 transformer",
                                         .video = false,
                                         .metadata_key = "branchgrpo.flux_config",
                                         .configs = flux_named_configs,
                                         .layouts = flux_layout_names,
                                         .lora_formats = flux_lora_formats,
                                         .bench_models = flux_bench_models,
                                         .patterns = flux_name_patterns,
                                         .lora_parts = flux_lora_diffusers_parts,
                                         .lora_layer = flux_lora_layer};

}  // namespace branchgrpo
