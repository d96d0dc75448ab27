#pragma once
// `branchgrpo bench iteration --model sd3-tiny | sd3`: the iteration harness (bench/harness.hpp) on the SD3.5
// MMDiT-X transformer over LibTorch (docs/performance.md). This header is torch-free (the FLOP count and the
// configs, unit-tested without LibTorch); bench/sd3.cpp, built only with LibTorch, TurboJPEG and toml++
// (tools/CMakeLists.txt defines BRANCHGRPO_CLI_BENCH_FLUX), holds the run.
#include <cstdint>

#include "branchgrpo/model_specs/sd3/config.hpp"

namespace branchgrpo::cli {

struct bench_options;

/// Multiply-adds x 2 of one forward of one row of the SD3 transformer over `image_tokens` patches and
/// `text_tokens` prompt tokens: the linear layers (per token, or per row for the embedders and the modulations) and
/// the attention products q k^T and weights v; norms, RoPE-free position adds and activations are not counted.
/// With N image and L text tokens, S = N + L, d = hidden, P = in_channels patch^2:
///   embedders 2 N P d + 2 L context_in d + 2 (256 d + d d) + 2 (pooled_in d + d d);
///   per block: modulations 2 d 6d per stream (9d for a dual-attention image stream, 2d for the last block's
///   context), joint q, k, v 6 S d^2 and products 4 S^2 d, output projections 2 N d^2 + 2 L d^2 (no context one in
///   the last block), MLPs 16 N d^2 + 16 L d^2 (likewise); a dual-attention block adds the image stream's own
///   attention 8 N d^2 + 4 N^2 d;  final layer 2 d 2d + 2 N d P.
/// Example: sd3_config::tiny()-sized shapes are checked by hand in tests/unit/test_bench_sd3.cpp.
/// @pre validate(c), image_tokens >= 1, text_tokens >= 0.
inline double sd3_forward_flops(const sd3_config& c, std::int64_t image_tokens, std::int64_t text_tokens) {
  const auto d = static_cast<double>(c.hidden), n = static_cast<double>(image_tokens);
  const auto l = static_cast<double>(text_tokens), s = n + l;
  const auto p = static_cast<double>(c.in_channels * c.patch * c.patch);
  double f = 2 * n * p * d + 2 * l * static_cast<double>(c.context_in) * d;
  f += 2 * (256 * d + d * d) + 2 * (static_cast<double>(c.pooled_in) * d + d * d);
  for (std::int64_t b = 0; b < c.depth; ++b) {
    const bool last = b + 1 == c.depth, dual = b < c.dual_attention_layers;
    f += 2 * d * (dual ? 9 : 6) * d + 2 * d * (last ? 2 : 6) * d;   // modulations
    f += 6 * s * d * d + 4 * s * s * d;                             // joint q, k, v and products
    f += 2 * (last ? n : s) * d * d + 16 * (last ? n : s) * d * d;  // output projections, MLPs
    if (dual) f += 8 * n * d * d + 4 * n * n * d;                   // the image stream's own attention
  }
  return f + 2 * d * 2 * d + 2 * n * d * p;
}

/// Runs dance and the BranchGRPO variants alternately on an SD3 transformer with random weights and prints the
/// report (flux's columns: analytic FLOPs, fraction of --peak-tflops, peak CUDA memory):
///   sd3-tiny  named_sd3_config("sd3-tiny") on a 16 x 16 latent (or --latent C,H,W);
///   sd3       SD3.5-Medium's sizes on the latent of --height x --width pixels (/8; default 256 x 256), meant for a
///             GPU in bfloat16.
/// Random prompt features [P, --text-tokens, context_in] and pooled vectors [P, pooled_in]; the variants share the
/// frozen base weights and each trains its own LoRA adapters (rank --rank, AdamW lr 1e-3); reward -mean(x^2) of
/// the leaf latents. Throws branchgrpo::invalid_input naming the value for a bad option.
/// Example: `branchgrpo bench iteration --model sd3-tiny --iters 1 --warmup 0 --prompts 1 --json` ->
///   {"branch":{...,"rollout_evaluations":...},"dance":{...,"forward_flops_per_row":...},...}.
void run_sd3_iteration_bench(const bench_options& options);

}  // namespace branchgrpo::cli
