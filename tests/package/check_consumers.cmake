# Installs branchgrpo and builds projects that consume it; run with `cmake -P` by tests/packaging.cmake.
#   MODE=install       empty WORK_DIR, `cmake --install BUILD_DIR --prefix PREFIX`, then check the prefix holds
#                      every file under HEADER_ROOTS' branchgrpo/ directories (each a source include root, installed
#                      into INCLUDEDIR) and every path in FILES ('|'-separated, relative to PREFIX); with TOOL (the
#                      installed tool, relative to PREFIX), run it. The fixture of the MODE=consumer tests.
#   MODE=consumer      build consumer/ from PREFIX with find_package(branchgrpo), linking only branchgrpo::TARGET
#                      (consumer/TARGET.cpp), and run it. TORCH=OFF: the build's compile and link lines must not
#                      mention LibTorch (the target builds without it); TORCH=ON: they must (the check's control).
#   MODE=subdirectory  build subdirectory/, which add_subdirectory()s SOURCE_DIR
# Other variables: WORK_DIR, CXX_COMPILER and GENERATOR (consumer, subdirectory), CONFIG (may be empty), CCACHE and
# CCACHE_BASEDIR (optional: the compiler launcher and its base directory).
cmake_minimum_required(VERSION 3.25)

set(required MODE WORK_DIR)
if(MODE STREQUAL "install")
  list(APPEND required BUILD_DIR PREFIX INCLUDEDIR)
elseif(MODE STREQUAL "consumer")
  list(APPEND required PREFIX TARGET TORCH CXX_COMPILER GENERATOR)
elseif(MODE STREQUAL "subdirectory")
  list(APPEND required SOURCE_DIR CXX_COMPILER GENERATOR)
else()
  message(FATAL_ERROR "unknown MODE '${MODE}' (install, consumer or subdirectory)")
endif()
foreach(variable IN LISTS required)
  if(NOT DEFINED ${variable} OR "${${variable}}" STREQUAL "")
    message(FATAL_ERROR "check_consumers.cmake MODE=${MODE} needs -D${variable}=...")
  endif()
endforeach()
if(NOT CONFIG)
  set(CONFIG Release)
endif()

# Runs a command; stops with its output unless it exits 0. The output is left in `run_output`.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT result EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "'${command}' failed (${result}):\n${output}")
  endif()
  set(run_output "${output}" PARENT_SCOPE)
endfunction()

set(package_dir ${CMAKE_CURRENT_LIST_DIR})
file(REMOVE_RECURSE ${WORK_DIR})

if(MODE STREQUAL "install")
  file(REMOVE_RECURSE ${PREFIX})  # nothing left over from an earlier install may pass the checks below
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX} --config ${CONFIG})
  set(missing "")
  set(headers 0)
  string(REPLACE "|" ";" roots "${HEADER_ROOTS}")
  foreach(root IN LISTS roots)
    file(GLOB_RECURSE sources RELATIVE ${root} ${root}/branchgrpo/*)
    if(NOT sources)
      message(FATAL_ERROR "no headers under ${root}/branchgrpo")
    endif()
    foreach(source IN LISTS sources)
      math(EXPR headers "${headers} + 1")
      if(NOT EXISTS ${PREFIX}/${INCLUDEDIR}/${source})
        list(APPEND missing ${INCLUDEDIR}/${source})
      endif()
    endforeach()
  endforeach()
  string(REPLACE "|" ";" files "${FILES}")
  foreach(file IN LISTS files)
    if(NOT EXISTS ${PREFIX}/${file})
      list(APPEND missing ${file})
    endif()
  endforeach()
  if(missing)
    list(JOIN missing "\n  " missing)
    message(FATAL_ERROR "the install into ${PREFIX} lacks:\n  ${missing}")
  endif()
  list(LENGTH roots root_count)
  list(LENGTH files file_count)
  message(STATUS "install: ${headers} headers of ${root_count} include roots and ${file_count} other files present")
  if(TOOL)
    run(${PREFIX}/${TOOL} tree --json)
    if(NOT run_output MATCHES "\"evaluations\":203[,}]")
      message(FATAL_ERROR "the installed branchgrpo tool printed:\n${run_output}")
    endif()
    message(STATUS "install: the installed tool runs")
  endif()
  return()
endif()

set(build ${WORK_DIR}/build)
set(configure_args -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=${CONFIG})
# The project's ccache (CMakeLists.txt), when its build has one: the consumers' LibTorch translation units are the
# same in every clone, so a clean clone's run hits the cache of an earlier one (CCACHE_BASEDIR is its source tree).
if(CCACHE)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE})
  set(ENV{CCACHE_BASEDIR} ${CCACHE_BASEDIR})
  set(ENV{CCACHE_NOHASHDIR} true)
endif()
if(MODE STREQUAL "consumer")
  # A torch-free target is consumed with LibTorch made unfindable: find_package(branchgrpo COMPONENTS <target>)
  # must not look for it even though the install holds branchgrpo::torch.
  set(no_torch "")
  if(NOT TORCH)
    set(no_torch -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON)
  endif()
  run(${CMAKE_COMMAND} -S ${package_dir}/consumer -B ${build} ${configure_args} -DCMAKE_PREFIX_PATH=${PREFIX}
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DBRANCHGRPO_TARGET=${TARGET} ${no_torch})
  string(FIND "${run_output}" "branchgrpo_DIR=${PREFIX}/" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "find_package(branchgrpo) did not use the install prefix ${PREFIX}:\n${run_output}")
  endif()
else()
  run(${CMAKE_COMMAND} -S ${package_dir}/subdirectory -B ${build} ${configure_args}
      -DBRANCHGRPO_SOURCE_DIR=${SOURCE_DIR})
endif()

run(${CMAKE_COMMAND} --build ${build} --config ${CONFIG} --verbose)
if(MODE STREQUAL "consumer")
  # LibTorch on a command line: its libraries (libtorch*.so, libc10*.so, -ltorch, torch*.lib), its API include
  # directory, or the ABI flag branchgrpo::torch passes on from TORCH_CXX_FLAGS.
  set(torch_pattern "lib(torch|c10)[_a-z]*\\.(so|a|dylib)|-l(torch|c10)|(torch|c10)[_a-z]*\\.lib")
  string(APPEND torch_pattern "|torch/csrc/api/include|_GLIBCXX_USE_CXX11_ABI")
  string(REGEX MATCH "${torch_pattern}" torch_seen "${run_output}")
  if(TORCH AND NOT torch_seen)
    message(FATAL_ERROR "branchgrpo::${TARGET}'s build mentions no LibTorch (the check below sees nothing):\n"
                        "${run_output}")
  elseif(NOT TORCH AND torch_seen)
    message(FATAL_ERROR "branchgrpo::${TARGET} must build without LibTorch, but its build uses '${torch_seen}':\n"
                        "${run_output}")
  endif()
endif()
if(EXISTS ${build}/${CONFIG}/consumer)  # multi-config generators
  run(${build}/${CONFIG}/consumer)
else()
  run(${build}/consumer)
endif()
if(MODE STREQUAL "consumer")
  message(STATUS "branchgrpo::${TARGET} consumer: ${run_output}")
else()
  message(STATUS "subdirectory consumer: ${run_output}")
endif()
