#pragma once
// `branchgrpo bench iteration --model wan22-tiny | wan22`: the iteration harness (bench/harness.hpp) on the Wan2.2
// two-expert transformer over LibTorch (docs/performance.md). Its FLOP count per call is one Wan expert's
// (wan_forward_flops, bench/wan.hpp): one expert runs per call. bench/wan.cpp, beside Wan2.1's (built only with
// LibTorch, TurboJPEG and toml++: tools/CMakeLists.txt defines BRANCHGRPO_CLI_BENCH_FLUX), holds the run.

namespace branchgrpo::cli {

struct bench_options;

/// Runs dance and the BranchGRPO variants alternately on a Wan2.2 transformer (two experts switched at the boundary
/// 0.875) with random weights and prints the report (flux's columns):
///   wan22-tiny  two wan_bench_tiny_config() experts on the default latent 16 x 4 x 8 x 8 (or --latent C,F,H,W);
///   wan22       two experts of Wan2.1-T2V-1.3B's sizes (A14B's 14B experts would hold 57 GB of random bf16 weights)
///               on 16 x 5 x 30 x 52 (or --latent), meant for a GPU in bfloat16.
/// Random text features [P, text_len, text_dim]; the variants share the frozen base weights and each trains its own
/// LoRA adapters on both experts (rank --rank, AdamW lr 1e-3); reward -mean(x^2) of the leaf latents. Throws
/// branchgrpo::invalid_input naming the value for a bad option.
/// Example: `branchgrpo bench iteration --model wan22-tiny --iters 1 --warmup 0 --prompts 1 --json` ->
///   {"branch":{...,"rollout_evaluations":203.0,...},"dance":{...},...}.
void run_wan22_iteration_bench(const bench_options& options);

}  // namespace branchgrpo::cli
