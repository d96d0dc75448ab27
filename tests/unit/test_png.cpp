// The PNG writer and raster plotter behind the tool's plots (tools/cli/images/png.hpp over the application layer's
// torch-free encoder tools/app/branchgrpo/app/png.hpp, plot.hpp). The PNG is decoded here with libpng's
// simplified reader and every pixel compared with the image.
#include <catch2/catch.hpp>
#include <png.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "cli/images/plot.hpp"
#include "cli/images/png.hpp"

using namespace branchgrpo;
using namespace branchgrpo::cli;

namespace {

struct decoded_png {
  std::uint32_t width = 0, height = 0;
  int bit_depth = 0, colour_type = 0, interlace = 0;  // from the IHDR chunk (bytes 24..28 of the file)
  std::vector<std::uint8_t> pixels;                   // PNG_FORMAT_RGB, row-major
};

// Decodes with libpng (png_image_begin_read_from_memory + png_image_finish_read); REQUIREs fail on any error.
decoded_png decode(const std::vector<std::uint8_t>& png) {
  REQUIRE(png.size() >= 29);
  png_image info{};
  info.version = PNG_IMAGE_VERSION;
  REQUIRE(png_image_begin_read_from_memory(&info, png.data(), png.size()) != 0);
  info.format = PNG_FORMAT_RGB;
  decoded_png out{.width = info.width,
                  .height = info.height,
                  .bit_depth = png[24],
                  .colour_type = png[25],
                  .interlace = png[28],
                  .pixels = std::vector<std::uint8_t>(PNG_IMAGE_SIZE(info))};
  INFO("libpng: " << info.message);
  REQUIRE(png_image_finish_read(&info, nullptr, out.pixels.data(), 0, nullptr) != 0);
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

// Encodes, decodes and checks the header and every pixel; returns the file's size.
std::size_t check_round_trip(const rgb_image& image) {
  const std::vector<std::uint8_t> bytes = encode_png(image);
  const std::vector<std::uint8_t> signature{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  CHECK(std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + 8) == signature);
  const decoded_png png = decode(bytes);
  CHECK(png.width == static_cast<std::uint32_t>(image.width));
  CHECK(png.height == static_cast<std::uint32_t>(image.height));
  CHECK(png.bit_depth == 8);
  CHECK(png.colour_type == 2);  // RGB
  CHECK(png.interlace == 0);
  CHECK(png.pixels == image.pixels);
  return bytes.size();
}

// The size of the stored-deflate PNG the tool wrote before libpng: signature 8, IHDR 25, IEND 12, one IDAT of
// 12 + zlib (2 + 5 per 65535-byte block + raw + 4) with raw = height * (1 + 3 width).
std::size_t stored_png_size(const rgb_image& image) {
  const std::size_t raw = static_cast<std::size_t>(image.height) * (1 + 3 * static_cast<std::size_t>(image.width));
  const std::size_t blocks = raw == 0 ? 1 : (raw + 65534) / 65535;
  return 8 + 25 + 12 + 12 + 2 + 5 * blocks + raw + 4;
}

}  // namespace

TEST_CASE("encode_png: a 1 x 1 image decodes to its pixel", "[png]") {
  const rgb_image image{.width = 1, .height = 1, .pixels = {10, 20, 30}};
  check_round_trip(image);
  CHECK(stored_png_size(image) == 72);  // the old encoder's documented size of a 1 x 1 PNG
}

TEST_CASE("encode_png: round trips, and deflate shrinks the files", "[png]") {
  check_round_trip(gradient_image(3, 2));
  // 200 x 120 (more than one 64 KiB stored block before): smooth gradients compress.
  const rgb_image gradient = gradient_image(200, 120);
  CHECK(check_round_trip(gradient) < stored_png_size(gradient) / 2);
  // A flat 256 x 128 plot background: 98 KiB stored, a few hundred bytes deflated.
  const rgb_image flat{.width = 256, .height = 128, .pixels = std::vector<std::uint8_t>(256 * 128 * 3, 255)};
  CHECK(stored_png_size(flat) == 98'505);
  CHECK(check_round_trip(flat) < 1000);
  // Noise does not compress: still decodes exactly.
  rgb_image noise{.width = 37, .height = 11, .pixels = {}};
  std::uint32_t state = 12345;
  for (int i = 0; i < 37 * 11 * 3; ++i) {
    state = state * 1664525u + 1013904223u;
    noise.pixels.push_back(static_cast<std::uint8_t>(state >> 24));
  }
  check_round_trip(noise);
}

TEST_CASE("encode_png rejects an empty or inconsistent image", "[png]") {
  CHECK_THROWS_WITH(encode_png(rgb_image{}), "a PNG needs at least one pixel, got 0 x 0");
  CHECK_THROWS_WITH(encode_png(rgb_image{.width = 2, .height = 1, .pixels = {1, 2, 3}}),
                    "image of 2 x 1 has 3 bytes, expected 6");
  CHECK_THROWS_AS(encode_png(rgb_image{.width = -1, .height = 3, .pixels = {}}), invalid_input);
}

TEST_CASE("write_png writes encode_png's bytes, and names the path on failure", "[png]") {
  const rgb_image image = gradient_image(5, 4);
  CHECK_THROWS_AS(write_png("/nonexistent-directory/x.png", image), write_error);
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
