# --- Write errors (label reliability): every output of tree, weights, toy, bench, pretrain and demo to a full disk
# (/dev/full, reached as standard output or through a symlink where a file is written) ends the command with a
# non-zero exit and one line naming the path, or "standard output", and "No space left on device"
# (tools/cli/output/output_file.hpp). tests/reliability/scripts/expect_error.sh runs each command.
if(TARGET branchgrpo_cli AND EXISTS /dev/full)
  set(outputs_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_outputs)
  set(expect_error ${CMAKE_CURRENT_SOURCE_DIR}/reliability/scripts/expect_error.sh)
  set(tool $<TARGET_FILE:branchgrpo_cli>)
  set(full "No space left on device")
  # Passes when `branchgrpo ARGN` fails with one stderr line matching `regex`; STDOUT sends stdout there.
  function(output_error_test name regex)
    cmake_parse_arguments(PARSE_ARGV 2 test "" "STDOUT" "ARGS")
    set(redirect)
    if(DEFINED test_STDOUT)
      set(redirect -o ${test_STDOUT})
    endif()
    add_test(NAME reliability_output_${name} COMMAND sh ${expect_error} ${redirect} "${regex}" ${tool} ${test_ARGS})
    set_tests_properties(reliability_output_${name} PROPERTIES LABELS "cli;reliability" TIMEOUT 30)
  endfunction()

  # Each output directory holds a symlink to /dev/full where the command writes a file.
  add_test(NAME reliability_outputs_setup
           COMMAND sh -c "rm -rf '${outputs_dir}' && mkdir -p '${outputs_dir}/toy_csv' '${outputs_dir}/toy_png' '${outputs_dir}/pretrain' '${outputs_dir}/demo' && ln -s /dev/full '${outputs_dir}/toy_csv/toy_dance.csv' && ln -s /dev/full '${outputs_dir}/toy_png/samples_before_after.png' && ln -s /dev/full '${outputs_dir}/pretrain/pretrain.json' && ln -s /dev/full '${outputs_dir}/demo/demo.csv'")
  set_tests_properties(reliability_outputs_setup PROPERTIES FIXTURES_SETUP cli_outputs LABELS "cli;reliability")

  output_error_test(tree_table "^branchgrpo: standard output: cannot write: ${full}$" STDOUT /dev/full ARGS tree)
  output_error_test(tree_json "^branchgrpo: standard output: cannot write: ${full}$" STDOUT /dev/full
                    ARGS tree --json)
  output_error_test(policies "^branchgrpo: standard output: cannot write: ${full}$" STDOUT /dev/full ARGS policies)
  output_error_test(weights_json "^branchgrpo: standard output: cannot write: ${full}$" STDOUT /dev/full
                    ARGS weights ${CMAKE_CURRENT_BINARY_DIR}/weights/tiny_bfl.safetensors --json)
  set_tests_properties(reliability_output_weights_json PROPERTIES FIXTURES_REQUIRED weights_files)
  # toy --json streams a line per iteration and stops at the first that fails (10000 iterations would take
  # minutes: the timeout catches a run that goes on).
  output_error_test(toy_json "^branchgrpo: standard output: cannot write: ${full}$" STDOUT /dev/full
                    ARGS toy --method dance --iters 10000 --prompts 1 --json --quiet --out ${outputs_dir}/toy_json)
  output_error_test(toy_csv "toy_csv/toy_dance.csv: cannot write: ${full}$" STDOUT /dev/null
                    ARGS toy --method dance --iters 1 --prompts 1 --quiet --out ${outputs_dir}/toy_csv)
  output_error_test(toy_png "toy_png/samples_before_after.png: cannot write: ${full}$" STDOUT /dev/null
                    ARGS toy --method dance --iters 1 --prompts 1 --quiet --out ${outputs_dir}/toy_png)
  set_tests_properties(reliability_output_toy_csv reliability_output_toy_png PROPERTIES FIXTURES_REQUIRED cli_outputs)
  output_error_test(bench_json_file "^branchgrpo: /dev/full: cannot write: ${full}$"
                    ARGS bench iteration --iters 1 --warmup 0 --prompts 1 --batching-repeats 1 --methods dance
                         --json-file /dev/full)
  # A --json-file that cannot be written is refused before the run, and no file is left behind.
  output_error_test(bench_json_file_missing_dir "nowhere/bench.json: cannot write: No such file or directory$"
                    ARGS bench iteration --iters 1000 --json-file ${outputs_dir}/nowhere/bench.json)
  if(TARGET branchgrpo::app)
    output_error_test(pretrain_json "pretrain/pretrain.json: cannot write: ${full}$"
                      ARGS pretrain --out ${outputs_dir}/pretrain --steps 1 --batch 1 --grid-samples 1 --quiet)
    set_tests_properties(reliability_output_pretrain_json PROPERTIES FIXTURES_REQUIRED cli_outputs
                                                                     LABELS "cli;reliability;torch")
    output_error_test(pretrain_stdout "^branchgrpo: standard output: cannot write: ${full}$" STDOUT /dev/full
                      ARGS pretrain --out ${outputs_dir}/pretrain_stdout --steps 1 --batch 1 --grid-samples 1 --quiet)
    set_tests_properties(reliability_output_pretrain_stdout PROPERTIES LABELS "cli;reliability;torch")
    if(EXISTS ${PROJECT_SOURCE_DIR}/models/shapes-tiny/model.safetensors)
      output_error_test(demo_csv "demo/demo.csv: cannot write: ${full}$" STDOUT /dev/null
                        ARGS demo --quick --quiet --methods dance --steps 4 --prompts 1 --iters 1
                             --model ${PROJECT_SOURCE_DIR}/models/shapes-tiny --out ${outputs_dir}/demo)
      set_tests_properties(reliability_output_demo_csv PROPERTIES FIXTURES_REQUIRED cli_outputs
                                                                  LABELS "cli;reliability;torch")
    endif()
  endif()
endif()
# An output directory that exists but takes no file (sysfs refuses new files, root included) is refused before any
# work, exit 2, naming it: `compare` found it only when writing runs.csv after every run; toy and pretrain share the
# check (make_directory, tools/cli/output/output_file.hpp).
if(TARGET branchgrpo_cli AND IS_DIRECTORY /sys)
  set(expect_error ${CMAKE_CURRENT_SOURCE_DIR}/reliability/scripts/expect_error.sh)
  foreach(command IN ITEMS compare toy)
    set(args ${command} --iters 100000 --out /sys)
    if(command STREQUAL "compare")
      list(APPEND args --seeds 2)
    endif()
    add_test(NAME reliability_output_${command}_unwritable_dir
             COMMAND sh ${expect_error} -t 20 -s 2 "^branchgrpo: /sys: cannot write in the directory: .+$"
                     $<TARGET_FILE:branchgrpo_cli> ${args})
    set_tests_properties(reliability_output_${command}_unwritable_dir PROPERTIES LABELS "cli;reliability" TIMEOUT 30)
  endforeach()
endif()
