#pragma once
// 8-bit RGB PNG encoding through libpng's simplified write API (png_image_write_to_memory: zlib deflate at
// libpng's default level, adaptive row filters). Torch-free and file-free: the tool's plots and image grids
// (tools/cli/images/png.hpp writes the bytes to disk) and the VLM judge's image_url parts (vlm_judge_client.hpp)
// both encode here. Link libpng (CMake: PNG::PNG, Debian libpng-dev); tests/unit/test_png.cpp decodes the bytes
// with libpng's reader and compares every pixel.
#include <png.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "branchgrpo/core/error.hpp"

namespace branchgrpo {

/// An 8-bit RGB image, row-major from the top-left, 3 bytes per pixel.
struct rgb_image {
  int width = 0;
  int height = 0;
  std::vector<std::uint8_t> pixels;  ///< width * height * 3

  friend bool operator==(const rgb_image&, const rgb_image&) = default;
};

/// The PNG file of `image`: 8-bit RGB (colour type 2), no interlace, deflate-compressed by libpng.
/// Example: a 1 x 1 image {10, 20, 30} decodes (png_image_finish_read, PNG_FORMAT_RGB) to {10, 20, 30}; a
///   256 x 128 flat white plot is under 1000 bytes (the stored-deflate encoder this replaced wrote 98,505).
/// @pre width, height >= 1 and pixels.size() == width * height * 3 (else invalid_input).
/// @post the bytes decode to exactly image.pixels; libpng failures (out of memory) throw invalid_input with
///       libpng's one-line message.
inline std::vector<std::uint8_t> encode_png(const rgb_image& image) {
  require(image.width >= 1 && image.height >= 1, "a PNG needs at least one pixel, got ", image.width, " x ",
          image.height);
  const auto row_bytes = static_cast<std::size_t>(image.width) * 3;
  require(image.pixels.size() == row_bytes * static_cast<std::size_t>(image.height), "image of ", image.width, " x ",
          image.height, " has ", image.pixels.size(), " bytes, expected ", row_bytes * image.height);
  png_image info{};
  info.version = PNG_IMAGE_VERSION;
  info.width = static_cast<png_uint_32>(image.width);
  info.height = static_cast<png_uint_32>(image.height);
  info.format = PNG_FORMAT_RGB;
  // Two passes: the first (no buffer) asks for the size, the second writes; the simplified API frees its own
  // state on every path, so there is no setjmp here.
  png_alloc_size_t size = 0;
  const auto write = [&](void* memory) {
    const int ok = png_image_write_to_memory(&info, memory, &size, 0, image.pixels.data(),
                                             static_cast<png_int_32>(row_bytes), nullptr);
    require(ok != 0, "libpng cannot encode a ", image.width, " x ", image.height, " image: ", info.message);
  };
  write(nullptr);
  std::vector<std::uint8_t> out(size);
  write(out.data());
  out.resize(size);
  return out;
}

}  // namespace branchgrpo
