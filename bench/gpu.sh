#!/usr/bin/env bash
# bench/gpu.sh: the GPU section of docs/performance.md in one run. Builds `branchgrpo` against the machine's
# PyTorch (its LibTorch, CMake prefix and C++ ABI) and runs the iteration harness on a FLUX.1-dev-size
# transformer (random weights: the GPU machine has no network) in bfloat16 on CUDA:
#
#   branchgrpo bench iteration --model flux --flux-config dev --dtype bfloat16 --device cuda ...
#
# and writes into $OUT (else ./out/gpu): bench_flux_dev.txt (the table), bench_flux_dev.json (one object keyed by
# variant: seconds_per_iter, time_ratio_vs_dance, overhead_fraction, batching_speedup, peak_memory_bytes,
# bf16_peak_fraction, ...), environment.txt (GPU, driver, torch) and build.log; then the same harness on a
# Wan2.1-T2V-1.3B-size video transformer (random weights, bf16; bench_wan.txt, bench_wan.json); the shipped video
# model trained with float32 masters, all-bf16 and classifier-free guidance (cfg_precision.txt); on a machine with two
# GPUs or more also distributed.txt (the NCCL variant: data-parallel training on every GPU against one, via torchrun;
# then full fine-tuning sharded with ZeRO-1 and ZeRO-2 against unsharded: time, measured per-rank bytes, reward).
#
# Usage, on the GPU machine from the repository root:
#   bench/gpu.sh                     # the default size (below), ~10 minutes including the build
#   BENCH_ARGS="--height 512 --width 512" bench/gpu.sh     # extra / overriding harness options (FLUX run)
#   WAN_BENCH_ARGS="--iters 2" bench/gpu.sh                # the same for the Wan run
# The machine may lack the tool's C++ dependencies (CLI11, nlohmann-json, toml++, TurboJPEG, Random123, libpng, Catch2). Stage them
# first on a Debian machine that has them (scripts/setup.sh) and take the folder along:
#   bench/gpu.sh --stage-deps build-gpu-deps      # here: copies headers, libraries and CMake files
#   BRANCHGRPO_DEPS=build-gpu-deps bench/gpu.sh   # there (default: build-gpu-deps when it exists)
#
# Exit status: 0 done; 2 no PyTorch (or no CUDA) on this machine; other: the build or the run failed (see the logs).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [[ "${1:-}" == "--stage-deps" ]]; then
  dest=${2:?usage: bench/gpu.sh --stage-deps DIR}
  mkdir -p "$dest"
  dest=$(cd "$dest" && pwd)
  # Headers and CMake package files keep /usr's layout, so the packages' relative prefixes resolve under $dest.
  copy() {
    for path in "$@"; do
      # mkdir + cp rather than cp --parents, which fails on some overlay file systems ("usr/lib/cmake: No such file").
      if [[ -e "$path" ]]; then
        mkdir -p "$dest/stage$(dirname "$path")" && cp -a "$path" "$dest/stage$(dirname "$path")/" && echo "staged $path"
      else echo "missing $path" >&2; fi
    done
  }
  rm -rf "$dest/stage" && mkdir -p "$dest/stage"
  copy /usr/include/Random123 /usr/include/CLI /usr/share/cmake/CLI11 /usr/include/nlohmann /usr/share/cmake/nlohmann_json \
       /usr/include/toml++ /usr/lib/x86_64-linux-gnu/cmake/tomlplusplus /usr/include/turbojpeg.h
  copy /usr/lib/x86_64-linux-gnu/libtomlplusplus.so* /usr/lib/x86_64-linux-gnu/libturbojpeg.so*
  # libpng (the tool's PNG writer, REQUIRED) with zlib's headers, and Catch2 for test_torch_keyed_step
  # (bench/gpu_kernels.sh): the GPU image has neither's development files.
  copy /usr/include/png.h /usr/include/pngconf.h /usr/include/pnglibconf.h /usr/include/libpng16 /usr/include/zlib.h \
       /usr/include/zconf.h /usr/lib/x86_64-linux-gnu/libpng*.so* /usr/lib/x86_64-linux-gnu/libz.so* \
       /usr/include/catch2 /usr/lib/cmake/Catch2 /usr/lib/libCatch2WithMain.a
  rm -rf "$dest/usr" && mv "$dest/stage/usr" "$dest/usr" && rmdir "$dest/stage"
  du -sh "$dest"
  exit 0
fi

out=${OUT:-$repo/out/gpu}
build=${BUILD_DIR:-$repo/build-gpu}
mkdir -p "$out"

if ! python3 -c 'import torch' 2>/dev/null; then
  echo "bench/gpu.sh: PyTorch is not installed here (python3 -c 'import torch' failed): no LibTorch to build against" >&2
  exit 2
fi
read -r torch_prefix torch_abi torch_version cuda_ok < <(python3 -c '
import torch
print(torch.utils.cmake_prefix_path, int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.__version__, int(torch.cuda.is_available()))')
if [[ "$cuda_ok" != 1 ]]; then
  echo "bench/gpu.sh: torch $torch_version sees no CUDA device" >&2
  exit 2
fi
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "torch: $torch_version (cmake prefix $torch_prefix, _GLIBCXX_USE_CXX11_ABI=$torch_abi)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || true
  echo "cpu: $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo || true)"
  echo "cmake: $(cmake --version | head -1); compiler: $(${CXX:-c++} --version | head -1)"
} > "$out/environment.txt"
cat "$out/environment.txt"

deps=${BRANCHGRPO_DEPS:-$repo/build-gpu-deps}
prefix_path="$torch_prefix"
if [[ -d "$deps/usr" ]]; then
  deps=$(cd "$deps" && pwd)
  prefix_path="$torch_prefix;$deps/usr"
  export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CPATH="$deps/usr/include${CPATH:+:$CPATH}"  # find_path of Random123 / turbojpeg fall back to it too
  echo "using the staged dependencies in $deps"
fi

generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
# The pip wheel's ABI must match everything linked with LibTorch (toml++ is a shared library in Debian: ABI 1).
echo "configuring and building branchgrpo_cli in $build (log: $out/build.log)"
if ! { cmake -S "$repo" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
         -DBRANCHGRPO_WARNINGS_AS_ERRORS=OFF "-DCMAKE_PREFIX_PATH=$prefix_path" \
         "-DCMAKE_INCLUDE_PATH=${deps}/usr/include" "-DCMAKE_LIBRARY_PATH=${deps}/usr/lib/x86_64-linux-gnu" \
         "-DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=$torch_abi" -DBRANCHGRPO_BUILD_TESTS=OFF \
         -DBRANCHGRPO_BUILD_EXAMPLES=OFF -DBRANCHGRPO_BUILD_BENCHMARKS=OFF &&
       cmake --build "$build" --target branchgrpo_cli -j "$(nproc)"; } > "$out/build.log" 2>&1; then
  tail -40 "$out/build.log" >&2
  echo "bench/gpu.sh: the build failed (see $out/build.log)" >&2
  exit 1
fi
grep -E "branchgrpo: |LibTorch" "$out/build.log" | head -20 || true

# The default size fits ~10 minutes on an H100 / H200 with the build: FLUX.1-dev (12 B parameters, bf16 weights,
# LoRA rank 8 on attention and MLP), 256 x 256 pixels (latent 16 x 32 x 32 = 256 image tokens) + 256 text tokens,
# one prompt (one tree of 16 leaves per variant), 20 steps, 1 warm-up + 1 measured iteration per variant, the
# batching speedup from one rollout each way. BENCH_ARGS comes last and overrides any of these.
args=(bench iteration --model flux --flux-config dev --dtype bfloat16 --device cuda --height 256 --width 256
      --text-tokens 256 --prompts 1 --steps 20 --iters 1 --warmup 1 --batching-repeats 1 --max-batch 16
      --peak-tflops "${PEAK_TFLOPS:-989}" --json-file "$out/bench_flux_dev.json")
read -r -a extra <<< "${BENCH_ARGS:-}"
echo "running: branchgrpo ${args[*]} ${extra[*]}"
set -o pipefail
"$build/bin/branchgrpo" "${args[@]}" "${extra[@]}" 2>&1 | tee "$out/bench_flux_dev.txt"
echo "wrote $out/bench_flux_dev.txt and $out/bench_flux_dev.json"

# Wan2.1-T2V-1.3B size (random weights, bf16, LoRA rank 8), latent 16 x 5 x 30 x 52 (17 frames at 240 x 416: 1950
# video tokens + 512 text tokens), one prompt, 20 steps, 1 warm-up + 1 measured iteration per variant. Estimate
# (tools/cli/bench/wan.hpp, wan_forward_flops): 5.92 TFLOP per forward row; one round of the five variants is
# ~2850 forward-equivalents (dance 305 + 2 x 320, branch 203 + 2 x 218, widpru 203 + 2 x 130, deppru 203 + 2 x 154,
# mix ~203 + 2 x 42) = 16.9 PFLOP, two rounds 34 PFLOP, the batching rollouts (1117 rows each way) 13 PFLOP: ~47
# PFLOP, ~2 minutes at 400 TFLOP/s (3 at 250) after the FLUX run. --max-batch 4: an update row keeps roughly 14 GB
# of activations (30 blocks x ~0.5 GB at 1950 tokens, float32 norms and residual), so 4 rows ~56 GB of the 141.
wan_args=(bench iteration --model wan --dtype bfloat16 --device cuda --latent 16,5,30,52 --prompts 1 --steps 20
          --iters 1 --warmup 1 --batching-repeats 1 --max-batch 4 --peak-tflops "${PEAK_TFLOPS:-989}"
          --json-file "$out/bench_wan.json")
read -r -a wan_extra <<< "${WAN_BENCH_ARGS:-}"
echo "running: branchgrpo ${wan_args[*]} ${wan_extra[*]}"
"$build/bin/branchgrpo" "${wan_args[@]}" "${wan_extra[@]}" 2>&1 | tee "$out/bench_wan.txt"
echo "wrote $out/bench_wan.txt and $out/bench_wan.json"

# Classifier-free guidance and precision (docs/wan.md, docs/torch.md "Precision"): the shipped moving-shapes model
# trained on the GPU in bfloat16 three ways, 6 iterations each: float32 master weights (the default, autocast and
# TF32 on), all-bf16 (model.master_weights = false), and masters under classifier-free guidance (scale 3, the
# empty prompt as the negative: zeros in the shapes word-vector space). Writes cfg_precision.txt: seconds per
# iteration after the first, each variant's last reward, and the guidance run's time against the unguided one.
precision=$out/cfg_precision
rm -rf "$precision" && mkdir -p "$precision"
python3 - "$repo/models/moving-shapes-tiny/prompts.safetensors" "$precision/prompts_cfg.safetensors" <<'PY'
import json, struct, sys
source, target = sys.argv[1], sys.argv[2]
with open(source, "rb") as f:
    (size,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(size))
    data = f.read()
context = header["context"]
assert context["dtype"] == "F32", context["dtype"]
begin, end = context["data_offsets"]
_, tokens, width = context["shape"]
zeros = bytes(4 * tokens * width)
metadata = dict(header.get("__metadata__", {}), negative_prompts="", family="wan", encoder="shapes")
out = {"__metadata__": metadata,
       "context": {"dtype": "F32", "shape": context["shape"], "data_offsets": [0, end - begin]},
       "negative_context": {"dtype": "F32", "shape": [1, tokens, width],
                            "data_offsets": [end - begin, end - begin + len(zeros)]}}
text = json.dumps(out).encode()
text += b" " * (-len(text) % 8)
with open(target, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data[begin:end] + zeros)
PY
# train_config FILE MODEL_DIR TREES OUTPUT_DIR [MODEL_KEYS] [DATA_KEYS]: a short run (6 iterations, LoRA rank 8, no
# checkpoints or grids) of a shipped model on CUDA.
train_config() {
  cat > "$1" <<TOML
[model]
dir = "$2"
device = "cuda"
${5:-}
[data]
prompts_per_iteration = $3
${6:-}
[lora]
rank = 8
[run]
iterations = 6
checkpoint_every = 0
grid_every = 0
output_dir = "$4"
TOML
}
precision_config() {  # NAME MODEL_KEYS DATA_KEYS
  train_config "$precision/$1.toml" "$repo/models/moving-shapes-tiny" 8 "$precision/$1" "dtype = \"bfloat16\"
$2" "$3"
}
precision_config masters "" ""
precision_config all_bf16 "master_weights = false" ""
precision_config cfg_masters "guidance_scale = 3.0" "embeddings = \"$precision/prompts_cfg.safetensors\""
for variant in masters all_bf16 cfg_masters; do
  "$build/bin/branchgrpo" train --config "$precision/$variant.toml" --quiet > "$precision/$variant.log" 2>&1 ||
    { tail -5 "$precision/$variant.log" >&2; echo "bench/gpu.sh: the $variant run failed" >&2; exit 1; }
done
python3 - "$precision" <<'PY' | tee "$out/cfg_precision.txt"
import json, os, sys
root = sys.argv[1]
print("moving-shapes-tiny on CUDA, bfloat16, LoRA rank 8, 8 trees per iteration, 6 iterations")
seconds = {}
for variant in ("masters", "all_bf16", "cfg_masters"):
    rows = [json.loads(line) for line in open(os.path.join(root, variant, "metrics.jsonl"))]
    seconds[variant] = sum(r["seconds"] for r in rows[1:]) / len(rows[1:])
    print(f"{variant}: {seconds[variant]:.3f} s / iteration, last reward_mean {rows[-1]['reward_mean']:.4f}")
print(f"guidance costs {seconds['cfg_masters'] / seconds['masters']:.2f}x the unguided iteration "
      f"(one call of 2 rows per row); masters cost {seconds['masters'] / seconds['all_bf16']:.2f}x all-bf16")
PY

# The NCCL variant (docs/distributed.md), on a machine with two GPUs or more: the shipped shapes model trained on
# one GPU, then on every GPU (torchrun, one rank per GPU: NCCL for the gradients when LibTorch has it, else Gloo
# through host copies, as the build log's "c10d" line says); both runs train 8 trees per GPU per iteration. Writes
# distributed.txt: seconds per iteration (iterations after the first) and the scaling efficiency.
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
if ((gpus < 2)); then
  echo "one GPU: the NCCL variant needs two or more (skipped)" | tee "$out/distributed.txt"
  exit 0
fi
grep -E "c10d" "$out/build.log" | head -3 | tee "$out/distributed.txt" || true
dist=$out/distributed
rm -rf "$dist" && mkdir -p "$dist"
# config NAME TREES -> $dist/NAME.toml
config() { train_config "$dist/$1.toml" "$repo/models/shapes-tiny" "$2" "$dist/$1"; }
seconds() {  # mean seconds per iteration after the first, from a run's metrics.jsonl
  python3 -c 'import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])][1:]
print(sum(r["seconds"] for r in rows) / len(rows))' "$1"
}
trees=$((8 * gpus))
config one_gpu "$trees" && config all_gpus "$trees"
"$build/bin/branchgrpo" train --config "$dist/one_gpu.toml" --quiet > "$dist/one_gpu.log" 2>&1
python3 -m torch.distributed.run --standalone --nproc_per_node "$gpus" --no_python \
  "$build/bin/branchgrpo" train --config "$dist/all_gpus.toml" --quiet --timeout 120 > "$dist/all_gpus.log" 2>&1
one=$(seconds "$dist/one_gpu/metrics.jsonl")
all=$(seconds "$dist/all_gpus/metrics.jsonl")
{
  echo "shapes-tiny, LoRA rank 8, $trees trees per iteration (dense tree, 20 steps), 6 iterations"
  echo "1 GPU: $one s / iteration"
  echo "$gpus GPUs: $all s / iteration"
  python3 -c "import sys; one, n, all = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]); print(f'speedup {one / all:.2f} of {n} (efficiency {one / all / n:.0%})')" "$one" "$gpus" "$all"
} | tee -a "$out/distributed.txt"

# The sharded variant (docs/distributed.md, "Sharded training"): full fine-tuning (LoRA off) of the shipped shapes
# model on every GPU, unsharded and with optimizer.sharding = "optimizer" / "gradients" (ZeRO-1 / ZeRO-2 over NCCL
# where LibTorch has it), 8 trees per GPU, a sharded checkpoint at the end; each rank's measured training-state bytes
# come from the metrics row (memory/rank<r>/*). Appends to distributed.txt: seconds per iteration, rank 0's optimizer
# state and gradient peak against the unsharded run's, and the last iteration's mean reward (the same experiment:
# equal to rounding).
sharded_config() {  # NAME SHARDING
  train_config "$dist/$1.toml" "$repo/models/shapes-tiny" "$trees" "$dist/$1" "" ""
  sed -i "/^\[lora\]\$/a enabled = false" "$dist/$1.toml"
  [ "$2" = none ] || printf '[optimizer]\nsharding = "%s"\n' "$2" >> "$dist/$1.toml"
}
for sharding in none optimizer gradients; do
  sharded_config "full_$sharding" "$sharding"
  python3 -m torch.distributed.run --standalone --nproc_per_node "$gpus" --no_python \
    "$build/bin/branchgrpo" train --config "$dist/full_$sharding.toml" --quiet --timeout 120 \
    > "$dist/full_$sharding.log" 2>&1 || { tail -5 "$dist/full_$sharding.log" >&2; echo "bench/gpu.sh: full_$sharding failed" >&2; }
done
python3 - "$dist" "$gpus" <<'PY' | tee -a "$out/distributed.txt"
import json, os, sys
root, gpus = sys.argv[1], int(sys.argv[2])
print(f"full fine-tuning of shapes-tiny on {gpus} GPUs (rank 0's measured bytes, last iteration)")
base = None
for sharding in ("none", "optimizer", "gradients"):
    path = os.path.join(root, f"full_{sharding}", "metrics.jsonl")
    if not os.path.exists(path):
        print(f"{sharding}: no metrics (see full_{sharding}.log)")
        continue
    rows = [json.loads(line) for line in open(path)]
    seconds = sum(r["seconds"] for r in rows[1:]) / max(len(rows) - 1, 1)
    last = rows[-1]
    optimizer, gradients = last["memory/rank0/optimizer"], last["memory/rank0/gradients_peak"]
    base = base or (optimizer, gradients)
    print(f"{sharding}: {seconds:.3f} s / iteration, optimizer state {optimizer / 1e6:.2f} MB "
          f"(x{optimizer / base[0]:.3f}), gradient peak {gradients / 1e6:.2f} MB (x{gradients / base[1]:.3f}), "
          f"last reward_mean {last['reward_mean']:.6f}")
PY
