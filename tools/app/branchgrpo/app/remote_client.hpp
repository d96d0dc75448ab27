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
// Transport: libcurl (Debian libcurl4-openssl-dev). Chosen over cpp-httplib because it is the most widely
// deployed HTTP client, C ABI (no header-only template mass in every TU that scores), with connect and total
// timeouts per request and HTTPS through OpenSSL for a server on another node. JSON: nlohmann-json.
//
// Failure rule: a failed request (no connection, a timeout, a non-200 status, a body that is not the protocol's
// answer: not JSON, a wrong count, a non-number, NaN) is retried `retries` times after backoff, backoff x 2, ...
// (the server keeps no state, so a retry is safe); then one invalid_input line naming the url and what came back,
// e.g. "remote reward http://127.0.0.1:8000/score: answer 2 has score "0.5", not a number (after 3 attempts)".
// The trainer's iteration ends there; the run keeps its last checkpoint and `train --resume` continues.
#include <curl/curl.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"

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

namespace detail {

/// Standard base64 (RFC 4648, padded). Example: "Man" -> "TWFu"; "M" -> "TQ==".
inline std::string base64(std::string_view bytes) {
  static constexpr char table[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::size_t n = std::min<std::size_t>(3, bytes.size() - i);
    std::uint32_t word = 0;
    for (std::size_t k = 0; k < 3; ++k) word = word << 8 | (k < n ? static_cast<std::uint8_t>(bytes[i + k]) : 0u);
    for (std::size_t k = 0; k < 4; ++k) out += k <= n ? table[(word >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

// libcurl's global state, initialized once for the process (curl_global_init is not thread-safe to race).
inline void curl_global() {
  static const bool done = [] { return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK; }();
  require(done, "libcurl could not be initialized");
}

// One HTTP exchange's outcome: a transport error (curl's message), or a status and body.
struct http_reply {
  std::string error;  // "" when the exchange completed
  long status = 0;
  std::string body;
};

}  // namespace detail

/// A connection to one reward server (protocol v1). Holds one libcurl handle, reused between requests (HTTP
/// keep-alive); not shared between threads.
/// @pre options.url non-empty, timeouts > 0, retries >= 0, backoff >= 0, batch >= 1, media image or video (else
///      invalid_input naming the value).
class remote_client {
 public:
  explicit remote_client(remote_options options) : options_(std::move(options)) {
    require(options_.url.starts_with("http://") || options_.url.starts_with("https://"), "remote reward url '",
            options_.url, "' is not http:// or https://");
    require(std::isfinite(options_.connect_timeout) && options_.connect_timeout > 0,
            "remote reward connect_timeout must be positive seconds, got ", options_.connect_timeout);
    require(std::isfinite(options_.timeout) && options_.timeout > 0,
            "remote reward timeout must be positive seconds, got ", options_.timeout);
    require(options_.retries >= 0 && options_.retries <= 100, "remote reward retries must be in [0, 100], got ",
            options_.retries);
    require(std::isfinite(options_.backoff) && options_.backoff >= 0 && options_.backoff <= 3600,
            "remote reward backoff must be in [0, 3600] seconds, got ", options_.backoff);
    require(options_.batch >= 1, "remote reward batch must be at least 1, got ", options_.batch);
    require(options_.media == "image" || options_.media == "video", "remote reward media '", options_.media,
            "' is not image or video");
    while (options_.url.ends_with('/')) options_.url.pop_back();
    detail::curl_global();
    curl_.reset(curl_easy_init());
    require(curl_ != nullptr, "libcurl could not make a handle");
  }

  [[nodiscard]] const remote_options& options() const { return options_; }

  /// GET /info: the server's scorers.
  /// Example: a server started with --scorer shapes_alignment -> {{.name = "shapes_alignment", .version = "1",
  ///   .media = {"image"}, .groupwise = false, .components = {"colour", "shape"}}}.
  std::vector<remote_scorer_info> info() {
    const std::string url = options_.url + "/info";
    return with_retries(
        url, [&] { return exchange(url, nullptr); },
        [&](const nlohmann::json& answer) {
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
  /// options.scorer is "") and scores options.media.
  /// Example: scorer "hps" on a server of {"shapes_alignment"} -> invalid_input "remote reward
  ///   http://127.0.0.1:8000: no scorer 'hps' (the server runs: shapes_alignment)".
  remote_scorer_info check_scorer() {
    const std::vector<remote_scorer_info> scorers = info();
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
    return *it;
  }

  /// POST /score for every item, in batches of whole groups (at most options.batch items, a larger group alone).
  /// Example: 4 float32 items of 2 groups, batch 2 -> 2 requests; scores in item order.
  /// @pre items of one group are contiguous; every item carries pixels of its shape or PNG frames.
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
  struct curl_deleter {
    void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
  };

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
    const std::string url = options_.url + "/score";
    const std::string body = request_body(items);
    return with_retries(
        url, [&] { return exchange(url, &body); },
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
        });
  }

  // Sends one request (GET without a body, POST with one); never throws for a transport or HTTP failure.
  detail::http_reply exchange(const std::string& url, const std::string* body) {
    CURL* h = curl_.get();
    curl_easy_reset(h);
    detail::http_reply reply;
    char message[CURL_ERROR_SIZE] = {};
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, message);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // timeouts without SIGALRM: safe in a multi-threaded trainer
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout * 1000));
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.timeout * 1000));
    curl_easy_setopt(
        h, CURLOPT_WRITEFUNCTION, +[](char* data, std::size_t size, std::size_t count, void* out) {
          static_cast<std::string*>(out)->append(data, size * count);
          return size * count;
        });
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &reply.body);
    curl_slist* headers = nullptr;
    if (body != nullptr) {
      headers = curl_slist_append(headers, "Content-Type: application/json");
      headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
      curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, body->data());
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body->size()));
    }
    const CURLcode code = curl_easy_perform(h);
    curl_slist_free_all(headers);
    if (code != CURLE_OK) {
      reply.error = message[0] != '\0' ? std::string(message) : std::string(curl_easy_strerror(code));
      return reply;
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &reply.status);
    return reply;
  }

  // The server's one-line error of a non-200 answer ({"error": ...}), else the start of the body.
  static std::string error_text(const detail::http_reply& reply) {
    const nlohmann::json parsed = nlohmann::json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object() && parsed.contains("error") && parsed["error"].is_string())
      return parsed["error"].get<std::string>();
    return reply.body.substr(0, 200);
  }

  // Runs `send` until `decode` accepts the answer or the attempts are spent; the last failure is the error.
  template <class Send, class Decode>
  auto with_retries(const std::string& url, Send&& send, Decode&& decode) ->
      typename std::invoke_result_t<Decode&, const nlohmann::json&>::second_type {
    std::string failure;
    double wait = options_.backoff;
    for (int attempt = 0; attempt <= options_.retries; ++attempt) {
      if (attempt > 0) {
        std::this_thread::sleep_for(std::chrono::duration<double>(wait));
        wait *= 2;
      }
      const detail::http_reply reply = send();
      if (!reply.error.empty()) {
        failure = reply.error;
        continue;
      }
      if (reply.status != 200) {
        failure = "HTTP " + std::to_string(reply.status) + ": " + error_text(reply);
        continue;
      }
      const nlohmann::json answer = nlohmann::json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
      if (answer.is_discarded()) {
        failure = "the answer is not JSON: " + reply.body.substr(0, 80);
        continue;
      }
      auto [why, value] = decode(answer);
      if (why.empty()) return value;
      failure = why;
    }
    fail("remote reward ", url, ": ", failure, " (after ", options_.retries + 1,
         options_.retries == 0 ? " attempt)" : " attempts)");
  }

  remote_options options_;
  std::unique_ptr<CURL, curl_deleter> curl_;
};

}  // namespace branchgrpo
