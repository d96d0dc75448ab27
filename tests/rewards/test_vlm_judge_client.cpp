// The VLM judge's client (tools/app/branchgrpo/app/vlm_judge_client.hpp) against tests/rewards/fake_openai_server.py,
// started here as a process on a free loopback port: the request shape (the server refuses any other), the score
// from the first token's top_logprobs to 1e-12 of the hand-computed value, and every fault as one line naming the
// url, never a hang. Each test stops the server it started.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "branchgrpo/app/png.hpp"
#include "branchgrpo/app/vlm_judge_client.hpp"
#include "reward_server_process.hpp"

namespace bg = branchgrpo;
using branchgrpo::testing::reward_server;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

const std::string fake_server = "tests/rewards/fake_openai_server.py";
const std::string model = "test/judge-vl";

reward_server judge_server(const std::string& fault = "", const std::string& log = "") {
  std::vector<std::string> args = {"--model", model};
  if (!fault.empty()) args.insert(args.end(), {"--fault", fault});
  if (!log.empty()) args.insert(args.end(), {"--log", log});
  return reward_server(args, fake_server);
}

// A width x height image whose red channel is red(x, y), green 40, blue 200.
template <class Red>
bg::rgb_image image(int width, int height, Red red) {
  bg::rgb_image out{.width = width, .height = height, .pixels = {}};
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      out.pixels.push_back(red(x, y));
      out.pixels.push_back(40);
      out.pixels.push_back(200);
    }
  return out;
}

// The fake server's score of an image: (0.05 + 0.8 r) / 0.9, r its mean red over 255.
double fake_score(const bg::rgb_image& img) {
  double red = 0;
  for (std::size_t i = 0; i < img.pixels.size(); i += 3) red += img.pixels[i];
  red /= 255.0 * img.width * img.height;
  return (0.05 + 0.8 * red) / 0.9;
}

std::string error_of(bg::vlm_judge_client& judge, const std::vector<std::uint8_t>& png) {
  try {
    (void)judge.score("a red circle", png);
  } catch (const bg::system_failure& error) {  // a failure of the server, not of the input: exit 1
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("vlm_question substitutes every {prompt}", "[rewards]") {
  CHECK(bg::vlm_question("Does this image show {prompt}? Answer yes or no.", "a red circle") ==
        "Does this image show a red circle? Answer yes or no.");
  CHECK(bg::vlm_question("{prompt} / {prompt}", "x") == "x / x");
  CHECK_THROWS_WITH(bg::vlm_question("Is this image good? {promt}", "x"),
                    "vlm judge question 'Is this image good? {promt}' has no {prompt} (the judge would ask every "
                    "image the same question)");
}

TEST_CASE("vlm_answer_word folds case, whitespace and word markers, nothing else", "[rewards]") {
  CHECK(bg::vlm_answer_word(" Yes") == "yes");
  CHECK(bg::vlm_answer_word("\xC4\xA0NO") == "no");
  CHECK(bg::vlm_answer_word("\xE2\x96\x81yes\n") == "yes");
  CHECK(bg::vlm_answer_word("Yes.") == "yes.");
  CHECK(bg::vlm_answer_word("Nope") == "nope");
}

TEST_CASE("vlm_yes_probability: P(yes) / (P(yes) + P(no)) over the first token's top_logprobs", "[rewards]") {
  const auto answer = [](nlohmann::json top) {
    return nlohmann::json{{"choices", {{{"logprobs", {{"content", {{{"token", "x"}, {"top_logprobs", top}}}}}}}}}};
  };
  const auto entry = [](const char* token, double p) {
    return nlohmann::json{{"token", token}, {"logprob", std::log(p)}};
  };
  auto [why, score] = bg::vlm_yes_probability(answer({entry("Yes", 0.6), entry("no", 0.2), entry("Maybe", 0.1)}));
  CHECK(why.empty());
  CHECK(score == Approx(0.75).epsilon(1e-12));
  std::tie(why, score) = bg::vlm_yes_probability(answer({entry("Yes", 0.3), entry(" yes", 0.3), entry("NO", 0.2)}));
  CHECK(score == Approx(0.75).epsilon(1e-12));
  // Far in the tail the ratio survives (log-sum-exp): e^-800 and e^-801.
  std::tie(why, score) = bg::vlm_yes_probability(
      answer({{{"token", "yes"}, {"logprob", -800.0}}, {{"token", "no"}, {"logprob", -801.0}}}));
  CHECK(score == Approx(1 / (1 + std::exp(-1.0))).epsilon(1e-12));
  CHECK(bg::vlm_yes_probability(answer({entry("Yes", 0.7), entry("Sure", 0.2)})).second == 1.0);
  CHECK(bg::vlm_yes_probability(answer({entry(" No", 0.7)})).second == 0.0);
  std::tie(why, score) = bg::vlm_yes_probability(answer({entry("Maybe", 0.5)}));
  CHECK(why == "neither yes nor no among the first token's 1 top_logprobs: \"Maybe\" -0.693147");
  CHECK(std::isnan(score));
  CHECK(bg::vlm_yes_probability(answer(nlohmann::json::array())).first ==
        "neither yes nor no among the first token's 0 top_logprobs: none");
  CHECK(bg::vlm_yes_probability(answer({{{"token", "Yes"}, {"logprob", "high"}}})).first ==
        "top_logprobs entry 0 is not {token: string, logprob: number}: {\"logprob\":\"high\",\"token\":\"Yes\"}");
  CHECK_THAT(bg::vlm_yes_probability(nlohmann::json{{"choices", nlohmann::json::array()}}).first,
             StartsWith("the answer has no choices[0].logprobs.content[0].top_logprobs (does the server return "
                        "logprobs?): {\"choices\":[]}"));
}

TEST_CASE("the judge scores through an OpenAI-compatible server: exact values, the question sent", "[rewards]") {
  const auto log = std::filesystem::temp_directory_path() / ("branchgrpo_vlm_log_" + std::to_string(::getpid()));
  std::filesystem::remove(log);
  {
    reward_server server = judge_server("", log.string());
    bg::vlm_judge_client judge({.url = server.url() + "/", .model = model});
    CHECK(judge.options().url == server.url());
    judge.check_model();
    bg::vlm_judge_client other({.url = server.url(), .model = "other/model"});
    CHECK_THROWS_WITH(other.check_model(),
                      "vlm judge " + server.url() + ": no model 'other/model' (the server serves: " + model + ")");
    const bg::rgb_image red = image(4, 3, [](int, int) { return std::uint8_t{255}; });
    const bg::rgb_image dark = image(4, 3, [](int, int) { return std::uint8_t{0}; });
    const bg::rgb_image ramp = image(17, 5, [](int x, int y) { return static_cast<std::uint8_t>(x * 15 + y); });
    CHECK(judge.score("a red circle", bg::encode_png(red)) == Approx(0.85 / 0.9).epsilon(1e-12));
    CHECK(judge.score("a blue square", bg::encode_png(dark)) == Approx(0.05 / 0.9).epsilon(1e-12));
    CHECK(judge.score("a ramp", bg::encode_png(ramp)) == Approx(fake_score(ramp)).epsilon(1e-12));
    // top_logprobs 1: only the most probable token is listed, so one side is absent: 1 or 0.
    bg::vlm_judge_client top1({.url = server.url(), .model = model, .question = "{prompt}?", .top_logprobs = 1});
    CHECK(top1.score("red", bg::encode_png(red)) == 1.0);
    CHECK(top1.score("dark", bg::encode_png(dark)) == 0.0);
  }
  std::ifstream lines(log);
  std::vector<nlohmann::json> requests;
  for (std::string line; std::getline(lines, line);) requests.push_back(nlohmann::json::parse(line));
  std::filesystem::remove(log);
  REQUIRE(requests.size() == 5);
  CHECK(requests[0]["question"] == "Does this image show a red circle? Answer yes or no.");
  CHECK(requests[0]["red"] == 1.0);
  CHECK(requests[2]["width"] == 17);
  CHECK(requests[2]["height"] == 5);
  CHECK(requests[3]["question"] == "red?");

  reward_server fixed = judge_server("fixed");
  bg::vlm_judge_client judge({.url = fixed.url(), .model = model});
  CHECK(judge.score("anything", bg::encode_png(image(1, 1, [](int, int) { return std::uint8_t{0}; }))) ==
        Approx(0.75).epsilon(1e-12));
}

TEST_CASE("a failing judge is one line naming the url and what came back, never a hang", "[rewards]") {
  const std::vector<std::uint8_t> png = bg::encode_png(image(2, 2, [](int, int) { return std::uint8_t{9}; }));
  const auto failure = [&](const std::string& fault, bg::http_patience patience, const std::string& name = model) {
    reward_server server = judge_server(fault);
    bg::vlm_judge_client judge({.url = server.url(), .model = name, .patience = patience});
    const std::string message = error_of(judge, png);
    CHECK_THAT(message, StartsWith("vlm judge " + server.url() + "/v1/chat/completions: "));
    return message;
  };
  const bg::http_patience once{.retries = 0};
  CHECK_THAT(failure("no-logprobs", once),
             Contains("the answer has no choices[0].logprobs.content[0].top_logprobs (does the server return "
                      "logprobs?): {\"choices\":[{\"finish_reason\":\"length\"") &&
                 Contains("(after 1 attempt)"));
  CHECK_THAT(failure("neither", once),
             Contains("neither yes nor no among the first token's 2 top_logprobs: \"Maybe\" -0.693147, \"The\" "
                      "-1.203973 (after 1 attempt)"));
  CHECK_THAT(failure("http-500", once), Contains("HTTP 500: fake failure (after 1 attempt)"));
  CHECK_THAT(failure("garbage", once), Contains("the answer is not JSON: <html>not json</html> (after 1 attempt)"));
  CHECK_THAT(failure("", once, "other/model"),
             Contains("HTTP 404: The model `other/model` does not exist. (after 1 attempt)"));
  // A server that dies without answering, and one slower than the timeout; retries after 0.05 s and 0.1 s.
  CHECK_THAT(failure("exit", {.retries = 2, .backoff = 0.05}), Contains("(after 3 attempts)"));
  const auto start = std::chrono::steady_clock::now();
  CHECK_THAT(failure("slow:30", {.timeout = 0.5, .retries = 1, .backoff = 0.05}),
             Contains("Operation timed out") && Contains("(after 2 attempts)"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  // An answer that never ends is cut at its bound (1 MiB + 4 KiB per top_logprobs entry), at once.
  const auto endless_start = std::chrono::steady_clock::now();
  CHECK_THAT(failure("endless", once),
             Contains("the answer is over 1.13 MB, the bound for 20 top_logprobs (params.max_answer_bytes) (after 1 "
                      "attempt)"));
  CHECK(std::chrono::steady_clock::now() - endless_start < std::chrono::seconds(20));
  // Nobody listening: a server that was stopped.
  std::string url;
  {
    reward_server gone = judge_server();
    url = gone.url();
    gone.stop();
  }
  bg::vlm_judge_client nobody({.url = url, .model = model, .patience = {.connect_timeout = 1, .retries = 0}});
  CHECK_THAT(error_of(nobody, png),
             StartsWith("vlm judge " + url + "/v1/chat/completions: ") && Contains("(after 1 attempt)"));
  // Before a run starts, the model check's failure is the run's refusal (invalid_input: exit 2).
  CHECK_THROWS_AS(nobody.check_model(), bg::invalid_input);
}

TEST_CASE("bad judge options are one line naming the value", "[rewards]") {
  CHECK_THROWS_WITH(bg::vlm_judge_client({.url = "http://x"}),
                    "vlm judge model: name the served model (e.g. Qwen/Qwen2.5-VL-7B-Instruct)");
  CHECK_THROWS_WITH(bg::vlm_judge_client({.url = "127.0.0.1:8000", .model = model}),
                    "vlm judge url '127.0.0.1:8000' is not http:// or https://");
  CHECK_THROWS_WITH(bg::vlm_judge_client({.url = "http://x:8000/v1/", .model = model}),
                    "vlm judge url 'http://x:8000/v1/' ends in /v1: give the server's root (the judge posts to "
                    "<url>/v1/chat/completions)");
  CHECK_THROWS_WITH(bg::vlm_judge_client({.url = "http://x", .model = model, .question = "Is it good?"}),
                    "vlm judge question 'Is it good?' has no {prompt} (the judge would ask every image the same "
                    "question)");
  CHECK_THROWS_WITH(bg::vlm_judge_client({.url = "http://x", .model = model, .top_logprobs = 21}),
                    "vlm judge top_logprobs must be in [1, 20], got 21");
  CHECK_THROWS_WITH(bg::vlm_judge_client({.url = "http://x", .model = model, .patience = {.timeout = 0}}),
                    "vlm judge timeout must be positive seconds, got 0");
}
