#!/usr/bin/env bash
# Compile-only check of the LibTorch adapter and its tests against PyTorch 2.x's LibTorch headers.
# CI builds against Debian's LibTorch 1.13; this catches 2.x API differences without installing the multi-GB
# PyPI torch with its CUDA dependencies: it downloads the wheel (~0.9 GB) and extracts only its headers.
# Usage: scripts/check_torch2_headers.sh [torch version, default 2.5.1]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
version=${1:-2.5.1}
work=${TMPDIR:-/tmp}/branchgrpo-torch-${version}
if [[ ! -d $work/torch/include ]]; then
  mkdir -p "$work"
  python3 -m pip download --quiet --no-deps "torch==${version}" -d "$work/wheel"
  python3 - "$work" <<'PY'
import glob, sys, zipfile
work = sys.argv[1]
wheel = zipfile.ZipFile(glob.glob(f"{work}/wheel/torch-*.whl")[0])
wheel.extractall(work, [n for n in wheel.namelist() if n.startswith("torch/include/")])
PY
fi
include=(-isystem "$work/torch/include" -isystem "$work/torch/include/torch/csrc/api/include")
status=0
for test in tests/torch/test_*.cpp; do
  if g++ -std=c++20 -fsyntax-only -Wall -Wextra -Wpedantic -Werror -Wno-restrict -D_GLIBCXX_USE_CXX11_ABI=0 \
       -Iinclude -Iadapters/torch -Iadapters/safetensors -Iadapters/model_specs -Iadapters/config -Itools/app -Itests/support "${include[@]}" "$test"; then
    echo "ok     $test (torch ${version} headers)"
  else
    echo "FAILED $test (torch ${version} headers)"
    status=1
  fi
done
exit $status
