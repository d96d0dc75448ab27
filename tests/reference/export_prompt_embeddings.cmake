# scripts/export_prompt_embeddings.py (docs/prompt_embeddings.md), include()d from tests/CMakeLists.txt:
# test_export_prompt_embeddings builds tiny random-weight T5, umT5 and CLIP encoders and their tokenizers in a
# temporary folder (no download) and checks every row the script writes against them, and its one-line errors.
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
