#pragma once
// JSON over HTTP with bounded patience: the transport of the reward server's client (remote_client.hpp) and the
// VLM judge's (vlm_judge_client.hpp). Torch-free.
//
//   json_http_client http("remote reward", "http://127.0.0.1:8000/", {.timeout = 60});
//   http.root()                                   "http://127.0.0.1:8000" (trailing slashes dropped)
//   http.post("/score", body, decode)             decode(answer JSON) -> {"" or why not, value}
//   http.post("/score", body, decode, {.bytes = 1 << 20, .holds = "64 scores"})   an answer bound of its own
//
// Transport: libcurl (Debian libcurl4-openssl-dev). Chosen over cpp-httplib because it is the most widely
// deployed HTTP client, C ABI (no header-only template mass in every TU that scores), with connect and total
// timeouts per request and HTTPS through OpenSSL for a server on another node. JSON: nlohmann-json.
//
// Failure rule: a failed request (no connection, a timeout, a non-200 status, an answer over its byte bound, a
// body that is not JSON, or one that `decode` refuses) is retried `retries` times after backoff, backoff x 2, ...
// (both servers keep no state between requests, so a retry is safe); then one system_failure line naming who
// asked, the url and what came back, e.g. "remote reward http://127.0.0.1:8000/score: HTTP 500: scorer crashed
// (after 3 attempts)" (a failure of a server: exit 1; a check made before a run starts turns it into its
// invalid_input refusal, exit 2).
//
// Bounded answers: every answer is read into memory up to a byte bound, and a longer one (announced by its
// Content-Length, or streamed, chunked or not) is cut off there: "... /score: the answer is over 1.31 MB, the
// bound for 64 scores (params.max_answer_bytes) (after 3 attempts)". The caller derives the bound from what the
// answer must hold (answer_bound); http_patience::max_answer_bytes, when set, replaces it for every request.
//
// Stops: while a request waits or a retry backs off, a stop request (core/stop.hpp) ends it within about a second
// with stop_requested.
#include <curl/curl.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/memory.hpp"
#include "branchgrpo/core/stop.hpp"

namespace branchgrpo {

/// How long to wait for a server, and how often to ask again.
struct http_patience {
  double connect_timeout = 5.0;  ///< seconds to connect
  double timeout = 300.0;        ///< seconds for a whole request, answer included
  int retries = 2;               ///< further attempts after a failed request
  double backoff = 1.0;          ///< seconds before the first retry; doubled before each next one
  /// Most bytes one answer may have; 0: each request's own bound (answer_bound: what the answer must hold).
  std::int64_t max_answer_bytes = 0;
};

/// The most an answer may hold, and what that is for the message ("64 scores").
struct answer_bound {
  std::int64_t bytes = std::int64_t{1} << 20;
  std::string holds = "a short answer";

  /// The bound of an answer holding `rows` rows of up to `values` JSON numbers each: 4 KiB per row and value
  /// (a number is at most 25 characters; the rest is room for names, whitespace and an error's text) above 1 MiB.
  /// Example: rows(64, 1, "scores") -> {1 MiB + 256 KiB = 1310720, "64 scores"}.
  static answer_bound rows(std::int64_t rows, std::int64_t values, std::string_view what) {
    return {.bytes = (std::int64_t{1} << 20) + rows * values * 4096,
            .holds = std::to_string(rows) + " " + std::string(what)};
  }
};

/// http_patience::max_answer_bytes' range: [1 KiB, 1 GiB].
inline constexpr std::int64_t min_answer_bytes = std::int64_t{1} << 10, max_answer_bytes = std::int64_t{1} << 30;

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
  std::int64_t limit = 0;  // the body's byte bound while it is read
  bool over = false;       // the answer was longer than `limit` (cut off)
};

// libcurl's write callback: appends to the reply's body up to its bound; past it, stops the transfer.
extern "C" inline std::size_t append_bounded(char* data, std::size_t size, std::size_t count, void* out) {
  auto* reply = static_cast<http_reply*>(out);
  const std::size_t bytes = size * count;
  if (static_cast<std::int64_t>(reply->body.size() + bytes) > reply->limit) {
    reply->over = true;
    return 0;  // CURLE_WRITE_ERROR: the transfer ends here
  }
  reply->body.append(data, bytes);
  return bytes;
}

// libcurl's progress callback (about once a second while waiting, more often while data flows): a non-zero
// answer aborts the transfer when a stop was requested.
extern "C" inline int abort_on_stop(void*, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return stop_signal() != 0 ? 1 : 0;
}

}  // namespace detail

/// A connection to one server root. Holds one libcurl handle, reused between requests (HTTP keep-alive); not
/// shared between threads.
/// Example: json_http_client("vlm judge", "http://127.0.0.1:9", {.connect_timeout = 1, .retries = 0}) posting to
///   "/v1/chat/completions" with nobody listening -> system_failure "vlm judge
///   http://127.0.0.1:9/v1/chat/completions: Failed to connect to 127.0.0.1 port 9 ... (after 1 attempt)".
/// @pre root is http:// or https://; timeouts > 0; retries in [0, 100]; backoff in [0, 3600] s;
///      max_answer_bytes 0 or in [min_answer_bytes, max_answer_bytes] (else invalid_input naming who and the
///      value, e.g. "remote reward timeout must be positive seconds, got 0").
class json_http_client {
 public:
  json_http_client(std::string who, std::string root, http_patience patience)
      : who_(std::move(who)), root_(std::move(root)), patience_(patience) {
    require(root_.starts_with("http://") || root_.starts_with("https://"), who_, " url '", root_,
            "' is not http:// or https://");
    require(std::isfinite(patience_.connect_timeout) && patience_.connect_timeout > 0, who_,
            " connect_timeout must be positive seconds, got ", patience_.connect_timeout);
    require(std::isfinite(patience_.timeout) && patience_.timeout > 0, who_, " timeout must be positive seconds, got ",
            patience_.timeout);
    require(patience_.retries >= 0 && patience_.retries <= 100, who_, " retries must be in [0, 100], got ",
            patience_.retries);
    require(std::isfinite(patience_.backoff) && patience_.backoff >= 0 && patience_.backoff <= 3600, who_,
            " backoff must be in [0, 3600] seconds, got ", patience_.backoff);
    require(patience_.max_answer_bytes == 0 ||
                (patience_.max_answer_bytes >= min_answer_bytes && patience_.max_answer_bytes <= max_answer_bytes),
            who_, " max_answer_bytes must be in [", min_answer_bytes, ", ", max_answer_bytes, "], got ",
            patience_.max_answer_bytes);
    while (root_.ends_with('/')) root_.pop_back();
    detail::curl_global();
    curl_.reset(curl_easy_init());
    require(curl_ != nullptr, "libcurl could not make a handle");
  }

  /// The server's root without trailing slashes.
  [[nodiscard]] const std::string& root() const { return root_; }

  /// GET root + path until decode accepts the answer (see the failure rule), reading at most `bound` bytes of it.
  template <class Decode>
  auto get(std::string_view path, Decode&& decode, const answer_bound& bound = {}) {
    const std::string url = root_ + std::string(path);
    return with_retries(
        url, [&] { return exchange(url, nullptr, bound); }, decode);
  }

  /// POST `body` (JSON text) to root + path until decode accepts the answer (see the failure rule), reading at most
  /// `bound` bytes of it.
  template <class Decode>
  auto post(std::string_view path, const std::string& body, Decode&& decode, const answer_bound& bound = {}) {
    const std::string url = root_ + std::string(path);
    return with_retries(
        url, [&] { return exchange(url, &body, bound); }, decode);
  }

  /// The bound in force for a request whose own is `bound`: http_patience::max_answer_bytes when set.
  [[nodiscard]] std::int64_t answer_limit(const answer_bound& bound) const {
    return patience_.max_answer_bytes > 0 ? patience_.max_answer_bytes : bound.bytes;
  }

 private:
  struct curl_deleter {
    void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
  };

  // Sends one request (GET without a body, POST with one); never throws for a transport or HTTP failure, nor for
  // an answer over its bound (reply.over); throws stop_requested when a stop ended the wait.
  detail::http_reply exchange(const std::string& url, const std::string* body, const answer_bound& bound) {
    CURL* h = curl_.get();
    curl_easy_reset(h);
    detail::http_reply reply;
    reply.limit = answer_limit(bound);
    char message[CURL_ERROR_SIZE] = {};
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, message);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // timeouts without SIGALRM: safe in a multi-threaded trainer
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(patience_.connect_timeout * 1000));
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(patience_.timeout * 1000));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, detail::append_bounded);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &reply);
    curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(reply.limit));  // an announced length
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, detail::abort_on_stop);
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
    if (code == CURLE_ABORTED_BY_CALLBACK) check_stop("a request to " + url);
    if (reply.over || code == CURLE_FILESIZE_EXCEEDED) {
      reply.over = true;
      reply.error = "the answer is over " + byte_text(static_cast<double>(reply.limit)) + ", the bound for " +
                    (patience_.max_answer_bytes > 0 ? "every answer" : bound.holds) + " (params.max_answer_bytes)";
      reply.body.clear();
      reply.body.shrink_to_fit();
      return reply;
    }
    if (code != CURLE_OK) {
      reply.error = message[0] != '\0' ? std::string(message) : std::string(curl_easy_strerror(code));
      return reply;
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &reply.status);
    return reply;
  }

  // A non-200 answer's one-line error: the reward server's {"error": "..."}, OpenAI's {"error": {"message":
  // "..."}} or vLLM's {"message": "..."}; else the start of the body.
  static std::string error_text(const detail::http_reply& reply) {
    const nlohmann::json parsed = nlohmann::json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object()) {
      const auto error = parsed.find("error");
      if (error != parsed.end() && error->is_string()) return error->get<std::string>();
      if (error != parsed.end() && error->is_object() && error->contains("message") && (*error)["message"].is_string())
        return (*error)["message"].get<std::string>().substr(0, 200);
      if (parsed.contains("message") && parsed["message"].is_string())
        return parsed["message"].get<std::string>().substr(0, 200);
    }
    return reply.body.substr(0, 200);
  }

  // Runs `send` until `decode` accepts the answer or the attempts are spent; the last failure is the error.
  template <class Send, class Decode>
  auto with_retries(const std::string& url, Send&& send, Decode& decode) ->
      typename std::invoke_result_t<Decode&, const nlohmann::json&>::second_type {
    std::string failure;
    double wait = patience_.backoff;
    for (int attempt = 0; attempt <= patience_.retries; ++attempt) {
      if (attempt > 0) {
        back_off(wait, url);
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
    fail_system(who_, " ", url, ": ", failure, " (after ", patience_.retries + 1,
                patience_.retries == 0 ? " attempt)" : " attempts)");
  }

  // Sleeps `seconds` before a retry, in slices of 100 ms, each after a stop check.
  static void back_off(double seconds, const std::string& url) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (auto now = std::chrono::steady_clock::now(); now < until; now = std::chrono::steady_clock::now()) {
      check_stop("a retry of " + url);
      std::this_thread::sleep_for(
          std::min(std::chrono::duration<double>(until - now), std::chrono::duration<double>(0.1)));
    }
    check_stop("a retry of " + url);
  }

  std::string who_;
  std::string root_;
  http_patience patience_;
  std::unique_ptr<CURL, curl_deleter> curl_;
};

}  // namespace branchgrpo
