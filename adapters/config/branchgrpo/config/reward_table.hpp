#pragma once
// The rewards a run config may name, as one table (torch-free): each entry's name, the media it scores and the
// parameters it takes, each with the rule its value is checked by. The config reader takes its list of names from
// here; tools/app/branchgrpo/app/reward_builds.hpp builds each entry (one builder per entry, same names in the same
// order, checked at compile time). docs/config.md's [[rewards]] tables describe the same entries.
//
//   find_reward("jpeg_compressibility")  -> the entry {image, params: quality (an integer in [1, 100])}
//   find_reward("hps")                   -> nullptr (the config reader: "must be alignment, ..., or vlm_judge")
//   reward_names_for(reward_media::video) -> "alignment, smoothness, torchscript, remote or vlm_judge"
//
// Adding a reward: one entry in reward_table (with its params array) and one in reward_builders; docs/rewards.md
// "Adding a reward". A parameter's range is stated here only; the builder reads the checked value (and gives the
// default: the reward's own, e.g. jpeg_compressibility{}.quality).
#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/parameters.hpp"

namespace branchgrpo {

/// What a reward scores: images (image models), clips (video models) or either, as the model makes.
enum class reward_media : unsigned char { image = 1, video = 2, both = 3 };

/// Whether a reward (or parameter) of `media` serves a model making `medium` (image or video).
/// Example: serves(reward_media::both, reward_media::video) -> true; serves(image, video) -> false.
constexpr bool serves(reward_media media, reward_media medium) {
  return (static_cast<unsigned>(media) & static_cast<unsigned>(medium)) != 0;
}

/// How a reward parameter's value is checked, and the reason its one-line error gives.
enum class param_rule : unsigned char {
  any,           ///< any number, any string
  in_range,      ///< in [low, high] ("must be in [low, high]"), then, with whole, "must be an integer"
  integer_in,    ///< an integer in [low, high] ("must be an integer in [low, high]")
  integer_from,  ///< an integer >= low ("must be an integer >= low")
  positive,      ///< > 0 and finite ("must be positive")
  zero_or_in,    ///< 0, or as in_range
  http_url,      ///< a string starting http:// or https:// ("is not http:// or https://")
};

/// One parameter of a reward entry ([[rewards]] params.<name>).
struct reward_param {
  std::string_view name;
  bool text = false;  ///< a string (else a number)
  param_rule rule = param_rule::any;
  double low = 0, high = 0;
  bool whole = false;                       ///< in_range, zero_or_in: also an integer
  std::string_view required = {};           ///< non-empty: a missing or empty value fails with this reason
  reward_media media = reward_media::both;  ///< the models whose build reads it
  std::string_view doc = {};
};

/// One reward a config may name.
struct reward_descriptor {
  std::string_view name;
  reward_media media = reward_media::both;
  std::span<const reward_param> params = {};  ///< in the order errors list them ("alignment has: ...")
  std::string_view doc = {};
};

namespace reward_params_of {
using enum param_rule;
// A server's patience (http_client.hpp), shared by remote and vlm_judge.
inline constexpr reward_param connect_timeout{
    .name = "connect_timeout", .rule = in_range, .low = 0.001, .high = 3600, .doc = "seconds to connect"};
inline constexpr reward_param timeout{
    .name = "timeout", .rule = in_range, .low = 0.001, .high = 86400, .doc = "seconds per request"};
inline constexpr reward_param retries{
    .name = "retries", .rule = in_range, .low = 0, .high = 100, .whole = true, .doc = "retries of a failed request"};
inline constexpr reward_param backoff{
    .name = "backoff", .rule = in_range, .low = 0, .high = 3600, .doc = "seconds before the first retry, doubled"};
inline constexpr reward_param max_answer_bytes{.name = "max_answer_bytes",
                                               .rule = zero_or_in,
                                               .low = 1 << 10,
                                               .high = 1 << 30,
                                               .whole = true,
                                               .doc = "0: each answer's own bound"};

inline constexpr std::array alignment = {
    reward_param{.name = "colour_weight", .rule = in_range, .low = 0, .high = 1},
    reward_param{.name = "shape_weight", .rule = in_range, .low = 0, .high = 1, .media = reward_media::video},
    reward_param{.name = "motion_weight", .rule = in_range, .low = 0, .high = 1, .media = reward_media::video},
    reward_param{.name = "colour_width", .rule = positive},
    reward_param{.name = "fill_width", .rule = positive},
    reward_param{.name = "travel", .rule = positive, .media = reward_media::video, .doc = "pixels"},
};
inline constexpr std::array jpeg = {reward_param{.name = "quality", .rule = integer_in, .low = 1, .high = 100}};
inline constexpr std::array smoothness = {reward_param{.name = "flicker_scale", .rule = positive}};
inline constexpr std::array torchscript = {
    reward_param{.name = "file", .text = true, .required = "the TorchScript reward needs a file"},
    reward_param{.name = "batch", .rule = integer_from, .low = 1},
};
inline constexpr std::array remote = {
    reward_param{.name = "url", .text = true, .rule = http_url, .required = "the remote reward needs a url"},
    reward_param{.name = "scorer", .text = true, .doc = "\"\": the server's only one"},
    connect_timeout,
    timeout,
    retries,
    backoff,
    max_answer_bytes,
    reward_param{.name = "batch", .rule = in_range, .low = 1, .high = 1e6, .whole = true, .doc = "leaves a request"},
};
inline constexpr std::array vlm_judge = {
    reward_param{.name = "url",
                 .text = true,
                 .rule = http_url,
                 .required = "the vlm_judge reward needs a url (the server's root, e.g. http://127.0.0.1:8000)"},
    reward_param{.name = "model",
                 .text = true,
                 .required = "the vlm_judge reward needs the served model's name (e.g. Qwen/Qwen2.5-VL-7B-Instruct)"},
    reward_param{.name = "question", .text = true, .doc = "must hold {prompt}"},
    reward_param{.name = "top_logprobs", .rule = in_range, .low = 1, .high = 20, .whole = true},
    connect_timeout,
    timeout,
    retries,
    backoff,
    max_answer_bytes,
};
}  // namespace reward_params_of

/// The rewards a run config may name, in the order errors list them (docs/config.md "[[rewards]]").
inline constexpr std::array reward_table = {
    reward_descriptor{.name = "alignment",
                      .params = reward_params_of::alignment,
                      .doc = "colour, shape (and motion) agreement with the shapes prompts"},
    reward_descriptor{.name = "jpeg_compressibility",
                      .media = reward_media::image,
                      .params = reward_params_of::jpeg,
                      .doc = "-(JPEG size in kB)"},
    reward_descriptor{.name = "jpeg_incompressibility",
                      .media = reward_media::image,
                      .params = reward_params_of::jpeg,
                      .doc = "+(JPEG size in kB)"},
    reward_descriptor{.name = "smoothness",
                      .media = reward_media::video,
                      .params = reward_params_of::smoothness,
                      .doc = "exp(-flicker / flicker_scale)"},
    reward_descriptor{
        .name = "torchscript", .params = reward_params_of::torchscript, .doc = "a TorchScript reward module"},
    reward_descriptor{.name = "remote", .params = reward_params_of::remote, .doc = "a reward server"},
    reward_descriptor{.name = "vlm_judge", .params = reward_params_of::vlm_judge, .doc = "P(yes) of a VLM"},
};

/// The names of `table`'s entries, in its order.
template <std::size_t N>
constexpr std::array<std::string_view, N> reward_names_of(const std::array<reward_descriptor, N>& table) {
  std::array<std::string_view, N> names{};
  for (std::size_t i = 0; i < N; ++i) names[i] = table[i].name;
  return names;
}

/// Reward names a config may use: reward_table's.
inline constexpr std::array reward_names = reward_names_of(reward_table);

/// The entry of `table` named `name`, or nullptr.
/// Example: find_reward("smoothness")->media -> reward_media::video; find_reward("hps") -> nullptr.
constexpr const reward_descriptor* find_reward(std::string_view name,
                                               std::span<const reward_descriptor> table = reward_table) {
  for (const reward_descriptor& d : table)
    if (d.name == name) return &d;
  return nullptr;
}

/// The names of `table`'s entries that serve `medium`, as errors list them.
/// Example: reward_names_for(reward_media::video) -> "alignment, smoothness, torchscript, remote or vlm_judge".
inline std::string reward_names_for(reward_media medium, std::span<const reward_descriptor> table = reward_table) {
  std::vector<std::string_view> names;
  for (const reward_descriptor& d : table)
    if (serves(d.media, medium)) names.push_back(d.name);
  return name_list(names);
}

}  // namespace branchgrpo
