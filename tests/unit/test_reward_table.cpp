// The torch-free reward table (adapters/config/branchgrpo/config/reward_table.hpp) and its params reader
// (reward_params.hpp): the doc examples, each rule's one-line error, the config reader's names from the table.
#include <catch2/catch.hpp>

#include <string>

#include "branchgrpo/config/reward_params.hpp"
#include "branchgrpo/config/reward_table.hpp"
#include "branchgrpo/config/run_config.hpp"
#include "error_text.hpp"

namespace bg = branchgrpo;
using bg::testing::error_of;

static_assert(bg::reward_names.size() == bg::reward_table.size());
static_assert(bg::reward_names[0] == "alignment");
static_assert(bg::find_reward("smoothness")->media == bg::reward_media::video);
static_assert(bg::find_reward("hps") == nullptr);
static_assert(bg::serves(bg::reward_media::both, bg::reward_media::video));
static_assert(!bg::serves(bg::reward_media::image, bg::reward_media::video));

TEST_CASE("reward_table: the doc examples; every entry's params are named once") {
  CHECK(bg::reward_names_for(bg::reward_media::video) == "alignment, smoothness, torchscript, remote or vlm_judge");
  CHECK(bg::reward_names_for(bg::reward_media::image) ==
        "alignment, jpeg_compressibility, jpeg_incompressibility, torchscript, remote or vlm_judge");
  for (const bg::reward_descriptor& reward : bg::reward_table) {
    CHECK(bg::find_reward(reward.name) == &reward);
    for (std::size_t i = 0; i < reward.params.size(); ++i)
      for (std::size_t j = i + 1; j < reward.params.size(); ++j) CHECK(reward.params[i].name != reward.params[j].name);
  }
}

TEST_CASE("param_why: each rule's reason") {
  using enum bg::param_rule;
  CHECK(bg::param_why({.name = "q", .rule = integer_in, .low = 1, .high = 100}, 101) ==
        "must be an integer in [1, 100]");
  CHECK(bg::param_why({.name = "q", .rule = integer_in, .low = 1, .high = 100}, 95).empty());
  CHECK(bg::param_why({.name = "b", .rule = integer_from, .low = 1}, 0.5) == "must be an integer >= 1");
  CHECK(bg::param_why({.name = "w", .rule = positive}, 0) == "must be positive");
  CHECK(bg::param_why({.name = "t", .rule = in_range, .low = 0.001, .high = 86400}, 0) == "must be in [0.001, 86400]");
  CHECK(bg::param_why({.name = "r", .rule = in_range, .low = 0, .high = 100, .whole = true}, 1.5) ==
        "must be an integer");
  CHECK(bg::param_why({.name = "m", .rule = zero_or_in, .low = 1024, .high = 1 << 30, .whole = true}, 0).empty());
  CHECK(bg::param_why({.name = "m", .rule = zero_or_in, .low = 1024, .high = 1 << 30, .whole = true}, 10) ==
        "must be in [1024, 1073741824]");
  CHECK(bg::param_why({.name = "b", .rule = in_range, .low = 1, .high = 1e6, .whole = true}, 0) ==
        "must be in [1, 1e+06]");
}

TEST_CASE("reward_param_reader: the doc examples, media, required strings, urls") {
  const auto reader = [](const bg::reward_entry& entry, bg::reward_media medium) {
    return bg::reward_param_reader{.source = "run.toml",
                                   .entry = entry,
                                   .index = 0,
                                   .list = "rewards",
                                   .reward = *bg::find_reward(entry.name),
                                   .medium = medium};
  };
  const bg::reward_entry jpeg{.name = "jpeg_compressibility", .params = {{"quality", 101.0}}};
  CHECK(error_of([&] { (void)reader(jpeg, bg::reward_media::image).number("quality", 95); }) ==
        "run.toml: rewards[0].params.quality = 101: must be an integer in [1, 100]");
  const bg::reward_entry unset{.name = "jpeg_compressibility"};
  CHECK(reader(unset, bg::reward_media::image).number("quality", 95) == 95);
  const bg::reward_entry typo{.name = "alignment", .params = {{"colour", 1.0}}};
  CHECK(error_of([&] { reader(typo, bg::reward_media::image).finish(); }) ==
        "run.toml: unknown key rewards[0].params.colour (alignment has: colour_weight, colour_width, fill_width)");
  // A video-only param of alignment is unknown on an image model, known on a video one.
  const bg::reward_entry travel{.name = "alignment", .params = {{"travel", 2.0}}};
  CHECK(error_of([&] { reader(travel, bg::reward_media::image).finish(); }) ==
        "run.toml: unknown key rewards[0].params.travel (alignment has: colour_weight, colour_width, fill_width)");
  CHECK(error_of([&] { reader(travel, bg::reward_media::video).finish(); }) == "(no error)");
  // A build reading a param its entry does not declare (or as the other type) is a programming error.
  CHECK_THROWS_AS(reader(unset, bg::reward_media::image).text("quality", ""), std::logic_error);
  const bg::reward_entry remote{.name = "remote", .params = {{"url", std::string("127.0.0.1:9")}}};
  CHECK(error_of([&] { (void)reader(remote, bg::reward_media::image).text("url", ""); }) ==
        "run.toml: rewards[0].params.url = '127.0.0.1:9': is not http:// or https://");
  const bg::reward_entry no_url{.name = "remote"};
  CHECK(error_of([&] { (void)reader(no_url, bg::reward_media::video).text("url", ""); }) ==
        "run.toml: rewards[0].params.url: the remote reward needs a url");
  const bg::reward_entry text_number{.name = "torchscript", .params = {{"batch", std::string("many")}}};
  CHECK(error_of([&] { (void)reader(text_number, bg::reward_media::image).number("batch", 16); }) ==
        "run.toml: rewards[0].params.batch = 'many': must be a number");
}

TEST_CASE("the config reader takes the reward names from the table") {
  const std::string error = error_of([] { (void)bg::parse_run_config("[[rewards]]\nname = \"hps\"\n", "run.toml"); });
  CHECK(error == "run.toml: rewards[0].name = 'hps': must be " + bg::name_list(bg::reward_names));
  for (const std::string_view name : bg::reward_names)
    CHECK(bg::parse_run_config("[[rewards]]\nname = \"" + std::string(name) + "\"\n", "run.toml").rewards[0].name ==
          name);
}
