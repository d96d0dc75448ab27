# Packaging tests, include()d from tests/CMakeLists.txt:
#   - the branchgrpo tool's `tree` subcommand: expected counts, and one-line errors on invalid input;
#   - its `toy` subcommand: JSON lines, the compare object, the CSV and PNG files, dropped trees, errors;
#   - every public header (core and torch-free adapters) compiles on its own;
#   - the install holds every target's files, each target is consumed alone through it (find_package), and the
#     core through add_subdirectory.

# The report behind `branchgrpo tree` lives with the tool.
if(TARGET test_tree_report)
  target_include_directories(test_tree_report PRIVATE ${PROJECT_SOURCE_DIR}/tools)
endif()
# So do the PNG writer and plotter behind `branchgrpo toy`.
if(TARGET test_png)
  target_include_directories(test_png PRIVATE ${PROJECT_SOURCE_DIR}/tools)
endif()

# --- The command-line tool ------------------------------------------------------------------------------------
if(TARGET branchgrpo_cli)
  # Passes when the output matches `regex` (the tool prints a report only on success).
  function(branchgrpo_cli_test name regex)
    add_test(NAME cli_${name} COMMAND branchgrpo_cli ${ARGN})
    set_tests_properties(cli_${name} PROPERTIES PASS_REGULAR_EXPRESSION "${regex}" LABELS cli)
  endfunction()

  # Passes when the tool exits non-zero with one line on stderr matching `regex` (package/check_cli_error.cmake).
  function(branchgrpo_cli_error_test name regex)
    list(JOIN ARGN "|" arguments)
    add_test(NAME cli_error_${name}
             COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:branchgrpo_cli> "-DARGS=${arguments}"
                     "-DEXPECT=${regex}" -P ${CMAKE_CURRENT_SOURCE_DIR}/package/check_cli_error.cmake)
    set_tests_properties(cli_error_${name} PROPERTIES LABELS cli)
  endfunction()

  # nlohmann's compact dump sorts the keys: {"branching":[...],"edges":218,...,"evaluations":203,...}.
  branchgrpo_cli_test(dense_leaves [=["leaves":16[,}]]=] tree --json)
  branchgrpo_cli_test(dense_nodes [=["nodes":219[,}]]=] tree --json)
  branchgrpo_cli_test(dense_evaluations [=["evaluations":203[,}]]=] tree --json)
  branchgrpo_cli_test(dense_edges [=["edges":218[,}]]=] tree --json)
  branchgrpo_cli_test(dense_per_leaf [=["edges_per_leaf":13.625,"edges_per_step".*"evaluations_per_leaf":12.6875,]=]
                      tree --json)
  branchgrpo_cli_test(dense_nodes_per_depth [=["nodes_per_depth":\[1,2,2,2,4,4,4,8,8,8,16,16,]=] tree --json)
  branchgrpo_cli_test(dense_topology [=["topology":"split_schedule{.split_steps = {0, 3, 6, 9}, .branching = {2}}"]=]
                      tree --schedule dense --json)
  branchgrpo_cli_test(dense_table "evaluations +203\n" tree)
  branchgrpo_cli_test(sequential_evaluations [=["evaluations":305[,}]]=] tree --sequential 16 --json)
  branchgrpo_cli_test(sequential_separate_roots [=["evaluations":320[,}]]=] tree --sequential 16 --shared-root false
                      --json)
  branchgrpo_cli_test(branching3_leaves [=["leaves":81[,}]]=] tree --branching 3 --json)
  branchgrpo_cli_test(branching_per_split [=["leaves":16[,}]]=] tree --branching 4,2,2,1 --json)  # 4*2*2*1
  branchgrpo_cli_test(mixed_evaluations [=["evaluations":169[,}]]=] tree --schedule mixed --json)
  branchgrpo_cli_test(sparse_evaluations [=["evaluations":135[,}]]=] tree --schedule sparse --json)
  branchgrpo_cli_test(flow_grpo_fast [=["evaluations":11,.*"ode_edges":6,.*"sde_edges":8,]=] tree --steps 5
                      --flow-grpo-fast 4 --split-step 2 --sde-steps 2 --json)
  branchgrpo_cli_test(user_sigmas [=["sigmas":\[1.0,0.5,0.0\]]=] tree --steps 2 --split-steps 0 --sigmas 1,0.5,0
                      --json)
  branchgrpo_cli_test(help "--split-steps" tree --help)

  branchgrpo_cli_error_test(split_step_past_steps "split step 20 is not in" tree --split-steps 0,3,20)
  branchgrpo_cli_error_test(branching_zero "branching factor 0 " tree --branching 0)
  branchgrpo_cli_error_test(branching_negative "branching factor -1 " tree --branching -1)
  branchgrpo_cli_error_test(duplicate_split "split step 3 is given more than once" tree --split-steps 0,3,3)
  branchgrpo_cli_error_test(too_many_leaves "exceeds 2\\^24 leaves" tree --branching 100)
  branchgrpo_cli_error_test(too_many_chains "20000000 roots exceeds 2\\^24" tree --sequential 20000000
                            --shared-root false)
  branchgrpo_cli_error_test(branching_count "2 branching factors for 4 split steps" tree --branching 2,2)
  branchgrpo_cli_error_test(group_zero "--sequential = 0: must be an integer in \\[1, 2147483647\\]" tree --sequential 0)
  branchgrpo_cli_error_test(steps_zero "steps must be at least 1, got 0" tree --steps 0)
  branchgrpo_cli_error_test(steps_too_many "at most 255 steps are supported, got 256" tree --steps 256)
  branchgrpo_cli_error_test(fast_split_past_steps "--split-step = 20: must be below --steps = 20" tree --flow-grpo-fast 4
                            --split-step 20)
  branchgrpo_cli_error_test(sigmas_increase "does not decrease at index 2: 0.5 then 0.7" tree --steps 2
                            --split-steps 0 --sigmas 1,0.5,0.7)
  branchgrpo_cli_error_test(sigmas_nan "--sigmas\\[1\\] = nan: must be a finite number" tree --steps 2 --split-steps 0 --sigmas 1,nan,0)
  branchgrpo_cli_error_test(sigmas_size "--sigmas has 3 values for 20 steps" tree --sigmas 1,0.5,0)
  branchgrpo_cli_error_test(shift_negative "--shift = -1: must be a number in \\[0.001, 1000\\]" tree --shift -1)
  branchgrpo_cli_error_test(unknown_option "--frobnicate" tree --frobnicate)
  branchgrpo_cli_error_test(unknown_subcommand "bogus" bogus)
  branchgrpo_cli_error_test(no_subcommand "a subcommand is required")
  branchgrpo_cli_error_test(bad_schedule "foo" tree --schedule foo)
  branchgrpo_cli_error_test(bad_number "abc" tree --steps abc)
  branchgrpo_cli_error_test(bad_bool "maybe" tree --sequential 4 --shared-root maybe)
  branchgrpo_cli_error_test(shared_root_alone "--shared-root requires --sequential" tree --shared-root false)
  branchgrpo_cli_error_test(sequential_and_branching "excludes" tree --sequential 4 --branching 3)
  branchgrpo_cli_error_test(fast_without_split "--flow-grpo-fast requires --split-step" tree --flow-grpo-fast 4)

  # `branchgrpo toy`: runs that succeed, checked by package/check_toy_cli.cmake (stdout lines and keys, the files
  # written into --out, which it empties first). "\n" in a quoted argument is a newline; `.` matches one too.
  function(branchgrpo_toy_test name)
    cmake_parse_arguments(PARSE_ARGV 1 toy "" "LINES;CSV_HEADER;STDOUT;STDERR" "KEYS;FILES;ARGS")
    set(out ${CMAKE_CURRENT_BINARY_DIR}/toy_cli/${name})
    list(JOIN toy_ARGS "|" arguments)
    list(JOIN toy_KEYS "|" keys)
    list(JOIN toy_FILES "|" files)
    set(defines -DTOOL=$<TARGET_FILE:branchgrpo_cli> "-DARGS=${arguments}|--out|${out}" -DOUT=${out})
    foreach(variable IN ITEMS LINES CSV_HEADER STDOUT STDERR)
      if(DEFINED toy_${variable})
        list(APPEND defines "-D${variable}=${toy_${variable}}")
      endif()
    endforeach()
    if(keys)
      list(APPEND defines "-DKEYS=${keys}")
    endif()
    if(files)
      list(APPEND defines "-DFILES=${files}")
    endif()
    add_test(NAME cli_toy_${name} COMMAND ${CMAKE_COMMAND} ${defines} -P
                                          ${CMAKE_CURRENT_SOURCE_DIR}/package/check_toy_cli.cmake)
    set_tests_properties(cli_toy_${name} PROPERTIES LABELS cli TIMEOUT 300)
  endfunction()

  branchgrpo_toy_test(json_lines LINES 3 ARGS toy --method branch --iters 3 --json --quiet
                      KEYS iteration reward_mean evaluations edges_trained seconds trees_dropped
                      FILES toy_branch.csv reward_vs_time.png samples_before_after.png
                      CSV_HEADER "^iteration,method,reward_mean,reward_std,evaluations,edges_trained,seconds,cumulative_seconds,loss")
  branchgrpo_toy_test(json_first_iteration LINES 2 ARGS toy --method dance --iters 2 --prompts 1 --json --quiet
                      STDOUT [=[^{"clip_fraction":[^}]*"evaluations":305,"evaluations_saved":0,"iteration":0,"loss"]=])  # 305: dance, G = 16
  branchgrpo_toy_test(compare LINES 1 ARGS toy --compare --iters 2 --prompts 2 --json
                      KEYS dance branch branch-widpru branch-deppru branch-mix final_reward reward_gain evaluations
                           edges_trained seconds_per_iter time_ratio_vs_dance
                      FILES compare.csv reward_vs_time.png samples_before_after.png
                      CSV_HEADER "^iteration,method,reward_mean,reward_std,evaluations,edges_trained,seconds,cumulative_seconds,loss"
                      STDOUT [=["dance":{[^}]*"time_ratio_vs_dance":1\.0[,}]]=])
  branchgrpo_toy_test(compare_table ARGS toy --compare --iters 1 --prompts 1 --quiet
                      STDOUT "vs dance.*\nbase model .*\ndance .*\nbranch .*\nbranch-widpru .*\nbranch-deppru .*\nbranch-mix "
                      FILES compare.csv reward_vs_time.png samples_before_after.png)
  branchgrpo_toy_test(single_table ARGS toy --method branch-mix --iters 2 --prompts 1
                      STDOUT "held-out reward .*base .* -> trained" FILES toy_branch-mix.csv)
  branchgrpo_toy_test(nan_leaf LINES 2 ARGS toy --method branch --iters 2 --prompts 2 --nan-leaf-every 1 --json
                      KEYS trees_dropped STDOUT [=["iteration":0,[^}]*"trees_dropped":1,.*"iteration":1,[^}]*"trees_dropped":1,]=]
                      STDERR "^warning: iteration 0: dropped 1 tree with a non-finite reward\nwarning: iteration 1: dropped 1 tree")
  branchgrpo_toy_test(nan_every_tree LINES 1 ARGS toy --method dance --iters 1 --prompts 1 --nan-leaf-every 1 --json
                      STDOUT [=["edges_trained":0,.*"reward_mean":null,.*"trees_dropped":1,]=])
  branchgrpo_cli_test(toy_help "--nan-leaf-every" toy --help)

  branchgrpo_cli_error_test(toy_unknown_method "unknown method 'foo'" toy --method foo)
  branchgrpo_cli_error_test(toy_iters_zero "--iters = 0: must be an integer in \\[1, " toy --iters 0)
  branchgrpo_cli_error_test(toy_compare_iters_zero "--iters = 0: must be an integer in \\[1, " toy --compare --iters 0)
  branchgrpo_cli_error_test(toy_prompts_zero "--prompts = 0: must be an integer in \\[1, " toy --prompts 0)
  branchgrpo_cli_error_test(toy_max_batch_zero "--max-batch = 0: must be an integer in \\[1, " toy --max-batch 0)
  branchgrpo_cli_error_test(toy_nan_every_negative "--nan-leaf-every = -1: must be an integer in \\[0, " toy
                            --nan-leaf-every -1)
  branchgrpo_cli_error_test(toy_steps_too_few "split step 6 is not in \\[0, 5\\)" toy --steps 5)
  branchgrpo_cli_error_test(toy_method_and_compare "excludes" toy --compare --method dance)
  branchgrpo_cli_error_test(toy_bad_iters "abc" toy --iters abc)
endif()

# --- Every public header compiles on its own --------------------------------------------------------------------
# One generated .cpp per header, holding only its #include, in an OBJECT library per include root: the core
# (include/) and each torch-free adapter whose target exists (adapters/<name>/, with its third-party library).
function(branchgrpo_self_containment target root link)
  file(GLOB_RECURSE headers CONFIGURE_DEPENDS ${root}/branchgrpo/*.hpp)
  set(sources "")
  foreach(header IN LISTS headers)
    file(RELATIVE_PATH relative ${root} ${header})
    string(MAKE_C_IDENTIFIER ${relative} identifier)
    set(source ${CMAKE_CURRENT_BINARY_DIR}/${target}/${identifier}.cpp)
    file(CONFIGURE OUTPUT ${source} CONTENT "#include <${relative}>\n")  # rewritten only when it changes
    list(APPEND sources ${source})
  endforeach()
  if(sources)
    add_library(${target} OBJECT ${sources})
    set_target_properties(${target} PROPERTIES CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF)
    target_link_libraries(${target} PRIVATE ${link} branchgrpo_warnings)
  endif()
endfunction()

branchgrpo_self_containment(header_self_containment ${PROJECT_SOURCE_DIR}/include branchgrpo::branchgrpo)
# The torch-free adapters too; not torch or app, where every header would be a ~40 s LibTorch translation unit
# (their consumers below compile one TU each).
foreach(adapter IN ITEMS eigen xtensor files safetensors model_specs config)
  if(TARGET branchgrpo::${adapter})
    branchgrpo_self_containment(header_self_containment_${adapter} ${PROJECT_SOURCE_DIR}/adapters/${adapter}
                                branchgrpo::${adapter})
  endif()
endforeach()

# --- Consumers: install + find_package, and add_subdirectory ----------------------------------------------------
# package_install (fixture setup branchgrpo_install): `cmake --install` of this build into package/prefix (emptied
# first); every file of every built target's include root must be there, the package's CMake files (with
# FindTurboJPEG.cmake, which branchgrpo::app's config needs), and, with the tool, the tool (it must run) and its
# shipped model.
# package_consumer_<target>, one per package target built here: a project that find_package()s branchgrpo from that
# prefix and links only branchgrpo::<target> (tests/package/consumer/<target>.cpp, -Wall -Wextra -Wpedantic
# -Werror), built and run. Those of the torch-free targets fail if LibTorch is on their compile or link lines
# (and those of torch and app if it is not: the check's control). package_subdirectory_consumer: add_subdirectory.
set(package_targets branchgrpo)
set(package_header_roots ${PROJECT_SOURCE_DIR}/include)
foreach(adapter IN ITEMS eigen xtensor files safetensors model_specs config torch)
  if(TARGET branchgrpo::${adapter})
    list(APPEND package_targets ${adapter})
    list(APPEND package_header_roots ${PROJECT_SOURCE_DIR}/adapters/${adapter})
  endif()
endforeach()
if(TARGET branchgrpo::app)
  list(APPEND package_targets app)
  list(APPEND package_header_roots ${PROJECT_SOURCE_DIR}/tools/app)
endif()
set(package_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/branchgrpo)
set(package_files ${package_cmake_dir}/branchgrpoConfig.cmake ${package_cmake_dir}/branchgrpoConfigVersion.cmake
                  ${package_cmake_dir}/branchgrpoTargets.cmake ${package_cmake_dir}/FindRandom123.cmake
                  ${package_cmake_dir}/FindTurboJPEG.cmake)
set(package_tool "")
if(TARGET branchgrpo_cli)
  set(package_tool ${CMAKE_INSTALL_BINDIR}/branchgrpo)
  set(package_models_dir ${CMAKE_INSTALL_DATADIR}/branchgrpo/models/shapes-tiny)
  list(APPEND package_files ${package_tool} ${package_models_dir}/model.safetensors
                            ${package_models_dir}/prompts.safetensors)
endif()
list(JOIN package_header_roots "|" package_header_roots)
list(JOIN package_files "|" package_files)
set(package_prefix ${CMAKE_CURRENT_BINARY_DIR}/package/prefix)
set(package_check ${CMAKE_CURRENT_SOURCE_DIR}/package/check_consumers.cmake)
set(package_consumer_args -DCXX_COMPILER=${CMAKE_CXX_COMPILER} "-DGENERATOR=${CMAKE_GENERATOR}" -DCONFIG=$<CONFIG>)
if(BRANCHGRPO_CCACHE_PROGRAM AND "${CMAKE_CXX_COMPILER_LAUNCHER}" MATCHES "ccache")
  list(APPEND package_consumer_args -DCCACHE=${BRANCHGRPO_CCACHE_PROGRAM} -DCCACHE_BASEDIR=${PROJECT_SOURCE_DIR})
endif()

add_test(NAME package_install
         COMMAND ${CMAKE_COMMAND} -DMODE=install -DBUILD_DIR=${PROJECT_BINARY_DIR} -DPREFIX=${package_prefix}
                 -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/package/install -DCONFIG=$<CONFIG>
                 -DINCLUDEDIR=${CMAKE_INSTALL_INCLUDEDIR} "-DHEADER_ROOTS=${package_header_roots}"
                 "-DFILES=${package_files}" "-DTOOL=${package_tool}" -P ${package_check})
set_tests_properties(package_install PROPERTIES LABELS package TIMEOUT 300 FIXTURES_SETUP branchgrpo_install)
foreach(package_target IN LISTS package_targets)
  if(package_target STREQUAL "torch" OR package_target STREQUAL "app")
    set(package_torch ON)
    set(package_labels "package;torch")
  else()
    set(package_torch OFF)
    set(package_labels package)
  endif()
  add_test(NAME package_consumer_${package_target}
           COMMAND ${CMAKE_COMMAND} -DMODE=consumer -DTARGET=${package_target} -DTORCH=${package_torch}
                   -DPREFIX=${package_prefix} -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/package/consumer_${package_target}
                   ${package_consumer_args} -P ${package_check})
  set_tests_properties(package_consumer_${package_target} PROPERTIES LABELS "${package_labels}" TIMEOUT 600
                       FIXTURES_REQUIRED branchgrpo_install)
endforeach()
add_test(NAME package_subdirectory_consumer
         COMMAND ${CMAKE_COMMAND} -DMODE=subdirectory -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                 -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/package/subdirectory ${package_consumer_args} -P ${package_check})
set_tests_properties(package_subdirectory_consumer PROPERTIES LABELS package TIMEOUT 600)

# --- Safetensors (branchgrpo::safetensors, torch-free) ---------------------------------------------------------
# test_safetensors needs no LibTorch: the reader is std + POSIX. It replays the fuzzer's seed corpus through the
# fuzzer's own checks (fuzz/safetensors_fuzz_input.hpp).
if(TARGET test_safetensors)
  target_link_libraries(test_safetensors PRIVATE branchgrpo::safetensors)
  target_include_directories(test_safetensors PRIVATE ${PROJECT_SOURCE_DIR}/fuzz)
  target_compile_definitions(test_safetensors PRIVATE BRANCHGRPO_FUZZ_CORPUS="${PROJECT_SOURCE_DIR}/fuzz/corpus")
endif()

# `branchgrpo weights` on checkpoints generated by tests/package/make_weights_fixtures.cpp (tiny FLUX config, each
# layout, sharded, damaged, not FLUX, malformed): a fixture writes them first.
if(TARGET branchgrpo_cli)
  add_executable(make_weights_fixtures ${CMAKE_CURRENT_SOURCE_DIR}/package/make_weights_fixtures.cpp)
  target_link_libraries(make_weights_fixtures PRIVATE branchgrpo::safetensors branchgrpo::model_specs
                                                      branchgrpo_warnings)
  set(weights_dir ${CMAKE_CURRENT_BINARY_DIR}/weights)
  add_test(NAME cli_weights_fixtures COMMAND make_weights_fixtures ${weights_dir})
  set_tests_properties(cli_weights_fixtures PROPERTIES FIXTURES_SETUP weights_files LABELS cli)

  # Functions, not macros: a macro would re-read the regexes' backslashes.
  function(weights_test name regex)
    branchgrpo_cli_test(weights_${name} "${regex}" weights ${ARGN})
    set_tests_properties(cli_weights_${name} PROPERTIES FIXTURES_REQUIRED weights_files)
  endfunction()
  function(weights_error_test name regex)
    branchgrpo_cli_error_test(weights_${name} "${regex}" weights ${ARGN})
    set_tests_properties(cli_error_weights_${name} PROPERTIES FIXTURES_REQUIRED weights_files)
  endfunction()

  weights_test(bfl_layout "layout    bfl \\(detected\\)\nconfig    tiny \\(best match of dev, schnell, tiny\\)\n"
               ${weights_dir}/tiny_bfl.safetensors)
  # tiny bfl: 2 double blocks x 2 streams x 13 + 2 single blocks x 8 + 16 outside the blocks = 84 tensors.
  weights_test(bfl_check "check     ok: all 84 tensors of tiny in bfl, every shape matching" ${weights_dir}/tiny_bfl.safetensors)
  weights_test(bfl_listing "tensors   84 \\(BF16 84\\), [0-9]+ bytes\nmetadata  format = pt\n.*\nimg_in.weight +BF16 +\\[64, 16\\]\n"
               ${weights_dir}/tiny_bfl.safetensors)
  weights_test(diffusers_layout "layout    diffusers \\(detected\\)\nconfig    tiny .*\ncheck     ok: all [0-9]+ tensors of tiny in diffusers"
               ${weights_dir}/tiny_diffusers.safetensors)
  weights_test(diffusers_listing "x_embedder.weight +BF16 +\\[64, 16\\]" ${weights_dir}/tiny_diffusers.safetensors)
  weights_test(sharded "\\(index of 2 shards\\)\n.*layout    diffusers \\(detected\\)\n.*check     ok"
               ${weights_dir}/tiny_sharded.safetensors.index.json)
  weights_test(sharded_json [=["sharded":true,"shards":\["tiny-00001-of-00002.safetensors","tiny-00002-of-00002.safetensors"\]]=]
               ${weights_dir}/tiny_sharded.safetensors.index.json --json)
  weights_test(damaged "check     3 problems: 1 missing, 1 unexpected, 1 shape mismatch\n  missing     img_in.bias\n  unexpected  extra.weight\n  mismatch    img_in.weight \\[64, 8\\] \\(expected \\[64, 16\\]\\)\n"
               ${weights_dir}/tiny_bfl_damaged.safetensors --config tiny)
  # nlohmann's compact dump sorts the keys.
  weights_test(damaged_json [=["config":"tiny",.*"layout":"bfl","metadata":{},"mismatched":\["img_in.weight \[64, 8\] \(expected \[64, 16\]\)"\],"missing":\["img_in.bias"\],"ok":false,.*"unexpected":\["extra.weight"\]}]=]
               ${weights_dir}/tiny_bfl_damaged.safetensors --json)
  weights_test(json_ok [=["config":"tiny","detected_layout":"bfl",.*"ok":true,]=] ${weights_dir}/tiny_bfl.safetensors --json)
  weights_test(json_tensor [=[{"dtype":"BF16","name":"img_in.weight","shape":\[64,16\]}]=] ${weights_dir}/tiny_bfl.safetensors
               --json)
  weights_test(forced_layout "layout    diffusers \\(as given; the names look like bfl\\)\n.*missing     x_embedder.weight"
               ${weights_dir}/tiny_bfl.safetensors --layout diffusers --config tiny)
  # The dev config against tiny weights: the embedding shapes differ, e.g. img_in.weight [64, 16] vs [3072, 64].
  weights_test(other_config "config    dev\n.*mismatch    img_in.weight \\[64, 16\\] \\(expected \\[3072, 64\\]\\)"
               ${weights_dir}/tiny_bfl.safetensors --config dev)
  weights_test(not_flux "layout    none: not a FLUX transformer checkpoint.*encoder.conv_in.weight +BF16 +\\[4, 3, 3, 3\\]"
               ${weights_dir}/not_flux.safetensors)
  weights_test(not_flux_json [=["config":null,.*"layout":null,.*"ok":null]=] ${weights_dir}/not_flux.safetensors --json)
  weights_test(help "--layout" --help)

  weights_error_test(malformed
                     "malformed.safetensors: tensor 'img_in.weight': data_offsets \\[0, 12\\] hold 12 bytes but shape \\[2, 2\\] of F32 needs 16"
                     ${weights_dir}/malformed.safetensors)
  weights_error_test(malformed_json "hold 12 bytes but shape \\[2, 2\\] of F32 needs 16" ${weights_dir}/malformed.safetensors --json)
  weights_error_test(missing_file "absent.safetensors: cannot open the safetensors file: No such file or directory" ${weights_dir}/absent.safetensors)
  weights_error_test(missing_shard "tiny_sharded.safetensors.index.json: shard 'tiny-00001-of-00002.safetensors': .*cannot open"
                     ${weights_dir}/missing_shard/tiny_sharded.safetensors.index.json)
  weights_error_test(bad_layout "sd3" ${weights_dir}/tiny_bfl.safetensors --layout sd3)
  weights_error_test(bad_config "pro" ${weights_dir}/tiny_bfl.safetensors --config pro)
  weights_error_test(no_file "file is required" )
endif()


# --- Benchmarks (docs/performance.md): smoke runs so they keep compiling and running; no timing asserts ----------
foreach(bench IN ITEMS bench_components bench_backends)
  if(TARGET ${bench})
    add_test(NAME smoke_${bench} COMMAND ${bench} --benchmark_min_time=0.01)  # Google Benchmark 1.7: seconds
    set_tests_properties(smoke_${bench} PROPERTIES LABELS bench TIMEOUT 120)
  endif()
endforeach()

# `branchgrpo bench iteration`: one short run (the JSON keys and the evaluation counts, never the times), errors.
if(TARGET branchgrpo_cli)
  set(bench_quick bench iteration --iters 1 --warmup 0 --prompts 1 --batching-repeats 1 --json)
  # nlohmann sorts the keys: batching_speedup < overhead_fraction < seconds_per_iter < time_ratio_vs_dance.
  foreach(variant IN ITEMS dance branch branch-widpru branch-deppru branch-mix)
    set(keys [=[":{"batched_denoiser_calls":[^}]*"batching_speedup":[^}]*"overhead_fraction":[^}]*]=])
    string(APPEND keys [=["seconds_per_iter":[^}]*"time_ratio_vs_dance":]=])
    branchgrpo_cli_test(bench_keys_${variant} "\"${variant}${keys}" ${bench_quick})
  endforeach()
  branchgrpo_cli_test(bench_dance_ratio [=["dance":{[^}]*"time_ratio_vs_dance":1\.0[,}]]=] ${bench_quick})
  branchgrpo_cli_test(bench_dance_evaluations [=["dance":{[^}]*"rollout_evaluations":305\.0,]=] ${bench_quick})
  branchgrpo_cli_test(bench_branch_evaluations [=["branch":{[^}]*"rollout_evaluations":203\.0,]=] ${bench_quick})
  # One node per call: 305 calls for dance, one per frontier (20) when batched.
  branchgrpo_cli_test(bench_dance_calls [=["dance":{"batched_denoiser_calls":20,[^}]*"unbatched_denoiser_calls":305,]=]
                      ${bench_quick})
  branchgrpo_cli_test(bench_table "vs dance.*\ndance .*\nbranch .*\nbranch-widpru .*\nbranch-deppru .*\nbranch-mix "
                      bench iteration --iters 1 --warmup 0 --prompts 1 --batching-repeats 1)
  branchgrpo_cli_test(bench_help "--batching-repeats" bench iteration --help)

  branchgrpo_cli_error_test(bench_methods_without_dance "--methods must include dance" bench iteration
                            --methods branch,branch-mix)
  branchgrpo_cli_error_test(bench_unknown_method "unknown method 'grpo'" bench iteration --methods dance,grpo)
  # --model flux-tiny / flux (tools/cli/bench/flux.cpp): built under the same condition as tools/CMakeLists.txt
  # gives it. One short CPU run each (the JSON keys and the evaluation counts, never the times): flux-tiny on the
  # shipped model (< 60 s on 2 cores), flux on the tiny config's random weights (the variants share one transformer
  # and swap their LoRA adapters).
  if(TARGET branchgrpo::app)
    set(flux_tiny_quick bench iteration --model flux-tiny --iters 1 --warmup 0 --prompts 1 --batching-repeats 1 --json)
    # nlohmann sorts the keys: branch-mix's object comes before dance's.
    set(flux_keys [=["branch-mix":{"batched_denoiser_calls":20,[^}]*"rollout_evaluations":203\.0,.*]=])
    string(APPEND flux_keys [=["dance":{"batched_denoiser_calls":20,[^}]*"batching_speedup":[^}]*"bf16_peak_fraction":[^}]*]=])
    string(APPEND flux_keys [=["overhead_fraction":[^}]*"peak_memory_bytes":null,[^}]*"rollout_evaluations":305\.0,]=])
    string(APPEND flux_keys [=[[^}]*"seconds_per_iter":[^}]*"time_ratio_vs_dance":1\.0[,}]]=])
    branchgrpo_cli_test(bench_flux_tiny "${flux_keys}" ${flux_tiny_quick})
    branchgrpo_cli_test(bench_flux_random_tiny
                        [=[^{"branch":{[^}]*"rollout_evaluations":203\.0,[^}]*},"dance":{[^}]*"rollout_evaluations":305\.0,]=]
                        bench iteration --model flux --flux-config tiny --height 64 --width 64 --text-tokens 8
                        --methods dance,branch --iters 1 --warmup 0 --prompts 1 --batching-repeats 1 --json)
    set_tests_properties(cli_bench_flux_tiny cli_bench_flux_random_tiny PROPERTIES
                         LABELS "cli;torch;bench" TIMEOUT 300)
    branchgrpo_cli_test(bench_flux_table "model flux-tiny.*\nvariant .*TFLOP/s .*\ndance .*\nbranch "
                        bench iteration --model flux-tiny --iters 1 --warmup 0 --prompts 1 --batching-repeats 1
                        --methods dance,branch)
    set_tests_properties(cli_bench_flux_table PROPERTIES LABELS "cli;torch;bench" TIMEOUT 300)
    branchgrpo_cli_error_test(bench_flux_config "--flux-config 'pro' is not dev, schnell or tiny" bench iteration
                              --model flux --flux-config pro)
    branchgrpo_cli_error_test(bench_flux_dtype "--dtype 'float16' is not float32 or bfloat16" bench iteration
                              --model flux-tiny --dtype float16)
    branchgrpo_cli_error_test(bench_flux_device "--device 'gpu' is not a device" bench iteration --model flux-tiny
                              --device gpu)
    branchgrpo_cli_error_test(bench_flux_latent "--latent must be C,H,W with C = 4" bench iteration --model flux
                              --flux-config tiny --latent 3,8,8)
    branchgrpo_cli_error_test(bench_flux_missing_dir "nowhere/model.safetensors: no such file" bench iteration
                              --model flux-tiny --model-dir nowhere)
  else()
    branchgrpo_cli_error_test(bench_flux_tiny "^branchgrpo: model flux-tiny needs the LibTorch adapter \\(not built\\)\n$"
                              bench iteration --model flux-tiny)
    branchgrpo_cli_error_test(bench_flux "^branchgrpo: model flux needs the LibTorch adapter \\(not built\\)\n$"
                              bench iteration --model flux --flux-config dev)
  endif()
  branchgrpo_cli_error_test(bench_unknown_model "unknown model 'foo'" bench iteration --model foo)
  branchgrpo_cli_error_test(bench_iters_zero "--iters = 0: must be an integer in \\[1, " bench iteration --iters 0)
  branchgrpo_cli_error_test(bench_prompts_zero "--prompts = 0: must be an integer in \\[1, " bench iteration --prompts 0)
  branchgrpo_cli_error_test(bench_warmup_negative "--warmup = -1: must be an integer in \\[0, " bench iteration --warmup -1)
  branchgrpo_cli_error_test(bench_steps_too_few "split step 6 is not in \\[0, 5\\)" bench iteration --steps 5)
  branchgrpo_cli_error_test(bench_no_subcommand "subcommand is required" bench)
endif()

# --- `branchgrpo train / sample / demo` (docs/config.md, docs/cli.md) -----------------------------------------------
# The run configuration (branchgrpo::config) is torch-free but reads TOML with toml++: test_run_config builds only
# where that target exists; so does test_reward_table (the reward table, adapters/config/.../reward_table.hpp).
if(TARGET test_run_config)
  target_compile_definitions(test_run_config PRIVATE BRANCHGRPO_EXAMPLES_DIR="${PROJECT_SOURCE_DIR}/examples")
endif()
foreach(name IN ITEMS test_run_config test_reward_table)
  if(NOT TARGET ${name})
    continue()
  endif()
  if(TARGET branchgrpo::config)
    target_link_libraries(${name} PRIVATE branchgrpo::config)
  else()
    set_target_properties(${name} PROPERTIES EXCLUDE_FROM_ALL ON)
    set_tests_properties(${name} PROPERTIES DISABLED ON)
  endif()
endforeach()

# `branchgrpo pretrain` (built with branchgrpo::app): a 2-step run writes every file; errors are one line.
if(TARGET branchgrpo_cli AND TARGET branchgrpo::app)
  add_test(NAME cli_pretrain_quick
           COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:branchgrpo_cli> -DOUT=${CMAKE_CURRENT_BINARY_DIR}/pretrain_quick
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/package/check_pretrain.cmake)
  set_tests_properties(cli_pretrain_quick PROPERTIES LABELS "cli;torch" TIMEOUT 300)
  add_test(NAME cli_pretrain_video_quick
           COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:branchgrpo_cli> -DVIDEO=ON
                   -DOUT=${CMAKE_CURRENT_BINARY_DIR}/pretrain_video_quick -P ${CMAKE_CURRENT_SOURCE_DIR}/package/check_pretrain.cmake)
  set_tests_properties(cli_pretrain_video_quick PROPERTIES LABELS "cli;torch" TIMEOUT 300)
  branchgrpo_cli_error_test(pretrain_video_unknown_key "unknown or fixed key 'in_dim' for --video" pretrain --video
                            --out ${CMAKE_CURRENT_BINARY_DIR}/pretrain_error --config-json [=[{"in_dim":16}]=])
  branchgrpo_cli_error_test(pretrain_steps_zero "--steps = 0: must be an integer in \\[1, " pretrain --out
                            ${CMAKE_CURRENT_BINARY_DIR}/pretrain_error --steps 0)
  branchgrpo_cli_error_test(pretrain_unknown_config_key "unknown or fixed key 'in_channels'" pretrain --out
                            ${CMAKE_CURRENT_BINARY_DIR}/pretrain_error --config-json [=[{"in_channels":16}]=])
  branchgrpo_cli_error_test(pretrain_bad_config "rope axes sum to 32, head dim is 48" pretrain --out
                            ${CMAKE_CURRENT_BINARY_DIR}/pretrain_error --config-json [=[{"hidden":96}]=])
  branchgrpo_cli_error_test(pretrain_bad_t_sampling "normal" pretrain --out ${CMAKE_CURRENT_BINARY_DIR}/pretrain_error
                            --t-sampling normal)
endif()

# `branchgrpo train / sample / demo` end to end on the shipped model (models/shapes-tiny), when the tool has them
# (same condition as tools/CMakeLists.txt); otherwise their stubs must say what is missing.
if(TARGET branchgrpo_cli)
  if(TARGET branchgrpo::app)
    set(shapes_model ${PROJECT_SOURCE_DIR}/models/shapes-tiny)
    if(EXISTS ${shapes_model}/model.safetensors)
      # demo --quick: 2 iterations per method (CI); report.md and its PNG files.
      set(demo_out ${CMAKE_CURRENT_BINARY_DIR}/demo_cli/quick)
      add_test(NAME demo_quick
               COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:branchgrpo_cli>
                       "-DARGS=demo|--quick|--quiet|--model|${shapes_model}|--out|${demo_out}" -DOUT=${demo_out}
                       "-DFILES=report.md|reward_vs_time.png|before_after.png|demo.csv"
                       "-DSTDOUT=base model: held-out reward .*\ndance .*\nbranch .*\nbranch-widpru .*\nbranch-deppru .*\nbranch-mix .*held-out reward"
                       -P ${CMAKE_CURRENT_SOURCE_DIR}/package/check_toy_cli.cmake)
      set_tests_properties(demo_quick PROPERTIES LABELS "cli;torch" TIMEOUT 1200)
      branchgrpo_cli_error_test(demo_bad_prompt_row "--prompt-rows: row 12 is not in the model's 12 prompts" demo
                                --model ${shapes_model} --prompt-rows 1,12 --out ${CMAKE_CURRENT_BINARY_DIR}/demo_cli/bad)

      # train: a 4-step tree, 2 iterations, a checkpoint and a grid after each; then --resume to 3 iterations,
      # sample from the checkpoint, and the refusals.
      set(train_dir ${CMAKE_CURRENT_BINARY_DIR}/train_cli)
      set(train_common "[model]\ndir = \"${shapes_model}\"\n[topology]\nsplit_steps = [0, 2]\n[rollout]\nsteps = 4\n")
      string(APPEND train_common "[optimizer]\nlr = 1e-3\n[lora]\nrank = 4\nalpha = 4.0\n")
      string(APPEND train_common "[[rewards]]\nname = \"alignment\"\n[[rewards]]\nname = \"jpeg_compressibility\"\nweight = 0.1\n")
      file(CONFIGURE OUTPUT ${train_dir}/run2.toml CONTENT
           "${train_common}[run]\niterations = 2\ncheckpoint_every = 1\ngrid_every = 1\noutput_dir = \"${train_dir}/out\"\n")
      file(CONFIGURE OUTPUT ${train_dir}/run3.toml CONTENT
           "${train_common}[run]\niterations = 3\ncheckpoint_every = 1\ngrid_every = 1\noutput_dir = \"${train_dir}/out\"\n")
      add_test(NAME cli_train
               COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:branchgrpo_cli>
                       "-DARGS=train|--config|${train_dir}/run2.toml|--json|--quiet" -DOUT=${train_dir}/out -DLINES=2
                       "-DKEYS=iteration|reward_mean|reward/alignment|reward/jpeg_compressibility|evaluations|edges_trained|grad_norm"
                       "-DFILES=metrics.csv|metrics.jsonl|config.toml|grids/iter-000002.png|checkpoints/iter-000002/weights.safetensors|checkpoints/iter-000002/state.safetensors"
                       "-DCSV_HEADER=^clip_fraction,edges,edges_trained,evaluations,evaluations_saved,grad_norm,iteration,loss,"
                       -P ${CMAKE_CURRENT_SOURCE_DIR}/package/check_toy_cli.cmake)
      set_tests_properties(cli_train PROPERTIES LABELS "cli;torch" TIMEOUT 600 FIXTURES_SETUP train_run)
      add_test(NAME cli_train_resume COMMAND branchgrpo_cli train --config ${train_dir}/run3.toml --resume --json)
      set_tests_properties(cli_train_resume PROPERTIES LABELS "cli;torch" TIMEOUT 600 FIXTURES_REQUIRED train_run
                           PASS_REGULAR_EXPRESSION "resuming from [^\n]*iter-000002 \\(iteration 2\\)\n.*\"iteration\":2,")
      # --memory: the estimate by part and the budget, nothing loaded or trained (no fixture needed).
      branchgrpo_cli_test(train_memory
                          "memory estimate \\(nothing loaded; docs/reliability.md\\)\n  weights +[0-9.]+ [kMG]?B  cpu\n  training state .*\n  rollout latents .*\n  activations .*\n  decoded samples .*  host\n  prompt rows .*  host\ntotal [0-9.]+ [kMG]?B of [0-9.]+ [MGT]B \\("
                          train --config ${train_dir}/run2.toml --memory)
      set_tests_properties(cli_train_memory PROPERTIES LABELS "cli;torch")
      add_test(NAME cli_sample COMMAND branchgrpo_cli sample --config ${train_dir}/run2.toml
                                       --checkpoint ${train_dir}/out/checkpoints/iter-000002 --prompts
                                       "a red circle, a blue square" --samples 2 --out ${train_dir}/grid.png)
      set_tests_properties(cli_sample PROPERTIES LABELS "cli;torch" TIMEOUT 600 FIXTURES_REQUIRED train_run
                           PASS_REGULAR_EXPRESSION "a red circle +reward [0-9.-]+\na blue square +reward [0-9.-]+\nweights: trained\nwrote ")
      branchgrpo_cli_error_test(train_existing_checkpoints "out already holds checkpoint iter-00000[23]: pass --resume"
                                train --config ${train_dir}/run2.toml)
      set_tests_properties(cli_error_train_existing_checkpoints PROPERTIES FIXTURES_REQUIRED train_run)
      branchgrpo_cli_error_test(sample_unknown_prompt "--prompts: 'a pink dog' is not in the prompt embeddings"
                                sample --config ${train_dir}/run2.toml --checkpoint
                                ${train_dir}/out/checkpoints/iter-000002 --prompts "a pink dog")
      set_tests_properties(cli_error_sample_unknown_prompt PROPERTIES FIXTURES_REQUIRED train_run)
    else()
      message(STATUS "branchgrpo: models/shapes-tiny is missing: skipping the train / sample / demo CLI tests")
    endif()
    # The shipped video model (models/moving-shapes-tiny): demo --video --quick writes its report with the
    # animation; train on it with a 4-step tree writes a frame-strip grid and a checkpoint.
    set(video_model ${PROJECT_SOURCE_DIR}/models/moving-shapes-tiny)
    if(EXISTS ${video_model}/model.safetensors)
      set(video_out ${CMAKE_CURRENT_BINARY_DIR}/demo_cli/video_quick)
      set(video_files report.md|reward_vs_time.png|before_after.png|demo.csv)
      if(TARGET GIF::GIF)
        string(APPEND video_files "|before_after.gif")
      endif()
      add_test(NAME demo_video_quick
               COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:branchgrpo_cli>
                       "-DARGS=demo|--video|--quick|--quiet|--model|${video_model}|--out|${video_out}" -DOUT=${video_out}
                       "-DFILES=${video_files}"
                       "-DSTDOUT=base model: held-out reward .*\ndance .*\nbranch .*\nbranch-widpru .*\nbranch-deppru .*\nbranch-mix .*held-out reward"
                       -P ${CMAKE_CURRENT_SOURCE_DIR}/package/check_toy_cli.cmake)
      set_tests_properties(demo_video_quick PROPERTIES LABELS "cli;torch" TIMEOUT 1200)
      set(video_train ${CMAKE_CURRENT_BINARY_DIR}/train_video_cli)
      file(CONFIGURE OUTPUT ${video_train}/run.toml CONTENT
           "[model]\ndir = \"${video_model}\"\n[topology]\nsplit_steps = [0, 2]\n[rollout]\nsteps = 4\nshift = 5.0\n[lora]\nrank = 4\nalpha = 4.0\n[[rewards]]\nname = \"alignment\"\n[[rewards]]\nname = \"smoothness\"\nweight = 0.25\n[run]\niterations = 1\ncheckpoint_every = 1\ngrid_every = 1\noutput_dir = \"${video_train}/out\"\n")
      add_test(NAME cli_train_video
               COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:branchgrpo_cli>
                       "-DARGS=train|--config|${video_train}/run.toml|--json|--quiet" -DOUT=${video_train}/out -DLINES=1
                       "-DKEYS=iteration|reward_mean|reward/alignment|reward/smoothness|edges_trained"
                       "-DFILES=metrics.jsonl|grids/iter-000001.png|checkpoints/iter-000001/weights.safetensors"
                       -P ${CMAKE_CURRENT_SOURCE_DIR}/package/check_toy_cli.cmake)
      set_tests_properties(cli_train_video PROPERTIES LABELS "cli;torch" TIMEOUT 600)
    else()
      message(STATUS "branchgrpo: models/moving-shapes-tiny is missing: skipping the video demo and train CLI tests")
    endif()
    file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/train_cli/bad_steps.toml CONTENT "[rollout]\nsteps = 0\n")
    file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/train_cli/bad_key.toml CONTENT "[rollout]\nstepz = 3\n")
    branchgrpo_cli_error_test(train_bad_value "bad_steps.toml: rollout.steps = 0: must be at least 1"
                              train --config ${CMAKE_CURRENT_BINARY_DIR}/train_cli/bad_steps.toml)
    branchgrpo_cli_error_test(train_unknown_key "bad_key.toml: unknown key rollout.stepz \\(rollout has: "
                              train --config ${CMAKE_CURRENT_BINARY_DIR}/train_cli/bad_key.toml)
    branchgrpo_cli_error_test(train_missing_config "absent.toml: cannot open the config file: No such file or directory"
                              train --config ${CMAKE_CURRENT_BINARY_DIR}/absent.toml)
    branchgrpo_cli_test(demo_help "--quick" demo --help)
    branchgrpo_cli_error_test(demo_unknown_method "unknown method 'grpo'" demo --methods dance,grpo)
    branchgrpo_cli_error_test(demo_updates_zero "--updates = 0: must be an integer in \\[1, " demo --updates 0)
    branchgrpo_cli_error_test(demo_bad_prompt_rows "--prompt-rows\\[1\\] = x: must be an integer in \\[0, " demo --prompt-rows 1,x)
    branchgrpo_cli_error_test(demo_eta_negative "--eta = -0.5: must be a number in \\[0.0001, 10\\]" demo --eta -0.5)
  else()
    branchgrpo_cli_error_test(demo_without_torch
                              "^branchgrpo: branchgrpo demo needs the LibTorch adapter \\(not built\\)" demo --quick)
    branchgrpo_cli_error_test(train_without_torch
                              "^branchgrpo: branchgrpo train needs the LibTorch adapter \\(not built\\)" train --config x)
  endif()
endif()
