# --- Sizes and numbers (label reliability): every size flag of tree, toy, bench, pretrain and demo is checked
# against a hard limit or the memory it implies before anything is built, under a low address-space limit
# (ulimit -v), within seconds; numbers the flag's type cannot hold ("--seed -1", 300 digits, "1e999") and empty
# lists are refused with one line naming the flag (tools/cli/options/number_options.hpp, tools/cli/options/memory_budget.hpp).
if(TARGET branchgrpo_cli)
  set(expect_error ${CMAKE_CURRENT_SOURCE_DIR}/reliability/scripts/expect_error.sh)
  set(tool $<TARGET_FILE:branchgrpo_cli>)
  set(limits_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_limits)
  # 3 GB of address space: room for the tool and LibTorch's libraries, far below what the sizes imply.
  set(address_space_kb 3000000)
  set(under_limit "\\(limit: address-space limit \\(ulimit -v\\) 3\\.07 GB\\)$")
  # Passes when `branchgrpo ARGN` fails, under `ulimit -v`, with one stderr line matching `regex` and nothing on
  # stdout, within the test's 30 s.
  function(limit_test name regex)
    set(command $<TARGET_FILE:branchgrpo_cli> ${ARGN})
    if(ARGV2 STREQUAL "sh")  # a shell command line, given whole
      set(command ${ARGN})
    endif()
    add_test(NAME reliability_limit_${name} COMMAND sh ${expect_error} -v ${address_space_kb} "${regex}" ${command})
    set_tests_properties(reliability_limit_${name} PROPERTIES LABELS "cli;reliability" TIMEOUT 30)
  endfunction()

  # Memory estimates.
  limit_test(toy_prompts "^branchgrpo: --prompts = 2000000000: the rollout of [0-9]+-node trees needs about [0-9.]+ [TP]B ${under_limit}"
             toy --prompts 2000000000 --out ${limits_dir}/toy)
  limit_test(toy_compare_prompts "^branchgrpo: --prompts = 100000000: the rollout of [0-9]+-node trees needs about"
             toy --compare --prompts 100000000 --out ${limits_dir}/toy)
  limit_test(bench_prompts "^branchgrpo: --prompts = 2000000000: the rollout of [0-9]+-node trees needs about .*${under_limit}"
             bench iteration --prompts 2000000000)
  # Hard limits.
  limit_test(toy_iters "^branchgrpo: --iters = 2000000000: must be an integer in \\[1, 1048575\\]$"
             toy --iters 2000000000)
  limit_test(toy_steps "^branchgrpo: --steps = 100000: must be an integer in \\[1, 255\\]$" toy --steps 100000)
  limit_test(bench_iters "^branchgrpo: --iters = 2000000000: must be an integer in \\[1, 500000\\]$"
             bench iteration --iters 2000000000)
  limit_test(bench_batching_repeats "^branchgrpo: --batching-repeats = 2000000000: must be an integer in \\[1, 10000\\]$"
             bench iteration --batching-repeats 2000000000)
  limit_test(bench_height "^branchgrpo: --height = 1000000: must be an integer in \\[8, 32768\\]$"
             bench iteration --model flux --height 1000000)
  limit_test(bench_latent "^branchgrpo: --latent\\[1\\] = 100000: must be an integer in \\[1, 4096\\]$"
             bench iteration --model flux --latent 4,100000,8)
  # tree: the core refuses more than 2^24 leaves; at the limit it prints the plan without a per-leaf allocation.
  limit_test(tree_leaves "exceeds 2\\^24 leaves" tree --branching 4097 --split-steps 0,1)
  add_test(NAME reliability_limit_tree_most_leaves
           COMMAND sh -c "ulimit -v ${address_space_kb}; '$<TARGET_FILE:branchgrpo_cli>' tree --branching 4096 --split-steps 0,1 --json")
  set_tests_properties(reliability_limit_tree_most_leaves PROPERTIES LABELS "cli;reliability" TIMEOUT 30
                       PASS_REGULAR_EXPRESSION [=["leaves":16777216[,}]]=])

  # Numbers the type cannot hold, and empty lists.
  limit_test(toy_seed_negative "^branchgrpo: --seed = -1: must be an integer in \\[0, 18446744073709551615\\]$"
             toy --seed -1)
  string(REPEAT 9 300 digits300)
  limit_test(toy_prompts_300_digits "^branchgrpo: --prompts = 9{29}\\.\\.\\.: must be an integer in \\[1, 2147483647\\]$"
             toy --prompts ${digits300})
  limit_test(bench_seed_300_digits "^branchgrpo: --seed = 9{29}\\.\\.\\.: must be an integer in \\[0, 18446744073709551615\\]$"
             bench iteration --seed ${digits300})
  limit_test(toy_hex "^branchgrpo: --max-batch = 0x10: must be an integer in \\[1, 9223372036854775807\\]$"
             toy --max-batch 0x10)
  limit_test(tree_steps_exponent "^branchgrpo: --steps = 1e3: must be an integer in \\[-2147483648, 2147483647\\]$"
             tree --steps 1e3)
  limit_test(tree_shift_overflow "^branchgrpo: --shift = 1e999: must be a finite number$" tree --shift 1e999)
  limit_test(tree_sigmas_nan "^branchgrpo: --sigmas\\[1\\] = nan: must be a finite number$" tree --steps 2
             --split-steps 0 --sigmas 1,nan,0)
  # An empty argument goes through sh: CMake drops "" from a test's command line.
  limit_test(tree_split_steps_empty "^branchgrpo: --split-steps: the list is empty" sh -c "'${tool}' tree --split-steps ''")
  limit_test(tree_branching_empty_element "^branchgrpo: --branching: element 1 of the list is empty$" tree
             --branching 4,,2)
  limit_test(bench_methods_empty "^branchgrpo: --methods: the list is empty" sh -c "'${tool}' bench iteration --methods ''")

  if(TARGET branchgrpo::app)
    limit_test(pretrain_batch "^branchgrpo: --batch = 2000000000: a training step needs about [0-9.]+ [TP]B ${under_limit}"
               pretrain --out ${limits_dir}/pretrain --batch 2000000000)
    limit_test(pretrain_threads "^branchgrpo: --threads = 100000: must be an integer in \\[0, [0-9]+\\]$"
               pretrain --out ${limits_dir}/pretrain --threads 100000)
    limit_test(pretrain_grid_samples "^branchgrpo: --grid-samples = 100000: must be an integer in \\[1, 4096\\]$"
               pretrain --out ${limits_dir}/pretrain --grid-samples 100000)
    limit_test(pretrain_config_width "^branchgrpo: --config-json = .*: the model and its optimizer state needs about"
               pretrain --out ${limits_dir}/pretrain --config-json [=[{"hidden": 16384, "heads": 128, "rope_axes": [32, 48, 48]}]=])
    limit_test(pretrain_config_unsigned "^branchgrpo: --config-json 'hidden' = 18446744073709551615: must be an integer in"
               pretrain --out ${limits_dir}/pretrain --config-json [=[{"hidden": 18446744073709551615}]=])
    limit_test(pretrain_lr_overflow "^branchgrpo: --lr = 1e999: must be a finite number$"
               pretrain --out ${limits_dir}/pretrain --lr 1e999)
    limit_test(demo_prompts "^branchgrpo: --prompts = 2000000000: the rollout of [0-9]+-node trees needs about .*${under_limit}"
               demo --prompts 2000000000 --out ${limits_dir}/demo)
    limit_test(demo_eval_samples "^branchgrpo: --eval-samples = 2000000000: the held-out evaluation needs about .*${under_limit}"
               demo --eval-samples 2000000000 --out ${limits_dir}/demo)
    limit_test(demo_seed_negative "^branchgrpo: --seed = -1: must be an integer in \\[0, 18446744073709551615\\]$"
               demo --seed -1)
    limit_test(demo_methods_empty "^branchgrpo: --methods: the list is empty" sh -c "'${tool}' demo --methods ''")
    set_tests_properties(reliability_limit_pretrain_batch reliability_limit_pretrain_threads
                         reliability_limit_pretrain_grid_samples reliability_limit_pretrain_config_width
                         reliability_limit_pretrain_config_unsigned reliability_limit_pretrain_lr_overflow
                         reliability_limit_demo_prompts reliability_limit_demo_eval_samples
                         reliability_limit_demo_seed_negative reliability_limit_demo_methods_empty
                         PROPERTIES LABELS "cli;reliability;torch")
  endif()
endif()

# A training run's memory (app/run_memory.hpp): branching 4096 at two split steps is 2^24 leaves per tree; `train`
# refuses it from the config and the model's headers, before loading anything, naming the keys.
if(TARGET branchgrpo_cli AND TARGET branchgrpo::app)
  set(huge_tree_config ${CMAKE_CURRENT_BINARY_DIR}/cli_limits/huge_tree.toml)
  file(WRITE ${huge_tree_config} "[model]\ndir = \"${PROJECT_SOURCE_DIR}/models/shapes-tiny\"\n[topology]\nsplit_steps = [0, 1]\nbranching = [4096]\n[run]\noutput_dir = \"${CMAKE_CURRENT_BINARY_DIR}/cli_limits/huge_tree\"\n")
  limit_test(train_tree "^branchgrpo: .*huge_tree.toml: the run needs about 1.96 TB, over the memory budget of 3.07 GB \\(address-space limit \\(ulimit -v\\)\\): rollout latents 1.96 TB \\(data.prompts_per_iteration = 2 trees of 318771201 nodes"
             train --config ${huge_tree_config})
  set_tests_properties(reliability_limit_train_tree PROPERTIES LABELS "cli;torch;reliability")
endif()

# `demo --quick` keeps an explicit --eval-samples (docs/cli.md, "branchgrpo demo"): before, --quick replaced it by 1
# silently, so this size passed its memory check and the demo ran with 1 sample per prompt.
if(TARGET branchgrpo_cli AND TARGET branchgrpo::app)
  limit_test(demo_quick_eval_samples "^branchgrpo: --eval-samples = 2000000000: the held-out evaluation needs about .*${under_limit}"
             demo --quick --eval-samples 2000000000 --out ${limits_dir}/demo_quick)
  set_tests_properties(reliability_limit_demo_quick_eval_samples PROPERTIES LABELS "cli;reliability;torch")
endif()
