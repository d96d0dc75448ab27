#pragma once
// Wan2.2's model_spec (model_specs/spec.hpp): two Wan2.1-architecture experts in one transformer
// (torch/wan22/transformer.hpp), whose tensor and LoRA layer names are the Wan names prefixed by the expert.
//   model.config   wan2.2-t2v-a14b (released: needs model.weights; prompts from umT5; guidance 4 on the
//                  high-noise expert and 3 on the low-noise one, Wan2.2's), wan22-tiny (random init allowed)
//   layouts        official: "high_noise_model.<official Wan name>", "low_noise_model.<...>" (the release's folder
//                  names); diffusers: "transformer.<diffusers Wan name>" (high noise), "transformer_2.<...>" (low)
//   LoRA formats   diffusers, comfyui: both load one expert per file (diffusers' WanPipeline.load_lora_weights reads
//                  "transformer.*" keys into transformer, or into transformer_2 with load_into_transformer_2=True;
//                  ComfyUI loads a LoRA per expert model), so an export writes one file per expert (lora_files):
//                  the adapters of wan22_lora_expert(layer) with the prefix stripped, in Wan's keys (wan_spec).
// Example: wan22_lora_expert("low_noise_model.blocks.3.self_attn.q") == {low_noise_model, "blocks.3.self_attn.q"};
//   wan22_lora_parts of it -> {"blocks.3.attn1.to_q", rows [0, out)} (Wan's, in the low-noise expert's file).
#include <array>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/spec.hpp"
#include "branchgrpo/model_specs/wan/layout.hpp"
#include "branchgrpo/model_specs/wan/lora_keys.hpp"
#include "branchgrpo/model_specs/wan/spec.hpp"
#include "branchgrpo/model_specs/wan22/config.hpp"

namespace branchgrpo {

/// The two experts, high noise first (the order of wan22_expert_prefixes).
enum class wan22_expert { high_noise = 0, low_noise = 1 };

/// The module names of the experts in our (official) layout and in diffusers' pipeline, by wan22_expert.
inline constexpr std::array<std::string_view, 2> wan22_official_prefixes = {"high_noise_model", "low_noise_model"};
inline constexpr std::array<std::string_view, 2> wan22_diffusers_prefixes = {"transformer", "transformer_2"};

/// "high-noise" / "low-noise", as messages name an expert.
inline std::string_view wan22_expert_label(wan22_expert expert) {
  return expert == wan22_expert::high_noise ? "high-noise" : "low-noise";
}

inline constexpr std::array wan22_named_configs = {
    named_model_config{
        .name = "wan2.2-t2v-a14b",
        .weights_name = "t2v-a14b",
        .text_encoder = "umt5",
        .guidance_scale = 4,     // the high-noise expert's (Wan2.2's t2v_A14B sample_guide_scale (3.0, 4.0))
        .guidance_scale_2 = 3},  // the low-noise expert's
    named_model_config{.name = "wan22-tiny", .weights_name = "tiny", .released = false}};
inline constexpr std::array<std::string_view, 2> wan22_layout_names = {"official", "diffusers"};
inline constexpr std::array<std::string_view, 2> wan22_bench_models = {"wan22-tiny", "wan22"};
inline constexpr std::array<std::string_view, 2> wan22_lora_formats = {"diffusers", "comfyui"};

/// The shape of a Wan2.2 model.config name. wan22-tiny is wan22_config::tiny()'s experts on the moving-shapes data's
/// terms: 3 latent channels in and out (the latents are the frames, model.decoder = "pixels") and text features
/// 32 wide (the shipped video model's prompts.safetensors), so that a run of it needs no file but a prompt file.
/// Example: named_wan22_config("wan2.2-t2v-a14b") == wan22_config::t2v_a14b();
///   named_wan22_config("wan22-tiny").expert.in_dim == 3, .expert.text_dim == 32, .boundary == 0.875.
/// @pre `name` is one of wan22_named_configs (else invalid_input naming it).
inline wan22_config named_wan22_config(std::string_view name) {
  if (name == "wan2.2-t2v-a14b") return wan22_config::t2v_a14b();
  require(name == "wan22-tiny", "'", name, "' is not a Wan2.2 config (wan2.2-t2v-a14b or wan22-tiny)");
  wan22_config tiny = wan22_config::tiny();
  tiny.expert.in_dim = tiny.expert.out_dim = 3;
  tiny.expert.text_dim = 32;
  return tiny;
}

/// An expert's layer: which expert, and the Wan layer name inside it.
struct wan22_layer {
  wan22_expert expert;
  std::string_view inner;  ///< the Wan layer name inside the expert (a view of the argument)
};

/// Which expert an adapted layer (our names: "<expert>.<official Wan layer>") belongs to, and its Wan name; nullopt
/// when it has no expert prefix.
/// Example: "high_noise_model.head.head" -> {high_noise, "head.head"}; "blocks.0.ffn.0" -> nullopt.
inline std::optional<wan22_layer> wan22_lora_expert(std::string_view layer) {
  for (std::size_t e = 0; e < wan22_official_prefixes.size(); ++e) {
    const std::string_view prefix = wan22_official_prefixes[e];
    if (layer.size() > prefix.size() && layer.starts_with(prefix) && layer[prefix.size()] == '.')
      return wan22_layer{static_cast<wan22_expert>(e), layer.substr(prefix.size() + 1)};
  }
  return std::nullopt;
}

/// Wan's diffusers parts of an expert's layer, the expert prefix stripped (model_spec::lora_parts). The parts name
/// the module inside its expert's own file (see the file comment), so the two experts' parts of one block coincide.
/// Example: ("high_noise_model.blocks.0.ffn.2", 40, 56) -> {blocks.0.ffn.net.2, rows [0, 40)}.
/// @pre `layer` is "<high_noise_model|low_noise_model>.<a Wan linear layer>" (else invalid_input naming it).
inline std::vector<lora_key_part> wan22_lora_parts(std::string_view layer, std::int64_t out_rows,
                                                   std::int64_t in_features) {
  const std::optional<wan22_layer> split = wan22_lora_expert(layer);
  require(split.has_value(), "LoRA layer '", layer,
          "' is not a Wan2.2 layer (names start with high_noise_model. or low_noise_model.)");
  return wan_lora_diffusers_parts(split->inner, out_rows, in_features);
}

/// Whether `layer` is an expert's Wan linear layer. Example: "low_noise_model.blocks.1.cross_attn.k" -> true;
///   "blocks.1.cross_attn.k" -> false (a Wan2.1 name).
inline bool wan22_lora_layer(std::string_view layer) {
  const std::optional<wan22_layer> split = wan22_lora_expert(layer);
  return split.has_value() && wan_lora_layer(split->inner);
}

/// The patterns of every name of Wan2.2's checkpoints: Wan's official patterns under both official prefixes and
/// its diffusers patterns under both diffusers prefixes ("transformer_2.blocks.#.attn1.to_q.weight").
inline const std::set<std::string>& wan22_name_patterns() {
  static const std::set<std::string> patterns = [] {
    std::set<std::string> out;
    for (const auto& [layout, prefixes] : {std::pair{wan_layout::official, wan22_official_prefixes},
                                           std::pair{wan_layout::diffusers, wan22_diffusers_prefixes}})
      for (const std::string_view prefix : prefixes)
        for (const wan_tensor_spec& spec : wan_expected_tensors(wan_config::tiny(), layout))
          out.insert(name_pattern(std::string(prefix) + "." + spec.name));
    return out;
  }();
  return patterns;
}

inline constexpr model_spec wan22_spec = {.name = "wan22",
                                          .label = "Wan2.2",
                                          .title = "Wan2.2 text-to-video transformer (two experts)",
                                          .video = true,
                                          .second_expert = true,
                                          .metadata_key = "branchgrpo.wan22_config",
                                          .configs = wan22_named_configs,
                                          .layouts = wan22_layout_names,
                                          .lora_formats = wan22_lora_formats,
                                          .bench_models = wan22_bench_models,
                                          .patterns = wan22_name_patterns,
                                          .lora_parts = wan22_lora_parts,
                                          .lora_layer = wan22_lora_layer,
                                          .lora_files = wan22_official_prefixes,
                                          .lora_file_family = &wan_spec};

}  // namespace branchgrpo
