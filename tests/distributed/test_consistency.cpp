// check_same_everywhere and ranks_text (branchgrpo/distributed/consistency.hpp) without processes: a fake
// communicator plays one rank of a group whose other ranks' hashes are given.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "branchgrpo/distributed/consistency.hpp"

namespace bg = branchgrpo;

namespace {

// Rank `rank` of a group whose every rank holds `hashes[r]`; all_gather hands back those (its own from `local`).
struct fake_group {
  int my_rank = 0;
  std::vector<std::uint64_t> hashes;

  [[nodiscard]] int rank() const { return my_rank; }
  [[nodiscard]] int size() const { return static_cast<int>(hashes.size()); }
  void all_reduce_sum(std::span<double>) {}
  void all_gather(std::span<const std::byte> local, std::span<std::byte> gathered) {
    REQUIRE(local.size() == sizeof(std::uint64_t));
    REQUIRE(gathered.size() == hashes.size() * sizeof(std::uint64_t));
    std::memcpy(gathered.data(), hashes.data(), gathered.size());
    std::memcpy(gathered.data() + static_cast<std::size_t>(my_rank) * local.size(), local.data(), local.size());
  }
  void barrier() {}
};
static_assert(bg::Communicator<fake_group>);

}  // namespace

TEST_CASE("ranks_text collapses runs of ranks") {
  const std::vector<int> one{3}, runs{0, 1, 2, 5, 7, 8}, two{0, 2};
  CHECK(bg::ranks_text(one) == "rank 3");
  CHECK(bg::ranks_text(runs) == "ranks 0-2, 5, 7-8");
  CHECK(bg::ranks_text(two) == "ranks 0, 2");
}

TEST_CASE("check_same_everywhere passes when every rank agrees") {
  bg::single_process alone;
  CHECK_NOTHROW(bg::check_same_everywhere(alone, 42, "configs"));
  fake_group group{.my_rank = 1, .hashes = {7, 0, 7}};
  CHECK_NOTHROW(bg::check_same_everywhere(group, 7, "configs"));
}

TEST_CASE("check_same_everywhere names each hash with its ranks, the same line on every rank") {
  const std::string expected =
      "the ranks run different configs: rank 0 xxh64 0000000000000001, rank 1 xxh64 00000000000000ff";
  for (int rank = 0; rank < 2; ++rank) {
    fake_group group{.my_rank = rank, .hashes = {1, 0xff}};
    CHECK_THROWS_WITH(bg::check_same_everywhere(group, group.hashes[static_cast<std::size_t>(rank)], "configs"),
                      expected);
  }
  fake_group four{.my_rank = 2, .hashes = {5, 5, 0, 5}};
  CHECK_THROWS_AS(bg::check_same_everywhere(four, 9, "parameters"), bg::invalid_input);
  CHECK_THROWS_WITH(bg::check_same_everywhere(four, 9, "parameters"),
                    "the ranks run different parameters: ranks 0-1, 3 xxh64 0000000000000005, rank 2 xxh64 "
                    "0000000000000009");
}
