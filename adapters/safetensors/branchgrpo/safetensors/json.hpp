#pragma once
// The JSON of safetensors headers and shard indexes (safetensors_detail, not public API). json_parser accepts
// exactly the subset the format needs: objects, arrays, strings (all escapes, \uXXXX with surrogate pairs, UTF-8
// checked) and non-negative integers below 2^64, nested at most 64 deep; anything else is rejected with a message
// naming the byte offset and the top-level member being read. Optional limits on the top-level members and on all
// values bound what a hostile text can make it build (tensor.hpp's safetensors_max_tensors and _header_values). It is
// hand-written rather than nlohmann-json's SAX parser because those offsets and messages cannot all be kept with it
// (docs/safetensors.md, "JSON parsing: which and why"). append_json_string is the writer's side: the escaping this
// parser reads back.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/safetensors/text.hpp"

namespace branchgrpo {

namespace safetensors_detail {

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

// How much a document may hold; the defaults do not limit. A value is an object, array, string or integer at any
// depth (a safetensors tensor entry is 6 + its rank); "__metadata__" does not count as a top-level member.
struct json_limits {
  std::size_t max_members = std::numeric_limits<std::size_t>::max();
  std::size_t max_values = std::numeric_limits<std::size_t>::max();
};

// Recursive descent over the subset. Errors name the source, the byte offset inside the JSON text and the
// top-level member being read (the tensor, for a safetensors header). The limits are checked as the text is read,
// so a document over them is refused after at most that many values, before the rest is parsed or stored.
class json_parser {
 public:
  // `member_label` names a top-level member in messages ("tensor"), `document` the text ("header").
  json_parser(std::string_view text, std::string_view source, std::string_view member_label, std::string_view document,
              json_limits limits = {})
      : text_(text), source_(source), member_label_(member_label), document_(document), limits_(limits) {}

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
    if (++values_ > limits_.max_values)
      error("more than ", limits_.max_values, " JSON values, the most a ", document_, " may hold");
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
        if (key != "__metadata__" && ++members_ > limits_.max_members) {
          std::ostringstream message;  // a count, not a syntax error: no byte offset, no member
          message << source_ << ": " << document_ << " lists more than " << limits_.max_members << ' ' << member_label_
                  << "s, the most a file may hold";
          throw invalid_input(message.str());
        }
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
  json_limits limits_;
  std::size_t pos_ = 0;
  std::size_t values_ = 0;
  std::size_t members_ = 0;
  int depth_ = 0;
  std::string member_;
  bool in_member_ = false;
};

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

}  // namespace safetensors_detail

}  // namespace branchgrpo
