# scripts/export_prompt_embeddings.py (docs/prompt_embeddings.md), include()d from tests/CMakeLists.txt:
# test_export_prompt_embeddings builds tiny random-weight T5, umT5 and CLIP encoders (SD3: two CLIPs with projection
# and a T5) and their tokenizers in a temporary folder (no download) and checks every row the script writes against
# them, and its one-line errors.
# It needs a python3 with torch and transformers: the first python3 on PATH when it has them, else Debian's
# /usr/bin/python3, which python3-torch installs into and scripts/setup.sh gives transformers. With neither, the
# test still runs, and fails saying what is missing.
find_package(Python3 COMPONENTS Interpreter QUIET)
set(export_python "")
foreach(candidate IN ITEMS "${Python3_EXECUTABLE}" /usr/bin/python3)
  if(candidate AND EXISTS "${candidate}")
    execute_process(COMMAND "${candidate}" -c "import torch, transformers" RESULT_VARIABLE status
                    OUTPUT_QUIET ERROR_QUIET)
    if(status EQUAL 0)
      set(export_python "${candidate}")
      break()
    endif()
    if(NOT export_python_fallback)
      set(export_python_fallback "${candidate}")
    endif()
  endif()
endforeach()
if(NOT export_python)
  if(NOT export_python_fallback)
    set(export_python_fallback python3)
  endif()
  set(export_python "${export_python_fallback}")
  message(STATUS "branchgrpo: no python3 with torch and transformers (scripts/setup.sh installs them): "
                 "test_export_prompt_embeddings will fail")
endif()
add_test(NAME test_export_prompt_embeddings
         COMMAND "${export_python}" -B ${CMAKE_CURRENT_LIST_DIR}/test_export_prompt_embeddings.py)
set_tests_properties(test_export_prompt_embeddings PROPERTIES LABELS "torch;reference" TIMEOUT 300)

# The SD3 case once more against diffusers' own StableDiffusion3Pipeline.encode_prompt (above it is checked against
# the pipeline's formula written out in the test when that python has no diffusers): with the project's .venv
# (torch 2, diffusers; ./scripts/python_package.sh) or the python above when either has diffusers; not added
# without one.
set(export_diffusers_python "")
foreach(candidate IN ITEMS "${PROJECT_SOURCE_DIR}/.venv/bin/python" "${export_python}")
  if(candidate AND EXISTS "${candidate}")
    execute_process(COMMAND "${candidate}" -c "import torch, transformers, diffusers" RESULT_VARIABLE status
                    OUTPUT_QUIET ERROR_QUIET)
    if(status EQUAL 0)
      set(export_diffusers_python "${candidate}")
      break()
    endif()
  endif()
endforeach()
if(export_diffusers_python)
  add_test(NAME test_export_prompt_embeddings_sd3_pipeline
           COMMAND "${export_diffusers_python}" -B ${CMAKE_CURRENT_LIST_DIR}/test_export_prompt_embeddings.py
                   ExportTest.test_sd3)
  set_tests_properties(test_export_prompt_embeddings_sd3_pipeline PROPERTIES LABELS "torch;reference" TIMEOUT 300)
else()
  message(STATUS "branchgrpo: no python with diffusers (the project's .venv has it): "
                 "test_export_prompt_embeddings_sd3_pipeline is not added")
endif()
