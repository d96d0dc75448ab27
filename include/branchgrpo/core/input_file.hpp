#pragma once
// Checking an input path before opening it: a directory opens and reads as empty, and a FIFO blocks its reader
// until a writer comes, so readers refuse both with one line instead of running on nothing or hanging.
#include <filesystem>
#include <string_view>
#include <system_error>

#include "branchgrpo/core/error.hpp"

namespace branchgrpo {

/// Throws invalid_input unless `path` is a regular file (after following links); a path that does not exist is
/// left to the caller's open, which names it with the system's reason.
/// Example: require_regular_file("/tmp", "config file") throws "/tmp: is a directory, not a config file";
///   on a FIFO "x.toml: is a FIFO, not a config file"; on an ordinary file it returns.
/// @post returns only for a regular file or a path that does not exist; never opens or blocks.
inline void require_regular_file(const std::filesystem::path& path, std::string_view what) {
  std::error_code error;
  const std::filesystem::file_type type = std::filesystem::status(path, error).type();
  using enum std::filesystem::file_type;
  if (type == regular || type == not_found || type == none) return;
  const char* kind = type == directory                    ? "a directory"
                     : type == fifo                       ? "a FIFO"
                     : type == socket                     ? "a socket"
                     : type == block || type == character ? "a device"
                                                          : "not a regular file";
  fail(path.string(), ": is ", kind, ", not a ", what);
}

}  // namespace branchgrpo
