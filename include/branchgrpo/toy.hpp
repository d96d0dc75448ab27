#pragma once
// The toy: a 2-D flow-matching model with exact gradients, so that the whole BranchGRPO method trains and is
// tested on a CPU in seconds (docs/toy.md).
//
//   ring_mixture      (toy/ring_data.hpp)  data: M = 8 Gaussians (std 0.15) on a circle of radius 2, mode k at
//                     angle 2 pi k / M. Prompt p names target mode p mod M.
//   fourier_policy<B> (toy/fourier_policy.hpp)  the model, a Denoiser and Policy on any backend B:
//                       v(x, sigma, p) = W phi(x, sigma, c(p)),  phi_j = sqrt(2 / F) cos(w_j . z + b_j),
//                     F = 256 fixed random Fourier features, W 2 x F. Base W: ridge fit of flow-matching
//                     targets eps - x0 at x = (1 - sigma) x0 + sigma eps (prompt ignored). Gradient of the
//                     edge log-prob in closed form: d log p / d W[k, :] = c (next_k - mean_k) / (2 std^2) phi.
//                     Adam updates (adam, toy/adam.hpp).
//   mode_reward<B>    (toy/rewards.hpp)  r = exp(-|x - m_p|^2 / (2 width^2)), width 0.5: 1 on the prompted
//                     mode, ~0.01 on its neighbours.
//   make_toy_policy   the fitted model from a seed.
// Use the toy for end-to-end tests of trainers, pruners and advantage estimators, and for quick ablations:
// the base model samples all 8 modes evenly; reward rises as the policy learns to follow the prompt.
#include <cstdint>
#include <utility>

#include "branchgrpo/rollout/host_backend.hpp"
#include "branchgrpo/toy/adam.hpp"
#include "branchgrpo/toy/fourier_policy.hpp"
#include "branchgrpo/toy/rewards.hpp"
#include "branchgrpo/toy/ridge.hpp"
#include "branchgrpo/toy/ring_data.hpp"

namespace branchgrpo {

/// The fitted toy model on backend B (host_backend by default).
/// Example: make_toy_policy(7).parameters().size() == 512 (2 x 256); two calls with seed 7 give identical W.
/// @pre options valid (fourier_options::validate).
template <Backend B = host_backend>
fourier_policy<B> make_toy_policy(std::uint64_t seed, fourier_options options = {}, B backend = {}) {
  return fourier_policy<B>(seed, std::move(options), std::move(backend));
}

}  // namespace branchgrpo
