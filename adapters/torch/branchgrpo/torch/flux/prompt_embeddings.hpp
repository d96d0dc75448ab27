#pragma once
// The prompt-embeddings file: precomputed text conditioning for a fixed list of prompts, so training never runs
// a text encoder (docs/prompt_embeddings.md). A safetensors file holding exactly
//   tensor "context"  [N, L, context_in]  F32   per-prompt token features (T5-XXL for FLUX: context_in 4096)
//   tensor "pooled"   [N, vec_in]         F32   per-prompt pooled vector (CLIP-L for FLUX: vec_in 768)
//   __metadata__ "prompts"     the N prompt strings joined with "\n" (so no prompt holds a newline)
//                "context_in"  decimal, equal to the context's last dimension  (optional on load)
//                "vec_in"      decimal, equal to the pooled's last dimension   (optional on load)
// F16, BF16 and F64 tensors are accepted too and converted to float32 on load. Row n of both tensors belongs
// to prompt n; a prompt index in a batch is a row of this table.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/flux/config.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/flux/denoiser.hpp"
#include "branchgrpo/torch/safetensors.hpp"

namespace branchgrpo {

/// The contents of a prompt-embeddings file.
struct prompt_file {
  prompt_embeddings embeddings;      ///< float32, CPU
  std::vector<std::string> prompts;  ///< prompts[n] is row n
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

}  // namespace detail

/// Throws invalid_input ("<source>: ...", one line) unless `file` is consistent: context [N, L, C] and pooled
/// [N, V] floating and finite, N >= 1, N prompts.
inline void check_prompt_file(const prompt_file& file, std::string_view source) {
  detail::check_prompt_tensor(file.embeddings.context, "context", 3, source);
  detail::check_prompt_tensor(file.embeddings.pooled, "pooled", 2, source);
  const std::int64_t n = file.embeddings.context.size(0);
  require(file.embeddings.pooled.size(0) == n, source, ": tensor 'context' holds ", n, " prompts, 'pooled' ",
          file.embeddings.pooled.size(0));
  require(static_cast<std::int64_t>(file.prompts.size()) == n, source, ": ", file.prompts.size(),
          " prompt strings for ", n, " embedding rows");
}

/// check_prompt_file, and the widths match a model: context_in and vec_in of `config`.
/// Example: a file of context [12, 3, 32] against flux_config::dev() throws
///   "prompts.safetensors: context width 32 does not match the model's context_in 4096".
inline void check_prompt_file(const prompt_file& file, const flux_config& config, std::string_view source) {
  check_prompt_file(file, source);
  require(file.embeddings.context.size(2) == config.context_in, source, ": context width ",
          file.embeddings.context.size(2), " does not match the model's context_in ", config.context_in);
  require(file.embeddings.pooled.size(1) == config.vec_in, source, ": pooled width ", file.embeddings.pooled.size(1),
          " does not match the model's vec_in ", config.vec_in);
}

/// Writes `embeddings` (as float32) and `prompts` to `path` atomically in the layout above.
/// Example: 2 prompts {"a red circle", "a blue square"}, context [2, 3, 32], pooled [2, 32] -> metadata
///   prompts "a red circle\na blue square", context_in "32", vec_in "32".
/// @pre check_prompt_file passes and no prompt holds '\n' (else invalid_input naming the path).
inline void save_prompt_file(const std::filesystem::path& path, const prompt_embeddings& embeddings,
                             std::span<const std::string> prompts) {
  const std::string source = path.string();
  const prompt_file file{embeddings, std::vector<std::string>(prompts.begin(), prompts.end())};
  check_prompt_file(file, source);
  std::string joined;
  for (std::size_t n = 0; n < prompts.size(); ++n) {
    require(prompts[n].find('\n') == std::string::npos, source, ": prompt ", n, " holds a newline");
    joined += (n ? "\n" : "") + prompts[n];
  }
  save_safetensors(path,
                   {{"context", embeddings.context.detach().to(torch::kCPU, torch::kFloat32)},
                    {"pooled", embeddings.pooled.detach().to(torch::kCPU, torch::kFloat32)}},
                   {{"prompts", joined},
                    {"context_in", std::to_string(embeddings.context.size(2))},
                    {"vec_in", std::to_string(embeddings.pooled.size(1))}});
}

/// Reads a prompt-embeddings file (float32, CPU) and checks it (check_prompt_file; exactly the two tensors; the
/// "prompts" metadata present; "context_in" / "vec_in", when present, equal to the widths).
/// Example: load_prompt_file("models/shapes-tiny/prompts.safetensors") -> 12 prompts, context [12, 3, 32].
///   A file whose "prompts" holds 11 lines for 12 rows throws "...: 11 prompt strings for 12 embedding rows".
inline prompt_file load_prompt_file(const std::filesystem::path& path) {
  const std::string source = path.string();
  const safetensors_file file(path);
  prompt_file out;
  for (const safetensors_tensor& tensor : file.tensors())
    require(tensor.name == "context" || tensor.name == "pooled", source, ": unexpected tensor '", tensor.name,
            "' (a prompt file holds 'context' and 'pooled')");
  const auto load = [&](std::string_view name) {
    const safetensors_tensor* tensor = file.find(name);
    require(tensor != nullptr, source, ": tensor '", name, "' is missing");
    const bool floating = tensor->dtype == safetensors_dtype::f32 || tensor->dtype == safetensors_dtype::f16 ||
                          tensor->dtype == safetensors_dtype::bf16 || tensor->dtype == safetensors_dtype::f64;
    require(floating, source, ": tensor '", name, "' has dtype ", safetensors_dtype_name(tensor->dtype),
            ", expected F32");
    return to_torch(*tensor, {.dtype = torch::kFloat32});
  };
  out.embeddings.context = load("context");
  out.embeddings.pooled = load("pooled");
  const auto& metadata = file.metadata();
  const auto prompts = metadata.find("prompts");
  require(prompts != metadata.end(), source, ": no __metadata__ key 'prompts' (the prompt strings)");
  out.prompts = detail::split_prompts(prompts->second);
  check_prompt_file(out, source);
  const auto width = [&](const std::string& key, std::int64_t actual) {
    const auto it = metadata.find(key);
    if (it == metadata.end()) return;
    require(it->second == std::to_string(actual), source, ": __metadata__ ", key, " '", it->second,
            "' does not match the tensor width ", actual);
  };
  width("context_in", out.embeddings.context.size(2));
  width("vec_in", out.embeddings.pooled.size(1));
  return out;
}

}  // namespace branchgrpo
