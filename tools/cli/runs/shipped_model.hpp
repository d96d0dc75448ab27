#pragma once
// Where the shipped demo models (models/shapes-tiny, models/moving-shapes-tiny) are: the tool runs from the source
// tree, a build directory or an install. BRANCHGRPO_SOURCE_DIR and BRANCHGRPO_DATA_DIR come from
// tools/CMakeLists.txt.
#include <filesystem>
#include <string>

namespace branchgrpo::cli {

/// `explicit_dir` when given; else the first existing of ./models/NAME, <source tree>/models/NAME,
/// <prefix>/share/branchgrpo/models/NAME; else ./models/NAME (whose loader then names it in its error).
/// Example: shipped_model_dir("") from the repository root == "models/shapes-tiny";
///   shipped_model_dir("", "moving-shapes-tiny") == "models/moving-shapes-tiny".
inline std::filesystem::path shipped_model_dir(const std::filesystem::path& explicit_dir,
                                               const std::string& name = "shapes-tiny") {
  if (!explicit_dir.empty()) return explicit_dir;
  const std::filesystem::path here = std::filesystem::path("models") / name;
  if (std::filesystem::is_directory(here)) return here;
  for (const std::filesystem::path root : {BRANCHGRPO_SOURCE_DIR, BRANCHGRPO_DATA_DIR}) {
    const std::filesystem::path candidate = root / "models" / name;
    if (std::filesystem::is_directory(candidate)) return candidate;
  }
  return here;
}

}  // namespace branchgrpo::cli
