#pragma once
// Noise correlators: the K >= 2 standardized noise rows of the children of one split (docs/correlators.md).
// Child b's next latent is mean_b + noise_std * factor * xi_b; the returned factor makes the engine score
// the edge with the std the sample was really drawn from.
//
//   independent  xi_b = eta_b, each child its own keyed N(0, 1) draw. Factor 1. The plain SDE; use as the
//                baseline and whenever siblings should explore as widely as possible.
//   correlated   xi_b = (xi_0 + s eta_b) / sqrt(1 + s^2), xi_0 shared (paper Eq. 2, default s = 4).
//                Factor 1; siblings correlate by 1 / (1 + s^2). The paper's method and the default.
//   scaled       xi_b = eta_b, factor scale: child b is drawn at std noise_std * scale and scored with it (the
//                official code's split_noise_scale, default 4, which scored it with noise_std: a defect). Use only
//                to reproduce the official code's wide split exploration, correctly scored.
//   antithetic   xi_{2j+1} = -xi_{2j}; odd K: the last child independent. Factor 1. Use for even K (K = 2)
//                when a pair's mean reward should carry no first-order noise term (lower-variance baselines).
//   orthogonal   independent draws, Gram-Schmidt orthogonalized, each rescaled to its own draw's norm.
//                Factor 1. Use for K >= 3 on small latents, where independent draws are far from orthogonal.
//
// eta_b is keyed by child b (stream edge), xi_0 by the parent (stream shared); see docs/design.md.
// A correlator is any regular type with `double operator()(const sibling_group&, std::span<double>) const`
// (concept NoiseCorrelator).
// The list of these policies is correlator_policies (catalog.hpp), and any_correlator chooses one of them at run time.
#include "branchgrpo/correlator/antithetic.hpp"
#include "branchgrpo/correlator/catalog.hpp"
#include "branchgrpo/correlator/concept.hpp"
#include "branchgrpo/correlator/correlated.hpp"
#include "branchgrpo/correlator/independent.hpp"
#include "branchgrpo/correlator/orthogonal.hpp"
#include "branchgrpo/correlator/scaled.hpp"
