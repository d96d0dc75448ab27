#!/usr/bin/env python3
"""Test vectors for GRPO-Guard's RatioNorm with its 1/dt gradient reweighting (arXiv 2510.22319) and for TempFlow-GRPO's
noise-aware step weights (arXiv 2508.04324) from the authors' own training code, run as an independent reference for
loss/ratio_guard.hpp and loss/step_weights.hpp. Nothing of that code is committed here: this script loads the
step function from each checkout, slices the policy-loss lines out of each training script at run time, and prints
the C++ rows that tests/unit/test_loss.cpp holds ("RatioNorm and inverse_dt against GRPO-Guard's trainer",
"noise_std against TempFlow-GRPO's trainer").

Usage: /usr/bin/python3 tests/reference/guard_reference.py FLOW_GRPO_CHECKOUT TEMPFLOW_GRPO_CHECKOUT
(Debian's python3-torch 1.13; float64.) Each checkout needs flow_grpo/diffusers_patch/sd3_sde_with_logprob.py and
the training script:
- GRPO-Guard: https://github.com/yifan123/flow_grpo at 9745241c (the merge of PR #175 from jingw193, whose commit
  2e2f712e "GRPO-Guard" by the paper's first author added scripts/train_sd3_GRPO_Guard.py, config/grpo_guard.py
  and the return_sqrt_dt option of sde_step_with_logprob); scripts/train_sd3_GRPO_Guard.py.
- TempFlow-GRPO: https://github.com/Shredded-Pork/TempFlow-GRPO at e66824ec; scripts/train_sd3_pr.py (the process-
  reward trainer, the one that weighs the loss by the step's noise) with its sde_step_with_logprob.
The lines sliced out (from "# grpo logic" to the policy loss) are exec'd with the tensors below as their locals.
The committed rows came from those commits; the TempFlow-GRPO snapshot at hand stopped before its code's release, so
its two files were written out by hand from a code-search index's copy at e66824ec (the trainer as the excerpt of
its loss lines, which is all this script reads of it).

GRPO-Guard rows: {schedule, step, a, A, eps, x[3], v_old[3], v_new[3], next[3], mean_old[3], mean_new[3], std_dev_t,
sqrt_dt, log_old, log_new, bias, ratio, loss, weighted_loss, d_log_new, d_mean_new[3]}, batch 1, 3 elements.
sde_step_with_logprob (sde_type "sde", noise_level a) with v_old and prev_sample = next gives the rollout's log_old
and mean_old; with v_new (a leaf requiring grad) it gives log_new, mean_new, std_dev_t and sqrt_dt. The sliced lines
then compute ratio_mean_bias (bias), ratio and policy_loss (loss, before "if config.rationorm: policy_loss /=
sqrt_dt.mean()**2"; weighted_loss after it); backward of weighted_loss gives d_log_new (the gradient at log_prob) and
d_mean_new (at prev_sample_mean, through log_prob and the bias).
Conventions mapped:
- std: their std_dev_t is Flow-GRPO's sigma_t = a sqrt(sigma / (1 - sigma)); the normaliser sqrt_dt * sigma_t is our
  edge std s (flow_grpo_sde's noise_std). Their bias is our mean gap b = kl_flow(mean_new, mean_old, s).
- ratio: exp((log_new - log_old + bias) * s) = exp(ratio_norm_log_ratio); loss = ratio_norm_loss.
- inverse_dt: sqrt_dt**2 = -dt = sigma - sigma_next, so weighted_loss = loss * inverse_dt_weight(sigma, sigma_next),
  raw (not normalised), as ours.
- gradient: d weighted_loss / d log_new = ratio_norm_loss_gradient * inverse_dt_weight; at the mean it adds the bias's
  path, which our trainer takes through -log p(mean_old): d_mean_new_i = G w ((next_i - mean_i) - (mean_old_i -
  mean_i)) / (s^2 N).
- log-probs: full Gaussian log-densities averaged over the elements (the "sde" branch), as ours, except that their
  constant torch.log(torch.sqrt(2 * torch.as_tensor(math.pi))) is computed in float32 (as_tensor of a Python float
  is float32): 0.9189385175704956 against 0.5 log(2 pi) = 0.9189385332046727, so their log-probs are 1.5634e-8
  higher than ours. The script prints that constant; the test adds the difference exactly (it cancels in every
  ratio). The same holds for TempFlow-GRPO's step.
- float32: the function casts model_output, sample and prev_sample with .float(); every such input here is float32-
  exact (next is rounded to float32 before both calls), the sigmas are float64, so every output is float64.

TempFlow-GRPO rows: {schedule, step, A, eps, x[3], v_old[3], v_new[3], next[3], std, log_old, log_new, loss,
d_log_new}, every step of each schedule. Their sde_step_with_logprob (noise level hard-coded 0.7, no casts) returns
std_dev_t * sqrt(-dt), the edge std, as its 4th value ("the original paper's case"; the commented alternative returns
sigma_t); the sliced lines give policy_loss = mean(max(-2.25 std A r, -2.25 std A clamp(r))).
Conventions mapped: loss = 2.25 std_t ppo_clipped_loss, a hand-tuned constant 2.25 times the raw std; ours is
w_t = std_t / mean_s std_s, so their weight is ours times 2.25 mean_s std_s (a constant per schedule). Their std
is (B, 1) and multiplies (B,) advantages, broadcasting to (B, B): harmless as every sample of a batch is at the same
step; batch 1 here.
"""
import math
import sys
import textwrap
import types

import torch

# The scheduler stand-in, the shifted schedule and the row formatting of the cps reference (same directory).
from cps_reference import DTYPE, Scheduler, exact_float32, fmt, shifted


def stub_diffusers():
    names = ["diffusers", "diffusers.utils", "diffusers.utils.torch_utils", "diffusers.configuration_utils",
             "diffusers.schedulers", "diffusers.schedulers.scheduling_utils",
             "diffusers.schedulers.scheduling_flow_match_euler_discrete"]
    modules = {name: types.ModuleType(name) for name in names}
    modules["diffusers.utils.torch_utils"].randn_tensor = None  # prev_sample is always given
    for name in ["BaseOutput", "is_scipy_available", "logging"]:
        setattr(modules["diffusers.utils"], name, None)
    modules["diffusers.configuration_utils"].ConfigMixin = object
    modules["diffusers.configuration_utils"].register_to_config = None
    modules["diffusers.schedulers.scheduling_utils"].SchedulerMixin = object
    euler = modules["diffusers.schedulers.scheduling_flow_match_euler_discrete"]
    euler.FlowMatchEulerDiscreteScheduler = object
    euler.FlowMatchEulerDiscreteSchedulerOutput = object
    sys.modules.update(modules)


def load_step(checkout):
    path = checkout + "/flow_grpo/diffusers_patch/sd3_sde_with_logprob.py"
    namespace = {"__name__": "upstream_sd3_sde_with_logprob"}
    with open(path) as source:
        exec(compile(source.read(), path, "exec"), namespace)
    return namespace["sde_step_with_logprob"]


def loss_lines(path, marker, end):
    """The lines from the "# grpo logic" before `marker` to the first line starting with `end`, dedented."""
    with open(path) as source:
        lines = source.read().split("\n")
    at = next(i for i, line in enumerate(lines) if marker in line)
    first = max(i for i in range(at) if lines[i].strip() == "# grpo logic")
    last = next(i for i in range(at, len(lines)) if lines[i].strip().startswith(end))
    return textwrap.dedent("\n".join(lines[first:last + 1]))


# Schedule 0: the shift-3 10-step schedule of SD3 (the GRPO-Guard configs' num_steps 10); 1: a plain linear one.
SCHEDULES = [shifted(10), [1.0, 0.75, 0.5, 0.25, 0.0]]


# Float32-exact inputs (multiples of 1/1024), cycled over the rows: x, v_old, the change v_new - v_old, eps.
INPUTS = [([0.375, -1.25, 0.8125], [-0.6875, 1.5, 0.09375], [0.0078125, -0.00390625, 0.01171875], [0.5, -1.125, 0.25]),
          ([-0.90625, 0.140625, 1.75], [1.125, -0.4375, -2.0], [-0.015625, 0.0068359375, 0.0029296875],
           [-1.5, 0.625, 0.046875]),
          ([1.3125, 0.5625, -0.296875], [0.21875, -1.0625, 0.828125], [0.0009765625, 0.0107421875, -0.005859375],
           [0.875, 1.25, -0.6875])]


def guard_rows(checkout):
    step = load_step(checkout)
    code = loss_lines(checkout + "/scripts/train_sd3_GRPO_Guard.py", "ratio_mean_bias = ratio_mean_bias /",
                      "policy_loss = policy_loss / (sqrt_dt.mean()**2)")
    split = code.index("policy_loss = torch.mean(torch.maximum(unclipped_loss, clipped_loss))")
    split = code.index("\n", split) + 1
    before, after = code[:split], code[split:]
    assert after.strip() == "if config.rationorm:\n    policy_loss = policy_loss / (sqrt_dt.mean()**2)", after
    # (schedule, step, noise level a, advantage, clip range, sign of v_new - v_old): the first step (sigma 1), middle
    # and last steps, both signs of A, the configs' clip 2e-6 and wider ones, r_hat on both sides of 1; the last row
    # has v_new == v_old (r_hat = 1 exactly).
    cases = [(0, 0, 0.7, 1.0, 1e-3, 1), (0, 2, 0.7, -1.5, 1e-3, 1), (0, 4, 0.7, 2.0, 2e-6, 1),
             (0, 6, 0.9, -0.75, 1e-2, 1), (0, 8, 0.7, 1.25, 1e-3, 1), (0, 9, 0.7, -2.0, 2e-6, 1),
             (1, 1, 0.5, 0.5, 1e-3, 1), (1, 2, 1.0, -1.0, 1e-4, 1), (1, 3, 0.7, 3.0, 1e-3, 1),
             (0, 3, 0.7, 1.0, 1e-4, -1), (0, 7, 0.7, -1.0, 1e-3, -1), (1, 0, 0.7, 2.0, 2e-6, -1), (0, 5, 0.7, 1.0, 1e-3, 0)]
    for row, (schedule, index, a, advantage, clip, sign) in enumerate(cases):
        x, v_old, dv, eps = (exact_float32(values) for values in INPUTS[row % len(INPUTS)])
        dv = sign * dv
        scheduler = Scheduler(SCHEDULES[schedule])
        timestep = scheduler.timesteps[index:index + 1]
        with torch.no_grad():
            _, _, mean_draft, sigma_draft, sqrt_dt_draft = step(scheduler, v_old, timestep, x, noise_level=a,
                                                                prev_sample=x, return_sqrt_dt=True)
        nxt = (mean_draft + sigma_draft * sqrt_dt_draft * eps).float().to(DTYPE)  # float32-exact
        with torch.no_grad():
            _, log_old, mean_old, _, _ = step(scheduler, v_old, timestep, x, noise_level=a, prev_sample=nxt,
                                              return_sqrt_dt=True)
        v_new = (v_old + dv).float().requires_grad_(True)
        assert torch.equal(v_new.detach().to(DTYPE), v_old + dv)
        _, log_new, mean_new, std_dev_t, sqrt_dt = step(scheduler, v_new, timestep, x, noise_level=a,
                                                        prev_sample=nxt, return_sqrt_dt=True)
        log_new.retain_grad()
        mean_new.retain_grad()
        config = types.SimpleNamespace(rationorm=True,
                                       train=types.SimpleNamespace(adv_clip_max=5.0, clip_range=clip, beta=0.0))
        local = {"torch": torch, "config": config, "j": 0, "log_prob": log_new, "prev_sample_mean": mean_new,
                 "std_dev_t": std_dev_t, "sqrt_dt": sqrt_dt,
                 "sample": {"advantages": torch.tensor([[advantage]], dtype=DTYPE), "log_probs": log_old[:, None],
                            "prev_sample_mean": mean_old[:, None]}}
        exec(before, local)
        loss = local["policy_loss"].item()
        exec(after, local)
        weighted = local["policy_loss"]
        weighted.backward()
        outputs = (log_old, log_new, mean_old, mean_new, std_dev_t, sqrt_dt, local["ratio_mean_bias"],
                   local["ratio"], weighted)
        assert all(t.dtype == DTYPE for t in outputs), [t.dtype for t in outputs]
        print(f"      {{{schedule}, {index}, {a!r}, {advantage!r}, {clip!r}, {fmt(x)}, {fmt(v_old)}, "
              f"{fmt(v_new.detach())}, {fmt(nxt)}, {fmt(mean_old)}, {fmt(mean_new.detach())}, "
              f"{std_dev_t.item()!r}, {sqrt_dt.item()!r}, {log_old.item()!r}, {log_new.item()!r}, "
              f"{local['ratio_mean_bias'].item()!r}, {local['ratio'].item()!r}, {loss!r}, {weighted.item()!r}, "
              f"{log_new.grad.item()!r}, {fmt(mean_new.grad)}}},")


def tempflow_rows(checkout):
    step = load_step(checkout)
    code = loss_lines(checkout + "/scripts/train_sd3_pr.py", "unclipped_loss = - 2.25 * std_dev_t",
                      "policy_loss = torch.mean(torch.maximum(unclipped_loss, clipped_loss))")
    advantages = [1.0, -1.5, 0.75, -0.5]
    clips = [1e-3, 1e-4, 1e-2]
    row = 0
    for schedule, sigmas in enumerate(SCHEDULES):
        scheduler = Scheduler(sigmas)
        for index in range(len(sigmas) - 1):
            x, v_old, dv, eps = (exact_float32(values) for values in INPUTS[row % len(INPUTS)])
            advantage, clip = advantages[row % len(advantages)], clips[row % len(clips)]
            row += 1
            timestep = scheduler.timesteps[index:index + 1]
            with torch.no_grad():
                _, _, mean_draft, std_draft = step(scheduler, v_old, timestep, x, prev_sample=x)
            nxt = (mean_draft + std_draft * eps).float().to(DTYPE)
            with torch.no_grad():
                _, log_old, _, _ = step(scheduler, v_old, timestep, x, prev_sample=nxt)
            v_new = (v_old + dv).requires_grad_(True)
            _, log_new, _, std = step(scheduler, v_new, timestep, x, prev_sample=nxt)
            log_new.retain_grad()
            config = types.SimpleNamespace(train=types.SimpleNamespace(adv_clip_max=5.0, clip_range=clip, beta=0.0))
            local = {"torch": torch, "config": config, "j": 0, "log_prob": log_new, "std_dev_t": std,
                     "sample": {"advantages": torch.tensor([[advantage]], dtype=DTYPE),
                                "log_probs": log_old[:, None]}}
            exec(code, local)
            loss = local["policy_loss"]
            loss.backward()
            assert all(t.dtype == DTYPE for t in (log_old, log_new, std, loss))
            print(f"      {{{schedule}, {index}, {advantage!r}, {clip!r}, {fmt(x)}, {fmt(v_old)}, "
                  f"{fmt(v_new.detach())}, {fmt(nxt)}, {std.item()!r}, {log_old.item()!r}, {log_new.item()!r}, "
                  f"{loss.item()!r}, {log_new.grad.item()!r}}},")


def main():
    stub_diffusers()
    # The constant both step functions subtract, evaluated as they do (float32, then promoted).
    print("  // their log(sqrt(2 pi)):", repr(torch.log(torch.sqrt(2 * torch.as_tensor(math.pi))).item()))
    print("  // schedules")
    for sigmas in SCHEDULES:
        print("      {" + ", ".join(repr(sigma) for sigma in sigmas) + "},")
    print("  // GRPO-Guard (yifan123/flow_grpo 9745241c)")
    guard_rows(sys.argv[1])
    print("  // TempFlow-GRPO (Shredded-Pork/TempFlow-GRPO e66824ec)")
    tempflow_rows(sys.argv[2])


if __name__ == "__main__":
    main()
