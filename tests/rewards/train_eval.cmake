# `branchgrpo train` with [eval] (held-out evaluation) on the shipped shapes model, straight and killed then
# resumed (tests/rewards/train_eval.sh; include()d from tests/CMakeLists.txt; label rewards).
if(TARGET branchgrpo_cli AND TARGET branchgrpo::app AND EXISTS ${PROJECT_SOURCE_DIR}/models/shapes-tiny/model.safetensors)
  add_test(NAME cli_train_eval
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train_eval.sh $<TARGET_FILE:branchgrpo_cli>
                   ${PROJECT_SOURCE_DIR}/models/shapes-tiny ${CMAKE_CURRENT_BINARY_DIR}/train_eval)
  set_tests_properties(cli_train_eval PROPERTIES LABELS "cli;torch;rewards" TIMEOUT 180)
endif()
