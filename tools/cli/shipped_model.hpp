#pragma once
// Where the shipped demo model (models/shapes-tiny) is: the tool runs from the source tree, a build directory or
// an install. BRANCHGRPO_SOURCE_DIR and BRANCHGRPO_DATA_DIR come from tools/CMakeLists.txt.
#include <filesystem>

namespace branchgrpo::cli {

/// `explicit_dir` when given; else the first existing of ./models/shapes-tiny, <source tree>/models/shapes-tiny,
/// <prefix>/share/branchgrpo/models/shapes-tiny; else ./models/shapes-tiny (whose loader then names it in its
/// error). Example: shipped_model_dir("") from the repository root == "models/shapes-tiny".
inline std::filesystem::path shipped_model_dir(const std::filesystem::path& explicit_dir) {
  if (!explicit_dir.empty()) return explicit_dir;
  const std::filesystem::path here = "models/shapes-tiny";
  if (std::filesystem::is_directory(here)) return here;
  for (const std::filesystem::path root : {BRANCHGRPO_SOURCE_DIR, BRANCHGRPO_DATA_DIR}) {
    const std::filesystem::path candidate = root / "models/shapes-tiny";
    if (std::filesystem::is_directory(candidate)) return candidate;
  }
  return here;
}

}  // namespace branchgrpo::cli
