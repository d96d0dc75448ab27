#pragma once
// What the reader hands out: safetensors_tensor, a view of one tensor's bytes inside a mapped file or a buffer
// (never a copy), and the header-size bound that the reader enforces and the writer keeps to.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "branchgrpo/safetensors/dtype.hpp"

namespace branchgrpo {

/// One tensor of a file: its name, dtype, shape and bytes (inside the mapping or the parsed buffer, which must
/// outlive it; not necessarily aligned to the element size: read it with memcpy or safetensors_to_float).
struct safetensors_tensor {
  std::string name;
  safetensors_dtype dtype = safetensors_dtype::f32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> data;

  /// The product of the shape (1 for a scalar, shape []).
  std::int64_t numel() const noexcept {
    if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;  // other extents may be huge
    std::int64_t count = 1;
    for (std::int64_t extent : shape) count *= extent;
    return count;
  }
};

/// The largest header the reader accepts and the writer writes (the reference implementation's bound).
inline constexpr std::uint64_t safetensors_max_header_bytes = 100'000'000;

}  // namespace branchgrpo
