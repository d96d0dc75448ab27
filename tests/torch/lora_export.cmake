# `branchgrpo export-lora` (docs/cli.md): the checkpoints test_lora_export writes (tiny FLUX, Wan, SD3 and Wan2.2 runs
# with trained-looking adapters, one without EMA, one of full fine-tuning) exported in every format (Wan2.2: a file
# per expert), the exported keys checked against diffusers' own module names and shapes
# (tests/torch/lora_export_diffusers_modules.txt, written by scripts/check_lora_export.py from diffusers' tiny models;
# the check itself needs only Python's standard library), and each refused input: one stderr line, exit status 2.
# The numerical check against diffusers needs PyTorch 2 (scripts/check_lora_export.py, not in CI).
if(TARGET branchgrpo_cli AND TARGET test_lora_export)
  set(lora_dir ${CMAKE_CURRENT_BINARY_DIR}/lora_export)
  set(expect_error ${CMAKE_CURRENT_SOURCE_DIR}/reliability/scripts/expect_error.sh)
  function(export_lora_error_test name regex)
    add_test(NAME cli_error_export_lora_${name}
             COMMAND sh ${expect_error} -s 2 "^branchgrpo: export-lora: ${regex}" $<TARGET_FILE:branchgrpo_cli>
                     export-lora ${ARGN})
    set_tests_properties(cli_error_export_lora_${name} PROPERTIES LABELS "cli;torch" TIMEOUT 60
                                                                  FIXTURES_REQUIRED lora_export_files)
  endfunction()
  export_lora_error_test(wan_kohya "--format kohya: Wan models export as diffusers or comfyui$"
                         ${lora_dir}/wan/iter-000002 --format kohya --output ${lora_dir}/never.safetensors)
  export_lora_error_test(wan22_kohya "--format kohya: Wan2.2 models export as diffusers or comfyui$"
                         ${lora_dir}/wan22/iter-000002 --format kohya --output ${lora_dir}/never.safetensors)
  export_lora_error_test(no_ema "--ema: .*flux_no_ema/iter-000001 has no EMA weights \\(no ema\\.\\* tensors"
                         ${lora_dir}/flux_no_ema/iter-000001 --ema --format diffusers
                         --output ${lora_dir}/never.safetensors)
  export_lora_error_test(full_fine_tuning ".*flux_full/iter-000001 is a full fine-tuning checkpoint \\(no lora_A"
                         ${lora_dir}/flux_full/iter-000001 --format diffusers --output ${lora_dir}/never.safetensors)
  export_lora_error_test(dtype "--dtype f8: expected bf16, fp16 or fp32$" ${lora_dir}/flux/iter-000002
                         --format diffusers --dtype f8 --output ${lora_dir}/never.safetensors)
  export_lora_error_test(format "--format peft: unknown format \\(expected diffusers, kohya or comfyui\\)$"
                         ${lora_dir}/flux/iter-000002 --format peft --output ${lora_dir}/never.safetensors)
  export_lora_error_test(merge_format "--merge writes the whole transformer in its own layout"
                         ${lora_dir}/flux/iter-000002 --merge --format diffusers --output ${lora_dir}/never.safetensors)
  export_lora_error_test(no_format "--format is required" ${lora_dir}/flux/iter-000002
                         --output ${lora_dir}/never.safetensors)

  # Every format of every family in one test (one process per export, ~1 s each), then the keys against diffusers'.
  add_test(NAME cli_export_lora_keys
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/torch/export_lora_all.sh $<TARGET_FILE:branchgrpo_cli> ${lora_dir}
                   ${CMAKE_CURRENT_SOURCE_DIR}/torch/lora_export_diffusers_modules.txt
                   ${PROJECT_SOURCE_DIR}/scripts/check_lora_export.py)
  set_tests_properties(cli_export_lora_keys PROPERTIES LABELS "cli;torch" TIMEOUT 120
                                                       FIXTURES_REQUIRED lora_export_files)
endif()
