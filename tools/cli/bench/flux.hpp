#pragma once
// `branchgrpo bench iteration --model flux-tiny | flux`: the iteration harness (bench/harness.hpp) on the FLUX
// transformer over LibTorch (docs/performance.md). Built only with LibTorch, TurboJPEG and toml++
// (tools/CMakeLists.txt defines BRANCHGRPO_CLI_BENCH_FLUX); commands/bench.cpp calls it.

namespace branchgrpo::cli {

struct bench_options;

/// Runs dance and the BranchGRPO variants alternately on a FLUX transformer and prints the report:
///   flux-tiny  the shipped shapes model (models/shapes-tiny, or --model-dir), each variant with its own copy
///              of the weights + LoRA (rank --rank) + autograd policy (AdamW lr 1e-3, as `branchgrpo demo`);
///              reward alignment + 0.1 x jpeg_compressibility (the demo's).
///   flux       random weights of --flux-config (dev, schnell, tiny) on --device in --dtype, random prompt
///              embeddings (--text-tokens per prompt), latent --latent C,H,W or --height / --width pixels / 8;
///              the variants share the frozen base weights and each trains its own LoRA adapters; reward
///              -mean(x^2) of the leaf latents (there is no decoder).
/// Both report the toy's columns plus the analytic transformer FLOPs, the fraction of --peak-tflops and the
/// peak CUDA memory. Throws branchgrpo::invalid_input naming the value for a bad option.
/// Example: `branchgrpo bench iteration --model flux-tiny --iters 1 --prompts 1 --json` ->
///   {"branch":{...,"bf16_peak_fraction":...,"peak_memory_bytes":null,...},"dance":{...},...}.
void run_flux_iteration_bench(const bench_options& options);

}  // namespace branchgrpo::cli
