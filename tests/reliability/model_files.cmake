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

# --- Messages that name the key and the file (docs/reliability.md, "Keys and files in messages") ----------------
# A run config naming a file of the other model family or of another prompt table, a prompt holding a NUL byte
# (echoed escaped: the line went on past the NUL only as "\x00"), a prompt set that repeats a prompt (a warning
# naming the rows, before the error that ends the command cheaply), a latent too small for a reward: each refused
# before the run with exit status 2 and one line naming the key and the file.
if(TARGET branchgrpo_cli AND TARGET branchgrpo::app AND TARGET test_model_files
   AND EXISTS ${PROJECT_SOURCE_DIR}/models/moving-shapes-tiny/model.safetensors)
  set(models ${PROJECT_SOURCE_DIR}/models)
  set(keys_dir ${model_files_dir}/keys)
  # ${keys_dir}/NAME.toml: TEXT and a [run] section of its own.
  function(key_config name text)
    file(WRITE ${keys_dir}/${name}.toml "${text}[run]\noutput_dir = \"${keys_dir}/out_${name}\"\n")
  endfunction()
  # `branchgrpo train --config ${keys_dir}/NAME.toml` exits 2 with one line matching REGEX (ARGN: expect_error.sh's
  # options before it, e.g. -w WARNING).
  function(key_test name regex)
    add_test(NAME reliability_key_${name}
             COMMAND sh ${expect_error} -v 3000000 -t 20 -s 2 ${ARGN} "${regex}" $<TARGET_FILE:branchgrpo_cli> train
                     --config ${keys_dir}/${name}.toml)
    set_tests_properties(reliability_key_${name} PROPERTIES LABELS "cli;reliability;torch" TIMEOUT 30
                                                            FIXTURES_REQUIRED model_files)
  endfunction()
  set(shapes_dir "[model]\ndir = \"${models}/shapes-tiny\"\n")
  set(video_dir "[model]\ndir = \"${models}/moving-shapes-tiny\"\n")

  # eval.embeddings of the other family's model: both pass the model's width checks; their text lengths (3 and 5
  # tokens) cannot share one prompt table ("prompt rows of 5 x 32 features appended to a table of 3 x 32" before).
  key_config(eval_family "${shapes_dir}[eval]\nembeddings = \"${models}/moving-shapes-tiny/prompts.safetensors\"\n")
  key_test(eval_family "^branchgrpo: .*/eval_family\\.toml: eval\\.embeddings = \".*/moving-shapes-tiny/prompts\\.safetensors\": prompts of 5 tokens x 32 features \\(pooled 32\\); the training prompts \\(.*/shapes-tiny/prompts\\.safetensors\\) are 3 tokens x 32 features \\(pooled 32\\): ")
  key_config(eval_family_video "${video_dir}[eval]\nembeddings = \"${models}/shapes-tiny/prompts.safetensors\"\n")
  key_test(eval_family_video "^branchgrpo: .*/eval_family_video\\.toml: eval\\.embeddings = \".*/shapes-tiny/prompts\\.safetensors\": prompts of 3 tokens x 32 features \\(pooled 32\\); the training prompts \\(.*/moving-shapes-tiny/prompts\\.safetensors\\) are 5 tokens")

  # model.weights of the other family under a named config (a 407-byte list of missing tensors, or "cannot tell the
  # FLUX layout of a checkpoint of N tensors", naming no file, before); of this family but another size.
  set(latent "latent_height = 8\nlatent_width = 8\n")
  key_config(wan_weights_flux_config "[model]\ndir = \"\"\nconfig = \"tiny\"\nweights = \"${models}/moving-shapes-tiny/model.safetensors\"\n${latent}[data]\nembeddings = \"${models}/shapes-tiny/prompts.safetensors\"\n")
  key_test(wan_weights_flux_config "^branchgrpo: .*/wan_weights_flux_config\\.toml: model\\.weights = \".*/moving-shapes-tiny/model\\.safetensors\": holds Wan weights \\(all [0-9]+ tensors have Wan names\\); model\\.config = \"tiny\" is a FLUX model \\(give a FLUX checkpoint, or a Wan config: wan-tiny, wan-t2v-1\\.3b or wan-t2v-14b\\)$")
  key_config(flux_weights_wan_config "[model]\ndir = \"\"\nconfig = \"wan-tiny\"\nweights = \"${models}/shapes-tiny/model.safetensors\"\n${latent}latent_frames = 2\n[data]\nembeddings = \"${models}/moving-shapes-tiny/prompts.safetensors\"\n")
  key_test(flux_weights_wan_config "^branchgrpo: .*/flux_weights_wan_config\\.toml: model\\.weights = \".*/shapes-tiny/model\\.safetensors\": holds FLUX weights \\(all [0-9]+ tensors have FLUX names\\); model\\.config = \"wan-tiny\" is a Wan model")
  key_config(flux_weights_other_size "[model]\ndir = \"\"\nconfig = \"tiny\"\nweights = \"${models}/shapes-tiny/model.safetensors\"\n${latent}[data]\nembeddings = \"${models}/shapes-tiny/prompts.safetensors\"\n")
  key_test(flux_weights_other_size "^branchgrpo: .*/flux_weights_other_size\\.toml: model\\.weights = \".*/shapes-tiny/model\\.safetensors\": does not fit model\\.config = \"tiny\": FLUX checkpoint \\(bfl layout\\) does not match the config: ")

  # A prompt holding a NUL byte: the whole prompt, the NUL escaped (the line ended at the NUL before).
  key_config(nul_prompt "${shapes_dir}[data]\nembeddings = \"${model_files_dir}/nul_prompt.safetensors\"\n")
  key_test(nul_prompt "^branchgrpo: .*/nul_prompt\\.toml: rewards\\[0\\]\\.name = 'alignment': prompt 2: prompt 'a red\\\\x00circle' names no colour \\(red, green, blue, yellow\\)$")

  # A repeated prompt: one warning line naming the file and the rows (accepted silently before); then an image
  # model's video reward ends the command before any work.
  key_config(repeated_prompts "${shapes_dir}[data]\nembeddings = \"${model_files_dir}/repeated_prompts.safetensors\"\n[[rewards]]\nname = \"smoothness\"\n")
  key_test(repeated_prompts "rewards\\[0\\]\\.name = 'smoothness' scores videos; the model makes images$"
           -w "^warning: .*/repeated_prompts\\.safetensors: rows 3 and 7 hold the same prompt 'a green circle'$")

  # A latent smaller than a reward reads (alignment: 3 x 3 pixels), with model.decoder = "pixels": refused before
  # the run naming the entry and the keys ("measure_shape expects [3, H, W] with H, W >= 3" in the first iteration
  # before).
  key_config(reward_size "${shapes_dir}latent_height = 2\nlatent_width = 2\n")
  key_test(reward_size "^branchgrpo: .*/reward_size\\.toml: rewards\\[0\\] \\(alignment\\) scores images of at least 3 x 3 pixels; model\\.latent_height = 2 and model\\.latent_width = 2 make 2 x 2 \\(model\\.decoder = \"pixels\": the latents are the images\\)$")
  key_config(reward_size_video "${video_dir}latent_height = 2\nlatent_width = 16\n")
  key_test(reward_size_video "^branchgrpo: .*/reward_size_video\\.toml: rewards\\[0\\] \\(alignment\\) scores frames of at least 3 x 3 pixels; model\\.latent_height = 2 and model\\.latent_width = 16 make 2 x 16 ")
endif()
