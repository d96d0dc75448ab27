#pragma once
// `branchgrpo bench iteration --model wan-tiny | wan`: the iteration harness (bench/harness.hpp) on the Wan2.1
// text-to-video transformer over LibTorch (docs/performance.md). This header is torch-free (the FLOP count and
// the configs, unit-tested without LibTorch); bench/wan.cpp, built only with LibTorch, TurboJPEG and toml++
// (tools/CMakeLists.txt defines BRANCHGRPO_CLI_BENCH_FLUX), holds the run.
#include <array>
#include <cstdint>

#include "branchgrpo/model_specs/wan/config.hpp"

namespace branchgrpo::cli {

struct bench_options;

/// The transformer of `--model wan-tiny`: wan_config::tiny()'s shape with 16 latent channels in and out (the
/// velocity must have the latent's shape), dim 64 (2 heads of 32), FFN 128, 2 blocks, text 32 wide and padded to
/// 16 tokens. Small enough for a few seconds per iteration on 2 CPU cores at the default --prompts.
/// Example: wan_bench_tiny_config().rope_axes() == {12, 10, 10}; validate() passes.
inline wan_config wan_bench_tiny_config() {
  return {.in_dim = 16,
          .out_dim = 16,
          .dim = 64,
          .ffn_dim = 128,
          .heads = 2,
          .layers = 2,
          .freq_dim = 32,
          .text_dim = 32,
          .text_len = 16};
}

/// The default latents [C, F, H, W]: wan-tiny 16 x 4 x 8 x 8 (64 tokens); wan 16 x 5 x 30 x 52 (17 frames at
/// 240 x 416 pixels through the VAE's 4 x 8 x 8 compression; 1950 tokens).
inline constexpr std::array<std::int64_t, 4> wan_tiny_latent = {16, 4, 8, 8};
inline constexpr std::array<std::int64_t, 4> wan_latent = {16, 5, 30, 52};

/// Tokens of a latent [C, F, H, W]: the patch grid, each side rounded up (the transformer pads it).
/// Example: t2v_1_3b(), {16, 5, 30, 52} -> 5 x 15 x 26 = 1950; {16, 1, 3, 3} -> 1 x 2 x 2 = 4.
inline std::int64_t wan_tokens(const wan_config& c, const std::array<std::int64_t, 4>& latent) {
  std::int64_t n = 1;
  for (std::size_t a = 0; a < 3; ++a) n *= (latent[a + 1] + c.patch[a] - 1) / c.patch[a];
  return n;
}

/// Multiply-adds x 2 of one forward of one row of the Wan transformer over `tokens` video tokens: the linear
/// layers (per token, or per row for the time embedding and projection) and the attention products q k^T and
/// weights v; norms, RoPE, modulation sums and activations are not counted. The text is padded to text_len
/// tokens, all embedded and all attended (as the official code), so the count depends on text_len, not on a
/// prompt's length. With N tokens, T = text_len, d = dim, m = ffn_dim, P = patch volume:
///   patch embedding 2 N (in_dim P) d, time 2 (freq_dim d + d d) + 2 d 6d, text 2 T (text_dim d + d d);
///   per block: self-attention q, k, v, o 8 N d^2 and products 4 N^2 d; cross-attention q, o 4 N d^2,
///   k, v 4 T d^2, products 4 N T d; FFN 4 N d m;  head 2 N d (out_dim P).
/// Example: t2v_1_3b() at 1950 tokens -> 5.916e12 (30 blocks of 1.969e11: the FFN 55 %, projections 30 %,
///   self-attention products 12 %); wan_config::tiny() at 1 token -> 229760 (tests/unit/test_bench_wan.cpp).
/// @pre validate(c), tokens >= 1.
inline double wan_forward_flops(const wan_config& c, std::int64_t tokens) {
  const auto d = static_cast<double>(c.dim), m = static_cast<double>(c.ffn_dim);
  const auto n = static_cast<double>(tokens), t = static_cast<double>(c.text_len);
  const auto p = static_cast<double>(c.patch_volume());
  double f = 2 * n * static_cast<double>(c.in_dim) * p * d;                 // patch embedding
  f += 2 * (static_cast<double>(c.freq_dim) * d + d * d) + 2 * d * 6 * d;   // time embedding, projection
  f += 2 * t * (static_cast<double>(c.text_dim) * d + d * d);               // text embedding
  const double per_block = 8 * n * d * d + 4 * n * n * d                    // self-attention
                           + 4 * n * d * d + 4 * t * d * d + 4 * n * t * d  // cross-attention
                           + 4 * n * d * m;                                 // FFN
  f += static_cast<double>(c.layers) * per_block;
  f += 2 * n * d * static_cast<double>(c.out_dim) * p;  // head
  return f;
}

/// Runs dance and the BranchGRPO variants alternately on a Wan transformer with random weights and prints the
/// report (the columns of flux's: analytic FLOPs, fraction of --peak-tflops, peak CUDA memory):
///   wan-tiny  wan_bench_tiny_config() on the default latent 16 x 4 x 8 x 8 (or --latent C,F,H,W);
///   wan       Wan2.1-T2V-1.3B's sizes on 16 x 5 x 30 x 52 (or --latent), meant for a GPU in bfloat16.
/// Random text features [P, text_len, text_dim] (--text-tokens does not apply: Wan pads every prompt to text_len);
/// the variants share the frozen base weights and each trains its own LoRA adapters (rank --rank, AdamW lr 1e-3);
/// reward -mean(x^2) of the leaf latents. Throws branchgrpo::invalid_input naming the value for a bad option.
/// Example: `branchgrpo bench iteration --model wan-tiny --iters 1 --warmup 0 --prompts 1 --json` ->
///   {"branch":{...,"rollout_evaluations":203.0,...},"dance":{...,"forward_flops_per_row":...},...}.
void run_wan_iteration_bench(const bench_options& options);

}  // namespace branchgrpo::cli
