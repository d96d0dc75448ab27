# Multi-process training (ctest -L distributed), include()d from tests/CMakeLists.txt:
#   - test_consistency: check_same_everywhere over a fake two-rank communicator (core only, no LibTorch);
#   - test_distributed: the c10d communicator as real processes started by run_ranks.sh (2 or 3 ranks on the
#     loopback): collectives, environment errors, a rank that exits or hangs, a missing rank, different configs.
#     Built when branchgrpo::torch has c10d's Gloo process group (adapters/CMakeLists.txt sets USE_C10D_GLOO).
add_executable(test_consistency ${CMAKE_CURRENT_LIST_DIR}/test_consistency.cpp)
target_link_libraries(test_consistency PRIVATE branchgrpo::branchgrpo branchgrpo_warnings Catch2::Catch2WithMain)
add_test(NAME test_consistency COMMAND test_consistency)
set_tests_properties(test_consistency PROPERTIES LABELS distributed)

set(distributed_c10d OFF)
if(TARGET branchgrpo_torch)
  get_target_property(distributed_definitions branchgrpo_torch INTERFACE_COMPILE_DEFINITIONS)
  if(USE_C10D_GLOO IN_LIST distributed_definitions)
    set(distributed_c10d ON)
  endif()
endif()
if(NOT distributed_c10d)
  message(STATUS "branchgrpo: skipping the c10d communicator tests (needs branchgrpo::torch with Gloo's headers)")
  return()
endif()

add_executable(test_distributed ${CMAKE_CURRENT_LIST_DIR}/test_distributed.cpp)
target_link_libraries(test_distributed PRIVATE branchgrpo::torch branchgrpo_warnings)

# distributed_test(NAME RANKS SECONDS [-e RANK:EXPECT]... -- SCENARIO [TIMEOUT]): run_ranks.sh with RANKS ranks
# and a deadline of SECONDS.
function(distributed_test name ranks seconds)
  add_test(NAME distributed_${name}
           COMMAND bash ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/run_ranks.sh -n ${ranks} -t ${seconds} ${ARGN})
  set_tests_properties(distributed_${name} PROPERTIES LABELS "distributed;torch" TIMEOUT 60)
endfunction()
set(program $<TARGET_FILE:test_distributed>)

distributed_test(collectives 2 20 -- ${program} collectives 5)
distributed_test(collectives_3_ranks 3 20 -- ${program} collectives 5)
# A rank that crashes: the survivor fails the next collective at once, naming it.
distributed_test(rank_exits 2 20 -e "0:fail:^rank 0: rank 1 did not reach collective 2 \\(all_reduce, timeout 5 s\\): it died or hangs \\(rank 0: .*\\)$" -e 1:any
                 -- ${program} rank1_exits 5)
# A rank that hangs: the survivor fails within the timeout (3 s here), naming it; run_ranks.sh kills the sleeper.
distributed_test(rank_hangs 2 20 -e "0:fail:^rank 0: rank 1 did not reach collective 2 \\(all_reduce, timeout 3 s\\): it died or hangs" -e 1:any
                 -- ${program} rank1_hangs 3)
# The store's host crashes: the survivor names rank 0.
distributed_test(store_host_exits 2 20 -e "1:fail:^rank 1: rank 0 .*(did not reach|is unreachable).*collective 2 .*it died or hangs" -e 0:any
                 -- ${program} rank0_exits 5)
# A rank that never starts: the rendezvous names it.
distributed_test(rank_absent 2 20 -e "0:fail:^rank 0: rank 1 did not join the group at 127\\.0\\.0\\.1:[0-9]+ within 3 s: not started, or died$" -e 1:ok
                 -- ${program} rank1_absent 3)
# Different configs: every rank fails with the same line.
set(mismatch "the ranks run different configs: rank 0 xxh64 [0-9a-f]{16}, rank 1 xxh64 [0-9a-f]{16}$")
distributed_test(config_mismatch 2 20 -e "0:fail:^rank 0: ${mismatch}" -e "1:fail:^rank 1: ${mismatch}"
                 -- ${program} config_mismatch 5)
# A collective that fails on every rank (sizes differ, a caller's bug): every rank fails within the timeout, blaming
# none, and rank 0 (the store's host) stays until the others have read the reports.
set(everywhere "collective 1 \\(all_reduce, timeout 3 s\\) failed on every rank: ")
distributed_test(fails_everywhere 2 20 -e "0:fail:^rank 0: ${everywhere}" -e "1:fail:^rank 1: ${everywhere}"
                 -- ${program} size_mismatch 3)

# The environment contract, in one process: read_launch_environment's checks, and one malformed variable end to end
# (one line on stderr naming it).
add_test(NAME distributed_environment COMMAND test_distributed environment)
add_test(NAME distributed_environment_line
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/../reliability/scripts/expect_error.sh -t 20
                 "^test_distributed: RANK = x: must be an integer in \\[0, 1\\]$"
                 env WORLD_SIZE=2 RANK=x MASTER_ADDR=127.0.0.1 MASTER_PORT=1 ${program} join)
set_tests_properties(distributed_environment distributed_environment_line PROPERTIES LABELS "distributed;torch"
                                                                                     TIMEOUT 60)

# The toy policy (host backend) through the c10d communicator: 2 ranks end where one process ends.
distributed_test(toy 2 40 -- ${program} toy 20)

# Sharded training (ZeRO-1, ZeRO-2) of the autograd policy: 2 and 3 ranks end where one unsharded process ends, each
# rank holding its share of AdamW's state; one rank is bit for bit the unsharded policy.
distributed_test(zero 2 60 -- ${program} zero 20)
distributed_test(zero_3_ranks 3 60 -- ${program} zero 20)
add_test(NAME distributed_zero_one COMMAND test_distributed zero_one)
set_tests_properties(distributed_zero_one PROPERTIES LABELS "distributed;torch" TIMEOUT 60)

# `branchgrpo train` on 2 ranks (tests/distributed/train_ranks.sh): the same weights and metrics as one process; a
# killed rank named within the timeout; a 2-rank checkpoint resumed by one process; different configs refused on both
# ranks; `--trace` writing one process's iterations and refused on 2 ranks.
# The zero* modes shard: 2 sharded ranks = one unsharded process; sharded checkpoints resumed at another world size
# (2 -> 1, 1 -> 2, 2 -> 3) and at the same one (bit for bit, also after a rank was killed while writing its shard:
# kill_on_rename, a preloaded fault); export-lora reading a sharded checkpoint.
if(TARGET branchgrpo_cli AND TARGET branchgrpo::app)
  add_library(kill_on_rename MODULE ${CMAKE_CURRENT_LIST_DIR}/kill_on_rename.cpp)
  target_link_libraries(kill_on_rename PRIVATE ${CMAKE_DL_LIBS})
  foreach(mode IN ITEMS same killed resume mismatch trace zero1_full zero2_full zero2_lora zero2_uneven zero_resume
                        zero_reshard_1_2 zero_reshard_2_3 zero_killed)
    add_test(NAME distributed_train_${mode}
             COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train_ranks.sh ${mode} $<TARGET_FILE:branchgrpo_cli> ${program}
                     ${PROJECT_SOURCE_DIR}/models/shapes-tiny ${CMAKE_CURRENT_BINARY_DIR}/distributed_train_${mode}
                     $<TARGET_FILE:kill_on_rename>)
    set_tests_properties(distributed_train_${mode} PROPERTIES LABELS "distributed;torch;cli" TIMEOUT 90)
  endforeach()
endif()

# The same launched by torchrun (python3-torch, scripts/setup.sh), the launcher docs/distributed.md shows first.
find_program(torchrun_program torchrun)
if(TARGET branchgrpo_cli AND TARGET branchgrpo::app AND torchrun_program)
  add_test(NAME distributed_train_torchrun
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train_ranks.sh torchrun $<TARGET_FILE:branchgrpo_cli> ${program}
                   ${PROJECT_SOURCE_DIR}/models/shapes-tiny ${CMAKE_CURRENT_BINARY_DIR}/distributed_train_torchrun)
  set_tests_properties(distributed_train_torchrun PROPERTIES LABELS "distributed;torch;cli" TIMEOUT 90)
elseif(NOT torchrun_program)
  message(STATUS "branchgrpo: no torchrun (python3-torch): distributed_train_torchrun is not run")
endif()
