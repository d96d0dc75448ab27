#pragma once
// The root of this source tree, for tests that read files shipped in it (models/, scripts/, tests/reference/).
//
// It comes from CMake (BRANCHGRPO_SOURCE_DIR, an absolute path), never from __FILE__: under ccache's base_dir the
// compiler is handed relative paths, so __FILE__ is relative to the directory the compiler ran in and means
// nothing to a test that runs elsewhere (ctest's working directory, a run config's directory).
#include <filesystem>

#ifndef BRANCHGRPO_SOURCE_DIR
#error "BRANCHGRPO_SOURCE_DIR must name the source tree (tests/CMakeLists.txt sets it for the tests that need it)"
#endif

namespace branchgrpo::testing {

/// The source tree's root, e.g. "/work/main"; models_dir() is "/work/main/models".
/// @post source_root().is_absolute()
inline std::filesystem::path source_root() { return std::filesystem::path(BRANCHGRPO_SOURCE_DIR); }

/// models/ of the source tree: the shipped tiny models (shapes-tiny, moving-shapes-tiny).
inline std::filesystem::path models_dir() { return source_root() / "models"; }

}  // namespace branchgrpo::testing
