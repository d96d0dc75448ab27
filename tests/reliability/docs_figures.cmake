# --- Figures in the README (labels docs, reliability): README.md's demo table is the stored run
# docs/demo/report.md, figure for figure (scripts/check_demo_figures.py; reads two files, runs nothing). The
# self-test changes each figure in memory and expects the check to name its row and column. The full check,
# `scripts/check_demo_figures.py --rerun`, reruns the demo (~5 minutes on 2 cores) and is not a ctest test.
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  set(demo_figures ${PROJECT_SOURCE_DIR}/scripts/check_demo_figures.py)
  set(demo_figures_files --readme ${PROJECT_SOURCE_DIR}/README.md --report ${PROJECT_SOURCE_DIR}/docs/demo/report.md)
  add_test(NAME docs_demo_figures COMMAND Python3::Interpreter ${demo_figures} ${demo_figures_files})
  add_test(NAME docs_demo_figures_self_test COMMAND Python3::Interpreter ${demo_figures} --self-test
                                                    ${demo_figures_files})
  set_tests_properties(docs_demo_figures docs_demo_figures_self_test PROPERTIES LABELS "docs;reliability" TIMEOUT 30)
else()
  message(STATUS "branchgrpo: no python3: docs_demo_figures is not run")
endif()
