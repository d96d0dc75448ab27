# libjpeg-turbo's TurboJPEG API (<turbojpeg.h>, libturbojpeg; Debian: libturbojpeg0-dev), which ships no CMake
# package. Defines the imported target TurboJPEG::TurboJPEG, found through pkg-config (libturbojpeg) when
# available, else find_path / find_library.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(PC_TurboJPEG QUIET libturbojpeg)
endif()
find_path(TurboJPEG_INCLUDE_DIR NAMES turbojpeg.h HINTS ${PC_TurboJPEG_INCLUDE_DIRS})
find_library(TurboJPEG_LIBRARY NAMES turbojpeg HINTS ${PC_TurboJPEG_LIBRARY_DIRS})
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(TurboJPEG REQUIRED_VARS TurboJPEG_LIBRARY TurboJPEG_INCLUDE_DIR)
if(TurboJPEG_FOUND AND NOT TARGET TurboJPEG::TurboJPEG)
  add_library(TurboJPEG::TurboJPEG UNKNOWN IMPORTED)
  set_target_properties(TurboJPEG::TurboJPEG PROPERTIES IMPORTED_LOCATION "${TurboJPEG_LIBRARY}"
                                                        INTERFACE_INCLUDE_DIRECTORIES "${TurboJPEG_INCLUDE_DIR}")
endif()
mark_as_advanced(TurboJPEG_INCLUDE_DIR TurboJPEG_LIBRARY)
