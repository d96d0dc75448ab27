#pragma once
// Wan2.2 A14B as one torch module: two Wan2.1-architecture transformers (torch/wan/transformer.hpp) registered as
// "high_noise_model" and "low_noise_model" (the official release's folder names), so its parameters are
// "high_noise_model.<official Wan name>" and "low_noise_model.<...>": LoRA on both experts, one training checkpoint
// and one optimizer hold both, and a forward runs the one expert its timestep picks (model_specs/wan22/config.hpp):
// t >= 1000 boundary -> high noise, else low noise, as diffusers' WanPipeline picks transformer / transformer_2.
//
//   wan22_transformer model(wan22_config::tiny());
//   model.forward(x [2, 4, 2, 4, 4], timestep {900, 900}, text [2, 5, 24])   high_noise_model's velocity
//   model.forward(x, {300, 300}, text)                                      low_noise_model's
//   model.forward(x, {900, 300}, text)   invalid_input: a call runs one expert (a batch at one sigma does)
//
// Weights: load_wan22_weights takes one map holding both experts, "high_noise_model.*" / "low_noise_model.*" (official
// Wan names inside) or diffusers' "transformer.*" / "transformer_2.*" (diffusers Wan names inside, renamed by Wan's
// mapping); load_wan22_checkpoint reads it from a release directory (official high_noise_model/ + low_noise_model/, or
// diffusers transformer/ + transformer_2/, each a diffusion_pytorch_model*.safetensors checkpoint, sharded or not) or
// from one safetensors file of prefixed names.
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/wan/layout.hpp"
#include "branchgrpo/model_specs/wan22/config.hpp"
#include "branchgrpo/model_specs/wan22/spec.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/safetensors.hpp"
#include "branchgrpo/torch/wan/transformer.hpp"

namespace branchgrpo {

/// The two experts and the switch between them (see the file comment).
/// Example: wan22_transformer(wan22_config::tiny()).expert_for(875) == high_noise (t >= 875),
///   .expert_for(874.9) == low_noise; named_parameters() has "high_noise_model.patch_embedding.weight", ...,
///   "low_noise_model.head.modulation": twice Wan's tensors.
class wan22_transformer : public torch::nn::Module {
 public:
  explicit wan22_transformer(const wan22_config& config) : config_((validate(config), config)) {
    high_noise_model = register_module("high_noise_model", std::make_shared<wan_transformer>(config.expert));
    low_noise_model = register_module("low_noise_model", std::make_shared<wan_transformer>(config.expert));
  }

  [[nodiscard]] const wan22_config& config() const { return config_; }

  /// The expert that runs at `timestep` (Wan's scale, 1000 sigma): high noise when timestep >= 1000 boundary,
  /// compared in float32 as diffusers compares its float32 timestep with the boundary.
  /// Example: boundary 0.875 -> 1000 and 875 high, 874.99 and 0 low.
  [[nodiscard]] wan22_expert expert_for(double timestep) const {
    return static_cast<float>(timestep) >= static_cast<float>(config_.boundary_timestep()) ? wan22_expert::high_noise
                                                                                           : wan22_expert::low_noise;
  }

  /// One expert's transformer.
  [[nodiscard]] wan_transformer& expert(wan22_expert which) {
    return which == wan22_expert::high_noise ? *high_noise_model : *low_noise_model;
  }

  /// Both experts recompute each block in the backward (wan_transformer::set_gradient_checkpointing).
  void set_gradient_checkpointing(bool on) {
    high_noise_model->set_gradient_checkpointing(on);
    low_noise_model->set_gradient_checkpointing(on);
  }

  /// latents [B, in_dim, F, H, W], timestep [B] (1000 sigma), text [B, L, text_dim] -> the velocity of
  /// expert_for(timestep) (wan_transformer::forward; its checks and shapes).
  /// @pre every row's timestep is on the same side of the boundary (else invalid_input naming the two timesteps and
  ///   the boundary), and finite.
  torch::Tensor forward(const torch::Tensor& latents, const torch::Tensor& timestep, const torch::Tensor& text) {
    require(timestep.defined() && timestep.numel() >= 1, "Wan2.2 needs a timestep per row, got none");
    // One transfer for both ends of the batch (one sync on a GPU).
    const torch::Tensor ends =
        torch::stack({timestep.min(), timestep.max()}).to(torch::kCPU).to(torch::kFloat64).contiguous();
    const double low = ends[0].item<double>(), high = ends[1].item<double>();
    require(std::isfinite(low) && std::isfinite(high), "Wan2.2 timesteps must be finite, got ", low, " to ", high);
    const wan22_expert which = expert_for(high);
    require(expert_for(low) == which, "Wan2.2 batch mixes timesteps ", high, " and ", low,
            " across the expert boundary ", config_.boundary_timestep(), " (boundary ", config_.boundary,
            "): one call runs one expert");
    return expert(which).forward(latents, timestep, text);
  }

  std::shared_ptr<wan_transformer> high_noise_model, low_noise_model;

 private:
  wan22_config config_;
};

// ---- Weights ------------------------------------------------------------------------------------------------

namespace detail {

/// Which naming of the experts a map of prefixed names uses: official (high_noise_model. / low_noise_model.) or
/// diffusers (transformer. / transformer_2.); nullopt when it has neither.
template <class Names>
std::optional<wan_layout> wan22_prefix_layout(const Names& names) {
  bool official = false, diffusers = false;
  for (const auto& name : names) {
    const std::string_view n = name;
    for (const std::string_view p : wan22_official_prefixes) official |= n.starts_with(std::string(p) + ".");
    for (const std::string_view p : wan22_diffusers_prefixes) diffusers |= n.starts_with(std::string(p) + ".");
  }
  require(!(official && diffusers),
          "Wan2.2 checkpoint mixes official (high_noise_model. / low_noise_model.) and diffusers (transformer. / "
          "transformer_2.) expert names");
  if (official) return wan_layout::official;
  if (diffusers) return wan_layout::diffusers;
  return std::nullopt;
}

/// The prefix of `which` expert in `layout`'s naming: "high_noise_model." / "transformer_2." ...
inline std::string wan22_prefix(wan_layout layout, wan22_expert which) {
  const auto& prefixes = layout == wan_layout::official ? wan22_official_prefixes : wan22_diffusers_prefixes;
  return std::string(prefixes[static_cast<std::size_t>(which)]) + ".";
}

/// "no low_noise_model.* or transformer_2.* tensors", what a missing expert's message says.
inline std::string wan22_missing_expert(wan22_expert which) {
  return "Wan2.2 checkpoint has no " + std::string(wan22_expert_label(which)) + " expert (no " +
         wan22_prefix(wan_layout::official, which) + "* or " + wan22_prefix(wan_layout::diffusers, which) +
         "* tensors)";
}

}  // namespace detail

/// Loads `which` expert's tensors of `tensors` (prefixed names, either naming; other tensors are ignored) into the
/// model, converting each to the expert's dtype and device (load_wan_weights in the layout the prefixes imply).
/// Example: {"transformer_2.blocks.0.attn1.to_q.weight", ...} with low_noise -> low_noise_model's
///   blocks.0.self_attn.q.weight, ...; a map without that expert -> "Wan2.2 checkpoint has no low-noise expert (no
///   low_noise_model.* or transformer_2.* tensors)".
/// @pre the expert's adapters are not merged. Errors name the expert: "Wan2.2 high-noise expert (high_noise_model.*):
///   Wan checkpoint (official layout) does not match the config: missing ...".
inline void load_wan22_expert_weights(wan22_transformer& model, wan22_expert which,
                                      const std::map<std::string, torch::Tensor>& tensors) {
  std::vector<std::string_view> names;
  for (const auto& [name, tensor] : tensors) names.push_back(name);
  const std::optional<wan_layout> layout = detail::wan22_prefix_layout(names);
  require(layout.has_value(), detail::wan22_missing_expert(which));
  const std::string prefix = detail::wan22_prefix(*layout, which);
  std::map<std::string, torch::Tensor> inner;
  for (const auto& [name, tensor] : tensors)
    if (name.starts_with(prefix)) inner.emplace(name.substr(prefix.size()), tensor);
  require(!inner.empty(), detail::wan22_missing_expert(which));
  try {
    load_wan_weights(model.expert(which), inner, *layout);
  } catch (const invalid_input& error) {
    fail("Wan2.2 ", wan22_expert_label(which), " expert (", prefix, "*): ", error.what());
  }
}

/// Loads both experts from one map (see the file comment). Every tensor must belong to an expert.
/// Example: diffusers' {"transformer.*", "transformer_2.*"} and the official {"high_noise_model.*",
///   "low_noise_model.*"} of the same weights load identical models; {"transformer.x", "vae.y"} -> "Wan2.2
///   checkpoint: tensor 'vae.y' is in neither expert (transformer.* or transformer_2.*)".
inline void load_wan22_weights(wan22_transformer& model, const std::map<std::string, torch::Tensor>& tensors) {
  std::vector<std::string_view> names;
  for (const auto& [name, tensor] : tensors) names.push_back(name);
  const std::optional<wan_layout> layout = detail::wan22_prefix_layout(names);
  require(layout.has_value(), detail::wan22_missing_expert(wan22_expert::high_noise));
  const std::string high = detail::wan22_prefix(*layout, wan22_expert::high_noise);
  const std::string low = detail::wan22_prefix(*layout, wan22_expert::low_noise);
  for (const std::string_view name : names)
    require(name.starts_with(high) || name.starts_with(low), "Wan2.2 checkpoint: tensor '", name,
            "' is in neither expert (", high, "* or ", low, "*)");
  for (const wan22_expert which : {wan22_expert::high_noise, wan22_expert::low_noise})
    load_wan22_expert_weights(model, which, tensors);
}

namespace detail {

/// The checkpoint of one expert folder: its diffusion_pytorch_model.safetensors.index.json (sharded, as both
/// releases ship it) or diffusion_pytorch_model.safetensors.
inline std::filesystem::path wan22_folder_checkpoint(const std::filesystem::path& folder) {
  const std::filesystem::path index = folder / "diffusion_pytorch_model.safetensors.index.json";
  const std::filesystem::path single = folder / "diffusion_pytorch_model.safetensors";
  if (std::filesystem::is_regular_file(index)) return index;
  require(std::filesystem::is_regular_file(single), folder.string(),
          ": no diffusion_pytorch_model.safetensors.index.json or diffusion_pytorch_model.safetensors");
  return single;
}

/// The expert folder of `which` in a release directory: high_noise_model/ / low_noise_model/ (official) or
/// transformer/ / transformer_2/ (diffusers), with its layout; one line naming the missing folder otherwise.
inline std::pair<std::filesystem::path, wan_layout> wan22_expert_folder(const std::filesystem::path& dir,
                                                                        wan22_expert which) {
  const auto has = [&](const auto& names) {
    return std::filesystem::is_directory(dir / names[0]) || std::filesystem::is_directory(dir / names[1]);
  };
  const bool official = has(wan22_official_prefixes), diffusers = has(wan22_diffusers_prefixes);
  require(official || diffusers, dir.string(),
          ": neither high_noise_model/ and low_noise_model/ (the official Wan2.2 release) nor transformer/ and "
          "transformer_2/ (diffusers) folders");
  const wan_layout layout = official ? wan_layout::official : wan_layout::diffusers;
  const auto& names = official ? wan22_official_prefixes : wan22_diffusers_prefixes;
  const std::filesystem::path folder = dir / names[static_cast<std::size_t>(which)];
  require(std::filesystem::is_directory(folder), dir.string(), ": no ", names[static_cast<std::size_t>(which)],
          "/ folder (the ",
          official ? "official Wan2.2 release has high_noise_model/ and low_noise_model/"
                   : "diffusers layout has transformer/ and transformer_2/",
          ")");
  return {folder, layout};
}

}  // namespace detail

/// `which` expert's tensors, prefixed as load_wan22_weights reads them, from a release directory (its expert folder,
/// names prefixed here) or one safetensors file of prefixed names (only that expert's tensors are copied). One
/// expert at a time keeps the host copy of A14B at one expert (28 GB in bfloat16, not 57).
/// Example: ("Wan2.2-T2V-A14B", low_noise, {.dtype = kBFloat16}) -> {"low_noise_model.blocks.0.self_attn.q.weight",
///   ...} from low_noise_model/diffusion_pytorch_model.safetensors.index.json; a directory without that folder ->
///   "<dir>: no low_noise_model/ folder (...)".
inline std::map<std::string, torch::Tensor> load_wan22_checkpoint(const std::filesystem::path& path, wan22_expert which,
                                                                  const safetensors_load_options& options = {}) {
  if (std::filesystem::is_directory(path)) {
    const auto [folder, layout] = detail::wan22_expert_folder(path, which);
    const std::string prefix = detail::wan22_prefix(layout, which);
    std::map<std::string, torch::Tensor> out;
    for (auto& [name, tensor] : load_safetensors(detail::wan22_folder_checkpoint(folder), options))
      out.emplace(prefix + name, std::move(tensor));
    return out;
  }
  const safetensors_checkpoint checkpoint(path);
  std::vector<const safetensors_tensor*> mine;
  for (const safetensors_tensor& tensor : checkpoint.tensors())
    for (const wan_layout layout : {wan_layout::official, wan_layout::diffusers})
      if (std::string_view(tensor.name).starts_with(detail::wan22_prefix(layout, which))) mine.push_back(&tensor);
  for (const safetensors_tensor* tensor : mine)
    detail::check_load_dtype(*tensor, options, safetensors_source(checkpoint, *tensor));
  std::map<std::string, torch::Tensor> out;
  for (const safetensors_tensor* tensor : mine)
    out.emplace(tensor->name, to_torch(*tensor, options, safetensors_source(checkpoint, *tensor)));
  return out;
}

/// Both experts' tensors (load_wan22_checkpoint of each), one map for load_wan22_weights.
inline std::map<std::string, torch::Tensor> load_wan22_checkpoint(const std::filesystem::path& path,
                                                                  const safetensors_load_options& options = {}) {
  std::map<std::string, torch::Tensor> out = load_wan22_checkpoint(path, wan22_expert::high_noise, options);
  out.merge(load_wan22_checkpoint(path, wan22_expert::low_noise, options));
  return out;
}

}  // namespace branchgrpo
