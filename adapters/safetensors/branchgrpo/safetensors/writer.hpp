#pragma once
// Writing: serialize_safetensors builds a file's bytes in memory, write_safetensors writes them atomically
// (temporary file, fsync, rename). Tensors are written in name order, so equal inputs give equal files, and the
// header is padded with spaces so the data start 8-byte aligned. What it writes, parse_safetensors accepts.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/safetensors/dtype.hpp"
#include "branchgrpo/safetensors/json.hpp"
#include "branchgrpo/safetensors/tensor.hpp"
#include "branchgrpo/safetensors/text.hpp"

namespace branchgrpo {

/// One tensor to write: its bytes (little-endian, row-major) must number product(shape) x dtype size.
struct safetensors_entry {
  std::string name;
  safetensors_dtype dtype = safetensors_dtype::f32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> bytes;
};

namespace safetensors_detail {

inline void check_tensor_name(std::string_view source, std::string_view name) {
  require(valid_utf8(name), source, ": tensor ", quote_name(name), ": name is not valid UTF-8");
  require(name != "__metadata__", source, ": a tensor may not be called '__metadata__'");
}

// The 8-byte length and the header (keys sorted, padded with spaces to a multiple of 8 bytes), and the
// order in which the data follow it.
struct safetensors_layout {
  std::string prefix;
  std::vector<std::size_t> order;
};

inline safetensors_layout plan_safetensors(std::span<const safetensors_entry> tensors,
                                           const std::map<std::string, std::string>& metadata,
                                           std::string_view destination) {
  // The reader's bounds (tensor.hpp), so that what is written can be read back.
  require(tensors.size() <= safetensors_max_tensors, destination, ": ", tensors.size(), " tensors exceed the limit of ",
          safetensors_max_tensors);
  std::size_t values = 1 + (metadata.empty() ? 0 : 1 + metadata.size());  // the root, __metadata__ and its strings
  for (const safetensors_entry& tensor : tensors) values += 6 + tensor.shape.size();  // see json_limits
  require(values <= safetensors_max_header_values, destination, ": the header would hold ", values,
          " JSON values, more than the limit of ", safetensors_max_header_values);
  safetensors_layout layout;
  layout.order.resize(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) layout.order[i] = i;
  std::sort(layout.order.begin(), layout.order.end(),
            [&](std::size_t a, std::size_t b) { return tensors[a].name < tensors[b].name; });

  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      require(valid_utf8(key) && valid_utf8(value), destination, ": metadata ", quote_name(key), " is not valid UTF-8");
      header += first ? "" : ",";
      first = false;
      append_json_string(header, key);
      header += ':';
      append_json_string(header, value);
    }
    header += '}';
  }
  std::uint64_t offset = 0;
  for (std::size_t k = 0; k < layout.order.size(); ++k) {
    const safetensors_entry& tensor = tensors[layout.order[k]];
    check_tensor_name(destination, tensor.name);
    require(k == 0 || tensors[layout.order[k - 1]].name != tensor.name, destination, ": tensor ",
            quote_name(tensor.name), " is given more than once");
    for (std::int64_t extent : tensor.shape)
      require(extent >= 0, destination, ": tensor ", quote_name(tensor.name), ": shape ", shape_text(tensor.shape),
              " has a negative extent");
    const std::optional<std::uint64_t> needed = byte_count(tensor.shape, safetensors_dtype_size(tensor.dtype));
    require(needed.has_value() && *needed == tensor.bytes.size(), destination, ": tensor ", quote_name(tensor.name),
            ": ", tensor.bytes.size(), " bytes given but shape ", shape_text(tensor.shape), " of ",
            safetensors_dtype_name(tensor.dtype), " needs ",
            needed ? std::to_string(*needed) : std::string("more than 2^64"));
    header += header.size() > 1 ? "," : "";
    append_json_string(header, tensor.name);
    header += ":{\"dtype\":\"";
    header += safetensors_dtype_name(tensor.dtype);
    header += "\",\"shape\":[";
    for (std::size_t d = 0; d < tensor.shape.size(); ++d)
      header += (d == 0 ? "" : ",") + std::to_string(tensor.shape[d]);
    header += ']';
    header += ",\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + *needed) + "]}";
    offset += *needed;
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');  // the data start 8-byte aligned in the file
  require(header.size() <= safetensors_max_header_bytes, destination, ": header of ", header.size(),
          " bytes exceeds the limit of ", safetensors_max_header_bytes);

  std::uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) {
    layout.prefix += static_cast<char>(length & 0xFF);
    length >>= 8;
  }
  layout.prefix += header;
  return layout;
}

}  // namespace safetensors_detail

/// The bytes of a safetensors file holding `tensors` (written in name order) and `metadata`.
/// Example: {"b": F32 [1], "a": U8 [2]} -> header {"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},
/// "b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}} (106 bytes)
/// and 6 spaces; the length 112 before it; a's 2 bytes then b's 4 after it: 126 bytes in all.
/// @pre names unique, valid UTF-8 and not "__metadata__"; each entry's bytes match its shape and dtype.
inline std::vector<std::byte> serialize_safetensors(std::span<const safetensors_entry> tensors,
                                                    const std::map<std::string, std::string>& metadata = {}) {
  const safetensors_detail::safetensors_layout layout =
      safetensors_detail::plan_safetensors(tensors, metadata, "<memory>");
  std::vector<std::byte> out;
  std::size_t total = layout.prefix.size();
  for (const safetensors_entry& tensor : tensors) total += tensor.bytes.size();
  out.reserve(total);
  for (const char c : layout.prefix) out.push_back(static_cast<std::byte>(c));
  for (std::size_t i : layout.order) out.insert(out.end(), tensors[i].bytes.begin(), tensors[i].bytes.end());
  return out;
}

/// Writes `tensors` and `metadata` to `path` atomically: into a temporary file beside it, flushed to disk, then
/// renamed over `path`, so readers see the old file or the whole new one. Throws invalid_input for invalid
/// entries (see serialize_safetensors) and std::system_error when the system refuses a write.
inline void write_safetensors(const std::filesystem::path& path, std::span<const safetensors_entry> tensors,
                              const std::map<std::string, std::string>& metadata = {}) {
  const std::string name = path.string();
  const safetensors_detail::safetensors_layout layout = safetensors_detail::plan_safetensors(tensors, metadata, name);
  static std::atomic<std::uint64_t> counter{0};  // distinct temporary names for concurrent writes
  const std::string temporary = name + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), name + ": cannot create " + temporary);
  const auto give_up = [&](const std::string& what) {
    const int error = errno;
    ::close(fd);
    ::unlink(temporary.c_str());
    throw std::system_error(error, std::generic_category(), name + ": " + what);
  };
  const auto write_all = [&](const void* data, std::size_t size) {
    const char* bytes = static_cast<const char*>(data);
    while (size > 0) {
      const ::ssize_t written = ::write(fd, bytes, size);
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) give_up("cannot write");
      bytes += written;
      size -= static_cast<std::size_t>(written);
    }
  };
  write_all(layout.prefix.data(), layout.prefix.size());
  for (std::size_t i : layout.order) write_all(tensors[i].bytes.data(), tensors[i].bytes.size());
  if (::fsync(fd) != 0) give_up("cannot flush");
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    throw std::system_error(error, std::generic_category(), name + ": cannot close");
  }
  if (::rename(temporary.c_str(), name.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    throw std::system_error(error, std::generic_category(), name + ": cannot rename " + temporary + " to it");
  }
}

}  // namespace branchgrpo
