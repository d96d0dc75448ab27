#pragma once
// Rollout: sampling the forest of a tree_plan with a denoiser on a tensor backend (docs/rollout.md).
//
//   Backend, Denoiser  (rollout/backend.hpp)  the few tensor operations the engine needs, and the model:
//                      v = denoiser(x, {step, sigma, tree keys, prompts}).
//   host_backend       (rollout/host_backend.hpp)  std::vector<double> reference backend; defines the numbers
//                      every other backend must reproduce. Use for tests, toys and CPU-sized latents.
//   rollout            (rollout/engine.hpp)  frontier-batched engine. Per step s, over all trees at once:
//                        mean = a x + c v   ({a, c, std} from the stepper; ode_step on ODE edges)
//                        next = mean + std * f * eps   (eps keyed; f and eps from the correlator at splits)
//                        log-prob = mean over elements of log N(next; mean, (std f)^2)
//                      Denoiser calls per step: ceil(frontier rows / max_batch); results do not depend on it.
//   keyed_sde_step     (rollout/keyed_sde_step.hpp)  the SDE step when the noise is fixed by the keys alone (chain
//                      steps, independent or correlated{s} splits): a backend that models KeyedSdeBackend runs it
//                      itself (LibTorch on CUDA: the fused kernel, noise drawn on the device); others get
//                      keyed_sde_step_on_host.
//   latent_of, leaf_latents  read a node's latent / the leaves' latents (tree.leaves() order) back.
//   sample_ode         (rollout/ode_sampler.hpp)  keyed deterministic Euler ODE samples without a tree (held-out
//                      evaluation, grids).
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/rollout/engine.hpp"
#include "branchgrpo/rollout/host_backend.hpp"
#include "branchgrpo/rollout/keyed_sde_step.hpp"
#include "branchgrpo/rollout/ode_sampler.hpp"
