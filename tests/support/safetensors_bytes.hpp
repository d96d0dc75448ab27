#pragma once
// Hand-made safetensors bytes for tests of the reader: any header text, valid or not, the writer would refuse
// (serialize_safetensors keeps to the format and its bounds), and the message the reader refuses them with.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/safetensors/header.hpp"

namespace branchgrpo::testing {

/// The 8-byte little-endian length of `header`, `header` itself (not padded), then `data_bytes` zero bytes.
/// Example: safetensors_bytes("{}", 2) == {2, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0, 0}.
inline std::vector<std::byte> safetensors_bytes(std::string_view header, std::size_t data_bytes = 0) {
  std::vector<std::byte> out;
  std::uint64_t length = header.size();
  for (int i = 0; i < 8; ++i, length >>= 8) out.push_back(static_cast<std::byte>(length & 0xFF));
  for (char c : header) out.push_back(static_cast<std::byte>(c));
  out.resize(out.size() + data_bytes, std::byte{0});
  return out;
}

/// The message parse_safetensors refuses `bytes` with, "" when it accepts them.
/// Example: safetensors_rejection(safetensors_bytes("[]"), "m") == "m: header is an array, not a JSON object".
inline std::string safetensors_rejection(std::span<const std::byte> bytes, std::string_view source) {
  try {
    parse_safetensors(bytes, source);
  } catch (const invalid_input& error) {
    return error.what();
  }
  return "";
}

}  // namespace branchgrpo::testing
