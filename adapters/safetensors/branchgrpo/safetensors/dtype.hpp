#pragma once
// The format's element types: their header names ("BF16"), their sizes, and exact conversions of the 16- and
// 8-bit floating-point encodings to float. constexpr and standard-library only, so code that only names or sizes a
// dtype (a model's key layout, a converter) can include this header alone.
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string_view>

namespace branchgrpo {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so is this host");

/// Element types of the format, with their names in the header ("F32", ...).
enum class safetensors_dtype : std::uint8_t { f64, f32, f16, bf16, f8_e4m3, i64, i32, i16, i8, u8, boolean };

inline constexpr std::array<safetensors_dtype, 11> safetensors_dtypes = {
    safetensors_dtype::f64,     safetensors_dtype::f32, safetensors_dtype::f16,    safetensors_dtype::bf16,
    safetensors_dtype::f8_e4m3, safetensors_dtype::i64, safetensors_dtype::i32,    safetensors_dtype::i16,
    safetensors_dtype::i8,      safetensors_dtype::u8,  safetensors_dtype::boolean};

/// The header's name of `dtype`: safetensors_dtype_name(safetensors_dtype::bf16) == "BF16".
constexpr std::string_view safetensors_dtype_name(safetensors_dtype dtype) noexcept {
  switch (dtype) {
    case safetensors_dtype::f64:
      return "F64";
    case safetensors_dtype::f32:
      return "F32";
    case safetensors_dtype::f16:
      return "F16";
    case safetensors_dtype::bf16:
      return "BF16";
    case safetensors_dtype::f8_e4m3:
      return "F8_E4M3";
    case safetensors_dtype::i64:
      return "I64";
    case safetensors_dtype::i32:
      return "I32";
    case safetensors_dtype::i16:
      return "I16";
    case safetensors_dtype::i8:
      return "I8";
    case safetensors_dtype::u8:
      return "U8";
    case safetensors_dtype::boolean:
      return "BOOL";
  }
  return "?";
}

/// Bytes per element: 8 for F64 and I64, 4 for F32 and I32, 2 for F16, BF16 and I16, 1 for the rest.
constexpr std::size_t safetensors_dtype_size(safetensors_dtype dtype) noexcept {
  switch (dtype) {
    case safetensors_dtype::f64:
    case safetensors_dtype::i64:
      return 8;
    case safetensors_dtype::f32:
    case safetensors_dtype::i32:
      return 4;
    case safetensors_dtype::f16:
    case safetensors_dtype::bf16:
    case safetensors_dtype::i16:
      return 2;
    case safetensors_dtype::f8_e4m3:
    case safetensors_dtype::i8:
    case safetensors_dtype::u8:
    case safetensors_dtype::boolean:
      return 1;
  }
  return 1;
}

/// The dtype called `name` in a header ("F32" -> f32), or nullopt for a name the format does not know.
constexpr std::optional<safetensors_dtype> safetensors_dtype_from_name(std::string_view name) noexcept {
  for (safetensors_dtype dtype : safetensors_dtypes)
    if (safetensors_dtype_name(dtype) == name) return dtype;
  return std::nullopt;
}

// --- Exact conversions to float ---------------------------------------------------------------------------

/// bfloat16 is the upper half of a float32: bf16_to_float(0x3F80) == 1.0f, bf16_to_float(0xC049) == -3.140625f.
constexpr float bf16_to_float(std::uint16_t bits) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

/// IEEE binary16 (1 sign, 5 exponent bits with bias 15, 10 mantissa bits), exact, including subnormals,
/// infinities and NaN payloads: 0x3C00 -> 1, 0x7BFF -> 65504, 0x0001 -> 2^-24, 0x7C00 -> inf.
constexpr float f16_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits >> 15) << 31;
  const std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  std::uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return std::bit_cast<float>(sign);  // +-0
  // Subnormal m * 2^-24: shift the leading one up to the implicit bit, lowering the exponent per shift.
  std::uint32_t exponent32 = 113;  // 2^-14 = the smallest normal half, as a float exponent (127 - 14)
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --exponent32;
  }
  return std::bit_cast<float>(sign | (exponent32 << 23) | ((mantissa & 0x3FFu) << 13));
}

/// float8 e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities; S.1111.111 is NaN; the
/// largest value is 1.75 * 2^8 = 448): 0x38 -> 1, 0x7E -> 448, 0x01 -> 2^-9, 0x7F -> NaN.
constexpr float f8_e4m3_to_float(std::uint8_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits >> 7) << 31;
  const std::uint32_t exponent = (bits >> 3) & 0xFu;
  const std::uint32_t mantissa = bits & 0x7u;
  if (exponent == 0xF && mantissa == 0x7) return std::bit_cast<float>(sign | 0x7FC00000u);
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 120) << 23) | (mantissa << 20));
  const float magnitude = static_cast<float>(mantissa) * (1.0f / 512.0f);  // subnormal m/8 * 2^-6, exact
  return sign != 0 ? -magnitude : magnitude;
}

// --- Sizes of whole tensors ------------------------------------------------------------------------------

namespace safetensors_detail {

// product(shape) * element_size, or nullopt when it does not fit in 64 bits.
inline std::optional<std::uint64_t> byte_count(std::span<const std::int64_t> shape, std::size_t element_size) {
  std::uint64_t count = element_size;
  for (std::int64_t extent : shape) {
    const auto e = static_cast<std::uint64_t>(extent);
    if (e != 0 && count > std::numeric_limits<std::uint64_t>::max() / e) {
      // Overflow, unless a later extent is 0 and the product is 0 after all.
      if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
      return std::nullopt;
    }
    count *= e;
  }
  return count;
}

}  // namespace safetensors_detail

}  // namespace branchgrpo
