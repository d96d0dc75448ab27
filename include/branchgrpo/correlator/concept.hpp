#pragma once
#include <concepts>
#include <cstddef>
#include <span>

#include "branchgrpo/noise/keyed_normal.hpp"

namespace branchgrpo {

/// The K >= 2 children of one parent at a split, as the correlator sees them.
/// `parent` is the parent's key with stream noise_stream::shared (a correlator may switch it to ::auxiliary);
/// `children[b]` is child b's key with stream noise_stream::edge.
struct sibling_group {
  noise_key parent;
  std::span<const noise_key> children;
  std::size_t elements = 0;  ///< elements of one latent row
};

/// A noise correlator writes the K standardized noise rows of a sibling group into `out` (K * elements,
/// row-major) and returns the factor by which the drawn noise's standard deviation differs from the
/// stepper's noise_std (1 for every marginal-preserving correlator; s for scaled{s}). The engine scores
/// each child's edge log-prob with noise_std * that factor. Chain edges (K = 1) never reach a correlator:
/// they draw independent keyed noise.
template <class C>
concept NoiseCorrelator = std::regular<C> && requires(const C& correlator, const sibling_group& group,
                                                      std::span<double> out) {
  { correlator(group, out) } -> std::same_as<double>;
};

}  // namespace branchgrpo
