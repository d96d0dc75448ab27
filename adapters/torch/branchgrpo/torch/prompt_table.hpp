#pragma once
// The text conditioning a denoiser looks up by prompt row: rows held in memory (a small table, the shipped
// models' prompts, negative prompts) or read on demand from memory-mapped prompt files (a dataset of any size in
// shards, flux/prompt_embeddings.hpp's open_prompt_dataset). A call copies only its batch's rows, to the model's
// device, so neither the host nor the device holds the table: 50,000 FLUX prompts are 400 GB of float32 features,
// and a batch of 16 is 128 MiB.
//
//   prompt_table table(prompt_embeddings{context, pooled});   rows in memory (any device)
//   table.append(prompt_table::mapped(file, context, pooled))  rows of a mapped file after them
//   table.rows({5, 0, 5}, device)                              {context [3, L, D], pooled [3, V]} float32
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/safetensors.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/safetensors.hpp"

namespace branchgrpo {

/// Text conditioning per prompt index: token features [N, L, D] (FLUX: T5's, Wan: umT5's) and pooled vectors
/// [N, V] (FLUX: CLIP's; undefined for Wan).
struct prompt_embeddings {
  torch::Tensor context;
  torch::Tensor pooled;
};

/// Rows of prompt conditioning, in segments: tensors in memory or tensors of a mapped file, numbered one after
/// the other. Copies share the segments (and the mappings).
/// Example: a table of 2 rows in memory with a mapped file of 3 rows appended has size() 5; rows({4, 0}, kCPU)
///   is {context [2, L, D], pooled [2, V]}: the file's last row, then the first row in memory.
/// @pre every segment has the same tokens L and widths D (and V, or no pooled at all): append checks it.
class prompt_table {
 public:
  prompt_table() = default;
  /// Rows in memory. Throws invalid_input unless context is [N, L, D] (N, L, D >= 1) and pooled, when defined,
  /// [N, V].
  prompt_table(prompt_embeddings rows) {  // NOLINT(google-explicit-constructor): a table of its rows
    require(rows.context.defined() && rows.context.dim() == 3 && rows.context.size(0) >= 1 &&
                rows.context.size(1) >= 1 && rows.context.size(2) >= 1,
            "prompt context must be [N, L, D], got ",
            rows.context.defined() ? rows.context.sizes() : c10::IntArrayRef{});
    require(!rows.pooled.defined() || (rows.pooled.dim() == 2 && rows.pooled.size(0) == rows.context.size(0)),
            "prompt pooled vectors must be [", rows.context.size(0), ", V], got ", rows.pooled.sizes());
    segment s{.first = 0, .count = rows.context.size(0), .memory = std::move(rows), .file = {}};
    segments_.push_back(std::move(s));
  }

  /// Rows in memory: prompt_table(prompt_embeddings{context, pooled}).
  prompt_table(torch::Tensor context, torch::Tensor pooled)
      : prompt_table(prompt_embeddings{.context = std::move(context), .pooled = std::move(pooled)}) {}

  /// The rows of `context` ([n, L, D]) and `pooled` ([n, V] or nullptr) inside `file`'s mapping, read on demand.
  /// @pre both are tensors of `file` with a floating dtype (load_prompt_file's checks); the file stays open as
  ///   long as a copy of the table lives.
  static prompt_table mapped(std::shared_ptr<const safetensors_file> file, const safetensors_tensor& context,
                             const safetensors_tensor* pooled) {
    require(context.shape.size() == 3 && context.shape[0] >= 1 && context.shape[1] >= 1 && context.shape[2] >= 1,
            file->path().string(), ": tensor 'context' must be [N, L, D]");
    require(pooled == nullptr || (pooled->shape.size() == 2 && pooled->shape[0] == context.shape[0]),
            file->path().string(), ": tensor 'pooled' must be [", context.shape[0], ", V]");
    prompt_table out;
    out.segments_.push_back(
        segment{.first = 0,
                .count = context.shape[0],
                .memory = {},
                .file = mapped_rows{.file = std::move(file), .context = &context, .pooled = pooled}});
    return out;
  }

  /// Appends `more`'s rows after these: row size() + j is more's row j.
  /// Example: a table of 12 prompts with one negative appended: row 12 is the negative.
  void append(const prompt_table& more) {
    require(more.size() >= 1, "prompt_table::append of an empty table");
    if (size() > 0) {
      require(more.tokens() == tokens() && more.width() == width(), "prompt rows of ", more.tokens(), " x ",
              more.width(), " features appended to a table of ", tokens(), " x ", width());
      require(more.pooled_width() == pooled_width(), "prompt rows with pooled width ", more.pooled_width(),
              " appended to a table with pooled width ", pooled_width(), " (0: none)");
    }
    const std::int64_t offset = size();
    for (segment s : more.segments_) {
      s.first += offset;
      segments_.push_back(std::move(s));
    }
  }

  [[nodiscard]] std::int64_t size() const {
    return segments_.empty() ? 0 : segments_.back().first + segments_.back().count;
  }
  /// L: tokens per prompt.
  [[nodiscard]] std::int64_t tokens() const { return context_dims().first; }
  /// D: the token features' width.
  [[nodiscard]] std::int64_t width() const { return context_dims().second; }
  /// V: the pooled vectors' width; 0 without pooled vectors.
  [[nodiscard]] std::int64_t pooled_width() const {
    require(!segments_.empty(), "an empty prompt table");
    const segment& s = segments_.front();
    if (s.file.file) return s.file.pooled == nullptr ? 0 : s.file.pooled->shape[1];
    return s.memory.pooled.defined() ? s.memory.pooled.size(1) : 0;
  }
  [[nodiscard]] bool has_pooled() const { return pooled_width() > 0; }
  /// Whether every row is in memory (no mapped file).
  [[nodiscard]] bool in_memory() const {
    for (const segment& s : segments_)
      if (s.file.file) return false;
    return true;
  }

  /// The rows `index` (in that order) as float32 on `device`: context [k, L, D] and pooled [k, V] (undefined
  /// without pooled vectors). A mapped row is copied out of its file and checked finite.
  /// Example: rows({7}, kCUDA) of a dataset whose row 7 holds a NaN throws
  ///   "data/p-00000-of-00002.safetensors: prompt 7: tensor 'context' holds a non-finite value (nan) at element 3".
  /// @pre every index in [0, size()) (else invalid_input naming the row and the size).
  [[nodiscard]] prompt_embeddings rows(std::span<const std::int64_t> index, torch::Device device) const {
    require(!index.empty(), "prompt_table::rows of no rows");
    const std::int64_t n = size();
    std::vector<torch::Tensor> context, pooled;
    context.reserve(index.size());
    for (std::size_t r = 0; r < index.size(); ++r) {
      const std::int64_t row = index[r];
      require(row >= 0 && row < n, "row ", r, " has prompt ", row, ", the table has ", n);
      const segment& s = segment_of(row);
      const std::int64_t local = row - s.first;
      if (s.file.file) {
        const std::string source = s.file.file->path().string() + ": prompt " + std::to_string(local);
        context.push_back(read_row(*s.file.context, local, source));
        if (s.file.pooled != nullptr) pooled.push_back(read_row(*s.file.pooled, local, source));
      } else {
        context.push_back(s.memory.context[local].to(torch::kCPU, torch::kFloat32));
        if (s.memory.pooled.defined()) pooled.push_back(s.memory.pooled[local].to(torch::kCPU, torch::kFloat32));
      }
    }
    prompt_embeddings out{.context = torch::stack(context).to(device), .pooled = {}};
    if (!pooled.empty()) out.pooled = torch::stack(pooled).to(device);
    return out;
  }

 private:
  struct mapped_rows {
    std::shared_ptr<const safetensors_file> file;  ///< null for rows in memory
    const safetensors_tensor* context = nullptr;   ///< views into the file's (stable) tensor list
    const safetensors_tensor* pooled = nullptr;
  };
  struct segment {
    std::int64_t first = 0;  ///< the table row of the segment's row 0
    std::int64_t count = 0;
    prompt_embeddings memory;
    mapped_rows file;
  };

  // Row `local` of a mapped [n, ...] tensor as float32 [...], through to_torch's copy and finiteness check.
  static torch::Tensor read_row(const safetensors_tensor& tensor, std::int64_t local, const std::string& source) {
    const std::size_t row_bytes = tensor.data.size() / static_cast<std::size_t>(tensor.shape[0]);
    const safetensors_tensor row{.name = tensor.name,
                                 .dtype = tensor.dtype,
                                 .shape = std::vector<std::int64_t>(tensor.shape.begin() + 1, tensor.shape.end()),
                                 .data = tensor.data.subspan(static_cast<std::size_t>(local) * row_bytes, row_bytes)};
    return to_torch(row, {.dtype = torch::kFloat32, .finite = true}, source);
  }

  // {L, D} of the first segment (append keeps every segment's equal).
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> context_dims() const {
    require(!segments_.empty(), "an empty prompt table");
    const segment& s = segments_.front();
    if (s.file.file) return {s.file.context->shape[1], s.file.context->shape[2]};
    return {s.memory.context.size(1), s.memory.context.size(2)};
  }

  [[nodiscard]] const segment& segment_of(std::int64_t row) const {
    // The segments are few (shards and one negatives' table): a binary search on their first rows.
    const auto it = std::upper_bound(segments_.begin(), segments_.end(), row,
                                     [](std::int64_t r, const segment& s) { return r < s.first; });
    return *(it - 1);
  }

  std::vector<segment> segments_;
};

}  // namespace branchgrpo
