#pragma once
// Where a LoRA adapter of our FLUX transformer (bfl names, torch/flux/transformer.hpp) goes (torch-free; flux_spec's
// lora_parts and lora_layer) in diffusers'
// FluxTransformer2DModel: the bfl -> diffusers module names of every linear layer (the LoRA part of
// model_specs/flux/layout.hpp's flux_diffusers_to_bfl, read the other way), with the rows of the fused projections.
//
// A fused base W = [Wq; Wk; Wv] with adapter B A: (W + s B A) x = [Wq + s Bq A; Wk + s Bk A; Wv + s Bv A] x, so the
// exact split is A copied to to_q / to_k / to_v and B cut by rows (diffusers' own kohya converter splits the same
// way). final_layer.adaLN_modulation.1 holds (shift, scale) where diffusers' norm_out.linear holds (scale, shift):
// B's two row halves are exchanged, A stays.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/lora_keys.hpp"

namespace branchgrpo {

namespace detail {

// bfl -> diffusers names of the layers outside the blocks.
inline constexpr lora_module_rename flux_lora_top_level[] = {
    {"img_in", "x_embedder"},
    {"time_in.in_layer", "time_text_embed.timestep_embedder.linear_1"},
    {"time_in.out_layer", "time_text_embed.timestep_embedder.linear_2"},
    {"vector_in.in_layer", "time_text_embed.text_embedder.linear_1"},
    {"vector_in.out_layer", "time_text_embed.text_embedder.linear_2"},
    {"guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1"},
    {"guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2"},
    {"txt_in", "context_embedder"},
    {"final_layer.linear", "proj_out"},
};

// Per double block ("double_blocks.N." -> "transformer_blocks.N."): the unfused layers; the two qkv are split.
inline constexpr lora_module_rename flux_lora_double_block[] = {
    {"img_mod.lin", "norm1.linear"},        {"txt_mod.lin", "norm1_context.linear"}, {"img_attn.proj", "attn.to_out.0"},
    {"txt_attn.proj", "attn.to_add_out"},   {"img_mlp.0", "ff.net.0.proj"},          {"img_mlp.2", "ff.net.2"},
    {"txt_mlp.0", "ff_context.net.0.proj"}, {"txt_mlp.2", "ff_context.net.2"},
};

// Per single block ("single_blocks.N." -> "single_transformer_blocks.N."); linear1 is split.
inline constexpr lora_module_rename flux_lora_single_block[] = {
    {"linear2", "proj_out"},
    {"modulation.lin", "norm.linear"},
};

}  // namespace detail

/// The diffusers modules of the bfl linear layer `layer` whose output has `out_rows` rows, `hidden` the model width.
/// Example: ("double_blocks.0.img_attn.qkv", 192, 64) -> {transformer_blocks.0.attn.to_q rows [0, 64),
///   .to_k [64, 128), .to_v [128, 192)}; ("single_blocks.1.linear1", 448, 64) -> to_q, to_k, to_v of 64 rows,
///   then single_transformer_blocks.1.proj_mlp rows [192, 448); ("final_layer.adaLN_modulation.1", 128, 64) ->
///   {norm_out.linear, all 128 rows, swap_halves}; ("img_in", 64, 64) -> {x_embedder, all rows}.
/// @pre `layer` is a linear layer of flux_transformer (else invalid_input naming it); out_rows fits it.
inline std::vector<lora_key_part> flux_lora_diffusers_parts(std::string_view layer, std::int64_t out_rows,
                                                            std::int64_t hidden) {
  const auto whole = [&](std::string name) {
    return std::vector<lora_key_part>{{.name = std::move(name), .row_offset = 0, .rows = out_rows}};
  };
  // q, k, v of `hidden` rows each, then (single blocks) the MLP input with the remaining rows.
  const auto split = [&](const std::string& prefix, std::vector<std::string_view> names) {
    const bool with_mlp = names.size() == 4;
    require(with_mlp ? out_rows > 3 * hidden : out_rows == 3 * hidden, "LoRA layer ", layer, ": ", out_rows,
            " output rows do not hold q, k and v of ", hidden, with_mlp ? " and the MLP input" : "");
    std::vector<lora_key_part> parts;
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < names.size(); ++i) {
      const std::int64_t rows = i < 3 ? hidden : out_rows - 3 * hidden;
      parts.push_back({.name = prefix + std::string(names[i]), .row_offset = offset, .rows = rows});
      offset += rows;
    }
    return parts;
  };
  for (const auto& entry : detail::flux_lora_top_level)
    if (layer == entry.ours) return whole(std::string(entry.diffusers));
  if (layer == "final_layer.adaLN_modulation.1")
    return {{.name = "norm_out.linear", .row_offset = 0, .rows = out_rows, .swap_halves = true}};
  std::string index, rest;
  if (detail::split_block_name(layer, "double_blocks.", index, rest)) {
    const std::string block = "transformer_blocks." + index + ".";
    if (rest == "img_attn.qkv") return split(block, {"attn.to_q", "attn.to_k", "attn.to_v"});
    if (rest == "txt_attn.qkv") return split(block, {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"});
    for (const auto& entry : detail::flux_lora_double_block)
      if (rest == entry.ours) return whole(block + std::string(entry.diffusers));
  } else if (detail::split_block_name(layer, "single_blocks.", index, rest)) {
    const std::string block = "single_transformer_blocks." + index + ".";
    if (rest == "linear1") return split(block, {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"});
    for (const auto& entry : detail::flux_lora_single_block)
      if (rest == entry.ours) return whole(block + std::string(entry.diffusers));
  }
  fail("LoRA layer '", layer, "' is not a linear layer of the FLUX transformer (bfl names)");
}

/// Whether `layer` is named as one of FLUX's (bfl names: a block or a top-level module), the test export-lora tells
/// a checkpoint's family by. Example: "double_blocks.0.img_attn.qkv" -> true; "blocks.0.self_attn.q" -> false.
inline bool flux_lora_layer(std::string_view layer) {
  constexpr std::string_view roots[] = {"double_blocks.", "single_blocks.", "img_in",       "txt_in",
                                        "time_in.",       "vector_in.",     "guidance_in.", "final_layer."};
  for (const std::string_view root : roots)
    if (layer.starts_with(root)) return true;
  return false;
}

}  // namespace branchgrpo
