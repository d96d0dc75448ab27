#!/usr/bin/env bash
# bench/gpu_python.sh: the "The package with a FLUX.1-dev-size model" figures of docs/performance.md in one command,
# on a machine with a CUDA GPU (no network needed): about 6 minutes on an H100 (the package's build about 1, the
# model's setup under 1, one warm-up and two measured iterations about 4).
#   1. builds the Python package into $OUT/python-package (pip --target; the fused CUDA kernels when nvcc is there);
#   2. runs bench/python_gpu_flux.py --device cuda: diffusers' FluxTransformer2DModel of FLUX.1-dev's size with random
#      bfloat16 weights, a rank-64 LoRA (peft) trained under bfloat16 autocast with gradient checkpointing, one
#      BranchGRPO tree of 16 steps at 512 x 512 per iteration: seconds per iteration, peak memory, the fraction of the
#      GPU's dense bfloat16 peak.
# It needs python3 with a CUDA torch, and diffusers, peft, transformers (with their requirements), nanobind and
# scikit-build-core importable, or staged as wheels: on a machine with PyPI,
#   bench/gpu_python.sh --stage-wheels build-gpu-wheels          # the pinned wheels of python/requirements.txt that
#                                                               # a torch installation lacks (about 47 MB)
#   PYTHON_VERSION=3.12 bench/gpu_python.sh --stage-wheels DIR   # for another Python than this machine's
# and take the folder along (BRANCHGRPO_WHEELS names it; default build-gpu-wheels): they are installed into
# $OUT/python-deps when something is missing.
# Writes into $OUT (else ./out/gpu-python): environment.txt, build.log, python_gpu_flux.txt, python_gpu_flux.json.
# Extra options go to the benchmark: BENCH_ARGS="--resolution 1024 --iterations 3" bench/gpu_python.sh
#
# Exit status: 0 done; 1 the build or the run failed; 2 no GPU, no CUDA torch, or packages missing and not staged.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# What a torch installation brings (torch and its own requirements) and the project's development tools: not staged.
not_staged='^(torch|triton|nvidia-|cuda-|numpy|pytest|iniconfig|pluggy|ruff|tensorboard|absl-py|grpcio|markdown==|protobuf|werkzeug|sympy|mpmath|networkx|jinja2|markupsafe|filelock|fsspec|typing_extensions)'

if [[ "${1:-}" == "--stage-wheels" ]]; then
  folder=${2:?"usage: bench/gpu_python.sh --stage-wheels DIR"}
  mkdir -p "$folder"
  python=${PYTHON:-$repo/.venv/bin/python}
  [[ -x "$python" ]] || python=python3
  version=()
  [[ -n "${PYTHON_VERSION:-}" ]] && version=(--python-version "$PYTHON_VERSION" --only-binary=:all:)
  grep -v '^#' "$repo/python/requirements.txt" | grep -viE "$not_staged" > "$folder/requirements.txt"
  "$python" -m pip download --quiet --disable-pip-version-check --no-deps "${version[@]}" -d "$folder" \
    -r "$folder/requirements.txt"
  echo "staged $(find "$folder" -name "*.whl" | wc -l) wheels ($(du -sh "$folder" | cut -f1)) in $folder"
  exit 0
fi

out=${OUT:-$repo/out/gpu-python}
mkdir -p "$out"
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "bench/gpu_python.sh: nvidia-smi sees no GPU" >&2
  exit 2
fi
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
  echo "bench/gpu_python.sh: python3 has no torch that sees the GPU (python3 -c 'import torch' with CUDA)" >&2
  exit 2
fi

# The packages: those python3 lacks come from the staged wheels.
needed='import diffusers, peft, transformers, nanobind, scikit_build_core'
wheels=${BRANCHGRPO_WHEELS:-$repo/build-gpu-wheels}
export PYTHONPATH="$out/python-package${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "$needed" 2> /dev/null; then
  if ! compgen -G "$wheels/*.whl" > /dev/null; then
    echo "bench/gpu_python.sh: python3 cannot '$needed', and no staged wheels in $wheels" \
      "(bench/gpu_python.sh --stage-wheels DIR on a machine with PyPI; BRANCHGRPO_WHEELS=DIR here)" >&2
    exit 2
  fi
  echo "installing the staged wheels of $wheels into $out/python-deps"
  python3 -m pip install --quiet --disable-pip-version-check --no-index --no-deps --target "$out/python-deps" \
    "$wheels"/*.whl
  export PYTHONPATH="$PYTHONPATH:$out/python-deps"
  python3 -c "$needed" || { echo "bench/gpu_python.sh: still missing after the staged wheels" >&2; exit 2; }
fi
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  python3 -c 'import torch, diffusers, peft; print("torch", torch.__version__, "cuda", torch.version.cuda,
"diffusers", diffusers.__version__, "peft", peft.__version__)'
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || true
  echo "cpu: $(nproc) cores"
} > "$out/environment.txt"
cat "$out/environment.txt"

echo "building the Python package into $out/python-package (log: $out/build.log)"
if ! python3 -m pip install --no-build-isolation --no-deps --target "$out/python-package" "$repo" \
  > "$out/build.log" 2>&1; then
  tail -20 "$out/build.log" >&2
  echo "bench/gpu_python.sh: the package's build failed (see $out/build.log)" >&2
  exit 1
fi

echo "running: python3 bench/python_gpu_flux.py --device cuda ${BENCH_ARGS:-}"
# shellcheck disable=SC2086  # BENCH_ARGS is a list of options
if ! python3 "$repo/bench/python_gpu_flux.py" --device cuda --json "$out/python_gpu_flux.json" ${BENCH_ARGS:-} 2>&1 |
  tee "$out/python_gpu_flux.txt"; then
  echo "bench/gpu_python.sh: the benchmark failed (see $out/python_gpu_flux.txt)" >&2
  exit 1
fi
echo "done: $out/python_gpu_flux.txt and $out/python_gpu_flux.json"
