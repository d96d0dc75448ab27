#pragma once
// Hyperparameters of the Stable Diffusion 3.5 transformer (MMDiT-X: joint blocks whose image and text streams have
// their own weights and attend jointly; the first `dual_attention_layers` blocks add a second self-attention on the
// image stream), and their "key=value;..." text in a model directory's __metadata__ ("branchgrpo.sd3_config").
// Torch-free, so the `branchgrpo weights` command can check checkpoints against a config without LibTorch.
//
//   sd3_config::medium()  SD3.5 Medium: hidden 1536 in 24 heads of 64, 24 blocks (0..12 with the second
//                         self-attention), learned positions on a 384 x 384 patch grid, q/k RMSNorm.
//   sd3_config::large()   SD3.5 Large: hidden 2432 in 38 heads of 64, 38 blocks, none dual, a 192 x 192 grid.
//   sd3_config::tiny()    for tests: 4 latent channels, hidden 20 in 2 heads of 10, 2 blocks (block 0 dual), a
//                         8 x 8 grid (latents up to 16 x 16), context 16 wide, pooled 12 wide.
// All of them: 2 x 2 patches, MLP 4 x hidden, LayerNorms without affine (eps 1e-6), GELU tanh, q/k RMSNorm eps 1e-6.
//
// Example: format_sd3_config(sd3_config::tiny()) == "in_channels=4;out_channels=4;patch=2;hidden=20;heads=2;depth=2;
//   pos_embed_max_size=8;sample_size=16;context_in=16;pooled_in=12;qk_norm=1;dual_attention_layers=1", and
//   parse_sd3_config of that text gives tiny() back.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <string_view>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/numbers.hpp"

namespace branchgrpo {

/// One SD3.5 transformer shape. The text features enter through `context_embedder` (context_in -> hidden) and the
/// pooled text vector through `y_embedder` (pooled_in -> hidden).
/// Example: sd3_config::medium().head_dim() == 64, .mlp_hidden() == 6144, .patch_features() == 64 (2 x 2 x 16),
///   .dual_attention(12) == true, .dual_attention(13) == false.
/// @pre validate(config) passes before a model is built from it.
struct sd3_config {
  std::int64_t in_channels = 16;   ///< latent channels in (the SD3 VAE's 16)
  std::int64_t out_channels = 16;  ///< latent channels out (the velocity)
  std::int64_t patch = 2;          ///< side of the square patches
  std::int64_t hidden = 1536;      ///< 64 x heads in the released models
  std::int64_t heads = 24;
  std::int64_t depth = 24;                  ///< joint blocks; the last one's text stream is "pre only"
  std::int64_t pos_embed_max_size = 384;    ///< side of the learned position grid (in patches)
  std::int64_t sample_size = 128;           ///< the latent side the model was trained at (1024 px / 8)
  std::int64_t context_in = 4096;           ///< text token features (CLIP-L + CLIP-G padded, then T5-XXL)
  std::int64_t pooled_in = 2048;            ///< pooled text vector (CLIP-L 768 + CLIP-G 1280)
  bool qk_norm = true;                      ///< RMSNorm of q and k per head (eps 1e-6)
  std::int64_t dual_attention_layers = 13;  ///< leading blocks with the image stream's second self-attention

  static sd3_config medium() { return {}; }
  static sd3_config large() {
    return {.hidden = 2432, .heads = 38, .depth = 38, .pos_embed_max_size = 192, .dual_attention_layers = 0};
  }
  static sd3_config tiny() {
    return {.in_channels = 4,
            .out_channels = 4,
            .hidden = 20,
            .heads = 2,
            .depth = 2,
            .pos_embed_max_size = 8,
            .sample_size = 16,
            .context_in = 16,
            .pooled_in = 12,
            .dual_attention_layers = 1};
  }

  [[nodiscard]] std::int64_t head_dim() const { return hidden / heads; }
  [[nodiscard]] std::int64_t mlp_hidden() const { return 4 * hidden; }
  /// Features of one output token: patch x patch x out_channels.
  [[nodiscard]] std::int64_t patch_features() const { return patch * patch * out_channels; }
  /// Whether block `block` has the second self-attention (MMDiT-X).
  [[nodiscard]] bool dual_attention(std::int64_t block) const { return block < dual_attention_layers; }

  friend bool operator==(const sd3_config&, const sd3_config&) = default;
};

/// Upper limits of an sd3_config's sizes, far above the released ones (hidden 2432, 38 blocks, a 384 grid) but low
/// enough that a corrupt or hostile config is refused before anything of that size is built or enumerated.
inline constexpr std::int64_t sd3_max_width = 65536;  ///< channels, hidden, heads, context_in, pooled_in, sample_size
inline constexpr std::int64_t sd3_max_depth = 1024;   ///< depth
inline constexpr std::int64_t sd3_max_grid = 1024;    ///< pos_embed_max_size
inline constexpr std::int64_t sd3_max_patch = 16;

/// Throws invalid_input naming the first inconsistent or out-of-limit field.
/// Example: sd3_config{.heads = 5} -> "sd3_config: hidden 1536 is not divisible by heads 5";
///   sd3_config{.depth = 100000000} -> "sd3_config: depth 100000000 exceeds the limit 1024";
///   sd3_config{.dual_attention_layers = 25} -> "sd3_config: dual_attention_layers 25 is not in [0, depth 24]".
/// @post every size positive and within its limit, hidden % heads == 0, 0 <= dual_attention_layers <= depth,
///   sample_size / patch <= pos_embed_max_size.
inline void validate(const sd3_config& c) {
  const auto in_range = [](std::int64_t value, std::int64_t limit, const char* name) {
    require(value <= limit, "sd3_config: ", name, " ", value, " exceeds the limit ", limit);
    require(value >= 1, "sd3_config: ", name, " ", value, " must be positive");
  };
  in_range(c.in_channels, sd3_max_width, "in_channels");
  in_range(c.out_channels, sd3_max_width, "out_channels");
  in_range(c.patch, sd3_max_patch, "patch");
  in_range(c.hidden, sd3_max_width, "hidden");
  in_range(c.heads, sd3_max_width, "heads");
  in_range(c.depth, sd3_max_depth, "depth");
  in_range(c.pos_embed_max_size, sd3_max_grid, "pos_embed_max_size");
  in_range(c.sample_size, sd3_max_width, "sample_size");
  in_range(c.context_in, sd3_max_width, "context_in");
  in_range(c.pooled_in, sd3_max_width, "pooled_in");
  require(c.hidden % c.heads == 0, "sd3_config: hidden ", c.hidden, " is not divisible by heads ", c.heads);
  require(c.dual_attention_layers >= 0 && c.dual_attention_layers <= c.depth, "sd3_config: dual_attention_layers ",
          c.dual_attention_layers, " is not in [0, depth ", c.depth, "]");
  require(c.sample_size / c.patch <= c.pos_embed_max_size, "sd3_config: sample_size ", c.sample_size, " is ",
          c.sample_size / c.patch, " patches, above pos_embed_max_size ", c.pos_embed_max_size);
}

/// An sd3_config as "key=value;..." in field order (qk_norm 0 / 1): see the file comment's example.
inline std::string format_sd3_config(const sd3_config& c) {
  std::ostringstream out;
  out << "in_channels=" << c.in_channels << ";out_channels=" << c.out_channels << ";patch=" << c.patch
      << ";hidden=" << c.hidden << ";heads=" << c.heads << ";depth=" << c.depth
      << ";pos_embed_max_size=" << c.pos_embed_max_size << ";sample_size=" << c.sample_size
      << ";context_in=" << c.context_in << ";pooled_in=" << c.pooled_in << ";qk_norm=" << (c.qk_norm ? 1 : 0)
      << ";dual_attention_layers=" << c.dual_attention_layers;
  return out.str();
}

/// Inverse of format_sd3_config. Every one of the 12 keys must appear exactly once; `source` prefixes errors.
/// Example: parse_sd3_config(format_sd3_config(c), "m") == c; "hidden=x;..." throws
///   "m: sd3_config hidden = x: must be an integer in [0, 65536]"; a text without depth throws
///   "m: sd3_config has no 'depth'"; "...;bogus=1" throws "m: unknown sd3_config key 'bogus'".
/// @post the result passes validate() (else "m: sd3_config: ..." as validate words it).
inline sd3_config parse_sd3_config(std::string_view text, std::string_view source) {
  std::map<std::string, std::string, std::less<>> fields;
  for (std::size_t at = 0; at <= text.size();) {
    const std::size_t end = std::min(text.find(';', at), text.size());
    const std::string_view item = text.substr(at, end - at);
    const std::size_t eq = item.find('=');
    require(eq != std::string_view::npos, source, ": sd3_config entry '", echo_text(item), "' is not key=value");
    const bool fresh = fields.emplace(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1))).second;
    require(fresh, source, ": sd3_config key '", echo_text(item.substr(0, eq)), "' appears twice");
    at = end + 1;
  }
  const auto integer = [&](std::string_view key, std::int64_t high) {
    const auto it = fields.find(key);
    require(it != fields.end(), source, ": sd3_config has no '", key, "'");
    const auto value =
        parse_integer<std::int64_t>(it->second, std::string(source) + ": sd3_config " + std::string(key), 0, high);
    fields.erase(it);
    return value;
  };
  sd3_config c;
  c.in_channels = integer("in_channels", sd3_max_width);
  c.out_channels = integer("out_channels", sd3_max_width);
  c.patch = integer("patch", sd3_max_patch);
  c.hidden = integer("hidden", sd3_max_width);
  c.heads = integer("heads", sd3_max_width);
  c.depth = integer("depth", sd3_max_depth);
  c.pos_embed_max_size = integer("pos_embed_max_size", sd3_max_grid);
  c.sample_size = integer("sample_size", sd3_max_width);
  c.context_in = integer("context_in", sd3_max_width);
  c.pooled_in = integer("pooled_in", sd3_max_width);
  c.qk_norm = integer("qk_norm", 1) == 1;
  c.dual_attention_layers = integer("dual_attention_layers", sd3_max_depth);
  require(fields.empty(), source, ": unknown sd3_config key '", fields.empty() ? "" : echo_text(fields.begin()->first),
          "'");
  try {
    validate(c);
  } catch (const invalid_input& error) {
    fail(source, ": ", error.what());
  }
  return c;
}

}  // namespace branchgrpo
