#pragma once
// The SDE transition of a frontier whose children's noise is keyed and fixed by the keys alone (a chain step, a
// split with independent siblings, or one with correlated{s} siblings): the one place where a backend may take over
// the draw and the step. The rollout engine calls keyed_sde_step; a backend that models KeyedSdeBackend runs it
// where its tensors live (LibTorch on CUDA: the CUDA adapter's fused kernel, noise drawn on the device), every other
// backend gets keyed_sde_step_on_host, the engine's own path: noise drawn on the host, scaled in double, handed over
// with from_host.
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/correlator/correlated.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/rollout/backend.hpp"

namespace branchgrpo {

/// One SDE transition: child row j has parent row j / branching, noise key keys[j] and standard deviation stds[j].
/// With parent_keys (one per parent row) the children's standardized noise is correlated{s}'s: the parent's shared
/// draw and the child's own, (xi_0 + s eta_j) / sqrt(1 + s^2); without, the child's own draw eta_j.
struct sde_transition {
  double x_coeff = 1.0;  ///< the stepper's affine_step: mean = x_coeff x + velocity_coeff v
  double velocity_coeff = 0.0;
  std::int64_t branching = 1;  ///< children per parent (K)
  std::span<const noise_key> keys;
  std::span<const double> stds;
  std::span<const noise_key> parent_keys = {};  ///< empty, or one per parent: correlated{s} siblings
  double s = 4.0;                               ///< correlated's s, used with parent_keys
  /// Empty: each row's log-prob is scored with stds[j], the std it was drawn with; else one per child row, the std
  /// its log-prob is scored with instead (a stepper's log_prob_std: cps).
  std::span<const double> log_prob_stds = {};
};

/// The children's latents and each child row's edge log-prob.
template <class Tensor>
struct keyed_sde_result {
  Tensor next;
  std::vector<double> log_probs;
};

/// A backend that runs keyed_sde_step itself. Its result must be keyed_sde_step_on_host's: `next` bit for bit,
/// the log-probs within rounding of the float64 sums (the CUDA kernels: 1e-12 relative).
template <class B>
concept KeyedSdeBackend = Backend<B> &&
    requires(B& backend, const typename B::tensor& x, const sde_transition& transition, const latent_shape& shape) {
  { backend.keyed_sde_step(x, x, transition, shape) } -> std::same_as<keyed_sde_result<typename B::tensor>>;
};

/// The transition with the Backend operations (the rollout engine's path): for child row j of parent p = j / K,
///   mean = affine(x_coeff, x, velocity_coeff, v)[p];  next[j] = affine(1, mean, 1, from_host(stds[j] * eps_j))
///   with eps_j = fill_keyed_normal(keys[j]), or with parent_keys correlated{s}'s row j of the sibling group
///   {parent_keys[p], keys of p's children} (scaled in double, then stored in the backend's dtype);
///   log_probs[j] = row_log_prob(next, mean, log_prob_stds.empty() ? stds : log_prob_stds)[j].
/// Example: host_backend, x = {{1, 1}}, v = {{0, 0}}, {x_coeff 1, velocity_coeff 0, branching 2, keys {k0, k1},
///   stds {0.5, 0.5}} -> next = {{1 + 0.5 eps_0}, {1 + 0.5 eps_1}} (eps_b = fill_keyed_normal(k_b), 2 values),
///   log_probs[b] = mean over the 2 elements of log N(next; 1, 0.25).
/// @pre x and v have equal rows and shape `shape`; branching >= 1; keys and stds hold rows(x) * branching
///      entries; parent_keys empty or rows(x) entries, then branching >= 2 and s > 0 and finite; every std > 0
///      and finite; log_prob_stds empty or one per child row, each > 0 and finite; every key valid
///      (fill_keyed_normal's).
/// @post rows(next) == rows(x) * branching; throws invalid_input naming the first violated precondition.
template <Backend B>
keyed_sde_result<typename B::tensor> keyed_sde_step_on_host(B& backend, const typename B::tensor& x,
                                                            const typename B::tensor& v,
                                                            const sde_transition& transition,
                                                            const latent_shape& shape) {
  validate(shape);  // before any allocation sized by it
  require(transition.branching >= 1, "an SDE transition needs branching >= 1, got ", transition.branching);
  const std::int64_t parents = backend.rows(x);
  const std::int64_t children = parents * transition.branching;
  require(static_cast<std::int64_t>(transition.keys.size()) == children &&
              static_cast<std::int64_t>(transition.stds.size()) == children,
          "an SDE transition of ", parents, " rows x ", transition.branching, " children got ", transition.keys.size(),
          " keys and ", transition.stds.size(), " stds");
  require(transition.log_prob_stds.empty() || static_cast<std::int64_t>(transition.log_prob_stds.size()) == children,
          "an SDE transition of ", children, " child rows got ", transition.log_prob_stds.size(), " log-prob stds");
  const bool correlated_siblings = !transition.parent_keys.empty();
  require(!correlated_siblings || static_cast<std::int64_t>(transition.parent_keys.size()) == parents,
          "an SDE transition of ", parents, " rows got ", transition.parent_keys.size(), " parent keys");
  typename B::tensor mean = backend.affine(transition.x_coeff, x, transition.velocity_coeff, v);
  if (transition.branching > 1) {
    std::vector<std::int64_t> index(static_cast<std::size_t>(children));
    for (std::int64_t j = 0; j < children; ++j) index[static_cast<std::size_t>(j)] = j / transition.branching;
    mean = backend.gather_rows(mean, index);
  }
  const auto elements = static_cast<std::size_t>(shape.elements());
  std::vector<double> host(static_cast<std::size_t>(children) * elements);
  const auto k = static_cast<std::size_t>(transition.branching);
  if (correlated_siblings)
    for (std::size_t p = 0; p < static_cast<std::size_t>(parents); ++p)
      correlated{.s = transition.s}(
          {.parent = transition.parent_keys[p], .children = transition.keys.subspan(p * k, k), .elements = elements},
          std::span<double>(host).subspan(p * k * elements, k * elements));
  else
    for (std::size_t j = 0; j < static_cast<std::size_t>(children); ++j)
      fill_keyed_normal(transition.keys[j], std::span<double>(host).subspan(j * elements, elements));
  for (std::size_t j = 0; j < static_cast<std::size_t>(children); ++j)
    for (std::size_t i = 0; i < elements; ++i) host[j * elements + i] *= transition.stds[j];
  typename B::tensor next = backend.affine(1.0, mean, 1.0, backend.from_host(host, children, shape));
  std::vector<double> log_probs =
      backend.row_log_prob(next, mean, transition.log_prob_stds.empty() ? transition.stds : transition.log_prob_stds);
  return {.next = std::move(next), .log_probs = std::move(log_probs)};
}

/// The generic entry: the backend's own keyed_sde_step when it models KeyedSdeBackend, keyed_sde_step_on_host
/// otherwise. Example, @pre and @post: keyed_sde_step_on_host's.
template <Backend B>
keyed_sde_result<typename B::tensor> keyed_sde_step(B& backend, const typename B::tensor& x,
                                                    const typename B::tensor& v, const sde_transition& transition,
                                                    const latent_shape& shape) {
  if constexpr (KeyedSdeBackend<B>)
    return backend.keyed_sde_step(x, v, transition, shape);
  else
    return keyed_sde_step_on_host(backend, x, v, transition, shape);
}

}  // namespace branchgrpo
