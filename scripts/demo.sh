#!/usr/bin/env bash
# Sets everything up, builds the branchgrpo tool (Release) and runs the main job: the cost of the paper's dense
# BranchGRPO tree against the DanceGRPO baseline of 16 sequential chains, then `branchgrpo demo`, which aligns the
# shipped shapes model (models/shapes-tiny) with DanceGRPO and every BranchGRPO variant from the same seed and
# writes out/demo/report.md with its plot and image grids.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build --target branchgrpo_cli -j"$(nproc)"

echo "== BranchGRPO, dense schedule: branchgrpo tree --schedule dense"
build/bin/branchgrpo tree --schedule dense
echo
echo "== DanceGRPO baseline: branchgrpo tree --sequential 16"
build/bin/branchgrpo tree --sequential 16
echo
echo "== Aligning the shipped shapes model with every method: branchgrpo demo --out out/demo"
build/bin/branchgrpo demo --out out/demo
