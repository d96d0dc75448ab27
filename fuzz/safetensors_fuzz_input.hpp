#pragma once
// What the safetensors fuzzer does with one input; shared with tests/unit/test_safetensors.cpp, which replays
// the seed corpus through it with the normal compiler. Rejections (branchgrpo::invalid_input) are fine; a
// crash, a sanitizer report, any other exception or a broken invariant (std::abort) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/safetensors.hpp"

namespace branchgrpo::fuzz {

inline void check(bool condition) {
  if (!condition) std::abort();
}

// Parses `bytes` as a safetensors file and, when that succeeds, reads every element, checks the invariants
// and that writing the contents back gives a file that parses to the same tensors.
inline void fuzz_safetensors_file(std::span<const std::byte> bytes) {
  safetensors_contents contents;
  try {
    contents = parse_safetensors(bytes, "fuzz");
  } catch (const invalid_input&) {
    return;
  }
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < contents.tensors.size(); ++i) {
    const safetensors_tensor& tensor = contents.tensors[i];
    check(i == 0 || contents.tensors[i - 1].name < tensor.name);
    check(tensor.data.data() >= bytes.data() && tensor.data.data() + tensor.data.size() <= bytes.data() + bytes.size());
    check(static_cast<std::uint64_t>(tensor.numel()) * safetensors_dtype_size(tensor.dtype) == tensor.data.size());
    const std::vector<float> values = safetensors_to_float(tensor);  // touches every byte
    check(values.size() == static_cast<std::size_t>(tensor.numel()));
    total += tensor.data.size();
  }
  std::vector<safetensors_entry> entries;
  for (const safetensors_tensor& tensor : contents.tensors)
    entries.push_back({.name = tensor.name, .dtype = tensor.dtype, .shape = tensor.shape, .bytes = tensor.data});
  const std::vector<std::byte> written = serialize_safetensors(entries, contents.metadata);
  const safetensors_contents again = parse_safetensors(written, "fuzz round trip");
  check(again.metadata == contents.metadata);
  check(again.tensors.size() == contents.tensors.size());
  std::uint64_t total_again = 0;
  for (std::size_t i = 0; i < again.tensors.size(); ++i) {
    const safetensors_tensor& a = contents.tensors[i];
    const safetensors_tensor& b = again.tensors[i];
    check(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape);
    check(std::equal(a.data.begin(), a.data.end(), b.data.begin(), b.data.end()));
    total_again += b.data.size();
  }
  check(total == total_again);
}

// Parses `text` as a shard index.
inline void fuzz_safetensors_index(std::string_view text) {
  try {
    const safetensors_index index = parse_safetensors_index(text, "fuzz");
    for (const auto& [name, file] : index.weight_map) check(!file.empty());
  } catch (const invalid_input&) {
  }
}

/// The fuzzer's entry point: each input is tried as a file and as an index.
inline int fuzz_safetensors(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  fuzz_safetensors_file(bytes);
  fuzz_safetensors_index(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

}  // namespace branchgrpo::fuzz
