#pragma once
// A keyed permutation of [0, N): position p maps to a row in O(1) time and memory, with no table, so a seeded
// shuffle of a 50,000- or 50,000,000-prompt dataset per epoch costs the same as one of 12 prompts and needs no
// state to resume (prompt_schedule, training/loop.hpp).
//
// Construction (a format-preserving cipher): a balanced Feistel network of 4 rounds on 2h bits, where 2^(2h) is
// the smallest even power of two >= N; the round function of round r is the low h bits of one Philox4x32-10 call,
//   counter = { right half, r, stream bits 0..31, stream bits 32..63 },  key = { seed bits 0..31, 32..63 },
// and positions the network maps to N or above are mapped again until they land in [0, N) ("cycle walking",
// fewer than 4 times on average since 2^(2h) < 4 N). A Feistel network is a bijection on its 2h-bit domain, and
// cycle walking restricts a bijection to its subset [0, N): the result is a permutation of [0, N) whatever the
// round function.
#include <Random123/philox.h>

#include <cstdint>

#include "branchgrpo/core/error.hpp"

namespace branchgrpo {

/// The permutation of [0, size) keyed by (seed, stream): operator()(p) is the row at position p.
/// Example: keyed_permutation{.size = 1}(0) == 0; for size 5, seed 7, stream 0 the positions 0..4 give each of
///   0..4 exactly once (tests/unit/test_noise.cpp lists the rows), and stream 1 gives another order.
/// @pre 1 <= size <= 2^62, position < size (else invalid_input naming the value).
/// @post the result is in [0, size), and distinct positions give distinct rows.
struct keyed_permutation {
  std::uint64_t size = 1;    ///< N
  std::uint64_t seed = 0;    ///< the key (a run's seed)
  std::uint64_t stream = 0;  ///< which permutation of that seed (an epoch)

  [[nodiscard]] std::uint64_t operator()(std::uint64_t position) const {
    require(size >= 1 && size <= (std::uint64_t{1} << 62), "keyed_permutation size must be in [1, 2^62], got ", size);
    require(position < size, "keyed_permutation position ", position, " is not below the size ", size);
    unsigned half_bits = 1;  // h: the smallest with 2^(2h) >= size
    while ((std::uint64_t{1} << (2 * half_bits)) < size) ++half_bits;
    std::uint64_t value = position;
    do {
      value = encrypt(value, half_bits);
    } while (value >= size);
    return value;
  }

  friend bool operator==(const keyed_permutation&, const keyed_permutation&) = default;

 private:
  [[nodiscard]] std::uint64_t encrypt(std::uint64_t value, unsigned half_bits) const {
    const std::uint64_t mask = (std::uint64_t{1} << half_bits) - 1;
    std::uint64_t left = value >> half_bits, right = value & mask;
    const r123::Philox4x32 philox;
    const r123::Philox4x32::key_type key = {{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
    for (std::uint32_t round = 0; round < 4; ++round) {
      const r123::Philox4x32::ctr_type counter = {{static_cast<std::uint32_t>(right), round,
                                                   static_cast<std::uint32_t>(stream),
                                                   static_cast<std::uint32_t>(stream >> 32)}};
      const auto bits = philox(counter, key);
      const std::uint64_t f = ((static_cast<std::uint64_t>(bits[1]) << 32) | bits[0]) & mask;
      const std::uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    return (left << half_bits) | right;
  }
};

}  // namespace branchgrpo
