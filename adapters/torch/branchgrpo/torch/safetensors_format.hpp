#pragma once
// Safetensors reading and writing without LibTorch (the standard library and POSIX mmap only), so the
// `branchgrpo weights` tool and the fuzzer build in seconds. docs/safetensors.md describes every check.
//
// File layout:
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   UTF-8 JSON: {"name": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}, ...,
//                          "__metadata__": {"key": "value"}}   (may end with spaces)
//   the rest  the data buffer; data_offsets [begin, end) are relative to its start.
// A file is accepted only when every tensor's byte range matches its shape and dtype and the ranges tile the
// buffer exactly (sorted by offset, no gap, no overlap, nothing after the last). Every rejection throws
// branchgrpo::invalid_input with one line naming the file and the tensor, e.g.
//   "model.safetensors: tensor 'img_in.weight': data_offsets [0, 12] hold 12 bytes but shape [2, 2] of F32
//    needs 16".
// The JSON parser accepts exactly the subset the format needs: objects, arrays, strings (all escapes,
// \uXXXX with surrogate pairs, UTF-8 checked) and non-negative integers; anything else is named and rejected.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"

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

// --- Parsed contents ---------------------------------------------------------------------------------------

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

/// What a header describes: the tensors sorted by name, and the `__metadata__` strings.
struct safetensors_contents {
  std::vector<safetensors_tensor> tensors;
  std::map<std::string, std::string> metadata;
};

/// A sharded checkpoint's `*.safetensors.index.json`: {"metadata": {...}, "weight_map": {"name": "file"}}.
/// Integer metadata values (Hugging Face writes "total_size") are kept as their decimal text.
struct safetensors_index {
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::string> weight_map;  ///< tensor name -> shard file, relative to the index
};

/// The largest header the reader accepts (the reference implementation's bound).
inline constexpr std::uint64_t safetensors_max_header_bytes = 100'000'000;

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

// A JSON value of the accepted subset. Objects keep their members in file order (keys[i] -> items[i]).
struct json_value {
  enum class kind : std::uint8_t { object, array, string, integer };
  kind type = kind::object;
  std::uint64_t integer = 0;
  std::string string;
  std::vector<std::string> keys;  // objects only
  std::vector<json_value> items;  // array elements or object values

  std::string_view kind_name() const noexcept {
    switch (type) {
      case kind::object:
        return "an object";
      case kind::array:
        return "an array";
      case kind::string:
        return "a string";
      case kind::integer:
        return "an integer";
    }
    return "?";
  }
};

// Recursive descent over the subset. Errors name the source, the byte offset inside the JSON text and the
// top-level member being read (the tensor, for a safetensors header).
class json_parser {
 public:
  // `member_label` names a top-level member in messages ("tensor"), `document` the text ("header").
  json_parser(std::string_view text, std::string_view source, std::string_view member_label, std::string_view document)
      : text_(text), source_(source), member_label_(member_label), document_(document) {}

  json_value parse_document() {
    skip_whitespace();
    json_value value = parse_value();
    skip_whitespace();
    if (pos_ != text_.size()) error("unexpected ", describe_here(), " after the end of the top-level value");
    return value;
  }

 private:
  static constexpr int max_depth = 64;

  template <class... Parts>
  [[noreturn]] void error(Parts&&... parts) const {
    std::ostringstream message;
    message << source_ << ": ";
    if (in_member_ && member_ == "__metadata__")
      message << "__metadata__: ";
    else if (in_member_)
      message << member_label_ << ' ' << quote_name(member_) << ": ";
    message << "bad " << document_ << " JSON at byte " << pos_ << ": ";
    (message << ... << std::forward<Parts>(parts));
    throw invalid_input(message.str());
  }

  std::string describe_here() const {
    if (pos_ >= text_.size()) return "the end of the " + std::string(document_);
    const auto byte = static_cast<unsigned char>(text_[pos_]);
    if (byte >= 0x20 && byte < 0x7F) return std::string("character '") + static_cast<char>(byte) + "'";
    constexpr std::string_view hex = "0123456789abcdef";
    return std::string("byte 0x") + hex[byte >> 4] + hex[byte & 0xF];
  }

  void skip_whitespace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  void expect(char c) {
    if (pos_ >= text_.size() || text_[pos_] != c) error("expected '", c, "', found ", describe_here());
    ++pos_;
  }

  json_value parse_value() {
    if (pos_ >= text_.size()) error("expected a value, found ", describe_here());
    const char c = text_[pos_];
    if (c == '{') return parse_object();
    if (c == '[') return parse_array();
    if (c == '"') {
      json_value value;
      value.type = json_value::kind::string;
      value.string = parse_string();
      return value;
    }
    if (c == '-') error("negative number: only non-negative integers are allowed");
    if (c >= '0' && c <= '9') return parse_integer();
    for (std::string_view word : {"true", "false", "null"})
      if (text_.substr(pos_, word.size()) == word)
        error("'", word, "' is not allowed: only objects, arrays, strings and non-negative integers");
    error("expected a value, found ", describe_here());
  }

  void enter() {
    if (++depth_ > max_depth) error("nesting deeper than ", max_depth, " levels");
  }

  json_value parse_object() {
    enter();
    json_value value;
    value.type = json_value::kind::object;
    ++pos_;  // '{'
    skip_whitespace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      --depth_;
      return value;
    }
    std::set<std::string, std::less<>> seen;
    while (true) {
      skip_whitespace();
      if (pos_ >= text_.size() || text_[pos_] != '"') error("expected a string key, found ", describe_here());
      if (depth_ == 1) {  // the previous member is done
        member_.clear();
        in_member_ = false;
      }
      const std::size_t key_start = pos_;
      std::string key = parse_string();
      if (depth_ == 1) {  // a top-level member: name it in the messages that follow
        member_ = key;
        in_member_ = true;
      }
      if (!seen.insert(key).second) {
        pos_ = key_start;
        error("duplicate key ", quote_name(key));
      }
      skip_whitespace();
      expect(':');
      skip_whitespace();
      value.items.push_back(parse_value());
      value.keys.push_back(std::move(key));
      skip_whitespace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == '}') {
        ++pos_;
        break;
      }
      error("expected ',' or '}' in an object, found ", describe_here());
    }
    if (depth_ == 1) {
      member_.clear();
      in_member_ = false;
    }
    --depth_;
    return value;
  }

  json_value parse_array() {
    enter();
    json_value value;
    value.type = json_value::kind::array;
    ++pos_;  // '['
    skip_whitespace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      --depth_;
      return value;
    }
    while (true) {
      skip_whitespace();
      value.items.push_back(parse_value());
      skip_whitespace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == ']') {
        ++pos_;
        break;
      }
      error("expected ',' or ']' in an array, found ", describe_here());
    }
    --depth_;
    return value;
  }

  json_value parse_integer() {
    json_value value;
    value.type = json_value::kind::integer;
    if (text_[pos_] == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' && text_[pos_ + 1] <= '9')
      error("number with a leading zero");
    std::uint64_t number = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const auto digit = static_cast<std::uint64_t>(text_[pos_] - '0');
      if (number > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) error("integer larger than 2^64 - 1");
      number = number * 10 + digit;
      ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E'))
      error("fraction or exponent: only non-negative integers are allowed");
    value.integer = number;
    return value;
  }

  std::uint32_t parse_hex4() {
    if (text_.size() - pos_ < 4) error("\\u escape needs four hex digits");
    std::uint32_t unit = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text_[pos_];
      std::uint32_t digit = 0;
      if (c >= '0' && c <= '9')
        digit = static_cast<std::uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        digit = static_cast<std::uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        digit = static_cast<std::uint32_t>(c - 'A' + 10);
      else
        error("\\u escape needs four hex digits, found ", describe_here());
      unit = unit * 16 + digit;
      ++pos_;
    }
    return unit;
  }

  std::string parse_string() {
    ++pos_;  // '"'
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) error("unterminated string");
      const auto c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) error("unescaped control character in a string");
      if (c >= 0x80) {
        const std::size_t length = utf8_sequence_length(text_, pos_);
        if (length == 0) error("invalid UTF-8 in a string");
        out.append(text_.substr(pos_, length));
        pos_ += length;
        continue;
      }
      if (c != '\\') {
        out += static_cast<char>(c);
        ++pos_;
        continue;
      }
      ++pos_;  // backslash
      if (pos_ >= text_.size()) error("unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          std::uint32_t code_point = parse_hex4();
          if (code_point >= 0xDC00 && code_point <= 0xDFFF) error("\\u escape is a lone low surrogate");
          if (code_point >= 0xD800 && code_point <= 0xDBFF) {
            if (text_.substr(pos_, 2) != "\\u") error("\\u escape is a high surrogate without its low half");
            pos_ += 2;
            const std::uint32_t low = parse_hex4();
            if (low < 0xDC00 || low > 0xDFFF) error("\\u escape is a high surrogate without its low half");
            code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, code_point);
          break;
        }
        default:
          --pos_;
          error("unknown escape '\\", describe_here(), "'");
      }
    }
  }

  std::string_view text_;
  std::string_view source_;
  std::string_view member_label_;
  std::string_view document_;
  std::size_t pos_ = 0;
  int depth_ = 0;
  std::string member_;
  bool in_member_ = false;
};

inline std::uint64_t read_le64(std::span<const std::byte> bytes) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < 8; ++i) value |= static_cast<std::uint64_t>(bytes[i]) << (8 * i);
  return value;
}

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

inline std::string metadata_value(const json_value& value, std::string_view source, std::string_view key,
                                  std::string_view where, bool integers_allowed) {
  if (value.type == json_value::kind::string) return value.string;
  if (integers_allowed && value.type == json_value::kind::integer) return std::to_string(value.integer);
  fail(source, ": ", where, " value of ", quote_name(key), " is ", value.kind_name(), ", not a string");
}

inline void check_tensor_name(std::string_view source, std::string_view name) {
  require(valid_utf8(name), source, ": tensor ", quote_name(name), ": name is not valid UTF-8");
  require(name != "__metadata__", source, ": a tensor may not be called '__metadata__'");
}

}  // namespace safetensors_detail

/// Parses and validates a whole safetensors file held in `bytes`; `source` names it in messages. The
/// returned tensors' data point into `bytes`. Throws invalid_input (one line, naming `source` and the
/// tensor) for any malformed input; never reads outside `bytes`.
/// Example: the 8-byte length 56, the 54-byte header {"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}
/// and 2 spaces, then 8 bytes -> one tensor "a", F32, shape [2], data = those 8 bytes; no metadata.
/// @post tensors are sorted by name and tile the data buffer exactly.
inline safetensors_contents parse_safetensors(std::span<const std::byte> bytes, std::string_view source = "<memory>") {
  using safetensors_detail::json_value;
  using safetensors_detail::quote_name;
  require(bytes.size() >= 8, source, ": file is ", bytes.size(), " bytes, shorter than the 8-byte header length");
  const std::uint64_t header_length = safetensors_detail::read_le64(bytes);
  require(header_length <= safetensors_max_header_bytes, source, ": header length ", header_length,
          " exceeds the limit of ", safetensors_max_header_bytes, " bytes");
  require(header_length <= bytes.size() - 8, source, ": header length ", header_length,
          " runs past the end of the file (", bytes.size() - 8, " bytes follow the length)");
  const std::string_view header(reinterpret_cast<const char*>(bytes.data() + 8), header_length);
  const std::span<const std::byte> buffer = bytes.subspan(8 + header_length);

  const json_value root = safetensors_detail::json_parser(header, source, "tensor", "header").parse_document();
  require(root.type == json_value::kind::object, source, ": header is ", root.kind_name(), ", not a JSON object");

  safetensors_contents contents;
  struct range {
    std::uint64_t begin, end;
    std::size_t tensor;
  };
  std::vector<range> ranges;
  for (std::size_t m = 0; m < root.keys.size(); ++m) {
    const std::string& name = root.keys[m];
    const json_value& entry = root.items[m];
    if (name == "__metadata__") {
      require(entry.type == json_value::kind::object, source, ": __metadata__ is ", entry.kind_name(),
              ", not an object");
      for (std::size_t k = 0; k < entry.keys.size(); ++k)
        contents.metadata[entry.keys[k]] =
            safetensors_detail::metadata_value(entry.items[k], source, entry.keys[k], "__metadata__", false);
      continue;
    }
    const std::string where = std::string(source) + ": tensor " + quote_name(name) + ": ";
    require(entry.type == json_value::kind::object, where, "entry is ", entry.kind_name(), ", not an object");
    const json_value* dtype_value = nullptr;
    const json_value* shape_value = nullptr;
    const json_value* offsets_value = nullptr;
    for (std::size_t k = 0; k < entry.keys.size(); ++k) {
      const std::string& key = entry.keys[k];
      if (key == "dtype")
        dtype_value = &entry.items[k];
      else if (key == "shape")
        shape_value = &entry.items[k];
      else if (key == "data_offsets")
        offsets_value = &entry.items[k];
      else
        fail(where, "unexpected key ", quote_name(key), " (expected dtype, shape and data_offsets)");
    }
    require(dtype_value != nullptr, where, "missing 'dtype'");
    require(shape_value != nullptr, where, "missing 'shape'");
    require(offsets_value != nullptr, where, "missing 'data_offsets'");

    safetensors_tensor tensor;
    tensor.name = name;
    require(dtype_value->type == json_value::kind::string, where, "dtype is ", dtype_value->kind_name(),
            ", not a string");
    const std::optional<safetensors_dtype> dtype = safetensors_dtype_from_name(dtype_value->string);
    if (!dtype) {
      std::string known;
      for (safetensors_dtype d : safetensors_dtypes)
        known += (known.empty() ? "" : ", ") + std::string(safetensors_dtype_name(d));
      fail(where, "unknown dtype ", quote_name(dtype_value->string), " (known: ", known, ")");
    }
    tensor.dtype = *dtype;

    require(shape_value->type == json_value::kind::array, where, "shape is ", shape_value->kind_name(),
            ", not an array");
    for (std::size_t d = 0; d < shape_value->items.size(); ++d) {
      const json_value& extent = shape_value->items[d];
      require(extent.type == json_value::kind::integer, where, "shape entry ", d, " is ", extent.kind_name(),
              ", not an integer");
      require(extent.integer <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), where,
              "shape entry ", d, " = ", extent.integer, " exceeds 2^63 - 1");
      tensor.shape.push_back(static_cast<std::int64_t>(extent.integer));
    }

    require(offsets_value->type == json_value::kind::array && offsets_value->items.size() == 2 &&
                offsets_value->items[0].type == json_value::kind::integer &&
                offsets_value->items[1].type == json_value::kind::integer,
            where, "data_offsets must be an array of two integers [begin, end]");
    const std::uint64_t begin = offsets_value->items[0].integer;
    const std::uint64_t end = offsets_value->items[1].integer;
    require(begin <= end, where, "data_offsets [", begin, ", ", end, "] end before they begin");
    const std::optional<std::uint64_t> needed =
        safetensors_detail::byte_count(tensor.shape, safetensors_dtype_size(tensor.dtype));
    require(needed.has_value(), where, "shape ", safetensors_detail::shape_text(tensor.shape), " of ",
            safetensors_dtype_name(tensor.dtype), " needs more than 2^64 bytes");
    require(end - begin == *needed, where, "data_offsets [", begin, ", ", end, "] hold ", end - begin,
            " bytes but shape ", safetensors_detail::shape_text(tensor.shape), " of ",
            safetensors_dtype_name(tensor.dtype), " needs ", *needed);
    require(end <= buffer.size(), where, "data_offsets [", begin, ", ", end, "] end past the data buffer of ",
            buffer.size(), " bytes");
    tensor.data = buffer.subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(end - begin));
    ranges.push_back({begin, end, contents.tensors.size()});
    contents.tensors.push_back(std::move(tensor));
  }

  // The ranges must tile the buffer: sorted by offset, each starts where the previous one ends.
  std::sort(ranges.begin(), ranges.end(),
            [](const range& a, const range& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const range& r = ranges[i];
    const std::string where = std::string(source) + ": tensor " + quote_name(contents.tensors[r.tensor].name) + ": ";
    if (r.begin < covered) {
      const range& previous = ranges[i - 1];
      fail(where, "data_offsets [", r.begin, ", ", r.end, "] overlap tensor ",
           quote_name(contents.tensors[previous.tensor].name), " at [", previous.begin, ", ", previous.end, "]");
    }
    if (r.begin > covered)
      fail(where, "data_offsets [", r.begin, ", ", r.end, "] leave a gap of ", r.begin - covered, " bytes after ",
           i == 0 ? std::string("the start of the data buffer")
                  : "tensor " + quote_name(contents.tensors[ranges[i - 1].tensor].name));
    covered = r.end;
  }
  if (covered != buffer.size()) {
    if (ranges.empty()) fail(source, ": the header lists no tensors but ", buffer.size(), " data bytes follow it");
    fail(source, ": tensor ", quote_name(contents.tensors[ranges.back().tensor].name), ": the data buffer holds ",
         buffer.size(), " bytes but the tensors end at ", covered, " (", buffer.size() - covered, " trailing bytes)");
  }

  std::sort(contents.tensors.begin(), contents.tensors.end(),
            [](const safetensors_tensor& a, const safetensors_tensor& b) { return a.name < b.name; });
  return contents;
}

/// Parses a sharded checkpoint's index JSON (the text of `*.safetensors.index.json`); `source` names it.
/// Shard file names must be relative and stay inside the index's folder (no absolute path, no '..').
/// Example: {"metadata": {"total_size": 24}, "weight_map": {"a": "m-1.safetensors"}} -> metadata
/// {"total_size": "24"}, weight_map {"a": "m-1.safetensors"}.
inline safetensors_index parse_safetensors_index(std::string_view json, std::string_view source = "<memory>") {
  using safetensors_detail::json_value;
  using safetensors_detail::quote_name;
  require(safetensors_detail::valid_utf8(json), source, ": index is not valid UTF-8");
  const json_value root = safetensors_detail::json_parser(json, source, "key", "index").parse_document();
  require(root.type == json_value::kind::object, source, ": index is ", root.kind_name(), ", not a JSON object");
  safetensors_index index;
  bool has_weight_map = false;
  for (std::size_t m = 0; m < root.keys.size(); ++m) {
    const std::string& key = root.keys[m];
    const json_value& value = root.items[m];
    if (key == "metadata") {
      require(value.type == json_value::kind::object, source, ": 'metadata' is ", value.kind_name(), ", not an object");
      for (std::size_t k = 0; k < value.keys.size(); ++k)
        index.metadata[value.keys[k]] =
            safetensors_detail::metadata_value(value.items[k], source, value.keys[k], "metadata", true);
    } else if (key == "weight_map") {
      require(value.type == json_value::kind::object, source, ": 'weight_map' is ", value.kind_name(),
              ", not an object");
      has_weight_map = true;
      for (std::size_t k = 0; k < value.keys.size(); ++k) {
        const std::string& name = value.keys[k];
        const json_value& file = value.items[k];
        const std::string where = std::string(source) + ": tensor " + quote_name(name) + ": ";
        require(file.type == json_value::kind::string, where, "weight_map entry is ", file.kind_name(),
                ", not a file name");
        require(!file.string.empty() && file.string.find('\0') == std::string::npos, where, "shard file name ",
                quote_name(file.string), " is empty or holds a NUL byte");
        const std::filesystem::path shard(file.string);
        require(shard.is_relative(), where, "shard file name ", quote_name(file.string), " is not relative");
        for (const auto& part : shard)
          require(part != "..", where, "shard file name ", quote_name(file.string), " leaves the index's folder");
        index.weight_map[name] = file.string;
      }
    } else {
      fail(source, ": unexpected key ", quote_name(key), " (expected 'metadata' and 'weight_map')");
    }
  }
  require(has_weight_map, source, ": missing 'weight_map'");
  return index;
}

// --- Files -----------------------------------------------------------------------------------------------

/// A safetensors file, memory-mapped read-only and validated on opening (parse_safetensors). Move-only; the
/// tensors' data point into the mapping and stay valid while the object lives (moves included).
/// Example: safetensors_file f("model.safetensors"); f.at("img_in.weight").shape -> {3072, 64}.
class safetensors_file {
 public:
  explicit safetensors_file(const std::filesystem::path& path) : path_(path) {
    const std::string name = path.string();
    const int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(name, ": cannot open: ", std::strerror(errno));
    struct ::stat status {};
    if (::fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
      ::close(fd);
      fail(name, ": not a regular file");
    }
    size_ = static_cast<std::size_t>(status.st_size);
    if (size_ > 0) {
      void* mapping = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      const int mmap_errno = errno;
      ::close(fd);
      if (mapping == MAP_FAILED) fail(name, ": cannot map: ", std::strerror(mmap_errno));
      mapping_ = mapping;
    } else {
      ::close(fd);
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
    std::ifstream in(path, std::ios::binary);
    require(static_cast<bool>(in), path.string(), ": cannot open: ", std::strerror(errno));
    std::string text;
    char chunk[65536];
    while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
      text.append(chunk, static_cast<std::size_t>(in.gcount()));
      require(text.size() <= safetensors_max_header_bytes, path.string(), ": index exceeds ",
              safetensors_max_header_bytes, " bytes");
    }
    require(!in.bad(), path.string(), ": cannot read");
    return text;
  }

  std::filesystem::path path_;
  std::vector<safetensors_file> files_;
  std::vector<safetensors_tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// --- Reading data as float ---------------------------------------------------------------------------------

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

// --- Writing ---------------------------------------------------------------------------------------------

/// One tensor to write: its bytes (little-endian, row-major) must number product(shape) x dtype size.
struct safetensors_entry {
  std::string name;
  safetensors_dtype dtype = safetensors_dtype::f32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> bytes;
};

namespace safetensors_detail {

inline void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (byte < 0x20) {
      constexpr std::string_view hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[byte >> 4];
      out += hex[byte & 0xF];
    } else {
      out += c;
    }
  }
  out += '"';
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
