#pragma once
// A minimal PNG writer for the tool's plots: 8-bit RGB, no filtering, zlib stream of stored (uncompressed)
// deflate blocks. No compression library: the plots are small, and the format stays easy to check
// (tests/unit/test_png.cpp inflates the blocks and recomputes every CRC).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "cli/output_file.hpp"

namespace branchgrpo::cli {

/// CRC-32 (ISO 3309, reflected polynomial 0xEDB88320, initial and final xor 0xFFFFFFFF), the PNG chunk check.
/// `crc` continues a previous result (0 to start).
/// Example: crc32 of the 9 bytes "123456789" == 0xCBF43926.
inline std::uint32_t crc32(std::span<const std::uint8_t> bytes, std::uint32_t crc = 0) {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t n = 0; n < 256; ++n) {
      std::uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (const std::uint8_t b : bytes) crc = table[(crc ^ b) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

/// Adler-32 (RFC 1950), the zlib stream check: a = 1 + sum of bytes, b = sum of the a's, both mod 65521.
/// Example: adler32 of "Wikipedia" == 0x11E60398.
inline std::uint32_t adler32(std::span<const std::uint8_t> bytes) {
  constexpr std::uint32_t modulus = 65521;
  std::uint32_t a = 1, b = 0;
  for (const std::uint8_t byte : bytes) {
    a = (a + byte) % modulus;
    b = (b + a) % modulus;
  }
  return (b << 16) | a;
}

/// An 8-bit RGB image, row-major from the top-left, 3 bytes per pixel.
struct rgb_image {
  int width = 0;
  int height = 0;
  std::vector<std::uint8_t> pixels;  ///< width * height * 3

  friend bool operator==(const rgb_image&, const rgb_image&) = default;
};

namespace detail {

inline void put_u32_be(std::vector<std::uint8_t>& out, std::uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(value >> shift));
}

inline void put_chunk(std::vector<std::uint8_t>& out, std::string_view type, std::span<const std::uint8_t> data) {
  put_u32_be(out, static_cast<std::uint32_t>(data.size()));
  const std::size_t checked_from = out.size();
  out.insert(out.end(), type.begin(), type.end());
  out.insert(out.end(), data.begin(), data.end());
  put_u32_be(out, crc32(std::span<const std::uint8_t>(out).subspan(checked_from)));
}

}  // namespace detail

/// The zlib stream (RFC 1950) of `raw` as stored deflate blocks (RFC 1951 BTYPE 00) of at most 65535 bytes:
///   0x78 0x01 | per block: BFINAL/BTYPE byte, LEN and ~LEN little-endian | Adler-32 of raw, big-endian.
/// Example: raw {1, 2, 3} -> 78 01 01 03 00 FC FF 01 02 03 00 0D 00 07 (adler32 {1, 2, 3} = 0x000D0007).
inline std::vector<std::uint8_t> zlib_stored(std::span<const std::uint8_t> raw) {
  constexpr std::size_t block = 65535;
  std::vector<std::uint8_t> out = {0x78, 0x01};  // deflate, 32 KiB window; 0x7801 is a multiple of 31
  std::size_t offset = 0;
  do {  // an empty input still needs one (empty) final block
    const std::size_t length = std::min(block, raw.size() - offset);
    const bool last = offset + length == raw.size();
    out.push_back(last ? 0x01 : 0x00);
    const auto len = static_cast<std::uint16_t>(length);
    const auto nlen = static_cast<std::uint16_t>(~len);
    out.insert(out.end(), {static_cast<std::uint8_t>(len & 0xFFu), static_cast<std::uint8_t>(len >> 8),
                           static_cast<std::uint8_t>(nlen & 0xFFu), static_cast<std::uint8_t>(nlen >> 8)});
    out.insert(out.end(), raw.begin() + static_cast<std::ptrdiff_t>(offset),
               raw.begin() + static_cast<std::ptrdiff_t>(offset + length));
    offset += length;
  } while (offset < raw.size());
  detail::put_u32_be(out, adler32(raw));
  return out;
}

/// The PNG file of `image`: signature, IHDR (8-bit RGB, colour type 2), one IDAT (each row prefixed by
/// filter 0, as a zlib_stored stream), IEND.
/// Example: a 1 x 1 image -> 72 bytes: signature 8, IHDR 12 + 13, IDAT 12 + 15 (zlib header 2, block header 5,
///   raw {0, r, g, b} 4, Adler-32 4), IEND 12.
/// @pre width, height >= 1 and pixels.size() == width * height * 3 (else invalid_input).
inline std::vector<std::uint8_t> encode_png(const rgb_image& image) {
  require(image.width >= 1 && image.height >= 1, "a PNG needs at least one pixel, got ", image.width, " x ",
          image.height);
  const auto row_bytes = static_cast<std::size_t>(image.width) * 3;
  require(image.pixels.size() == row_bytes * static_cast<std::size_t>(image.height), "image of ", image.width, " x ",
          image.height, " has ", image.pixels.size(), " bytes, expected ", row_bytes * image.height);
  std::vector<std::uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

  std::vector<std::uint8_t> header;
  detail::put_u32_be(header, static_cast<std::uint32_t>(image.width));
  detail::put_u32_be(header, static_cast<std::uint32_t>(image.height));
  header.insert(header.end(), {8, 2, 0, 0, 0});  // bit depth, RGB, deflate, adaptive filtering, no interlace
  detail::put_chunk(out, "IHDR", header);

  std::vector<std::uint8_t> raw;
  raw.reserve((row_bytes + 1) * static_cast<std::size_t>(image.height));
  for (int y = 0; y < image.height; ++y) {
    raw.push_back(0);  // filter type None
    const auto first = image.pixels.begin() + static_cast<std::ptrdiff_t>(row_bytes * static_cast<std::size_t>(y));
    raw.insert(raw.end(), first, first + static_cast<std::ptrdiff_t>(row_bytes));
  }
  detail::put_chunk(out, "IDAT", zlib_stored(raw));
  detail::put_chunk(out, "IEND", {});
  return out;
}

/// Writes encode_png(image) to `path` with write_file (atomic replace; a failure throws write_error naming the
/// path and the reason, e.g. "/dev/full: cannot write: No space left on device").
inline void write_png(const std::string& path, const rgb_image& image) {
  const std::vector<std::uint8_t> bytes = encode_png(image);
  write_file(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

}  // namespace branchgrpo::cli
