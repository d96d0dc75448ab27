#pragma once
// Checks that every rank of a multi-process run agrees on something it computed alone (its config, its
// parameters), so that ranks running different experiments stop at once instead of averaging unrelated gradients.
//
//   check_same_everywhere(comm, hash, what)   all-gathers a 64-bit hash; throws the same one line on every rank
//                                             when they differ: "the ranks run different configs: rank 0 xxh64
//                                             ..., rank 1 xxh64 ..."
//   ranks_text(ranks)                         "rank 3", "ranks 0-2, 5": rank lists as the messages show them
//
// Generic over the Communicator concept (communicator.hpp): single_process always agrees with itself; the c10d
// communicator of adapters/torch (branchgrpo/torch/distributed.hpp) gathers over Gloo.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/hash.hpp"
#include "branchgrpo/distributed/communicator.hpp"

namespace branchgrpo {

/// Ranks as a short list: consecutive runs collapse to "a-b", the word agrees in number.
/// Example: ranks_text({3}) == "rank 3"; ranks_text({0, 1, 2, 5}) == "ranks 0-2, 5".
/// @pre ranks ascending, no duplicates.
inline std::string ranks_text(std::span<const int> ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) text += ", ";
    text += std::to_string(ranks[i]);
    if (j > i) text += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return text;
}

/// Compares `hash` across the ranks and throws invalid_input on every rank (the same line everywhere) when the
/// ranks do not all hold the same value. `what` names the thing hashed, as a plural noun ("configs",
/// "parameters"). The hashes are listed in order of their lowest rank, each with the ranks that hold it.
/// Example: rank 0 and rank 1 hashing different TOML texts ->
///   "the ranks run different configs: rank 0 xxh64 1b2c3d4e5f607182, rank 1 xxh64 0f1e2d3c4b5a6978";
///   4 ranks where rank 2 differs -> "the ranks run different parameters: ranks 0-1, 3 xxh64 ..., rank 2 xxh64 ...".
/// @pre every rank calls it at the same point (it is a collective).
/// @post returns on every rank or throws on every rank.
template <Communicator C>
void check_same_everywhere(C& communicator, std::uint64_t hash, std::string_view what) {
  const std::vector<std::uint64_t> hashes =
      all_gather_values<std::uint64_t>(communicator, std::span<const std::uint64_t>(&hash, 1));
  if (std::all_of(hashes.begin(), hashes.end(), [&](std::uint64_t h) { return h == hashes.front(); })) return;
  std::vector<std::pair<std::uint64_t, std::vector<int>>> groups;  // distinct hashes, by lowest rank
  for (std::size_t rank = 0; rank < hashes.size(); ++rank) {
    auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == hashes[rank]; });
    if (group == groups.end()) group = groups.insert(groups.end(), {hashes[rank], {}});
    group->second.push_back(static_cast<int>(rank));
  }
  std::string text = "the ranks run different " + std::string(what) + ":";
  for (std::size_t i = 0; i < groups.size(); ++i)
    text += (i > 0 ? ", " : " ") + ranks_text(groups[i].second) + " xxh64 " + hex_digest(groups[i].first);
  fail(text);
}

}  // namespace branchgrpo
