#pragma once
// The tool's GIF writer for animations (e.g. the frames of a video leaf): frames of rgb_image (png.hpp) encoded
// by giflib (>= 5; CMake GIF::GIF, Debian libgif-dev) as a looping GIF89a with one global palette, written through
// output_file.hpp's write_file.
//
// The palette: GIF holds at most 256 colours.
//   at most 256 distinct colours over all frames (the shapes clips: a background, a few shape colours and their
//     anti-aliased edges): the palette is exactly those colours, sorted by (r, g, b), and every pixel is kept;
//   more: every channel is rounded to the nearest of the 6 levels 0, 51, ..., 255 (the 216-colour cube), so a
//     channel moves by at most 25 (no dithering: flat regions stay flat, gradients band).
// gif_palette says which case applied.
#include <gif_lib.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "cli/images/png.hpp"
#include "cli/output/output_file.hpp"

namespace branchgrpo::cli {

/// A palette and each frame's pixels as indices into it.
struct gif_palette {
  std::vector<std::array<std::uint8_t, 3>> colours;  ///< at most 256
  std::vector<std::vector<std::uint8_t>> indices;    ///< per frame, width * height
  bool exact = true;                                 ///< false: quantized to the 216-colour cube
};

/// The palette of `frames` (see the file comment).
/// Example: two 2 x 1 frames {red, grey} and {grey, red} -> colours {grey (128, 128, 128), red (230, 26, 26)}
///   (sorted), indices {1, 0} and {0, 1}, exact; a frame of 300 distinct colours -> exact = false, channel 30
///   becomes 51 and 20 becomes 0.
/// @pre frames non-empty, each width * height * 3 bytes (checked by encode_gif).
inline gif_palette quantize_gif(std::span<const rgb_image> frames) {
  const auto key = [](const std::uint8_t* p) {
    return (std::uint32_t{p[0]} << 16) | (std::uint32_t{p[1]} << 8) | std::uint32_t{p[2]};
  };
  std::vector<std::uint32_t> distinct;
  for (const rgb_image& frame : frames)
    for (std::size_t i = 0; i < frame.pixels.size(); i += 3) distinct.push_back(key(&frame.pixels[i]));
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  gif_palette out;
  out.exact = distinct.size() <= 256;
  if (!out.exact) {  // the 6 x 6 x 6 cube, index 36 r + 6 g + b of the levels
    for (int r = 0; r < 6; ++r)
      for (int g = 0; g < 6; ++g)
        for (int b = 0; b < 6; ++b)
          out.colours.push_back({static_cast<std::uint8_t>(51 * r), static_cast<std::uint8_t>(51 * g),
                                 static_cast<std::uint8_t>(51 * b)});
  } else {
    for (const std::uint32_t colour : distinct)
      out.colours.push_back({static_cast<std::uint8_t>(colour >> 16), static_cast<std::uint8_t>(colour >> 8),
                             static_cast<std::uint8_t>(colour)});
  }
  for (const rgb_image& frame : frames) {
    std::vector<std::uint8_t> indices(frame.pixels.size() / 3);
    for (std::size_t p = 0; p < indices.size(); ++p) {
      const std::uint8_t* rgb = &frame.pixels[3 * p];
      if (out.exact) {
        const auto at = std::lower_bound(distinct.begin(), distinct.end(), key(rgb)) - distinct.begin();
        indices[p] = static_cast<std::uint8_t>(at);
      } else {
        const auto level = [](std::uint8_t v) { return (v + 25) / 51; };  // nearest of 0, 51, ..., 255
        indices[p] = static_cast<std::uint8_t>(36 * level(rgb[0]) + 6 * level(rgb[1]) + level(rgb[2]));
      }
    }
    out.indices.push_back(std::move(indices));
  }
  return out;
}

namespace detail {

// giflib's output callback: appends to the std::vector<std::uint8_t> in UserData.
inline int append_gif_bytes(GifFileType* gif, const GifByteType* bytes, int length) {
  auto* out = static_cast<std::vector<std::uint8_t>*>(gif->UserData);
  out->insert(out->end(), bytes, bytes + length);
  return length;
}

}  // namespace detail

/// The GIF89a file of the animation `frames`, each shown for `delay_centiseconds` (GIF's unit: 1/100 s), looping
/// forever (NETSCAPE2.0 extension), one global palette from quantize_gif, every frame full-size and opaque.
/// Example: 4 frames of 16 x 16 at delay 25 -> a 1 s loop at 4 frames per second; decoding it (DGifSlurp) gives
///   back every pixel when the frames hold at most 256 colours.
/// @pre frames non-empty; all of one size width, height in [1, 65535]; pixels.size() == width * height * 3;
///      0 <= delay_centiseconds <= 65535 (else invalid_input).
/// @post a GIF whose frames decode to the frames (exactly when quantize_gif(frames).exact).
inline std::vector<std::uint8_t> encode_gif(std::span<const rgb_image> frames, int delay_centiseconds) {
  require(!frames.empty(), "a GIF needs at least one frame");
  const int width = frames.front().width, height = frames.front().height;
  require(width >= 1 && height >= 1 && width <= 65535 && height <= 65535, "a GIF frame must be 1 to 65535 pixels a ",
          "side, got ", width, " x ", height);
  for (std::size_t f = 0; f < frames.size(); ++f) {
    const rgb_image& frame = frames[f];
    require(frame.width == width && frame.height == height, "GIF frame ", f, " is ", frame.width, " x ", frame.height,
            ", frame 0 is ", width, " x ", height);
    require(frame.pixels.size() == static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3, "GIF frame ",
            f, " of ", width, " x ", height, " has ", frame.pixels.size(), " bytes, expected ",
            static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3);
  }
  require(delay_centiseconds >= 0 && delay_centiseconds <= 65535, "GIF frame delay must be in [0, 65535] ",
          "hundredths of a second, got ", delay_centiseconds);
  gif_palette palette = quantize_gif(frames);

  // A colour map's size must be a power of two (at least 2); the unused entries stay black.
  int map_size = 2;
  while (map_size < static_cast<int>(palette.colours.size())) map_size *= 2;
  std::vector<GifColorType> colours(static_cast<std::size_t>(map_size), GifColorType{0, 0, 0});
  for (std::size_t i = 0; i < palette.colours.size(); ++i)
    colours[i] = {palette.colours[i][0], palette.colours[i][1], palette.colours[i][2]};

  std::vector<std::uint8_t> out;
  int error = 0;
  GifFileType* gif = EGifOpen(&out, detail::append_gif_bytes, &error);
  require(gif != nullptr, "giflib cannot start a GIF: ", GifErrorString(error));
  ColorMapObject* map = GifMakeMapObject(map_size, colours.data());
  // Every giflib call returns GIF_OK or GIF_ERROR (its reason in gif->Error); the first failure stops the rest.
  bool ok = map != nullptr;
  const auto step = [&](int status) { ok = ok && status == GIF_OK; };
  if (ok) {
    EGifSetGifVersion(gif, true);  // GIF89a: the animation extensions
    step(EGifPutScreenDesc(gif, width, height, 8, 0, map));
    // NETSCAPE2.0 sub-block: 1, then the loop count 0 (forever) little-endian.
    const std::array<GifByteType, 11> netscape = {'N', 'E', 'T', 'S', 'C', 'A', 'P', 'E', '2', '.', '0'};
    const std::array<GifByteType, 3> loop = {1, 0, 0};
    step(EGifPutExtensionLeader(gif, APPLICATION_EXT_FUNC_CODE));
    step(EGifPutExtensionBlock(gif, static_cast<int>(netscape.size()), netscape.data()));
    step(EGifPutExtensionBlock(gif, static_cast<int>(loop.size()), loop.data()));
    step(EGifPutExtensionTrailer(gif));
    for (std::vector<std::uint8_t>& indices : palette.indices) {
      GraphicsControlBlock control{};
      control.DisposalMode = DISPOSE_DO_NOT;  // every frame covers the whole screen
      control.UserInputFlag = false;
      control.DelayTime = delay_centiseconds;
      control.TransparentColor = NO_TRANSPARENT_COLOR;
      std::array<GifByteType, 4> extension{};
      EGifGCBToExtension(&control, extension.data());
      step(EGifPutExtension(gif, GRAPHICS_EXT_FUNC_CODE, static_cast<int>(extension.size()), extension.data()));
      step(EGifPutImageDesc(gif, 0, 0, width, height, false, nullptr));
      for (int y = 0; y < height && ok; ++y)
        step(EGifPutLine(gif, indices.data() + static_cast<std::ptrdiff_t>(y) * width, width));
    }
  }
  const int failure = map == nullptr ? E_GIF_ERR_NOT_ENOUGH_MEM : gif->Error;
  GifFreeMapObject(map);
  int close_error = 0;
  const bool closed = EGifCloseFile(gif, &close_error) == GIF_OK;  // frees gif; writes the trailer
  require(ok, "giflib cannot encode a ", width, " x ", height, " GIF: ", GifErrorString(failure));
  require(closed, "giflib cannot finish a GIF: ", GifErrorString(close_error));
  return out;
}

/// Writes encode_gif(frames, delay_centiseconds) to `path` with write_file (atomic replace; a failure throws
/// write_error naming the path and the reason, e.g. "/dev/full: cannot write: No space left on device").
inline void write_gif(const std::string& path, std::span<const rgb_image> frames, int delay_centiseconds) {
  const std::vector<std::uint8_t> bytes = encode_gif(frames, delay_centiseconds);
  write_file(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

}  // namespace branchgrpo::cli
