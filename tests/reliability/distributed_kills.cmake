# --- A dead peer in a multi-process run (label reliability; docs/reliability.md "Distributed output and exposure"):
#   - reliability_distributed_store_host_killed: `branchgrpo train` on 2 ranks whose rank 0, the store's host, is
#     SIGKILLed 14 times at different moments (start-up, the rendezvous, frozen then killed while rank 1 connects, the
#     held-out evaluation and the rollout of a ZeRO-2 run with an EMA, checkpoint writes: scripts/kill_store_host.sh);
#     the survivor ends each time with exit 1 and one line naming rank 0, never an abort, another signal or a hang.
#     Before the fix it aborted (134) when LibTorch 1.13's TCPStore thread threw "Connection reset by peer" (about
#     half of the frozen kills) and when the evaluation's EMA swap, a collective, threw from a destructor (every
#     kill during a ZeRO-2 evaluation).
# Needs the tool, the kill_on_rename fault library and c10d's Gloo process group (tests/distributed/distributed.cmake).
if(NOT TARGET test_distributed OR NOT TARGET branchgrpo_cli OR NOT TARGET kill_on_rename)
  return()
endif()
add_test(NAME reliability_distributed_store_host_killed
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/scripts/kill_store_host.sh $<TARGET_FILE:branchgrpo_cli>
                 ${PROJECT_SOURCE_DIR}/models/shapes-tiny ${CMAKE_CURRENT_BINARY_DIR}/distributed_store_host_killed
                 $<TARGET_FILE:kill_on_rename>)
set_tests_properties(reliability_distributed_store_host_killed
                     PROPERTIES LABELS "reliability;distributed;torch;cli" TIMEOUT 240)
