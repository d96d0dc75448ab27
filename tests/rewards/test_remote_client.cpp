// The remote reward's client (tools/app/branchgrpo/app/remote_client.hpp) against the real reward server
// (scripts/reward_server.py), started here as a process on a free loopback port: scores that come back exactly as
// the server sends them, batching by whole groups, the scorer check, and every fault as one line naming the url,
// never a hang. Each test stops the server it started.
#include <catch2/catch.hpp>
#include <sys/resource.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
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
  } catch (const bg::system_failure& error) {  // a failure of the server, not of the input: exit 1
    return error.what();
  }
  return "";
}

// The process's peak resident set so far (getrusage's ru_maxrss, kB on Linux), in bytes.
double peak_resident_bytes() {
  ::rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;
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
  // Before a run starts, the scorer check's failure is the run's refusal (invalid_input: exit 2).
  CHECK_THROWS_AS(nobody.check_scorer(), bg::invalid_input);
  CHECK_THROWS_WITH(nobody.check_scorer(), StartsWith("remote reward http://127.0.0.1:9/info: "));
  // Bad options.
  CHECK_THROWS_WITH(bg::remote_client({.url = "127.0.0.1:8000"}),
                    "remote reward url '127.0.0.1:8000' is not http:// or https://");
  CHECK_THROWS_WITH(bg::remote_client({.url = "http://x", .timeout = 0}),
                    "remote reward timeout must be positive seconds, got 0");
  CHECK_THROWS_WITH(bg::remote_client({.url = "http://x", .batch = 0}),
                    "remote reward batch must be at least 1, got 0");
  CHECK_THROWS_WITH(bg::remote_client({.url = "http://x", .max_answer_bytes = 10}),
                    "remote reward max_answer_bytes must be in [1024, 1073741824], got 10");
}

TEST_CASE("an answer is read up to its bound: an endless body, chunked or not, costs no memory", "[rewards]") {
  const auto failure = [](const std::string& fault, bg::remote_options options) {
    reward_server server({"--scorer", "shapes_alignment", "--fault", fault});
    options.url = server.url();
    bg::remote_client client(options);
    const double before = peak_resident_bytes();
    const auto start = std::chrono::steady_clock::now();
    const std::string message = error_of(client, items(1, 2));
    // Unbounded, the client grew about 2 bytes per byte received until the timeout (GBs in seconds).
    CHECK(peak_resident_bytes() - before < 64e6);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
    CHECK_THAT(message, StartsWith("remote reward " + server.url() + "/score: the answer is over "));
    return message;
  };
  // http_client.hpp's example: 64 scores -> 1 MiB + 256 KiB.
  CHECK(bg::answer_bound::rows(64, 1, "scores").bytes == 1310720);
  CHECK(bg::answer_bound::rows(64, 1, "scores").holds == "64 scores");
  // 2 items of a scorer with no declared components: 1 MiB + 2 x 4 KiB.
  const bg::remote_options once{.timeout = 60, .retries = 0};
  const std::string bound = "the answer is over 1.06 MB, the bound for 2 scores (params.max_answer_bytes)";
  CHECK_THAT(failure("endless", once), Contains(bound + " (after 1 attempt)"));
  CHECK_THAT(failure("endless-chunked", once), Contains(bound));
  CHECK_THAT(failure("huge-length", {.timeout = 60, .retries = 1, .backoff = 0.05}),
             Contains(bound + " (after 2 attempts)"));
  CHECK_THAT(failure("endless", {.timeout = 60, .retries = 0, .max_answer_bytes = 4096}),
             Contains("the answer is over 4.1 kB, the bound for every answer (params.max_answer_bytes)"));
  // An ordinary answer within an explicit bound still comes through.
  reward_server server({"--scorer", "shapes_alignment"});
  bg::remote_client client({.url = server.url(), .max_answer_bytes = 1024});
  CHECK(client.score(items(2, 2)).scores == std::vector<double>(4, 0.0));
}

TEST_CASE("a stop request ends a request that waits, and a retry's backoff, within about a second", "[rewards]") {
  const auto stopped_after = [](const std::string& fault, bg::remote_options options) {
    reward_server server({"--scorer", "shapes_alignment", "--fault", fault});
    options.url = server.url();
    bg::remote_client client(options);
    bg::clear_stop();
    std::thread stopper([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      bg::request_stop(SIGTERM);
    });
    const auto start = std::chrono::steady_clock::now();
    std::string message;
    try {
      (void)client.score(items(1, 2));
    } catch (const bg::stop_requested& stop) {
      message = stop.what();
      CHECK(stop.signal() == SIGTERM);
    }
    stopper.join();
    bg::clear_stop();
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
    return message;
  };
  // A server that answers after 60 s, and one that fails at once, with 60 s of backoff before the retry.
  CHECK_THAT(stopped_after("slow:60", {.timeout = 120, .retries = 0}),
             StartsWith("stopped by SIGTERM during a request to http://127.0.0.1:") && Contains("/score"));
  CHECK_THAT(stopped_after("http-500", {.timeout = 120, .retries = 1, .backoff = 60}),
             StartsWith("stopped by SIGTERM during a retry of http://127.0.0.1:"));
  // A pending request stops the next batch before it is sent.
  reward_server server({"--scorer", "shapes_alignment"});
  bg::remote_client client({.url = server.url()});
  bg::request_stop(SIGINT);
  CHECK_THROWS_WITH(client.score(items(1, 1)), "stopped by SIGINT during scoring by the remote reward");
  bg::clear_stop();
}
