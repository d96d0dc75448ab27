#pragma once
// Helpers shared by the noise correlators: checking a sibling group and addressing its rows of noise.
#include <cstddef>
#include <span>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/correlator/concept.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"

namespace branchgrpo {

namespace detail {

/// Throws unless `group` is a split (K >= 2, elements >= 1) with valid keys and `out` holds exactly its K rows;
/// returns K.
inline std::size_t check_sibling_group(const sibling_group& group, std::span<const double> out, const char* policy) {
  const std::size_t k = group.children.size();
  require(k >= 2, policy, " needs a split of at least 2 children, got ", k);
  require(group.elements >= 1, policy, " needs at least 1 element per row, got ", group.elements);
  // Division instead of k * elements: no overflow on absurd element counts.
  require(out.size() % k == 0 && out.size() / k == group.elements, policy, " output holds ", out.size(),
          " values, expected ", k, " rows of ", group.elements);
  // Every key is checked, also those a policy does not read (antithetic's odd children, the parent).
  check_noise_key(group.parent);
  for (const noise_key& child : group.children) check_noise_key(child);
  return k;
}

/// `key` with its stream replaced: the correlator, not the caller, decides what a draw is for.
inline noise_key stream_key(noise_key key, noise_stream stream) {
  key.stream = stream;
  return key;
}

/// Row b of `out` (row-major, `elements` per row).
inline std::span<double> sibling_row(std::span<double> out, std::size_t b, std::size_t elements) {
  return out.subspan(b * elements, elements);
}

/// Child b's own N(0, 1) draw (its key, stream edge) into row b of `out`.
inline void fill_own_row(const sibling_group& group, std::size_t b, std::span<double> out) {
  fill_keyed_normal(stream_key(group.children[b], noise_stream::edge), sibling_row(out, b, group.elements));
}

}  // namespace detail

}  // namespace branchgrpo
