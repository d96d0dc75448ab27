# scripts/export_reward.py (docs/export_rewards.md), include()d from tests/CMakeLists.txt after
# export_prompt_embeddings.cmake, whose python3 (the one with torch and transformers) it runs on; open_clip_torch
# comes from scripts/setup.sh too. test_export_reward builds tiny random-weight transformers CLIP and open_clip
# models (no download), exports PickScore, the CLIP score and HPS-v2.1 modules from them and checks their scores
# against the original scorers' forward, their preprocessing against the original 8-bit pipelines, the embedded
# prompt list and the one-line errors. It leaves the modules in export_reward/, where test_export_reward_cpp (the
# hidden [.exported_reward] case of test_autoencoder) loads them through LibTorch and checks the same scores.
set(exported_rewards ${CMAKE_CURRENT_BINARY_DIR}/export_reward)
add_test(NAME test_export_reward COMMAND "${export_python}" -B ${CMAKE_CURRENT_LIST_DIR}/test_export_reward.py)
set_tests_properties(test_export_reward PROPERTIES LABELS "rewards;reference" TIMEOUT 120
                                                   ENVIRONMENT "BRANCHGRPO_EXPORTED_REWARDS=${exported_rewards}"
                                                   FIXTURES_SETUP exported_reward_files)
if(TARGET test_autoencoder)
  add_test(NAME test_export_reward_cpp COMMAND test_autoencoder "[.exported_reward]")
  set_tests_properties(test_export_reward_cpp PROPERTIES LABELS "rewards;torch" TIMEOUT 60
                                                         ENVIRONMENT "BRANCHGRPO_EXPORTED_REWARDS=${exported_rewards}"
                                                         FIXTURES_REQUIRED exported_reward_files)
endif()
