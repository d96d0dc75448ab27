#pragma once
// The two weight layouts SD3.5 transformer checkpoints come in, as names and shapes (torch-free):
//   stability  Stability AI's reference code (MMDiTX) and the released single-file sd3.5_medium.safetensors /
//              sd3.5_large.safetensors with their prefix "model.diffusion_model." removed: pos_embed,
//              x_embedder.proj (the patch conv), t_embedder.mlp.0/2, y_embedder.mlp.0/2, context_embedder,
//              joint_blocks.N.{context_block,x_block}.attn.{qkv (fused q; k; v), ln_q, ln_k, proj},
//              x_block.attn2.* (dual-attention blocks), .mlp.fc1/fc2, .adaLN_modulation.1, final_layer.linear and
//              final_layer.adaLN_modulation.1 ordered (shift, scale).
//   diffusers  SD3Transformer2DModel (transformer/diffusion_pytorch_model*.safetensors): pos_embed.pos_embed,
//              pos_embed.proj, time_text_embed.*, split attn.to_q/to_k/to_v (add_*_proj for the text),
//              norm_q / norm_added_q, to_out.0 / to_add_out, ff / ff_context, norm1.linear / norm1_context.linear,
//              norm_out.linear ordered (scale, shift).
// The last block's text stream is "pre only": it feeds the joint attention (qkv, ln_q, ln_k) and nothing else, so it
// has no proj, no MLP, and a modulation of 2 x hidden, (shift, scale) in stability's layout and (scale, shift) in
// diffusers' (its norm1_context is an AdaLayerNormContinuous). Dual-attention blocks modulate with 9 x hidden.
// The native model (torch/sd3/transformer.hpp) uses the stability names; sd3_diffusers_to_stability(config) maps.
//
// Example: sd3_config::medium() -> 665 stability tensors, 909 diffusers tensors; large() -> 923 and 1227.
#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <ranges>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/flux/layout.hpp"  // flux_tensor_spec, flux_key_report, compare_tensors, flux_merge
#include "branchgrpo/model_specs/sd3/config.hpp"

namespace branchgrpo {

enum class sd3_layout { stability, diffusers };

/// "stability" or "diffusers".
inline std::string_view layout_name(sd3_layout layout) {
  return layout == sd3_layout::stability ? "stability" : "diffusers";
}

/// Example: parse_sd3_layout("diffusers") == sd3_layout::diffusers; "bfl" -> invalid_input
///   "unknown SD3 layout 'bfl' (expected stability or diffusers)".
inline sd3_layout parse_sd3_layout(std::string_view name) {
  if (name == "stability") return sd3_layout::stability;
  if (name == "diffusers") return sd3_layout::diffusers;
  fail("unknown SD3 layout '", name, "' (expected stability or diffusers)");
}

/// A tensor name with its shape (the same record as FLUX's).
using sd3_tensor_spec = flux_tensor_spec;
/// What a checkpoint lacks or has in excess (the same report as FLUX's).
using sd3_key_report = flux_key_report;
/// How one stability tensor is built from diffusers tensors: copy, concat (fused qkv = [q; k; v] along dim 0) or
/// swap_halves ((scale, shift) -> (shift, scale)); the same as FLUX's.
using sd3_merge = flux_merge;
/// One stability tensor <- its diffusers source(s) and merge (the same record as FLUX's).
using sd3_key_mapping = flux_key_mapping;

/// The prefix of the transformer's tensors in the released single-file checkpoints (which also hold the VAE as
/// first_stage_model.* and, in some, the text encoders as text_encoders.*).
inline constexpr std::string_view sd3_released_prefix = "model.diffusion_model.";

namespace detail {

/// One stability tensor with its shape and its diffusers source(s).
struct sd3_tensor_row {
  sd3_tensor_spec stability;
  std::vector<std::string> sources;
  sd3_merge merge = sd3_merge::copy;
};

/// Builds the rows of one checkpoint in the native module's order.
struct sd3_rows {
  std::vector<sd3_tensor_row> rows;

  void tensor(const std::string& name, std::vector<std::int64_t> shape, const std::string& source,
              sd3_merge merge = sd3_merge::copy) {
    rows.push_back({{name, std::move(shape)}, {source}, merge});
  }
  /// name.weight [out, in] and name.bias [out] <- source.weight / source.bias.
  void linear(const std::string& name, const std::string& source, std::int64_t in, std::int64_t out,
              sd3_merge merge = sd3_merge::copy) {
    tensor(name + ".weight", {out, in}, source + ".weight", merge);
    tensor(name + ".bias", {out}, source + ".bias", merge);
  }
  /// name.weight [3h, h] and name.bias [3h] <- concat of the three sources' (q, k, v).
  void fused_qkv(const std::string& name, const std::string& prefix, const std::array<std::string_view, 3>& qkv,
                 std::int64_t h) {
    for (const auto& [suffix, shape] : {std::pair{".weight", std::vector<std::int64_t>{3 * h, h}},
                                        std::pair{".bias", std::vector<std::int64_t>{3 * h}}}) {
      sd3_tensor_row row{{name + suffix, shape}, {}, sd3_merge::concat};
      for (const std::string_view part : qkv) row.sources.push_back(prefix + std::string(part) + suffix);
      rows.push_back(std::move(row));
    }
  }
};

/// The diffusers names of one attention: its q, k, v projections, q / k norms and output projection.
struct sd3_attention_names {
  std::array<std::string_view, 3> qkv;
  std::string_view norm_q, norm_k, out;
};

/// One attention (stability "<p>attn.", "<p>attn2.") of a stream; `out` empty: pre only (no output projection).
inline void add_sd3_attention(sd3_rows& r, const sd3_config& c, const std::string& stability, const std::string& block,
                              const sd3_attention_names& names) {
  r.fused_qkv(stability + "qkv", block, names.qkv, c.hidden);
  if (c.qk_norm) {
    r.tensor(stability + "ln_q.weight", {c.head_dim()}, block + std::string(names.norm_q) + ".weight");
    r.tensor(stability + "ln_k.weight", {c.head_dim()}, block + std::string(names.norm_k) + ".weight");
  }
  if (!names.out.empty()) r.linear(stability + "proj", block + std::string(names.out), c.hidden, c.hidden);
}

/// Joint block i: its text stream (context_block), then its image stream (x_block).
inline void add_sd3_block(sd3_rows& r, const sd3_config& c, std::int64_t i) {
  const std::int64_t h = c.hidden, m = c.mlp_hidden();
  const std::string p = indexed("joint_blocks", i), q = indexed("transformer_blocks", i);
  const bool pre_only = i == c.depth - 1;
  const std::string ctx = p + "context_block.";
  add_sd3_attention(r, c, ctx + "attn.", q,
                    {{"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"},
                     "attn.norm_added_q",
                     "attn.norm_added_k",
                     pre_only ? "" : "attn.to_add_out"});
  if (!pre_only) {
    r.linear(ctx + "mlp.fc1", q + "ff_context.net.0.proj", h, m);
    r.linear(ctx + "mlp.fc2", q + "ff_context.net.2", m, h);
  }
  r.linear(ctx + "adaLN_modulation.1", q + "norm1_context.linear", h, (pre_only ? 2 : 6) * h,
           pre_only ? sd3_merge::swap_halves : sd3_merge::copy);
  const std::string x = p + "x_block.";
  add_sd3_attention(r, c, x + "attn.", q,
                    {{"attn.to_q", "attn.to_k", "attn.to_v"}, "attn.norm_q", "attn.norm_k", "attn.to_out.0"});
  if (c.dual_attention(i))
    add_sd3_attention(r, c, x + "attn2.", q,
                      {{"attn2.to_q", "attn2.to_k", "attn2.to_v"}, "attn2.norm_q", "attn2.norm_k", "attn2.to_out.0"});
  r.linear(x + "mlp.fc1", q + "ff.net.0.proj", h, m);
  r.linear(x + "mlp.fc2", q + "ff.net.2", m, h);
  r.linear(x + "adaLN_modulation.1", q + "norm1.linear", h, (c.dual_attention(i) ? 9 : 6) * h);
}

/// Every stability tensor of `c` in the native module's order (its own pos_embed first, then its children in
/// registration order), with the diffusers sources.
inline std::vector<sd3_tensor_row> sd3_tensor_rows(const sd3_config& c) {
  validate(c);
  const std::int64_t h = c.hidden, grid = c.pos_embed_max_size;
  sd3_rows r;
  r.tensor("pos_embed", {1, grid * grid, h}, "pos_embed.pos_embed");
  r.tensor("x_embedder.proj.weight", {h, c.in_channels, c.patch, c.patch}, "pos_embed.proj.weight");
  r.tensor("x_embedder.proj.bias", {h}, "pos_embed.proj.bias");
  r.linear("t_embedder.mlp.0", "time_text_embed.timestep_embedder.linear_1", 256, h);
  r.linear("t_embedder.mlp.2", "time_text_embed.timestep_embedder.linear_2", h, h);
  r.linear("y_embedder.mlp.0", "time_text_embed.text_embedder.linear_1", c.pooled_in, h);
  r.linear("y_embedder.mlp.2", "time_text_embed.text_embedder.linear_2", h, h);
  r.linear("context_embedder", "context_embedder", c.context_in, h);
  for (std::int64_t i = 0; i < c.depth; ++i) add_sd3_block(r, c, i);
  r.linear("final_layer.linear", "proj_out", h, c.patch_features());
  r.linear("final_layer.adaLN_modulation.1", "norm_out.linear", h, 2 * h, sd3_merge::swap_halves);
  return std::move(r.rows);
}

}  // namespace detail

/// Every tensor of an SD3 transformer of `config` in `layout`: stability in the native module's order; diffusers
/// in the order of the stability tensors they make up (a fused qkv's q, k, v in turn).
/// Example: sd3_config::tiny(), stability -> starts {"pos_embed", [1, 64, 20]}, {"x_embedder.proj.weight",
///   [20, 4, 2, 2]}, ...; joint_blocks.0.x_block.attn.qkv.weight [60, 20], .attn.ln_q.weight [10],
///   joint_blocks.0.x_block.adaLN_modulation.1.weight [180, 20] (dual: 9 x 20),
///   joint_blocks.1.context_block.adaLN_modulation.1.weight [40, 20] (pre only), final_layer.linear.weight
///   [16, 20]. Diffusers: transformer_blocks.0.attn.to_q.weight [20, 20], ... medium(): 665 / 909 tensors.
/// @pre validate(config).
inline std::vector<sd3_tensor_spec> sd3_expected_tensors(const sd3_config& config, sd3_layout layout) {
  std::vector<sd3_tensor_spec> out;
  for (auto& row : detail::sd3_tensor_rows(config)) {
    if (layout == sd3_layout::stability) {
      out.push_back(std::move(row.stability));
      continue;
    }
    std::vector<std::int64_t> shape = row.stability.shape;
    shape[0] /= static_cast<std::int64_t>(row.sources.size());  // a fused qkv's thirds; else the whole
    for (auto& source : row.sources) out.push_back({std::move(source), shape});
  }
  return out;
}

/// The diffusers -> stability conversion, one entry per stability tensor of sd3_expected_tensors(config,
/// stability) (same order).
/// Example: "joint_blocks.0.x_block.attn.qkv.weight" <- concat(transformer_blocks.0.attn.to_q/to_k/to_v.weight);
///   "joint_blocks.0.context_block.attn.ln_q.weight" <- copy(transformer_blocks.0.attn.norm_added_q.weight);
///   "final_layer.adaLN_modulation.1.bias" <- swap_halves(norm_out.linear.bias); for the last block i,
///   "joint_blocks.i.context_block.adaLN_modulation.1.weight" <- swap_halves(transformer_blocks.i.norm1_context.
///   linear.weight).
/// @post every diffusers tensor of the config is a source exactly once.
inline std::vector<sd3_key_mapping> sd3_diffusers_to_stability(const sd3_config& config) {
  std::vector<sd3_key_mapping> out;
  for (auto& row : detail::sd3_tensor_rows(config))
    out.push_back({.target = std::move(row.stability.name), .sources = std::move(row.sources), .merge = row.merge});
  return out;
}

/// Which layout a set of tensor names is in (after sd3_transformer_part): counts the names under each layout's
/// own top-level modules (stability: joint_blocks., x_embedder., t_embedder., y_embedder., final_layer. and
/// pos_embed itself; diffusers: transformer_blocks., pos_embed., time_text_embed., norm_out., proj_out.).
/// context_embedder is shared and counts for neither. nullopt when neither is present or both equally.
/// Example: {"pos_embed", "joint_blocks.0.x_block.attn.qkv.weight"} -> stability; {"pos_embed.pos_embed"} ->
///   diffusers; {"context_embedder.weight"} -> nullopt.
template <std::ranges::input_range Names>
requires std::convertible_to<std::ranges::range_reference_t<Names>, std::string_view> std::optional<sd3_layout>
detect_sd3_layout(const Names& names) {
  constexpr std::string_view stability_roots[] = {"joint_blocks.", "x_embedder.", "t_embedder.", "y_embedder.",
                                                  "final_layer."};
  constexpr std::string_view diffusers_roots[] = {"transformer_blocks.", "pos_embed.", "time_text_embed.", "norm_out.",
                                                  "proj_out."};
  std::int64_t stability = 0, diffusers = 0;
  for (const auto& entry : names) {
    const std::string_view name = entry;
    const auto under = [&](std::string_view root) { return name.starts_with(root); };
    stability += name == "pos_embed" || std::ranges::any_of(stability_roots, under);
    diffusers += std::ranges::any_of(diffusers_roots, under);
  }
  if (stability == diffusers) return std::nullopt;
  return stability > diffusers ? sd3_layout::stability : sd3_layout::diffusers;
}

/// The transformer's part of a checkpoint: when any name starts with sd3_released_prefix (a released single
/// file), exactly those names with the prefix removed (the file's VAE, text encoders and anything else dropped);
/// otherwise every entry as it is. V is a tensor, a shape, ...
/// Example: {"model.diffusion_model.pos_embed": a, "first_stage_model.x": b} -> {"pos_embed": a};
///   {"pos_embed.pos_embed": a} -> unchanged.
template <class V>
std::map<std::string, V> sd3_transformer_part(const std::map<std::string, V>& tensors) {
  const bool released =
      std::ranges::any_of(tensors, [](const auto& entry) { return entry.first.starts_with(sd3_released_prefix); });
  if (!released) return tensors;
  std::map<std::string, V> out;
  for (const auto& [name, value] : tensors)
    if (name.starts_with(sd3_released_prefix)) out.emplace(name.substr(sd3_released_prefix.size()), value);
  return out;
}

/// Compares a checkpoint's names and shapes (after sd3_transformer_part) with sd3_expected_tensors(config, layout).
/// Example: tiny config, stability, every expected tensor but pos_embed, and final_layer.linear.bias as [8] ->
///   missing {"pos_embed"}, mismatched {"final_layer.linear.bias [8] (expected [16])"}.
/// @post as compare_tensors.
inline sd3_key_report check_sd3_tensors(const sd3_config& config, sd3_layout layout,
                                        const std::map<std::string, std::vector<std::int64_t>>& shapes) {
  return compare_tensors(sd3_expected_tensors(config, layout), shapes, [](const std::string&) { return false; });
}

/// The layout of a checkpoint's names (after sd3_transformer_part), or invalid_input naming a key each layout
/// would have when the names are of neither.
/// Example: {"x.weight"} with tiny() -> "SD3 checkpoint of 1 tensors is in neither layout: no pos_embed
///   (stability) and no pos_embed.pos_embed (diffusers)".
template <class V>
sd3_layout require_sd3_layout(const sd3_config& config, const std::map<std::string, V>& tensors) {
  const auto names = std::views::keys(tensors);
  if (const auto layout = detect_sd3_layout(names)) return *layout;
  const auto first_missing = [&](sd3_layout layout) {
    for (const sd3_tensor_spec& spec : sd3_expected_tensors(config, layout))
      if (!tensors.contains(spec.name)) return spec.name;
    return std::string("(none)");
  };
  fail("SD3 checkpoint of ", tensors.size(), " tensors is in neither layout: no ", first_missing(sd3_layout::stability),
       " (stability) and no ", first_missing(sd3_layout::diffusers), " (diffusers)");
}

}  // namespace branchgrpo
