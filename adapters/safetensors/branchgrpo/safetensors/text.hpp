#pragma once
// Text rules shared by the reader and the writer (safetensors_detail, not public API): how a name or value is
// quoted so that every message stays one line, how a shape is printed, and strict UTF-8 (no overlong forms, no
// surrogates, nothing above U+10FFFF), which header strings must be and written names are checked to be.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace branchgrpo {

namespace safetensors_detail {

// A name or value as it may appear in a one-line message: control and non-ASCII-printable bytes escaped,
// long text cut.
inline std::string printable(std::string_view text) {
  constexpr std::size_t limit = 120;
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < limit; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte == '\\' || byte == '\'') {
      out += '\\';
      out += static_cast<char>(byte);
    } else if (byte < 0x20 || byte == 0x7F) {
      constexpr std::string_view hex = "0123456789abcdef";
      out += "\\x";
      out += hex[byte >> 4];
      out += hex[byte & 0xF];
    } else {
      out += static_cast<char>(byte);  // UTF-8 (validated before any name reaches a message) or ASCII
    }
  }
  if (text.size() > limit) out += "...";
  return out;
}

inline std::string quote_name(std::string_view text) { return "'" + printable(text) + "'"; }

inline std::string shape_text(std::span<const std::int64_t> shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  return out + "]";
}

// Length of the valid UTF-8 sequence starting at text[i], or 0 when it is not one (overlong forms,
// surrogates and code points above U+10FFFF are invalid).
inline std::size_t utf8_sequence_length(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // bounds of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (text.size() - i < length) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (std::size_t k = 2; k < length; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return length;
}

inline bool valid_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = utf8_sequence_length(text, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

inline void append_utf8(std::string& out, std::uint32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

}  // namespace safetensors_detail

}  // namespace branchgrpo
