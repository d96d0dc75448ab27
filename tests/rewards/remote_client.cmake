# The remote reward's client (tools/app/branchgrpo/app/remote_client.hpp) against scripts/reward_server.py,
# which the test starts on a free loopback port (include()d from tests/CMakeLists.txt; label rewards). Torch-free:
# libcurl (Debian libcurl4-openssl-dev) and nlohmann-json. Skipped without libcurl.
find_package(CURL QUIET)
find_package(nlohmann_json 3 CONFIG QUIET)
if(CURL_FOUND AND TARGET nlohmann_json::nlohmann_json)
  add_executable(test_remote_client ${CMAKE_CURRENT_LIST_DIR}/test_remote_client.cpp)
  target_link_libraries(test_remote_client PRIVATE branchgrpo::branchgrpo branchgrpo_warnings Catch2::Catch2WithMain
                                                   CURL::libcurl nlohmann_json::nlohmann_json)
  target_include_directories(test_remote_client PRIVATE ${PROJECT_SOURCE_DIR}/tools/app ${PROJECT_SOURCE_DIR}/tests/support)
  target_compile_definitions(test_remote_client PRIVATE BRANCHGRPO_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  add_test(NAME test_remote_client COMMAND test_remote_client)
  set_tests_properties(test_remote_client PROPERTIES LABELS rewards TIMEOUT 180)
else()
  message(STATUS "branchgrpo: skipping test_remote_client (needs libcurl4-openssl-dev and nlohmann-json)")
endif()
