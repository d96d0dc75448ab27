#!/usr/bin/env bash
# bench/gpu_kernels.sh: the "CUDA kernels" section of docs/performance.md in one run, on a machine with a CUDA GPU
# (an H200 for the figures there; no network needed). Builds with nvcc against the machine's LibTorch (PyTorch's
# when python3 can import torch: a CUDA build, so the torch backend uses the kernels; else Debian's, CPU-only), then
#   1. cuda_kernel_check: device noise == host noise bit for bit (plain and correlated{4}); the fused SDE step's
#      next == the host's bit for bit and its log-probs within 1e-9 of the host's float64 ones; the bandwidth of each
#      kernel on a 16 x 16 x 128 x 128 latent as GB/s and as a fraction of the H200's 4.8 TB/s;
#   2. test_torch_keyed_step: the torch backend's keyed SDE step on CUDA tensors (the fused kernel when linked) against
#      the CPU's, next bit for bit and log-probs within 1e-12 (when Catch2 is there to build it);
#   3. the FLUX iteration harness on the shipped model, on the GPU in float32 (the kernels' dtype):
#        branchgrpo bench iteration --model flux-tiny --device cuda --dtype float32 ...
#      (needs a CUDA LibTorch and the tool's dependencies; skipped with a line saying why otherwise);
#   4. the Python package on the GPU against the CPU (bench/python_device_check.py: a float64 rollout bit for bit,
#      log-probs and one PPO gradient within 1e-12), when python3 imports a CUDA torch and the package can be built
#      there (nanobind and scikit-build-core importable; the package goes to $out/python-package).
# Writes into $OUT (else ./out/gpu-kernels): environment.txt, build.log, cuda_kernel_check.txt, torch_keyed_step.txt,
# bench_flux_tiny.txt, bench_flux_tiny.json, python_device_check.txt.
#
# Usage, on the GPU machine from the repository root (about 5 minutes on 16 cores, most of it the build):
#   bench/gpu_kernels.sh
#   CHECK_ARGS="--reps 100" BENCH_ARGS="--iters 5" bench/gpu_kernels.sh      # extra / overriding options
# The machine may lack the tool's C++ dependencies: stage them as for bench/gpu.sh (bench/gpu.sh --stage-deps
# build-gpu-deps on a Debian machine that has them) and take the folder along; BRANCHGRPO_DEPS names it.
#
# Exit status: 0 done (the check passed); 1 the build or the check failed; 2 no nvcc or no CUDA device here.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-$repo/out/gpu-kernels}
build=${BUILD_DIR:-$repo/build-gpu-kernels}
mkdir -p "$out"

nvcc=${CUDACXX:-$(command -v nvcc || true)}
if [[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]]; then nvcc=/usr/local/cuda/bin/nvcc; fi
if [[ -z "$nvcc" ]]; then
  echo "bench/gpu_kernels.sh: no nvcc (not on PATH, no CUDACXX, no /usr/local/cuda/bin/nvcc): nothing to build" >&2
  exit 2
fi
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "bench/gpu_kernels.sh: nvidia-smi sees no GPU: the kernels would build but not run" >&2
  exit 2
fi

# LibTorch: PyTorch's if python3 has it (its CMake prefix and C++ ABI), else whatever find_package finds (Debian's).
prefix_path="" abi_flags="" torch_cuda=0 torch_about="none importable from python3 (find_package(Torch) decides)"
if python3 -c 'import torch' 2> /dev/null; then
  read -r torch_prefix torch_abi torch_version torch_cuda < <(python3 -c '
import torch
print(torch.utils.cmake_prefix_path, int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.__version__, int(torch.cuda.is_available()))')
  prefix_path=$torch_prefix
  abi_flags="-D_GLIBCXX_USE_CXX11_ABI=$torch_abi"
  torch_about="$torch_version (cmake prefix $torch_prefix, _GLIBCXX_USE_CXX11_ABI=$torch_abi, cuda $torch_cuda)"
fi
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "torch: $torch_about"
  echo "nvcc: $("$nvcc" --version | tail -1)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv 2>&1 || true
  echo "cpu: $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo || true)"
  echo "cmake: $(cmake --version | head -1); compiler: $(${CXX:-c++} --version | head -1)"
} > "$out/environment.txt"
cat "$out/environment.txt"

deps=${BRANCHGRPO_DEPS:-$repo/build-gpu-deps}
if [[ -d "$deps/usr" ]]; then
  deps=$(cd "$deps" && pwd)
  prefix_path="${prefix_path:+$prefix_path;}$deps/usr"
  export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CPATH="$deps/usr/include${CPATH:+:$CPATH}"
  echo "using the staged dependencies in $deps"
fi

# The tests need Catch2 (Debian's libcatch2-dev, or staged): only test_torch_keyed_step is built from them.
tests=OFF
[[ -f /usr/include/catch2/catch.hpp || -f "${CPATH%%:*}/catch2/catch.hpp" ]] && tests=ON
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
# The H200 is sm_90; one architecture keeps the build short.
echo "configuring and building cuda_kernel_check and branchgrpo_cli in $build (log: $out/build.log)"
if ! { cmake -S "$repo" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
         -DBRANCHGRPO_WARNINGS_AS_ERRORS=OFF "-DCMAKE_CUDA_COMPILER=$nvcc" \
         -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-90}" ${prefix_path:+"-DCMAKE_PREFIX_PATH=$prefix_path"} \
         ${abi_flags:+"-DCMAKE_CXX_FLAGS=$abi_flags"} -DBRANCHGRPO_BUILD_TESTS="$tests" -DBRANCHGRPO_BUILD_EXAMPLES=OFF \
         -DBRANCHGRPO_BUILD_BENCHMARKS=OFF &&
       cmake --build "$build" --target cuda_kernel_check -j "$(nproc)"; } > "$out/build.log" 2>&1; then
  tail -40 "$out/build.log" >&2
  echo "bench/gpu_kernels.sh: the build of cuda_kernel_check failed (see $out/build.log)" >&2
  exit 1
fi
grep -E "branchgrpo: |LibTorch" "$out/build.log" | head -20 || true

read -r -a check_extra <<< "${CHECK_ARGS:-}"
echo "running: cuda_kernel_check --reps 50 ${check_extra[*]}"
status=0
"$build/bin/cuda_kernel_check" --reps 50 "${check_extra[@]}" 2>&1 | tee "$out/cuda_kernel_check.txt" || status=$?
if ((status != 0)); then
  echo "bench/gpu_kernels.sh: cuda_kernel_check failed (exit $status, see $out/cuda_kernel_check.txt)" >&2
  exit 1
fi

# The FLUX iteration harness on the GPU: only a CUDA LibTorch can put the model there.
if [[ "$torch_cuda" != 1 ]]; then
  echo "no CUDA LibTorch (python3 -c 'import torch' with CUDA): the flux-tiny iteration benchmark is skipped" |
    tee "$out/bench_flux_tiny.txt"
  exit 0
fi
if ! cmake --build "$build" --target branchgrpo_cli -j "$(nproc)" >> "$out/build.log" 2>&1; then
  tail -40 "$out/build.log" >&2
  echo "bench/gpu_kernels.sh: the build of branchgrpo_cli failed (see $out/build.log)" >&2
  exit 1
fi
grep -q "uses the CUDA kernels" "$out/build.log" && echo "the torch backend uses the CUDA kernels" ||
  echo "note: the build did not link the CUDA kernels into the torch backend (see $out/build.log)"
# The rollout's device step through LibTorch (torch_backend::keyed_sde_step on CUDA tensors: the fused kernel) against
# the CPU's, bit for bit; a Catch2 test, built when Catch2 is there.
if cmake --build "$build" --target test_torch_keyed_step -j "$(nproc)" >> "$out/build.log" 2>&1; then
  echo "running: test_torch_keyed_step (the torch backend's keyed SDE step on the GPU against the CPU)"
  "$build/tests/test_torch_keyed_step" 2>&1 | tail -3 | tee "$out/torch_keyed_step.txt" ||
    { echo "bench/gpu_kernels.sh: test_torch_keyed_step failed" >&2; status=1; }
else
  echo "test_torch_keyed_step not built (no Catch2? see $out/build.log)" | tee "$out/torch_keyed_step.txt"
fi
args=(bench iteration --model flux-tiny --device cuda --dtype float32 --prompts 8 --iters 3 --warmup 1
      --batching-repeats 1 --json-file "$out/bench_flux_tiny.json")
read -r -a extra <<< "${BENCH_ARGS:-}"
echo "running: branchgrpo ${args[*]} ${extra[*]}"
"$build/bin/branchgrpo" "${args[@]}" "${extra[@]}" 2>&1 | tee "$out/bench_flux_tiny.txt"
# The Python package on the GPU: built into $out/python-package when its build tools are there.
if python3 -c 'import nanobind, scikit_build_core' 2> /dev/null &&
  python3 -m pip install --quiet --no-build-isolation --no-deps --target "$out/python-package" "$repo" \
    >> "$out/build.log" 2>&1; then
  echo "running: python3 bench/python_device_check.py --device cuda"
  PYTHONPATH="$out/python-package" python3 "$repo/bench/python_device_check.py" --device cuda 2>&1 |
    tee "$out/python_device_check.txt" || { echo "bench/gpu_kernels.sh: python_device_check failed" >&2; status=1; }
else
  echo "the Python package could not be built here (needs nanobind and scikit-build-core; see $out/build.log):" \
    "python_device_check skipped" | tee "$out/python_device_check.txt"
fi
echo "wrote $out/cuda_kernel_check.txt, $out/torch_keyed_step.txt, $out/bench_flux_tiny.txt," \
  "$out/bench_flux_tiny.json and $out/python_device_check.txt"
exit $status
