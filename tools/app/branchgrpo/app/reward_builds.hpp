#pragma once
// The build side of the reward table: one reward_builder per reward_table entry (config/reward_table.hpp), same
// names in the same order (checked at compile time), each with a build for the images of an image model and one for
// the clips of a video model, present exactly for the media the entry declares. build_run_reward turns a run's
// [[rewards]] (or [[eval.rewards]]) into one weighted_sum through them.
//
//   [[rewards]] name = "jpeg_compressibility", params = {quality = 80} on an image model
//     -> reward_builders[1].image -> named_reward{"jpeg_compressibility", 1.0, jpeg_compressibility{80}}
//   the same on a video model -> "run.toml: rewards[0].name = 'jpeg_compressibility' scores images; the model makes
//     videos (alignment, smoothness, torchscript, remote or vlm_judge)"
//   name = "hps" (a config made in code) -> "run.toml: rewards[0].name = 'hps': must be alignment, ... or vlm_judge"
//
// Adding a reward: its reward_table entry and its reward_builder here (docs/rewards.md "Adding a reward"). A build
// reads its params through the reward_param_reader (checked as reward_table declares them; it gives the defaults)
// and returns the term (reward_request::term); the entry's win_rate, [advantage] per_reward, [eval] and the
// metrics' reward/<name> then work for it.
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/app/http_client.hpp"
#include "branchgrpo/app/moving_shapes.hpp"
#include "branchgrpo/app/remote_reward.hpp"
#include "branchgrpo/app/rewards.hpp"
#include "branchgrpo/app/run_memory.hpp"
#include "branchgrpo/app/run_model.hpp"
#include "branchgrpo/app/shapes.hpp"
#include "branchgrpo/app/video_rewards.hpp"
#include "branchgrpo/app/vlm_judge.hpp"
#include "branchgrpo/config/reward_params.hpp"
#include "branchgrpo/config/reward_table.hpp"
#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/torch/flux/autoencoder.hpp"
#include "branchgrpo/torch/torchscript.hpp"

namespace branchgrpo {

/// The reward entries a reward is built from and the key errors name them by: the run's [[rewards]]
/// ({config.rewards, "rewards"}) or the held-out evaluation's ({config.eval.rewards, "eval.rewards"}).
struct reward_list {
  std::span<const reward_entry> entries;
  std::string_view key = "rewards";
};

/// What a build gets: the run, its model, the entry's params and the term's name and weight.
struct reward_request {
  const run_config& config;
  const run_model& model;
  const reward_param_reader& params;
  std::string label;  ///< the term's name: the entry's, "_2", "_3", ... for repeats
  double weight = 1.0;

  /// The term scoring with `score`.
  [[nodiscard]] named_reward term(named_reward::pointwise score) const {
    return {.name = label, .weight = weight, .score = std::move(score), .score_groups = {}};
  }
};

/// A build: the term of one entry, its params read (and checked) through request.params.
using reward_build = named_reward (*)(const reward_request& request);

/// The build side of one reward_table entry: a build per medium it scores (nullptr for the other).
struct reward_builder {
  std::string_view name;
  reward_build image = nullptr;
  reward_build video = nullptr;
};

namespace detail {

// The rest of an alignment reward (shape_alignment, or moving_shape_alignment with its travel): the widths, then
// the run's prompts must parse ("a red circle", "a red circle moving left") and its images be large enough.
template <class Alignment, class Parse>
named_reward alignment_term(const reward_request& r, Alignment a, Parse parse) {
  a.colour_width = r.params.number("colour_width", a.colour_width);
  a.fill_width = r.params.number("fill_width", a.fill_width);
  if constexpr (requires { a.travel; }) a.travel = r.params.number("travel", a.travel);
  for (std::size_t n = 0; n < r.model.prompts.size(); ++n) {
    try {
      (void)parse(r.model.prompts[n]);
    } catch (const invalid_input& error) {
      fail(r.config.source, ": ", r.params.where(), ".name = 'alignment': prompt ", n, ": ", error.what());
    }
  }
  check_reward_image_size(r.config, r.model, r.params.where(), r.params.entry.name, shape_min_side);
  return r.term(std::move(a));
}

inline named_reward alignment_image(const reward_request& r) {
  shape_alignment a{.prompts = r.model.prompts};
  a.colour_weight = r.params.number("colour_weight", a.colour_weight);
  return alignment_term(r, std::move(a), [](const std::string& p) { return parse_shapes_prompt(p); });
}

inline named_reward alignment_video(const reward_request& r) {
  moving_shape_alignment a{.prompts = r.model.prompts};
  a.colour_weight = r.params.number("colour_weight", a.colour_weight);
  a.shape_weight = r.params.number("shape_weight", a.shape_weight);
  a.motion_weight = r.params.number("motion_weight", a.motion_weight);
  const double sum = a.colour_weight + a.shape_weight + a.motion_weight;
  if (std::abs(sum - 1) > 1e-9)
    r.params.bad("motion_weight", run_number_text(a.motion_weight),
                 "colour_weight + shape_weight + motion_weight must be 1, they sum to " + run_number_text(sum));
  return alignment_term(r, std::move(a), [](const std::string& p) { return parse_moving_shapes_prompt(p); });
}

template <class Jpeg>
named_reward jpeg_image(const reward_request& r) {
  return r.term(Jpeg{.quality = static_cast<int>(r.params.number("quality", Jpeg{}.quality))});
}

inline named_reward smoothness_video(const reward_request& r) {
  temporal_smoothness smooth;
  smooth.flicker_scale = r.params.number("flicker_scale", smooth.flicker_scale);
  return r.term(smooth);
}

// A TorchScript reward module from params.file, `batch` rows a call unless params.batch, loaded by `load` (the
// leaves reach it in [-1, 1], the run decodes first; the module takes [0, 1]) and refused when exported for another
// prompt list (check_torchscript_prompts).
template <class Load>
named_reward torchscript_term(const reward_request& r, double batch, Load load) {
  const std::string file = r.params.text("file", "");
  batch = r.params.number("batch", batch);
  auto module = std::make_shared<decltype(load(r.config.input_path(file)))>(load(r.config.input_path(file)));
  check_torchscript_prompts(module->module, module->path, r.model.prompts, run_prompt_path(r.config).string());
  module->batch = static_cast<std::int64_t>(batch);
  return r.term([module](const torch::Tensor& leaves, std::span<const std::int64_t> prompts) {
    return (*module)(leaves, prompts);
  });
}

inline named_reward torchscript_image(const reward_request& r) {
  return torchscript_term(r, 16, [&](const std::filesystem::path& file) {
    return load_torchscript_reward(
        file, [](const torch::Tensor& x) { return unit_images(x); }, run_device(r.config));
  });
}

inline named_reward torchscript_video(const reward_request& r) {
  return torchscript_term(r, 4, [&](const std::filesystem::path& file) {
    return load_torchscript_video_reward(
        file, [](const torch::Tensor& x) { return (x + 1.0) / 2.0; }, run_device(r.config));
  });
}

static_assert(reward_params_of::max_answer_bytes.low == double(min_answer_bytes) &&
                  reward_params_of::max_answer_bytes.high == double(max_answer_bytes),
              "reward_table's max_answer_bytes range is http_client.hpp's");

// A server reward's params connect_timeout, timeout, retries, backoff and max_answer_bytes (http_client.hpp),
// `given` the defaults; max_answer_bytes = 0 keeps given's.
inline http_patience patience_params(const reward_param_reader& p, http_patience given) {
  http_patience out{.connect_timeout = p.number("connect_timeout", given.connect_timeout),
                    .timeout = p.number("timeout", given.timeout),
                    .retries = static_cast<int>(p.number("retries", given.retries)),
                    .backoff = p.number("backoff", given.backoff),
                    .max_answer_bytes = given.max_answer_bytes};
  if (const double own = p.number("max_answer_bytes", 0); own != 0)
    out.max_answer_bytes = static_cast<std::int64_t>(own);
  return out;
}

// name = "remote": a reward server's scorer (remote_reward.hpp), checked before the run starts (the server answers
// /info and runs the scorer for the model's media). Images or clips alike.
inline named_reward remote_term(const reward_request& r) {
  const reward_param_reader& p = r.params;
  remote_options options{
      .url = p.text("url", ""), .scorer = p.text("scorer", ""), .media = r.model.is_video() ? "video" : "image"};
  const http_patience patience = patience_params(p, {.connect_timeout = options.connect_timeout,
                                                     .timeout = options.timeout,
                                                     .retries = options.retries,
                                                     .backoff = options.backoff});
  options.connect_timeout = patience.connect_timeout;
  options.timeout = patience.timeout;
  options.retries = patience.retries;
  options.backoff = patience.backoff;
  options.max_answer_bytes = patience.max_answer_bytes;
  options.batch = static_cast<std::int64_t>(p.number("batch", static_cast<double>(options.batch)));
  remote_reward reward(std::move(options), r.model.prompts);
  reward.check_server();
  // The server's named components reach the logs as reward/<label>/<component> (a copy shares the last ones).
  named_reward::detail_rows details = [reward] { return reward.last_components(); };
  return {.name = r.label,
          .weight = r.weight,
          .score = {},
          .score_groups = std::move(reward),
          .details = std::move(details)};
}

// name = "vlm_judge": P(yes) of a VLM behind an OpenAI-compatible chat endpoint (vlm_judge.hpp), checked before the
// run starts (the server lists the model at /v1/models). Video models: the middle frame.
inline named_reward vlm_judge_term(const reward_request& r) {
  const reward_param_reader& p = r.params;
  vlm_judge_options options{.url = p.text("url", ""), .model = p.text("model", "")};
  if (vlm_url_ends_in_v1(options.url))
    p.bad("url", "'" + options.url + "'",
          "ends in /v1: give the server's root (the judge posts to <url>/v1/chat/completions)");
  options.question = p.text("question", options.question);
  if (options.question.find("{prompt}") == std::string::npos)
    p.bad("question", "'" + options.question + "'",
          "has no {prompt} (the judge would ask every image the same question)");
  options.top_logprobs = static_cast<int>(p.number("top_logprobs", options.top_logprobs));
  options.patience = patience_params(p, options.patience);
  vlm_judge_reward reward(std::move(options), r.model.prompts);
  reward.check_model();
  return r.term(std::move(reward));
}

// An entry with win_rate = true: its scorer's scores (pointwise, or a groupwise one's such as a remote server's)
// turned into win rates within each tree.
inline named_reward as_win_rate(named_reward term) {
  if (term.score) {
    term.score_groups = win_rate<named_reward::pointwise>{.score = std::move(term.score)};
    term.score = {};
  } else {
    term.score_groups = [inner = std::move(term.score_groups)](
                            const torch::Tensor& leaves, std::span<const std::int64_t> prompts,
                            const leaf_groups& groups) { return win_rates(inner(leaves, prompts, groups), groups); };
  }
  return term;
}

}  // namespace detail

/// The builds of reward_table's entries, in its order.
inline constexpr std::array reward_builders = {
    reward_builder{.name = "alignment", .image = detail::alignment_image, .video = detail::alignment_video},
    reward_builder{.name = "jpeg_compressibility", .image = detail::jpeg_image<jpeg_compressibility>},
    reward_builder{.name = "jpeg_incompressibility", .image = detail::jpeg_image<jpeg_incompressibility>},
    reward_builder{.name = "smoothness", .video = detail::smoothness_video},
    reward_builder{.name = "torchscript", .image = detail::torchscript_image, .video = detail::torchscript_video},
    reward_builder{.name = "remote", .image = detail::remote_term, .video = detail::remote_term},
    reward_builder{.name = "vlm_judge", .image = detail::vlm_judge_term, .video = detail::vlm_judge_term},
};

/// Whether `builders` builds `table`'s entries: the same names in the same order, and a build for exactly the media
/// each entry declares. Example: reward_table and reward_builders -> true (a static_assert below).
constexpr bool builds_table(std::span<const reward_descriptor> table, std::span<const reward_builder> builders) {
  if (table.size() != builders.size()) return false;
  for (std::size_t i = 0; i < table.size(); ++i)
    if (table[i].name != builders[i].name ||
        serves(table[i].media, reward_media::image) != (builders[i].image != nullptr) ||
        serves(table[i].media, reward_media::video) != (builders[i].video != nullptr))
      return false;
  return true;
}
static_assert(builds_table(reward_table, reward_builders),
              "reward_builders must build reward_table's entries: the same names, in the same order, for its media");

/// The entries of `list` as one weighted_sum through `table` and `builders` (by default the shipped rewards; see
/// make_run_reward in training_run.hpp for what each entry scores). Errors are one line naming the entry: an
/// unknown name lists the known ones, a reward for the other medium says so, a param names its key.
/// @pre builds_table(table, builders) (else std::logic_error).
inline weighted_sum build_run_reward(const run_config& config, const run_model& model, const reward_list& list,
                                     std::span<const reward_descriptor> table = reward_table,
                                     std::span<const reward_builder> builders = reward_builders) {
  if (!builds_table(table, builders)) throw std::logic_error("build_run_reward: the builders do not build the table");
  const reward_media medium = model.is_video() ? reward_media::video : reward_media::image;
  std::vector<named_reward> terms;
  std::map<std::string, int> seen;
  for (std::size_t i = 0; i < list.entries.size(); ++i) {
    const reward_entry& entry = list.entries[i];
    const std::string where = std::string(list.key) + "[" + std::to_string(i) + "]";
    const reward_descriptor* reward = find_reward(entry.name, table);
    if (reward == nullptr) {
      std::vector<std::string_view> names;
      for (const reward_descriptor& d : table) names.push_back(d.name);
      fail(config.source, ": ", where, ".name = '", entry.name, "': must be ", name_list(names));
    }
    if (medium == reward_media::video && !serves(reward->media, medium))
      fail(config.source, ": ", where, ".name = '", entry.name, "' scores images; the model makes videos (",
           reward_names_for(medium, table), ")");
    if (medium == reward_media::image && !serves(reward->media, medium))
      fail(config.source, ": ", where, ".name = '", entry.name, "' scores videos; the model makes images");
    const reward_param_reader params{
        .source = config.source, .entry = entry, .index = i, .list = list.key, .reward = *reward, .medium = medium};
    const std::string label = entry.name + (seen[entry.name]++ ? "_" + std::to_string(seen[entry.name]) : "");
    const reward_builder& builder = builders[static_cast<std::size_t>(reward - table.data())];
    named_reward term = (medium == reward_media::video ? builder.video : builder.image)(
        {.config = config, .model = model, .params = params, .label = label, .weight = entry.weight});
    params.finish();
    terms.push_back(entry.win_rate ? detail::as_win_rate(std::move(term)) : std::move(term));
  }
  return weighted_sum(std::move(terms));
}

}  // namespace branchgrpo
