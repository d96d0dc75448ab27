#pragma once
// A fresh empty directory for one test's files, removed with everything in it at the end of the scope.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace branchgrpo::testing {

/// <temp>/branchgrpo_<test>_<pid>_<name>, emptied on construction (a crashed earlier run may have left it) and
/// removed on destruction; the pid keeps concurrent runs apart.
/// Example: scratch_dir dir("model_files", "dtypes"); dir.path == "/tmp/branchgrpo_model_files_4242_dtypes".
struct scratch_dir {
  std::filesystem::path path;
  scratch_dir(std::string_view test, std::string_view name)
      : path(std::filesystem::temp_directory_path() /
             ("branchgrpo_" + std::string(test) + "_" + std::to_string(::getpid()) + "_" + std::string(name))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ignored;  // a destructor must not throw; what is left is emptied by the next run
    std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace branchgrpo::testing
