# --- Multi-process output and exposure (label reliability; docs/distributed.md "Exposure" and "Distributed
# output"), on test_distributed and tests/distributed/run_ranks.sh (tests/distributed/distributed.cmake builds them
# when LibTorch has c10d's Gloo process group):
#   - exposure: 2 ranks on MASTER_ADDR=127.0.0.1; rank 0 reads back where its sockets listen (/proc/net/tcp{,6}):
#     the store's and Gloo's accept this host only, and the store refuses every other address of this host;
#   - an unresolvable MASTER_ADDR ends a rank, rank 1 (a client) or rank 0 (the store's host), with exactly one
#     stderr line naming MASTER_ADDR and the failure, however long the timeout: LibTorch's line per connection
#     retry (one a second) stays hidden; the same through `branchgrpo train`.
if(NOT TARGET test_distributed)
  return()
endif()
set(distributed_program $<TARGET_FILE:test_distributed>)
set(distributed_expect_error ${CMAKE_CURRENT_LIST_DIR}/scripts/expect_error.sh)

add_test(NAME reliability_distributed_exposure
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/../distributed/run_ranks.sh -n 2 -t 30 -- ${distributed_program}
                 exposure 10)

# RFC 6761 reserves .invalid: the name never resolves, whatever the network; the reason ("Name or service not
# known", or "Temporary failure in name resolution" without DNS) is the resolver's.
set(unresolvable no-such-host.invalid)
set(unresolvable_line "could not reach the store at MASTER_ADDR = 'no-such-host\\.invalid' within 4 s: the name does not resolve \\(.+\\)$")
add_test(NAME reliability_distributed_unresolvable_client
         COMMAND sh ${distributed_expect_error} -t 30 "^test_distributed: rank 1 ${unresolvable_line}"
                 env WORLD_SIZE=2 RANK=1 MASTER_ADDR=${unresolvable} MASTER_PORT=29500 ${distributed_program} join 4)
add_test(NAME reliability_distributed_unresolvable_host
         COMMAND sh ${distributed_expect_error} -t 30 "^test_distributed: rank 0 ${unresolvable_line}"
                 env WORLD_SIZE=2 RANK=0 MASTER_ADDR=${unresolvable} MASTER_PORT=29500 ${distributed_program} join 4)
set_tests_properties(reliability_distributed_exposure reliability_distributed_unresolvable_client
                     reliability_distributed_unresolvable_host
                     PROPERTIES LABELS "reliability;distributed;torch" TIMEOUT 60)

# The user's path: `branchgrpo train` under the same environment, on the shipped model (the config must load
# before the join).
if(TARGET branchgrpo_cli AND TARGET branchgrpo::app)
  set(distributed_config ${CMAKE_CURRENT_BINARY_DIR}/distributed_unresolvable/train.toml)
  file(WRITE ${distributed_config} "[model]\ndir = \"${PROJECT_SOURCE_DIR}/models/shapes-tiny\"\n[run]\niterations = 1\noutput_dir = \"${CMAKE_CURRENT_BINARY_DIR}/distributed_unresolvable/out\"\n")
  add_test(NAME reliability_distributed_unresolvable_train
           COMMAND sh ${distributed_expect_error} -t 30 "^branchgrpo: rank 1 ${unresolvable_line}"
                   env WORLD_SIZE=2 RANK=1 MASTER_ADDR=${unresolvable} MASTER_PORT=29500
                   $<TARGET_FILE:branchgrpo_cli> train --config ${distributed_config} --timeout 4)
  set_tests_properties(reliability_distributed_unresolvable_train
                       PROPERTIES LABELS "reliability;distributed;torch;cli" TIMEOUT 60)
endif()
