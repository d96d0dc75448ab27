// The GIF animation writer (tools/cli/images/gif.hpp): encoded through giflib, decoded here with giflib's reader
// (DGifSlurp) and compared pixel by pixel, frame by frame, with the delay and the loop extension.
#include <catch2/catch.hpp>
#include <gif_lib.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "cli/images/gif.hpp"

using namespace branchgrpo;
using namespace branchgrpo::cli;

namespace {

struct decoded_gif {
  int width = 0, height = 0;
  std::vector<rgb_image> frames;
  std::vector<int> delays;  // centiseconds, per frame
  bool loops = false;       // a NETSCAPE2.0 extension with loop count 0
  int palette_size = 0;
};

struct memory_reader {
  const std::vector<std::uint8_t>* bytes = nullptr;
  std::size_t at = 0;
};

int read_bytes(GifFileType* gif, GifByteType* out, int length) {
  auto* reader = static_cast<memory_reader*>(gif->UserData);
  const std::size_t count = std::min(static_cast<std::size_t>(length), reader->bytes->size() - reader->at);
  std::memcpy(out, reader->bytes->data() + reader->at, count);
  reader->at += count;
  return static_cast<int>(count);
}

decoded_gif decode(const std::vector<std::uint8_t>& bytes) {
  REQUIRE(bytes.size() >= 6);
  CHECK(std::string(bytes.begin(), bytes.begin() + 6) == "GIF89a");
  memory_reader reader{.bytes = &bytes};
  int error = 0;
  GifFileType* gif = DGifOpen(&reader, read_bytes, &error);
  REQUIRE(gif != nullptr);
  REQUIRE(DGifSlurp(gif) == GIF_OK);
  decoded_gif out;
  out.width = gif->SWidth;
  out.height = gif->SHeight;
  REQUIRE(gif->SColorMap != nullptr);
  out.palette_size = gif->SColorMap->ColorCount;
  for (int f = 0; f < gif->ImageCount; ++f) {
    const SavedImage& image = gif->SavedImages[f];
    CHECK(image.ImageDesc.Left == 0);
    CHECK(image.ImageDesc.Width == out.width);
    CHECK(image.ImageDesc.Height == out.height);
    rgb_image frame{.width = out.width, .height = out.height, .pixels = {}};
    for (int p = 0; p < out.width * out.height; ++p) {
      const GifColorType colour = gif->SColorMap->Colors[image.RasterBits[p]];
      frame.pixels.insert(frame.pixels.end(), {colour.Red, colour.Green, colour.Blue});
    }
    out.frames.push_back(std::move(frame));
    GraphicsControlBlock control{};
    REQUIRE(DGifSavedExtensionToGCB(gif, f, &control) == GIF_OK);
    out.delays.push_back(control.DelayTime);
    CHECK(control.TransparentColor == NO_TRANSPARENT_COLOR);
  }
  // The loop extension sits before the first image: an application block "NETSCAPE2.0" then {1, 0, 0}.
  if (gif->ImageCount > 0) {
    const SavedImage& first = gif->SavedImages[0];
    for (int e = 0; e + 1 < first.ExtensionBlockCount; ++e) {
      const ExtensionBlock& block = first.ExtensionBlocks[e];
      const ExtensionBlock& data = first.ExtensionBlocks[e + 1];
      if (block.Function == APPLICATION_EXT_FUNC_CODE && block.ByteCount == 11 &&
          std::memcmp(block.Bytes, "NETSCAPE2.0", 11) == 0 && data.ByteCount == 3)
        out.loops = data.Bytes[0] == 1 && data.Bytes[1] == 0 && data.Bytes[2] == 0;
    }
  }
  DGifCloseFile(gif, &error);
  return out;
}

// A 16 x 16 "a red square moving right" clip: grey 235 background, a 4 x 4 red (230, 26, 26) square whose left
// edge moves 2 pixels a frame, with a half-covered column of (232, 130, 130) to its right (anti-aliasing).
std::vector<rgb_image> square_clip(int frames) {
  std::vector<rgb_image> out;
  for (int f = 0; f < frames; ++f) {
    rgb_image image{.width = 16, .height = 16, .pixels = {}};
    for (int y = 0; y < 16; ++y)
      for (int x = 0; x < 16; ++x) {
        const int left = 2 + 2 * f;
        std::array<std::uint8_t, 3> colour{235, 235, 235};
        if (y >= 6 && y < 10 && x >= left && x < left + 4) colour = {230, 26, 26};
        if (y >= 6 && y < 10 && x == left + 4) colour = {232, 130, 130};
        image.pixels.insert(image.pixels.end(), colour.begin(), colour.end());
      }
    out.push_back(std::move(image));
  }
  return out;
}

}  // namespace

TEST_CASE("quantize_gif: the doc example, exact and cube palettes", "[gif]") {
  const rgb_image a{.width = 2, .height = 1, .pixels = {230, 26, 26, 128, 128, 128}};
  const rgb_image b{.width = 2, .height = 1, .pixels = {128, 128, 128, 230, 26, 26}};
  const std::vector<rgb_image> frames{a, b};
  const gif_palette palette = quantize_gif(frames);
  CHECK(palette.exact);
  CHECK(palette.colours == std::vector<std::array<std::uint8_t, 3>>{{128, 128, 128}, {230, 26, 26}});
  CHECK(palette.indices == std::vector<std::vector<std::uint8_t>>{{1, 0}, {0, 1}});

  // 300 distinct colours: the 216-colour cube. Pixel 0 is (0, 0, 0); pixel 1 (30, 20, 1) -> levels (1, 0, 0).
  rgb_image many{.width = 300, .height = 1, .pixels = {}};
  for (int i = 0; i < 300; ++i)
    many.pixels.insert(many.pixels.end(),
                       {static_cast<std::uint8_t>(i == 1 ? 30 : i % 256),
                        static_cast<std::uint8_t>(i == 1 ? 20 : i / 256), static_cast<std::uint8_t>(i == 1 ? 1 : 0)});
  const gif_palette cube = quantize_gif(std::span<const rgb_image>(&many, 1));
  CHECK_FALSE(cube.exact);
  CHECK(cube.colours.size() == 216);
  CHECK(cube.colours[cube.indices[0][1]] == std::array<std::uint8_t, 3>{51, 0, 0});
  CHECK(cube.colours[cube.indices[0][0]] == std::array<std::uint8_t, 3>{0, 0, 0});
  // Every channel within 25 of the original.
  for (std::size_t p = 0; p < 300; ++p)
    for (std::size_t k = 0; k < 3; ++k) {
      const int got = cube.colours[cube.indices[0][p]][k];
      const int want = many.pixels[3 * p + k];
      CHECK(std::abs(got - want) <= 25);
    }
}

TEST_CASE("encode_gif: a shapes clip round-trips exactly, with its delay and loop", "[gif]") {
  const std::vector<rgb_image> clip = square_clip(4);
  const std::vector<std::uint8_t> bytes = encode_gif(clip, 25);
  const decoded_gif gif = decode(bytes);
  CHECK(gif.width == 16);
  CHECK(gif.height == 16);
  CHECK(gif.palette_size == 4);  // 3 colours, rounded up to a power of two
  REQUIRE(gif.frames.size() == 4);
  for (std::size_t f = 0; f < 4; ++f) {
    INFO("frame " << f);
    CHECK(gif.frames[f] == clip[f]);
  }
  CHECK(gif.delays == std::vector<int>{25, 25, 25, 25});
  CHECK(gif.loops);
  // LZW on 3 colours: far smaller than the raw 4 x 768 bytes of pixels.
  CHECK(bytes.size() < 4 * 16 * 16 * 3 / 4);

  // One frame, one colour: a palette of 2 entries, still valid.
  const rgb_image flat{.width = 3, .height = 2, .pixels = std::vector<std::uint8_t>(18, 7)};
  const decoded_gif single = decode(encode_gif(std::span<const rgb_image>(&flat, 1), 0));
  CHECK(single.palette_size == 2);
  REQUIRE(single.frames.size() == 1);
  CHECK(single.frames[0] == flat);
  CHECK(single.delays == std::vector<int>{0});
}

TEST_CASE("encode_gif: more than 256 colours are quantized to the cube, within 25 per channel", "[gif]") {
  rgb_image gradient{.width = 32, .height = 16, .pixels = {}};
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 32; ++x)
      gradient.pixels.insert(gradient.pixels.end(),
                             {static_cast<std::uint8_t>(8 * x), static_cast<std::uint8_t>(16 * y),
                              static_cast<std::uint8_t>(4 * (x + y))});
  const decoded_gif gif = decode(encode_gif(std::span<const rgb_image>(&gradient, 1), 10));
  CHECK(gif.palette_size == 256);
  REQUIRE(gif.frames.size() == 1);
  for (std::size_t i = 0; i < gradient.pixels.size(); ++i)
    CHECK(std::abs(int{gif.frames[0].pixels[i]} - int{gradient.pixels[i]}) <= 25);
}

TEST_CASE("encode_gif rejects bad frames and delays; write_gif names the path", "[gif]") {
  CHECK_THROWS_WITH(encode_gif({}, 10), "a GIF needs at least one frame");
  const std::vector<rgb_image> mixed{rgb_image{.width = 2, .height = 1, .pixels = std::vector<std::uint8_t>(6)},
                                     rgb_image{.width = 1, .height = 2, .pixels = std::vector<std::uint8_t>(6)}};
  CHECK_THROWS_WITH(encode_gif(mixed, 10), "GIF frame 1 is 1 x 2, frame 0 is 2 x 1");
  const std::vector<rgb_image> short_pixels{rgb_image{.width = 2, .height = 1, .pixels = {1, 2, 3}}};
  CHECK_THROWS_WITH(encode_gif(short_pixels, 10), "GIF frame 0 of 2 x 1 has 3 bytes, expected 6");
  const std::vector<rgb_image> empty{rgb_image{}};
  CHECK_THROWS_WITH(encode_gif(empty, 10), "a GIF frame must be 1 to 65535 pixels a side, got 0 x 0");
  const std::vector<rgb_image> clip = square_clip(2);
  CHECK_THROWS_WITH(encode_gif(clip, -1), "GIF frame delay must be in [0, 65535] hundredths of a second, got -1");
  CHECK_THROWS_AS(encode_gif(clip, 70000), invalid_input);
  CHECK_THROWS_AS(write_gif("/nonexistent-directory/clip.gif", clip, 10), write_error);
}
