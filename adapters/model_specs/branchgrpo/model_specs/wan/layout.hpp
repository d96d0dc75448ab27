#pragma once
// The two weight layouts Wan2.1 T2V checkpoints come in, as names and shapes (torch-free):
//   official   Wan-AI's reference code (wan/modules/model.py, WanModel) and the released
//              diffusion_pytorch_model*.safetensors: blocks.N.self_attn.{q,k,v,o}, .cross_attn.*, .norm3 (the
//              affine LayerNorm before the cross-attention), .ffn.0 / .ffn.2, .modulation [1, 6, dim];
//              head.head, head.modulation [1, 2, dim].
//   diffusers  WanTransformer3DModel: condition_embedder.*, blocks.N.attn1.* / .attn2.* (to_q, to_k, to_v,
//              to_out.0, norm_q, norm_k), .norm2 (= official norm3), .ffn.net.0.proj / .ffn.net.2,
//              .scale_shift_table; proj_out, scale_shift_table.
// The two differ only in names (no fused or reordered tensors), so the diffusers -> official mapping is a
// rename. The native model (torch/wan/transformer.hpp) uses the official names.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <map>
#include <optional>
#include <ranges>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/flux/layout.hpp"  // flux_tensor_spec, flux_key_report, compare_tensors
#include "branchgrpo/model_specs/wan/config.hpp"

namespace branchgrpo {

enum class wan_layout { official, diffusers };

/// "official" or "diffusers".
inline std::string_view layout_name(wan_layout layout) {
  return layout == wan_layout::official ? "official" : "diffusers";
}

/// Example: parse_wan_layout("diffusers") == wan_layout::diffusers; "bfl" -> invalid_input naming it.
inline wan_layout parse_wan_layout(std::string_view name) {
  if (name == "official") return wan_layout::official;
  if (name == "diffusers") return wan_layout::diffusers;
  fail("unknown Wan layout '", name, "' (expected official or diffusers)");
}

/// A tensor name with its shape (the same record as FLUX's).
using wan_tensor_spec = flux_tensor_spec;
/// What a checkpoint lacks or has in excess (the same report as FLUX's).
using wan_key_report = flux_key_report;

/// One renamed tensor: official name <- diffusers name.
struct wan_key_mapping {
  std::string target;  ///< official name
  std::string source;  ///< diffusers name
  friend bool operator==(const wan_key_mapping&, const wan_key_mapping&) = default;
};

namespace detail {

/// Both layouts' names side by side, in the native module's order, with shapes.
struct wan_tensor_pair {
  std::string official, diffusers;
  std::vector<std::int64_t> shape;
};

inline std::vector<wan_tensor_pair> wan_tensor_pairs(const wan_config& c) {
  validate(c);
  std::vector<wan_tensor_pair> out;
  const auto linear = [&](const std::string& official, const std::string& diffusers, std::int64_t in,
                          std::int64_t out_features) {
    out.push_back({official + ".weight", diffusers + ".weight", {out_features, in}});
    out.push_back({official + ".bias", diffusers + ".bias", {out_features}});
  };
  const std::int64_t d = c.dim;
  out.push_back(
      {"patch_embedding.weight", "patch_embedding.weight", {d, c.in_dim, c.patch[0], c.patch[1], c.patch[2]}});
  out.push_back({"patch_embedding.bias", "patch_embedding.bias", {d}});
  linear("text_embedding.0", "condition_embedder.text_embedder.linear_1", c.text_dim, d);
  linear("text_embedding.2", "condition_embedder.text_embedder.linear_2", d, d);
  linear("time_embedding.0", "condition_embedder.time_embedder.linear_1", c.freq_dim, d);
  linear("time_embedding.2", "condition_embedder.time_embedder.linear_2", d, d);
  linear("time_projection.1", "condition_embedder.time_proj", d, 6 * d);
  for (std::int64_t i = 0; i < c.layers; ++i) {
    const std::string p = indexed("blocks", i);
    for (const auto& [official, diffusers] : {std::pair{"self_attn", "attn1"}, std::pair{"cross_attn", "attn2"}}) {
      const std::string o = p + official + ".", f = p + diffusers + ".";
      linear(o + "q", f + "to_q", d, d);
      linear(o + "k", f + "to_k", d, d);
      linear(o + "v", f + "to_v", d, d);
      linear(o + "o", f + "to_out.0", d, d);
      out.push_back({o + "norm_q.weight", f + "norm_q.weight", {d}});
      out.push_back({o + "norm_k.weight", f + "norm_k.weight", {d}});
    }
    out.push_back({p + "norm3.weight", p + "norm2.weight", {d}});
    out.push_back({p + "norm3.bias", p + "norm2.bias", {d}});
    linear(p + "ffn.0", p + "ffn.net.0.proj", d, c.ffn_dim);
    linear(p + "ffn.2", p + "ffn.net.2", c.ffn_dim, d);
    out.push_back({p + "modulation", p + "scale_shift_table", {1, 6, d}});
  }
  linear("head.head", "proj_out", d, c.out_dim * c.patch_volume());
  out.push_back({"head.modulation", "scale_shift_table", {1, 2, d}});
  return out;
}

}  // namespace detail

/// Every tensor of a Wan T2V transformer of `config` in `layout`, in the native module's order.
/// Example: wan_config::tiny(), official -> starts {"patch_embedding.weight", [40, 4, 1, 2, 2]},
///   {"patch_embedding.bias", [40]}, ...; blocks.0.self_attn.norm_q.weight [40] (over the whole dim, not per
///   head), blocks.0.modulation [1, 6, 40], head.head.weight [12, 40] (3 channels x 2 x 2), head.modulation
///   [1, 2, 40]. t2v_1_3b(): 12 + 30 x 27 + 3 = 825 tensors in either layout.
/// @pre validate(config).
inline std::vector<wan_tensor_spec> wan_expected_tensors(const wan_config& config, wan_layout layout) {
  std::vector<wan_tensor_spec> out;
  for (auto& pair : detail::wan_tensor_pairs(config))
    out.push_back({layout == wan_layout::official ? pair.official : pair.diffusers, pair.shape});
  return out;
}

/// Which layout a set of tensor names is in: counts the names only one layout has (official: text_embedding.,
/// time_embedding., time_projection., head., and block names with .self_attn., .cross_attn., .norm3.,
/// .modulation or .ffn.0. / .ffn.2.; diffusers: condition_embedder., scale_shift_table, proj_out., and block
/// names with .attn1., .attn2., .ffn.net.). patch_embedding is shared and counts for neither. nullopt when
/// neither is present or both equally.
/// Example: {"blocks.0.self_attn.q.weight"} -> official; {"condition_embedder.time_proj.bias"} -> diffusers;
///   {"patch_embedding.weight"} -> nullopt.
template <std::ranges::input_range Names>
requires std::convertible_to<std::ranges::range_reference_t<Names>, std::string_view> std::optional<wan_layout>
detect_wan_layout(const Names& names) {
  constexpr std::string_view official_roots[] = {"text_embedding.", "time_embedding.", "time_projection.", "head."};
  constexpr std::string_view official_parts[] = {".self_attn.", ".cross_attn.", ".norm3.",
                                                 ".modulation", ".ffn.0.",      ".ffn.2."};
  constexpr std::string_view diffusers_roots[] = {"condition_embedder.", "scale_shift_table", "proj_out."};
  constexpr std::string_view diffusers_parts[] = {".attn1.", ".attn2.", ".ffn.net.", ".scale_shift_table"};
  std::int64_t official = 0, diffusers = 0;
  for (const auto& entry : names) {
    const std::string_view name = entry;
    const auto under = [&](std::string_view root) { return name.starts_with(root); };
    const auto has = [&](std::string_view part) { return name.find(part) != std::string_view::npos; };
    official += std::ranges::any_of(official_roots, under) || std::ranges::any_of(official_parts, has);
    diffusers += std::ranges::any_of(diffusers_roots, under) || std::ranges::any_of(diffusers_parts, has);
  }
  if (official == diffusers) return std::nullopt;
  return official > diffusers ? wan_layout::official : wan_layout::diffusers;
}

/// Compares a checkpoint's names and shapes with wan_expected_tensors(config, layout).
/// Example: tiny config, official, every expected tensor but head.head.bias, and head.modulation as [2, 40] ->
///   missing {"head.head.bias"}, mismatched {"head.modulation [2, 40] (expected [1, 2, 40])"}.
/// @post as compare_tensors.
inline wan_key_report check_wan_tensors(const wan_config& config, wan_layout layout,
                                        const std::map<std::string, std::vector<std::int64_t>>& shapes) {
  return compare_tensors(wan_expected_tensors(config, layout), shapes, [](const std::string&) { return false; });
}

/// The sizes a checkpoint in `layout` implies, read from its shapes (for a file of no released size): in_dim and
/// patch from patch_embedding.weight [dim, in_dim, pf, ph, pw], text_dim and freq_dim from the first text and
/// time embedding linears [dim, text_dim] / [dim, freq_dim], ffn_dim from block 0's first FFN linear
/// [ffn_dim, dim], out_dim from the head [out_dim x patch volume, dim], layers from the highest block index + 1.
/// heads, text_len, eps and rope_theta are not in the weights (nothing's shape depends on them): heads is
/// dim / 128 when 128 divides dim (both releases' head width), else 1; the rest keep wan_config's defaults.
/// Example: the official shapes of t2v_14b() -> t2v_14b(); the diffusers shapes of tiny() -> tiny() but heads 1;
///   without patch_embedding.weight -> nullopt.
/// @post nullopt when one of those tensors is absent or of another rank, the head's rows are not a multiple of
///   the patch volume, or the sizes fail validate; else validate(result) passes.
inline std::optional<wan_config> infer_wan_config(const std::map<std::string, std::vector<std::int64_t>>& shapes,
                                                  wan_layout layout) {
  const bool official = layout == wan_layout::official;
  const auto shape = [&](const char* official_name, const char* diffusers_name,
                         std::size_t rank) -> const std::vector<std::int64_t>* {
    const auto found = shapes.find(official ? official_name : diffusers_name);
    return found != shapes.end() && found->second.size() == rank ? &found->second : nullptr;
  };
  const auto* patch = shape("patch_embedding.weight", "patch_embedding.weight", 5);
  const auto* text = shape("text_embedding.0.weight", "condition_embedder.text_embedder.linear_1.weight", 2);
  const auto* time = shape("time_embedding.0.weight", "condition_embedder.time_embedder.linear_1.weight", 2);
  const auto* ffn = shape("blocks.0.ffn.0.weight", "blocks.0.ffn.net.0.proj.weight", 2);
  const auto* head = shape("head.head.weight", "proj_out.weight", 2);
  if (!patch || !text || !time || !ffn || !head) return std::nullopt;
  std::int64_t layers = 0;
  for (const auto& [name, extents] : shapes) {
    if (!name.starts_with("blocks.")) continue;
    const std::string_view rest = std::string_view(name).substr(7);
    std::int64_t index = -1;
    const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), index);
    if (error == std::errc() && end != rest.data() && *end == '.')  // capped: validate refuses more than the limit
      layers = std::max(layers, std::min(index, wan_max_depth) + 1);
  }
  wan_config c{.in_dim = (*patch)[1],
               .dim = (*patch)[0],
               .ffn_dim = (*ffn)[0],
               .layers = layers,
               .freq_dim = (*time)[1],
               .text_dim = (*text)[1],
               .patch = {(*patch)[2], (*patch)[3], (*patch)[4]}};
  c.heads = c.dim % 128 == 0 ? c.dim / 128 : 1;
  const auto valid = [](const wan_config& config) {
    try {
      validate(config);
      return true;
    } catch (const invalid_input&) {
      return false;
    }
  };
  if (!valid(c)) return std::nullopt;  // first: the patch sides are within limits before their product is taken
  if ((*head)[0] % c.patch_volume() != 0) return std::nullopt;
  c.out_dim = (*head)[0] / c.patch_volume();
  if (!valid(c)) return std::nullopt;
  return c;
}

/// The diffusers -> official renaming, one entry per official tensor of wan_expected_tensors(config, official)
/// (same order). Example: "blocks.0.norm3.weight" <- "blocks.0.norm2.weight" (diffusers numbers its norms in
/// call order), "blocks.3.modulation" <- "blocks.3.scale_shift_table", "head.modulation" <- "scale_shift_table",
/// "time_projection.1.weight" <- "condition_embedder.time_proj.weight".
/// @post every diffusers tensor of the config is a source exactly once.
inline std::vector<wan_key_mapping> wan_diffusers_to_official(const wan_config& config) {
  std::vector<wan_key_mapping> out;
  for (auto& pair : detail::wan_tensor_pairs(config)) out.push_back({pair.official, pair.diffusers});
  return out;
}

}  // namespace branchgrpo
