#pragma once
// What a model family tells the torch-free readers (the run config, `branchgrpo weights`, `export-lora`, the
// prompt-file checks): one model_spec, a regular struct of names and spans. Each family writes its own in
// <family>/spec.hpp; registry.hpp lists them, and the LibTorch side (tools/app/branchgrpo/app/families/) adds the
// transformer, the loader and the denoiser to the same entry.
//
//   named_model_config  one model.config value: its `weights --config` name, released or not, its text encoder
//                       and default guidance scale
//   model_spec          a family: names, medium, metadata key, named configs, key layouts, LoRA formats and keys,
//                       bench models, the tensor-name patterns that tell its checkpoints apart
//
// Example: flux_spec (flux/spec.hpp) = {.name = "flux", .label = "FLUX", .video = false, .metadata_key =
//   "branchgrpo.flux_config", .configs = {dev, schnell, tiny}, .layouts = {"bfl", "diffusers"}, ...};
//   config_list(flux_spec) == "dev, schnell or tiny"; config_list(flux_spec, random_first) == "tiny, dev or schnell".
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/model_specs/lora_keys.hpp"

namespace branchgrpo {

/// One named shape of a family, as model.config and `branchgrpo weights --config` name it.
struct named_model_config {
  std::string_view name = {};          ///< model.config's value: "dev", "wan-t2v-1.3b"
  std::string_view weights_name = {};  ///< `branchgrpo weights --config`'s value: "dev", "t2v-1.3b"
  bool released = true;  ///< a released model's shape, which needs model.weights (else random init is allowed)
  std::string_view text_encoder = {};  ///< the encoder its prompts must come from ("" for the test shapes)
  double guidance_scale = 1.0;         ///< model.guidance_scale's default under this config
  double guidance_scale_2 = 0;         ///< model.guidance_scale_2's default (a second expert's scale; 0 = none)
};

/// One model family, torch-free (see the file comment).
struct model_spec {
  std::string_view name = {};          ///< "flux": `weights --family`, the family a prompt file was exported for
  std::string_view label = {};         ///< "FLUX": as messages name the family
  std::string_view title = {};         ///< "FLUX.1 transformer": `branchgrpo weights`' report
  bool video = false;                  ///< latents [C, F, h, w] decoded to clips; else [C, h, w] decoded to images
  bool second_expert = false;          ///< a second expert runs at low noise (Wan2.2): model.guidance_scale_2 applies
  std::string_view metadata_key = {};  ///< the __metadata__ key of a model directory's config
  std::span<const named_model_config> configs = {};
  std::span<const std::string_view> layouts = {};        ///< key layouts, the family's native one first
  std::span<const std::string_view> lora_formats = {};   ///< `export-lora --format` values it writes
  std::span<const std::string_view> bench_models = {};   ///< `bench iteration --model` values of its transformers
  const std::set<std::string>& (*patterns)() = nullptr;  ///< name_pattern of every tensor name of any config and layout
  /// The diffusers modules one adapted linear layer (our names) feeds, with the rows of B each takes; throws
  /// invalid_input naming a layer that is not the family's (lora_keys.hpp).
  std::vector<lora_key_part> (*lora_parts)(std::string_view layer, std::int64_t out_rows,
                                           std::int64_t in_features) = nullptr;
  /// Whether an adapted layer's name is the family's (how export-lora tells a checkpoint's family).
  bool (*lora_layer)(std::string_view layer) = nullptr;
  /// The leading modules whose adapters a LoRA export writes to a file each, in `lora_file_family`'s keys with the
  /// module stripped (Wan2.2's experts: diffusers and ComfyUI load one LoRA per expert model); empty: one file.
  std::span<const std::string_view> lora_files = {};
  const model_spec* lora_file_family = nullptr;

  /// The named config `name` (model.config's spelling), or nullptr.
  [[nodiscard]] const named_model_config* find(std::string_view config) const {
    const auto it = std::ranges::find(configs, config, &named_model_config::name);
    return it == configs.end() ? nullptr : &*it;
  }
  /// Whether the family writes LoRA `format` ("kohya").
  [[nodiscard]] bool writes(std::string_view format) const {
    return std::ranges::find(lora_formats, format) != lora_formats.end();
  }
};

/// A tensor name with every all-digit component replaced by '#', so one block's names stand for every block's.
/// Example: "blocks.12.ffn.0.weight" -> "blocks.#.ffn.#.weight"; "img_in.weight" -> "img_in.weight".
inline std::string name_pattern(std::string_view name) {
  std::string out;
  std::size_t start = 0;
  while (start <= name.size()) {
    const std::size_t end = std::min(name.find('.', start), name.size());
    const std::string_view part = name.substr(start, end - start);
    const bool digits = !part.empty() && std::ranges::all_of(part, [](char c) { return c >= '0' && c <= '9'; });
    out += digits ? std::string_view("#") : part;
    if (end == name.size()) break;
    out += '.';
    start = end + 1;
  }
  return out;
}

/// The order a list of configs is written in.
enum class config_order { as_listed, random_first };

/// The family's model.config names as "a, b or c" (`weights_names`: the `weights --config` spelling); with
/// random_first, the configs that need no checkpoint come first.
/// Example: config_list(wan_spec, config_order::random_first) == "wan-tiny, wan-t2v-1.3b or wan-t2v-14b";
///   config_list(wan_spec, config_order::as_listed, true) == "t2v-1.3b, t2v-14b or tiny".
inline std::string config_list(const model_spec& spec, config_order order = config_order::as_listed,
                               bool weights_names = false) {
  std::vector<named_model_config> configs(spec.configs.begin(), spec.configs.end());
  if (order == config_order::random_first)
    std::ranges::stable_partition(configs, [](const named_model_config& c) { return !c.released; });
  std::vector<std::string_view> names;
  for (const named_model_config& c : configs) names.push_back(weights_names ? c.weights_name : c.name);
  return name_list(names);
}

}  // namespace branchgrpo
