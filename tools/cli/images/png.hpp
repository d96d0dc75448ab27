#pragma once
// The tool's PNG writer (plots, image grids): encode_png and rgb_image of the application layer's torch-free
// branchgrpo/app/png.hpp (libpng; shared with the VLM judge), the bytes written to disk through output_file.hpp's
// write_file. Link libpng (CMake: PNG::PNG, Debian libpng-dev).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/app/png.hpp"
#include "cli/output/output_file.hpp"

namespace branchgrpo::cli {

using branchgrpo::encode_png;
using branchgrpo::rgb_image;

/// Writes encode_png(image) to `path` with write_file (atomic replace; a failure throws write_error naming the
/// path and the reason, e.g. "/dev/full: cannot write: No space left on device").
inline void write_png(const std::string& path, const rgb_image& image) {
  const std::vector<std::uint8_t> bytes = encode_png(image);
  write_file(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

}  // namespace branchgrpo::cli
