# --- Round 2 of the hostile inputs (label reliability; docs/reliability.md): numbers that skipped the one number
# path, empty list flags, echoes cut, --help to a full device. Each is one command that must fail with one stderr
# line (tests/reliability/scripts/expect_error.sh) within seconds. What train reads from its run directory (FIFOs,
# huge files, link loops, ulimit -f) is train_reliability.sh's mode `files` (checkpoints.cmake).
if(TARGET branchgrpo_cli)
  set(expect_error ${CMAKE_CURRENT_SOURCE_DIR}/reliability/scripts/expect_error.sh)
  # Passes when `branchgrpo ARGN` fails with one stderr line matching `regex`, nothing on stdout, within 30 s.
  function(input_test name regex)
    add_test(NAME reliability_input_${name} COMMAND sh ${expect_error} "${regex}" $<TARGET_FILE:branchgrpo_cli> ${ARGN})
    set_tests_properties(reliability_input_${name} PROPERTIES LABELS "cli;reliability" TIMEOUT 30)
  endfunction()

  if(TARGET branchgrpo::app)
    # `sample`'s numbers went through CLI11's own conversion: hex, spaces and "" were read, -1 and 2^64 saturated.
    set(sample_args sample --config none.toml --checkpoint none)
    set(seed_range "must be an integer in \\[0, 18446744073709551615\\]$")
    input_test(sample_seed_hex "^branchgrpo: --seed = 0x10: ${seed_range}" ${sample_args} --seed 0x10)
    input_test(sample_seed_space "^branchgrpo: --seed =  5: ${seed_range}" ${sample_args} --seed " 5")
    # An empty argument, which CMake would drop from a test's command: through a shell, the tool as $0.
    function(input_test_sh name regex script)
      add_test(NAME reliability_input_${name}
               COMMAND sh ${expect_error} "${regex}" sh -c "${script}" $<TARGET_FILE:branchgrpo_cli>)
      set_tests_properties(reliability_input_${name} PROPERTIES LABELS "cli;reliability" TIMEOUT 30)
    endfunction()
    input_test_sh(sample_seed_empty "^branchgrpo: --seed = : ${seed_range}"
                  "exec \"$0\" sample --config none.toml --checkpoint none --seed ''")
    input_test(sample_seed_negative "^branchgrpo: --seed = -1: ${seed_range}" ${sample_args} --seed -1)
    input_test(sample_seed_overflow "^branchgrpo: --seed = 18446744073709551616: ${seed_range}" ${sample_args}
               --seed 18446744073709551616)
    input_test(sample_samples_hex "^branchgrpo: --samples = 0x10: must be an integer in \\[1, 4096\\]$" ${sample_args}
               --samples 0x10)
    # An empty list flag is an error, never the default.
    input_test_sh(sample_prompts_empty "^branchgrpo: --prompts: the list is empty"
                  "exec \"$0\" sample --config none.toml --checkpoint none --prompts ''")
    input_test_sh(demo_prompt_rows_empty "^branchgrpo: --prompt-rows: the list is empty"
                  "exec \"$0\" demo --prompt-rows ''")
    # A learning rate of 5e-324 is refused with its range, not met as a NaN later.
    input_test(demo_lr_tiny "^branchgrpo: --lr = 5e-324: must be a number in \\[1e-12, 1\\]$" demo --lr 5e-324)
    # A 5,000-character config path is echoed cut: the line stays short.
    string(REPEAT "d" 5000 long_name)
    input_test(train_long_path "^branchgrpo: /dddd.{140,170}dddd/run.toml: cannot open the config file: File name too long$"
               train --config /${long_name}/run.toml)
  endif()
  # Any message, whatever its origin (here CLI11's, echoing a 100 kB value), is one line of at most 1000 characters
  # after the prefix.
  string(REPEAT "x" 100000 huge_value)
  input_test(cli11_echo_cut "^branchgrpo: .{900,1000}$" toy --method ${huge_value})
  # --help succeeds only when the usage was written.
  if(EXISTS /dev/full)
    add_test(NAME reliability_input_help_full
             COMMAND sh ${expect_error} -o /dev/full
                     "^branchgrpo: standard output: cannot write: No space left on device$"
                     $<TARGET_FILE:branchgrpo_cli> --help)
    set_tests_properties(reliability_input_help_full PROPERTIES LABELS "cli;reliability" TIMEOUT 30)
  endif()
endif()
# --- Flags named as flags (label reliability): Flow-GRPO-Fast's sizes are checked as the tree's flags, not as the
# core's fields ("sde_steps 0 from split step 0 runs past 20 steps" before, naming neither the flag nor the reason).
# --split-step past --steps and --sequential 0: cli_error_fast_split_past_steps and cli_error_group_zero
# (tests/packaging.cmake).
if(TARGET branchgrpo_cli)
  set(expect_error ${CMAKE_CURRENT_SOURCE_DIR}/reliability/scripts/expect_error.sh)
  function(flag_test name regex)
    add_test(NAME reliability_flag_${name}
             COMMAND sh ${expect_error} -s 2 "${regex}" $<TARGET_FILE:branchgrpo_cli> ${ARGN})
    set_tests_properties(reliability_flag_${name} PROPERTIES LABELS "cli;reliability" TIMEOUT 30)
  endfunction()
  flag_test(tree_sde_steps_zero "^branchgrpo: --sde-steps = 0: must be an integer in \\[1, 255\\]$"
            tree --flow-grpo-fast 4 --split-step 0 --sde-steps 0)
  flag_test(tree_sde_steps_past "^branchgrpo: --sde-steps = 5: from --split-step = 18 it runs past --steps = 20 \\(at most 2 SDE steps from step 18\\)$"
            tree --flow-grpo-fast 4 --split-step 18 --sde-steps 5)
  flag_test(tree_fast_group_zero "^branchgrpo: --flow-grpo-fast = 0: must be an integer in \\[1, 2147483647\\]$"
            tree --flow-grpo-fast 0 --split-step 0)
endif()
