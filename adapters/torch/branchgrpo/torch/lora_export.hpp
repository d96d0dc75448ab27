#pragma once
// A trained LoRA in the key layouts other tools load (`branchgrpo export-lora`, docs/cli.md):
//
//   diffusers  "transformer.<diffusers module>.lora_A.weight" / ".lora_B.weight", the scale alpha / rank folded
//              into B (PEFT loads a file without alphas with lora_alpha = rank, i.e. scale 1). Each family's
//              model_spec::lora_parts says where a layer goes: FLUX's fused projections are split
//              (model_specs/flux/lora_keys.hpp), Wan's modules renamed (model_specs/wan/lora_keys.hpp).
//   kohya      FLUX and SD3 (model_spec::lora_formats): "lora_unet_<bfl / Stability module, dots as _>"
//              ".lora_down.weight" (A), ".lora_up.weight" (B) and ".alpha" (a scalar; the loader scales by
//              alpha / rank), fused projections kept fused.
//   comfyui    "diffusion_model.<our module>.lora_A.weight" / ".lora_B.weight" (bfl names for FLUX, official for
//              Wan, Stability's for SD3: the names ComfyUI's model state uses), the scale folded into B.
//   Wan2.2's two experts go to a file each (model_spec::lora_files, lora_export_files), in Wan's keys.
//   merged     (merge_lora_tensors) the full transformer W + (alpha / rank) B A in our layout.
//
// Example: the FLUX adapter double_blocks.0.img_attn.qkv (A [8, 64], B [192, 8], alpha 16, rank 8) ->
//   diffusers: transformer.transformer_blocks.0.attn.to_q.lora_A.weight = A, ...to_q.lora_B.weight = 2 B[0:64],
//     to_k and to_v likewise with rows [64, 128) and [128, 192);
//   kohya: lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight = A, .lora_up.weight = B, .alpha = 16;
//   comfyui: diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight = A, .lora_B.weight = 2 B.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <ranges>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/core/stop.hpp"
#include "branchgrpo/model_specs/family.hpp"
#include "branchgrpo/model_specs/registry.hpp"
#include "branchgrpo/torch/compat.hpp"

namespace branchgrpo {

enum class lora_export_format { diffusers, kohya, comfyui };

inline std::string_view lora_export_format_name(lora_export_format format) {
  return format == lora_export_format::diffusers ? "diffusers"
         : format == lora_export_format::kohya   ? "kohya"
                                                 : "comfyui";
}

/// Example: parse_lora_export_format("kohya") == kohya; "peft" -> invalid_input
///   "--format peft: unknown format (expected diffusers, kohya or comfyui)".
inline lora_export_format parse_lora_export_format(std::string_view name) {
  if (name == "diffusers") return lora_export_format::diffusers;
  if (name == "kohya") return lora_export_format::kohya;
  if (name == "comfyui") return lora_export_format::comfyui;
  fail("--format ", echo_text(name), ": unknown format (expected diffusers, kohya or comfyui)");
}

/// Throws invalid_input when `family` does not write `format` (its model_spec::lora_formats).
/// Example: (wan_spec, kohya) -> "--format kohya: Wan models export as diffusers or comfyui".
inline void check_lora_export_format(const model_spec& family, lora_export_format format) {
  require(family.writes(lora_export_format_name(format)), "--format ", lora_export_format_name(format), ": ",
          family.label, " models export as ", name_list(family.lora_formats));
}

/// One trained adapter: down = A [rank, in], up = B [out, rank].
struct lora_adapter {
  torch::Tensor down, up;
};

/// The adapters of a checkpoint's weights by layer ("<layer>.lora_A.weight" + "<layer>.lora_B.weight"); other
/// names are ignored (none when the run trained every weight).
/// Example: {"a.lora_A.weight", "a.lora_B.weight", "b.weight"} -> {"a": {A, B}}.
/// @post throws invalid_input naming the layer when one factor lacks the other or their ranks differ.
inline std::map<std::string, lora_adapter> lora_adapters_of(const std::map<std::string, torch::Tensor>& weights) {
  constexpr std::string_view down_suffix = ".lora_A.weight", up_suffix = ".lora_B.weight";
  std::map<std::string, lora_adapter> out;
  for (const auto& [name, tensor] : weights) {
    const bool down = name.ends_with(down_suffix), up = name.ends_with(up_suffix);
    if (!down && !up) continue;
    const std::string layer = name.substr(0, name.size() - down_suffix.size());
    (down ? out[layer].down : out[layer].up) = tensor;
  }
  for (const auto& [layer, adapter] : out) {
    require(adapter.down.defined() && adapter.up.defined(), "LoRA layer ", layer, " has ",
            adapter.down.defined() ? "lora_A but no lora_B" : "lora_B but no lora_A");
    require(adapter.down.dim() == 2 && adapter.up.dim() == 2 && adapter.down.size(0) == adapter.up.size(1),
            "LoRA layer ", layer, ": lora_A ", adapter.down.sizes(), " and lora_B ", adapter.up.sizes(),
            " are not [rank, in] and [out, rank]");
  }
  return out;
}

/// The family of model_spec_table more of whose module names `layers` are than any other's (model_spec::lora_layer:
/// FLUX's bfl names, Wan's official ones); nullptr when none is ahead.
/// Example: {"double_blocks.0.img_attn.qkv"} -> flux_spec; {"blocks.0.self_attn.q"} -> wan_spec; {"unet.up"} ->
///   nullptr.
inline const model_spec* lora_family_of(const std::map<std::string, lora_adapter>& layers) {
  return leading_family([&](const model_spec& spec) {
    return std::ranges::count_if(layers, [&](const auto& layer) { return spec.lora_layer(layer.first); });
  });
}

/// One file of a LoRA export: its path, the adapters it holds (named as `family` names them) and the leading module
/// they were taken from ("" for the whole transformer).
struct lora_export_file {
  std::string path;
  std::map<std::string, lora_adapter> adapters;
  const model_spec* family = nullptr;
  std::string module;
};

/// The files an export of `adapters` (layers of `family`) to `output` writes: one, or for a family with
/// model_spec::lora_files one per module, each holding that module's adapters with the module stripped, named as
/// lora_file_family names them, at `output`'s stem + "." + module + its extension.
/// Example: Wan2.2 adapters {high_noise_model.blocks.0.ffn.0, low_noise_model.blocks.0.ffn.0}, "out/l.safetensors"
///   -> {"out/l.high_noise_model.safetensors", {blocks.0.ffn.0}, &wan_spec, "high_noise_model"} and the
///   low_noise_model one; FLUX adapters -> {"out/l.safetensors", all of them, &flux_spec, ""}.
/// @pre every adapter is under one of the modules when the family has lora_files (else invalid_input naming it).
inline std::vector<lora_export_file> lora_export_files(const std::map<std::string, lora_adapter>& adapters,
                                                       const model_spec& family, const std::string& output) {
  if (family.lora_files.empty()) return {{.path = output, .adapters = adapters, .family = &family, .module = ""}};
  const std::filesystem::path out(output);
  std::vector<lora_export_file> files;
  for (const std::string_view module : family.lora_files) {
    std::filesystem::path path = out;
    path.replace_filename(out.stem().string() + "." + std::string(module) + out.extension().string());
    files.push_back(
        {.path = path.string(), .adapters = {}, .family = family.lora_file_family, .module = std::string(module)});
  }
  for (const auto& [layer, adapter] : adapters) {
    const auto file = std::ranges::find_if(files, [&](const lora_export_file& f) {
      return layer.size() > f.module.size() && layer.starts_with(f.module) && layer[f.module.size()] == '.';
    });
    require(file != files.end(), "LoRA layer '", layer, "' is in none of the ", family.label, " modules ",
            name_list(family.lora_files));
    file->adapters.emplace(layer.substr(file->module.size() + 1), adapter);
  }
  return files;
}

/// The adapters in `format`'s keys (see the file comment), each tensor converted to `dtype` (nullopt: as stored).
/// B is scaled by alpha / rank in float64, then rounded to `dtype` once.
/// Example: as in the file comment; a Wan adapter blocks.0.ffn.0 -> diffusers transformer.blocks.0.ffn.net.0.proj.*.
/// @pre check_lora_export_format(family, format); every layer is one of `family`'s (else invalid_input naming it:
///   family.lora_parts' message).
inline std::map<std::string, torch::Tensor> export_lora_tensors(const std::map<std::string, lora_adapter>& adapters,
                                                                const model_spec& family, lora_export_format format,
                                                                double alpha, std::optional<torch::Dtype> dtype) {
  check_lora_export_format(family, format);
  std::map<std::string, torch::Tensor> out;
  const auto store = [&](const std::string& key, const torch::Tensor& tensor) {
    out[key] = tensor.to(dtype.value_or(tensor.scalar_type())).contiguous();
  };
  for (const auto& [layer, adapter] : adapters) {
    check_stop("the LoRA export");  // per layer (core/stop.hpp)
    const torch::Tensor down = adapter.down, up = adapter.up;
    const double scale = alpha / static_cast<double>(down.size(0));
    const auto folded = [&](const torch::Tensor& rows) {  // scale B in float64, then the stored or asked dtype
      return (rows.to(torch::kFloat64) * scale).to(dtype.value_or(up.scalar_type()));
    };
    // The layer's diffusers parts; also the check that it is one of the family's, whatever the format.
    const std::vector<lora_key_part> parts = family.lora_parts(layer, up.size(0), down.size(1));
    if (format == lora_export_format::kohya) {
      std::string flat = layer;
      std::replace(flat.begin(), flat.end(), '.', '_');
      store("lora_unet_" + flat + ".lora_down.weight", down);
      store("lora_unet_" + flat + ".lora_up.weight", up);
      store("lora_unet_" + flat + ".alpha", torch::tensor(alpha, torch::kFloat32).to(down.scalar_type()));
    } else if (format == lora_export_format::comfyui) {
      store("diffusion_model." + layer + ".lora_A.weight", down);
      out["diffusion_model." + layer + ".lora_B.weight"] = folded(up).contiguous();
    } else {
      // A FLUX layer's input width is the model's hidden size for every layer that is split (qkv, linear1).
      for (const lora_key_part& part : parts) {
        torch::Tensor rows = up.narrow(0, part.row_offset, part.rows);
        if (part.swap_halves) {
          const auto halves = rows.chunk(2, 0);
          rows = torch::cat({halves[1], halves[0]}, 0);
        }
        const std::string name = "transformer." + part.name;
        store(name + ".lora_A.weight", down);
        out[name + ".lora_B.weight"] = folded(rows).contiguous();
      }
    }
  }
  return out;
}

/// `base` (a whole transformer in our layout, "<layer>.weight" ...) with every adapter merged:
/// W + (alpha / rank) B A, computed in float32, each tensor then converted to `dtype` (nullopt: the base's).
/// Example: W = [[1, 2]], A = [[1, 1]], B = [[0.5]], alpha 2, rank 1 -> [[2, 3]] (lora.hpp's lora_linear example).
/// @post throws invalid_input naming the layer whose "<layer>.weight" is absent or of another shape than B A.
inline std::map<std::string, torch::Tensor> merge_lora_tensors(const std::map<std::string, torch::Tensor>& base,
                                                               const std::map<std::string, lora_adapter>& adapters,
                                                               double alpha, std::optional<torch::Dtype> dtype) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, tensor] : base) {
    check_stop("the LoRA merge");  // per tensor (core/stop.hpp): a full FLUX.1 is 780 of them
    out[name] = tensor.to(dtype.value_or(tensor.scalar_type())).contiguous();
  }
  for (const auto& [layer, adapter] : adapters) {
    check_stop("the LoRA merge");
    const auto found = base.find(layer + ".weight");
    require(found != base.end(), "LoRA layer ", layer, " has no base weight ", layer, ".weight");
    const torch::Tensor& weight = found->second;
    require(weight.dim() == 2 && weight.size(0) == adapter.up.size(0) && weight.size(1) == adapter.down.size(1),
            "LoRA layer ", layer, ": B A is [", adapter.up.size(0), ", ", adapter.down.size(1), "], the base weight ",
            weight.sizes());
    const double scale = alpha / static_cast<double>(adapter.down.size(0));
    const torch::Tensor delta = torch::matmul(adapter.up.to(torch::kFloat32), adapter.down.to(torch::kFloat32));
    out[layer + ".weight"] =
        (weight.to(torch::kFloat32) + scale * delta).to(dtype.value_or(weight.scalar_type())).contiguous();
  }
  return out;
}

}  // namespace branchgrpo
