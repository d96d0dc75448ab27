#pragma once
// Parsing and validation of a safetensors file already in memory (parse_safetensors) and of a sharded
// checkpoint's index JSON (parse_safetensors_index). Use it directly on a buffer you hold (a download, a fuzzer
// input); mapped_file.hpp opens files with it. docs/safetensors.md lists every check and its message.
//
// File layout:
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   UTF-8 JSON: {"name": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}, ...,
//                          "__metadata__": {"key": "value"}}   (may end with spaces)
//   the rest  the data buffer; data_offsets [begin, end) are relative to its start.
// A file is accepted only when every tensor's byte range matches its shape and dtype and the ranges tile the
// buffer exactly (sorted by offset, no gap, no overlap, nothing after the last), and the header keeps to
// tensor.hpp's bounds: at most safetensors_max_header_bytes, safetensors_max_tensors tensors and
// safetensors_max_header_values JSON values, the last two checked while parsing. Every rejection throws
// branchgrpo::invalid_input with one line naming the file and the tensor, e.g.
//   "model.safetensors: tensor 'img_in.weight': data_offsets [0, 12] hold 12 bytes but shape [2, 2] of F32
//    needs 16".
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/safetensors/dtype.hpp"
#include "branchgrpo/safetensors/json.hpp"
#include "branchgrpo/safetensors/tensor.hpp"
#include "branchgrpo/safetensors/text.hpp"

namespace branchgrpo {

/// What a header describes: the tensors sorted by name, and the `__metadata__` strings.
struct safetensors_contents {
  std::vector<safetensors_tensor> tensors;
  std::map<std::string, std::string> metadata;
};

/// A sharded checkpoint's `*.safetensors.index.json`: {"metadata": {...}, "weight_map": {"name": "file"}}.
/// Integer metadata values (Hugging Face writes "total_size") are kept as their decimal text.
struct safetensors_index {
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::string> weight_map;  ///< tensor name -> shard file, relative to the index
};

namespace safetensors_detail {

inline std::uint64_t read_le64(std::span<const std::byte> bytes) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < 8; ++i) value |= static_cast<std::uint64_t>(bytes[i]) << (8 * i);
  return value;
}

inline std::string metadata_value(const json_value& value, std::string_view source, std::string_view key,
                                  std::string_view where, bool integers_allowed) {
  if (value.type == json_value::kind::string) return value.string;
  if (integers_allowed && value.type == json_value::kind::integer) return std::to_string(value.integer);
  fail(source, ": ", where, " value of ", quote_name(key), " is ", value.kind_name(), ", not a string");
}

}  // namespace safetensors_detail

/// Parses and validates a whole safetensors file held in `bytes`; `source` names it in messages. The
/// returned tensors' data point into `bytes`. Throws invalid_input (one line, naming `source` and the
/// tensor) for any malformed input; never reads outside `bytes`.
/// Example: the 8-byte length 56, the 54-byte header {"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}
/// and 2 spaces, then 8 bytes -> one tensor "a", F32, shape [2], data = those 8 bytes; no metadata.
/// @post tensors are sorted by name and tile the data buffer exactly.
inline safetensors_contents parse_safetensors(std::span<const std::byte> bytes, std::string_view source = "<memory>") {
  using safetensors_detail::json_value;
  using safetensors_detail::quote_name;
  require(bytes.size() >= 8, source, ": file is ", bytes.size(), " bytes, shorter than the 8-byte header length");
  const std::uint64_t header_length = safetensors_detail::read_le64(bytes);
  require(header_length <= safetensors_max_header_bytes, source, ": header length ", header_length,
          " exceeds the limit of ", safetensors_max_header_bytes, " bytes");
  require(header_length <= bytes.size() - 8, source, ": header length ", header_length,
          " runs past the end of the file (", bytes.size() - 8, " bytes follow the length)");
  const std::string_view header(reinterpret_cast<const char*>(bytes.data() + 8), header_length);
  const std::span<const std::byte> buffer = bytes.subspan(8 + header_length);

  const json_value root = safetensors_detail::json_parser(
                              header, source, "tensor", "header",
                              {.max_members = safetensors_max_tensors, .max_values = safetensors_max_header_values})
                              .parse_document();
  require(root.type == json_value::kind::object, source, ": header is ", root.kind_name(), ", not a JSON object");

  safetensors_contents contents;
  struct range {
    std::uint64_t begin, end;
    std::size_t tensor;
  };
  std::vector<range> ranges;
  for (std::size_t m = 0; m < root.keys.size(); ++m) {
    const std::string& name = root.keys[m];
    const json_value& entry = root.items[m];
    if (name == "__metadata__") {
      require(entry.type == json_value::kind::object, source, ": __metadata__ is ", entry.kind_name(),
              ", not an object");
      for (std::size_t k = 0; k < entry.keys.size(); ++k)
        contents.metadata[entry.keys[k]] =
            safetensors_detail::metadata_value(entry.items[k], source, entry.keys[k], "__metadata__", false);
      continue;
    }
    const std::string where = std::string(source) + ": tensor " + quote_name(name) + ": ";
    require(entry.type == json_value::kind::object, where, "entry is ", entry.kind_name(), ", not an object");
    const json_value* dtype_value = nullptr;
    const json_value* shape_value = nullptr;
    const json_value* offsets_value = nullptr;
    for (std::size_t k = 0; k < entry.keys.size(); ++k) {
      const std::string& key = entry.keys[k];
      if (key == "dtype")
        dtype_value = &entry.items[k];
      else if (key == "shape")
        shape_value = &entry.items[k];
      else if (key == "data_offsets")
        offsets_value = &entry.items[k];
      else
        fail(where, "unexpected key ", quote_name(key), " (expected dtype, shape and data_offsets)");
    }
    require(dtype_value != nullptr, where, "missing 'dtype'");
    require(shape_value != nullptr, where, "missing 'shape'");
    require(offsets_value != nullptr, where, "missing 'data_offsets'");

    safetensors_tensor tensor;
    tensor.name = name;
    require(dtype_value->type == json_value::kind::string, where, "dtype is ", dtype_value->kind_name(),
            ", not a string");
    const std::optional<safetensors_dtype> dtype = safetensors_dtype_from_name(dtype_value->string);
    if (!dtype) {
      std::string known;
      for (safetensors_dtype d : safetensors_dtypes)
        known += (known.empty() ? "" : ", ") + std::string(safetensors_dtype_name(d));
      fail(where, "unknown dtype ", quote_name(dtype_value->string), " (known: ", known, ")");
    }
    tensor.dtype = *dtype;

    require(shape_value->type == json_value::kind::array, where, "shape is ", shape_value->kind_name(),
            ", not an array");
    for (std::size_t d = 0; d < shape_value->items.size(); ++d) {
      const json_value& extent = shape_value->items[d];
      require(extent.type == json_value::kind::integer, where, "shape entry ", d, " is ", extent.kind_name(),
              ", not an integer");
      require(extent.integer <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), where,
              "shape entry ", d, " = ", extent.integer, " exceeds 2^63 - 1");
      tensor.shape.push_back(static_cast<std::int64_t>(extent.integer));
    }

    require(offsets_value->type == json_value::kind::array && offsets_value->items.size() == 2 &&
                offsets_value->items[0].type == json_value::kind::integer &&
                offsets_value->items[1].type == json_value::kind::integer,
            where, "data_offsets must be an array of two integers [begin, end]");
    const std::uint64_t begin = offsets_value->items[0].integer;
    const std::uint64_t end = offsets_value->items[1].integer;
    require(begin <= end, where, "data_offsets [", begin, ", ", end, "] end before they begin");
    const std::optional<std::uint64_t> needed =
        safetensors_detail::byte_count(tensor.shape, safetensors_dtype_size(tensor.dtype));
    require(needed.has_value(), where, "shape ", safetensors_detail::shape_text(tensor.shape), " of ",
            safetensors_dtype_name(tensor.dtype), " needs more than 2^64 bytes");
    require(end - begin == *needed, where, "data_offsets [", begin, ", ", end, "] hold ", end - begin,
            " bytes but shape ", safetensors_detail::shape_text(tensor.shape), " of ",
            safetensors_dtype_name(tensor.dtype), " needs ", *needed);
    require(end <= buffer.size(), where, "data_offsets [", begin, ", ", end, "] end past the data buffer of ",
            buffer.size(), " bytes");
    tensor.data = buffer.subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(end - begin));
    ranges.push_back({begin, end, contents.tensors.size()});
    contents.tensors.push_back(std::move(tensor));
  }

  // The ranges must tile the buffer: sorted by offset, each starts where the previous one ends.
  std::sort(ranges.begin(), ranges.end(),
            [](const range& a, const range& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const range& r = ranges[i];
    const std::string where = std::string(source) + ": tensor " + quote_name(contents.tensors[r.tensor].name) + ": ";
    if (r.begin < covered) {
      const range& previous = ranges[i - 1];
      fail(where, "data_offsets [", r.begin, ", ", r.end, "] overlap tensor ",
           quote_name(contents.tensors[previous.tensor].name), " at [", previous.begin, ", ", previous.end, "]");
    }
    if (r.begin > covered)
      fail(where, "data_offsets [", r.begin, ", ", r.end, "] leave a gap of ", r.begin - covered, " bytes after ",
           i == 0 ? std::string("the start of the data buffer")
                  : "tensor " + quote_name(contents.tensors[ranges[i - 1].tensor].name));
    covered = r.end;
  }
  if (covered != buffer.size()) {
    if (ranges.empty()) fail(source, ": the header lists no tensors but ", buffer.size(), " data bytes follow it");
    fail(source, ": tensor ", quote_name(contents.tensors[ranges.back().tensor].name), ": the data buffer holds ",
         buffer.size(), " bytes but the tensors end at ", covered, " (", buffer.size() - covered, " trailing bytes)");
  }

  std::sort(contents.tensors.begin(), contents.tensors.end(),
            [](const safetensors_tensor& a, const safetensors_tensor& b) { return a.name < b.name; });
  return contents;
}

/// Parses a sharded checkpoint's index JSON (the text of `*.safetensors.index.json`); `source` names it.
/// Shard file names must be relative and stay inside the index's folder (no absolute path, no '..').
/// Example: {"metadata": {"total_size": 24}, "weight_map": {"a": "m-1.safetensors"}} -> metadata
/// {"total_size": "24"}, weight_map {"a": "m-1.safetensors"}.
inline safetensors_index parse_safetensors_index(std::string_view json, std::string_view source = "<memory>") {
  using safetensors_detail::json_value;
  using safetensors_detail::quote_name;
  require(safetensors_detail::valid_utf8(json), source, ": index is not valid UTF-8");
  const json_value root =
      safetensors_detail::json_parser(json, source, "key", "index", {.max_values = safetensors_max_header_values})
          .parse_document();
  require(root.type == json_value::kind::object, source, ": index is ", root.kind_name(), ", not a JSON object");
  safetensors_index index;
  bool has_weight_map = false;
  for (std::size_t m = 0; m < root.keys.size(); ++m) {
    const std::string& key = root.keys[m];
    const json_value& value = root.items[m];
    if (key == "metadata") {
      require(value.type == json_value::kind::object, source, ": 'metadata' is ", value.kind_name(), ", not an object");
      for (std::size_t k = 0; k < value.keys.size(); ++k)
        index.metadata[value.keys[k]] =
            safetensors_detail::metadata_value(value.items[k], source, value.keys[k], "metadata", true);
    } else if (key == "weight_map") {
      require(value.type == json_value::kind::object, source, ": 'weight_map' is ", value.kind_name(),
              ", not an object");
      has_weight_map = true;
      require(value.keys.size() <= safetensors_max_tensors, source, ": 'weight_map' lists ", value.keys.size(),
              " tensors, more than the ", safetensors_max_tensors, " a checkpoint may hold");
      for (std::size_t k = 0; k < value.keys.size(); ++k) {
        const std::string& name = value.keys[k];
        const json_value& file = value.items[k];
        const std::string where = std::string(source) + ": tensor " + quote_name(name) + ": ";
        require(file.type == json_value::kind::string, where, "weight_map entry is ", file.kind_name(),
                ", not a file name");
        require(!file.string.empty() && file.string.find('\0') == std::string::npos, where, "shard file name ",
                quote_name(file.string), " is empty or holds a NUL byte");
        const std::filesystem::path shard(file.string);
        require(shard.is_relative(), where, "shard file name ", quote_name(file.string), " is not relative");
        for (const auto& part : shard)
          require(part != "..", where, "shard file name ", quote_name(file.string), " leaves the index's folder");
        index.weight_map[name] = file.string;
      }
    } else {
      fail(source, ": unexpected key ", quote_name(key), " (expected 'metadata' and 'weight_map')");
    }
  }
  require(has_weight_map, source, ": missing 'weight_map'");
  return index;
}

}  // namespace branchgrpo
