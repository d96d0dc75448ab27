#include <catch2/catch.hpp>

#include <cmath>
#include <numbers>
#include <vector>

#include "branchgrpo/noise/keyed_normal.hpp"

using namespace branchgrpo;

TEST_CASE("Philox4x32-10 matches Random123's known-answer vectors", "[noise]") {
  // kat_vectors of Random123: philox4x32 10 rounds.
  CHECK(philox4x32_10({0, 0, 0, 0}, {0, 0}) ==
        std::array<std::uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        std::array<std::uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        std::array<std::uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("keyed normals follow the documented Box-Muller layout", "[noise]") {
  const noise_key key{.seed = 0x0000000500000007ULL, .iteration = 3, .tree = 2, .node = 11, .step = 4,
                      .stream = noise_stream::edge};
  // counter {block, node, tree, iteration | step << 20 | stream << 28}, key {seed low, seed high}.
  const auto bits = philox4x32_10({1, 11, 2, 3u | (4u << 20) | (1u << 28)}, {7, 5});
  const auto u = [](std::uint32_t b) { return (static_cast<double>(b) + 0.5) / 4294967296.0; };
  const double radius = std::sqrt(-2.0 * std::log(u(bits[2])));
  const double angle = 2.0 * std::numbers::pi * u(bits[3]);
  // Elements 6 and 7 are lanes 2 and 3 of block 1.
  CHECK(keyed_normal(key, 6) == Approx(radius * std::cos(angle)).epsilon(1e-15));
  CHECK(keyed_normal(key, 7) == Approx(radius * std::sin(angle)).epsilon(1e-15));
}

TEST_CASE("a keyed draw depends only on the key and the element index", "[noise]") {
  const noise_key key{.seed = 42, .iteration = 1, .tree = 0, .node = 5, .step = 2};
  std::vector<double> whole(6);
  fill_keyed_normal(key, whole);
  std::vector<double> tail(2);
  fill_keyed_normal(key, tail, 4);  // the doc comment's example
  CHECK(tail[0] == whole[4]);
  CHECK(tail[1] == whole[5]);
  for (std::size_t i = 0; i < whole.size(); ++i) CHECK(keyed_normal(key, i) == whole[i]);

  // Every key field changes the draw.
  auto differs = [&](noise_key other) { return keyed_normal(other, 0) != whole[0]; };
  auto k = key;
  k.seed = 43;
  CHECK(differs(k));
  k = key;
  k.iteration = 2;
  CHECK(differs(k));
  k = key;
  k.tree = 1;
  CHECK(differs(k));
  k = key;
  k.node = 6;
  CHECK(differs(k));
  k = key;
  k.step = 3;
  CHECK(differs(k));
  k = key;
  k.stream = noise_stream::shared;
  CHECK(differs(k));
}

TEST_CASE("keyed normals have standard normal moments", "[noise]") {
  std::vector<double> draws(200000);
  fill_keyed_normal({.seed = 9}, draws);
  double sum = 0, squares = 0, fourth = 0;
  for (double x : draws) {
    sum += x;
    squares += x * x;
    fourth += x * x * x * x;
  }
  const double n = static_cast<double>(draws.size());
  CHECK(sum / n == Approx(0.0).margin(0.01));
  CHECK(squares / n == Approx(1.0).margin(0.01));
  CHECK(fourth / n == Approx(3.0).margin(0.06));
}

TEST_CASE("noise keys outside their fields are rejected", "[noise]") {
  std::vector<double> out(4);
  CHECK_THROWS_WITH(fill_keyed_normal({.iteration = max_noise_iteration + 1}, out),
                    "noise key iteration 1048576 exceeds 1048575");
  CHECK_THROWS_WITH(fill_keyed_normal({.step = 256}, out), "noise key step 256 exceeds 255");
  CHECK_THROWS_AS(fill_keyed_normal({}, out, std::uint64_t{1} << 34), invalid_input);
}
