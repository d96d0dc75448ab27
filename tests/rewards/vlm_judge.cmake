# The VLM judge's client (tools/app/branchgrpo/app/vlm_judge_client.hpp) against tests/rewards/fake_openai_server.py,
# an OpenAI-compatible chat-completions server in Python's standard library that the test starts on a free loopback
# port (include()d from tests/CMakeLists.txt after remote_client.cmake; label rewards). Torch-free: libcurl, libpng
# and nlohmann-json. Skipped without them.
find_package(PNG QUIET)
if(CURL_FOUND AND TARGET PNG::PNG AND TARGET nlohmann_json::nlohmann_json)
  branchgrpo_client_test(test_vlm_judge_client PNG::PNG)
else()
  message(STATUS "branchgrpo: skipping test_vlm_judge_client (needs libcurl4-openssl-dev, libpng-dev and nlohmann-json)")
endif()
