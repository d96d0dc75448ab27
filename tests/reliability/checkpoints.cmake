# --- Checkpoints, resume, signals and train's outputs (label reliability; docs/reliability.md) -----------------------
# test_hash: XXH64 against the reference implementation's values. test_checkpoint_integrity (tests/torch): flipped
# bytes, missing files, malformed manifests, lost optimizer tensors, fallback, cleanup, config comparison.
# tests/reliability/scripts/train_reliability.sh drives `branchgrpo train` on the shipped model: a flipped byte then
# --resume, a changed config then --resume, SIGTERM mid-run then --resume, metrics.jsonl on /dev/full, and FIFOs,
# huge files and link loops where the run reads (mode files).
if(TARGET test_hash)
  set_tests_properties(test_hash PROPERTIES LABELS reliability TIMEOUT 30)
endif()
# The torch tests are added after this file is included: label this one when the directory is done.
function(branchgrpo_label_checkpoint_integrity)
  if(TEST test_checkpoint_integrity)
    set_tests_properties(test_checkpoint_integrity PROPERTIES LABELS "torch;reliability" TIMEOUT 120)
  endif()
endfunction()
cmake_language(DEFER CALL branchgrpo_label_checkpoint_integrity)

if(TARGET branchgrpo_cli AND TARGET branchgrpo::app AND EXISTS ${PROJECT_SOURCE_DIR}/models/shapes-tiny/model.safetensors)
  set(train_reliability ${CMAKE_CURRENT_SOURCE_DIR}/reliability/scripts/train_reliability.sh)
  foreach(mode IN ITEMS checksum config sigterm files)
    add_test(NAME reliability_train_${mode}
             COMMAND bash ${train_reliability} ${mode} $<TARGET_FILE:branchgrpo_cli>
                     ${PROJECT_SOURCE_DIR}/models/shapes-tiny ${CMAKE_CURRENT_BINARY_DIR}/train_reliability/${mode})
    set_tests_properties(reliability_train_${mode} PROPERTIES LABELS "cli;torch;reliability" TIMEOUT 120)
  endforeach()
  if(EXISTS /dev/full)
    add_test(NAME reliability_train_full
             COMMAND bash ${train_reliability} full $<TARGET_FILE:branchgrpo_cli>
                     ${PROJECT_SOURCE_DIR}/models/shapes-tiny ${CMAKE_CURRENT_BINARY_DIR}/train_reliability/full)
    set_tests_properties(reliability_train_full PROPERTIES LABELS "cli;torch;reliability" TIMEOUT 60)
  endif()
  # `sample --samples` is bounded before the model is loaded.
  branchgrpo_cli_error_test(sample_too_many "--samples = 5000: must be an integer in \\[1, 4096\\]" sample --config
                            ${CMAKE_CURRENT_BINARY_DIR}/train_cli/run2.toml --checkpoint x --samples 5000)
  set_tests_properties(cli_error_sample_too_many PROPERTIES LABELS "cli;reliability" TIMEOUT 60)
endif()
