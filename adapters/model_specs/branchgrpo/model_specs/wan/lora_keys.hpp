#pragma once
// Where a LoRA adapter of our Wan2.1 transformer (official names, torch/wan/transformer.hpp) goes in diffusers'
// WanTransformer3DModel (torch-free; wan_spec's lora_parts and lora_layer): the official -> diffusers names of every
// linear layer (the LoRA part of model_specs/wan/layout.hpp's wan_diffusers_to_official, read the other way). Nothing
// is fused or reordered in either layout, so every adapter keeps its A and B and only the module path changes.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/lora_keys.hpp"

namespace branchgrpo {

namespace detail {

inline constexpr lora_module_rename wan_lora_top_level[] = {
    {"text_embedding.0", "condition_embedder.text_embedder.linear_1"},
    {"text_embedding.2", "condition_embedder.text_embedder.linear_2"},
    {"time_embedding.0", "condition_embedder.time_embedder.linear_1"},
    {"time_embedding.2", "condition_embedder.time_embedder.linear_2"},
    {"time_projection.1", "condition_embedder.time_proj"},
    {"head.head", "proj_out"},
};
// Per block ("blocks.N." in both layouts).
inline constexpr lora_module_rename wan_lora_block[] = {
    {"self_attn.q", "attn1.to_q"},  {"self_attn.k", "attn1.to_k"},
    {"self_attn.v", "attn1.to_v"},  {"self_attn.o", "attn1.to_out.0"},
    {"cross_attn.q", "attn2.to_q"}, {"cross_attn.k", "attn2.to_k"},
    {"cross_attn.v", "attn2.to_v"}, {"cross_attn.o", "attn2.to_out.0"},
    {"ffn.0", "ffn.net.0.proj"},    {"ffn.2", "ffn.net.2"},
};

}  // namespace detail

/// The diffusers module of the official linear layer `layer`.
/// Example: "blocks.3.self_attn.o" -> "blocks.3.attn1.to_out.0", "blocks.0.ffn.0" -> "blocks.0.ffn.net.0.proj",
///   "time_projection.1" -> "condition_embedder.time_proj", "head.head" -> "proj_out".
/// @pre `layer` is a linear layer of wan_transformer (else invalid_input naming it).
inline std::string wan_lora_diffusers_name(std::string_view layer) {
  for (const auto& entry : detail::wan_lora_top_level)
    if (layer == entry.ours) return std::string(entry.diffusers);
  std::string index, rest;
  if (detail::split_block_name(layer, "blocks.", index, rest))
    for (const auto& entry : detail::wan_lora_block)
      if (rest == entry.ours) return "blocks." + index + "." + std::string(entry.diffusers);
  fail("LoRA layer '", layer, "' is not a linear layer of the Wan transformer (official names)");
}

/// wan_lora_diffusers_name as the one part every rows of B go to (model_spec::lora_parts).
/// Example: ("blocks.0.ffn.2", 40, 56) -> {blocks.0.ffn.net.2, rows [0, 40)}.
inline std::vector<lora_key_part> wan_lora_diffusers_parts(std::string_view layer, std::int64_t out_rows,
                                                           std::int64_t /*in_features*/) {
  return {{.name = wan_lora_diffusers_name(layer), .row_offset = 0, .rows = out_rows}};
}

/// Whether `layer` is one of Wan's linear layers (official names). Example: "blocks.0.self_attn.q" -> true.
inline bool wan_lora_layer(std::string_view layer) {
  for (const auto& entry : detail::wan_lora_top_level)
    if (layer == entry.ours) return true;
  std::string index, rest;
  if (detail::split_block_name(layer, "blocks.", index, rest))
    for (const auto& entry : detail::wan_lora_block)
      if (rest == entry.ours) return true;
  return false;
}

}  // namespace branchgrpo
