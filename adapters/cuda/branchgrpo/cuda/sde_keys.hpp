#pragma once
// The host half of a fused SDE step (kernels.hpp: sde_step): a transition's arguments checked in one line each, and
// the keys its noise is drawn from on the device. Shared by every caller that hands device tensors to the kernel
// (LibTorch's torch/cuda_kernels.hpp, the Python package's python/src/cuda_step.hpp), so that they draw the same
// noise: the host engine's (rollout/keyed_sde_step.hpp) bit for bit. No CUDA header.
#include <cmath>
#include <cstdint>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/correlator/sibling_rows.hpp"
#include "branchgrpo/cuda/elementwise.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/rollout/keyed_sde_step.hpp"

namespace branchgrpo::cuda {

/// The keys of a transition's child rows as the kernel reads them: each child's own key and, for correlated{s}
/// siblings, its parent's shared key (one per child row), each on its stream as correlated draws them.
struct sde_step_keys {
  std::vector<noise_key> own, shared;  ///< shared: empty for independent children
  double s = 0.0;

  /// The kernel's noise source over device copies of `own` and `shared` (shared_device unused when shared is
  /// empty).
  [[nodiscard]] noise_rows rows(const noise_key* own_device, const noise_key* shared_device) const {
    const bool correlated = !shared.empty();
    return {.own = own_device,
            .shared = correlated ? shared_device : nullptr,
            .s = correlated ? s : 0.0,
            .norm = correlated ? correlated_norm(s) : 1.0};
  }
};

/// `transition` over `parents` rows checked as the kernel needs it, and its keys.
/// Example: 1 parent, branching 2, keys {k0, k1}, parent_keys {p} (correlated{4}) -> own {edge stream of k0, k1},
///   shared {shared stream of p, twice}, s 4.
/// @pre branching >= 1; no log_prob_stds (the kernel scores each row with its drawing std); keys and stds hold
///      parents * branching entries, every std > 0 and finite, every key valid; parent_keys empty or one per parent,
///      then branching >= 2 and s > 0 and finite. Else invalid_input naming the first violated one.
inline sde_step_keys sde_step_keys_of(const sde_transition& transition, std::int64_t parents) {
  require(transition.branching >= 1, "an SDE transition needs branching >= 1, got ", transition.branching);
  require(transition.log_prob_stds.empty(), "the fused SDE kernel scores rows with their drawing stds; got ",
          transition.log_prob_stds.size(), " log-prob stds");
  const std::int64_t children = parents * transition.branching;
  require(static_cast<std::int64_t>(transition.keys.size()) == children &&
              static_cast<std::int64_t>(transition.stds.size()) == children,
          "an SDE transition of ", parents, " rows x ", transition.branching, " children got ", transition.keys.size(),
          " keys and ", transition.stds.size(), " stds");
  for (std::size_t j = 0; j < transition.stds.size(); ++j)
    require(std::isfinite(transition.stds[j]) && transition.stds[j] > 0.0, "row_log_prob std[", j,
            "] = ", transition.stds[j], " must be positive and finite");
  for (const noise_key& key : transition.keys) branchgrpo::detail::check_noise_key(key);
  sde_step_keys out{.own = {transition.keys.begin(), transition.keys.end()}, .shared = {}, .s = transition.s};
  if (transition.parent_keys.empty()) return out;
  // correlated{s} siblings: as correlated does, each child's own draw on stream edge and, per child row, its
  // parent's shared draw on stream shared.
  require(static_cast<std::int64_t>(transition.parent_keys.size()) == parents, "an SDE transition of ", parents,
          " rows got ", transition.parent_keys.size(), " parent keys");
  require(std::isfinite(transition.s) && transition.s > 0.0, "correlated s must be positive and finite, got ",
          transition.s);
  require(transition.branching >= 2, "correlated needs a split of at least 2 children, got ", transition.branching);
  for (const noise_key& key : transition.parent_keys) branchgrpo::detail::check_noise_key(key);
  for (noise_key& key : out.own) key = branchgrpo::detail::stream_key(key, noise_stream::edge);
  for (std::int64_t j = 0; j < children; ++j)
    out.shared.push_back(branchgrpo::detail::stream_key(
        transition.parent_keys[static_cast<std::size_t>(j / transition.branching)], noise_stream::shared));
  return out;
}

}  // namespace branchgrpo::cuda
