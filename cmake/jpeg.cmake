# branchgrpo_jpeg: an INTERFACE target linking libjpeg-turbo's TurboJPEG API (<turbojpeg.h>, libturbojpeg), used
# by the JPEG rewards of adapters/torch (branchgrpo/torch/rewards.hpp). Found through pkg-config (libturbojpeg),
# else find_path / find_library. Absent when neither finds it: the torch targets that need it are then skipped.
# Not exported: a consumer of the installed headers links libturbojpeg itself.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(BRANCHGRPO_TURBOJPEG QUIET IMPORTED_TARGET libturbojpeg)
endif()
if(BRANCHGRPO_TURBOJPEG_FOUND)
  add_library(branchgrpo_jpeg INTERFACE)
  target_link_libraries(branchgrpo_jpeg INTERFACE PkgConfig::BRANCHGRPO_TURBOJPEG)
else()
  find_path(BRANCHGRPO_TURBOJPEG_INCLUDE_DIR turbojpeg.h)
  find_library(BRANCHGRPO_TURBOJPEG_LIBRARY NAMES turbojpeg)
  if(BRANCHGRPO_TURBOJPEG_INCLUDE_DIR AND BRANCHGRPO_TURBOJPEG_LIBRARY)
    add_library(branchgrpo_jpeg INTERFACE)
    target_include_directories(branchgrpo_jpeg SYSTEM INTERFACE ${BRANCHGRPO_TURBOJPEG_INCLUDE_DIR})
    target_link_libraries(branchgrpo_jpeg INTERFACE ${BRANCHGRPO_TURBOJPEG_LIBRARY})
  endif()
endif()
if(TARGET branchgrpo_jpeg)
  message(STATUS "branchgrpo: TurboJPEG found, the JPEG rewards build (branchgrpo_jpeg)")
else()
  message(STATUS "branchgrpo: TurboJPEG (libturbojpeg) not found, skipping the JPEG rewards and what uses them; "
                 "install libturbojpeg0-dev")
endif()
