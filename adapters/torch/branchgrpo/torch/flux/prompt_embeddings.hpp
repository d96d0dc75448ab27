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
//                "family"            a model_spec_table name ("flux", "wan", "sd3"): the model family the features
//                                    are for (optional; Wan2.2 reads Wan's umT5 features, "wan")
//                "encoder"           "t5+clip" (FLUX), "umt5" (Wan), "clip-l+clip-g+t5" (SD3), "shapes" (the
//                                    shipped models) (optional)
//                "context_in", "vec_in", "text_len"   decimal widths D, V and length L (optional on load)
// F16, BF16 and F64 tensors are accepted too and converted to float32 on load. Row n of context and pooled
// belongs to prompt n; a prompt index in a batch is a row of this table.
//
//   load_prompt_file(path)     one file, loaded whole (small tables: the shipped models', tests)
//   open_prompt_dataset(path)  a file or a directory of its shards, memory-mapped and read by row (prompt_table):
//                              a dataset of any size (docs/prompt_embeddings.md, "Datasets at scale")
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/model_specs/flux/config.hpp"
#include "branchgrpo/model_specs/registry.hpp"
#include "branchgrpo/model_specs/wan/config.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/flux/denoiser.hpp"
#include "branchgrpo/torch/prompt_table.hpp"
#include "branchgrpo/torch/safetensors.hpp"

namespace branchgrpo {

/// The contents of a prompt-embeddings file.
struct prompt_file {
  prompt_embeddings embeddings;               ///< float32, CPU; pooled undefined in a file without it (Wan)
  std::vector<std::string> prompts;           ///< prompts[n] is row n
  prompt_embeddings negative_embeddings;      ///< [M, ...] float32, CPU; context undefined without negatives
  std::vector<std::string> negative_prompts;  ///< the M negative prompts
  std::vector<std::int64_t> negative_index;   ///< with negatives: prompt n's negative row, in [0, M)
  std::string family = {};                    ///< "flux", "wan", "sd3" or "" (a file that does not say)
  std::string encoder = {};                   ///< "t5+clip", "umt5", "clip-l+clip-g+t5", "shapes", ... or ""

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

// The negatives' part of check_prompt_file, for a table of n prompts of tokens x width features (pooled_width 0:
// no pooled vectors).
inline void check_negatives(const prompt_embeddings& negatives, std::span<const std::string> negative_prompts,
                            std::span<const std::int64_t> negative_index, std::int64_t n, std::int64_t tokens,
                            std::int64_t width, std::int64_t pooled_width, std::string_view source) {
  const bool pooled = pooled_width > 0;
  if (!negatives.context.defined()) {
    require(negative_prompts.empty() && negative_index.empty() && !negatives.pooled.defined(), source,
            ": negative prompts without tensor 'negative_context'");
    return;
  }
  const torch::Tensor& negative = negatives.context;
  check_prompt_tensor(negative, "negative_context", 3, source);
  require(negative.size(1) == tokens && negative.size(2) == width, source, ": tensor 'negative_context' has shape ",
          negative.sizes(), ": its tokens and width must be context's [", tokens, ", ", width, "]");
  const std::int64_t m = negative.size(0);
  require(static_cast<std::int64_t>(negative_prompts.size()) == m, source, ": ", negative_prompts.size(),
          " negative prompt strings for ", m, " negative embedding rows");
  require(negatives.pooled.defined() == pooled, source, ": tensor 'negative_pooled' ",
          pooled ? "is missing beside 'pooled'" : "is there without 'pooled'");
  if (pooled) {
    check_prompt_tensor(negatives.pooled, "negative_pooled", 2, source);
    require(negatives.pooled.size(0) == m && negatives.pooled.size(1) == pooled_width, source,
            ": tensor 'negative_pooled' has shape ", negatives.pooled.sizes(), ", expected [", m, ", ", pooled_width,
            "]");
  }
  require(static_cast<std::int64_t>(negative_index.size()) == n, source, ": ", negative_index.size(),
          " negative indices for ", n, " prompts");
  for (std::size_t i = 0; i < negative_index.size(); ++i)
    require(negative_index[i] >= 0 && negative_index[i] < m, source, ": negative_index[", i, "] = ", negative_index[i],
            " is not a negative row in [0, ", m, ")");
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
  detail::check_negatives(file.negative_embeddings, file.negative_prompts, file.negative_index, n, context.size(1),
                          context.size(2), pooled ? file.embeddings.pooled.size(1) : 0, source);
}

/// Two rows of a prompt set that hold the same prompt: the first such pair (by its later row), and how many rows in
/// all repeat an earlier row's prompt.
struct repeated_prompt {
  std::size_t first = 0;    ///< the earlier row
  std::size_t second = 0;   ///< the first row that repeats an earlier one
  std::size_t repeats = 0;  ///< rows that repeat an earlier row (2 for {"a", "b", "a", "a"})
};

/// The rows of `prompts` that repeat an earlier row's prompt (exact text), or nothing when every prompt is distinct.
/// A repeated prompt is trained as often as the rows that hold it: usually a mistake of the export, worth a warning.
/// Example: {"a red circle", "a blue square", "a red circle", "a red circle"} -> {.first = 0, .second = 2,
///   .repeats = 2}; {"a", "b"} -> nullopt.
inline std::optional<repeated_prompt> find_repeated_prompt(std::span<const std::string> prompts) {
  std::map<std::string_view, std::size_t> seen;
  std::optional<repeated_prompt> out;
  for (std::size_t row = 0; row < prompts.size(); ++row) {
    const auto [at, inserted] = seen.emplace(prompts[row], row);
    if (inserted) continue;
    if (!out) out = repeated_prompt{.first = at->second, .second = row, .repeats = 0};
    ++out->repeats;
  }
  return out;
}

/// Throws invalid_input unless the file was made for `family` ("flux", "wan" or "sd3") and, when `encoder` is not "",
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

namespace detail {

// What a prompt file holds besides its prompts' rows: validated from the header and the metadata, with the
// negatives (small) loaded; `context` and `pooled` point into the file's tensors.
struct prompt_file_header {
  const safetensors_tensor* context = nullptr;
  const safetensors_tensor* pooled = nullptr;
  std::vector<std::string> prompts;
  prompt_embeddings negative_embeddings;
  std::vector<std::string> negative_prompts;
  std::vector<std::int64_t> negative_index;
  std::string family, encoder;
};

// Every check of load_prompt_file that needs no pass over the prompts' rows: the tensors of the layout with
// floating dtypes and the shapes of check_prompt_file, the metadata, the negatives (loaded; check_negatives tests
// them).
inline prompt_file_header read_prompt_file_header(const safetensors_file& file, const std::string& source) {
  constexpr std::array<std::string_view, 5> names = {"context", "pooled", "negative_context", "negative_pooled",
                                                     "negative_index"};
  for (const safetensors_tensor& tensor : file.tensors())
    require(std::find(names.begin(), names.end(), tensor.name) != names.end(), source, ": unexpected tensor '",
            tensor.name, "' (a prompt file holds context, pooled, negative_context, negative_pooled, negative_index)");
  const auto floating = [&](std::string_view name) {
    const safetensors_tensor* tensor = file.find(name);
    if (tensor == nullptr) return tensor;
    const bool ok = tensor->dtype == safetensors_dtype::f32 || tensor->dtype == safetensors_dtype::f16 ||
                    tensor->dtype == safetensors_dtype::bf16 || tensor->dtype == safetensors_dtype::f64;
    require(ok, source, ": tensor '", name, "' has dtype ", safetensors_dtype_name(tensor->dtype), ", expected F32");
    return tensor;
  };
  const auto shape_text = [](const safetensors_tensor& t) {
    std::string text = "[";
    for (std::size_t d = 0; d < t.shape.size(); ++d) text += (d ? ", " : "") + std::to_string(t.shape[d]);
    return text + "]";
  };
  prompt_file_header out;
  out.context = floating("context");
  require(out.context != nullptr, source, ": tensor 'context' is missing");
  out.pooled = floating("pooled");
  const auto check_shape = [&](const safetensors_tensor& t, std::size_t dims) {
    require(t.shape.size() == dims, source, ": tensor '", t.name, "' has shape ", shape_text(t), ", expected ",
            dims == 3 ? "[N, L, context_in]" : "[N, vec_in]");
    for (const std::int64_t d : t.shape)
      require(d >= 1, source, ": tensor '", t.name, "' has shape ", shape_text(t), " with an empty dimension");
  };
  check_shape(*out.context, 3);
  const std::int64_t n = out.context->shape[0];
  if (out.pooled != nullptr) {
    check_shape(*out.pooled, 2);
    require(out.pooled->shape[0] == n, source, ": tensor 'context' holds ", n, " prompts, 'pooled' ",
            out.pooled->shape[0]);
  }
  const auto& metadata = file.metadata();
  const auto text = [&](const std::string& key) {
    const auto it = metadata.find(key);
    return it == metadata.end() ? std::optional<std::string>() : std::optional<std::string>(it->second);
  };
  const std::optional<std::string> prompts = text("prompts");
  require(prompts.has_value(), source, ": no __metadata__ key 'prompts' (the prompt strings)");
  out.prompts = split_prompts(*prompts);
  require(static_cast<std::int64_t>(out.prompts.size()) == n, source, ": ", out.prompts.size(), " prompt strings for ",
          n, " embedding rows");
  const auto load_small = [&](std::string_view name) {
    const safetensors_tensor* tensor = floating(name);
    return tensor == nullptr ? torch::Tensor() : to_torch(*tensor, {.dtype = torch::kFloat32});
  };
  out.negative_embeddings.context = load_small("negative_context");
  out.negative_embeddings.pooled = load_small("negative_pooled");
  if (const std::optional<std::string> negatives = text("negative_prompts"))
    out.negative_prompts = split_prompts(*negatives);
  if (out.negative_embeddings.context.defined()) {
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
  const bool known = std::ranges::any_of(model_spec_table, [&](const model_spec& f) { return f.name == out.family; });
  require(out.family.empty() || known, source, ": __metadata__ family '", out.family, "' is not one of ",
          name_list(model_spec_names()));
  const auto width = [&](const std::string& key, const safetensors_tensor* tensor, std::size_t dim) {
    const std::optional<std::string> value = text(key);
    if (!value || tensor == nullptr) return;
    require(*value == std::to_string(tensor->shape[dim]), source, ": __metadata__ ", key, " '", *value,
            "' does not match the tensor's ", tensor->shape[dim]);
  };
  width("context_in", out.context, 2);
  width("vec_in", out.pooled, 1);
  width("text_len", out.context, 1);
  return out;
}

}  // namespace detail

/// Reads a prompt-embeddings file (float32, CPU) and checks it (check_prompt_file; only the tensors of the layout;
/// the "prompts" metadata present; widths in the metadata, when present, equal to the tensors').
/// Example: load_prompt_file("models/shapes-tiny/prompts.safetensors") -> 12 prompts, context [12, 3, 32].
///   A file whose "prompts" holds 11 lines for 12 rows throws "...: 11 prompt strings for 12 embedding rows".
inline prompt_file load_prompt_file(const std::filesystem::path& path) {
  const std::string source = path.string();
  const safetensors_file file(path);
  detail::prompt_file_header header = detail::read_prompt_file_header(file, source);
  prompt_file out{
      .embeddings = {.context = to_torch(*header.context, {.dtype = torch::kFloat32}),
                     .pooled = header.pooled == nullptr ? torch::Tensor()
                                                        : to_torch(*header.pooled, {.dtype = torch::kFloat32})},
      .prompts = std::move(header.prompts),
      .negative_embeddings = std::move(header.negative_embeddings),
      .negative_prompts = std::move(header.negative_prompts),
      .negative_index = std::move(header.negative_index),
      .family = std::move(header.family),
      .encoder = std::move(header.encoder)};
  check_prompt_file(out, source);
  return out;
}

/// A prompt dataset opened for reading by row: one prompt file, or a directory of its shards
/// NAME-00001-of-0000K.safetensors (scripts/export_prompt_embeddings.py --shard-rows), each a prompt file of the
/// layout above. The files are memory-mapped, not loaded: opening reads their headers and the prompt strings, and
/// a batch's rows are copied out of the mappings when the denoiser asks for them (prompt_table), so the resident
/// memory does not grow with the dataset (docs/prompt_embeddings.md, "Datasets at scale", has the measurement).
struct prompt_dataset {
  prompt_table rows;                          ///< the N prompts' rows, in shard order
  std::vector<std::string> prompts;           ///< prompts[n] is row n
  prompt_embeddings negative_embeddings;      ///< [M, ...] float32 in memory; context undefined without negatives
  std::vector<std::string> negative_prompts;  ///< the M distinct negative prompts of all shards
  std::vector<std::int64_t> negative_index;   ///< with negatives: prompt n's negative row, in [0, M)
  std::string family = {};                    ///< "flux", "wan" or ""
  std::string encoder = {};                   ///< as in prompt_file
  std::vector<std::filesystem::path> files;   ///< the shards (one for a single file)

  [[nodiscard]] bool has_negatives() const { return negative_embeddings.context.defined(); }
  /// The family and encoder, as check_prompt_source reads them.
  [[nodiscard]] prompt_file source_metadata() const {
    return prompt_file{.embeddings = {},
                       .prompts = {},
                       .negative_embeddings = {},
                       .negative_prompts = {},
                       .negative_index = {},
                       .family = family,
                       .encoder = encoder};
  }
};

namespace detail {

// The shards of a dataset directory, in order: every *.safetensors file is NAME-<i>-of-<K>.safetensors with one
// NAME and K, and i = 1 .. K all there (the layout of Hugging Face's sharded checkpoints).
inline std::vector<std::filesystem::path> prompt_shards(const std::filesystem::path& dir) {
  const std::string source = dir.string();
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
  require(!files.empty(), source, ": a prompt dataset directory holds no *.safetensors shards");
  std::sort(files.begin(), files.end());
  std::string stem, total_text;
  std::int64_t count = -1;
  std::size_t width = 0;  // the digits of a shard's number: 5 in p-00001-of-00004
  const auto shard_name = [&](std::int64_t i) {
    return stem + "-" + zero_padded(i, width) + "-of-" + total_text + ".safetensors";
  };
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string name = files[i].stem().string();
    const std::size_t of = name.rfind("-of-");
    const std::size_t dash = of == std::string::npos || of == 0 ? std::string::npos : name.rfind('-', of - 1);
    const auto digits = [](std::string_view text) {
      return !text.empty() && text.size() <= 9 &&
             std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    require(dash != std::string::npos && digits(std::string_view(name).substr(dash + 1, of - dash - 1)) &&
                digits(std::string_view(name).substr(of + 4)),
            source, ": shard '", files[i].filename().string(),
            "' is not named NAME-00001-of-00004.safetensors (a dataset directory holds only its shards)");
    const std::int64_t index = std::stoll(name.substr(dash + 1, of - dash - 1));
    if (i == 0) {
      stem = name.substr(0, dash);
      total_text = name.substr(of + 4);
      count = std::stoll(total_text);
      width = of - dash - 1;
    }
    require(name.substr(0, dash) == stem && name.substr(of + 4) == total_text, source, ": shard '",
            files[i].filename().string(), "' is not one of ", stem, "-*-of-", total_text, ".safetensors");
    require(index >= 1 && index <= count, source, ": shard '", files[i].filename().string(), "' numbers beyond 1..",
            count);
    require(index == static_cast<std::int64_t>(i) + 1, source, ": shard ", i + 1, " of ", count, " (",
            shard_name(static_cast<std::int64_t>(i) + 1), ") is missing");
  }
  require(static_cast<std::int64_t>(files.size()) == count, source, ": shard ", files.size() + 1, " of ", count, " (",
          shard_name(static_cast<std::int64_t>(files.size()) + 1), ") is missing");
  return files;
}

}  // namespace detail

/// Opens a prompt file or a shard directory for reading by row. Every shard passes load_prompt_file's checks but
/// the finiteness of its rows, which rows() tests as it copies them; the shards agree on tokens, widths, pooled,
/// family and encoder; a negative prompt that several shards hold has the same features in each (the dataset
/// keeps it once).
/// Example: a directory of p-00001-of-00002.safetensors (3 prompts) and p-00002-of-00002.safetensors (2) ->
///   5 prompts, rows 3 and 4 from the second shard. A missing first shard throws
///   "data: shard 1 of 2 (p-00001-of-00002.safetensors) is missing".
inline prompt_dataset open_prompt_dataset(const std::filesystem::path& path) {
  prompt_dataset out;
  out.files =
      std::filesystem::is_directory(path) ? detail::prompt_shards(path) : std::vector<std::filesystem::path>{path};
  std::vector<torch::Tensor> negative_context, negative_pooled;
  bool first_has_negatives = false;
  for (std::size_t s = 0; s < out.files.size(); ++s) {
    const std::string source = out.files[s].string();
    auto file = std::make_shared<const safetensors_file>(out.files[s]);
    detail::prompt_file_header header = detail::read_prompt_file_header(*file, source);
    const prompt_table rows = prompt_table::mapped(file, *header.context, header.pooled);
    detail::check_negatives(header.negative_embeddings, header.negative_prompts, header.negative_index, rows.size(),
                            rows.tokens(), rows.width(), rows.pooled_width(), source);
    if (s == 0) {
      out.family = header.family;
      out.encoder = header.encoder;
      first_has_negatives = header.negative_embeddings.context.defined();
    } else {
      require(header.family == out.family && header.encoder == out.encoder, source, ": family '", header.family,
              "' and encoder '", header.encoder, "', shard 1 has '", out.family, "' and '", out.encoder, "'");
      require(rows.tokens() == out.rows.tokens() && rows.width() == out.rows.width() &&
                  rows.pooled_width() == out.rows.pooled_width(),
              source, ": rows of ", rows.tokens(), " x ", rows.width(), " features (pooled width ", rows.pooled_width(),
              "), shard 1 has ", out.rows.tokens(), " x ", out.rows.width(), " (", out.rows.pooled_width(), ")");
      require(
          header.negative_embeddings.context.defined() == first_has_negatives, source,
          first_has_negatives ? ": has no negative prompts, shard 1 has" : ": has negative prompts, shard 1 has none");
    }
    // The shard's negatives, each kept once by its text: the shard's negative row j is the dataset's local[j].
    std::vector<std::int64_t> local;
    for (std::size_t j = 0; j < header.negative_prompts.size(); ++j) {
      const auto found =
          std::find(out.negative_prompts.begin(), out.negative_prompts.end(), header.negative_prompts[j]);
      const torch::Tensor context = header.negative_embeddings.context[static_cast<std::int64_t>(j)];
      if (found == out.negative_prompts.end()) {
        local.push_back(static_cast<std::int64_t>(out.negative_prompts.size()));
        out.negative_prompts.push_back(header.negative_prompts[j]);
        negative_context.push_back(context);
        if (header.negative_embeddings.pooled.defined())
          negative_pooled.push_back(header.negative_embeddings.pooled[static_cast<std::int64_t>(j)]);
      } else {
        const auto k = found - out.negative_prompts.begin();
        require(torch::equal(negative_context[static_cast<std::size_t>(k)], context), source, ": negative prompt \"",
                echo_middle(header.negative_prompts[j], 60), "\" has other features than in an earlier shard");
        local.push_back(k);
      }
    }
    for (const std::int64_t j : header.negative_index) out.negative_index.push_back(local[static_cast<std::size_t>(j)]);
    out.prompts.insert(out.prompts.end(), std::make_move_iterator(header.prompts.begin()),
                       std::make_move_iterator(header.prompts.end()));
    if (s == 0)
      out.rows = rows;
    else
      out.rows.append(rows);
  }
  if (!negative_context.empty()) {
    out.negative_embeddings.context = torch::stack(negative_context);
    if (!negative_pooled.empty()) out.negative_embeddings.pooled = torch::stack(negative_pooled);
  }
  return out;
}

/// check_prompt_file's FLUX width checks on a dataset: pooled there, context_in and vec_in of `config`.
inline void check_prompt_dataset(const prompt_dataset& data, const flux_config& config, std::string_view source) {
  require(data.rows.has_pooled(), source, ": tensor 'pooled' is missing (FLUX needs pooled vectors)");
  require(data.rows.width() == config.context_in, source, ": context width ", data.rows.width(),
          " does not match the model's context_in ", config.context_in);
  require(data.rows.pooled_width() == config.vec_in, source, ": pooled width ", data.rows.pooled_width(),
          " does not match the model's vec_in ", config.vec_in);
}

/// check_prompt_file's Wan checks on a dataset: width text_dim, at most text_len tokens.
inline void check_prompt_dataset(const prompt_dataset& data, const wan_config& config, std::string_view source) {
  require(data.rows.width() == config.text_dim && data.rows.tokens() <= config.text_len, source, ": text features [",
          data.rows.size(), ", ", data.rows.tokens(), ", ", data.rows.width(), "] do not fit the model's text_dim ",
          config.text_dim, " and text_len ", config.text_len);
}

}  // namespace branchgrpo
