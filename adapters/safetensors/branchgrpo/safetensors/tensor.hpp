#pragma once
// What the reader hands out: safetensors_tensor, a view of one tensor's bytes inside a mapped file or a buffer
// (never a copy), and the header bounds (bytes, tensors, JSON values) that the reader enforces and the writer keeps to.
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

/// The most tensors one file (or one sharded checkpoint's index) may list, checked by the reader as it parses and
/// kept to by the writer: 2^17, over 100 times what real models hold (FLUX.1-dev's transformer has 780 tensors, a
/// Wan2.1-14B checkpoint about 1100), so that a header of a million empty tensors is refused within milliseconds
/// instead of being parsed into gigabytes.
inline constexpr std::size_t safetensors_max_tensors = std::size_t{1} << 17;

/// The most JSON values a header or an index may hold: 16 per tensor at safetensors_max_tensors (a tensor entry
/// takes 6 + its rank; each metadata entry takes 1). It bounds what parsing may build from a header within
/// safetensors_max_header_bytes whatever its text (a shape of 50 million zeros, millions of metadata keys): at
/// most 2^21 parsed values of about 100 bytes each.
inline constexpr std::size_t safetensors_max_header_values = 16 * safetensors_max_tensors;

}  // namespace branchgrpo
