# Builds and runs a project that consumes branchgrpo; run with `cmake -P` by tests/packaging.cmake.
#   MODE=install       cmake --install BUILD_DIR into WORK_DIR/prefix, then build consumer/ with find_package
#                      (and, with TOOL_INSTALLED, run the installed branchgrpo tool; every adapter in
#                      ADAPTERS, comma-separated, must come with the package)
#   MODE=subdirectory  build subdirectory/, which add_subdirectory()s SOURCE_DIR
# Other variables: SOURCE_DIR, WORK_DIR, CXX_COMPILER, GENERATOR, CONFIG (may be empty), BINDIR.
cmake_minimum_required(VERSION 3.25)

foreach(variable IN ITEMS MODE SOURCE_DIR WORK_DIR CXX_COMPILER GENERATOR)
  if(NOT DEFINED ${variable} OR "${${variable}}" STREQUAL "")
    message(FATAL_ERROR "check_consumers.cmake needs -D${variable}=...")
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
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})
set(configure_args -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=${CONFIG})

if(MODE STREQUAL "install")
  if(NOT BUILD_DIR)
    message(FATAL_ERROR "MODE=install needs -DBUILD_DIR=...")
  endif()
  set(prefix ${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix} --config ${CONFIG})
  run(${CMAKE_COMMAND} -S ${package_dir}/consumer -B ${build} ${configure_args} -DCMAKE_PREFIX_PATH=${prefix}
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
  string(FIND "${run_output}" "branchgrpo_DIR=${prefix}/" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "find_package(branchgrpo) did not use the install prefix ${prefix}:\n${run_output}")
  endif()
  string(REPLACE "," ";" adapters "${ADAPTERS}")
  foreach(adapter IN LISTS adapters)
    string(FIND "${run_output}" "adapter branchgrpo::${adapter} found" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "the installed package lacks branchgrpo::${adapter}:\n${run_output}")
    endif()
  endforeach()
  if(TOOL_INSTALLED)
    run(${prefix}/${BINDIR}/branchgrpo tree --json)
    if(NOT run_output MATCHES "\"evaluations\":203[,}]")
      message(FATAL_ERROR "the installed branchgrpo tool printed:\n${run_output}")
    endif()
    # `branchgrpo demo` run outside the source tree loads the installed copy of the shipped model.
    foreach(file IN ITEMS model.safetensors prompts.safetensors)
      if(NOT EXISTS ${prefix}/share/branchgrpo/models/shapes-tiny/${file})
        message(FATAL_ERROR "the install lacks share/branchgrpo/models/shapes-tiny/${file}")
      endif()
    endforeach()
  endif()
elseif(MODE STREQUAL "subdirectory")
  run(${CMAKE_COMMAND} -S ${package_dir}/subdirectory -B ${build} ${configure_args}
      -DBRANCHGRPO_SOURCE_DIR=${SOURCE_DIR})
else()
  message(FATAL_ERROR "unknown MODE '${MODE}' (install or subdirectory)")
endif()

run(${CMAKE_COMMAND} --build ${build} --config ${CONFIG})
if(EXISTS ${build}/${CONFIG}/consumer)  # multi-config generators
  run(${build}/${CONFIG}/consumer)
else()
  run(${build}/consumer)
endif()
message(STATUS "${MODE} consumer: ${run_output}")
