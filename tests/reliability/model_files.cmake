# --- Model files (label reliability; docs/reliability.md, "Model files") ------------------------------------------
# test_model_files (tests/unit, torch-free): the header's bounds on tensors and JSON values, refused as they are
# reached and naming the file; the NaN / infinity search. It also writes the bad files the tool is run on below
# (fixture model_files): a header of 2^17 + 1 tensors, and the shipped image model with I32 weights, with a NaN
# weight and with both families' metadata. test_model_files_torch: dtypes and non-finite weights refused at load,
# naming the file (or shard) and the tensor. test_shapes "[model_files]": the model-directory readers.
set(model_files_dir ${CMAKE_CURRENT_BINARY_DIR}/model_files)
if(TARGET test_model_files)
  target_link_libraries(test_model_files PRIVATE branchgrpo::safetensors)
  target_compile_definitions(test_model_files PRIVATE BRANCHGRPO_MODEL_FILES_DIR="${model_files_dir}"
                                                      BRANCHGRPO_MODELS_DIR="${PROJECT_SOURCE_DIR}/models")
  set_tests_properties(test_model_files PROPERTIES LABELS reliability TIMEOUT 60 FIXTURES_SETUP model_files)
endif()

# The torch tests are added after this file is included: label and filter them when the directory is done.
function(branchgrpo_model_files_torch_tests)
  if(TEST test_model_files_torch)
    set_tests_properties(test_model_files_torch PROPERTIES LABELS "torch;reliability" TIMEOUT 60)
  endif()
  if(TARGET test_shapes)
    add_test(NAME reliability_model_files_app COMMAND test_shapes "[model_files]")
    set_tests_properties(reliability_model_files_app PROPERTIES LABELS "torch;reliability" TIMEOUT 60)
  endif()
endfunction()
cmake_language(DEFER CALL branchgrpo_model_files_torch_tests)

# The tool on those files: one line naming the file (and the tensor), a non-zero exit, within seconds, under a 3 GB
# address-space limit (the 2^17 + 1 tensors would have been parsed into gigabytes before the limit existed).
if(TARGET branchgrpo_cli AND TARGET test_model_files)
  set(expect_error ${CMAKE_CURRENT_SOURCE_DIR}/reliability/scripts/expect_error.sh)
  function(model_file_test name regex)
    add_test(NAME reliability_model_file_${name}
             COMMAND sh ${expect_error} -v 3000000 -t 20 "${regex}" $<TARGET_FILE:branchgrpo_cli> ${ARGN})
    set_tests_properties(reliability_model_file_${name} PROPERTIES LABELS "cli;reliability" TIMEOUT 30
                                                                   FIXTURES_REQUIRED model_files)
  endfunction()
  model_file_test(huge_count "huge_count\\.safetensors: header lists more than 131072 tensors, the most a file may hold$"
                  weights ${model_files_dir}/huge_count.safetensors)
  if(TARGET branchgrpo::app)
    # `compare --model shapes` trained the I32 model (gradient norm 0) before dtypes were checked.
    set(compare compare --model shapes --seeds 2 --iters 1 --quiet --out ${model_files_dir}/out --model-dir)
    model_file_test(i32 "i32/model\\.safetensors: tensor 'img_in\\.weight' is I32: model weights must be F32, BF16, F16 or F8_E4M3$"
                    ${compare} ${model_files_dir}/i32)
    model_file_test(nan "nan/model\\.safetensors: tensor 'img_in\\.weight' holds a non-finite value \\(nan\\) at element 5$"
                    ${compare} ${model_files_dir}/nan)
    model_file_test(both_families "both/model\\.safetensors: __metadata__ holds both 'branchgrpo\\.flux_config' and 'branchgrpo\\.wan_config'; a model file declares one family$"
                    ${compare} ${model_files_dir}/both)
  endif()
endif()
