#!/usr/bin/env bash
# Builds and runs the LibTorch adapter against PyTorch 2.x's LibTorch from PyPI. CI builds against Debian's
# libtorch-dev 1.13; this is the run-time check for 2.x (scripts/check_torch2_headers.sh only compiles against
# 2.x's headers). Heavy, so not part of CI; docs/torch.md "LibTorch versions" has the results and the costs.
#
#   1. a virtual environment (~/.cache/branchgrpo/venv-torch2) with torch==VERSION from PyPI, reused when it
#      already holds that version. Outside the source tree: CMake refuses a target whose install interface names
#      a directory of the source tree, as branchgrpo::torch's does with the wheel's NCCL headers. PyPI's default
#      wheel is the CUDA build (~30 packages with the NVIDIA CUDA wheels and Triton, 5.3 GB installed for 2.15.0);
#      it runs on a CPU too.
#   2. a build directory (build-torch2/, gitignored) configured with CMAKE_PREFIX_PATH =
#      torch.utils.cmake_prefix_path and the wheel's C++ ABI (torch._C._GLIBCXX_USE_CXX11_ABI).
#   3. builds the torch tests (tests/torch/*, the application layer's among them), the conformance suite, the c10d
#      communicator's test program and the branchgrpo tool, then runs `ctest -L torch` (without the package_*
#      tests, which install and consume the whole project) and the conformance suite.
#   4. runs the image demo, `branchgrpo demo --quick`, and prints one summary line.
#
# Usage: scripts/test_libtorch2.sh [torch version, default 2.15.0]
# Environment: TORCH2_VENV (default ~/.cache/branchgrpo/venv-torch2), TORCH2_BUILD (build-torch2),
#              TORCH2_DEMO_OUT (/tmp/demo_torch2), JOBS (parallel compile jobs, default 2).
# Exits non-zero when anything fails.
#
# Requirements beyond scripts/setup.sh's packages:
#   - torch 2.7 or later. Older PyPI wheels use the pre-C++11 std::string ABI (_GLIBCXX_USE_CXX11_ABI=0), which
#     cannot link Debian's C++ libraries this project uses (Catch2's libCatch2WithMain.a, libtomlplusplus.so);
#     the script refuses them (scripts/check_torch2_headers.sh compiles against their headers instead).
#   - a CUDA toolkit (nvcc, e.g. /usr/local/cuda) for the CUDA wheel: its Caffe2Config.cmake fails without one
#     ("Your installed Caffe2 version uses CUDA but I cannot find the CUDA libraries").
# With nvcc the build links the project's CUDA kernels into the torch backend (BRANCHGRPO_TORCH_CUDA_KERNELS; for
# sm_80 and sm_90, BRANCHGRPO_CUDA_ARCHITECTURES); everything here runs on the CPU, so this checks that the
# CUDA-enabled build compiles, links and keeps the CPU path.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version=${1:-2.15.0}
venv=${TORCH2_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/branchgrpo/venv-torch2}
build=${TORCH2_BUILD:-build-torch2}
demo_out=${TORCH2_DEMO_OUT:-/tmp/demo_torch2}
jobs=${JOBS:-2}
start=$SECONDS
say() { echo "test_libtorch2.sh: $*"; }
run() {
  say "+ $*"
  "$@"
}
elapsed() { echo "$(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"; }

# --- 1. The virtual environment ----------------------------------------------------------------------------------
mkdir -p "$(dirname "$venv")"
venv=$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")
if [[ $venv/ == "$PWD"/* ]]; then
  say "TORCH2_VENV=$venv is inside the source tree, where CMake refuses the wheel's NCCL headers:" \
    "put it elsewhere" >&2
  exit 1
fi
python=$venv/bin/python
installed=$("$python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
if [[ $installed == "$version" ]]; then
  say "torch $version is already in $venv: reusing it"
else
  free_gb=$(df -Pk "$(dirname "$venv")" | awk 'NR == 2 { print int($4 / 1048576) }')
  say "installing torch $version from PyPI into $venv${installed:+ (replacing $installed)}; ${free_gb} GB free"
  if ((free_gb < 15)); then
    say "needs ~15 GB free (the wheels and their download cache, the build directory)" >&2
    exit 1
  fi
  [[ -x $python ]] || run python3 -m venv "$venv"
  # numpy only silences torch's "Failed to initialize NumPy" warning on import.
  run "$python" -m pip install --progress-bar off "torch==$version" numpy
  say "installed ($(elapsed)); $(du -sh "$venv" | cut -f1) in $venv"
fi

# --- 2. Configure ------------------------------------------------------------------------------------------------
read -r torch_version prefix abi < <("$python" -c \
  'import torch; print(torch.__version__, torch.utils.cmake_prefix_path, int(torch._C._GLIBCXX_USE_CXX11_ABI))')
say "torch $torch_version: CMake prefix $prefix, _GLIBCXX_USE_CXX11_ABI=$abi"
if [[ $abi != 1 ]]; then
  say "torch $torch_version is built with the pre-C++11 ABI (_GLIBCXX_USE_CXX11_ABI=0); Debian's Catch2 and" \
    "toml++ libraries use the new one, so the tests cannot link. Use torch 2.7 or later, or" \
    "scripts/check_torch2_headers.sh $version for a compile-only check" >&2
  exit 1
fi
# -D_GLIBCXX_USE_CXX11_ABI for every translation unit, not only those linking LibTorch (TORCH_CXX_FLAGS, empty in
# 2.x wheels): torch-free and torch objects share executables (the branchgrpo tool).
options=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_FLAGS="-D_GLIBCXX_USE_CXX11_ABI=$abi"
         -DBRANCHGRPO_BUILD_BENCHMARKS=OFF -DBRANCHGRPO_BUILD_EXAMPLES=OFF)
nvcc=${CUDACXX:-$(command -v nvcc || true)}
[[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
[[ -n $nvcc ]] && options+=(-DCMAKE_CUDA_COMPILER="$nvcc" -DBRANCHGRPO_WITH_CUDA=ON)
# The wheel's NCCL (site-packages/nvidia/nccl) is found by adapters/CMakeLists.txt itself.
run cmake -S . -B "$build" "${options[@]}"
torch_dir=$(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt")
if [[ $torch_dir != "$prefix"/* ]]; then
  say "$build took LibTorch from $torch_dir, not from $prefix (a stale Torch_DIR? remove $build)" >&2
  exit 1
fi

# --- 3. Build and test -------------------------------------------------------------------------------------------
targets=(branchgrpo_cli test_backend_conformance)
for source in tests/torch/test_*.cpp; do
  targets+=("$(basename "$source" .cpp)")
done
# The c10d communicator's tests (ctest -L "distributed;torch"), when CMake found Gloo's headers.
if [[ $(cmake --build "$build" --target help) == *$'\n... test_distributed\n'* ]]; then
  targets+=(test_distributed)
fi
run nice -n 10 cmake --build "$build" -j"$jobs" --target "${targets[@]}"
say "built ${#targets[@]} targets ($(elapsed) so far)"

log=$build/test_libtorch2.log
: >"$log"
status=0
run ctest --test-dir "$build" -L torch -E '^package_' --output-on-failure -j2 2>&1 | tee -a "$log" ||
  status=1
run ctest --test-dir "$build" -R '^test_backend_conformance$' --output-on-failure 2>&1 | tee -a "$log" ||
  status=1
# ctest's "100% tests passed, 0 tests failed out of 58", once per run.
read -r failed total < <(awk '/tests failed out of/ { failed += $4; total += $NF }
                              END { print failed + 0, total + 0 }' "$log")
if ((total == 0)); then
  status=1
fi

# --- 4. The image demo -------------------------------------------------------------------------------------------
demo_log=$build/test_libtorch2.demo.log
if run "$build/bin/branchgrpo" demo --quick --out "$demo_out" 2>&1 | tee "$demo_log"; then
  # One line per method, "branch-mix     held-out reward 0.3000 -> 0.5000 (+0.2000), 1.000 s/iter": the best gain.
  demo=$(awk '/held-out reward .* -> / {
                methods++; gain = $7; gsub(/[(),]/, "", gain)
                if (methods == 1 || gain + 0 > best) { best = gain + 0; name = $1; from = $4; to = $6 } }
              END { printf "%d methods, best %s %s -> %s", methods, name, from, to }' "$demo_log")
  demo="ok ($demo; $demo_out/report.md)"
else
  demo="FAILED (see $demo_log)"
  status=1
fi

say "torch $torch_version (PyPI, CXX11 ABI $abi): $((total - failed))/$total torch tests passed" \
  "(ctest -L torch without package_*, and test_backend_conformance); demo --quick: $demo; $(elapsed)"
exit $status
