#pragma once
// The client side of the reward server protocol v1 (docs/rewards.md "Remote rewards: the server protocol";
// scripts/reward_server.py is a server): a batch of leaves with their prompt strings and tree structure goes out
// as JSON over HTTP, one finite score per leaf (and optional named components) comes back. Torch-free: the caller
// hands float32 pixels or encoded PNG frames.
//
//   remote_client client({.url = "http://127.0.0.1:8000", .scorer = "hpsv2"});
//   client.info()                          GET /info: the server's scorers (checked at start)
//   client.score(items)                    POST /score per batch of whole groups -> scores and components
//
// Transport: http_client.hpp's json_http_client (libcurl, nlohmann-json), shared with the VLM judge.
//
// Failure rule: a failed request (no connection, a timeout, a non-200 status, a body that is not the protocol's
// answer: not JSON, a wrong count, a non-number, NaN) is retried `retries` times after backoff, backoff x 2, ...
// (the server keeps no state, so a retry is safe); then one system_failure line naming the url and what came back,
// e.g. "remote reward http://127.0.0.1:8000/score: answer 2 has score "0.5", not a number (after 3 attempts)".
// The trainer's iteration ends there; the run keeps its last checkpoint and `train --resume` continues.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/app/http_client.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/stop.hpp"

namespace branchgrpo {

/// Where the server is and how long to wait for it.
struct remote_options {
  std::string url = "";          ///< http(s)://host:port, the server's root (the client adds /info, /score)
  std::string scorer = "";       ///< which of the server's scorers; "" when it runs exactly one
  std::string media = "image";   ///< image or video
  double connect_timeout = 5.0;  ///< seconds to connect
  double timeout = 300.0;        ///< seconds for a whole request, answer included
  int retries = 2;               ///< further attempts after a failed request
  double backoff = 1.0;          ///< seconds before the first retry; doubled before each next one
  std::int64_t batch = 64;       ///< leaves per request at most (whole groups: a larger group goes alone)
  /// Most bytes of one answer; 0: derived per request from its items (http_client.hpp's answer_bound).
  std::int64_t max_answer_bytes = 0;
};

/// One leaf to score: its prompt text and index, its tree (group) and leaf index, and its pixels, either float32
/// RGB in [-1, 1] of `shape` ([3, H, W] or [F, 3, H, W], C order; encoding "float32", lossless) or 8-bit RGB PNG
/// bytes, one per frame (encoding "png").
struct remote_item {
  std::string_view prompt;
  std::int64_t prompt_index = 0;
  std::int64_t group = 0;
  std::int64_t leaf = 0;
  std::vector<std::int64_t> shape = {};
  std::span<const float> pixels = {};
  std::vector<std::string> png_frames = {};
};

/// What /score answered for a list of items: one score per item, and each named component per item.
struct remote_scores {
  std::vector<double> scores;
  std::map<std::string, std::vector<double>> components;
};

/// A scorer a server runs (/info).
struct remote_scorer_info {
  std::string name = "", version = "";
  std::vector<std::string> media = {};
  bool groupwise = false;
  std::vector<std::string> components = {};
};

/// A connection to one reward server (protocol v1). Holds one libcurl handle, reused between requests (HTTP
/// keep-alive); not shared between threads.
/// @pre options.url non-empty, timeouts > 0, retries >= 0, backoff >= 0, batch >= 1, media image or video (else
///      invalid_input naming the value).
class remote_client {
 public:
  explicit remote_client(remote_options options)
      : options_(std::move(options)),
        http_("remote reward", options_.url,
              {.connect_timeout = options_.connect_timeout,
               .timeout = options_.timeout,
               .retries = options_.retries,
               .backoff = options_.backoff,
               .max_answer_bytes = options_.max_answer_bytes}) {
    require(options_.batch >= 1, "remote reward batch must be at least 1, got ", options_.batch);
    require(options_.media == "image" || options_.media == "video", "remote reward media '", options_.media,
            "' is not image or video");
    options_.url = http_.root();
  }

  [[nodiscard]] const remote_options& options() const { return options_; }

  /// GET /info: the server's scorers.
  /// Example: a server started with --scorer shapes_alignment -> {{.name = "shapes_alignment", .version = "1",
  ///   .media = {"image"}, .groupwise = false, .components = {"colour", "shape"}}}.
  std::vector<remote_scorer_info> info() {
    return http_.get("/info", [&](const nlohmann::json& answer) {
      std::vector<remote_scorer_info> out;
      if (!answer.is_object() || !answer.contains("scorers") || !answer["scorers"].is_array())
        return std::make_pair(std::string("the answer has no list 'scorers'"), out);
      for (const nlohmann::json& s : answer["scorers"]) {
        if (!s.is_object() || !s.contains("name") || !s["name"].is_string())
          return std::make_pair(std::string("a scorer without a name"), out);
        remote_scorer_info scorer{.name = s["name"].get<std::string>(), .version = s.value("version", "")};
        if (s.contains("media") && s["media"].is_array())
          for (const auto& m : s["media"])
            if (m.is_string()) scorer.media.push_back(m.get<std::string>());
        scorer.groupwise = s.value("groupwise", false);
        if (s.contains("components") && s["components"].is_array())
          for (const auto& c : s["components"])
            if (c.is_string()) scorer.components.push_back(c.get<std::string>());
        out.push_back(std::move(scorer));
      }
      return std::make_pair(std::string(), out);
    });
  }

  /// The scorer this client asks for, checked against /info: it exists (or the server runs exactly one when
  /// options.scorer is "") and scores options.media. Its components size the answers' byte bound.
  /// Example: scorer "hps" on a server of {"shapes_alignment"} -> invalid_input "remote reward
  ///   http://127.0.0.1:8000: no scorer 'hps' (the server runs: shapes_alignment)".
  remote_scorer_info check_scorer() {
    const std::vector<remote_scorer_info> scorers = as_refusal([&] { return info(); });  // before the run: exit 2
    std::string names;
    for (const auto& s : scorers) names += (names.empty() ? "" : ", ") + s.name;
    const auto it = std::find_if(scorers.begin(), scorers.end(), [&](const remote_scorer_info& s) {
      return options_.scorer.empty() ? scorers.size() == 1 : s.name == options_.scorer;
    });
    require(it != scorers.end(), "remote reward ", options_.url, ": ",
            options_.scorer.empty() ? std::string("name a scorer") : "no scorer '" + options_.scorer + "'",
            " (the server runs: ", names.empty() ? std::string("none") : names, ")");
    require(std::find(it->media.begin(), it->media.end(), options_.media) != it->media.end(), "remote reward ",
            options_.url, ": scorer '", it->name, "' does not score ", options_.media, "s");
    components_ = static_cast<std::int64_t>(it->components.size());
    return *it;
  }

  /// POST /score for every item, in batches of whole groups (at most options.batch items, a larger group alone).
  /// Example: 4 float32 items of 2 groups, batch 2 -> 2 requests; scores in item order.
  /// @pre items of one group are contiguous; every item carries pixels of its shape or PNG frames.
  /// Each answer is read up to a byte bound (http_client.hpp): 1 MiB + 4 KiB per item and value (its score and each
  /// component check_scorer learnt of), or options.max_answer_bytes.
  /// @post scores.size() == items.size(); every score finite; each component one value per item.
  remote_scores score(std::span<const remote_item> items) {
    remote_scores out;
    std::size_t first = 0;
    while (first < items.size()) {
      std::size_t last = first;
      while (last < items.size()) {  // whole groups while they fit; at least one group
        std::size_t end = last;
        while (end < items.size() && items[end].group == items[last].group) ++end;
        if (last > first && end - first > static_cast<std::size_t>(options_.batch)) break;
        last = end;
      }
      check_stop("scoring by the remote reward");  // between requests (core/stop.hpp)
      const remote_scores part = score_batch(items.subspan(first, last - first));
      out.scores.insert(out.scores.end(), part.scores.begin(), part.scores.end());
      for (const auto& [name, values] : part.components) {
        std::vector<double>& all = out.components[name];
        all.resize(first, std::nan(""));
        all.insert(all.end(), values.begin(), values.end());
      }
      first = last;
    }
    for (auto& [name, values] : out.components) values.resize(items.size(), std::nan(""));
    return out;
  }

 private:
  // One request's JSON body.
  std::string request_body(std::span<const remote_item> items) const {
    nlohmann::json body = {{"protocol", 1}, {"media", options_.media}};
    if (!options_.scorer.empty()) body["scorer"] = options_.scorer;
    const bool png = !items.empty() && !items.front().png_frames.empty();
    body["encoding"] = png ? "png" : "float32";
    nlohmann::json list = nlohmann::json::array();
    for (const remote_item& item : items) {
      nlohmann::json entry = {{"prompt", std::string(item.prompt)},
                              {"prompt_index", item.prompt_index},
                              {"group", item.group},
                              {"leaf", item.leaf}};
      if (png) {
        require(!item.png_frames.empty(), "remote reward: item ", item.group, ".", item.leaf, " has no PNG frames");
        if (options_.media == "image") {
          entry["data"] = detail::base64(item.png_frames.front());
        } else {
          nlohmann::json frames = nlohmann::json::array();
          for (const std::string& f : item.png_frames) frames.push_back(detail::base64(f));
          entry["data"] = std::move(frames);
        }
      } else {
        std::int64_t count = 1;
        for (std::int64_t d : item.shape) count *= d;
        require(!item.shape.empty() && count == static_cast<std::int64_t>(item.pixels.size()), "remote reward: item ",
                item.group, ".", item.leaf, " has ", item.pixels.size(), " float32 values for its shape");
        // Little-endian float32 in C order: the protocol's bytes (this client runs on little-endian hosts).
        static_assert(std::endian::native == std::endian::little, "the float32 encoding assumes a little-endian host");
        entry["data"] = {{"shape", item.shape},
                         {"base64", detail::base64(std::string_view(reinterpret_cast<const char*>(item.pixels.data()),
                                                                    item.pixels.size() * sizeof(float)))}};
      }
      list.push_back(std::move(entry));
    }
    body["items"] = std::move(list);
    return body.dump();
  }

  remote_scores score_batch(std::span<const remote_item> items) {
    const answer_bound bound = answer_bound::rows(static_cast<std::int64_t>(items.size()), 1 + components_, "scores");
    return http_.post(
        "/score", request_body(items),
        [&](const nlohmann::json& answer) {
          remote_scores out;
          if (!answer.is_object() || !answer.contains("scores") || !answer["scores"].is_array())
            return std::make_pair(std::string("the answer has no list 'scores'"), out);
          const nlohmann::json& scores = answer["scores"];
          if (scores.size() != items.size())
            return std::make_pair("the answer has " + std::to_string(scores.size()) + " scores for " +
                                      std::to_string(items.size()) + " items",
                                  out);
          for (std::size_t i = 0; i < scores.size(); ++i) {
            if (!scores[i].is_number())
              return std::make_pair("answer " + std::to_string(i) + " has score " + scores[i].dump() + ", not a number",
                                    out);
            const double v = scores[i].get<double>();
            if (!std::isfinite(v))
              return std::make_pair("answer " + std::to_string(i) + " has score " + std::to_string(v), out);
            out.scores.push_back(v);
          }
          if (answer.contains("components")) {
            const nlohmann::json& parts = answer["components"];
            if (!parts.is_object()) return std::make_pair(std::string("'components' is not an object"), out);
            for (const auto& [name, values] : parts.items()) {
              if (!values.is_array() || values.size() != items.size())
                return std::make_pair("component '" + name + "' has no value per item", out);
              std::vector<double>& row = out.components[name];
              for (const nlohmann::json& v : values) {
                if (!v.is_number() || !std::isfinite(v.get<double>()))
                  return std::make_pair("component '" + name + "' holds " + v.dump(), out);
                row.push_back(v.get<double>());
              }
            }
          }
          return std::make_pair(std::string(), out);
        },
        bound);
  }

  remote_options options_;
  std::int64_t components_ = 0;  // the scorer's components, as /info listed them
  json_http_client http_;
};

}  // namespace branchgrpo
