#pragma once
// Rewards on decoded videos, each modelling the core's Reward concept on torch_backend. A video leaf is a clip of
// F frames: leaves [rows, F, 3, H, W] (frame-major, each frame RGB like the image rewards of rewards.hpp).
//
//   torchscript_video_reward{module, path, decode, ...}  a user-exported video reward model (VideoAlign,
//                          VideoScore, ...): forward(frames [B, F, 3, H, W] float in [0, 1], prompts int64 [B])
//                          -> scores [B]; `decode` turns leaf latents into such frames first
//   moving_shape_alignment{}  colour, shape and direction of motion of the clip's shape against a prompt like
//                          "a red square moving right", in [0, 1], from the pixels alone
//   temporal_smoothness{}  1 for a clip without frame-to-frame flicker, towards 0 with more, in [0, 1]
//
// Ranges: the procedural rewards read the leaves as pixels in [-1, 1] (the shapes model's and the autoencoders'
// output range, as shape_alignment does): v = clamp((x + 1) / 2, 0, 1). The TorchScript reward is given frames in
// [0, 1] (what video reward models' preprocessing starts from; a decoder producing [-1, 1] maps (x + 1) / 2 in
// its `decode`), as torchscript_reward is given images in [0, 1].
//
// They combine with weighted_sum (rewards.hpp) like the image rewards, e.g.
//   weighted_sum({{"motion", 1.0, moving_shape_alignment{}}, {"smooth", 0.5, temporal_smoothness{}}}).
// A row holding a non-finite value scores NaN (the trainer drops its tree).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/app/rewards.hpp"
#include "branchgrpo/app/shapes.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/torchscript.hpp"

namespace branchgrpo {

// ---- TorchScript video reward models -----------------------------------------------------------------------------

/// Leaf latents [rows, ...] -> frames [rows, F, 3, H, W] in [0, 1].
using video_decoder_fn = std::function<torch::Tensor(const torch::Tensor& leaves)>;

/// A TorchScript video reward model behind the core's Reward concept (torch_backend): the leaves are decoded to
/// frames in [0, 1] by `decode` (identity when empty: the leaves are such frames already), passed in chunks of
/// `batch` rows with their prompt indices (int64 [rows]) to forward(frames, prompts) -> scores [rows].
/// Export one from Python as for images (docs/export_rewards.md), e.g. VideoAlign's reward head wrapped as
///   class Reward(torch.nn.Module):
///       def forward(self, frames: Tensor, prompts: Tensor) -> Tensor:  # [B, F, 3, H, W] in [0, 1], [B]
///           return self.model(self.preprocess(frames), self.prompt_tokens[prompts])
///   torch.jit.script(Reward(...)).save("videoalign.pt")
/// Example: forward = mean over frames and pixels of the channels weighted (1, 2, 3) + prompt; a grey 0.5 clip
///   with prompt 2 scores 0.5 * 6 + 2 = 5, the same clip holding one NaN pixel in any frame scores NaN.
/// @pre prompts.size() == leaves.size(0); prompt indices non-negative; batch >= 1.
/// @post one score per leaf, in leaf order; NaN where the clip was not finite (the module sees zeros instead, so
///       one failed leaf cannot poison the batch).
struct torchscript_video_reward {
  torch::jit::Module module;
  std::filesystem::path path;            ///< named in error messages
  video_decoder_fn decode;               ///< leaves -> frames in [0, 1]; empty: identity
  std::int64_t batch = 4;                ///< clips per forward call (memory bound of the reward model)
  torch::Device device = torch::kCPU;    ///< frames and prompts are moved here
  torch::Dtype dtype = torch::kFloat32;  ///< frames are converted to this dtype

  std::vector<double> operator()(const torch::Tensor& leaves, std::span<const std::int64_t> prompts) {
    return detail::score_with_torchscript(
        {.module = module, .path = path, .decode = decode, .batch = batch, .device = device, .dtype = dtype}, leaves,
        prompts,
        {.type = "torchscript_video_reward",
         .model = "TorchScript video reward",
         .samples = "frames",
         .shape = "F, 3, H, W",
         .dims = 5,
         .channel_dim = 2,
         .what = "video reward",
         .items = "clips"});
  }
};

/// load_torchscript(path, device) wrapped as a video reward with the given decoder (empty: leaves are frames).
/// Example: load_torchscript_video_reward("videoalign.pt", [&](const torch::Tensor& z) { return vae(z); }).
inline torchscript_video_reward load_torchscript_video_reward(const std::filesystem::path& path,
                                                              video_decoder_fn decode = {},
                                                              torch::Device device = torch::kCPU) {
  return {.module = load_torchscript(path, device), .path = path, .decode = std::move(decode), .device = device};
}

// ---- The moving-shapes task --------------------------------------------------------------------------------------

/// Directions of motion in image coordinates (x to the right, y down): unit vectors (-1, 0), (1, 0), (0, -1),
/// (0, 1).
inline constexpr std::array<std::string_view, 4> motion_direction_names = {"left", "right", "up", "down"};

/// What a moving-shapes prompt asks for: a coloured shape (shapes_target) and its direction of motion.
struct moving_shape_target {
  shapes_target shape;
  int direction = 0;  ///< index into motion_direction_names

  friend bool operator==(const moving_shape_target&, const moving_shape_target&) = default;
};

/// The 48 moving-shapes prompts in index order: prompt 4 (3 c + s) + d is "a <colour c> <shape s> moving
/// <direction d>".
/// Example: moving_shapes_prompts()[0] == "a red circle moving left", [5] == "a red square moving right".
inline std::vector<std::string> moving_shapes_prompts() {
  std::vector<std::string> out;
  for (const std::string& still : shapes_prompts())
    for (const std::string_view direction : motion_direction_names)
      out.push_back(still + " moving " + std::string(direction));
  return out;
}

/// The colour, shape (parse_shapes_prompt) and direction (the first word that is a direction name, ASCII
/// case-insensitive) a prompt names.
/// Example: "A blue triangle moving Up" -> {{.colour = 2, .shape = 2}, .direction = 2}; "a red square" throws
///   "prompt 'a red square' names no direction of motion (left, right, up, down)".
/// @pre the prompt holds a colour, a shape and a direction word (else invalid_input naming the prompt).
inline moving_shape_target parse_moving_shapes_prompt(std::string_view prompt) {
  moving_shape_target out{.shape = parse_shapes_prompt(prompt), .direction = -1};
  for (const std::string& word : prompt_words(prompt))
    for (std::size_t d = 0; d < motion_direction_names.size() && out.direction < 0; ++d)
      if (word == motion_direction_names[d]) out.direction = static_cast<int>(d);
  require(out.direction >= 0, "prompt '", echo_middle(prompt, 80),
          "' names no direction of motion (left, right, up, down)");
  return out;
}

namespace detail {

// [rows, F, 3, H, W] float64 CPU contiguous copy of the leaves, after checking their shape and the prompt count.
inline torch::Tensor reward_clips(const torch::Tensor& leaves, std::span<const std::int64_t> prompts,
                                  const char* reward, std::int64_t min_frames, std::int64_t min_side) {
  require(leaves.defined() && leaves.dim() == 5 && leaves.size(2) == 3, reward,
          " expects clips [rows, F, 3, H, W], got ", leaves.defined() ? leaves.sizes() : c10::IntArrayRef{});
  require(leaves.size(1) >= min_frames && leaves.size(3) >= min_side && leaves.size(4) >= min_side, reward,
          " needs at least ", min_frames, " frames of ", min_side, " x ", min_side, " pixels, got ", leaves.size(1),
          " of ", leaves.size(3), " x ", leaves.size(4));
  require(static_cast<std::int64_t>(prompts.size()) == leaves.size(0), reward, " got ", prompts.size(), " prompts for ",
          leaves.size(0), " rows");
  return leaves.detach().to(torch::kCPU, torch::kFloat64).contiguous();
}

}  // namespace detail

/// Where a frame's shape is: measure_shape's features plus the coverage-weighted centroid
///   (cx, cy) = sum_p m(p) (j + 1/2, i + 1/2) / sum_p m(p)   (pixel (row i, column j); m as in shape_features)
/// in pixels from the top-left corner.
struct shape_position {
  shape_features features;
  double cx = 0, cy = 0;
};

/// shape_position of one frame [3, H, W] in [-1, 1].
/// Example: a 16 x 16 frame of background 0.84 with the 4 x 4 square of rows 6..9 and columns 2..5 at
///   (0.8, -0.8, -0.8) -> object, fill 1, centroid (4, 8).
/// @pre frame [3, H, W] with H, W >= 3, finite.
inline shape_position locate_shape(const torch::Tensor& frame) {
  shape_position out{.features = measure_shape(frame)};
  if (!out.features.object) return out;
  const torch::Tensor v = ((frame.detach().to(torch::kCPU, torch::kFloat64) + 1.0) / 2.0).clamp(0.0, 1.0).contiguous();
  const auto a = v.accessor<double, 3>();
  const auto& b = out.features.background;
  const auto& f = out.features.foreground;
  double axis_squared = 0;
  for (std::size_t k = 0; k < 3; ++k) axis_squared += (f[k] - b[k]) * (f[k] - b[k]);
  double total = 0, sx = 0, sy = 0;
  for (std::int64_t i = 0; i < v.size(1); ++i)
    for (std::int64_t j = 0; j < v.size(2); ++j) {
      double projection = 0;
      for (std::size_t k = 0; k < 3; ++k) projection += (a[static_cast<std::int64_t>(k)][i][j] - b[k]) * (f[k] - b[k]);
      const double m = std::clamp((projection / axis_squared - 0.15) / 0.7, 0.0, 1.0);  // measure_shape's coverage
      total += m;
      sx += m * (static_cast<double>(j) + 0.5);
      sy += m * (static_cast<double>(i) + 0.5);
    }
  if (total > 0) {
    out.cx = sx / total;
    out.cy = sy / total;
  }
  return out;
}

/// Prompt alignment of the moving-shapes task from the frames alone, in [0, 1]:
///   r = colour_weight s_colour + shape_weight s_shape + motion_weight s_motion   (weights summing to 1)
///   s_colour = mean over frames of exp(-|f_t - c_p|^2 / (2 colour_width^2))    (shape_alignment's terms, per
///   s_shape  = mean over frames of exp(-(fill_t - fill_p)^2 / (2 fill_width^2))  frame; 0 for a frame without
///                                                                                an object)
///   s_motion = clamp((D . u_p) / travel, 0, 1),  D = centroid of the last frame with an object - centroid of the
///              first (locate_shape), u_p the prompt's direction; 0 when fewer than two frames hold an object
/// so a shape that moves `travel` pixels or more the asked way over the clip gets the whole motion term, one that
/// stands still or moves the other way none, and a diagonal move counts by its component along u_p.
/// Example: 3 frames of 16 x 16, background 0.84, a pure red (0.8, -0.8, -0.8) 4 x 4 square at columns 2..5,
///   4..7, 6..9 (centroids x = 4, 6, 8): for "a red square moving right" s_colour = s_shape = 1, D = (4, 0),
///   s_motion = 4 / 4 = 1, r = 1; for "... moving left" s_motion = 0, r = 2/3; for "... moving up" 2/3; for
///   "a red circle moving right" s_shape = exp(-(1 - pi/4)^2 / 0.0128) = 0.0274, r = (1 + 0.0274 + 1) / 3 = 0.676;
///   with travel 8 the right-moving clip scores (1 + 1 + 0.5) / 3 = 0.833.
/// @pre leaves [rows, F, 3, H, W] (F >= 1, H, W >= 3), prompts index `prompts` (each naming a colour, a shape and
///      a direction); weights >= 0 summing to 1 (within 1e-9); widths and travel > 0.
/// @post per row a value in [0, 1], or NaN when the row holds a non-finite value.
struct moving_shape_alignment {
  std::vector<std::string> prompts = moving_shapes_prompts();
  double colour_weight = 1.0 / 3;
  double shape_weight = 1.0 / 3;
  double motion_weight = 1.0 / 3;
  double colour_width = 0.2;
  double fill_width = 0.08;
  double travel = 4.0;  ///< pixels of motion along the prompt's direction that earn the whole motion term
  std::array<double, 3> fill_targets = shape_alignment{}.fill_targets;

  /// The three terms of one clip [F, 3, H, W] for a target: {s_colour, s_shape, s_motion}.
  [[nodiscard]] std::array<double, 3> terms(const torch::Tensor& clip, const moving_shape_target& target) const {
    static constexpr std::array<std::array<double, 2>, 4> unit = {{{-1, 0}, {1, 0}, {0, -1}, {0, 1}}};
    const auto frames = clip.size(0);
    double colour = 0, shape = 0;
    std::vector<shape_position> seen;
    for (std::int64_t t = 0; t < frames; ++t) {
      const shape_position at = locate_shape(clip[t]);
      if (!at.features.object) continue;
      double squared = 0;
      for (std::size_t k = 0; k < 3; ++k)
        squared +=
            std::pow(at.features.foreground[k] - shapes_palette[static_cast<std::size_t>(target.shape.colour)][k], 2);
      colour += std::exp(-squared / (2 * colour_width * colour_width));
      const double gap = at.features.fill - fill_targets[static_cast<std::size_t>(target.shape.shape)];
      shape += std::exp(-gap * gap / (2 * fill_width * fill_width));
      seen.push_back(at);
    }
    double motion = 0;
    if (seen.size() >= 2) {
      const auto& u = unit[static_cast<std::size_t>(target.direction)];
      const double along = (seen.back().cx - seen.front().cx) * u[0] + (seen.back().cy - seen.front().cy) * u[1];
      motion = std::clamp(along / travel, 0.0, 1.0);
    }
    return {colour / static_cast<double>(frames), shape / static_cast<double>(frames), motion};
  }

  std::vector<double> operator()(const torch::Tensor& leaves, std::span<const std::int64_t> rows_prompts) const {
    for (const double weight : {colour_weight, shape_weight, motion_weight})
      require(std::isfinite(weight) && weight >= 0, "moving_shape_alignment weights must be non-negative, got ",
              weight);
    require(std::abs(colour_weight + shape_weight + motion_weight - 1) <= 1e-9,
            "moving_shape_alignment weights must sum to 1, got ", colour_weight + shape_weight + motion_weight);
    for (const double width : {colour_width, fill_width, travel})
      require(std::isfinite(width) && width > 0, "moving_shape_alignment widths and travel must be positive, got ",
              width);
    const torch::Tensor clips = detail::reward_clips(leaves, rows_prompts, "moving_shape_alignment", 1, shape_min_side);
    std::vector<moving_shape_target> targets;
    for (const std::string& prompt : prompts) targets.push_back(parse_moving_shapes_prompt(prompt));
    std::vector<double> out(rows_prompts.size());
    for (std::size_t r = 0; r < out.size(); ++r) {
      const std::int64_t p = rows_prompts[r];
      require(p >= 0 && p < static_cast<std::int64_t>(targets.size()), "moving_shape_alignment row ", r, " has prompt ",
              p, ", the prompt list has ", targets.size());
      const auto row = static_cast<std::int64_t>(r);
      if (!detail::row_finite(clips, row)) {
        out[r] = std::numeric_limits<double>::quiet_NaN();
        continue;
      }
      const std::array<double, 3> s = terms(clips[row], targets[static_cast<std::size_t>(p)]);
      out[r] = colour_weight * s[0] + shape_weight * s[1] + motion_weight * s[2];
    }
    return out;
  }
};

/// Temporal smoothness from the frames alone, in [0, 1] (prompt-free):
///   d_t     = median over pixels p of mean over channels |v_{t+1}(p) - v_t(p)|, for t = 0 .. F - 2
///   flicker = mean over t of d_t
///   r       = exp(-flicker / flicker_scale)
/// with v = clamp((x + 1) / 2, 0, 1). The median skips the pixels a moving object changes as long as it covers
/// less than half of the frame, so motion is not flicker; global changes (brightness jumps, colour shifts,
/// per-frame noise) are. One frame: r = 1.
/// Example: a static clip -> 1; a moving red square on a constant background -> 1; 3 frames whose grey background
///   alternates 0.5, 0.6, 0.5 (in [0, 1]) -> d = 0.1, 0.1, flicker 0.1, r = exp(-0.1 / 0.05) = exp(-2) = 0.135;
///   a background that jumps once 0.5 -> 0.6 and stays over 3 frames -> flicker 0.05, r = exp(-1) = 0.368.
/// @pre leaves [rows, F, 3, H, W] (F >= 1, H, W >= 1), one prompt per row (ignored); flicker_scale > 0.
/// @post per row a value in (0, 1], or NaN when the row holds a non-finite value.
struct temporal_smoothness {
  double flicker_scale = 0.05;

  /// The flicker of one clip [F, 3, H, W] in [-1, 1].
  [[nodiscard]] static double flicker(const torch::Tensor& clip) {
    const torch::Tensor v = ((clip.detach().to(torch::kCPU, torch::kFloat64) + 1.0) / 2.0).clamp(0.0, 1.0);
    const std::int64_t frames = v.size(0);
    if (frames < 2) return 0.0;
    double sum = 0;
    for (std::int64_t t = 0; t + 1 < frames; ++t) {
      const torch::Tensor change = (v[t + 1] - v[t]).abs().mean(0).flatten().contiguous();
      std::vector<double> values(change.data_ptr<double>(), change.data_ptr<double>() + change.numel());
      std::sort(values.begin(), values.end());
      const std::size_t m = values.size();
      sum += m % 2 ? values[m / 2] : (values[m / 2 - 1] + values[m / 2]) / 2;
    }
    return sum / static_cast<double>(frames - 1);
  }

  std::vector<double> operator()(const torch::Tensor& leaves, std::span<const std::int64_t> prompts) const {
    require(std::isfinite(flicker_scale) && flicker_scale > 0, "temporal_smoothness flicker_scale must be positive, ",
            "got ", flicker_scale);
    const torch::Tensor clips = detail::reward_clips(leaves, prompts, "temporal_smoothness", 1, 1);
    std::vector<double> out(prompts.size());
    for (std::size_t r = 0; r < out.size(); ++r) {
      const auto row = static_cast<std::int64_t>(r);
      out[r] = detail::row_finite(clips, row) ? std::exp(-flicker(clips[row]) / flicker_scale)
                                              : std::numeric_limits<double>::quiet_NaN();
    }
    return out;
  }

  friend bool operator==(const temporal_smoothness&, const temporal_smoothness&) = default;
};

}  // namespace branchgrpo
