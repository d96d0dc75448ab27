#pragma once
// The procedural "moving shapes" clips of the shipped video model (models/moving-shapes-tiny; docs/wan.md): one
// coloured shape gliding across a plain light-grey background, 8 frames of 3 x 16 x 16, RGB in [-1, 1] (pixel
// space: the clip IS the latent [C = 3, F, H, W], Wan's layout, no autoencoder).
//
//   prompts     48 = 12 shapes prompts x 4 directions (video_rewards.hpp): "a red circle moving left", ...
//   draw        moving_shapes_draw(seed, index): size, path, position and colour jitter of clip `index`
//   render      moving_shapes_render(sample): [3, 8, 16, 16], every frame shapes_render of the moved shape
//   batch       make_moving_shapes_batch(seed, first, count)
//   model       a Wan2.1-architecture transformer (moving_shapes_wan_config) in a model directory whose
//               model.safetensors holds "branchgrpo.wan_config" (load_video_model)
//   frames      clip_frames(latents [rows, 3, F, H, W]) -> [rows, F, 3, H, W], what video rewards score
//   sampling    video_sample_ode(model, text, prompts, seed): Euler ODE, 20 steps, Wan's shift 5
//
// Sample randomness: the 8 uniforms of clip i are shapes.hpp's with the tag 0x4D4F5631 ("MOV1"): u0 size, u1
// travel, u2 cross-axis position, u3 background, u4..u6 colour jitter, u7 the prompt when the batch draws it.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/app/shapes.hpp"
#include "branchgrpo/app/video_rewards.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/model_specs/wan/config.hpp"
#include "branchgrpo/model_specs/wan/layout.hpp"
#include "branchgrpo/rollout/ode_sampler.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/torch/backend.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/flux/prompt_embeddings.hpp"
#include "branchgrpo/torch/safetensors.hpp"
#include "branchgrpo/torch/wan/denoiser.hpp"
#include "branchgrpo/torch/wan/transformer.hpp"

namespace branchgrpo {

// ---- The data set ---------------------------------------------------------------------------------------------

/// Frames per clip.
inline constexpr std::int64_t moving_shapes_frames = 8;
/// 12 shapes prompts x 4 directions.
inline constexpr std::int64_t moving_shapes_prompt_count = 48;

/// Everything that defines one clip: the shape at the middle of its path (`still`, whose prompt is the shapes
/// prompt p / 4) and the direction and length of its path.
struct moving_shapes_sample {
  std::int64_t prompt = 0;  ///< moving-shapes prompt 4 (3 colour + shape) + direction
  shapes_sample still;      ///< the shape with its centre at the middle of the path
  double travel = 4;        ///< pixels from the first frame's centre to the last's, along the direction

  friend bool operator==(const moving_shapes_sample&, const moving_shapes_sample&) = default;
};

namespace detail {
inline constexpr std::uint32_t moving_shapes_philox_tag = 0x4D4F5631u;  // "MOV1"
}

/// Clip `index` of the data set drawn with `seed`:
///   prompt = floor(48 u7) unless given; R = 2.5 + u0; e = half extent (R, 0.85 R, 1.2 R); room = 14 - 2 e;
///   travel = room (0.5 + 0.5 u1); the path runs along the direction through the image centre 8, from
///   8 - travel / 2 to 8 + travel / 2 (mirrored for left and up); the other coordinate is 1 + e + room u2;
///   background and colour as shapes_draw's.
/// Example: any seed, index 3, prompt 5 ("a red square moving right") -> still.prompt 1, e = 0.85 R, still.cy in
///   [1 + e, 15 - e], still.cx = 8, travel in [room / 2, room]: frame 0 centred at x = 8 - travel / 2.
/// @pre prompt, when given, in [0, 48) (else invalid_input).
/// @post a pure function of (seed, index, prompt); the shape stays one pixel inside every frame.
inline moving_shapes_sample moving_shapes_draw(std::uint64_t seed, std::uint64_t index,
                                               std::optional<std::int64_t> prompt = {}) {
  const std::array<double, 8> u = detail::shapes_uniforms(seed, index, detail::moving_shapes_philox_tag);
  moving_shapes_sample s;
  s.prompt = detail::drawn_prompt(prompt, u[7], moving_shapes_prompt_count, "moving-shapes");
  const std::int64_t still_prompt = s.prompt / 4;
  const int shape = static_cast<int>(still_prompt % 3), colour = static_cast<int>(still_prompt / 3);
  s.still.prompt = still_prompt;
  s.still.radius = 2.5 + u[0];
  const double e = detail::shapes_half_extent(shape, s.still.radius);
  const double room = static_cast<double>(shapes_image_size) - 2.0 - 2.0 * e;
  s.travel = room * (0.5 + 0.5 * u[1]);
  const double middle = static_cast<double>(shapes_image_size) / 2, across = 1.0 + e + room * u[2];
  const bool horizontal = s.prompt % 4 < 2;
  s.still.cx = horizontal ? middle : across;
  s.still.cy = horizontal ? across : middle;
  detail::shapes_jitter(s.still, colour, u);
  return s;
}

/// The clip of `sample`, [3, F, 16, 16] float32 in [-1, 1] (channels first: Wan's latent layout): frame t is
/// shapes_render of the still shape moved by travel (t / (F - 1) - 1/2) along the prompt's direction.
/// Example: "a red square moving right" with travel 6 -> the square's centre x is 5 in frame 0 and 11 in frame 7.
/// @pre sample.prompt in [0, 48); frames >= 2.
inline torch::Tensor moving_shapes_render(const moving_shapes_sample& sample,
                                          std::int64_t frames = moving_shapes_frames) {
  require(frames >= 2, "a moving-shapes clip needs at least 2 frames, got ", frames);
  static constexpr std::array<std::array<double, 2>, 4> unit = {{{-1, 0}, {1, 0}, {0, -1}, {0, 1}}};
  const auto& direction = unit[static_cast<std::size_t>(sample.prompt % 4)];
  std::vector<torch::Tensor> out;
  for (std::int64_t t = 0; t < frames; ++t) {
    const double offset = sample.travel * (static_cast<double>(t) / static_cast<double>(frames - 1) - 0.5);
    shapes_sample frame = sample.still;
    frame.cx += offset * direction[0];
    frame.cy += offset * direction[1];
    out.push_back(shapes_render(frame));
  }
  return torch::stack(out, 1);
}

/// Clips [count, 3, F, 16, 16] and prompts of a batch of the data set.
struct moving_shapes_batch {
  torch::Tensor clips;
  std::vector<std::int64_t> prompts;
};

/// Clips first, ..., first + count - 1 drawn with `seed` (random prompts).
/// Example: make_moving_shapes_batch(0, 10, 2).clips[1] equals moving_shapes_render(moving_shapes_draw(0, 11)).
/// @pre count >= 0.
inline moving_shapes_batch make_moving_shapes_batch(std::uint64_t seed, std::uint64_t first, std::int64_t count) {
  auto [clips, prompts] = detail::draw_batch(
      seed, first, count, "moving-shapes", [](std::uint64_t s, std::uint64_t i) { return moving_shapes_draw(s, i); },
      [](const moving_shapes_sample& sample) { return moving_shapes_render(sample); },
      {0, 3, moving_shapes_frames, shapes_image_size, shapes_image_size});
  return {.clips = std::move(clips), .prompts = std::move(prompts)};
}

/// Pixel latents [rows, 3, F, H, W] -> frames [rows, F, 3, H, W] (what the video rewards and writers take).
/// @pre latents are 5-D with 3 channels (else invalid_input naming the shape).
inline torch::Tensor clip_frames(const torch::Tensor& latents) {
  require(latents.defined() && latents.dim() == 5 && latents.size(1) == 3,
          "pixel video latents must be [rows, 3, F, H, W], got ",
          latents.defined() ? latents.sizes() : c10::IntArrayRef{});
  return latents.permute({0, 2, 1, 3, 4}).contiguous();
}

// ---- wan_config as metadata text ------------------------------------------------------------------------------

/// A wan_config as "key=value;..." in field order.
/// Example: wan_config::tiny() -> "in_dim=4;out_dim=3;dim=40;ffn_dim=56;heads=2;layers=2;freq_dim=32;
///   text_dim=24;text_len=8;patch=1,2,2;eps=1e-06;rope_theta=10000".
inline std::string format_wan_config(const wan_config& c) {
  std::ostringstream out;
  out << "in_dim=" << c.in_dim << ";out_dim=" << c.out_dim << ";dim=" << c.dim << ";ffn_dim=" << c.ffn_dim
      << ";heads=" << c.heads << ";layers=" << c.layers << ";freq_dim=" << c.freq_dim << ";text_dim=" << c.text_dim
      << ";text_len=" << c.text_len << ";patch=" << c.patch[0] << ',' << c.patch[1] << ',' << c.patch[2]
      << ";eps=" << detail::shortest_text(c.eps) << ";rope_theta=" << detail::shortest_text(c.rope_theta);
  return out.str();
}

/// Inverse of format_wan_config: every one of the 12 keys exactly once, values within wan_config's limits;
/// `source` prefixes errors ("m: wan_config layers = 100000000: must be an integer in [1, 1024]").
/// @post the result passes validate().
inline wan_config parse_wan_config(std::string_view text, std::string_view source) {
  detail::config_fields f(text, source, "wan_config");
  wan_config c;
  c.in_dim = f.integer("in_dim", 1, wan_max_width);
  c.out_dim = f.integer("out_dim", 1, wan_max_width);
  c.dim = f.integer("dim", 1, wan_max_width);
  c.ffn_dim = f.integer("ffn_dim", 1, wan_max_width);
  c.heads = f.integer("heads", 1, wan_max_width);
  c.layers = f.integer("layers", 1, wan_max_depth);
  c.freq_dim = f.integer("freq_dim", 1, wan_max_width);
  c.text_dim = f.integer("text_dim", 1, wan_max_width);
  c.text_len = f.integer("text_len", 1, wan_max_text_len);
  c.patch = f.triple("patch", 1, wan_max_patch);
  c.eps = f.number("eps");
  c.rope_theta = f.number("rope_theta");
  f.finish();
  try {
    validate(c);
  } catch (const invalid_input& error) {
    fail(source, ": ", error.what());
  }
  return c;
}

/// The shipped video model's transformer: pixels in and out (3 channels), 8 x 16 x 16 clips cut into
/// 1 x 4 x 4 patches (128 tokens), dim 64 in 2 heads of 32 (RoPE 12 / 10 / 10), FFN 256, 4 blocks, word
/// embeddings of width 32 padded to 8 tokens, time embedding 64 wide.
inline wan_config moving_shapes_wan_config() {
  return {.in_dim = 3,
          .out_dim = 3,
          .dim = 64,
          .ffn_dim = 256,
          .heads = 2,
          .layers = 4,
          .freq_dim = 64,
          .text_dim = 32,
          .text_len = 8,
          .patch = {1, 4, 4}};
}

// ---- A pretrained video model directory -------------------------------------------------------------------------

/// A video model directory as `branchgrpo pretrain --video` writes it: model.safetensors (official Wan names,
/// __metadata__ holding "branchgrpo.wan_config") and prompts.safetensors (prompt_embeddings.hpp's file: context
/// [N, L, text_dim] is the text the transformer attends to; the pooled vectors are not used by Wan).
struct video_model {
  wan_config config;
  std::map<std::string, torch::Tensor> weights;  ///< official names, float32, CPU
  prompt_embeddings embeddings;                  ///< float32, CPU
  std::vector<std::string> prompts;
  std::map<std::string, std::string> metadata;
};

/// Whether DIR/model.safetensors declares a Wan (video) model: its metadata holds wan_config_metadata_key.
/// Throws invalid_input naming the file when it is missing or unreadable, or declares both families
/// (require_one_model_family).
inline bool is_video_model_dir(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "model.safetensors";
  require(std::filesystem::is_regular_file(path), path.string(), ": no such file");
  const safetensors_checkpoint checkpoint(path);
  require_one_model_family(checkpoint.metadata(), path.string());
  return checkpoint.metadata().contains(std::string(wan_config_metadata_key));
}

/// Reads DIR/model.safetensors and DIR/prompts.safetensors; checks that the file declares Wan alone
/// (require_one_model_family), that every weight is of model_weight_dtypes and finite, the weights against the
/// config and the text width against its text_dim and text_len. Errors are one line naming the file.
/// Example: load_video_model("models/moving-shapes-tiny") -> moving_shapes_wan_config(), 48 prompts, context
///   [48, 5, 32].
inline video_model load_video_model(const std::filesystem::path& dir) {
  const std::filesystem::path model_path = dir / "model.safetensors";
  const std::filesystem::path prompts_path = dir / "prompts.safetensors";
  require(std::filesystem::is_regular_file(model_path), model_path.string(), ": no such file");
  video_model out;
  out.config =
      detail::read_model_file(model_path, wan_config_metadata_key, parse_wan_config, out.weights, out.metadata);
  const wan_key_report report = check_wan_tensors(out.config, wan_layout::official, detail::tensor_shapes(out.weights));
  require(report.ok(), model_path.string(), ": weights do not match the config: ", report.message());
  prompt_file prompts = load_prompt_file(prompts_path);
  check_prompt_file(prompts, prompts_path.string());
  const torch::Tensor& context = prompts.embeddings.context;
  require(context.size(2) == out.config.text_dim && context.size(1) <= out.config.text_len, prompts_path.string(),
          ": text features [", context.size(0), ", ", context.size(1), ", ", context.size(2),
          "] do not fit the model's text_dim ", out.config.text_dim, " and text_len ", out.config.text_len);
  out.embeddings = std::move(prompts.embeddings);
  out.prompts = std::move(prompts.prompts);
  return out;
}

/// Clips [rows, C, F, H, W] of the deterministic flow ODE, as shapes_sample_ode for images: x starts at the
/// keyed normals noise_key{seed, 0, tree = row, node 0, step 0, root_latent}, Euler over
/// shifted_linear_schedule(steps, shift). No autograd.
/// @pre prompts index text's rows; steps >= 1; shift > 0.
inline torch::Tensor video_sample_ode(const std::shared_ptr<wan_transformer>& model, const torch::Tensor& text,
                                      std::span<const std::int64_t> prompts, std::uint64_t seed, int steps = 20,
                                      double shift = 5.0, std::int64_t frames = moving_shapes_frames,
                                      std::int64_t height = shapes_image_size, std::int64_t width = shapes_image_size) {
  const sigma_schedule schedule = shifted_linear_schedule(steps, shift);
  const std::int64_t channels = model->config().in_dim;
  const torch::Device device = model->patch_embedding->weight.device();
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  if (prompts.empty()) return torch::empty({0, channels, frames, height, width}, f32);
  torch::NoGradGuard no_grad;
  torch_backend backend{.device = device, .dtype = torch::kFloat32};
  wan_denoiser denoiser(model, text.to(f32));
  return sample_ode(backend, denoiser, schedule, latent_shape{{channels, frames, height, width}}, prompts,
                    detail::ode_root_key(seed), static_cast<std::int64_t>(prompts.size()))
      .front();
}

}  // namespace branchgrpo
