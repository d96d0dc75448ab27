#pragma once
// The Wan2.1 video VAE's DECODER as torch::nn modules, with the parameter names of the official Wan2.1_VAE.pth
// state dict (conv2.*, decoder.*), so leaf latents of a Wan model become RGB videos for rewards. Decoder only,
// like flux/autoencoder.hpp: the encoder's tensors (encoder.*, conv1.*) are skipped when loading. diffusers'
// AutoencoderKLWan names load too (wan_vae_layout::diffusers, detected from the names).
//
//   z = latents * std + mean                        (per channel; undo the latent normalization)
//   x = conv2(z)                                    1x1x1 CausalConv3d, z_dim -> z_dim
//   x = decoder.conv1(x)                            3x3x3 causal, z_dim -> dim * dim_mult.back()
//   x = middle: residual, attention, residual
//   for level 0 .. L-1 (lowest resolution first): num_res_blocks + 1 residual blocks, then (but for the last
//       level) a resample: upsample3d (time x2, space x2) where temporal_upsample(level), else upsample2d
//   video = head: conv(silu(rms_norm(x)))           3x3x3 causal, -> 3 channels, roughly in [-1, 1]
//
// causal conv:  a Conv3d with kernel kt x 3 x 3, zero padding 1 in space and kt - 1 zero frames in the PAST only
//               along time, so output frame t sees input frames <= t.
// rms_norm:     x / max(|x|_2 over channels, 1e-12) * sqrt(C) * gamma (no bias).
// residual:     x' = shortcut(x) + conv_b(silu(rms_b(conv_a(silu(rms_a(x)))))), shortcut a 1x1x1 conv when the
//               width changes. State-dict children: residual.0 (rms_a), .2 (conv_a), .3 (rms_b), .6 (conv_b).
// attention:    per frame, one head over the H*W positions: x' = x + proj(softmax(q k^T / sqrt(C)) v), q, k, v
//               the three C-channel thirds of the 1x1 conv to_qkv(rms_norm(x)).
// upsample2d:   per frame, nearest 2x then a 3x3 Conv2d halving the width (C -> C / 2).
// upsample3d:   first time_conv, a causal (3, 1, 1) conv C -> 2C whose two C-channel halves become two
//               consecutive frames (t -> 2t), then upsample2d. The clip's FIRST frame skips time_conv (it stays
//               one frame), and time_conv's causal padding starts at frame 1 (frame 0 is never in its window).
//               So the two upsample3d take T latent frames to 1 + 2(T - 1) and then 1 + 4(T - 1) frames.
//
// Decoding is chunked along time like the official WanVAE_.decode (one latent frame per chunk by default),
// each causal conv keeping its last kt - 1 input frames between chunks; the result equals decoding the whole
// clip at once (every other layer is frame-local), which `latent_frames_per_chunk = 0` does.
#include <cmath>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/flux/layout.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/safetensors.hpp"

namespace branchgrpo {

/// One Wan VAE shape (decoder side) and its per-channel latent normalization (latents = (z - mean) / std).
/// Example: wan_vae_config::wan21().video_frames(21) == 81, spatial_upscale() == 8; tiny() decodes
///   [B, 4, 3, h, w] to [B, 3, 9, 8h, 8w].
/// @pre validate(config) passes before a model is built from it.
struct wan_vae_config {
  std::int64_t z_dim = 16;                            ///< latent channels
  std::int64_t dim = 96;                              ///< base width; level widths dim * dim_mult[i]
  std::vector<std::int64_t> dim_mult = {1, 2, 4, 4};  ///< encoder order (highest resolution first)
  std::int64_t num_res_blocks = 2;                    ///< the decoder has num_res_blocks + 1 per level
  /// Encoder order, one per resample (levels - 1); the decoder upsamples time where the REVERSED list is true.
  std::vector<bool> temporal_downsample = {false, true, true};
  std::vector<double> latents_mean = {-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,  -0.1517, 1.5508,
                                      0.4134,  -0.0715, 0.5517,  -0.3632, -0.1922, -0.9497, 0.2503,  -0.2921};
  std::vector<double> latents_std = {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                                     3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160};

  /// Wan2.1_VAE.pth (the VAE of every Wan2.1 model).
  static wan_vae_config wan21() { return {}; }
  /// For tests: widths 8 and 16, 4 latent channels, 2 blocks per level, the full 4-level shape (x4 time, x8
  /// space), its own normalization constants.
  static wan_vae_config tiny() {
    return {.z_dim = 4,
            .dim = 8,
            .dim_mult = {1, 2, 2, 2},
            .num_res_blocks = 1,
            .latents_mean = {0.5, -0.25, 0.0, 1.0},
            .latents_std = {2.0, 0.5, 1.0, 1.5}};
  }

  /// The decoder's order: temporal_downsample reversed. wan21() -> {true, true, false}.
  [[nodiscard]] std::vector<bool> temporal_upsample() const {
    return {temporal_downsample.rbegin(), temporal_downsample.rend()};
  }
  /// Output pixels per latent cell along each spatial axis: 2^(levels - 1).
  [[nodiscard]] std::int64_t spatial_upscale() const {
    return std::int64_t{1} << (dim_mult.empty() ? 0 : dim_mult.size() - 1);
  }
  /// Video frames decoded from `latent_frames` (>= 1) latent frames: 1 + s (T - 1), s = 2^(temporal upsamples).
  [[nodiscard]] std::int64_t video_frames(std::int64_t latent_frames) const {
    std::int64_t stride = 1;
    for (bool up : temporal_downsample) stride *= up ? 2 : 1;
    return 1 + stride * (latent_frames - 1);
  }

  friend bool operator==(const wan_vae_config&, const wan_vae_config&) = default;
};

/// Throws invalid_input naming the first inconsistent field.
/// Example: tiny() with .dim = 7 -> "wan_vae_config: level 0's width 7 must be even (upsampling halves it)".
/// @post every size positive, level widths even, levels - 1 temporal flags, z_dim finite means and positive stds.
inline void validate(const wan_vae_config& c) {
  require(c.z_dim >= 1 && c.dim >= 1, "wan_vae_config: z_dim ", c.z_dim, " and dim ", c.dim, " must be positive");
  require(!c.dim_mult.empty() && c.dim_mult.size() <= 8, "wan_vae_config: dim_mult needs 1 to 8 levels, got ",
          c.dim_mult.size());
  require(c.num_res_blocks >= 0, "wan_vae_config: num_res_blocks ", c.num_res_blocks, " must be non-negative");
  for (std::size_t i = 0; i < c.dim_mult.size(); ++i) {
    require(c.dim_mult[i] >= 1, "wan_vae_config: dim_mult[", i, "] ", c.dim_mult[i], " must be positive");
    require((c.dim * c.dim_mult[i]) % 2 == 0, "wan_vae_config: level ", i, "'s width ", c.dim * c.dim_mult[i],
            " must be even (upsampling halves it)");
  }
  require(c.temporal_downsample.size() + 1 == c.dim_mult.size(), "wan_vae_config: temporal_downsample needs ",
          c.dim_mult.size() - 1, " flags (levels - 1), got ", c.temporal_downsample.size());
  require(c.latents_mean.size() == static_cast<std::size_t>(c.z_dim) &&
              c.latents_std.size() == static_cast<std::size_t>(c.z_dim),
          "wan_vae_config: latents_mean and latents_std need z_dim ", c.z_dim, " values, got ", c.latents_mean.size(),
          " and ", c.latents_std.size());
  for (std::size_t i = 0; i < c.latents_std.size(); ++i) {
    require(std::isfinite(c.latents_mean[i]), "wan_vae_config: latents_mean[", i, "] ", c.latents_mean[i],
            " must be finite");
    require(std::isfinite(c.latents_std[i]) && c.latents_std[i] > 0, "wan_vae_config: latents_std[", i, "] ",
            c.latents_std[i], " must be finite and positive");
  }
}

namespace detail {

/// The decoder's level widths: widths[0] the middle's, widths[i + 1] level i's (lowest resolution first).
inline std::vector<std::int64_t> wan_vae_decoder_widths(const wan_vae_config& c) {
  std::vector<std::int64_t> widths{c.dim * c.dim_mult.back()};
  for (auto m = c.dim_mult.rbegin(); m != c.dim_mult.rend(); ++m) widths.push_back(c.dim * *m);
  return widths;
}

inline void add_wan_vae_conv(std::vector<flux_tensor_spec>& out, const std::string& name,
                             std::vector<std::int64_t> shape) {
  out.push_back({name + ".weight", shape});
  out.push_back({name + ".bias", {shape[0]}});
}

inline void add_wan_vae_residual(std::vector<flux_tensor_spec>& out, const std::string& name, std::int64_t in,
                                 std::int64_t out_c) {
  out.push_back({name + ".residual.0.gamma", {in, 1, 1, 1}});
  add_wan_vae_conv(out, name + ".residual.2", {out_c, in, 3, 3, 3});
  out.push_back({name + ".residual.3.gamma", {out_c, 1, 1, 1}});
  add_wan_vae_conv(out, name + ".residual.6", {out_c, out_c, 3, 3, 3});
  if (in != out_c) add_wan_vae_conv(out, name + ".shortcut", {out_c, in, 1, 1, 1});
}

}  // namespace detail

/// Every decoder tensor of `config` in the Wan2.1_VAE.pth layout, in module order.
/// Example: wan21() -> 108 tensors (73,295,603 weights), the first conv2.weight [16, 16, 1, 1, 1], then
/// decoder.conv1.weight
///   [384, 16, 3, 3, 3]; decoder.upsamples.3.time_conv.weight is [768, 384, 3, 1, 1], decoder.upsamples.3.resample.1
///   .weight [192, 384, 3, 3], the last decoder.head.2.bias [3].
inline std::vector<flux_tensor_spec> wan_vae_decoder_expected_tensors(const wan_vae_config& config) {
  validate(config);
  std::vector<flux_tensor_spec> out;
  const std::vector<std::int64_t> widths = detail::wan_vae_decoder_widths(config);
  const std::vector<bool> temporal = config.temporal_upsample();
  detail::add_wan_vae_conv(out, "conv2", {config.z_dim, config.z_dim, 1, 1, 1});
  detail::add_wan_vae_conv(out, "decoder.conv1", {widths[0], config.z_dim, 3, 3, 3});
  detail::add_wan_vae_residual(out, "decoder.middle.0", widths[0], widths[0]);
  out.push_back({"decoder.middle.1.norm.gamma", {widths[0], 1, 1}});
  detail::add_wan_vae_conv(out, "decoder.middle.1.to_qkv", {3 * widths[0], widths[0], 1, 1});
  detail::add_wan_vae_conv(out, "decoder.middle.1.proj", {widths[0], widths[0], 1, 1});
  detail::add_wan_vae_residual(out, "decoder.middle.2", widths[0], widths[0]);
  std::int64_t index = 0;
  const auto levels = widths.size() - 1;
  for (std::size_t level = 0; level < levels; ++level) {
    // A level after a resample starts at half the previous width (the resample's conv halves it).
    std::int64_t in = level == 0 ? widths[0] : widths[level] / 2;
    const std::int64_t level_out = widths[level + 1];
    for (std::int64_t block = 0; block <= config.num_res_blocks; ++block) {
      detail::add_wan_vae_residual(out, "decoder.upsamples." + std::to_string(index++), in, level_out);
      in = level_out;
    }
    if (level + 1 < levels) {
      const std::string name = "decoder.upsamples." + std::to_string(index++);
      detail::add_wan_vae_conv(out, name + ".resample.1", {level_out / 2, level_out, 3, 3});
      if (temporal[level]) detail::add_wan_vae_conv(out, name + ".time_conv", {2 * level_out, level_out, 3, 1, 1});
    }
  }
  out.push_back({"decoder.head.0.gamma", {widths.back(), 1, 1, 1}});
  detail::add_wan_vae_conv(out, "decoder.head.2", {3, widths.back(), 3, 3, 3});
  return out;
}

/// The two names a Wan VAE checkpoint may use: `official` (Wan2.1_VAE.pth: conv2.*, decoder.conv1, middle.i,
/// upsamples.k.residual.i, head.i) or `diffusers` (AutoencoderKLWan, as diffusers'
/// scripts/convert_wan_to_diffusers.py renames them: post_quant_conv.*, decoder.conv_in, mid_block.resnets.i /
/// attentions.0, up_blocks.L.resnets.j.{norm1, conv1, norm2, conv2, conv_shortcut}, up_blocks.L.upsamplers.0,
/// norm_out, conv_out). Shapes are the same in both.
enum class wan_vae_layout { official, diffusers };

/// The diffusers name of the official decoder name `name` (the layouts differ in names only).
/// Example: wan21(), "decoder.upsamples.4.shortcut.weight" -> "decoder.up_blocks.1.resnets.0.conv_shortcut.weight";
///   "decoder.upsamples.3.time_conv.bias" -> "decoder.up_blocks.0.upsamplers.0.time_conv.bias"; "conv2.weight" ->
///   "post_quant_conv.weight".
/// @pre name is one of wan_vae_decoder_expected_tensors(config)'s names.
inline std::string wan_vae_diffusers_name(const wan_vae_config& config, const std::string& name) {
  // The residual block's children, official -> diffusers.
  const auto block_part = [](const std::string& part) -> std::string {
    for (const auto& [from, to] :
         {std::pair{"residual.0.", "norm1."}, std::pair{"residual.2.", "conv1."}, std::pair{"residual.3.", "norm2."},
          std::pair{"residual.6.", "conv2."}, std::pair{"shortcut.", "conv_shortcut."}})
      if (part.starts_with(from)) return to + part.substr(std::string(from).size());
    fail("wan_vae_diffusers_name: unknown residual tensor ", part);
  };
  if (name.starts_with("conv2.")) return "post_quant_conv." + name.substr(6);
  if (name.starts_with("decoder.conv1.")) return "decoder.conv_in." + name.substr(14);
  if (name.starts_with("decoder.head.0.")) return "decoder.norm_out." + name.substr(15);
  if (name.starts_with("decoder.head.2.")) return "decoder.conv_out." + name.substr(15);
  if (name.starts_with("decoder.middle.1.")) return "decoder.mid_block.attentions.0." + name.substr(17);
  if (name.starts_with("decoder.middle.0.")) return "decoder.mid_block.resnets.0." + block_part(name.substr(17));
  if (name.starts_with("decoder.middle.2.")) return "decoder.mid_block.resnets.1." + block_part(name.substr(17));
  require(name.starts_with("decoder.upsamples."), "wan_vae_diffusers_name: unknown decoder tensor ", name);
  const std::string rest = name.substr(18);
  const std::size_t dot = rest.find('.');
  const std::int64_t index = std::stoll(rest.substr(0, dot));
  // Every level holds num_res_blocks + 1 blocks, then (but the last) one resample.
  const std::int64_t stride = config.num_res_blocks + 2;
  const std::string level = "decoder.up_blocks." + std::to_string(index / stride) + ".";
  const std::int64_t position = index % stride;
  if (position == config.num_res_blocks + 1) return level + "upsamplers.0." + rest.substr(dot + 1);
  return level + "resnets." + std::to_string(position) + "." + block_part(rest.substr(dot + 1));
}

/// Every decoder tensor of `config` in `layout`, in module order (wan_vae_decoder_expected_tensors renamed).
/// Example: wan21(), diffusers -> 108 tensors, the first post_quant_conv.weight [16, 16, 1, 1, 1].
inline std::vector<flux_tensor_spec> wan_vae_decoder_expected_tensors(const wan_vae_config& config,
                                                                      wan_vae_layout layout) {
  std::vector<flux_tensor_spec> out = wan_vae_decoder_expected_tensors(config);
  if (layout == wan_vae_layout::diffusers)
    for (flux_tensor_spec& spec : out) spec.name = wan_vae_diffusers_name(config, spec.name);
  return out;
}

/// diffusers when the names hold post_quant_conv.weight or decoder.conv_in.weight, else official.
template <typename Map>
wan_vae_layout detect_wan_vae_layout(const Map& tensors) {
  return tensors.contains("post_quant_conv.weight") || tensors.contains("decoder.conv_in.weight")
             ? wan_vae_layout::diffusers
             : wan_vae_layout::official;
}

/// True for the names of a full checkpoint that the decoder does not use: encoder.* and the encoder-side 1x1
/// conv (official conv1.*, diffusers quant_conv.*; the decoder-side one is conv2.* / post_quant_conv.*).
/// Example: "encoder.conv1.weight", "conv1.bias" and "quant_conv.bias" -> true; "decoder.conv1.weight",
///   "conv2.bias" and "post_quant_conv.bias" -> false.
inline bool wan_vae_encoder_name(const std::string& name) {
  return name.starts_with("encoder.") || name.starts_with("conv1.") || name.starts_with("quant_conv.");
}

/// Compares a checkpoint's names and shapes with wan_vae_decoder_expected_tensors(config, layout); the
/// encoder's names (wan_vae_encoder_name) are skipped, any other extra name is unexpected.
/// Example: tiny(), every decoder tensor but conv2.bias, plus encoder.conv1.weight and "extra" -> missing
///   {"conv2.bias"}, unexpected {"extra"}.
inline flux_key_report check_wan_vae_decoder_tensors(const wan_vae_config& config,
                                                     const std::map<std::string, std::vector<std::int64_t>>& shapes,
                                                     wan_vae_layout layout = wan_vae_layout::official) {
  return compare_tensors(wan_vae_decoder_expected_tensors(config, layout), shapes, wan_vae_encoder_name);
}

// ---- Modules ------------------------------------------------------------------------------------------------

/// What the causal convs carry from one time chunk to the next: each conv with a temporal kernel kt > 1 owns
/// one slot (in call order) holding its last kt - 1 input frames; an undefined slot means "no chunk yet".
/// A deque, so a slot reference stays valid while later slots are added.
struct wan_vae_stream {
  std::deque<torch::Tensor> slots;
  std::size_t cursor = 0;

  torch::Tensor& next_slot() {
    if (cursor == slots.size()) slots.emplace_back();
    return slots[cursor++];
  }
};

/// A Conv3d (kernel kt x k x k, spatial zero padding k / 2, none in time) run causally: the input is preceded
/// by the slot's kt - 1 frames (zeros before the first chunk), and the slot then keeps the last kt - 1 frames.
/// @post output frames == input frames.
inline torch::Tensor wan_vae_causal_conv(torch::nn::Conv3d& conv, const torch::Tensor& x, wan_vae_stream& stream) {
  const std::int64_t past = (*conv->options.kernel_size())[0] - 1;
  if (past == 0) return conv(x);
  torch::Tensor& slot = stream.next_slot();
  if (!slot.defined()) slot = torch::zeros({x.size(0), x.size(1), past, x.size(3), x.size(4)}, x.options());
  const torch::Tensor input = torch::cat({slot, x}, 2);
  slot = input.narrow(2, input.size(2) - past, past);
  return conv(input);
}

inline torch::nn::Conv3d wan_vae_conv3d(std::int64_t in, std::int64_t out, std::int64_t kt, std::int64_t k) {
  return torch::nn::Conv3d(torch::nn::Conv3dOptions(in, out, {kt, k, k}).padding({0, k / 2, k / 2}).bias(true));
}

/// [B, C, T, H, W] <-> [B T, C, H, W], for the frame-local 2-D layers.
inline torch::Tensor wan_vae_frames(const torch::Tensor& x) {
  return x.permute({0, 2, 1, 3, 4}).reshape({x.size(0) * x.size(2), x.size(1), x.size(3), x.size(4)});
}
inline torch::Tensor wan_vae_unframes(const torch::Tensor& x, std::int64_t batch) {
  return x.reshape({batch, x.size(0) / batch, x.size(1), x.size(2), x.size(3)}).permute({0, 2, 1, 3, 4});
}

/// x / max(|x|_2 over dim 1, 1e-12) * sqrt(C) * gamma; gamma [C, 1, 1, 1] (videos) or [C, 1, 1] (frames).
class wan_vae_rms_norm : public torch::nn::Module {
 public:
  wan_vae_rms_norm(std::int64_t channels, bool video) : scale_(std::sqrt(static_cast<double>(channels))) {
    gamma = register_parameter("gamma", video ? torch::ones({channels, 1, 1, 1}) : torch::ones({channels, 1, 1}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    namespace F = torch::nn::functional;
    return F::normalize(x, F::NormalizeFuncOptions().dim(1).eps(1e-12)) * scale_ * gamma;
  }
  torch::Tensor gamma;

 private:
  double scale_;
};

/// rms-silu-conv twice, plus a (1x1x1 conv when the width changes) shortcut. Children residual.0 / .2 / .3 / .6
/// and shortcut, as in the state dict (the parameter-free SiLU and dropout fill indices 1, 4, 5).
class wan_vae_residual_block : public torch::nn::Module {
 public:
  wan_vae_residual_block(std::int64_t in, std::int64_t out) {
    norm_a = std::make_shared<wan_vae_rms_norm>(in, true);
    conv_a = wan_vae_conv3d(in, out, 3, 3);
    norm_b = std::make_shared<wan_vae_rms_norm>(out, true);
    conv_b = wan_vae_conv3d(out, out, 3, 3);
    auto list = register_module("residual", torch::nn::ModuleList());
    list->push_back(norm_a);
    list->push_back(torch::nn::SiLU());
    list->push_back(conv_a);
    list->push_back(norm_b);
    list->push_back(torch::nn::SiLU());
    list->push_back(torch::nn::Identity());  // the official dropout (p = 0)
    list->push_back(conv_b);
    if (in != out) shortcut = register_module("shortcut", wan_vae_conv3d(in, out, 1, 1));
  }
  torch::Tensor forward(const torch::Tensor& x, wan_vae_stream& stream) {
    torch::Tensor h = wan_vae_causal_conv(conv_a, torch::silu(norm_a->forward(x)), stream);
    h = wan_vae_causal_conv(conv_b, torch::silu(norm_b->forward(h)), stream);
    return (shortcut ? shortcut(x) : x) + h;
  }
  std::shared_ptr<wan_vae_rms_norm> norm_a, norm_b;
  torch::nn::Conv3d conv_a{nullptr}, conv_b{nullptr}, shortcut{nullptr};
};

/// Per-frame single-head self-attention over the H*W positions, with a residual.
class wan_vae_attention_block : public torch::nn::Module {
 public:
  explicit wan_vae_attention_block(std::int64_t channels) {
    norm = register_module("norm", std::make_shared<wan_vae_rms_norm>(channels, false));
    to_qkv = register_module("to_qkv", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, 3 * channels, 1)));
    proj = register_module("proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 1)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const std::int64_t b = x.size(0), c = x.size(1);
    const torch::Tensor frames = wan_vae_frames(x);
    const std::int64_t n = frames.size(0), height = frames.size(2), width = frames.size(3);
    // [BT, 3C, H, W] -> [BT, 1, HW, 3C]; q, k, v are the channel thirds.
    const torch::Tensor qkv = to_qkv(norm->forward(frames)).reshape({n, 1, 3 * c, height * width}).transpose(2, 3);
    const std::vector<torch::Tensor> parts = qkv.chunk(3, -1);
    const torch::Tensor a = attention(parts[0].contiguous(), parts[1].contiguous(), parts[2].contiguous());
    const torch::Tensor out = proj(a.squeeze(1).transpose(1, 2).reshape({n, c, height, width}));
    return x + wan_vae_unframes(out, b);
  }
  std::shared_ptr<wan_vae_rms_norm> norm;
  torch::nn::Conv2d to_qkv{nullptr}, proj{nullptr};
};

/// upsample2d (nearest 2x, 3x3 conv C -> C / 2, per frame), preceded in upsample3d mode by time_conv, which
/// doubles every frame but the clip's first (see the file comment).
class wan_vae_resample : public torch::nn::Module {
 public:
  wan_vae_resample(std::int64_t channels, bool temporal) {
    auto list = register_module("resample", torch::nn::ModuleList());
    conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels / 2, 3).padding(1));
    list->push_back(torch::nn::Identity());  // the official nearest-exact upsample (no parameters)
    list->push_back(conv);
    if (temporal) time_conv = register_module("time_conv", wan_vae_conv3d(channels, 2 * channels, 3, 1));
  }
  torch::Tensor forward(torch::Tensor x, wan_vae_stream& stream) {
    if (time_conv) x = double_frames(x, stream);
    namespace F = torch::nn::functional;
    // nearest-exact and nearest agree for an integer factor of 2.
    const torch::Tensor up =
        F::interpolate(wan_vae_frames(x),
                       F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest));
    return wan_vae_unframes(conv(up), x.size(0));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Conv3d time_conv{nullptr};

 private:
  // Frames t -> 2t, the clip's first frame excepted; its causal window starts at frame 1 (zeros before).
  torch::Tensor double_frames(const torch::Tensor& x, wan_vae_stream& stream) {
    torch::Tensor& slot = stream.next_slot();
    const bool first_chunk = !slot.defined();
    if (first_chunk) slot = torch::zeros({x.size(0), x.size(1), 2, x.size(3), x.size(4)}, x.options());
    const torch::Tensor rest = first_chunk ? x.narrow(2, 1, x.size(2) - 1) : x;
    if (rest.size(2) == 0) return x;
    const torch::Tensor input = torch::cat({slot, rest}, 2);
    slot = input.narrow(2, input.size(2) - 2, 2);
    const std::int64_t b = x.size(0), c = x.size(1), t = rest.size(2), h = x.size(3), w = x.size(4);
    // [B, 2C, t, H, W]: channel half i is frame 2 t' + i.
    const torch::Tensor doubled =
        time_conv(input).reshape({b, 2, c, t, h, w}).permute({0, 2, 3, 1, 4, 5}).reshape({b, c, 2 * t, h, w});
    return first_chunk ? torch::cat({x.narrow(2, 0, 1), doubled}, 2) : doubled;
  }
};

/// The network after conv2: decoder.conv1, decoder.middle, decoder.upsamples, decoder.head.
class wan_vae_decoder3d : public torch::nn::Module {
 public:
  explicit wan_vae_decoder3d(const wan_vae_config& c) {
    const std::vector<std::int64_t> widths = detail::wan_vae_decoder_widths(c);
    const std::vector<bool> temporal = c.temporal_upsample();
    conv1 = register_module("conv1", wan_vae_conv3d(c.z_dim, widths[0], 3, 3));
    auto middle = register_module("middle", torch::nn::ModuleList());
    middle_a = std::make_shared<wan_vae_residual_block>(widths[0], widths[0]);
    middle_attention = std::make_shared<wan_vae_attention_block>(widths[0]);
    middle_b = std::make_shared<wan_vae_residual_block>(widths[0], widths[0]);
    middle->push_back(middle_a);
    middle->push_back(middle_attention);
    middle->push_back(middle_b);
    auto upsamples = register_module("upsamples", torch::nn::ModuleList());
    const std::size_t levels = widths.size() - 1;
    for (std::size_t level = 0; level < levels; ++level) {
      std::int64_t in = level == 0 ? widths[0] : widths[level] / 2;
      const std::int64_t out = widths[level + 1];
      for (std::int64_t block = 0; block <= c.num_res_blocks; ++block) {
        blocks.push_back(std::make_shared<wan_vae_residual_block>(in, out));
        upsamples->push_back(blocks.back());
        resamples.emplace_back();
        in = out;
      }
      if (level + 1 < levels) {
        resamples.back() = std::make_shared<wan_vae_resample>(out, temporal[level]);
        upsamples->push_back(resamples.back());
      }
    }
    auto head = register_module("head", torch::nn::ModuleList());
    head_norm = std::make_shared<wan_vae_rms_norm>(widths.back(), true);
    head_conv = wan_vae_conv3d(widths.back(), 3, 3, 3);
    head->push_back(head_norm);
    head->push_back(torch::nn::SiLU());
    head->push_back(head_conv);
  }
  /// One time chunk: x [B, z_dim, t, h, w] (after conv2) -> its video frames; `stream` carries the causal state.
  torch::Tensor forward(const torch::Tensor& x, wan_vae_stream& stream) {
    torch::Tensor h = wan_vae_causal_conv(conv1, x, stream);
    h = middle_b->forward(middle_attention->forward(middle_a->forward(h, stream)), stream);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      h = blocks[i]->forward(h, stream);
      if (resamples[i]) h = resamples[i]->forward(h, stream);
    }
    return wan_vae_causal_conv(head_conv, torch::silu(head_norm->forward(h)), stream);
  }
  torch::nn::Conv3d conv1{nullptr}, head_conv{nullptr};
  std::shared_ptr<wan_vae_residual_block> middle_a, middle_b;
  std::shared_ptr<wan_vae_attention_block> middle_attention;
  std::vector<std::shared_ptr<wan_vae_residual_block>> blocks;
  std::vector<std::shared_ptr<wan_vae_resample>> resamples;  ///< resamples[i]: after blocks[i], or null
  std::shared_ptr<wan_vae_rms_norm> head_norm;
};

/// The Wan2.1 VAE, decoder only: named_parameters() are exactly wan_vae_decoder_expected_tensors(config).
/// Example: wan_vae_decoder(wan_vae_config::tiny()).decode(latents [1, 4, 3, 2, 3]) has shape
///   [1, 3, 9, 16, 24]; wan21() decodes Wan latents [1, 16, 21, 60, 104] to 81 frames of 480 x 832.
class wan_vae_decoder : public torch::nn::Module {
 public:
  explicit wan_vae_decoder(const wan_vae_config& config) : config_((validate(config), config)) {
    conv2 = register_module("conv2", wan_vae_conv3d(config.z_dim, config.z_dim, 1, 1));
    decoder = register_module("decoder", std::make_shared<wan_vae_decoder3d>(config));
  }

  [[nodiscard]] const wan_vae_config& config() const { return config_; }

  /// Normalized latents [B, z_dim, T, h, w] (the transformer's space) -> video [B, 3, 1 + 4 (T - 1), 8h, 8w]
  /// (wan21(); in general config().video_frames(T) and spatial_upscale()), roughly in [-1, 1]; clamped to
  /// [-1, 1] when `clamp` (the official WanVAE.decode clamps). Decodes `latent_frames_per_chunk` latent frames
  /// at a time (1, the official schedule and the least memory, by default; 0 = the whole clip at once): every
  /// chunking gives the same video up to rounding. Runs in the model's dtype and device; differentiable unless
  /// called under a NoGradGuard.
  /// @pre latents are 5-D with z_dim channels and T >= 1; latent_frames_per_chunk >= 0.
  /// @post video frame f depends only on latent frames <= ceil(f / 4) (causal).
  torch::Tensor decode(const torch::Tensor& latents, bool clamp = false, std::int64_t latent_frames_per_chunk = 1) {
    require(latents.defined() && latents.dim() == 5 && latents.size(1) == config_.z_dim && latents.size(2) >= 1,
            "wan_vae_decoder::decode expects latents [B, ", config_.z_dim, ", T >= 1, h, w], got ",
            latents.defined() ? latents.sizes() : torch::IntArrayRef{});
    require(latent_frames_per_chunk >= 0, "wan_vae_decoder::decode: latent_frames_per_chunk ", latent_frames_per_chunk,
            " must be non-negative");
    const torch::Tensor& w = conv2->weight;
    const auto options = torch::TensorOptions().dtype(w.scalar_type()).device(w.device());
    const torch::Tensor mean = torch::tensor(config_.latents_mean, torch::kFloat64).to(options);
    const torch::Tensor std = torch::tensor(config_.latents_std, torch::kFloat64).to(options);
    const torch::Tensor z =
        latents.to(w.device(), w.scalar_type()) * std.view({1, -1, 1, 1, 1}) + mean.view({1, -1, 1, 1, 1});
    const torch::Tensor x = conv2(z);
    const std::int64_t frames = x.size(2);
    const std::int64_t chunk = latent_frames_per_chunk == 0 ? frames : latent_frames_per_chunk;
    wan_vae_stream stream;
    std::vector<torch::Tensor> pieces;
    for (std::int64_t start = 0; start < frames; start += chunk) {
      stream.cursor = 0;
      pieces.push_back(decoder->forward(x.narrow(2, start, std::min(chunk, frames - start)), stream));
    }
    const torch::Tensor video = pieces.size() == 1 ? pieces.front() : torch::cat(pieces, 2);
    return clamp ? video.clamp(-1.0, 1.0) : video;
  }

  torch::nn::Conv3d conv2{nullptr};
  std::shared_ptr<wan_vae_decoder3d> decoder;

 private:
  wan_vae_config config_;
};

/// The model's weights by Wan2.1_VAE.pth name, detached.
inline std::map<std::string, torch::Tensor> wan_vae_decoder_state(wan_vae_decoder& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters()) out.emplace(item.key(), item.value().detach());
  return out;
}

/// Loads decoder weights into `model` in either layout (detect_wan_vae_layout), converting each tensor to the
/// model's dtype and device. The encoder's names are ignored; every missing / unexpected name and shape mismatch
/// (in the detected layout's names) is named in one invalid_input line (the first 10, then a count).
/// Example: a map lacking conv2.bias and holding "extra" -> "Wan VAE weights do not match the config: missing
///   conv2.bias, unexpected extra".
inline void load_wan_vae_decoder_weights(wan_vae_decoder& model, const std::map<std::string, torch::Tensor>& tensors) {
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const auto& [name, tensor] : tensors) shapes.emplace(name, tensor.sizes().vec());
  const wan_vae_layout layout = detect_wan_vae_layout(tensors);
  const flux_key_report report = check_wan_vae_decoder_tensors(model.config(), shapes, layout);
  require(report.ok(), "Wan VAE weights do not match the config: ", report.message());
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const bool official = layout == wan_vae_layout::official;
    item.value().copy_(tensors.at(official ? item.key() : wan_vae_diffusers_name(model.config(), item.key())));
  }
}

/// Loads a safetensors file holding the Wan2.1_VAE.pth state dict (converted with its names kept) or diffusers'
/// AutoencoderKLWan weights (vae/diffusion_pytorch_model.safetensors) into `model`; the encoder's tensors may be
/// there or not. Errors name the file. The decoder's tensors are refused unless of model_weight_dtypes and finite.
inline void load_wan_vae_decoder_weights(wan_vae_decoder& model, const std::filesystem::path& path) {
  const safetensors_checkpoint checkpoint(path);
  std::map<std::string, torch::Tensor> tensors;
  for (const safetensors_tensor& tensor : checkpoint.tensors())
    if (!wan_vae_encoder_name(tensor.name))
      tensors.emplace(tensor.name, to_torch(tensor, {.allowed_dtypes = model_weight_dtypes, .finite = true},
                                            safetensors_source(checkpoint, tensor)));
  try {
    load_wan_vae_decoder_weights(model, tensors);
  } catch (const invalid_input& e) {
    fail(path.string(), ": ", e.what());
  }
}

}  // namespace branchgrpo
