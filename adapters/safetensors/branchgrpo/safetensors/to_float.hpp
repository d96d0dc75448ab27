#pragma once
// A tensor's elements as float, whatever its dtype, and its first NaN or infinite element (found on its own or
// while the bytes are copied out). The bytes are read with memcpy because nothing aligns them: another writer's
// header may have any length, so the data may start at any byte.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/safetensors/dtype.hpp"
#include "branchgrpo/safetensors/tensor.hpp"
#include "branchgrpo/safetensors/text.hpp"

namespace branchgrpo {

namespace safetensors_detail {

template <class Stored, class Convert>
void convert_elements(std::span<const std::byte> bytes, std::span<float> out, Convert convert) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    Stored value;
    std::memcpy(&value, bytes.data() + i * sizeof(Stored), sizeof(Stored));  // data need not be aligned
    out[i] = convert(value);
  }
}

// Whether any of the `count` elements of Bits at `data` has every bit of `mask` set: the floating-point
// encodings' NaN and infinity patterns (all exponent bits; for F8_E4M3, whose only non-finite values are NaN,
// exponent and mantissa). No early exit and an integer accumulator, so that the compiler vectorizes the loop: with
// it, testing a block as it is copied costs about half a copy (a bool accumulator cost three copies).
template <class Bits>
bool any_masked(const std::byte* data, std::size_t count, Bits mask) {
  Bits found = 0;
  for (std::size_t i = 0; i < count; ++i) {
    Bits bits;
    std::memcpy(&bits, data + i * sizeof(Bits), sizeof(Bits));
    found |= static_cast<Bits>((bits & mask) == mask);
  }
  return found != 0;
}

template <class Bits>
std::optional<std::size_t> first_masked(const std::byte* data, std::size_t count, Bits mask) {
  if (!any_masked(data, count, mask)) return std::nullopt;
  for (std::size_t i = 0; i < count; ++i)
    if (any_masked(data + i * sizeof(Bits), 1, mask)) return i;
  return std::nullopt;
}

}  // namespace safetensors_detail

/// Converts every element of `tensor` to float (exactly for F32, F16, BF16, F8_E4M3, BOOL, U8, I8 and I16;
/// rounded to nearest for F64, I32 and I64) into `out`, which must hold numel() values.
/// Example: BF16 bytes {0x80, 0x3F, 0x49, 0xC0} -> {1.0f, -3.140625f}.
inline void safetensors_to_float(const safetensors_tensor& tensor, std::span<float> out) {
  const std::size_t size = safetensors_dtype_size(tensor.dtype);
  require(out.size() == tensor.data.size() / size && tensor.data.size() % size == 0, "tensor ",
          safetensors_detail::quote_name(tensor.name), ": ", out.size(), " floats for ", tensor.data.size(),
          " bytes of ", safetensors_dtype_name(tensor.dtype));
  const auto cast = [](auto value) { return static_cast<float>(value); };
  switch (tensor.dtype) {
    case safetensors_dtype::f64:
      safetensors_detail::convert_elements<double>(tensor.data, out, cast);
      break;
    case safetensors_dtype::f32:
      safetensors_detail::convert_elements<float>(tensor.data, out, cast);
      break;
    case safetensors_dtype::f16:
      safetensors_detail::convert_elements<std::uint16_t>(tensor.data, out, f16_to_float);
      break;
    case safetensors_dtype::bf16:
      safetensors_detail::convert_elements<std::uint16_t>(tensor.data, out, bf16_to_float);
      break;
    case safetensors_dtype::f8_e4m3:
      safetensors_detail::convert_elements<std::uint8_t>(tensor.data, out, f8_e4m3_to_float);
      break;
    case safetensors_dtype::i64:
      safetensors_detail::convert_elements<std::int64_t>(tensor.data, out, cast);
      break;
    case safetensors_dtype::i32:
      safetensors_detail::convert_elements<std::int32_t>(tensor.data, out, cast);
      break;
    case safetensors_dtype::i16:
      safetensors_detail::convert_elements<std::int16_t>(tensor.data, out, cast);
      break;
    case safetensors_dtype::i8:
      safetensors_detail::convert_elements<std::int8_t>(tensor.data, out, cast);
      break;
    case safetensors_dtype::u8:
      safetensors_detail::convert_elements<std::uint8_t>(tensor.data, out, cast);
      break;
    case safetensors_dtype::boolean:
      safetensors_detail::convert_elements<std::uint8_t>(tensor.data, out,
                                                         [](std::uint8_t b) { return b != 0 ? 1.0f : 0.0f; });
      break;
  }
}

/// The elements of `tensor` as floats (see the overload above).
inline std::vector<float> safetensors_to_float(const safetensors_tensor& tensor) {
  std::vector<float> out(tensor.data.size() / safetensors_dtype_size(tensor.dtype));
  safetensors_to_float(tensor, out);
  return out;
}

/// A NaN or infinite element of a tensor: its row-major index and its value as float (NaN, +inf or -inf).
struct safetensors_non_finite {
  std::size_t index = 0;
  float value = 0;
};

/// The first NaN or infinite element among `bytes`, elements of `dtype` (a whole number of them), or nullopt when
/// all are finite, as integer and BOOL elements always are. The stored bits are tested, so an F64 value too large
/// for float counts as finite.
/// Example: F32 {1, NaN, -inf} -> {index 1, NaN}; BF16 {0x3F80, 0xFF80} -> {index 1, -inf}; I32 bytes -> nullopt.
/// @pre bytes.size() is a multiple of safetensors_dtype_size(dtype).
inline std::optional<safetensors_non_finite> safetensors_find_non_finite(safetensors_dtype dtype,
                                                                         std::span<const std::byte> bytes) {
  using safetensors_detail::first_masked;
  const std::size_t count = bytes.size() / safetensors_dtype_size(dtype);
  std::optional<std::size_t> index;
  switch (dtype) {
    case safetensors_dtype::f64:
      index = first_masked<std::uint64_t>(bytes.data(), count, 0x7FF0000000000000u);
      break;
    case safetensors_dtype::f32:
      index = first_masked<std::uint32_t>(bytes.data(), count, 0x7F800000u);
      break;
    case safetensors_dtype::f16:
      index = first_masked<std::uint16_t>(bytes.data(), count, 0x7C00u);
      break;
    case safetensors_dtype::bf16:
      index = first_masked<std::uint16_t>(bytes.data(), count, 0x7F80u);
      break;
    case safetensors_dtype::f8_e4m3:
      index = first_masked<std::uint8_t>(bytes.data(), count, 0x7Fu);
      break;
    case safetensors_dtype::i64:
    case safetensors_dtype::i32:
    case safetensors_dtype::i16:
    case safetensors_dtype::i8:
    case safetensors_dtype::u8:
    case safetensors_dtype::boolean:
      return std::nullopt;  // no non-finite values
  }
  if (!index) return std::nullopt;
  const safetensors_tensor element{
      .name = {},
      .dtype = dtype,
      .shape = {1},
      .data = bytes.subspan(*index * safetensors_dtype_size(dtype), safetensors_dtype_size(dtype))};
  float value = 0;
  safetensors_to_float(element, std::span<float>(&value, 1));
  return safetensors_non_finite{.index = *index, .value = value};
}

/// Copies `tensor`'s bytes into `out` and returns its first NaN or infinite element (see above), found on the way:
/// block by block, each block tested while it is still in the cache, so the data are read from memory once, as a
/// plain copy reads them. When there is one, `out` holds the blocks up to and including its block.
/// Example: the 8 bytes of F32 {2, inf} -> out holds them, {index 1, inf}.
/// @pre out.size() == tensor.data.size().
inline std::optional<safetensors_non_finite> safetensors_copy_checking_finite(const safetensors_tensor& tensor,
                                                                              std::span<std::byte> out) {
  require(out.size() == tensor.data.size(), "tensor ", safetensors_detail::quote_name(tensor.name), ": ",
          tensor.data.size(), " bytes to copy into ", out.size());
  constexpr std::size_t block = std::size_t{1} << 16;  // 64 KiB: in L2 when tested; a multiple of every dtype size
  for (std::size_t begin = 0; begin < out.size(); begin += block) {
    const std::size_t size = std::min(block, out.size() - begin);
    std::memcpy(out.data() + begin, tensor.data.data() + begin, size);
    if (auto found = safetensors_find_non_finite(tensor.dtype, tensor.data.subspan(begin, size))) {
      found->index += begin / safetensors_dtype_size(tensor.dtype);
      return found;
    }
  }
  return std::nullopt;
}

}  // namespace branchgrpo
