# Runs the branchgrpo tool on invalid input; run with `cmake -P` by tests/packaging.cmake.
# Passes when the tool exits with a non-zero status (not a crash), prints nothing on stdout and exactly one
# line on stderr that matches EXPECT. Variables: TOOL, ARGS (arguments separated by '|'), EXPECT (a regex).
cmake_minimum_required(VERSION 3.25)

string(REPLACE "|" ";" arguments "${ARGS}")
execute_process(COMMAND ${TOOL} ${arguments} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(shown "branchgrpo ${ARGS}\nexit: ${result}\nstdout: ${out}\nstderr: ${err}")
if(NOT result MATCHES "^[0-9]+$" OR result EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit status (and no crash)\n${shown}")
endif()
if(NOT out STREQUAL "")
  message(FATAL_ERROR "expected nothing on stdout\n${shown}")
endif()
string(REGEX MATCHALL "\n" newlines "${err}")
list(LENGTH newlines lines)
if(NOT lines EQUAL 1 OR NOT err MATCHES "\n$")
  message(FATAL_ERROR "expected exactly one line on stderr\n${shown}")
endif()
if(NOT err MATCHES "${EXPECT}")
  message(FATAL_ERROR "stderr does not match '${EXPECT}'\n${shown}")
endif()
