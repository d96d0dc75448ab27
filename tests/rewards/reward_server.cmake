# scripts/reward_server.py, the reward server of the `remote` reward (docs/rewards.md, "The reward server"),
# include()d from tests/CMakeLists.txt. reward_server starts it as a process on a loopback port and checks the
# protocol, the shapes_alignment test scorer against the C++ formula, every bad request and each --fault mode.
# It needs Debian's /usr/bin/python3 with python3-numpy and python3-pil (scripts/setup.sh), no network, no GPU.
add_test(NAME reward_server COMMAND /usr/bin/python3 -B ${PROJECT_SOURCE_DIR}/tests/rewards/test_reward_server.py)
set_tests_properties(reward_server PROPERTIES LABELS rewards TIMEOUT 120)
