#pragma once
// A tensor's elements as float, whatever its dtype. The bytes are read with memcpy because nothing aligns them:
// another writer's header may have any length, so the data may start at any byte.
#include <cstddef>
#include <cstdint>
#include <cstring>
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

}  // namespace branchgrpo
