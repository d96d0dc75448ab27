#!/usr/bin/env python3
"""Test vectors for ode_step's DPM-Solver++(2M) (schedule/steppers.hpp) from MixGRPO's own solver, run as an
independent reference: MixGRPO-Flash (arXiv 2507.21802) integrates the ODE steps outside its SDE window with
fastvideo/utils/sampling_utils.py's multistep_dpm_solver_second_order_update (dpm_algorithm_type "dpmsolver++",
dpm_solver_type "midpoint") and dpm_solver_first_order_update. Nothing of that code is committed here: this script
loads the file from a checkout of https://github.com/Tencent-Hunyuan/MixGRPO and prints the C++ rows that
tests/unit/test_schedule.cpp holds ("ode_step against MixGRPO's DPM-Solver++").

Usage: /usr/bin/python3 tests/reference/dpm_solver_reference.py PATH/TO/MixGRPO/fastvideo/utils/sampling_utils.py
(Debian's python3-torch 1.13; float64 tensors throughout.)

Each row: {sigma_prev, sigma_from, sigma_to, x, v, x0_prev, next}. MixGRPO's update reads its sigmas at
step_index - 1, step_index, step_index + 1, so a compressed step (skip edges between) is the list
[sigma_prev, sigma_from, sigma_to] at step_index 1; its model outputs are data predictions x0 = x - sigma v
(convert_model_output). sigma_prev = -1 marks a first-order row (dpm_solver_first_order_update).
"""
import sys
import types

import torch


def load_solver(path):
    # The file imports diffusers (randn_tensor, for the SDE variant only) and tqdm: neither is used by the ODE
    # updates, so empty stand-ins keep Debian's python3-torch enough to run them.
    diffusers = types.ModuleType("diffusers")
    utils = types.ModuleType("diffusers.utils")
    torch_utils = types.ModuleType("diffusers.utils.torch_utils")
    torch_utils.randn_tensor = None
    sys.modules.update({"diffusers": diffusers, "diffusers.utils": utils, "diffusers.utils.torch_utils": torch_utils})
    if "tqdm" not in sys.modules:
        tqdm = types.ModuleType("tqdm")
        tqdm.tqdm = None
        sys.modules["tqdm"] = tqdm
    namespace = {"__name__": "mixgrpo_sampling_utils"}
    with open(path) as source:
        exec(compile(source.read(), path, "exec"), namespace)
    return namespace


def main():
    solver = load_solver(sys.argv[1])
    args = types.SimpleNamespace(dpm_algorithm_type="dpmsolver++", dpm_solver_type="midpoint")
    t = lambda value: torch.tensor(value, dtype=torch.float64)
    # (sigma_prev, sigma_from, sigma_to): consecutive steps of a shifted schedule, compressed (stride 2, 3) steps,
    # unequal spacings, and first-order rows.
    cases = [(0.9, 0.8, 0.7), (0.75, 0.5, 0.25), (0.8571428571428571, 0.7826086956521738, 0.6923076923076923),
             (0.6, 0.45, 0.2), (0.95, 0.5, 0.45), (0.3, 0.2, 0.05), (-1, 0.5, 0.25), (-1, 0.8, 0.4)]
    x, v, x0_prev = 0.7, -1.3, 0.4
    for sigma_prev, sigma_from, sigma_to in cases:
        sample = t([x])
        m0 = sample - sigma_from * t([v])  # convert_model_output
        if sigma_prev < 0:
            out = solver["dpm_solver_first_order_update"](args, m0, t([sigma_from, sigma_to]), 0, sample, None, False)
        else:
            out = solver["multistep_dpm_solver_second_order_update"](
                args, [t([x0_prev]), m0], t([sigma_prev, sigma_from, sigma_to]), 1, sample, None, False)
        print(f"      {{{sigma_prev!r}, {sigma_from!r}, {sigma_to!r}, {x!r}, {v!r}, {x0_prev!r}, {out[0].item()!r}}},")


if __name__ == "__main__":
    main()
