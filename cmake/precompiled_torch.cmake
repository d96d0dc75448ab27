# One precompiled <torch/torch.h> for every target of this project that compiles LibTorch's headers.
#
# Parsing <torch/torch.h> is most of the ~40 s a LibTorch translation unit takes on this project's 2-core machine
# (about 30 s of it, measured with g++ 12 -fsyntax-only), and the build has ~25 such units, each its own test
# executable or tool source. branchgrpo_torch_pch precompiles the header once; branchgrpo_precompile_torch(target)
# makes a target reuse it (CMake's REUSE_FROM: the same .gch, force-included before each of the target's sources).
# GCC uses a precompiled header only when the flags that shape it match, and CMake adds -Winvalid-pch, which
# -Werror turns into an error, so a mismatch fails the build instead of silently costing the time again.
#
#   branchgrpo_precompile_torch(test_flux)                      every source of test_flux
#   branchgrpo_precompile_torch(branchgrpo_cli SOURCES a.cpp)   only these sources (the others skip it)
#
# Off by default: with Debian 12's GCC 12 at -O3 the precompiled header changes what gets inlined, and GCC 12's
# false positives for `"literal" + std::string&&` (GCC bug 105329: -Wrestrict, -Wstringop-overflow, -Warray-bounds)
# then fail -Werror builds of the safetensors writer in test_autoencoder. Measured here before that: a LibTorch test
# TU took 25 s of CPU with the precompiled header instead of 38 s, and making the header ~60 s once (a 630 MB .gch).
# -DBRANCHGRPO_PRECOMPILED_TORCH=ON turns it on (GCC 13 or clang, or BRANCHGRPO_WARNINGS_AS_ERRORS=OFF); nothing
# else changes: every source includes what it uses.
option(BRANCHGRPO_PRECOMPILED_TORCH "Precompile <torch/torch.h> once for the LibTorch translation units" OFF)

if(BRANCHGRPO_PRECOMPILED_TORCH AND TARGET branchgrpo::torch AND NOT TARGET branchgrpo_torch_pch)
  add_library(branchgrpo_torch_pch OBJECT ${CMAKE_CURRENT_LIST_DIR}/torch_pch.cpp)
  target_link_libraries(branchgrpo_torch_pch PRIVATE branchgrpo::torch branchgrpo_warnings)
  target_precompile_headers(branchgrpo_torch_pch PRIVATE <torch/torch.h>)
endif()

function(branchgrpo_precompile_torch target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES")
  if(NOT TARGET branchgrpo_torch_pch)
    return()
  endif()
  target_precompile_headers(${target} REUSE_FROM branchgrpo_torch_pch)
  if(arg_SOURCES)
    get_target_property(sources ${target} SOURCES)
    foreach(source IN LISTS sources)
      if(NOT source IN_LIST arg_SOURCES)
        set_source_files_properties(${source} TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
      endif()
    endforeach()
  endif()
endfunction()
