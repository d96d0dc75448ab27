# --- Special files (label reliability): a FIFO or a directory where a file is read is one line, never a hang ----
# (each test's timeout turns a hang into a failure). tests/unit/test_input_file.cpp checks the one open itself
# (files/input_file.hpp).
if(TARGET test_input_file)
  target_link_libraries(test_input_file PRIVATE branchgrpo::files)
  set_tests_properties(test_input_file PROPERTIES LABELS reliability TIMEOUT 30)
endif()
if(TARGET branchgrpo_cli)
  set(special_dir ${CMAKE_CURRENT_BINARY_DIR}/special_files)
  add_test(NAME reliability_special_files_setup
           COMMAND sh -c "rm -rf '${special_dir}' && mkdir -p '${special_dir}/config_dir' && mkfifo '${special_dir}/fifo.safetensors' '${special_dir}/fifo.index.json' '${special_dir}/fifo.toml' && printf '{\"weight_map\": {\"w\": \"fifo.safetensors\"}}' > '${special_dir}/fifo_shard.index.json'")
  set_tests_properties(reliability_special_files_setup PROPERTIES FIXTURES_SETUP special_files LABELS reliability)
  function(special_file_test name regex)
    branchgrpo_cli_error_test(${name} "${regex}" ${ARGN})
    set_tests_properties(cli_error_${name} PROPERTIES FIXTURES_REQUIRED special_files LABELS "cli;reliability"
                                                      TIMEOUT 30)
  endfunction()
  # A size far beyond the limit is refused before anything is allocated (under a 2 GiB address-space limit).
  add_test(NAME reliability_tree_huge_steps
           COMMAND sh -c "ulimit -v 2000000; '$<TARGET_FILE:branchgrpo_cli>' tree --steps 2147483647")
  set_tests_properties(reliability_tree_huge_steps PROPERTIES LABELS "cli;reliability" TIMEOUT 30 WILL_FAIL FALSE
                       PASS_REGULAR_EXPRESSION "at most 255 steps are supported, got 2147483647")
  special_file_test(weights_fifo "fifo.safetensors: is a FIFO, not a safetensors file" weights ${special_dir}/fifo.safetensors)
  special_file_test(weights_fifo_index "fifo.index.json: is a FIFO, not a safetensors index" weights
                    ${special_dir}/fifo.index.json)
  # A sharded checkpoint whose shard is a FIFO: named as one, never as missing (checkpoint directories' shards:
  # test_checkpoint_integrity).
  special_file_test(weights_fifo_shard
                    "fifo_shard.index.json: shard 'fifo.safetensors': .*/fifo.safetensors: is a FIFO, not a safetensors file"
                    weights ${special_dir}/fifo_shard.index.json)
  if(TARGET branchgrpo::app)
    special_file_test(train_fifo_config "fifo.toml: is a FIFO, not a config file" train --config
                      ${special_dir}/fifo.toml)
    special_file_test(train_directory_config "config_dir: is a directory, not a config file" train --config
                      ${special_dir}/config_dir)
  endif()
endif()
