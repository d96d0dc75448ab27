// Video rewards (tools/app/branchgrpo/app/video_rewards.hpp): the moving-shapes alignment and temporal smoothness
// on hand-built clips with hand-computed scores, their weighted sum, and a TorchScript video reward saved, loaded
// and scored (the module is defined in C++ with torch::jit::Module::define, as test_autoencoder does for images).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <numbers>
#include <string>
#include <vector>

#include "branchgrpo/app/rewards.hpp"
#include "branchgrpo/app/video_rewards.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/torch/backend.hpp"
#include "branchgrpo/training/concepts.hpp"
#include "error_text.hpp"

using namespace branchgrpo;

static_assert(Reward<torchscript_video_reward, torch_backend>);
static_assert(Reward<moving_shape_alignment, torch_backend>);
static_assert(Reward<temporal_smoothness, torch_backend>);

namespace {

std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("branchgrpo_test_video_rewards_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// A clip [F, 3, 16, 16] in [-1, 1]: background 0.84 (0.92 in [0, 1]), and in frame t a 4 x 4 square of colour
/// `colour` ([-1, 1]) at rows top + dy t .. +3 and columns left + dx t .. +3.
torch::Tensor square_clip(std::int64_t frames, std::int64_t left, std::int64_t top, std::int64_t dx, std::int64_t dy,
                          std::vector<float> colour = {0.8F, -0.8F, -0.8F}) {
  torch::Tensor clip = torch::full({frames, 3, 16, 16}, 0.84);
  for (std::int64_t t = 0; t < frames; ++t)
    for (std::int64_t k = 0; k < 3; ++k)
      clip[t][k]
          .narrow(0, top + dy * t, 4)
          .narrow(1, left + dx * t, 4)
          .fill_(static_cast<double>(colour[static_cast<std::size_t>(k)]));
  return clip;
}

/// Index of "a <colour> <shape> moving <direction>" in moving_shapes_prompts().
std::int64_t prompt_index(const std::string& prompt) {
  const std::vector<std::string> all = moving_shapes_prompts();
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i] == prompt) return static_cast<std::int64_t>(i);
  FAIL("no prompt " << prompt);
  return -1;
}

}  // namespace

TEST_CASE("moving-shapes prompts parse into colour, shape and direction", "[video_rewards]") {
  const std::vector<std::string> prompts = moving_shapes_prompts();
  REQUIRE(prompts.size() == 48);
  CHECK(prompts[0] == "a red circle moving left");
  CHECK(prompts[5] == "a red square moving right");
  CHECK(prompts[47] == "a yellow triangle moving down");
  CHECK(parse_moving_shapes_prompt("A blue triangle moving Up") ==
        moving_shape_target{.shape = {.colour = 2, .shape = 2}, .direction = 2});
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const moving_shape_target target = parse_moving_shapes_prompt(prompts[i]);
    CHECK(4 * (3 * target.shape.colour + target.shape.shape) + target.direction == static_cast<int>(i));
  }
  CHECK(testing::error_of([] { (void)parse_moving_shapes_prompt("a red square"); }) ==
        "prompt 'a red square' names no direction of motion (left, right, up, down)");
}

TEST_CASE("locate_shape: the doc example's centroid", "[video_rewards]") {
  const torch::Tensor clip = square_clip(1, 2, 6, 0, 0);
  const shape_position at = locate_shape(clip[0]);
  CHECK(at.features.object);
  CHECK(at.features.fill == Approx(1.0));
  CHECK(at.cx == Approx(4.0));
  CHECK(at.cy == Approx(8.0));
  CHECK_FALSE(locate_shape(torch::full({3, 16, 16}, 0.84)).features.object);
}

TEST_CASE("moving_shape_alignment: the doc example's scores", "[video_rewards]") {
  // 3 frames, the red square at columns 2..5, 4..7, 6..9 (centroid x 4, 6, 8), rows 6..9.
  const torch::Tensor clip = square_clip(3, 2, 6, 2, 0);
  const torch::Tensor clips = torch::stack({clip, clip, clip, clip});
  const std::vector<std::int64_t> prompts{
      prompt_index("a red square moving right"), prompt_index("a red square moving left"),
      prompt_index("a red square moving up"), prompt_index("a red circle moving right")};
  moving_shape_alignment reward;
  const std::vector<double> scores = reward(clips, prompts);
  REQUIRE(scores.size() == 4);
  CHECK(scores[0] == Approx(1.0).margin(1e-9));
  CHECK(scores[1] == Approx(2.0 / 3).margin(1e-9));
  CHECK(scores[2] == Approx(2.0 / 3).margin(1e-9));
  const double circle = std::exp(-std::pow(1 - std::numbers::pi / 4, 2) / (2 * 0.08 * 0.08));
  CHECK(circle == Approx(0.0274).margin(1e-4));
  CHECK(scores[3] == Approx((1 + circle + 1) / 3).margin(1e-9));
  CHECK(scores[3] == Approx(0.676).margin(1e-3));

  // Half the travel earns half the motion term.
  reward.travel = 8;
  CHECK(reward(clip.unsqueeze(0), std::vector<std::int64_t>{prompts[0]})[0] == Approx(2.5 / 3).margin(1e-9));

  // Downwards, 1 pixel a frame over 5 frames: D = (0, 4), full motion for "down", none for "right".
  const torch::Tensor down = square_clip(5, 6, 2, 0, 1);
  const std::vector<double> vertical = moving_shape_alignment{}(
      torch::stack({down, down}),
      std::vector<std::int64_t>{prompt_index("a red square moving down"), prompt_index("a red square moving right")});
  CHECK(vertical[0] == Approx(1.0).margin(1e-9));
  CHECK(vertical[1] == Approx(2.0 / 3).margin(1e-9));

  // A blue square scores no colour: |f - c_red|^2 = 0.64 + 0.0225... -> exp(-large) ~ 0; r = (0 + 1 + 1) / 3.
  const torch::Tensor blue = square_clip(3, 2, 6, 2, 0, {-0.7F, -0.5F, 0.9F});  // (0.15, 0.25, 0.95)
  CHECK(moving_shape_alignment{}(blue.unsqueeze(0), std::vector<std::int64_t>{prompts[0]})[0] ==
        Approx(2.0 / 3).margin(1e-6));
  CHECK(moving_shape_alignment{}(blue.unsqueeze(0), std::vector<std::int64_t>{prompt_index(
                                                        "a blue square moving right")})[0] == Approx(1.0).margin(1e-6));

  // No object in any frame: every term 0. A frame with a NaN: NaN.
  const torch::Tensor empty = torch::full({1, 3, 3, 16, 16}, 0.84);
  CHECK(moving_shape_alignment{}(empty, std::vector<std::int64_t>{0})[0] == 0.0);
  torch::Tensor broken = clip.clone();
  broken[2][1][3][3] = std::nan("");
  CHECK(std::isnan(moving_shape_alignment{}(broken.unsqueeze(0), std::vector<std::int64_t>{prompts[0]})[0]));
}

TEST_CASE("moving_shape_alignment rejects bad input with one line", "[video_rewards]") {
  const torch::Tensor clips = square_clip(2, 2, 6, 2, 0).unsqueeze(0);
  const std::vector<std::int64_t> one{5};
  CHECK(testing::error_of([&] { (void)moving_shape_alignment{}(clips[0], one); }) ==
        "moving_shape_alignment expects clips [rows, F, 3, H, W], got [2, 3, 16, 16]");
  CHECK(testing::error_of([&] { (void)moving_shape_alignment{}(clips, std::vector<std::int64_t>{}); }) ==
        "moving_shape_alignment got 0 prompts for 1 rows");
  CHECK(testing::error_of([&] { (void)moving_shape_alignment{}(clips, std::vector<std::int64_t>{48}); }) ==
        "moving_shape_alignment row 0 has prompt 48, the prompt list has 48");
  CHECK(testing::error_of([&] { (void)moving_shape_alignment{.motion_weight = 0.5}(clips, one); }) ==
        "moving_shape_alignment weights must sum to 1, got 1.16667");
  CHECK(testing::error_of([&] { (void)moving_shape_alignment{.travel = 0}(clips, one); }) ==
        "moving_shape_alignment widths and travel must be positive, got 0");
}

TEST_CASE("temporal_smoothness: the doc example's scores", "[video_rewards]") {
  // Static and moving clips: no flicker.
  const torch::Tensor still = square_clip(3, 2, 6, 0, 0), moving = square_clip(3, 2, 6, 2, 0);
  // Background alternating 0.5, 0.6, 0.5 in [0, 1] (0, 0.2, 0 in [-1, 1]): flicker 0.1 -> exp(-2).
  torch::Tensor alternating = torch::zeros({3, 3, 16, 16});
  alternating[1].fill_(0.2);
  // One jump 0.5 -> 0.6 that stays: d = 0.1, 0 -> flicker 0.05 -> exp(-1).
  torch::Tensor jump = torch::zeros({3, 3, 16, 16});
  jump[1].fill_(0.2);
  jump[2].fill_(0.2);
  // Noise of +-0.1 ([-1, 1]) on alternate pixels of frame 1: every pixel changes by 0.05 -> flicker 0.05.
  torch::Tensor noisy = torch::zeros({2, 3, 16, 16});
  noisy[1] = torch::where((torch::arange(256) % 2 == 0).reshape({16, 16}), 0.1, -0.1).expand({3, 16, 16});
  const torch::Tensor clips = torch::stack({still, moving, alternating, jump});
  const std::vector<double> scores = temporal_smoothness{}(clips, std::vector<std::int64_t>{0, 1, 2, 3});
  CHECK(scores[0] == 1.0);
  CHECK(scores[1] == 1.0);
  CHECK(scores[2] == Approx(std::exp(-2.0)).margin(1e-9));
  CHECK(scores[2] == Approx(0.135).margin(1e-3));
  CHECK(scores[3] == Approx(std::exp(-1.0)).margin(1e-9));
  CHECK(temporal_smoothness{}(noisy.unsqueeze(0), std::vector<std::int64_t>{0})[0] ==
        Approx(std::exp(-1.0)).margin(1e-6));
  CHECK(temporal_smoothness::flicker(alternating) == Approx(0.1).margin(1e-9));
  // A larger scale forgives more: exp(-0.1 / 0.1).
  CHECK(temporal_smoothness{.flicker_scale = 0.1}(alternating.unsqueeze(0), std::vector<std::int64_t>{0})[0] ==
        Approx(std::exp(-1.0)).margin(1e-9));
  // One frame: nothing to flicker. A NaN: NaN.
  CHECK(temporal_smoothness{}(still.narrow(0, 0, 1).unsqueeze(0), std::vector<std::int64_t>{0})[0] == 1.0);
  torch::Tensor broken = still.clone();
  broken[0][0][0][0] = INFINITY;
  CHECK(std::isnan(temporal_smoothness{}(broken.unsqueeze(0), std::vector<std::int64_t>{0})[0]));
  CHECK(testing::error_of([&] {
          (void)temporal_smoothness{.flicker_scale = -1}(clips, std::vector<std::int64_t>{0, 1, 2, 3});
        }) == "temporal_smoothness flicker_scale must be positive, got -1");
}

TEST_CASE("video rewards combine with weighted_sum", "[video_rewards]") {
  const torch::Tensor moving = square_clip(3, 2, 6, 2, 0);
  torch::Tensor flickering = moving.clone();
  flickering[1] -= 0.2;  // frame 1 darker by 0.1 in [0, 1] (brighter would clip at 1): d = 0.1, 0.1 -> exp(-2)
  weighted_sum reward({{"motion", 1.0, moving_shape_alignment{}}, {"smooth", 0.5, temporal_smoothness{}}});
  const std::int64_t right = prompt_index("a red square moving right");
  const std::vector<double> scores =
      reward(torch::stack({moving, flickering}), std::vector<std::int64_t>{right, right});
  CHECK(scores[0] == Approx(1.0 + 0.5).margin(1e-9));
  CHECK(reward.last_rows().at("smooth")[1] == Approx(std::exp(-2.0)).margin(1e-6));
  CHECK(scores[1] == Approx(reward.last_rows().at("motion")[1] + 0.5 * std::exp(-2.0)).margin(1e-6));
}

namespace {

/// A scripted video reward: mean over frames and pixels of the channels weighted (1, 2, 3), plus the prompt index.
torch::jit::Module scripted_video_reward() {
  torch::jit::Module module("test_video_reward");
  module.register_buffer("weights", torch::tensor({1.0F, 2.0F, 3.0F}));
  module.define(R"(
def forward(self, frames: Tensor, prompts: Tensor) -> Tensor:
    means = frames.mean(dim=[1, 3, 4])
    return (means * self.weights).sum(dim=1) + prompts.to(frames.dtype)
)");
  return module;
}

}  // namespace

TEST_CASE("TorchScript video reward: save, load, score, NaN rows, chunks, decode, errors", "[video_rewards]") {
  const auto dir = fresh_dir("torchscript");
  const auto path = dir / "video_reward.pt";
  scripted_video_reward().save(path.string());
  torchscript_video_reward reward = load_torchscript_video_reward(path);

  // The doc example: a grey 0.5 clip with prompt 2 scores 0.5 * 6 + 2 = 5. Clip 1: frame 0 channels 0.1, 0.2,
  // 0.3 and frame 1 channels 0.3, 0.4, 0.5 -> means 0.2, 0.3, 0.4 -> 0.2 + 0.6 + 1.2 + 0 = 2. Clip 2 has a NaN.
  torch::Tensor clips = torch::full({3, 2, 3, 4, 4}, 0.5);
  for (std::int64_t k = 0; k < 3; ++k) {
    clips[1][0][k].fill_(0.1 * static_cast<double>(k + 1));
    clips[1][1][k].fill_(0.1 * static_cast<double>(k + 3));
  }
  clips[2][1][2][3][0] = std::nan("");
  const std::vector<std::int64_t> prompts{2, 0, 2};
  const std::vector<double> scores = reward(clips, prompts);
  REQUIRE(scores.size() == 3);
  CHECK(scores[0] == Approx(5.0).margin(1e-6));
  CHECK(scores[1] == Approx(2.0).margin(1e-6));
  CHECK(std::isnan(scores[2]));

  // Chunks of one clip give the same scores; a decoder maps leaves in [-1, 1] to frames in [0, 1].
  reward.batch = 1;
  const std::vector<double> chunked = reward(clips, prompts);
  CHECK(chunked[0] == Approx(scores[0]).margin(1e-6));
  CHECK(chunked[1] == Approx(scores[1]).margin(1e-6));
  CHECK(std::isnan(chunked[2]));
  torchscript_video_reward decoded =
      load_torchscript_video_reward(path, [](const torch::Tensor& leaves) { return (leaves + 1) / 2; });
  CHECK(decoded(torch::zeros({1, 2, 3, 4, 4}), std::vector<std::int64_t>{1})[0] == Approx(0.5 * 6 + 1).margin(1e-6));

  // Errors: one line naming the file.
  const std::string name = path.string();
  CHECK(testing::error_of([&] {
          (void)reward(clips, std::vector<std::int64_t>{0, 1});
        }) == "torchscript_video_reward '" + name + "': 2 prompts for 3 leaves");
  CHECK(testing::error_of([&] {
          (void)reward(clips, std::vector<std::int64_t>{0, -1, 0});
        }) == "torchscript_video_reward '" + name + "': prompt index -1 at row 1 is negative");
  CHECK(testing::error_of([&] {
          (void)reward(torch::zeros({2, 3, 4, 4}), std::vector<std::int64_t>{0, 0});
        }) == "torchscript_video_reward '" + name + "': frames must be [1, F, 3, H, W], got [1, 3, 4, 4]");
  reward.batch = 0;
  CHECK(testing::error_of([&] { (void)reward(clips, prompts); }) ==
        "torchscript_video_reward: batch 0 must be at least 1");
  torch::jit::Module wrong_count("wrong_count");
  wrong_count.define(R"(
def forward(self, frames: Tensor, prompts: Tensor) -> Tensor:
    return frames.mean(dim=[2, 3, 4])
)");
  wrong_count.save((dir / "wrong_count.pt").string());
  torchscript_video_reward bad = load_torchscript_video_reward(dir / "wrong_count.pt");
  CHECK(testing::error_of([&] { (void)bad(clips, prompts); }) == "TorchScript video reward '" +
                                                                     (dir / "wrong_count.pt").string() +
                                                                     "' returned [3, 2] for 3 clips (expected [3])");
  std::filesystem::remove_all(dir);
}
