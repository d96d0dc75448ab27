#!/usr/bin/env bash
# Installs the Python package `branchgrpo` (pyproject.toml, python/) into the project's venv (.venv, made by
# scripts/setup.sh): its extension module is built by CMake under build/python/, incrementally on a rerun.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ ! -x .venv/bin/python ]]; then
  echo "python_package.sh: no .venv: run ./scripts/setup.sh first" >&2
  exit 2
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps .
