// open_input_file / read_input_file / file_digest (files/input_file.hpp): what every reader of a run's input files
// goes through. A directory, a FIFO (which would block an ordinary open), a device (a link to /dev/zero reads for
// ever), a file over its kind's limit, a link loop and a missing file are each one line; a regular file reads whole.
#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "branchgrpo/files/input_file.hpp"
#include "error_text.hpp"
#include "scratch_dir.hpp"

namespace bg = branchgrpo;
using branchgrpo::testing::error_of;
using branchgrpo::testing::scratch_dir;

TEST_CASE("open_input_file refuses what is not a regular file, in one line, without blocking",
          "[input_file][reliability]") {
  const scratch_dir dir("input_file", "kinds");
  std::ofstream(dir.path / "run.toml") << "[run]\n";
  REQUIRE(::mkfifo((dir.path / "pipe.toml").c_str(), 0600) == 0);
  std::filesystem::create_symlink("/dev/zero", dir.path / "zero.toml");
  std::filesystem::create_symlink(dir.path / "loop_b", dir.path / "loop_a");
  std::filesystem::create_symlink(dir.path / "loop_a", dir.path / "loop_b");
  const bg::input_kind config = bg::input_kinds::config;

  CHECK(bg::read_input_file(dir.path / "run.toml", config) == "[run]\n");
  CHECK(bg::open_input_file(dir.path / "run.toml", config).size() == 6);
  CHECK(error_of([&] { (void)bg::open_input_file(dir.path, config); }) ==
        dir.path.string() + ": is a directory, not a config file");
  CHECK(error_of([&] { (void)bg::open_input_file(dir.path / "pipe.toml", config); }) ==
        (dir.path / "pipe.toml").string() + ": is a FIFO, not a config file");
  CHECK(error_of([&] { (void)bg::open_input_file(dir.path / "zero.toml", config); }) ==
        (dir.path / "zero.toml").string() + ": is a device, not a config file");
  CHECK(error_of([&] { (void)bg::open_input_file(dir.path / "loop_a", config); }) ==
        (dir.path / "loop_a").string() + ": cannot open the config file: Too many levels of symbolic links");
  CHECK(error_of([&] { (void)bg::open_input_file(dir.path / "absent.toml", config); }) ==
        (dir.path / "absent.toml").string() + ": cannot open the config file: No such file or directory");
}

TEST_CASE("open_input_file refuses a file over its kind's limit before reading it", "[input_file][reliability]") {
  const scratch_dir dir("input_file", "limit");
  const std::filesystem::path huge = dir.path / "manifest.txt";
  std::ofstream(huge).put('x');
  std::filesystem::resize_file(huge, std::uint64_t{9} << 30);  // sparse: 9 GiB on no disk
  CHECK(error_of([&] { (void)bg::read_input_file(huge, bg::input_kinds::manifest); }) ==
        huge.string() + ": 9.66 GB is over the limit of 1.05 MB for a checkpoint manifest");
  // At the limit itself it reads.
  std::filesystem::resize_file(huge, bg::input_kinds::manifest.max_bytes);
  CHECK(bg::read_input_file(huge, bg::input_kinds::manifest).size() == bg::input_kinds::manifest.max_bytes);
}

TEST_CASE("path_text cuts a long path in the middle", "[input_file][reliability]") {
  CHECK(bg::path_text("/a/b.toml") == "/a/b.toml");
  const std::string long_path = "/" + std::string(5000, 'd') + "/run.toml";
  const std::string shown = bg::path_text(long_path);
  CHECK(shown.size() == 160);
  CHECK(shown.starts_with("/ddd"));
  CHECK(shown.ends_with("ddd/run.toml"));
  CHECK(shown.find("...") == 78);
  // A refusal names the cut path, so one line stays short.
  CHECK(error_of([&] { (void)bg::open_input_file(long_path, bg::input_kinds::config); }).size() < 250);
}

TEST_CASE("file_digest streams a whole file through the same open", "[input_file][hash][reliability]") {
  const scratch_dir dir("input_file", "digest");
  std::ofstream(dir.path / "abc.bin", std::ios::binary) << "abc";
  std::string big((std::size_t{1} << 20) + 77, '\0');  // more than one 1 MiB chunk
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i & 0xFF);
  std::ofstream(dir.path / "big.bin", std::ios::binary).write(big.data(), static_cast<std::streamsize>(big.size()));
  REQUIRE(::mkfifo((dir.path / "pipe.bin").c_str(), 0600) == 0);

  CHECK(bg::file_digest(dir.path / "abc.bin") == bg::file_digest_result{.size = 3, .xxh64 = 0x44bc2cf5ad770999ull});
  CHECK(bg::file_digest(dir.path / "big.bin") ==
        bg::file_digest_result{.size = big.size(), .xxh64 = bg::xxh64_digest(big)});
  CHECK(error_of([&] { (void)bg::file_digest(dir.path / "absent.bin"); }) ==
        (dir.path / "absent.bin").string() + ": cannot open the file: No such file or directory");
  CHECK(error_of([&] { (void)bg::file_digest(dir.path / "pipe.bin"); }) ==
        (dir.path / "pipe.bin").string() + ": is a FIFO, not a file");
}
