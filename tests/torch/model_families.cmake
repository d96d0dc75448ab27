# The third and fourth model families through their registry entries alone (docs/extending.md, "A model family"):
# SD3 (model.config = "sd3-tiny") and Wan2.2 (model.config = "wan22-tiny"), random init from run.seed, on the
# shipped models' prompt files (no family metadata; 32-wide features, which the tiny configs read). Per family:
# `train` one iteration with a checkpoint, `sample` from it, and `bench iteration --model <family>-tiny`. The LoRA
# exports of both are checked with FLUX's and Wan's (lora_export.cmake), the forwards against diffusers in
# test_sd3 / test_sd3_vae / test_wan22.
if(TARGET branchgrpo_cli AND TARGET branchgrpo::app)
  set(families_dir ${CMAKE_CURRENT_BINARY_DIR}/model_families)
  set(models ${PROJECT_SOURCE_DIR}/models)
  set(family_common "[topology]\nsplit_steps = [0, 2]\n[rollout]\nsteps = 4\n")
  string(APPEND family_common "[optimizer]\nlr = 1e-3\n[lora]\nrank = 4\nalpha = 4.0\n")
  string(APPEND family_common "[run]\niterations = 1\ncheckpoint_every = 1\n")
  file(CONFIGURE OUTPUT ${families_dir}/sd3.toml CONTENT
       "[model]\ndir = \"\"\nconfig = \"sd3-tiny\"\nlatent_height = 8\nlatent_width = 8\n\
[data]\nembeddings = \"${models}/shapes-tiny/prompts.safetensors\"\nprompts_per_iteration = 2\n\
[[rewards]]\nname = \"jpeg_compressibility\"\n${family_common}output_dir = \"${families_dir}/sd3\"\n")
  file(CONFIGURE OUTPUT ${families_dir}/wan22.toml CONTENT
       "[model]\ndir = \"\"\nconfig = \"wan22-tiny\"\nlatent_frames = 2\nlatent_height = 8\nlatent_width = 8\n\
[data]\nembeddings = \"${models}/moving-shapes-tiny/prompts.safetensors\"\nprompts_per_iteration = 2\n\
[[rewards]]\nname = \"smoothness\"\n${family_common}output_dir = \"${families_dir}/wan22\"\n")
  set(sd3_prompt "a red circle")
  set(wan22_prompt "a red circle moving left")
  foreach(family IN ITEMS sd3 wan22)
    add_test(NAME cli_train_${family}
             COMMAND sh -c "rm -rf '${families_dir}/${family}' && \"$0\" train --config '${families_dir}/${family}.toml' --json --quiet"
                     $<TARGET_FILE:branchgrpo_cli>)
    set_tests_properties(cli_train_${family} PROPERTIES LABELS "cli;torch" TIMEOUT 600
                                                        FIXTURES_SETUP ${family}_run
                                                        PASS_REGULAR_EXPRESSION "\"edges_trained\":[1-9][0-9]*,.*\"iteration\":0,")
    add_test(NAME cli_sample_${family}
             COMMAND branchgrpo_cli sample --config ${families_dir}/${family}.toml --checkpoint
                     ${families_dir}/${family}/checkpoints/iter-000001 --prompts "${${family}_prompt}" --samples 2
                     --out ${families_dir}/${family}_grid.png)
    set_tests_properties(cli_sample_${family} PROPERTIES LABELS "cli;torch" TIMEOUT 600 FIXTURES_REQUIRED ${family}_run
                         PASS_REGULAR_EXPRESSION "${${family}_prompt} +reward [0-9.-]+\nweights: trained\nwrote ")
    # The dense tree's 203 evaluations against dance's 305, on the family's transformer (the times are not judged).
    set(bench_regex [=[^{"branch":{[^}]*"model":"]=])
    string(APPEND bench_regex "${family}-tiny" [=[",[^}]*"rollout_evaluations":203\.0,[^}]*},"dance":{[^}]*]=]
           [=["rollout_evaluations":305\.0]=])
    branchgrpo_cli_test(bench_${family}_tiny "${bench_regex}"
                        bench iteration --model ${family}-tiny --methods dance,branch --iters 1 --warmup 0 --prompts 1
                        --batching-repeats 1 --text-tokens 8 --json)
    set_tests_properties(cli_bench_${family}_tiny PROPERTIES LABELS "cli;torch;bench" TIMEOUT 300)
  endforeach()
endif()
