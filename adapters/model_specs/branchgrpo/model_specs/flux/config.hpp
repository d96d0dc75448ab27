#pragma once
// Hyperparameters of the FLUX.1 transformer (a rectified-flow MM-DiT: double-stream blocks with joint
// text/image attention, then single-stream blocks over the concatenated sequence). Torch-free, so the
// `branchgrpo weights` command can check checkpoints against a config without LibTorch.
//
//   flux_config::dev()      FLUX.1-dev: 64 packed channels, hidden 3072, 24 heads, 19 + 38 blocks,
//                           RoPE axes {16, 56, 56}, theta 10000, pooled 768, context 4096, guidance embedding.
//   flux_config::schnell()  FLUX.1-schnell: dev without the guidance embedding.
//   flux_config::tiny()     for tests: 16 packed channels (4 latent channels x 2x2), hidden 64, 2 heads of 32,
//                           axes {8, 12, 12}, 2 + 2 blocks, pooled 16, context 32.
#include <array>
#include <cmath>
#include <cstdint>

#include "branchgrpo/core/error.hpp"

namespace branchgrpo {

/// One FLUX transformer shape. `in_channels` counts packed channels: 4 x the latent channels (2x2 patches).
/// Example: flux_config::dev().head_dim() == 128, .mlp_hidden() == 12288, .latent_channels() == 16.
/// @pre validate(config) passes before a model is built from it.
struct flux_config {
  std::int64_t in_channels = 64;
  std::int64_t hidden = 3072;
  std::int64_t heads = 24;
  std::int64_t depth_double = 19;
  std::int64_t depth_single = 38;
  std::array<std::int64_t, 3> rope_axes = {16, 56, 56};  ///< per position axis (index, row, column)
  double rope_theta = 10000;
  std::int64_t vec_in = 768;       ///< pooled text vector (CLIP-L)
  std::int64_t context_in = 4096;  ///< text token features (T5-XXL)
  double mlp_ratio = 4.0;
  bool qkv_bias = true;        ///< bias of the double blocks' fused qkv projections
  bool guidance_embed = true;  ///< distilled guidance embedding (dev yes, schnell no)

  static flux_config dev() { return {}; }
  static flux_config schnell() { return {.guidance_embed = false}; }
  static flux_config tiny() {
    return {.in_channels = 16,
            .hidden = 64,
            .heads = 2,
            .depth_double = 2,
            .depth_single = 2,
            .rope_axes = {8, 12, 12},
            .vec_in = 16,
            .context_in = 32};
  }

  [[nodiscard]] std::int64_t head_dim() const { return hidden / heads; }
  [[nodiscard]] std::int64_t mlp_hidden() const {
    return static_cast<std::int64_t>(static_cast<double>(hidden) * mlp_ratio);
  }
  [[nodiscard]] std::int64_t latent_channels() const { return in_channels / 4; }

  friend bool operator==(const flux_config&, const flux_config&) = default;
};

/// Upper limits of a flux_config's sizes, far above any released FLUX (hidden 3072, 19 + 38 blocks) but low enough
/// that a corrupt or hostile config (a model file's metadata saying depth_double = 100000000) is refused before
/// anything of that size is built or enumerated.
inline constexpr std::int64_t flux_max_width = 65536;  ///< hidden, in_channels, vec_in, context_in, MLP width
inline constexpr std::int64_t flux_max_depth = 1024;   ///< depth_double, depth_single

/// Throws invalid_input naming the first inconsistent or out-of-limit field.
/// Example: flux_config{.heads = 5} -> "flux_config: hidden 3072 is not divisible by heads 5";
///   flux_config{.depth_double = 100000000} -> "flux_config: depth_double 100000000 exceeds the limit 1024".
/// @post hidden % heads == 0, sum(rope_axes) == head_dim, every axis even and positive, in_channels % 4 == 0,
///   every width <= flux_max_width and every depth <= flux_max_depth.
inline void validate(const flux_config& c) {
  const auto at_most = [](std::int64_t value, std::int64_t limit, const char* name) {
    require(value <= limit, "flux_config: ", name, " ", value, " exceeds the limit ", limit);
  };
  at_most(c.in_channels, flux_max_width, "in_channels");
  at_most(c.hidden, flux_max_width, "hidden");
  at_most(c.vec_in, flux_max_width, "vec_in");
  at_most(c.context_in, flux_max_width, "context_in");
  at_most(c.depth_double, flux_max_depth, "depth_double");
  at_most(c.depth_single, flux_max_depth, "depth_single");
  require(c.in_channels >= 4 && c.in_channels % 4 == 0, "flux_config: in_channels ", c.in_channels,
          " is not a positive multiple of 4 (2x2 packing)");
  require(c.hidden >= 1, "flux_config: hidden ", c.hidden, " must be positive");
  require(c.heads >= 1, "flux_config: heads ", c.heads, " must be positive");
  require(c.hidden % c.heads == 0, "flux_config: hidden ", c.hidden, " is not divisible by heads ", c.heads);
  require(c.depth_double >= 0 && c.depth_single >= 0, "flux_config: block counts ", c.depth_double, " and ",
          c.depth_single, " must be non-negative");
  std::int64_t axes = 0;
  for (std::size_t i = 0; i < c.rope_axes.size(); ++i) {
    require(c.rope_axes[i] >= 2 && c.rope_axes[i] % 2 == 0, "flux_config: rope axis ", i, " has odd or empty dim ",
            c.rope_axes[i]);
    axes += c.rope_axes[i];
  }
  require(axes == c.head_dim(), "flux_config: rope axes sum to ", axes, ", head dim is ", c.head_dim());
  require(std::isfinite(c.rope_theta) && c.rope_theta > 1, "flux_config: rope_theta ", c.rope_theta,
          " must be finite and above 1");
  require(c.vec_in >= 1 && c.context_in >= 1, "flux_config: vec_in ", c.vec_in, " and context_in ", c.context_in,
          " must be positive");
  require(std::isfinite(c.mlp_ratio) && c.mlp_ratio > 0 && c.mlp_ratio * static_cast<double>(c.hidden) >= 1 &&
              c.mlp_ratio * static_cast<double>(c.hidden) <= static_cast<double>(flux_max_width),
          "flux_config: mlp_ratio ", c.mlp_ratio, " must give an MLP width in [1, ", flux_max_width, "]");
}

}  // namespace branchgrpo
