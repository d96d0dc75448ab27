#include <catch2/catch.hpp>

#include <cmath>
#include <numbers>
#include <set>
#include <vector>

#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/noise/keyed_permutation.hpp"

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
  const noise_key key{
      .seed = 0x0000000500000007ULL, .iteration = 3, .tree = 2, .node = 11, .step = 4, .stream = noise_stream::edge};
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

TEST_CASE("keyed_permutation follows the documented Feistel layout", "[noise][permutation]") {
  // Size 5: h = 2 (2^4 = 16 >= 5); round r's function is the low 2 bits of Philox(counter {right, r, stream, 0},
  // key {seed, 0}); positions mapped to 5..15 are mapped again.
  const auto by_hand = [](std::uint64_t position, std::uint32_t seed, std::uint32_t stream) {
    std::uint64_t value = position;
    do {
      std::uint64_t left = value >> 2, right = value & 3;
      for (std::uint32_t round = 0; round < 4; ++round) {
        const std::uint64_t f = philox4x32_10({static_cast<std::uint32_t>(right), round, stream, 0}, {seed, 0})[0] & 3;
        const std::uint64_t next = left ^ f;
        left = right;
        right = next;
      }
      value = (left << 2) | right;
    } while (value >= 5);
    return value;
  };
  std::vector<std::uint64_t> rows, by_hand_rows;
  for (std::uint64_t p = 0; p < 5; ++p) {
    rows.push_back(keyed_permutation{.size = 5, .seed = 7, .stream = 0}(p));
    by_hand_rows.push_back(by_hand(p, 7, 0));
  }
  CHECK(rows == by_hand_rows);
  CHECK(rows == std::vector<std::uint64_t>{0, 4, 3, 2, 1});  // the doc example's rows
  std::vector<std::uint64_t> other;
  for (std::uint64_t p = 0; p < 5; ++p) other.push_back(keyed_permutation{.size = 5, .seed = 7, .stream = 1}(p));
  CHECK(other == std::vector<std::uint64_t>{2, 3, 4, 1, 0});
  CHECK(keyed_permutation{.size = 1, .seed = 3, .stream = 9}(0) == 0);
}

TEST_CASE("keyed_permutation is a permutation of every size", "[noise][permutation]") {
  for (const std::uint64_t size : {2u, 3u, 4u, 7u, 16u, 17u, 1000u, 50000u}) {
    std::set<std::uint64_t> seen;
    for (std::uint64_t p = 0; p < size; ++p) {
      const std::uint64_t row = keyed_permutation{.size = size, .seed = 42, .stream = size}(p);
      REQUIRE(row < size);
      seen.insert(row);
    }
    CHECK(seen.size() == size);
  }
  // A large size is O(1) per position: no table of 2^40 entries is built.
  const keyed_permutation huge{.size = std::uint64_t{1} << 40, .seed = 1, .stream = 0};
  CHECK(huge(123) < huge.size);
  CHECK(huge(123) != huge(124));
  CHECK_THROWS_WITH((keyed_permutation{.size = 5}(5)), "keyed_permutation position 5 is not below the size 5");
  CHECK_THROWS_WITH((keyed_permutation{.size = 0}(0)), "keyed_permutation size must be in [1, 2^62], got 0");
}
