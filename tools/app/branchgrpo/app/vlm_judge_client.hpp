#pragma once
// The VLM judge's client (docs/rewards.md "VLM judge"): one image and a yes/no question about its prompt go to an
// OpenAI-compatible chat-completions endpoint (vLLM's or SGLang's `serve`), one token comes back with its
// top_logprobs, and the image scores P(yes) / (P(yes) + P(no)). Torch-free: the caller hands PNG bytes
// (png.hpp); vlm_judge.hpp turns decoded leaves into them.
//
//   vlm_judge_client judge({.url = "http://127.0.0.1:8000", .model = "Qwen/Qwen2.5-VL-7B-Instruct"});
//   judge.check_model()                    GET /v1/models: the server serves the model (checked at start)
//   judge.score("a red circle", png)       POST /v1/chat/completions -> P(yes) in [0, 1]
//
// The request (max_tokens 1, temperature 0: the answer is the model's first-token distribution, not a sample):
//   {"model": M, "max_tokens": 1, "temperature": 0, "logprobs": true, "top_logprobs": N,
//    "messages": [{"role": "user", "content": [
//        {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}},
//        {"type": "text", "text": <question with {prompt} replaced by the prompt>}]}]}
// Transport and failure rule: http_client.hpp (timeouts, retries with backoff, one line naming the url).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/app/http_client.hpp"
#include "branchgrpo/core/error.hpp"

namespace branchgrpo {

/// Where the judge is served, which model, and what it is asked.
struct vlm_judge_options {
  std::string url = "";    ///< http(s)://host:port, the server's root (the client adds /v1/chat/completions)
  std::string model = "";  ///< the served model name, e.g. "Qwen/Qwen2.5-VL-7B-Instruct"
  std::string question = "Does this image show {prompt}? Answer yes or no.";  ///< every {prompt}: the prompt
  int top_logprobs = 20;  ///< alternatives of the first token the server lists (OpenAI and vLLM allow <= 20)
  http_patience patience = {.connect_timeout = 5.0, .timeout = 60.0, .retries = 2, .backoff = 1.0};
};

/// The path the judge posts to, under options.url.
inline constexpr std::string_view vlm_judge_path = "/v1/chat/completions";

/// Whether `url` names the API's /v1 instead of the server's root (a common slip: OpenAI clients take base_url
/// ".../v1"). Example: "http://h:8000/v1/" -> true; "http://h:8000" -> false.
inline bool vlm_url_ends_in_v1(std::string_view url) {
  while (url.ends_with('/')) url.remove_suffix(1);
  return url.ends_with("/v1");
}

/// `question` with every "{prompt}" replaced by `prompt`.
/// Example: ("Does this image show {prompt}? Answer yes or no.", "a red circle") -> "Does this image show a red
///   circle? Answer yes or no."; ("{prompt} / {prompt}", "x") -> "x / x".
/// @pre question contains "{prompt}" (else invalid_input naming the question).
inline std::string vlm_question(std::string_view question, std::string_view prompt) {
  static constexpr std::string_view slot = "{prompt}";
  require(question.find(slot) != std::string_view::npos, "vlm judge question '", question,
          "' has no {prompt} (the judge would ask every image the same question)");
  std::string out;
  std::size_t at = 0;
  for (std::size_t hit = question.find(slot); hit != std::string_view::npos; hit = question.find(slot, at)) {
    out.append(question.substr(at, hit - at)).append(prompt);
    at = hit + slot.size();
  }
  return out.append(question.substr(at));
}

/// A token as the judge reads it: ASCII whitespace and a leading word marker (GPT-2's "Ġ", SentencePiece's "▁")
/// removed, ASCII letters lower-cased. Example: " Yes" -> "yes"; "ĠNO" -> "no"; "▁yes\n" -> "yes"; "Yes." ->
/// "yes." (punctuation stays: "Yes." is not a yes token).
inline std::string vlm_answer_word(std::string_view token) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  while (!token.empty() && space(token.front())) token.remove_prefix(1);
  for (const std::string_view marker : {std::string_view("\xC4\xA0"), std::string_view("\xE2\x96\x81")})
    if (token.starts_with(marker)) token.remove_prefix(marker.size());
  while (!token.empty() && space(token.back())) token.remove_suffix(1);
  std::string word(token);
  for (char& c : word)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return word;
}

/// The judge's score of one chat-completions answer: over the first generated token's top_logprobs
/// (choices[0].logprobs.content[0].top_logprobs, each {"token", "logprob"}), P(yes) = sum of exp(logprob) over the
/// tokens whose vlm_answer_word is "yes", P(no) likewise for "no", and the score is P(yes) / (P(yes) + P(no)).
/// A side absent from the list counts 0 (its probability is below the last listed one's): only yes -> 1, only no
/// -> 0. Returns {"", score}, or {why not, NaN} when the answer has no such list, a malformed entry, or neither a
/// yes nor a no token (why: one line quoting what came back).
/// Example: top_logprobs [{"Yes", ln 0.6}, {"no", ln 0.2}, {"Maybe", ln 0.1}] -> 0.6 / (0.6 + 0.2) = 0.75;
///   [{"Yes", ln 0.3}, {" yes", ln 0.3}, {"NO", ln 0.2}] -> 0.75; [{"Maybe", ln 0.9}] -> {"neither yes nor no
///   among the first token's 1 top_logprobs: \"Maybe\" -0.105...", NaN}.
/// @post score in [0, 1] when why is "".
inline std::pair<std::string, double> vlm_yes_probability(const nlohmann::json& answer) {
  constexpr double none = -std::numeric_limits<double>::infinity();
  const nlohmann::json* list = nullptr;
  if (answer.is_object() && answer.contains("choices") && answer["choices"].is_array() && !answer["choices"].empty()) {
    const nlohmann::json& choice = answer["choices"][0];
    if (choice.is_object() && choice.contains("logprobs") && choice["logprobs"].is_object() &&
        choice["logprobs"].contains("content") && choice["logprobs"]["content"].is_array() &&
        !choice["logprobs"]["content"].empty()) {
      const nlohmann::json& first = choice["logprobs"]["content"][0];
      if (first.is_object() && first.contains("top_logprobs") && first["top_logprobs"].is_array())
        list = &first["top_logprobs"];
    }
  }
  const auto failed = [](std::string why) { return std::make_pair(std::move(why), std::nan("")); };
  if (list == nullptr) {
    std::string came = answer.dump();
    if (came.size() > 160) came = came.substr(0, 160) + "...";
    return failed("the answer has no choices[0].logprobs.content[0].top_logprobs (does the server return logprobs?): " +
                  came);
  }
  // log P(yes) and log P(no) as log-sum-exp, so that tiny probabilities (logprob -800) keep their ratio.
  double log_yes = none, log_no = none;
  const auto add = [](double& total, double logprob) {
    const double high = std::max(total, logprob);
    total = high + std::log(std::exp(total - high) + std::exp(logprob - high));
  };
  std::string listed;
  for (std::size_t k = 0; k < list->size(); ++k) {
    const nlohmann::json& entry = (*list)[k];
    if (!entry.is_object() || !entry.contains("token") || !entry["token"].is_string() || !entry.contains("logprob") ||
        !entry["logprob"].is_number() || !std::isfinite(entry["logprob"].get<double>()))
      return failed("top_logprobs entry " + std::to_string(k) +
                    " is not {token: string, logprob: number}: " + entry.dump().substr(0, 120));
    const double logprob = entry["logprob"].get<double>();
    const std::string word = vlm_answer_word(entry["token"].get<std::string>());
    if (word == "yes") add(log_yes, logprob);
    if (word == "no") add(log_no, logprob);
    if (k < 5) listed += (listed.empty() ? " " : ", ") + entry["token"].dump() + " " + std::to_string(logprob);
  }
  if (log_yes == none && log_no == none)
    return failed("neither yes nor no among the first token's " + std::to_string(list->size()) + " top_logprobs:" +
                  (listed.empty() ? std::string(" none") : listed) + (list->size() > 5 ? ", ..." : ""));
  if (log_no == none) return {"", 1.0};
  if (log_yes == none) return {"", 0.0};
  return {"", 1.0 / (1.0 + std::exp(log_no - log_yes))};
}

/// A connection to one judge server. Holds one libcurl handle (http_client.hpp); not shared between threads.
/// Example: against `vllm serve Qwen/Qwen2.5-VL-7B-Instruct`, score("a red circle", <PNG of a red circle>) -> a
///   value near 1; against tests/rewards/fake_openai_server.py, exactly its table's P(yes) / (P(yes) + P(no)).
/// @pre options.url http(s)://, not ending in /v1 (the root: the client adds /v1/chat/completions); model
///      non-empty; question holds {prompt}; top_logprobs in [1, 20]; patience as http_client.hpp's (else
///      invalid_input naming the value).
class vlm_judge_client {
 public:
  explicit vlm_judge_client(vlm_judge_options options)
      : options_(std::move(options)), http_("vlm judge", checked_root(options_.url), options_.patience) {
    require(!options_.model.empty(), "vlm judge model: name the served model (e.g. Qwen/Qwen2.5-VL-7B-Instruct)");
    (void)vlm_question(options_.question, "");
    require(options_.top_logprobs >= 1 && options_.top_logprobs <= 20,
            "vlm judge top_logprobs must be in [1, 20], got ", options_.top_logprobs);
    options_.url = http_.root();
  }

  [[nodiscard]] const vlm_judge_options& options() const { return options_; }

  /// GET /v1/models: checks that the server serves options.model (before a run's first iteration, so that a wrong
  /// name or a dead server is one line at start, not after the first rollout).
  /// Example: model "other/model" on a server of {"test/judge-vl"} -> invalid_input "vlm judge
  ///   http://127.0.0.1:8000: no model 'other/model' (the server serves: test/judge-vl)".
  void check_model() {
    const std::vector<std::string> served = as_refusal([&] {  // before the run: a refusal, exit 2
      return http_.get("/v1/models", [](const nlohmann::json& answer) {
        std::vector<std::string> ids;
        if (!answer.is_object() || !answer.contains("data") || !answer["data"].is_array())
          return std::make_pair(std::string("the answer has no list 'data'"), ids);
        for (const nlohmann::json& m : answer["data"])
          if (m.is_object() && m.contains("id") && m["id"].is_string()) ids.push_back(m["id"].get<std::string>());
        return std::make_pair(std::string(), ids);
      });
    });
    std::string names;
    for (const std::string& id : served) names += (names.empty() ? "" : ", ") + id;
    require(std::find(served.begin(), served.end(), options_.model) != served.end(), "vlm judge ", options_.url,
            ": no model '", options_.model, "' (the server serves: ", names.empty() ? std::string("none") : names, ")");
  }

  /// The chat-completions request for one image (the shape in this file's comment).
  [[nodiscard]] std::string request_body(std::string_view prompt, std::span<const std::uint8_t> png) const {
    const std::string image = "data:image/png;base64," +
                              detail::base64(std::string_view(reinterpret_cast<const char*>(png.data()), png.size()));
    nlohmann::json content = nlohmann::json::array();
    content.push_back({{"type", "image_url"}, {"image_url", {{"url", image}}}});
    content.push_back({{"type", "text"}, {"text", vlm_question(options_.question, prompt)}});
    return nlohmann::json{{"model", options_.model},
                          {"messages", nlohmann::json::array({{{"role", "user"}, {"content", std::move(content)}}})},
                          {"max_tokens", 1},
                          {"temperature", 0},
                          {"logprobs", true},
                          {"top_logprobs", options_.top_logprobs}}
        .dump();
  }

  /// P(yes) / (P(yes) + P(no)) of the judge's first answer token for this image and prompt (vlm_yes_probability).
  /// @post in [0, 1]; a failure (transport, HTTP, not JSON, no logprobs, neither yes nor no) after the retries is
  ///       one system_failure line "vlm judge <url>/v1/chat/completions: <what came back> (after N attempts)"; an
  ///       answer is read up to 1 MiB + 4 KiB per top_logprobs entry (or options.patience.max_answer_bytes).
  double score(std::string_view prompt, std::span<const std::uint8_t> png) {
    return http_.post(vlm_judge_path, request_body(prompt, png), vlm_yes_probability,
                      answer_bound::rows(options_.top_logprobs, 1, "top_logprobs"));
  }

 private:
  static const std::string& checked_root(const std::string& url) {
    require(!vlm_url_ends_in_v1(url), "vlm judge url '", url,
            "' ends in /v1: give the server's root (the judge posts to <url>/v1/chat/completions)");
    return url;
  }

  vlm_judge_options options_;
  json_http_client http_;
};

}  // namespace branchgrpo
