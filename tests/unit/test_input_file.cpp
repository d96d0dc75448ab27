// require_regular_file (core/input_file.hpp): a directory or a FIFO is refused without opening it (a FIFO would
// block its reader); a regular file passes; a missing path is left to the caller's open.
#include <catch2/catch.hpp>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "branchgrpo/core/input_file.hpp"
#include "error_text.hpp"

using branchgrpo::require_regular_file;
using branchgrpo::testing::error_of;

TEST_CASE("require_regular_file refuses directories and FIFOs in one line", "[input_file][reliability]") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "branchgrpo_input_file_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "run.toml") << "[run]\n";
  REQUIRE(::mkfifo((dir / "pipe.toml").c_str(), 0600) == 0);

  CHECK_NOTHROW(require_regular_file(dir / "run.toml", "config file"));
  CHECK_NOTHROW(require_regular_file(dir / "absent.toml", "config file"));  // the open will name it
  CHECK(error_of([&] { require_regular_file(dir, "config file"); }) ==
        dir.string() + ": is a directory, not a config file");
  CHECK(error_of([&] { require_regular_file(dir / "pipe.toml", "config file"); }) ==
        (dir / "pipe.toml").string() + ": is a FIFO, not a config file");
  std::filesystem::remove_all(dir);
}
