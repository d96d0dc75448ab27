#pragma once
// Keyed Gaussian noise: every draw is a pure function of (seed, iteration, tree, node, step, stream,
// element), so a node's noise never depends on batch size, evaluation order, backend or process.
//
// Layout of one Philox4x32-10 call (Random123):
//   key     = { seed bits 0..31, seed bits 32..63 }
//   counter = { element / 4, node, tree, iteration | step << 20 | stream << 28 }
// The four 32-bit outputs become four uniforms u = (r + 0.5) / 2^32 in (0, 1), and Box-Muller in double
// turns (u0, u1) into elements 4b, 4b+1 and (u2, u3) into 4b+2, 4b+3:
//   z_even = sqrt(-2 ln u_a) cos(2 pi u_b),  z_odd = sqrt(-2 ln u_a) sin(2 pi u_b).
// ln, cos and sin are noise/box_muller.hpp's (IEEE operations only, within 0.52 ulp), not libm's, whose last bits
// differ between C libraries and CUDA: the same key gives the same bits on every machine and on a GPU
// (adapters/cuda draws them on the device with the same functions).
#include <Random123/philox.h>

#include <array>
#include <cstdint>
#include <span>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/noise/box_muller.hpp"

namespace branchgrpo {

/// What a draw is for; part of the key so that different uses of one node never share noise.
enum class noise_stream : std::uint32_t {
  root_latent = 0,     ///< the initial latent x_T of a root
  edge = 1,            ///< a child's own draw on the edge from its parent
  shared = 2,          ///< the draw a parent shares among its children at a split (correlated noise)
  auxiliary = 3,       ///< extra draws a correlator may need (orthogonal, for example)
  matching_time = 4,   ///< the noise level a decoupled objective trains a sample at (loss/objective.hpp)
  matching_noise = 5,  ///< the noise eps a decoupled objective adds to a sample
};

inline constexpr std::uint32_t max_noise_iteration = (1u << 20) - 1;
inline constexpr std::uint32_t max_noise_step = (1u << 8) - 1;

/// The identity of one noise vector. `node` is the node's index inside its tree, `tree` the global
/// index of the tree in the iteration (including the rank offset in multi-process training).
struct noise_key {
  std::uint64_t seed = 0;
  std::uint32_t iteration = 0;  ///< at most max_noise_iteration
  std::uint32_t tree = 0;
  std::uint32_t node = 0;
  std::uint32_t step = 0;  ///< at most max_noise_step
  noise_stream stream = noise_stream::edge;

  friend bool operator==(const noise_key&, const noise_key&) = default;
};

namespace detail {

// constexpr, so that adapters/cuda calls the same layout on the device.
constexpr r123::Philox4x32::ctr_type philox_counter(const noise_key& key, std::uint32_t block) {
  return {
      {block, key.node, key.tree, key.iteration | (key.step << 20) | (static_cast<std::uint32_t>(key.stream) << 28)}};
}

constexpr r123::Philox4x32::key_type philox_key(const noise_key& key) {
  return {{static_cast<std::uint32_t>(key.seed), static_cast<std::uint32_t>(key.seed >> 32)}};
}

inline void check_noise_key(const noise_key& key) {
  require(key.iteration <= max_noise_iteration, "noise key iteration ", key.iteration, " exceeds ",
          max_noise_iteration);
  require(key.step <= max_noise_step, "noise key step ", key.step, " exceeds ", max_noise_step);
  require(static_cast<std::uint32_t>(key.stream) < 16u, "noise key stream ", static_cast<std::uint32_t>(key.stream),
          " exceeds 15");
}

/// Four standard normals of one Philox block.
inline std::array<double, 4> normal_block(const noise_key& key, std::uint32_t block) {
  const r123::Philox4x32 philox;
  const auto bits = philox(philox_counter(key, block), philox_key(key));
  const normal_pair low = box_muller(bits[0], bits[1]), high = box_muller(bits[2], bits[3]);
  return {low.first, low.second, high.first, high.second};
}

}  // namespace detail

/// The raw Philox4x32-10 output for a counter and key; exposed for known-answer tests.
/// Example: counter {0,0,0,0}, key {0,0} -> {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}.
inline std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter,
                                                  std::array<std::uint32_t, 2> key) {
  const r123::Philox4x32 philox;
  const auto out = philox({{counter[0], counter[1], counter[2], counter[3]}}, {{key[0], key[1]}});
  return {out[0], out[1], out[2], out[3]};
}

/// Fills `out` with elements [first, first + out.size()) of the keyed N(0, 1) vector.
/// Example: fill_keyed_normal(k, a) with a of size 6 and then fill_keyed_normal(k, b, 4) with b of size 2
/// gives b[0] == a[4], b[1] == a[5].
/// @pre the key's iteration, step and stream fit their fields; first + out.size() <= 2^34.
/// @post every element is a function of (key, element index) only.
inline void fill_keyed_normal(const noise_key& key, std::span<double> out, std::uint64_t first = 0) {
  detail::check_noise_key(key);
  require(first + out.size() <= (std::uint64_t{1} << 34), "noise request of ", out.size(), " elements from element ",
          first, " exceeds 2^34 elements");
  std::size_t written = 0;
  while (written < out.size()) {
    const std::uint64_t element = first + written;
    const auto block = detail::normal_block(key, static_cast<std::uint32_t>(element / 4));
    for (std::uint64_t lane = element % 4; lane < 4 && written < out.size(); ++lane) out[written++] = block[lane];
  }
}

/// One element of the keyed N(0, 1) vector.
inline double keyed_normal(const noise_key& key, std::uint64_t element) {
  double value = 0.0;
  fill_keyed_normal(key, std::span<double>(&value, 1), element);
  return value;
}

}  // namespace branchgrpo
