# The remote reward's client (tools/app/branchgrpo/app/remote_client.hpp) against scripts/reward_server.py,
# which the test starts on a free loopback port (include()d from tests/CMakeLists.txt; label rewards). Torch-free:
# libcurl (Debian libcurl4-openssl-dev) and nlohmann-json. Skipped without libcurl.
find_package(CURL QUIET)
find_package(nlohmann_json 3 CONFIG QUIET)

# A torch-free test of a server's client: tests/rewards/<name>.cpp linked with libcurl, nlohmann-json and the
# libraries after the name, tools/app and tests/support on its include path; label rewards.
function(branchgrpo_client_test name)
  add_executable(${name} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/${name}.cpp)
  target_link_libraries(${name} PRIVATE branchgrpo::branchgrpo branchgrpo_warnings Catch2::Catch2WithMain CURL::libcurl
                                        nlohmann_json::nlohmann_json ${ARGN})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tools/app ${PROJECT_SOURCE_DIR}/tests/support)
  target_compile_definitions(${name} PRIVATE BRANCHGRPO_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS rewards TIMEOUT 180)
endfunction()

if(CURL_FOUND AND TARGET nlohmann_json::nlohmann_json)
  branchgrpo_client_test(test_remote_client)
else()
  message(STATUS "branchgrpo: skipping test_remote_client (needs libcurl4-openssl-dev and nlohmann-json)")
endif()
