# --- Stops and exit classes (label reliability; docs/reliability.md, "Exit status" and "Stopping") -----------------
# tests/reliability/scripts/stop_reliability.sh: SIGTERM during a held-out evaluation of 4 x 4096 samples, during a
# reward server's slow answer, during `compare` and during `pretrain`, each ending within 10 s with one line and exit
# 143; a reward server failing mid-run (exit 1) and one absent at the start (exit 2). The byte bound of a network
# answer and the stop of a waiting request are tested in test_remote_client and test_vlm_judge_client.
if(TARGET branchgrpo_cli AND TARGET branchgrpo::app AND EXISTS ${PROJECT_SOURCE_DIR}/models/shapes-tiny/model.safetensors)
  foreach(mode IN ITEMS eval scoring server compare pretrain)
    add_test(NAME reliability_stop_${mode}
             COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/reliability/scripts/stop_reliability.sh ${mode}
                     $<TARGET_FILE:branchgrpo_cli> ${PROJECT_SOURCE_DIR}/models/shapes-tiny
                     ${CMAKE_CURRENT_BINARY_DIR}/stop_reliability/${mode} ${PROJECT_SOURCE_DIR})
    set_tests_properties(reliability_stop_${mode} PROPERTIES LABELS "cli;torch;reliability" TIMEOUT 120)
  endforeach()
endif()
