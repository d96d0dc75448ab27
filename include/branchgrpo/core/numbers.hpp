#pragma once
// The one path from text to numbers: command-line flags, config values and checkpoint metadata all go through
// parse_integer / parse_number, which accept only what the target type represents exactly and name the key in a
// one-line error. No silent saturation ("--seed -1" is not 2^64 - 1), no 300-digit echoes of the input.
#include <cfloat>
#include <charconv>
#include <cmath>
#include <concepts>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "branchgrpo/core/error.hpp"

namespace branchgrpo {

namespace detail {
// What one byte of echoed text becomes: the byte itself, or for a control character (0x00-0x1F, 0x7F) an escape:
// "\\n", "\\r", "\\t", else "\\x" and two hex digits ("\\x00" for NUL), so that an echo never holds a byte that
// would end, break or hide the one-line message (a NUL ends what() there, a newline splits the line).
inline void append_echoed(std::string& out, char c) {
  const auto byte = static_cast<unsigned char>(c);
  if (byte >= 0x20 && byte != 0x7F) {
    out += c;
  } else if (c == '\n') {
    out += "\\n";
  } else if (c == '\r') {
    out += "\\r";
  } else if (c == '\t') {
    out += "\\t";
  } else {
    constexpr char hex[] = "0123456789abcdef";
    out += {'\\', 'x', hex[byte >> 4], hex[byte & 0xF]};
  }
}

// The characters append_echoed writes for `c`: 1, or 2 or 4 for an escape.
inline std::size_t echoed_width(char c) {
  const auto byte = static_cast<unsigned char>(c);
  if (byte >= 0x20 && byte != 0x7F) return 1;
  return c == '\n' || c == '\r' || c == '\t' ? 2 : 4;
}

// The longest prefix (from_end: suffix) of `text` whose echo is at most `most` characters, echoed; an escape is
// never cut.
inline std::string echoed_part(std::string_view text, std::size_t most, bool from_end) {
  std::size_t width = 0, count = 0;
  for (; count < text.size(); ++count) {
    const std::size_t w = echoed_width(text[from_end ? text.size() - 1 - count : count]);
    if (width + w > most) break;
    width += w;
  }
  std::string out;
  for (const char c : from_end ? text.substr(text.size() - count) : text.substr(0, count)) append_echoed(out, c);
  return out;
}

// The characters the whole of `text` echoes to (its length when it holds no control character).
inline std::size_t echoed_size(std::string_view text) {
  std::size_t width = 0;
  for (const char c : text) width += echoed_width(c);
  return width;
}
}  // namespace detail

/// The input as an error message shows it: control characters escaped (a NUL as "\\x00", a newline as "\\n"), at
/// most 32 characters, longer text cut with "..." (a pasted 300-digit number stays readable).
/// Example: echo_text(std::string(300, '9')) == std::string(29, '9') + "...";
///   echo_text(std::string("a\0b", 3)) == "a\\x00b".
/// @post the result holds no control character and is at most 32 characters long; an escape is never cut.
inline std::string echo_text(std::string_view text) {
  constexpr std::size_t most = 32;
  if (detail::echoed_size(text) <= most) return detail::echoed_part(text, most, false);
  return detail::echoed_part(text, most - 3, false) + "...";
}

/// Long text (a path, a device string, a list, a prompt) as a message shows it: control characters escaped as
/// echo_text does, at most `most` characters, a longer text cut in the middle with "..." so that its start and its
/// end (a path's file name) stay.
/// Example: echo_middle("abcdefghij", 7) == "ab...ij"; echo_middle("abc", 7) == "abc";
///   echo_middle(std::string("a red\0circle", 12), 80) == "a red\\x00circle" (the NUL would have ended the
///   message there).
/// @pre most >= 5
/// @post the result holds no control character and is at most `most` characters long.
inline std::string echo_middle(std::string_view text, std::size_t most) {
  if (detail::echoed_size(text) <= most) return detail::echoed_part(text, most, false);
  const std::size_t head = (most - 3) / 2;
  const std::size_t tail = most - 3 - head;
  return detail::echoed_part(text, head, false) + "..." + detail::echoed_part(text, tail, true);
}

namespace detail {
// The whole of `text` as a decimal T, or nothing.
template <std::integral T>
std::optional<T> whole_integer(std::string_view text) {
  T value{};
  const char* last = text.data() + text.size();
  const auto [end, error] = std::from_chars(text.data(), last, value);
  if (text.empty() || error != std::errc() || end != last) return std::nullopt;
  return value;
}
}  // namespace detail

/// Parses the whole of `text` as a decimal integer of type T in [low, high] (an optional leading '-' for signed T
/// only; no '+', spaces, hex or exponent). Throws invalid_input "<key> = <text>: must be an integer in [low, high]".
/// Example: parse_integer<int>("42", "--iters") == 42;
///   parse_integer<std::uint64_t>("-1", "--seed") throws
///   "--seed = -1: must be an integer in [0, 18446744073709551615]";
///   parse_integer<int>("0", "--threads", 1, 256) throws "--threads = 0: must be an integer in [1, 256]".
/// @post low <= value <= high, and its decimal text equals `text` up to leading zeros.
template <std::integral T>
requires(!std::same_as<T, bool>) T
    parse_integer(std::string_view text, std::string_view key, T low = std::numeric_limits<T>::min(),
                  T high = std::numeric_limits<T>::max()) {
  const std::optional<T> value = detail::whole_integer<T>(text);
  if (!value || *value < low || *value > high)
    fail(key, " = ", echo_text(text), ": must be an integer in [", std::to_string(low), ", ", std::to_string(high),
         "]");
  return *value;
}

/// `value` in decimal, zero-padded on the left to at least `width` digits: names that sort in numeric order
/// (checkpoints, shards, sample files).
/// Example: zero_padded(10, 6) == "000010"; zero_padded(1234567, 6) == "1234567"; zero_padded(0, 0) == "0".
/// @pre value >= 0 (else invalid_input naming it).
inline std::string zero_padded(std::int64_t value, std::size_t width) {
  require(value >= 0, "zero_padded(", value, "): a negative number");
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

/// A range's bound as a message or `--help` shows it: the shortest text that reads back exactly, in plain digits
/// from 0.0001 to 10 million, with an exponent beyond.
/// Example: number_bound_text(0.0001) == "0.0001", number_bound_text(1e6) == "1000000",
///   number_bound_text(1e-6) == "1e-6", number_bound_text(1e300) == "1e300", number_bound_text(-1e3) == "-1000".
inline std::string number_bound_text(double value) {
  char text[64];
  const double magnitude = std::fabs(value);
  const bool plain = value == 0 || (magnitude >= 1e-4 && magnitude < 1e7);
  const auto [end, error] =
      std::to_chars(text, text + sizeof text, value, plain ? std::chars_format::fixed : std::chars_format::scientific);
  if (error != std::errc()) return "?";
  std::string out(text, end);
  // "1e-06" -> "1e-6", "1e+300" -> "1e300": the exponent as a person writes it.
  if (const std::size_t e = out.find('e'); e != std::string::npos) {
    std::size_t digits = e + 1;
    if (out[digits] == '+') out.erase(digits, 1);
    if (out[digits] == '-') ++digits;
    while (digits + 1 < out.size() && out[digits] == '0') out.erase(digits, 1);
  }
  return out;
}

/// Parses the whole of `text` as a finite double (decimal or exponent form, e.g. "0.5", "1e-4", "-3"; no "nan",
/// "inf", hex or spaces) in [low, high]. Throws invalid_input "<key> = <text>: must be a finite number", or
/// "<key> = <text>: must be a number in [low, high]" when it is finite but outside the bounds.
/// Example: parse_number("1e-4", "--lr") == 1e-4; parse_number("1e999", "--lr") throws
///   "--lr = 1e999: must be a finite number"; parse_number("5e-324", "--lr", 1e-12, 1) throws
///   "--lr = 5e-324: must be a number in [1e-12, 1]".
/// @post low <= value <= high, value finite.
inline double parse_number(std::string_view text, std::string_view key, double low = -DBL_MAX, double high = DBL_MAX) {
  double value = 0;
  const char* first = text.data();
  const char* last = first + text.size();
  const auto [end, error] = std::from_chars(first, last, value, std::chars_format::general);
  if (text.empty() || error != std::errc() || end != last || !std::isfinite(value))
    fail(key, " = ", echo_text(text), ": must be a finite number");
  if (value < low || value > high)
    fail(key, " = ", echo_text(text), ": must be a number in [", number_bound_text(low), ", ", number_bound_text(high),
         "]");
  return value;
}

}  // namespace branchgrpo
