#!/usr/bin/env bash
# Sets everything up, builds (Release) and runs every test. Exits non-zero when anything fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
./scripts/python_package.sh
ctest --test-dir build --output-on-failure -j2
