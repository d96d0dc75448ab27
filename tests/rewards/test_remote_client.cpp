// The remote reward's client (tools/app/branchgrpo/app/remote_client.hpp) against the real reward server
// (scripts/reward_server.py), started here as a process on a free loopback port: scores that come back exactly as
// the server sends them, batching by whole groups, the scorer check, and every fault as one line naming the url,
// never a hang. Each test stops the server it started.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "branchgrpo/app/remote_client.hpp"
#include "reward_server_process.hpp"

namespace bg = branchgrpo;
using branchgrpo::testing::reward_server;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

// A flat background image (no shape: shapes_alignment scores it 0), float32 [3, 16, 16].
const std::vector<float> blank(3 * 16 * 16, 0.84F);

std::vector<bg::remote_item> items(int groups, int leaves) {
  std::vector<bg::remote_item> out;
  for (int g = 0; g < groups; ++g)
    for (int l = 0; l < leaves; ++l)
      out.push_back(
          {.prompt = "a red circle", .prompt_index = 0, .group = g, .leaf = l, .shape = {3, 16, 16}, .pixels = blank});
  return out;
}

std::string error_of(bg::remote_client& client, const std::vector<bg::remote_item>& list) {
  try {
    (void)client.score(list);
  } catch (const bg::invalid_input& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("base64 as RFC 4648", "[rewards]") {
  CHECK(bg::detail::base64("Man") == "TWFu");
  CHECK(bg::detail::base64("M") == "TQ==");
  CHECK(bg::detail::base64("Ma") == "TWE=");
  CHECK(bg::detail::base64("") == "");
}

TEST_CASE("the client scores through the server: exact values, whole groups per request, the scorer check",
          "[rewards]") {
  // Prepared answers, one list per request: 4 leaves in 2 groups with batch 2 are 2 requests of 2.
  const auto answers =
      std::filesystem::temp_directory_path() / ("branchgrpo_remote_fixed_" + std::to_string(::getpid()));
  std::ofstream(answers) << "[[0.1, 0.30000000000000004], [1e-300, -2.5]]";
  {
    reward_server server({"--scorer", "shapes_alignment", "--fault", "fixed:" + answers.string()});
    bg::remote_client client({.url = server.url(), .batch = 2});
    const bg::remote_scores got = client.score(items(2, 2));
    CHECK(got.scores == std::vector<double>{0.1, 0.30000000000000004, 1e-300, -2.5});  // bit for bit
  }
  std::filesystem::remove(answers);

  reward_server server({"--scorer", "shapes_alignment"});
  bg::remote_client client({.url = server.url() + "/", .scorer = "shapes_alignment", .batch = 3});
  const bg::remote_scorer_info scorer = client.check_scorer();
  CHECK(scorer.name == "shapes_alignment");
  CHECK(!scorer.groupwise);
  // A blank image holds no shape: alignment 0 (as the C++ shape_alignment). A group of 4 is larger than the
  // batch of 3 and goes alone.
  const bg::remote_scores got = client.score(items(2, 4));
  CHECK(got.scores == std::vector<double>(8, 0.0));
  bg::remote_client wrong({.url = server.url(), .scorer = "hps"});
  CHECK_THROWS_WITH(wrong.check_scorer(),
                    "remote reward " + server.url() + ": no scorer 'hps' (the server runs: shapes_alignment)");
  bg::remote_client video({.url = server.url(), .media = "video"});
  CHECK_THROWS_WITH(video.check_scorer(),
                    "remote reward " + server.url() + ": scorer 'shapes_alignment' does not score videos");
}

TEST_CASE("a failing server is one line naming the url and what came back, never a hang", "[rewards]") {
  const auto failure = [](const std::string& fault, bg::remote_options options) {
    reward_server server({"--scorer", "shapes_alignment", "--fault", fault});
    options.url = server.url();
    bg::remote_client client(options);
    const std::string message = error_of(client, items(1, 2));
    CHECK_THAT(message, StartsWith("remote reward " + server.url() + "/score: "));
    return message;
  };
  const bg::remote_options once{.retries = 0};
  CHECK_THAT(failure("wrong-count", once), Contains("the answer has 1 scores for 2 items (after 1 attempt)"));
  CHECK_THAT(failure("string", once),
             Contains("answer 0 has score \"0.5\", not a number") || Contains("not a number (after 1 attempt)"));
  CHECK_THAT(failure("null", once), Contains("answer 0 has score null, not a number"));
  CHECK_THAT(failure("nan", once), Contains("the answer is not JSON"));  // a bare NaN token is not JSON
  CHECK_THAT(failure("garbage", once), Contains("the answer is not JSON"));
  CHECK_THAT(failure("http-500", once), Contains("HTTP 500: "));
  // A server that dies without answering, and one slower than the timeout; two retries after 0.05 s and 0.1 s.
  CHECK_THAT(failure("exit", {.retries = 2, .backoff = 0.05}), Contains("(after 3 attempts)"));
  const auto start = std::chrono::steady_clock::now();
  CHECK_THAT(failure("slow:30", {.timeout = 0.5, .retries = 1, .backoff = 0.05}), Contains("(after 2 attempts)"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  // Nobody listening.
  bg::remote_client nobody({.url = "http://127.0.0.1:9", .connect_timeout = 1, .retries = 0});
  CHECK_THAT(error_of(nobody, items(1, 1)), StartsWith("remote reward http://127.0.0.1:9/score: "));
  // Bad options.
  CHECK_THROWS_WITH(bg::remote_client({.url = "127.0.0.1:8000"}),
                    "remote reward url '127.0.0.1:8000' is not http:// or https://");
  CHECK_THROWS_WITH(bg::remote_client({.url = "http://x", .timeout = 0}),
                    "remote reward timeout must be positive seconds, got 0");
  CHECK_THROWS_WITH(bg::remote_client({.url = "http://x", .batch = 0}),
                    "remote reward batch must be at least 1, got 0");
}
