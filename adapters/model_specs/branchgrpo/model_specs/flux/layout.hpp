#pragma once
// The two weight layouts FLUX.1 checkpoints come in, as names and shapes (torch-free):
//   bfl        Black Forest Labs' reference code and the released flux1-dev.safetensors:
//              fused qkv (`double_blocks.N.img_attn.qkv`), fused single-block `linear1` = [q; k; v; mlp_in],
//              final modulation `final_layer.adaLN_modulation.1` ordered (shift, scale).
//   diffusers  FluxTransformer2DModel: split to_q/to_k/to_v (add_*_proj for text), single blocks split into
//              to_q/to_k/to_v/proj_mlp and proj_out, `norm_out.linear` ordered (scale, shift).
// Every name gets a ".weight" or ".bias" suffix (RMSNorm scales: ".scale" in bfl, ".weight" in diffusers).
// The native model (flux.hpp) uses the bfl names; diffusers checkpoints are converted with
// flux_diffusers_to_bfl(config).
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <ranges>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/flux/config.hpp"

namespace branchgrpo {

enum class flux_layout { bfl, diffusers };

/// "bfl" or "diffusers".
inline std::string_view layout_name(flux_layout layout) { return layout == flux_layout::bfl ? "bfl" : "diffusers"; }

/// Example: parse_flux_layout("diffusers") == flux_layout::diffusers; "sd3" -> invalid_input naming it.
inline flux_layout parse_flux_layout(std::string_view name) {
  if (name == "bfl") return flux_layout::bfl;
  if (name == "diffusers") return flux_layout::diffusers;
  fail("unknown FLUX layout '", name, "' (expected bfl or diffusers)");
}

/// A tensor name with its shape.
struct flux_tensor_spec {
  std::string name;
  std::vector<std::int64_t> shape;
  friend bool operator==(const flux_tensor_spec&, const flux_tensor_spec&) = default;
};

namespace detail {

using flux_shape = std::vector<std::int64_t>;

inline void add_linear(std::vector<flux_tensor_spec>& out, const std::string& name, std::int64_t in,
                       std::int64_t out_features, bool bias = true) {
  out.push_back({name + ".weight", {out_features, in}});
  if (bias) out.push_back({name + ".bias", {out_features}});
}

inline std::string indexed(std::string_view prefix, std::int64_t i) {
  return std::string(prefix) + "." + std::to_string(i) + ".";
}

inline std::string shape_text(const flux_shape& shape) {
  std::ostringstream text;
  text << "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text << (i ? ", " : "") << shape[i];
  text << "]";
  return text.str();
}

}  // namespace detail

/// Every tensor of a FLUX transformer of `config` in `layout`, in module order.
/// Example: flux_config::tiny(), bfl -> starts {"img_in.weight", [64, 16]}, {"img_in.bias", [64]}, ...;
///   double_blocks.0.img_attn.qkv.weight [192, 64], single_blocks.0.linear1.weight [448, 64],
///   final_layer.linear.weight [16, 64]. dev(): 780 tensors in bfl, 1160 in diffusers (split q/k/v).
/// @pre validate(config).
inline std::vector<flux_tensor_spec> flux_expected_tensors(const flux_config& config, flux_layout layout) {
  validate(config);
  const std::int64_t h = config.hidden, d = config.head_dim(), m = config.mlp_hidden();
  std::vector<flux_tensor_spec> out;
  using detail::add_linear;
  if (layout == flux_layout::bfl) {
    add_linear(out, "img_in", config.in_channels, h);
    add_linear(out, "time_in.in_layer", 256, h);
    add_linear(out, "time_in.out_layer", h, h);
    add_linear(out, "vector_in.in_layer", config.vec_in, h);
    add_linear(out, "vector_in.out_layer", h, h);
    if (config.guidance_embed) {
      add_linear(out, "guidance_in.in_layer", 256, h);
      add_linear(out, "guidance_in.out_layer", h, h);
    }
    add_linear(out, "txt_in", config.context_in, h);
    for (std::int64_t i = 0; i < config.depth_double; ++i) {
      const std::string p = detail::indexed("double_blocks", i);
      for (const char* stream : {"img", "txt"}) {
        const std::string s = p + stream;
        add_linear(out, s + "_mod.lin", h, 6 * h);
        add_linear(out, s + "_attn.qkv", h, 3 * h, config.qkv_bias);
        out.push_back({s + "_attn.norm.query_norm.scale", {d}});
        out.push_back({s + "_attn.norm.key_norm.scale", {d}});
        add_linear(out, s + "_attn.proj", h, h);
        add_linear(out, s + "_mlp.0", h, m);
        add_linear(out, s + "_mlp.2", m, h);
      }
    }
    for (std::int64_t i = 0; i < config.depth_single; ++i) {
      const std::string p = detail::indexed("single_blocks", i);
      add_linear(out, p + "linear1", h, 3 * h + m);
      add_linear(out, p + "linear2", h + m, h);
      out.push_back({p + "norm.query_norm.scale", {d}});
      out.push_back({p + "norm.key_norm.scale", {d}});
      add_linear(out, p + "modulation.lin", h, 3 * h);
    }
    add_linear(out, "final_layer.linear", h, config.in_channels);
    add_linear(out, "final_layer.adaLN_modulation.1", h, 2 * h);
    return out;
  }
  add_linear(out, "x_embedder", config.in_channels, h);
  add_linear(out, "time_text_embed.timestep_embedder.linear_1", 256, h);
  add_linear(out, "time_text_embed.timestep_embedder.linear_2", h, h);
  add_linear(out, "time_text_embed.text_embedder.linear_1", config.vec_in, h);
  add_linear(out, "time_text_embed.text_embedder.linear_2", h, h);
  if (config.guidance_embed) {
    add_linear(out, "time_text_embed.guidance_embedder.linear_1", 256, h);
    add_linear(out, "time_text_embed.guidance_embedder.linear_2", h, h);
  }
  add_linear(out, "context_embedder", config.context_in, h);
  for (std::int64_t i = 0; i < config.depth_double; ++i) {
    const std::string p = detail::indexed("transformer_blocks", i);
    add_linear(out, p + "norm1.linear", h, 6 * h);
    add_linear(out, p + "norm1_context.linear", h, 6 * h);
    for (const char* name :
         {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"})
      add_linear(out, p + name, h, h, config.qkv_bias);
    for (const char* name : {"attn.norm_q", "attn.norm_k", "attn.norm_added_q", "attn.norm_added_k"})
      out.push_back({p + name + ".weight", {d}});
    add_linear(out, p + "attn.to_out.0", h, h);
    add_linear(out, p + "attn.to_add_out", h, h);
    add_linear(out, p + "ff.net.0.proj", h, m);
    add_linear(out, p + "ff.net.2", m, h);
    add_linear(out, p + "ff_context.net.0.proj", h, m);
    add_linear(out, p + "ff_context.net.2", m, h);
  }
  for (std::int64_t i = 0; i < config.depth_single; ++i) {
    const std::string p = detail::indexed("single_transformer_blocks", i);
    add_linear(out, p + "norm.linear", h, 3 * h);
    for (const char* name : {"attn.to_q", "attn.to_k", "attn.to_v"}) add_linear(out, p + name, h, h);
    out.push_back({p + "attn.norm_q.weight", {d}});
    out.push_back({p + "attn.norm_k.weight", {d}});
    add_linear(out, p + "proj_mlp", h, m);
    add_linear(out, p + "proj_out", h + m, h);
  }
  add_linear(out, "norm_out.linear", h, 2 * h);
  add_linear(out, "proj_out", h, config.in_channels);
  return out;
}

/// Which layout a set of tensor names is in: counts the names under each layout's top-level modules
/// (bfl: double_blocks, single_blocks, img_in, txt_in, time_in, vector_in, guidance_in, final_layer;
/// diffusers: transformer_blocks, single_transformer_blocks, x_embedder, context_embedder, time_text_embed,
/// norm_out, proj_out). nullopt when neither is present or both equally.
/// Example: {"img_in.weight", "double_blocks.0.img_mod.lin.weight"} -> bfl; {"x_embedder.bias"} -> diffusers;
///   {"encoder.conv_in.weight"} -> nullopt.
template <std::ranges::input_range Names>
requires std::convertible_to<std::ranges::range_reference_t<Names>, std::string_view> std::optional<flux_layout>
detect_flux_layout(const Names& names) {
  constexpr std::string_view bfl_roots[] = {"double_blocks.", "single_blocks.", "img_in.",      "txt_in.",
                                            "time_in.",       "vector_in.",     "guidance_in.", "final_layer."};
  constexpr std::string_view diffusers_roots[] = {"transformer_blocks.",
                                                  "single_transformer_blocks.",
                                                  "x_embedder.",
                                                  "context_embedder.",
                                                  "time_text_embed.",
                                                  "norm_out.",
                                                  "proj_out."};
  std::int64_t bfl = 0, diffusers = 0;
  for (const auto& entry : names) {
    const std::string_view name = entry;
    const auto under = [&](std::string_view root) { return name.starts_with(root); };
    bfl += std::ranges::any_of(bfl_roots, under);
    diffusers += std::ranges::any_of(diffusers_roots, under);
  }
  if (bfl == diffusers) return std::nullopt;
  return bfl > diffusers ? flux_layout::bfl : flux_layout::diffusers;
}

/// What a checkpoint lacks or has in excess relative to a config and layout.
struct flux_key_report {
  std::vector<std::string> missing;     ///< expected names absent from the checkpoint
  std::vector<std::string> unexpected;  ///< checkpoint names the layout does not have
  std::vector<std::string> mismatched;  ///< "name [got] (expected [want])"

  [[nodiscard]] bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }

  /// One line listing every problem comma-separated, the first `listed` of them spelled out.
  /// Example: missing {"a.weight"}, unexpected {"b"} -> "missing a.weight, unexpected b";
  ///   25 problems, listed 10 -> the first 10, then ", ... and 15 more".
  [[nodiscard]] std::string message(std::size_t listed = 10) const {
    std::vector<std::string> items;
    for (const auto& name : missing) items.push_back("missing " + name);
    for (const auto& name : unexpected) items.push_back("unexpected " + name);
    for (const auto& text : mismatched) items.push_back("shape mismatch " + text);
    std::string line;
    for (std::size_t i = 0; i < items.size() && i < listed; ++i) line += (i ? ", " : "") + items[i];
    if (items.size() > listed) line += ", ... and " + std::to_string(items.size() - listed) + " more";
    return line;
  }
};

/// Compares a checkpoint's names and shapes with an expected tensor list; names for which ignored(name) holds
/// are neither expected nor unexpected (e.g. the encoder half of an autoencoder file).
/// Example: expected {a [2]}, checkpoint {a [3], b [1]} -> mismatched {"a [3] (expected [2])"}, unexpected {"b"}.
/// @post names in the report are in the order of the expected list (missing, mismatched) and of the
///   checkpoint map (unexpected, sorted by name).
template <class Ignored>
flux_key_report compare_tensors(const std::vector<flux_tensor_spec>& expected,
                                const std::map<std::string, std::vector<std::int64_t>>& shapes, Ignored ignored) {
  flux_key_report report;
  std::set<std::string> wanted;
  for (const flux_tensor_spec& spec : expected) {
    wanted.insert(spec.name);
    const auto found = shapes.find(spec.name);
    if (found == shapes.end())
      report.missing.push_back(spec.name);
    else if (found->second != spec.shape)
      report.mismatched.push_back(spec.name + " " + detail::shape_text(found->second) + " (expected " +
                                  detail::shape_text(spec.shape) + ")");
  }
  for (const auto& [name, shape] : shapes)
    if (!wanted.contains(name) && !ignored(name)) report.unexpected.push_back(name);
  return report;
}

/// Compares a checkpoint's names and shapes with flux_expected_tensors(config, layout).
/// Example: tiny config, bfl, every expected tensor but img_in.bias, and img_in.weight as [64, 8] ->
///   missing {"img_in.bias"}, mismatched {"img_in.weight [64, 8] (expected [64, 16])"}.
/// @post as compare_tensors.
inline flux_key_report check_flux_tensors(const flux_config& config, flux_layout layout,
                                          const std::map<std::string, std::vector<std::int64_t>>& shapes) {
  return compare_tensors(flux_expected_tensors(config, layout), shapes, [](const std::string&) { return false; });
}

/// How one bfl tensor is built from diffusers tensors.
enum class flux_merge {
  copy,         ///< the single source as is
  concat,       ///< sources concatenated along dim 0 (fused qkv, single-block linear1)
  swap_halves,  ///< the single source with its two halves along dim 0 exchanged (norm_out: scale, shift)
};

struct flux_key_mapping {
  std::string target;                ///< bfl name
  std::vector<std::string> sources;  ///< diffusers names
  flux_merge merge = flux_merge::copy;
  friend bool operator==(const flux_key_mapping&, const flux_key_mapping&) = default;
};

/// The diffusers -> bfl conversion, one entry per bfl tensor of flux_expected_tensors(config, bfl) (same order).
/// Example: "double_blocks.0.img_attn.qkv.weight" <- concat(transformer_blocks.0.attn.to_q/to_k/to_v.weight);
///   "single_blocks.0.linear1.bias" <- concat(single_transformer_blocks.0.attn.to_q/k/v.bias, .proj_mlp.bias);
///   "final_layer.adaLN_modulation.1.weight" <- swap_halves(norm_out.linear.weight).
/// @post every diffusers tensor of the config is a source exactly once.
inline std::vector<flux_key_mapping> flux_diffusers_to_bfl(const flux_config& config) {
  validate(config);
  std::vector<flux_key_mapping> out;
  const auto linear = [&](const std::string& target, const std::string& source, bool bias = true) {
    out.push_back({target + ".weight", {source + ".weight"}, flux_merge::copy});
    if (bias) out.push_back({target + ".bias", {source + ".bias"}, flux_merge::copy});
  };
  const auto fused = [&](const std::string& target, const std::vector<std::string>& sources, bool bias = true) {
    for (const char* suffix : {".weight", ".bias"}) {
      if (!bias && std::string_view(suffix) == ".bias") continue;
      flux_key_mapping entry{.target = target + suffix, .sources = {}, .merge = flux_merge::concat};
      for (const auto& source : sources) entry.sources.push_back(source + suffix);
      out.push_back(std::move(entry));
    }
  };
  linear("img_in", "x_embedder");
  linear("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1");
  linear("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2");
  linear("vector_in.in_layer", "time_text_embed.text_embedder.linear_1");
  linear("vector_in.out_layer", "time_text_embed.text_embedder.linear_2");
  if (config.guidance_embed) {
    linear("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1");
    linear("guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2");
  }
  linear("txt_in", "context_embedder");
  for (std::int64_t i = 0; i < config.depth_double; ++i) {
    const std::string p = detail::indexed("double_blocks", i), q = detail::indexed("transformer_blocks", i);
    struct stream_names {
      const char *stream, *norm, *to_q, *to_k, *to_v, *norm_q, *norm_k, *out, *ff;
    };
    for (const stream_names& s :
         {stream_names{"img", "norm1", "attn.to_q", "attn.to_k", "attn.to_v", "attn.norm_q", "attn.norm_k",
                       "attn.to_out.0", "ff"},
          stream_names{"txt", "norm1_context", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj",
                       "attn.norm_added_q", "attn.norm_added_k", "attn.to_add_out", "ff_context"}}) {
      const std::string t = p + s.stream;
      linear(t + "_mod.lin", q + s.norm + ".linear");
      fused(t + "_attn.qkv", {q + s.to_q, q + s.to_k, q + s.to_v}, config.qkv_bias);
      out.push_back({t + "_attn.norm.query_norm.scale", {q + s.norm_q + ".weight"}, flux_merge::copy});
      out.push_back({t + "_attn.norm.key_norm.scale", {q + s.norm_k + ".weight"}, flux_merge::copy});
      linear(t + "_attn.proj", q + s.out);
      linear(t + "_mlp.0", q + s.ff + ".net.0.proj");
      linear(t + "_mlp.2", q + s.ff + ".net.2");
    }
  }
  for (std::int64_t i = 0; i < config.depth_single; ++i) {
    const std::string p = detail::indexed("single_blocks", i), q = detail::indexed("single_transformer_blocks", i);
    fused(p + "linear1", {q + "attn.to_q", q + "attn.to_k", q + "attn.to_v", q + "proj_mlp"});
    linear(p + "linear2", q + "proj_out");
    out.push_back({p + "norm.query_norm.scale", {q + "attn.norm_q.weight"}, flux_merge::copy});
    out.push_back({p + "norm.key_norm.scale", {q + "attn.norm_k.weight"}, flux_merge::copy});
    linear(p + "modulation.lin", q + "norm.linear");
  }
  linear("final_layer.linear", "proj_out");
  for (const char* suffix : {".weight", ".bias"})
    out.push_back({std::string("final_layer.adaLN_modulation.1") + suffix,
                   {std::string("norm_out.linear") + suffix},
                   flux_merge::swap_halves});
  return out;
}

}  // namespace branchgrpo
