// The PNG writer and raster plotter behind `branchgrpo toy` (tools/cli/png.hpp, plot.hpp). The PNG is
// decoded here by an independent reader: every chunk's CRC recomputed bit by bit, the stored deflate blocks
// inflated, the Adler-32 recomputed and the rows compared with the image.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "cli/plot.hpp"
#include "cli/png.hpp"

using namespace branchgrpo;
using namespace branchgrpo::cli;

namespace {

std::vector<std::uint8_t> bytes_of(std::string_view s) { return {s.begin(), s.end()}; }

// Bitwise CRC-32 (no table), written from the definition: reflected polynomial 0xEDB88320.
std::uint32_t reference_crc(std::span<const std::uint8_t> data) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (const std::uint8_t byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return crc ^ 0xFFFFFFFFu;
}

std::uint32_t reference_adler(std::span<const std::uint8_t> data) {
  std::uint64_t a = 1, b = 0;
  for (const std::uint8_t byte : data) {
    a += byte;
    b += a;
  }
  return static_cast<std::uint32_t>(((b % 65521) << 16) | (a % 65521));
}

std::uint32_t read_u32(const std::vector<std::uint8_t>& v, std::size_t at) {
  return (std::uint32_t{v.at(at)} << 24) | (std::uint32_t{v.at(at + 1)} << 16) | (std::uint32_t{v.at(at + 2)} << 8) |
         std::uint32_t{v.at(at + 3)};
}

struct decoded_png {
  std::vector<std::string> chunk_types;
  std::uint32_t width = 0, height = 0;
  std::vector<std::uint8_t> header;  // the 13 IHDR bytes
  std::vector<std::uint8_t> raw;     // inflated IDAT: filter byte + row, per row
  std::size_t blocks = 0;
};

// Reads the PNG, checking the signature, each chunk's CRC, the zlib header, every stored block's NLEN and the
// Adler-32; REQUIREs fail on any mismatch.
decoded_png decode(const std::vector<std::uint8_t>& png) {
  decoded_png out;
  const std::vector<std::uint8_t> signature = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  REQUIRE(png.size() >= 8);
  REQUIRE(std::vector<std::uint8_t>(png.begin(), png.begin() + 8) == signature);
  std::vector<std::uint8_t> idat;
  std::size_t at = 8;
  while (at < png.size()) {
    const std::uint32_t length = read_u32(png, at);
    REQUIRE(at + 12 + length <= png.size());
    const std::span<const std::uint8_t> checked(png.data() + at + 4, length + 4);  // type + data
    CHECK(read_u32(png, at + 8 + length) == reference_crc(checked));
    const std::string type(png.begin() + static_cast<std::ptrdiff_t>(at + 4),
                           png.begin() + static_cast<std::ptrdiff_t>(at + 8));
    out.chunk_types.push_back(type);
    const auto data = png.begin() + static_cast<std::ptrdiff_t>(at + 8);
    if (type == "IHDR") out.header.assign(data, data + length);
    if (type == "IDAT") idat.insert(idat.end(), data, data + length);
    at += 12 + length;
  }
  REQUIRE(out.header.size() == 13);
  out.width = read_u32(out.header, 0);
  out.height = read_u32(out.header, 4);

  REQUIRE(idat.size() >= 2 + 5 + 4);
  CHECK((idat[0] & 0x0F) == 8);                 // deflate
  CHECK(((idat[0] << 8) | idat[1]) % 31 == 0);  // FCHECK
  CHECK((idat[1] & 0x20) == 0);                 // no preset dictionary
  std::size_t pos = 2;
  bool final_block = false;
  while (!final_block) {
    REQUIRE(pos + 5 <= idat.size());
    final_block = (idat[pos] & 1) != 0;
    CHECK(((idat[pos] >> 1) & 3) == 0);  // BTYPE 00: stored
    const std::uint16_t len = static_cast<std::uint16_t>(idat[pos + 1] | (idat[pos + 2] << 8));
    const std::uint16_t nlen = static_cast<std::uint16_t>(idat[pos + 3] | (idat[pos + 4] << 8));
    CHECK(static_cast<std::uint16_t>(~len) == nlen);
    pos += 5;
    REQUIRE(pos + len <= idat.size());
    out.raw.insert(out.raw.end(), idat.begin() + static_cast<std::ptrdiff_t>(pos),
                   idat.begin() + static_cast<std::ptrdiff_t>(pos + len));
    pos += len;
    ++out.blocks;
  }
  REQUIRE(pos + 4 == idat.size());
  CHECK(read_u32(idat, pos) == reference_adler(out.raw));
  return out;
}

rgb_image gradient_image(int width, int height) {
  rgb_image image{.width = width, .height = height, .pixels = {}};
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      image.pixels.insert(image.pixels.end(), {static_cast<std::uint8_t>(x * 7), static_cast<std::uint8_t>(y * 13),
                                               static_cast<std::uint8_t>((x + y) % 256)});
  return image;
}

// Decodes and checks every pixel against the image (filter byte 0 before each row).
void check_round_trip(const rgb_image& image, std::size_t expected_blocks) {
  const decoded_png png = decode(encode_png(image));
  CHECK(png.chunk_types == std::vector<std::string>{"IHDR", "IDAT", "IEND"});
  CHECK(png.width == static_cast<std::uint32_t>(image.width));
  CHECK(png.height == static_cast<std::uint32_t>(image.height));
  CHECK(std::vector<std::uint8_t>(png.header.begin() + 8, png.header.end()) ==
        std::vector<std::uint8_t>{8, 2, 0, 0, 0});  // 8-bit RGB, deflate, filter method 0, no interlace
  CHECK(png.blocks == expected_blocks);
  const std::size_t row = static_cast<std::size_t>(image.width) * 3;
  REQUIRE(png.raw.size() == (row + 1) * static_cast<std::size_t>(image.height));
  std::vector<std::uint8_t> pixels;
  for (int y = 0; y < image.height; ++y) {
    const auto first = png.raw.begin() + static_cast<std::ptrdiff_t>((row + 1) * static_cast<std::size_t>(y));
    CHECK(*first == 0);
    pixels.insert(pixels.end(), first + 1, first + 1 + static_cast<std::ptrdiff_t>(row));
  }
  CHECK(pixels == image.pixels);
}

}  // namespace

TEST_CASE("crc32 and adler32 match their check values", "[png]") {
  const auto digits = bytes_of("123456789");
  CHECK(crc32(digits) == 0xCBF43926u);
  CHECK(reference_crc(digits) == 0xCBF43926u);
  // Continuing a CRC over a split input gives the CRC of the whole.
  CHECK(crc32(std::span(digits).subspan(4), crc32(std::span(digits).first(4))) == 0xCBF43926u);
  CHECK(crc32({}) == 0u);
  CHECK(adler32(bytes_of("Wikipedia")) == 0x11E60398u);
  CHECK(adler32({}) == 1u);
  // 3000 bytes of 0xFF: a = 1 + 765000 = 765001 mod 65521 = 44270 wraps; compare with the 64-bit reference.
  const std::vector<std::uint8_t> ones(3000, 0xFF);
  CHECK(adler32(ones) == reference_adler(ones));
}

TEST_CASE("zlib_stored: the doc comment's stream", "[png]") {
  // adler32 {1, 2, 3}: a = 1 + 1 + 2 + 3 = 7, b = 2 + 4 + 7 = 13 -> 0x000D0007.
  CHECK(zlib_stored(std::vector<std::uint8_t>{1, 2, 3}) ==
        std::vector<std::uint8_t>{0x78, 0x01, 0x01, 0x03, 0x00, 0xFC, 0xFF, 1, 2, 3, 0x00, 0x0D, 0x00, 0x07});
  // Empty input: one empty final block, adler 1.
  CHECK(zlib_stored({}) == std::vector<std::uint8_t>{0x78, 0x01, 0x01, 0x00, 0x00, 0xFF, 0xFF, 0, 0, 0, 1});
}

TEST_CASE("encode_png: a 1 x 1 image is 72 bytes and decodes to its pixel", "[png]") {
  const rgb_image image{.width = 1, .height = 1, .pixels = {10, 20, 30}};
  const std::vector<std::uint8_t> png = encode_png(image);
  CHECK(png.size() == 72);  // 8 + (12 + 13) + (12 + 15) + 12
  const decoded_png decoded = decode(png);
  CHECK(decoded.raw == std::vector<std::uint8_t>{0, 10, 20, 30});
  check_round_trip(image, 1);
}

TEST_CASE("encode_png: round trips, one block and several", "[png]") {
  check_round_trip(gradient_image(3, 2), 1);
  // 200 x 120: 120 rows of 601 bytes = 72120 raw bytes -> blocks of 65535 and 6585.
  check_round_trip(gradient_image(200, 120), 2);
}

TEST_CASE("encode_png rejects an empty or inconsistent image", "[png]") {
  CHECK_THROWS_WITH(encode_png(rgb_image{}), "a PNG needs at least one pixel, got 0 x 0");
  CHECK_THROWS_WITH(encode_png(rgb_image{.width = 2, .height = 1, .pixels = {1, 2, 3}}),
                    "image of 2 x 1 has 3 bytes, expected 6");
  CHECK_THROWS_AS(encode_png(rgb_image{.width = -1, .height = 3, .pixels = {}}), invalid_input);
}

TEST_CASE("glyphs, text width and text drawing", "[plot]") {
  CHECK(glyph('1') == std::array<std::uint8_t, 7>{0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E});
  CHECK(glyph('a') == glyph('A'));
  CHECK(glyph(' ') == std::array<std::uint8_t, 7>{});
  CHECK(glyph('~') == std::array<std::uint8_t, 7>{0x1F, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1F});  // unknown: a box
  CHECK(canvas::text_width("AB", 2) == 22);                                                    // (2 * 6 - 1) * 2
  CHECK(canvas::text_width("") == 0);

  canvas c(12, 8);
  c.text(0, 0, "1", black);
  // Row 0 of '1' is 0x04: only column 2 set; row 6 is 0x0E: columns 1-3.
  CHECK(c.at(2, 0) == black);
  CHECK(c.at(1, 0) == white);
  CHECK(c.at(1, 6) == black);
  CHECK(c.at(3, 6) == black);
  CHECK(c.at(4, 6) == white);
  c.text(6, 0, "-", palette[0], 1);  // '-' row 3 is 0x1F: x 6..10
  CHECK(c.at(6, 3) == palette[0]);
  CHECK(c.at(10, 3) == palette[0]);
  CHECK(c.at(11, 3) == white);
  c.set(-1, 100, black);  // clipped, no effect
}

TEST_CASE("canvas lines and discs", "[plot]") {
  canvas c(10, 10);
  c.line(0, 5, 9, 5, palette[1]);
  for (int x = 0; x < 10; ++x) CHECK(c.at(x, 5) == palette[1]);
  CHECK(c.at(0, 4) == white);
  c.line(0, 0, std::nan(""), 3, black);  // non-finite end: nothing
  CHECK(c.at(0, 0) == white);
  c.disc(2, 2, 1.0, palette[2]);  // centre and its 4 neighbours (distance 1), not the diagonals (1.41)
  CHECK(c.at(2, 2) == palette[2]);
  CHECK(c.at(3, 2) == palette[2]);
  CHECK(c.at(2, 1) == palette[2]);
  CHECK(c.at(3, 3) == white);
}

TEST_CASE("nice_ticks and tick_label: the doc comment's examples", "[plot]") {
  const std::vector<double> unit = nice_ticks(0, 1, 5);
  REQUIRE(unit.size() == 6);
  for (std::size_t i = 0; i < unit.size(); ++i) CHECK(unit[i] == Approx(0.2 * static_cast<double>(i)).margin(1e-12));
  // range 0.74 / 5 = 0.148 -> step 0.2; ends rounded outwards to 0 and 1.
  const std::vector<double> inner = nice_ticks(0.13, 0.87, 5);
  REQUIRE(inner.size() == 6);
  CHECK(inner.front() == 0.0);
  CHECK(inner.back() == Approx(1.0));
  // Empty range [3, 3] widens to [2.5, 3.5]: step 1 / 5 = 0.2 -> 2.4 .. 3.6.
  const std::vector<double> flat = nice_ticks(3, 3, 5);
  CHECK(flat.front() == Approx(2.4));
  CHECK(flat.back() == Approx(3.6));
  // 0 .. 23 with 8 steps: 2.875 -> 5; ticks 0, 5, ..., 25.
  CHECK(nice_ticks(0, 23, 8) == std::vector<double>{0, 5, 10, 15, 20, 25});
  CHECK_THROWS_WITH(nice_ticks(1, 0), "nice_ticks needs a finite range, got [1, 0]");

  CHECK(tick_label(0.4, 0.2) == "0.4");
  CHECK(tick_label(15, 5) == "15");
  CHECK(tick_label(0.05, 0.05) == "0.05");
  CHECK(tick_label(-0.0000001, 0.1) == "0.0");
}

TEST_CASE("a line chart and a scatter grid render at their sizes, in their colours", "[plot]") {
  line_chart chart{.title = "T", .x_label = "X", .y_label = "Y", .width = 400, .height = 200, .lines = {}};
  chart.lines.push_back({.name = "a", .colour = palette[3], .x = {0, 1, 2}, .y = {0, 1, std::nan("")}});
  const rgb_image image = render(chart);
  CHECK(image.width == 400);
  CHECK(image.height == 200);
  std::size_t coloured = 0;
  for (std::size_t i = 0; i + 2 < image.pixels.size(); i += 3)
    if (image.pixels[i] == palette[3].r && image.pixels[i + 1] == palette[3].g && image.pixels[i + 2] == palette[3].b)
      ++coloured;
  CHECK(coloured > 50);  // the segment, two dots and the legend swatch
  chart.lines.front().x.pop_back();
  CHECK_THROWS_WITH(render(chart), "series 'a' has 2 x and 3 y values");

  scatter_grid grid{
      .title = "S", .caption = "C", .columns = 3, .panel_size = 100, .extent = 3.0, .circle_radius = 0.5, .panels = {}};
  grid.panels.push_back({.title = "P", .points = {{0.0, 0.0, palette[4]}}, .circles = {}});
  grid.panels.push_back({.title = "Q", .points = {}, .circles = {}});
  const rgb_image scatter = render(grid);
  // 2 panels in one row: 20 + 2 * 120 wide; 44 + (22 + 100 + 20) + 26 high.
  CHECK(scatter.width == 260);
  CHECK(scatter.height == 212);
  // The point at (0, 0) sits at the first panel's centre: x 20 + 50, y 44 + 22 + 50.
  const std::size_t at = (static_cast<std::size_t>(116) * 260 + 70) * 3;
  CHECK(rgb{scatter.pixels[at], scatter.pixels[at + 1], scatter.pixels[at + 2]} == palette[4]);
}
