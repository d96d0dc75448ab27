// docs/extending.md, "A reward": a toy reward added through exactly the page's steps, one reward_table entry
// (torch-free) and one reward_builder (tools/app/branchgrpo/app/reward_builds.hpp), here in this file as a user's
// own lists; built, checked and refused through the same path as the shipped ones.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "branchgrpo/app/reward_builds.hpp"
#include "error_text.hpp"

namespace bg = branchgrpo;
using bg::testing::error_of;

namespace {

// The toy: every image scores params.offset (default 0.25), in [-1, 1].
constexpr std::array toy_params = {
    bg::reward_param{.name = "offset", .rule = bg::param_rule::in_range, .low = -1, .high = 1}};

bg::named_reward toy_image(const bg::reward_request& r) {
  const double offset = r.params.number("offset", 0.25);
  return r.term([offset](const torch::Tensor& images, std::span<const std::int64_t>) {
    return std::vector<double>(static_cast<std::size_t>(images.size(0)), offset);
  });
}

// The shipped table and builders with the toy's entry appended: the one step of adding a reward.
constexpr auto toy_table = [] {
  std::array<bg::reward_descriptor, bg::reward_table.size() + 1> t{};
  std::copy(bg::reward_table.begin(), bg::reward_table.end(), t.begin());
  t.back() = {.name = "toy", .media = bg::reward_media::image, .params = toy_params, .doc = "a constant"};
  return t;
}();
constexpr auto toy_builders = [] {
  std::array<bg::reward_builder, bg::reward_builders.size() + 1> b{};
  std::copy(bg::reward_builders.begin(), bg::reward_builders.end(), b.begin());
  b.back() = {.name = "toy", .image = toy_image};
  return b;
}();
static_assert(bg::builds_table(toy_table, toy_builders));
static_assert(!bg::builds_table(toy_table, bg::reward_builders));  // the table's entry without its builder

bg::weighted_sum build(const bg::run_config& config, const bg::run_model& model) {
  return bg::build_run_reward(config, model, {.entries = config.rewards, .key = "rewards"}, toy_table, toy_builders);
}

}  // namespace

TEST_CASE("a toy reward added as one table entry and one builder is built, checked and refused like the others") {
  bg::run_model model;  // an image model: the toy's scores do not look at it
  model.prompts = {"a red circle"};
  bg::run_config config;
  config.rewards = {{.name = "toy", .weight = 2.0, .params = {{"offset", 0.5}}}};
  bg::weighted_sum reward = build(config, model);
  const std::vector<std::int64_t> prompts = {0, 0};
  CHECK(reward(torch::zeros({2, 3, 4, 4}), prompts) == std::vector<double>{1.0, 1.0});

  config.rewards[0].params = {{"offset", 2.0}};
  CHECK(error_of([&] { (void)build(config, model); }) == "config: rewards[0].params.offset = 2: must be in [-1, 1]");
  config.rewards[0].params = {{"ofset", 0.5}};
  CHECK(error_of([&] { (void)build(config, model); }) ==
        "config: unknown key rewards[0].params.ofset (toy has: offset)");
  config.rewards[0] = {.name = "hps"};
  CHECK(error_of([&] { (void)build(config, model); }) ==
        "config: rewards[0].name = 'hps': must be alignment, jpeg_compressibility, jpeg_incompressibility, "
        "smoothness, torchscript, remote, vlm_judge or toy");
  // The shipped table does not know it.
  config.rewards[0] = {.name = "toy"};
  CHECK(error_of([&] { (void)bg::build_run_reward(config, model, {.entries = config.rewards}); }) ==
        "config: rewards[0].name = 'toy': must be alignment, jpeg_compressibility, jpeg_incompressibility, "
        "smoothness, torchscript, remote or vlm_judge");
  CHECK_THROWS_AS(bg::build_run_reward(config, model, {.entries = config.rewards}, toy_table), std::logic_error);
}
