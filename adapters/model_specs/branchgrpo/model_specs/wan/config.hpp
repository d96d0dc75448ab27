#pragma once
// Hyperparameters of the Wan2.1 text-to-video transformer (a DiT over 3-D patches of video latents: per block
// self-attention with 3-axis RoPE, cross-attention to umT5 text features, a GELU FFN, all modulated by the
// timestep). Torch-free, so the `branchgrpo weights` command can check checkpoints without LibTorch.
//
//   wan_config::t2v_1_3b()  Wan2.1-T2V-1.3B: dim 1536, FFN 8960, 12 heads (128 wide), 30 blocks.
//   wan_config::t2v_14b()   Wan2.1-T2V-14B: dim 5120, FFN 13824, 40 heads (128 wide), 40 blocks.
//   wan_config::tiny()      for tests: 4 latent channels in, 3 out, dim 40, 2 heads of 20 (RoPE 8 / 6 / 6),
//                           FFN 56, 2 blocks, text 24 wide and padded to 8 tokens, time embedding 32 wide.
// Both released configs share in_dim = out_dim = 16 (VAE latent channels), patch (1, 2, 2), freq_dim 256,
// text_dim 4096 (umT5-XXL), text_len 512, eps 1e-6, RoPE theta 10000, q/k RMSNorm and the cross-attention
// LayerNorm (official qk_norm = cross_attn_norm = True); this implementation always has both.
#include <array>
#include <cmath>
#include <cstdint>

#include "branchgrpo/core/error.hpp"

namespace branchgrpo {

/// One Wan2.1 T2V transformer shape.
/// Example: wan_config::t2v_1_3b().head_dim() == 128, .rope_axes() == {44, 42, 42}, .patch_volume() == 4;
///   wan_config::tiny().rope_axes() == {8, 6, 6}.
/// @pre validate(config) passes before a model is built from it.
struct wan_config {
  std::int64_t in_dim = 16;   ///< latent channels in
  std::int64_t out_dim = 16;  ///< latent channels out (the velocity)
  std::int64_t dim = 1536;
  std::int64_t ffn_dim = 8960;
  std::int64_t heads = 12;
  std::int64_t layers = 30;
  std::int64_t freq_dim = 256;                    ///< width of the sinusoidal time embedding
  std::int64_t text_dim = 4096;                   ///< text encoder features (umT5-XXL)
  std::int64_t text_len = 512;                    ///< the context is zero-padded to this many tokens
  std::array<std::int64_t, 3> patch = {1, 2, 2};  ///< (frames, rows, columns) per token
  double eps = 1e-6;                              ///< LayerNorm and RMSNorm epsilon
  double rope_theta = 10000;

  static wan_config t2v_1_3b() { return {}; }
  static wan_config t2v_14b() { return {.dim = 5120, .ffn_dim = 13824, .heads = 40, .layers = 40}; }
  static wan_config tiny() {
    return {.in_dim = 4,
            .out_dim = 3,
            .dim = 40,
            .ffn_dim = 56,
            .heads = 2,
            .layers = 2,
            .freq_dim = 32,
            .text_dim = 24,
            .text_len = 8};
  }

  [[nodiscard]] std::int64_t head_dim() const { return dim / heads; }
  /// The head dim split between the (frame, row, column) RoPE axes as Wan splits it: with d = head_dim,
  /// rows and columns get 2 (d / 6) dims each and frames the rest, d - 4 (d / 6) (128 -> 44 / 42 / 42).
  [[nodiscard]] std::array<std::int64_t, 3> rope_axes() const {
    const std::int64_t d = head_dim(), side = 2 * (d / 6);
    return {d - 2 * side, side, side};
  }
  [[nodiscard]] std::int64_t patch_volume() const { return patch[0] * patch[1] * patch[2]; }

  friend bool operator==(const wan_config&, const wan_config&) = default;
};

/// Upper limits of a wan_config's sizes, far above any released Wan (dim 5120, 40 blocks, text 512 x 4096) but
/// low enough that a corrupt or hostile config is refused before anything of that size is built or enumerated.
inline constexpr std::int64_t wan_max_width = 65536;  ///< in_dim, out_dim, dim, ffn_dim, freq_dim, text_dim
inline constexpr std::int64_t wan_max_depth = 1024;   ///< layers
inline constexpr std::int64_t wan_max_text_len = 65536;
inline constexpr std::int64_t wan_max_patch = 16;  ///< each patch side

/// Throws invalid_input naming the first inconsistent or out-of-limit field.
/// Example: wan_config{.heads = 7} -> "wan_config: dim 1536 is not divisible by heads 7";
///   wan_config{.layers = 100000000} -> "wan_config: layers 100000000 exceeds the limit 1024".
/// @post dim % heads == 0, head_dim even and >= 6 (every RoPE axis gets at least one pair), every size positive
///   and within its limit, eps finite and positive, rope_theta finite and above 1.
inline void validate(const wan_config& c) {
  const auto in_range = [](std::int64_t value, std::int64_t limit, const char* name) {
    require(value <= limit, "wan_config: ", name, " ", value, " exceeds the limit ", limit);
    require(value >= 1, "wan_config: ", name, " ", value, " must be positive");
  };
  in_range(c.in_dim, wan_max_width, "in_dim");
  in_range(c.out_dim, wan_max_width, "out_dim");
  in_range(c.dim, wan_max_width, "dim");
  in_range(c.ffn_dim, wan_max_width, "ffn_dim");
  in_range(c.freq_dim, wan_max_width, "freq_dim");
  in_range(c.text_dim, wan_max_width, "text_dim");
  in_range(c.text_len, wan_max_text_len, "text_len");
  in_range(c.heads, wan_max_width, "heads");
  in_range(c.layers, wan_max_depth, "layers");
  for (std::size_t i = 0; i < c.patch.size(); ++i)
    require(c.patch[i] >= 1 && c.patch[i] <= wan_max_patch, "wan_config: patch side ", i, " is ", c.patch[i],
            ", expected 1 to ", wan_max_patch);
  require(c.freq_dim % 2 == 0, "wan_config: freq_dim ", c.freq_dim, " must be even (cos and sin halves)");
  require(c.dim % c.heads == 0, "wan_config: dim ", c.dim, " is not divisible by heads ", c.heads);
  require(c.head_dim() % 2 == 0 && c.head_dim() >= 6, "wan_config: head dim ", c.head_dim(),
          " must be even and at least 6 (three RoPE axes of whole pairs)");
  require(std::isfinite(c.eps) && c.eps > 0, "wan_config: eps ", c.eps, " must be finite and positive");
  require(std::isfinite(c.rope_theta) && c.rope_theta > 1, "wan_config: rope_theta ", c.rope_theta,
          " must be finite and above 1");
}

}  // namespace branchgrpo
