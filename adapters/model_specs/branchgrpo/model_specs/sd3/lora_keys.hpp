#pragma once
// Where a LoRA adapter of our SD3.5 transformer (stability names, torch/sd3/transformer.hpp) goes in diffusers'
// SD3Transformer2DModel (torch-free; sd3_spec's lora_parts and lora_layer): the stability -> diffusers names of every
// linear layer with the rows of B each diffusers module takes (the LoRA part of model_specs/sd3/layout.hpp's
// sd3_diffusers_to_stability, read the other way).
//
// A fused qkv W = [Wq; Wk; Wv] with adapter B A splits exactly into A copied to to_q / to_k / to_v and B cut by rows
// (as for FLUX). The modulations that stability orders (shift, scale) where diffusers orders (scale, shift) -- the
// final layer and the last block's pre-only text stream, both 2 x hidden rows -- exchange B's two row halves.
// The patch embedding (x_embedder.proj) is a convolution, not a lora_linear, and has no adapter.
//
// Example: ("joint_blocks.0.x_block.attn.qkv", 60, 20) -> transformer_blocks.0.attn.to_q rows [0, 20), .to_k
//   [20, 40), .to_v [40, 60); ("joint_blocks.1.context_block.attn.proj", 20, 20) -> transformer_blocks.1.attn.
//   to_add_out, all rows.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/lora_keys.hpp"

namespace branchgrpo {

namespace detail {

// stability -> diffusers names of the linear layers outside the blocks (final_layer.adaLN_modulation.1 aside).
inline constexpr lora_module_rename sd3_lora_top_level[] = {
    {"t_embedder.mlp.0", "time_text_embed.timestep_embedder.linear_1"},
    {"t_embedder.mlp.2", "time_text_embed.timestep_embedder.linear_2"},
    {"y_embedder.mlp.0", "time_text_embed.text_embedder.linear_1"},
    {"y_embedder.mlp.2", "time_text_embed.text_embedder.linear_2"},
    {"context_embedder", "context_embedder"},
    {"final_layer.linear", "proj_out"},
};

// Per joint block ("joint_blocks.N." -> "transformer_blocks.N."): the unfused layers.
inline constexpr lora_module_rename sd3_lora_block[] = {
    {"x_block.attn.proj", "attn.to_out.0"},
    {"x_block.attn2.proj", "attn2.to_out.0"},
    {"x_block.mlp.fc1", "ff.net.0.proj"},
    {"x_block.mlp.fc2", "ff.net.2"},
    {"x_block.adaLN_modulation.1", "norm1.linear"},
    {"context_block.attn.proj", "attn.to_add_out"},
    {"context_block.mlp.fc1", "ff_context.net.0.proj"},
    {"context_block.mlp.fc2", "ff_context.net.2"},
    {"context_block.adaLN_modulation.1", "norm1_context.linear"},  // the last block's: swap_halves (2 x hidden)
};

// Per joint block: the fused qkv layers and the diffusers q, k, v they split into.
struct sd3_lora_fused {
  std::string_view ours;
  std::array<std::string_view, 3> qkv;
};
inline constexpr sd3_lora_fused sd3_lora_qkv[] = {
    {"x_block.attn.qkv", {"attn.to_q", "attn.to_k", "attn.to_v"}},
    {"x_block.attn2.qkv", {"attn2.to_q", "attn2.to_k", "attn2.to_v"}},
    {"context_block.attn.qkv", {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"}},
};

}  // namespace detail

/// The diffusers modules of the stability linear layer `layer` whose output has `out_rows` rows and input
/// `in_features` (the model width for every layer inside the blocks).
/// Example: ("joint_blocks.0.x_block.attn.qkv", 60, 20) -> {transformer_blocks.0.attn.to_q rows [0, 20), .to_k
///   [20, 40), .to_v [40, 60)}; ("joint_blocks.1.context_block.adaLN_modulation.1", 40, 20) -> {transformer_blocks.
///   1.norm1_context.linear, all 40 rows, swap_halves} (2 x width: the pre-only block); the same layer of 120 rows ->
///   all rows, no swap; ("final_layer.adaLN_modulation.1", 40, 20) -> {norm_out.linear, swap_halves};
///   ("t_embedder.mlp.0", 20, 256) -> {time_text_embed.timestep_embedder.linear_1, all rows}.
/// @pre `layer` is a linear layer of sd3_transformer (else invalid_input naming it); a qkv has 3 x in_features rows.
inline std::vector<lora_key_part> sd3_lora_diffusers_parts(std::string_view layer, std::int64_t out_rows,
                                                           std::int64_t in_features) {
  const auto whole = [&](std::string name, bool swap = false) {
    return std::vector<lora_key_part>{
        {.name = std::move(name), .row_offset = 0, .rows = out_rows, .swap_halves = swap}};
  };
  for (const auto& entry : detail::sd3_lora_top_level)
    if (layer == entry.ours) return whole(std::string(entry.diffusers));
  if (layer == "final_layer.adaLN_modulation.1") return whole("norm_out.linear", true);
  std::string index, rest;
  if (detail::split_block_name(layer, "joint_blocks.", index, rest)) {
    const std::string block = "transformer_blocks." + index + ".";
    for (const auto& entry : detail::sd3_lora_qkv) {
      if (rest != entry.ours) continue;
      require(out_rows == 3 * in_features, "LoRA layer ", layer, ": ", out_rows,
              " output rows do not hold q, k and v of ", in_features);
      std::vector<lora_key_part> parts;
      for (std::size_t i = 0; i < entry.qkv.size(); ++i)
        parts.push_back({.name = block + std::string(entry.qkv[i]),
                         .row_offset = static_cast<std::int64_t>(i) * in_features,
                         .rows = in_features});
      return parts;
    }
    for (const auto& entry : detail::sd3_lora_block)
      if (rest == entry.ours)
        return whole(block + std::string(entry.diffusers),
                     rest == "context_block.adaLN_modulation.1" && out_rows == 2 * in_features);
  }
  fail("LoRA layer '", layer, "' is not a linear layer of the SD3 transformer (stability names)");
}

/// Whether `layer` is one of SD3's linear layers (stability names), the test export-lora tells a checkpoint's family
/// by. Example: "joint_blocks.0.x_block.attn.qkv" -> true; "double_blocks.0.img_attn.qkv" -> false;
///   "joint_blocks.0.x_block.bogus" -> false.
inline bool sd3_lora_layer(std::string_view layer) {
  for (const auto& entry : detail::sd3_lora_top_level)
    if (layer == entry.ours) return true;
  if (layer == "final_layer.adaLN_modulation.1") return true;
  std::string index, rest;
  if (!detail::split_block_name(layer, "joint_blocks.", index, rest)) return false;
  for (const auto& entry : detail::sd3_lora_qkv)
    if (rest == entry.ours) return true;
  for (const auto& entry : detail::sd3_lora_block)
    if (rest == entry.ours) return true;
  return false;
}

}  // namespace branchgrpo
