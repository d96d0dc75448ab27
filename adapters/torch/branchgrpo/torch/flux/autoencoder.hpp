#pragma once
// The FLUX.1 autoencoder's DECODER as torch::nn modules, with the parameter names of BFL's `ae.safetensors`
// (decoder.*), so leaf latents of a FLUX model become RGB images for rewards. Decoder only, by design: training
// never encodes (rollouts start from noise), so a full ae.safetensors' encoder.* tensors are skipped when loading.
//
//   z = latents / scale_factor + shift_factor                       (undo the latent normalization)
//   h = conv_in(z)                                                  3x3, z_channels -> ch * ch_mult.back()
//   h = mid.block_2(mid.attn_1(mid.block_1(h)))
//   for level L-1 .. 0: num_res_blocks + 1 resnet blocks to ch * ch_mult[level], then (level > 0) upsample
//   images = conv_out(swish(norm_out(h)))                           3x3 -> out_ch, roughly in [-1, 1]
//
// resnet block: x' = shortcut(x) + conv2(swish(norm2(conv1(swish(norm1(x)))))), shortcut a 1x1 conv
//               (nin_shortcut) when the width changes, else the identity.
// attention:    x' = x + proj_out(softmax(q k^T / sqrt(C)) v), q, k, v 1x1 convs of norm(x), one head over the
//               H*W positions.
// upsample:     nearest-neighbour 2x, then a 3x3 conv.
// Norms are GroupNorm(groups, eps 1e-6, affine); swish(x) = x sigmoid(x). Each of the L - 1 upsamples doubles
// the size: dev (L = 4) decodes [B, 16, h, w] to [B, 3, 8h, 8w].
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/flux/layout.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/safetensors.hpp"

namespace branchgrpo {

/// One FLUX autoencoder shape (decoder side) and its latent normalization.
/// Example: flux_autoencoder_config::dev().upscale() == 8; tiny().upscale() == 2.
/// @pre validate(config) passes before a model is built from it.
struct flux_autoencoder_config {
  std::int64_t z_channels = 16;                      ///< latent channels
  std::int64_t ch = 128;                             ///< base width; level i is ch * ch_mult[i] wide
  std::vector<std::int64_t> ch_mult = {1, 2, 4, 4};  ///< per resolution level, highest resolution first
  std::int64_t num_res_blocks = 2;                   ///< the decoder has num_res_blocks + 1 per level
  std::int64_t out_ch = 3;
  std::int64_t groups = 32;      ///< GroupNorm groups; must divide every level's width
  double eps = 1e-6;             ///< GroupNorm epsilon
  double scale_factor = 0.3611;  ///< latents = scale_factor * (z - shift_factor)
  double shift_factor = 0.1159;

  /// FLUX.1-dev / schnell's ae.safetensors.
  static flux_autoencoder_config dev() { return {}; }
  /// For tests: widths 32 and 64 (8 groups), 4 latent channels, 2 blocks per level, one upsample.
  static flux_autoencoder_config tiny() {
    return {.z_channels = 4, .ch = 32, .ch_mult = {1, 2}, .num_res_blocks = 1, .groups = 8};
  }

  /// Output pixels per latent cell along each axis: 2^(levels - 1).
  [[nodiscard]] std::int64_t upscale() const { return std::int64_t{1} << (ch_mult.empty() ? 0 : ch_mult.size() - 1); }

  friend bool operator==(const flux_autoencoder_config&, const flux_autoencoder_config&) = default;
};

/// Throws invalid_input naming the first inconsistent field.
/// Example: tiny() with .groups = 12 -> "flux_autoencoder_config: groups 12 do not divide level 0's width 32".
/// @post every size positive, groups divide every level's width, scale_factor finite and non-zero.
inline void validate(const flux_autoencoder_config& c) {
  require(c.z_channels >= 1 && c.ch >= 1 && c.out_ch >= 1, "flux_autoencoder_config: z_channels ", c.z_channels,
          ", ch ", c.ch, " and out_ch ", c.out_ch, " must be positive");
  require(!c.ch_mult.empty() && c.ch_mult.size() <= 8, "flux_autoencoder_config: ch_mult needs 1 to 8 levels, got ",
          c.ch_mult.size());
  require(c.num_res_blocks >= 0, "flux_autoencoder_config: num_res_blocks ", c.num_res_blocks, " must be non-negative");
  require(c.groups >= 1, "flux_autoencoder_config: groups ", c.groups, " must be positive");
  for (std::size_t i = 0; i < c.ch_mult.size(); ++i) {
    require(c.ch_mult[i] >= 1, "flux_autoencoder_config: ch_mult[", i, "] ", c.ch_mult[i], " must be positive");
    require((c.ch * c.ch_mult[i]) % c.groups == 0, "flux_autoencoder_config: groups ", c.groups,
            " do not divide level ", i, "'s width ", c.ch * c.ch_mult[i]);
  }
  require(std::isfinite(c.eps) && c.eps > 0, "flux_autoencoder_config: eps ", c.eps, " must be finite and positive");
  require(std::isfinite(c.scale_factor) && c.scale_factor != 0, "flux_autoencoder_config: scale_factor ",
          c.scale_factor, " must be finite and non-zero");
  require(std::isfinite(c.shift_factor), "flux_autoencoder_config: shift_factor ", c.shift_factor, " must be finite");
}

namespace detail {

inline void add_conv(std::vector<flux_tensor_spec>& out, const std::string& name, std::int64_t in, std::int64_t out_c,
                     std::int64_t kernel) {
  out.push_back({name + ".weight", {out_c, in, kernel, kernel}});
  out.push_back({name + ".bias", {out_c}});
}

inline void add_norm(std::vector<flux_tensor_spec>& out, const std::string& name, std::int64_t channels) {
  out.push_back({name + ".weight", {channels}});
  out.push_back({name + ".bias", {channels}});
}

inline void add_resnet(std::vector<flux_tensor_spec>& out, const std::string& name, std::int64_t in,
                       std::int64_t out_c) {
  add_norm(out, name + ".norm1", in);
  add_conv(out, name + ".conv1", in, out_c, 3);
  add_norm(out, name + ".norm2", out_c);
  add_conv(out, name + ".conv2", out_c, out_c, 3);
  if (in != out_c) add_conv(out, name + ".nin_shortcut", in, out_c, 1);
}

}  // namespace detail

/// Every decoder tensor of `config` in the ae.safetensors layout (names start with "decoder."), in module order.
/// Example: dev() -> 138 tensors, the first decoder.conv_in.weight [512, 16, 3, 3], the last
///   decoder.conv_out.bias [3]; decoder.up.1.block.0.nin_shortcut.weight is [256, 512, 1, 1].
inline std::vector<flux_tensor_spec> flux_decoder_expected_tensors(const flux_autoencoder_config& config) {
  validate(config);
  std::vector<flux_tensor_spec> out;
  const auto levels = static_cast<std::int64_t>(config.ch_mult.size());
  std::int64_t width = config.ch * config.ch_mult.back();
  detail::add_conv(out, "decoder.conv_in", config.z_channels, width, 3);
  detail::add_resnet(out, "decoder.mid.block_1", width, width);
  detail::add_norm(out, "decoder.mid.attn_1.norm", width);
  for (const char* name : {"q", "k", "v", "proj_out"})
    detail::add_conv(out, std::string("decoder.mid.attn_1.") + name, width, width, 1);
  detail::add_resnet(out, "decoder.mid.block_2", width, width);
  // Level i's tensors are named up.i but built from the lowest resolution (i = L - 1) upwards; list them in
  // name order (up.0 first), tracking each level's input width.
  std::vector<std::int64_t> level_in(static_cast<std::size_t>(levels));
  for (std::int64_t level = levels - 1; level >= 0; --level) {
    level_in[static_cast<std::size_t>(level)] = width;
    width = config.ch * config.ch_mult[static_cast<std::size_t>(level)];
  }
  for (std::int64_t level = 0; level < levels; ++level) {
    const std::string prefix = "decoder.up." + std::to_string(level);
    const std::int64_t level_out = config.ch * config.ch_mult[static_cast<std::size_t>(level)];
    std::int64_t in = level_in[static_cast<std::size_t>(level)];
    for (std::int64_t block = 0; block <= config.num_res_blocks; ++block) {
      detail::add_resnet(out, prefix + ".block." + std::to_string(block), in, level_out);
      in = level_out;
    }
    if (level > 0) detail::add_conv(out, prefix + ".upsample.conv", level_out, level_out, 3);
  }
  const std::int64_t last = config.ch * config.ch_mult.front();
  detail::add_norm(out, "decoder.norm_out", last);
  detail::add_conv(out, "decoder.conv_out", last, config.out_ch, 3);
  return out;
}

/// Compares a checkpoint's names and shapes with flux_decoder_expected_tensors(config). Names starting with
/// "encoder." are skipped (a full ae.safetensors holds both halves); any other extra name is unexpected.
/// Example: tiny(), every decoder tensor but decoder.conv_in.bias, plus encoder.conv_in.weight and
///   "extra" -> missing {"decoder.conv_in.bias"}, unexpected {"extra"}.
inline flux_key_report check_flux_decoder_tensors(const flux_autoencoder_config& config,
                                                  const std::map<std::string, std::vector<std::int64_t>>& shapes) {
  return compare_tensors(flux_decoder_expected_tensors(config), shapes,
                         [](const std::string& name) { return name.starts_with("encoder."); });
}

// ---- Modules ------------------------------------------------------------------------------------------------

inline torch::Tensor ae_swish(const torch::Tensor& x) { return x * torch::sigmoid(x); }

inline torch::nn::GroupNorm ae_group_norm(const flux_autoencoder_config& c, std::int64_t channels) {
  return torch::nn::GroupNorm(torch::nn::GroupNormOptions(c.groups, channels).eps(c.eps).affine(true));
}

inline torch::nn::Conv2d ae_conv(std::int64_t in, std::int64_t out, std::int64_t kernel) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel).stride(1).padding(kernel / 2).bias(true));
}

/// Two GroupNorm-swish-conv3x3 stages and a residual (a 1x1 conv shortcut when the width changes).
class ae_resnet_block : public torch::nn::Module {
 public:
  ae_resnet_block(const flux_autoencoder_config& c, std::int64_t in, std::int64_t out) {
    norm1 = register_module("norm1", ae_group_norm(c, in));
    conv1 = register_module("conv1", ae_conv(in, out, 3));
    norm2 = register_module("norm2", ae_group_norm(c, out));
    conv2 = register_module("conv2", ae_conv(out, out, 3));
    if (in != out) nin_shortcut = register_module("nin_shortcut", ae_conv(in, out, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor h = conv2(ae_swish(norm2(conv1(ae_swish(norm1(x))))));
    return (nin_shortcut ? nin_shortcut(x) : x) + h;
  }
  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, nin_shortcut{nullptr};
};

/// Single-head self-attention over the H*W positions with 1x1-conv projections and a residual.
class ae_attention_block : public torch::nn::Module {
 public:
  ae_attention_block(const flux_autoencoder_config& c, std::int64_t channels) {
    norm = register_module("norm", ae_group_norm(c, channels));
    q = register_module("q", ae_conv(channels, channels, 1));
    k = register_module("k", ae_conv(channels, channels, 1));
    v = register_module("v", ae_conv(channels, channels, 1));
    proj_out = register_module("proj_out", ae_conv(channels, channels, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor h = norm(x);
    const std::int64_t b = x.size(0), c = x.size(1), height = x.size(2), width = x.size(3);
    // [B, C, H, W] -> [B, 1, H*W, C]: positions are tokens, channels features.
    const auto tokens = [&](const torch::Tensor& t) {
      return t.reshape({b, 1, c, height * width}).transpose(2, 3).contiguous();
    };
    const torch::Tensor a = attention(tokens(q(h)), tokens(k(h)), tokens(v(h)));
    return x + proj_out(a.transpose(2, 3).reshape({b, c, height, width}));
  }
  torch::nn::GroupNorm norm{nullptr};
  torch::nn::Conv2d q{nullptr}, k{nullptr}, v{nullptr}, proj_out{nullptr};
};

/// Nearest-neighbour 2x, then a 3x3 conv.
class ae_upsample : public torch::nn::Module {
 public:
  explicit ae_upsample(std::int64_t channels) { conv = register_module("conv", ae_conv(channels, channels, 3)); }
  torch::Tensor forward(const torch::Tensor& x) {
    namespace F = torch::nn::functional;
    return conv(F::interpolate(
        x, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest)));
  }
  torch::nn::Conv2d conv{nullptr};
};

/// One resolution level: up.i.block.0 .. block.num_res_blocks, then up.i.upsample (levels above 0).
class ae_up_level : public torch::nn::Module {
 public:
  ae_up_level(const flux_autoencoder_config& c, std::int64_t in, std::int64_t out, bool upsamples) {
    auto list = register_module("block", torch::nn::ModuleList());
    for (std::int64_t i = 0; i <= c.num_res_blocks; ++i) {
      blocks.push_back(std::make_shared<ae_resnet_block>(c, i == 0 ? in : out, out));
      list->push_back(blocks.back());
    }
    if (upsamples) upsample = register_module("upsample", std::make_shared<ae_upsample>(out));
  }
  std::vector<std::shared_ptr<ae_resnet_block>> blocks;
  std::shared_ptr<ae_upsample> upsample;
};

/// mid.block_1, mid.attn_1, mid.block_2 at the lowest resolution.
class ae_mid : public torch::nn::Module {
 public:
  ae_mid(const flux_autoencoder_config& c, std::int64_t width) {
    block_1 = register_module("block_1", std::make_shared<ae_resnet_block>(c, width, width));
    attn_1 = register_module("attn_1", std::make_shared<ae_attention_block>(c, width));
    block_2 = register_module("block_2", std::make_shared<ae_resnet_block>(c, width, width));
  }
  torch::Tensor forward(const torch::Tensor& x) { return block_2->forward(attn_1->forward(block_1->forward(x))); }
  std::shared_ptr<ae_resnet_block> block_1, block_2;
  std::shared_ptr<ae_attention_block> attn_1;
};

/// The decoder network proper: un-normalized latents z [B, z_channels, h, w] -> [B, out_ch, h s, w s].
class ae_decoder : public torch::nn::Module {
 public:
  explicit ae_decoder(const flux_autoencoder_config& c) {
    const auto levels = static_cast<std::int64_t>(c.ch_mult.size());
    std::int64_t width = c.ch * c.ch_mult.back();
    conv_in = register_module("conv_in", ae_conv(c.z_channels, width, 3));
    mid = register_module("mid", std::make_shared<ae_mid>(c, width));
    // Built from the lowest resolution up, registered as up.0 .. up.(L-1) (up.0 = highest resolution).
    up_levels.resize(static_cast<std::size_t>(levels));
    for (std::int64_t level = levels - 1; level >= 0; --level) {
      const std::int64_t out = c.ch * c.ch_mult[static_cast<std::size_t>(level)];
      up_levels[static_cast<std::size_t>(level)] = std::make_shared<ae_up_level>(c, width, out, level > 0);
      width = out;
    }
    auto list = register_module("up", torch::nn::ModuleList());
    for (const auto& level : up_levels) list->push_back(level);
    norm_out = register_module("norm_out", ae_group_norm(c, width));
    conv_out = register_module("conv_out", ae_conv(width, c.out_ch, 3));
  }
  torch::Tensor forward(const torch::Tensor& z) {
    torch::Tensor h = mid->forward(conv_in(z));
    for (auto level = up_levels.rbegin(); level != up_levels.rend(); ++level) {
      for (auto& block : (*level)->blocks) h = block->forward(h);
      if ((*level)->upsample) h = (*level)->upsample->forward(h);
    }
    return conv_out(ae_swish(norm_out(h)));
  }
  torch::nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  std::shared_ptr<ae_mid> mid;
  std::vector<std::shared_ptr<ae_up_level>> up_levels;
  torch::nn::GroupNorm norm_out{nullptr};
};

/// [-1, 1] images -> [0, 1]: (clamp(x, -1, 1) + 1) / 2. NaN stays NaN (a failed leaf stays visible).
/// Example: {-2, -1, 0, 0.5, 3} -> {0, 0, 0.5, 0.75, 1}.
inline torch::Tensor unit_images(const torch::Tensor& x) { return (x.clamp(-1.0, 1.0) + 1.0) * 0.5; }

/// The FLUX autoencoder, decoder only: named_parameters() are exactly flux_decoder_expected_tensors(config).
/// Example: flux_autoencoder(flux_autoencoder_config::tiny()).decode(latents [2, 4, 4, 6]) has shape
///   [2, 3, 8, 12]; dev() decodes FLUX latents [1, 16, 128, 128] to a 1024 x 1024 image.
class flux_autoencoder : public torch::nn::Module {
 public:
  explicit flux_autoencoder(const flux_autoencoder_config& config) : config_((validate(config), config)) {
    decoder = register_module("decoder", std::make_shared<ae_decoder>(config));
  }

  [[nodiscard]] const flux_autoencoder_config& config() const { return config_; }

  /// Normalized latents [B, z_channels, h, w] (the transformer's space) -> images [B, out_ch, h s, w s] with
  /// s = config().upscale(), roughly in [-1, 1]; clamped to [-1, 1] when `clamp`. Runs in the model's dtype and
  /// device (the latents are converted); differentiable unless called under a NoGradGuard.
  /// @pre latents are 4-D with z_channels channels.
  torch::Tensor decode(const torch::Tensor& latents, bool clamp = false) {
    require(latents.defined() && latents.dim() == 4 && latents.size(1) == config_.z_channels,
            "flux_autoencoder::decode expects latents [B, ", config_.z_channels, ", h, w], got ",
            latents.defined() ? latents.sizes() : torch::IntArrayRef{});
    const torch::Tensor& w = decoder->conv_in->weight;
    const torch::Tensor z = latents.to(w.device(), w.scalar_type()) / config_.scale_factor + config_.shift_factor;
    const torch::Tensor images = decoder->forward(z);
    return clamp ? images.clamp(-1.0, 1.0) : images;
  }

  /// decode then unit_images: images in [0, 1], the input of a reward model.
  torch::Tensor decode_images(const torch::Tensor& latents) { return unit_images(decode(latents)); }

  std::shared_ptr<ae_decoder> decoder;

 private:
  flux_autoencoder_config config_;
};

/// The model's weights by ae.safetensors name, detached.
inline std::map<std::string, torch::Tensor> flux_autoencoder_state(flux_autoencoder& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters()) out.emplace(item.key(), item.value().detach());
  return out;
}

/// Loads decoder weights in the ae.safetensors layout into `model`, converting each tensor to the model's dtype
/// and device. encoder.* tensors are ignored; every missing / unexpected name and shape mismatch is named in one
/// invalid_input line (the first 10, then a count).
/// Example: a map lacking decoder.conv_in.bias and holding "extra" -> "FLUX autoencoder weights do not match
///   the config: missing decoder.conv_in.bias, unexpected extra".
inline void load_flux_autoencoder_weights(flux_autoencoder& model,
                                          const std::map<std::string, torch::Tensor>& tensors) {
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const auto& [name, tensor] : tensors) shapes.emplace(name, tensor.sizes().vec());
  const flux_key_report report = check_flux_decoder_tensors(model.config(), shapes);
  require(report.ok(), "FLUX autoencoder weights do not match the config: ", report.message());
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) item.value().copy_(tensors.at(item.key()));
}

/// Loads an ae.safetensors file (or a file holding only the decoder.* tensors) into `model`; errors name the
/// file. Only the decoder's tensors are copied out of the mapping, each refused unless of model_weight_dtypes and
/// finite.
inline void load_flux_autoencoder_weights(flux_autoencoder& model, const std::filesystem::path& path) {
  const safetensors_checkpoint checkpoint(path);
  std::map<std::string, torch::Tensor> tensors;
  for (const safetensors_tensor& tensor : checkpoint.tensors())
    if (!tensor.name.starts_with("encoder."))
      tensors.emplace(tensor.name, to_torch(tensor, {.allowed_dtypes = model_weight_dtypes, .finite = true},
                                            safetensors_source(checkpoint, tensor)));
  try {
    load_flux_autoencoder_weights(model, tensors);
  } catch (const invalid_input& e) {
    fail(path.string(), ": ", e.what());
  }
}

}  // namespace branchgrpo
