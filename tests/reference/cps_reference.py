#!/usr/bin/env python3
"""Test vectors for the cps stepper (schedule/steppers.hpp: coefficients-preserving sampling, Wang & Yu, arXiv
2509.05952) from Flow-GRPO's own step function, run as an independent reference: sde_step_with_logprob with
sde_type="cps" in flow_grpo/diffusers_patch/sd3_sde_with_logprob.py of https://github.com/yifan123/flow_grpo.
Nothing of that code is committed here: this script loads the file from a checkout and prints the C++ rows that
tests/unit/test_schedule.cpp holds ("cps against Flow-GRPO's sde_step_with_logprob").

Usage: /usr/bin/python3 tests/reference/cps_reference.py PATH/TO/flow_grpo/flow_grpo/diffusers_patch/sd3_sde_with_logprob.py
(Debian's python3-torch 1.13; float64 tensors.) The committed rows came from yifan123/flow_grpo 54809b5f.

What is called: sde_step_with_logprob(scheduler, v, timestep, x, noise_level=eta, prev_sample=..., sde_type="cps")
with a scheduler stand-in holding the attributes it reads (sigmas, the whole schedule ending at 0, and
index_for_timestep over timesteps = 1000 sigma), on one sample (batch 1) of 3 elements, twice per row:
- prev_sample None, with diffusers' randn_tensor replaced by a stand-in returning the given eps: its prev_sample is
  the drawn sample, next = mean + std eps;
- prev_sample = a given next: its log_prob is that of a known next (it returns the same mean and std).
Each row: {sigma, sigma_next, eta, x[3], v[3], eps[3], sample[3], next[3], mean[3], std, log_prob}, with sigma =
sigmas[i] and sigma_next = sigmas[i + 1] (the function's sigma and sigma_prev: "prev" is the previous sample of the
reverse process, our next step), mean its prev_sample_mean, std its std_dev_t, log_prob its returned log_prob.

Conventions mapped:
- eta: Flow-GRPO's noise_level under sde_type "cps" is our cps eta itself: both std = sigma[i+1] sin(eta pi / 2)
  (not the noise_level a of its "sde" type, our flow_grpo_sde).
- mean and std: our affine_step gives mean = x_coeff x + velocity_coeff v and noise_std; Flow-GRPO's
  prev_sample_mean = (1 - sigma_prev) (x - sigma v) + sqrt(sigma_prev^2 - std^2) (x + (1 - sigma) v).
- log-prob: Flow-GRPO returns -mean over elements of (next - mean)^2, all constants removed. Ours is
  gaussian_log_prob_mean(next, mean, log_prob_std = 1/sqrt(2)) = mean over elements of log N(next; mean, 1/2)
  = -mean (next - mean)^2 - 0.5 log pi. The test adds that constant exactly (it cancels in every ratio and KL);
  both are means over the elements, not sums.
- float32: the function casts model_output, sample and prev_sample with .float(). Every such input here is exactly
  representable in float32 (checked below), so the casts lose nothing; the sigmas are float64 tensors and torch's
  type promotion then computes mean, std, sample and log_prob in float64 (checked: every output is float64).
"""
import math
import sys
import types

import torch

DTYPE = torch.float64


class Noise:
    """diffusers' randn_tensor, replaced: returns the eps the current row gives (the function's only random draw)."""
    eps = None

    @staticmethod
    def randn_tensor(shape, generator=None, device=None, dtype=None):
        assert tuple(shape) == tuple(Noise.eps.shape), (shape, Noise.eps.shape)
        return Noise.eps


def load_step(path):
    # The file imports diffusers for randn_tensor (replaced by Noise.randn_tensor) and for a type annotation
    # (FlowMatchEulerDiscreteScheduler): stand-ins keep Debian's python3-torch enough to run it.
    names = ["diffusers", "diffusers.utils", "diffusers.utils.torch_utils", "diffusers.schedulers",
             "diffusers.schedulers.scheduling_flow_match_euler_discrete"]
    modules = {name: types.ModuleType(name) for name in names}
    modules["diffusers.utils.torch_utils"].randn_tensor = Noise.randn_tensor
    modules["diffusers.schedulers.scheduling_flow_match_euler_discrete"].FlowMatchEulerDiscreteScheduler = object
    sys.modules.update(modules)
    namespace = {"__name__": "flow_grpo_sd3_sde_with_logprob"}
    with open(path) as source:
        exec(compile(source.read(), path, "exec"), namespace)
    return namespace["sde_step_with_logprob"]


class Scheduler:
    """What sde_step_with_logprob reads of a FlowMatchEulerDiscreteScheduler: sigmas (ending at 0) and
    index_for_timestep, over timesteps = 1000 sigma (diffusers' convention)."""

    def __init__(self, sigmas):
        self.sigmas = torch.tensor(sigmas, dtype=DTYPE)
        self.timesteps = self.sigmas[:-1] * 1000

    def index_for_timestep(self, timestep):
        found = (self.timesteps == timestep).nonzero()
        assert len(found) == 1, timestep
        return int(found[0])


def shifted(steps, shift=3.0):
    t = [1 - i / steps for i in range(steps + 1)]
    return [shift * u / (1 + (shift - 1) * u) for u in t]


def exact_float32(values):
    tensor = torch.tensor([values], dtype=DTYPE)  # batch 1, 3 elements
    assert torch.equal(tensor.float().to(DTYPE), tensor), values
    return tensor


def fmt(tensor):
    return "{" + ", ".join(repr(value) for value in tensor.flatten().tolist()) + "}"


def main():
    step = load_step(sys.argv[1])
    # (schedule, step, eta): the first, a middle and the last steps of a shifted 10-step schedule, steps of the
    # plain linear one, the doc example {1, 0.5, 0}; eta from 0.1 to 1.
    ten, linear = shifted(10), [1.0, 0.75, 0.5, 0.25, 0.0]
    cases = [(ten, 0, 0.8), (ten, 3, 0.5), (ten, 6, 1.0), (ten, 8, 0.1), (ten, 9, 0.8), (linear, 1, 0.3),
             (linear, 2, 0.7), ([1.0, 0.5, 0.0], 0, 0.5)]
    # Float32-exact inputs (multiples of 1/64), cycled over the rows.
    inputs = [([0.375, -1.25, 0.8125], [-0.6875, 1.5, 0.09375], [0.5, -1.125, 0.25], [0.25, -0.75, 0.5625]),
              ([-0.90625, 0.140625, 1.75], [1.125, -0.4375, -2.0], [-1.5, 0.625, 0.046875], [-1.0, 0.3125, 1.4375]),
              ([1.3125, 0.5625, -0.296875], [0.21875, -1.0625, 0.828125], [0.875, 1.25, -0.6875], [1.0, 0.9375, -0.5])]
    for index, (sigmas, i, eta) in enumerate(cases):
        x, v, eps, given = (exact_float32(values) for values in inputs[index % len(inputs)])
        scheduler = Scheduler(sigmas)
        timestep = scheduler.timesteps[i:i + 1]
        Noise.eps = eps
        sample, _, mean, std = step(scheduler, v, timestep, x, noise_level=eta, sde_type="cps")
        _, log_prob, mean_again, std_again = step(scheduler, v, timestep, x, noise_level=eta, prev_sample=given,
                                                  sde_type="cps")
        assert torch.equal(mean, mean_again) and torch.equal(std, std_again)
        assert all(t.dtype == DTYPE for t in (sample, mean, std, log_prob)), (sample.dtype, mean.dtype, log_prob.dtype)
        print(f"      {{{sigmas[i]!r}, {sigmas[i + 1]!r}, {eta!r}, {fmt(x)}, {fmt(v)}, {fmt(eps)}, {fmt(sample)}, "
              f"{fmt(given)}, {fmt(mean)}, {std.item()!r}, {log_prob.item()!r}}},")


if __name__ == "__main__":
    main()
