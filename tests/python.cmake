# The Python package (docs/python.md, ctest -L python), when the project's venv exists (scripts/setup.sh makes it):
#   python_package_install  scripts/python_package.sh: pip install . into .venv (incremental), the fixture
#   python_tests            pytest python/tests (the C++ tool's `tree` reports as the reference)
#   python_doctests         the package's docstrings and docs/python.md's quickstart, as doctests
#   python_ruff             ruff check and ruff format --check over python/, bench/python_*.py and examples/python
set(venv_python ${PROJECT_SOURCE_DIR}/.venv/bin/python)
if(NOT EXISTS ${venv_python})
  message(STATUS "branchgrpo: skipping the Python package's tests (no .venv: run scripts/setup.sh)")
  return()
endif()
add_test(NAME python_package_install COMMAND ${PROJECT_SOURCE_DIR}/scripts/python_package.sh)
set_tests_properties(python_package_install PROPERTIES FIXTURES_SETUP python_package LABELS python TIMEOUT 900)
set(pytest ${venv_python} -m pytest -q -p no:cacheprovider)
add_test(NAME python_tests COMMAND ${pytest} python/tests WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
if(TARGET branchgrpo_cli)
  set_tests_properties(python_tests PROPERTIES ENVIRONMENT "BRANCHGRPO_CLI=$<TARGET_FILE:branchgrpo_cli>")
endif()
add_test(NAME python_doctests COMMAND ${pytest} --doctest-modules --pyargs branchgrpo --doctest-glob=python.md
                                      docs/python.md WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
add_test(NAME python_ruff
         COMMAND sh -c "${PROJECT_SOURCE_DIR}/.venv/bin/ruff check python bench examples/python && ${PROJECT_SOURCE_DIR}/.venv/bin/ruff format --check python bench examples/python"
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(python_tests python_doctests PROPERTIES FIXTURES_REQUIRED python_package LABELS python)
set_tests_properties(python_ruff PROPERTIES LABELS python)
