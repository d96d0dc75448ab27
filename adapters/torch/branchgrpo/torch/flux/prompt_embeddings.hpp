#pragma once
// The prompt-embeddings file: precomputed text conditioning for a fixed list of prompts, so training never runs
// a text encoder (docs/prompt_embeddings.md; scripts/export_prompt_embeddings.py writes it for FLUX and Wan).
// A safetensors file holding
//   tensor "context"           [N, L, D]  float  per-prompt token features (FLUX: T5-XXL, Wan: umT5-XXL; D 4096)
//   tensor "pooled"            [N, V]     float  per-prompt pooled vector (FLUX: CLIP-L, V 768); Wan files omit it
//   tensor "negative_context"  [M, L, D]  float  optional: the negative prompts' features (classifier-free
//   tensor "negative_pooled"   [M, V]     float    guidance); negative_pooled exactly when pooled is there
//   tensor "negative_index"    [N]        I64    optional with M = 1: row n's negative is negative row index[n]
//   __metadata__ "prompts"           the N prompt strings joined with "\n" (so no prompt holds a newline)
//                "negative_prompts"  the M negative prompt strings, likewise (with negative_context)
//                "family"            "flux" or "wan": the model family the features are for (optional)
//                "encoder"           "t5+clip" (FLUX), "umt5" (Wan), "shapes" (the shipped models) (optional)
//                "context_in", "vec_in", "text_len"   decimal widths D, V and length L (optional on load)
// F16, BF16 and F64 tensors are accepted too and converted to float32 on load. Row n of context and pooled
// belongs to prompt n; a prompt index in a batch is a row of this table.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/flux/config.hpp"
#include "branchgrpo/model_specs/wan/config.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/flux/denoiser.hpp"
#include "branchgrpo/torch/safetensors.hpp"

namespace branchgrpo {

/// The contents of a prompt-embeddings file.
struct prompt_file {
  prompt_embeddings embeddings;               ///< float32, CPU; pooled undefined in a file without it (Wan)
  std::vector<std::string> prompts;           ///< prompts[n] is row n
  prompt_embeddings negative_embeddings;      ///< [M, ...] float32, CPU; context undefined without negatives
  std::vector<std::string> negative_prompts;  ///< the M negative prompts
  std::vector<std::int64_t> negative_index;   ///< with negatives: prompt n's negative row, in [0, M)
  std::string family = {};                    ///< "flux", "wan" or "" (a file that does not say)
  std::string encoder = {};                   ///< "t5+clip", "umt5", "shapes", ... or ""

  [[nodiscard]] bool has_negatives() const { return negative_embeddings.context.defined(); }
};

namespace detail {

// Throws "<source>: <what>" unless `t` is a floating tensor of `dims` dimensions, each >= 1, all finite;
// a non-finite value is named by its prompt row.
inline void check_prompt_tensor(const torch::Tensor& t, std::string_view name, std::int64_t dims,
                                std::string_view source) {
  require(t.defined(), source, ": tensor '", name, "' is missing");
  require(t.is_floating_point(), source, ": tensor '", name, "' has dtype ", c10::toString(t.scalar_type()),
          ", expected F32");
  require(t.dim() == dims, source, ": tensor '", name, "' has shape ", t.sizes(), ", expected ",
          dims == 3 ? "[N, L, context_in]" : "[N, vec_in]");
  for (std::int64_t d = 0; d < dims; ++d)
    require(t.size(d) >= 1, source, ": tensor '", name, "' has shape ", t.sizes(), " with an empty dimension");
  const torch::Tensor bad = torch::isfinite(t.to(torch::kFloat32)).logical_not().reshape({t.size(0), -1}).any(1);
  if (bad.any().item<bool>()) {
    const std::int64_t row = bad.nonzero().flatten()[0].item<std::int64_t>();
    const torch::Tensor values = t[row].flatten().to(torch::kFloat64);
    const std::int64_t at = torch::isfinite(values).logical_not().nonzero().flatten()[0].item<std::int64_t>();
    fail(source, ": tensor '", name, "' of prompt ", row, " holds ", values[at].item<double>(), " at element ", at);
  }
}

inline std::vector<std::string> split_prompts(const std::string& joined) {
  std::vector<std::string> out(1);
  for (const char ch : joined) {
    if (ch == '\n')
      out.emplace_back();
    else
      out.back().push_back(ch);
  }
  return out;
}

inline std::string join_prompts(std::span<const std::string> prompts, std::string_view what, std::string_view source) {
  std::string joined;
  for (std::size_t n = 0; n < prompts.size(); ++n) {
    require(prompts[n].find('\n') == std::string::npos, source, ": ", what, " ", n, " holds a newline");
    joined += (n ? "\n" : "") + prompts[n];
  }
  return joined;
}

}  // namespace detail

/// Throws invalid_input ("<source>: ...", one line) unless `file` is consistent: context [N, L, D] floating and
/// finite, N >= 1, N prompts; pooled, when there, [N, V]; negatives, when there, [M, L, D] (and [M, V] exactly when
/// pooled is there) with M strings and N indices in [0, M).
/// Example: negative_context [1, 3, 32] beside context [2, 4, 32] throws
///   "p.safetensors: tensor 'negative_context' has shape [1, 3, 32]: its tokens and width must be context's [4, 32]".
inline void check_prompt_file(const prompt_file& file, std::string_view source) {
  detail::check_prompt_tensor(file.embeddings.context, "context", 3, source);
  const torch::Tensor& context = file.embeddings.context;
  const std::int64_t n = context.size(0);
  const bool pooled = file.embeddings.pooled.defined();
  if (pooled) {
    detail::check_prompt_tensor(file.embeddings.pooled, "pooled", 2, source);
    require(file.embeddings.pooled.size(0) == n, source, ": tensor 'context' holds ", n, " prompts, 'pooled' ",
            file.embeddings.pooled.size(0));
  }
  require(static_cast<std::int64_t>(file.prompts.size()) == n, source, ": ", file.prompts.size(),
          " prompt strings for ", n, " embedding rows");
  if (!file.has_negatives()) {
    require(file.negative_prompts.empty() && file.negative_index.empty() && !file.negative_embeddings.pooled.defined(),
            source, ": negative prompts without tensor 'negative_context'");
    return;
  }
  const torch::Tensor& negative = file.negative_embeddings.context;
  detail::check_prompt_tensor(negative, "negative_context", 3, source);
  require(negative.size(1) == context.size(1) && negative.size(2) == context.size(2), source,
          ": tensor 'negative_context' has shape ", negative.sizes(), ": its tokens and width must be context's [",
          context.size(1), ", ", context.size(2), "]");
  const std::int64_t m = negative.size(0);
  require(static_cast<std::int64_t>(file.negative_prompts.size()) == m, source, ": ", file.negative_prompts.size(),
          " negative prompt strings for ", m, " negative embedding rows");
  require(file.negative_embeddings.pooled.defined() == pooled, source, ": tensor 'negative_pooled' ",
          pooled ? "is missing beside 'pooled'" : "is there without 'pooled'");
  if (pooled) {
    detail::check_prompt_tensor(file.negative_embeddings.pooled, "negative_pooled", 2, source);
    require(file.negative_embeddings.pooled.size(0) == m &&
                file.negative_embeddings.pooled.size(1) == file.embeddings.pooled.size(1),
            source, ": tensor 'negative_pooled' has shape ", file.negative_embeddings.pooled.sizes(), ", expected [", m,
            ", ", file.embeddings.pooled.size(1), "]");
  }
  require(static_cast<std::int64_t>(file.negative_index.size()) == n, source, ": ", file.negative_index.size(),
          " negative indices for ", n, " prompts");
  for (std::size_t i = 0; i < file.negative_index.size(); ++i)
    require(file.negative_index[i] >= 0 && file.negative_index[i] < m, source, ": negative_index[", i,
            "] = ", file.negative_index[i], " is not a negative row in [0, ", m, ")");
}

/// Throws invalid_input unless the file was made for `family` ("flux" or "wan") and, when `encoder` is not "",
/// by that text encoder: "<source>: made for wan models (metadata family = 'wan'); the model is flux". A file
/// without family metadata passes; one without encoder metadata passes for "flux" (the T5 + CLIP exporter wrote
/// none before), not for "wan": a 4096-wide T5 feature would fit Wan's shape and silently be the wrong encoder's.
inline void check_prompt_source(const prompt_file& file, std::string_view family, std::string_view encoder,
                                std::string_view source) {
  require(file.family.empty() || file.family == family, source, ": made for ", file.family,
          " models (metadata family = '", file.family, "'); the model is ", family);
  if (encoder.empty()) return;
  require(!file.encoder.empty() || family == "flux", source, ": no 'encoder' metadata: the model needs ", encoder,
          " features (write them with scripts/export_prompt_embeddings.py --model ", family, ")");
  require(file.encoder.empty() || file.encoder == encoder, source, ": features of encoder '", file.encoder,
          "'; the model needs ", encoder, " features (scripts/export_prompt_embeddings.py --model ", family, ")");
}

/// check_prompt_file, and the widths match a FLUX model: pooled there, context_in and vec_in of `config`.
/// Example: a file of context [12, 3, 32] against flux_config::dev() throws
///   "prompts.safetensors: context width 32 does not match the model's context_in 4096".
inline void check_prompt_file(const prompt_file& file, const flux_config& config, std::string_view source) {
  check_prompt_file(file, source);
  require(file.embeddings.pooled.defined(), source, ": tensor 'pooled' is missing (FLUX needs pooled vectors)");
  require(file.embeddings.context.size(2) == config.context_in, source, ": context width ",
          file.embeddings.context.size(2), " does not match the model's context_in ", config.context_in);
  require(file.embeddings.pooled.size(1) == config.vec_in, source, ": pooled width ", file.embeddings.pooled.size(1),
          " does not match the model's vec_in ", config.vec_in);
}

/// check_prompt_file, and the features fit a Wan model: width text_dim, at most text_len tokens (pooled unused).
/// Example: context [2, 600, 4096] against wan_config::t2v_1_3b() throws
///   "p.safetensors: text features [2, 600, 4096] do not fit the model's text_dim 4096 and text_len 512".
inline void check_prompt_file(const prompt_file& file, const wan_config& config, std::string_view source) {
  check_prompt_file(file, source);
  const torch::Tensor& context = file.embeddings.context;
  require(context.size(2) == config.text_dim && context.size(1) <= config.text_len, source, ": text features [",
          context.size(0), ", ", context.size(1), ", ", context.size(2), "] do not fit the model's text_dim ",
          config.text_dim, " and text_len ", config.text_len);
}

/// Writes `file` (tensors as float32) to `path` atomically in the layout above.
/// Example: 2 prompts {"a red circle", "a blue square"}, context [2, 3, 32], pooled [2, 32] -> metadata
///   prompts "a red circle\na blue square", context_in "32", vec_in "32", text_len "3".
/// @pre check_prompt_file passes and no prompt holds '\n' (else invalid_input naming the path).
inline void save_prompt_file(const std::filesystem::path& path, const prompt_file& file) {
  const std::string source = path.string();
  check_prompt_file(file, source);
  const auto host = [](const torch::Tensor& t) { return t.detach().to(torch::kCPU, torch::kFloat32); };
  std::map<std::string, torch::Tensor> tensors{{"context", host(file.embeddings.context)}};
  std::map<std::string, std::string> metadata{{"prompts", detail::join_prompts(file.prompts, "prompt", source)},
                                              {"context_in", std::to_string(file.embeddings.context.size(2))},
                                              {"text_len", std::to_string(file.embeddings.context.size(1))}};
  if (file.embeddings.pooled.defined()) {
    tensors["pooled"] = host(file.embeddings.pooled);
    metadata["vec_in"] = std::to_string(file.embeddings.pooled.size(1));
  }
  if (file.has_negatives()) {
    tensors["negative_context"] = host(file.negative_embeddings.context);
    if (file.negative_embeddings.pooled.defined()) tensors["negative_pooled"] = host(file.negative_embeddings.pooled);
    tensors["negative_index"] = torch::tensor(file.negative_index, torch::kInt64);
    metadata["negative_prompts"] = detail::join_prompts(file.negative_prompts, "negative prompt", source);
  }
  if (!file.family.empty()) metadata["family"] = file.family;
  if (!file.encoder.empty()) metadata["encoder"] = file.encoder;
  save_safetensors(path, tensors, metadata);
}

/// save_prompt_file of `embeddings` and `prompts` alone (no negatives, no family or encoder).
inline void save_prompt_file(const std::filesystem::path& path, const prompt_embeddings& embeddings,
                             std::span<const std::string> prompts) {
  save_prompt_file(path, prompt_file{.embeddings = embeddings,
                                     .prompts = std::vector<std::string>(prompts.begin(), prompts.end()),
                                     .negative_embeddings = {},
                                     .negative_prompts = {},
                                     .negative_index = {}});
}

/// Reads a prompt-embeddings file (float32, CPU) and checks it (check_prompt_file; only the tensors of the layout;
/// the "prompts" metadata present; widths in the metadata, when present, equal to the tensors').
/// Example: load_prompt_file("models/shapes-tiny/prompts.safetensors") -> 12 prompts, context [12, 3, 32].
///   A file whose "prompts" holds 11 lines for 12 rows throws "...: 11 prompt strings for 12 embedding rows".
inline prompt_file load_prompt_file(const std::filesystem::path& path) {
  const std::string source = path.string();
  const safetensors_file file(path);
  prompt_file out;
  constexpr std::array<std::string_view, 5> names = {"context", "pooled", "negative_context", "negative_pooled",
                                                     "negative_index"};
  for (const safetensors_tensor& tensor : file.tensors())
    require(std::find(names.begin(), names.end(), tensor.name) != names.end(), source, ": unexpected tensor '",
            tensor.name, "' (a prompt file holds context, pooled, negative_context, negative_pooled, negative_index)");
  const auto load = [&](std::string_view name) {
    const safetensors_tensor* tensor = file.find(name);
    if (tensor == nullptr) return torch::Tensor();
    const bool floating = tensor->dtype == safetensors_dtype::f32 || tensor->dtype == safetensors_dtype::f16 ||
                          tensor->dtype == safetensors_dtype::bf16 || tensor->dtype == safetensors_dtype::f64;
    require(floating, source, ": tensor '", name, "' has dtype ", safetensors_dtype_name(tensor->dtype),
            ", expected F32");
    return to_torch(*tensor, {.dtype = torch::kFloat32});
  };
  out.embeddings.context = load("context");
  require(out.embeddings.context.defined(), source, ": tensor 'context' is missing");
  out.embeddings.pooled = load("pooled");
  out.negative_embeddings.context = load("negative_context");
  out.negative_embeddings.pooled = load("negative_pooled");
  const auto& metadata = file.metadata();
  const auto text = [&](const std::string& key) {
    const auto it = metadata.find(key);
    return it == metadata.end() ? std::optional<std::string>() : std::optional<std::string>(it->second);
  };
  const std::optional<std::string> prompts = text("prompts");
  require(prompts.has_value(), source, ": no __metadata__ key 'prompts' (the prompt strings)");
  out.prompts = detail::split_prompts(*prompts);
  if (const std::optional<std::string> negatives = text("negative_prompts"))
    out.negative_prompts = detail::split_prompts(*negatives);
  if (out.has_negatives()) {
    require(text("negative_prompts").has_value(), source,
            ": no __metadata__ key 'negative_prompts' beside tensor 'negative_context'");
    if (const safetensors_tensor* index = file.find("negative_index")) {
      require(index->dtype == safetensors_dtype::i64 && index->shape.size() == 1, source,
              ": tensor 'negative_index' must be I64 [N], got ", safetensors_dtype_name(index->dtype), " of ",
              index->shape.size(), " dimensions");
      const torch::Tensor values = to_torch(*index).contiguous();
      out.negative_index.assign(values.data_ptr<std::int64_t>(), values.data_ptr<std::int64_t>() + values.numel());
    } else {
      require(out.negative_embeddings.context.size(0) == 1, source, ": ", out.negative_embeddings.context.size(0),
              " negative prompts need tensor 'negative_index' (which prompt takes which)");
      out.negative_index.assign(out.prompts.size(), 0);
    }
  } else {
    require(file.find("negative_index") == nullptr, source, ": tensor 'negative_index' without 'negative_context'");
  }
  out.family = text("family").value_or("");
  out.encoder = text("encoder").value_or("");
  require(out.family.empty() || out.family == "flux" || out.family == "wan", source, ": __metadata__ family '",
          out.family, "' is not flux or wan");
  check_prompt_file(out, source);
  const auto width = [&](const std::string& key, const torch::Tensor& tensor, std::int64_t dim) {
    const std::optional<std::string> value = text(key);
    if (!value || !tensor.defined()) return;
    require(*value == std::to_string(tensor.size(dim)), source, ": __metadata__ ", key, " '", *value,
            "' does not match the tensor's ", tensor.size(dim));
  };
  width("context_in", out.embeddings.context, 2);
  width("vec_in", out.embeddings.pooled, 1);
  width("text_len", out.embeddings.context, 1);
  return out;
}

}  // namespace branchgrpo
