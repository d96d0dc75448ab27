# `branchgrpo demo --remote-reward` through scripts/reward_server.py's shapes_alignment scorer against the in-process
# demo (tests/rewards/test_demo_remote.py; include()d from tests/CMakeLists.txt; label rewards).
if(TARGET branchgrpo_cli AND TARGET branchgrpo::app AND EXISTS ${PROJECT_SOURCE_DIR}/models/shapes-tiny/model.safetensors)
  add_test(NAME cli_demo_remote_reward
           COMMAND /usr/bin/python3 -B ${CMAKE_CURRENT_LIST_DIR}/test_demo_remote.py $<TARGET_FILE:branchgrpo_cli>
                   ${CMAKE_CURRENT_BINARY_DIR}/demo_remote)
  set_tests_properties(cli_demo_remote_reward PROPERTIES LABELS "cli;torch;rewards" TIMEOUT 300)
endif()
