#pragma once
// Files on disk: safetensors_file maps one file read-only (POSIX mmap) and validates it with parse_safetensors;
// safetensors_checkpoint opens a single file, or a sharded checkpoint's *.index.json and each of its shards once,
// as one view sorted by name. Tensor data point into the mappings, so opening reads only the headers.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/files/input_file.hpp"
#include "branchgrpo/safetensors/header.hpp"
#include "branchgrpo/safetensors/tensor.hpp"
#include "branchgrpo/safetensors/text.hpp"

namespace branchgrpo {

/// A safetensors file, memory-mapped read-only and validated on opening (parse_safetensors). Move-only; the
/// tensors' data point into the mapping and stay valid while the object lives (moves included).
/// Example: safetensors_file f("model.safetensors"); f.at("img_in.weight").shape -> {3072, 64}.
class safetensors_file {
 public:
  explicit safetensors_file(const std::filesystem::path& path) : path_(path) {
    const std::string name = path.string();
    const input_file file = open_input_file(path, input_kinds::safetensors);
    size_ = static_cast<std::size_t>(file.size());
    if (size_ > 0) {
      void* mapping = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, file.descriptor(), 0);
      if (mapping == MAP_FAILED) fail(path_text(path), ": cannot map: ", std::strerror(errno));
      mapping_ = mapping;
    }
    try {
      contents_ = parse_safetensors(bytes(), name);
    } catch (...) {
      unmap();
      throw;
    }
  }

  safetensors_file(safetensors_file&& other) noexcept
      : path_(std::move(other.path_)),
        mapping_(std::exchange(other.mapping_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        contents_(std::move(other.contents_)) {}

  safetensors_file& operator=(safetensors_file&& other) noexcept {
    if (this != &other) {
      unmap();
      path_ = std::move(other.path_);
      mapping_ = std::exchange(other.mapping_, nullptr);
      size_ = std::exchange(other.size_, 0);
      contents_ = std::move(other.contents_);
    }
    return *this;
  }

  safetensors_file(const safetensors_file&) = delete;
  safetensors_file& operator=(const safetensors_file&) = delete;
  ~safetensors_file() { unmap(); }

  const std::filesystem::path& path() const noexcept { return path_; }
  /// The tensors, sorted by name.
  std::span<const safetensors_tensor> tensors() const noexcept { return contents_.tensors; }
  const std::map<std::string, std::string>& metadata() const noexcept { return contents_.metadata; }

  /// The tensor called `name`, or nullptr.
  const safetensors_tensor* find(std::string_view name) const noexcept {
    const auto it = std::lower_bound(contents_.tensors.begin(), contents_.tensors.end(), name,
                                     [](const safetensors_tensor& t, std::string_view n) { return t.name < n; });
    return it != contents_.tensors.end() && it->name == name ? &*it : nullptr;
  }

  /// The tensor called `name`; throws invalid_input naming the file and the tensor when there is none.
  const safetensors_tensor& at(std::string_view name) const {
    const safetensors_tensor* tensor = find(name);
    require(tensor != nullptr, path_.string(), ": no tensor ", safetensors_detail::quote_name(name));
    return *tensor;
  }

 private:
  std::span<const std::byte> bytes() const noexcept {
    return {static_cast<const std::byte*>(mapping_), mapping_ != nullptr ? size_ : 0};
  }

  void unmap() noexcept {
    if (mapping_ != nullptr) ::munmap(mapping_, size_);
    mapping_ = nullptr;
  }

  std::filesystem::path path_;
  void* mapping_ = nullptr;
  std::size_t size_ = 0;
  safetensors_contents contents_;
};

/// One checkpoint, either a single `.safetensors` file or a sharded one named by its `*.index.json` (any path
/// ending in ".json"): each shard is opened once and the tensors of all shards form one view, sorted by name.
/// Every weight_map entry must be in its shard and every shard tensor in the weight_map under that shard.
/// Errors name the index file and, inside it, the shard's own one-line message.
class safetensors_checkpoint {
 public:
  explicit safetensors_checkpoint(const std::filesystem::path& path) : path_(path) {
    if (path.extension() != ".json") {
      files_.emplace_back(path);
      tensors_.assign(files_.front().tensors().begin(), files_.front().tensors().end());
      metadata_ = files_.front().metadata();
      return;
    }
    const std::string source = path.string();
    const safetensors_index index = parse_safetensors_index(read_index(path), source);
    metadata_ = index.metadata;
    std::map<std::string, std::size_t> shard_of_file;
    for (const auto& [name, file] : index.weight_map) {
      if (shard_of_file.contains(file)) continue;
      shard_of_file[file] = files_.size();
      try {
        files_.emplace_back(path.parent_path() / file);
      } catch (const invalid_input& error) {
        fail(source, ": shard ", safetensors_detail::quote_name(file), ": ", error.what());
      }
    }
    for (const auto& [name, file] : index.weight_map) {
      const safetensors_file& shard = files_[shard_of_file.at(file)];
      const safetensors_tensor* tensor = shard.find(name);
      require(tensor != nullptr, source, ": tensor ", safetensors_detail::quote_name(name), " is mapped to shard ",
              safetensors_detail::quote_name(file), ", which does not hold it");
      tensors_.push_back(*tensor);
    }
    for (const auto& [file, shard_number] : shard_of_file)
      for (const safetensors_tensor& tensor : files_[shard_number].tensors()) {
        const auto entry = index.weight_map.find(tensor.name);
        require(entry != index.weight_map.end(), source, ": shard ", safetensors_detail::quote_name(file),
                " holds tensor ", safetensors_detail::quote_name(tensor.name), ", which the weight_map does not list");
        require(entry->second == file, source, ": shard ", safetensors_detail::quote_name(file), " holds tensor ",
                safetensors_detail::quote_name(tensor.name), ", which the weight_map puts in shard ",
                safetensors_detail::quote_name(entry->second));
      }
    // weight_map is a sorted map, so tensors_ is sorted by name.
  }

  const std::filesystem::path& path() const noexcept { return path_; }
  bool sharded() const noexcept { return path_.extension() == ".json"; }
  /// All tensors, sorted by name; their data point into the shards' mappings.
  std::span<const safetensors_tensor> tensors() const noexcept { return tensors_; }
  /// The index's metadata for a sharded checkpoint, the file's `__metadata__` otherwise.
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  /// The opened files: one, or every shard once.
  std::span<const safetensors_file> files() const noexcept { return files_; }

  const safetensors_tensor* find(std::string_view name) const noexcept {
    const auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                                     [](const safetensors_tensor& t, std::string_view n) { return t.name < n; });
    return it != tensors_.end() && it->name == name ? &*it : nullptr;
  }

  const safetensors_tensor& at(std::string_view name) const {
    const safetensors_tensor* tensor = find(name);
    require(tensor != nullptr, path_.string(), ": no tensor ", safetensors_detail::quote_name(name));
    return *tensor;
  }

 private:
  static std::string read_index(const std::filesystem::path& path) {
    return read_input_file(path, input_kinds::safetensors_index);
  }

  std::filesystem::path path_;
  std::vector<safetensors_file> files_;
  std::vector<safetensors_tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace branchgrpo
