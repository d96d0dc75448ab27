# scripts/track.py (docs/cli.md, "Experiment tracking"), include()d from tests/CMakeLists.txt: track_sidecar builds
# fake train output directories (metrics.jsonl, grids, config.toml), runs track.py on them (--once, --follow through
# a simulated --resume, SIGTERM, malformed lines, an interrupted batch) and reads the TensorBoard event files back
# with tensorboard's own EventAccumulator. It runs on Debian's /usr/bin/python3, which scripts/setup.sh gives
# tensorboard and tensorboardX; without them it fails saying so. The wandb part is skipped when wandb is absent.
add_test(NAME track_sidecar COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/rewards/test_track.py)
set_tests_properties(track_sidecar PROPERTIES LABELS rewards TIMEOUT 120)
