#pragma once
// Wan2.1's model_spec (model_specs/spec.hpp): the video family of the moving-shapes models and Wan2.1 T2V.
//   model.config  wan-t2v-1.3b, wan-t2v-14b (released: need model.weights; prompts from umT5; guidance 5, Wan's
//                 sample_guide_scale), wan-tiny (random init allowed)
//   layouts       official (native), diffusers     LoRA formats  diffusers, comfyui
#include <array>
#include <set>
#include <string>
#include <string_view>

#include "branchgrpo/model_specs/spec.hpp"
#include "branchgrpo/model_specs/wan/config.hpp"
#include "branchgrpo/model_specs/wan/layout.hpp"
#include "branchgrpo/model_specs/wan/lora_keys.hpp"

namespace branchgrpo {

inline constexpr std::array wan_named_configs = {
    named_model_config{.name = "wan-t2v-1.3b", .weights_name = "t2v-1.3b", .text_encoder = "umt5", .guidance_scale = 5},
    named_model_config{.name = "wan-t2v-14b", .weights_name = "t2v-14b", .text_encoder = "umt5", .guidance_scale = 5},
    named_model_config{.name = "wan-tiny", .weights_name = "tiny", .released = false}};
inline constexpr std::array<std::string_view, 2> wan_layout_names = {"official", "diffusers"};
inline constexpr std::array<std::string_view, 2> wan_bench_models = {"wan-tiny", "wan"};
inline constexpr std::array<std::string_view, 2> wan_lora_formats = {"diffusers", "comfyui"};

/// The shape of a Wan model.config name: wan-t2v-1.3b, wan-t2v-14b, or wan-tiny = wan_config::tiny() with out_dim =
/// in_dim = 4 (tiny() itself predicts 3 channels from 4 for the reference check; sampling needs them equal).
/// Example: named_wan_config("wan-t2v-14b") == wan_config::t2v_14b(); named_wan_config("wan-tiny").out_dim == 4.
/// @pre `name` is one of wan_named_configs (else invalid_input naming it).
inline wan_config named_wan_config(std::string_view name) {
  if (name == "wan-t2v-14b") return wan_config::t2v_14b();
  if (name == "wan-t2v-1.3b") return wan_config::t2v_1_3b();
  require(name == "wan-tiny", "'", name, "' is not a Wan config (wan-t2v-1.3b, wan-t2v-14b or wan-tiny)");
  wan_config tiny = wan_config::tiny();
  tiny.out_dim = tiny.in_dim;
  return tiny;
}

/// The patterns of every name Wan's configs have, in either layout (the block count aside, every config names its
/// tensors alike).
inline const std::set<std::string>& wan_name_patterns() {
  static const std::set<std::string> patterns = [] {
    std::set<std::string> out;
    for (const wan_layout layout : {wan_layout::official, wan_layout::diffusers})
      for (const wan_tensor_spec& spec : wan_expected_tensors(wan_config::tiny(), layout))
        out.insert(name_pattern(spec.name));
    return out;
  }();
  return patterns;
}

inline constexpr model_spec wan_spec = {.name = "wan",
                                        .label = "Wan",
                                        .title = "Wan2.1 text-to-video transformer",
                                        .video = true,
                                        .metadata_key = "branchgrpo.wan_config",
                                        .configs = wan_named_configs,
                                        .layouts = wan_layout_names,
                                        .lora_formats = wan_lora_formats,
                                        .bench_models = wan_bench_models,
                                        .patterns = wan_name_patterns,
                                        .lora_parts = wan_lora_diffusers_parts,
                                        .lora_layer = wan_lora_layer};

}  // namespace branchgrpo
