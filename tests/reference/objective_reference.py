#!/usr/bin/env python3
"""Test vectors for the decoupled objectives (loss/objective.hpp) from the authors' own training scripts, run as
independent references. Nothing of that code is committed here: this script reads the files from checkouts and
prints the C++ rows that tests/unit/test_objective.cpp holds ("[objective][reference]").

- DiffusionNFT (arXiv 2509.16117), https://github.com/NVlabs/DiffusionNFT, scripts/train_nft_sd3.py: the loss is
  inline in the training loop. The lines from the advantage clip ("advantages_clip = torch.clamp(") to the batch
  mean ("policy_loss = (ori_policy_loss * ...") are sliced out at run time and executed on given tensors: r from the
  clipped advantage, the positive / implicit negative predictions, their x0-space losses with the adaptive weight,
  the division by beta and the factor adv_clip_max.
- AWM (arXiv 2509.25050), https://github.com/scxue/advantage_weighted_matching,
  advantage_weighted_matching/scripts/train_sd3_awm.py: the function compute_log_prob_awm (parsed out of the file
  with ast, run with a stand-in transformer that returns the given velocity) and the inline PPO block of the
  training loop (from "# grpo logic" to the policy loss, sliced out at run time).
- Optionally (--flow-factory DIR, DIR = Flow-Factory/src/flow_factory/trainers of
  https://github.com/X-GenGroup/Flow-Factory), nft.py's inline loss and awm.py's compute_weighted_log_prob are run
  on the same inputs and compared here (float32 for AWM: that method returns .float()); one comment line says how
  close they are.

Usage: /usr/bin/python3 tests/reference/objective_reference.py PATH/TO/DiffusionNFT/scripts/train_nft_sd3.py \
           PATH/TO/advantage_weighted_matching/advantage_weighted_matching/scripts/train_sd3_awm.py \
           [--flow-factory PATH/TO/Flow-Factory/src/flow_factory/trainers]
(Debian's python3-torch 1.13; float64 tensors throughout.) The committed rows came from NVlabs/DiffusionNFT 24af5554,
scxue/advantage_weighted_matching be513723 and X-GenGroup/Flow-Factory a0b2bc5a.

NFT rows: {beta, a_max, advantage, t, v_theta[4], v_old[4], u[4], r, loss, d loss / d v_theta[4]} for one sample
(batch 1) of 4 latent elements, with x0 and eps chosen so that u = eps - x0 and x_t = (1 - t) x0 + t eps; then the
upstream mean over a batch of the last three rows (same beta and a_max).
AWM rows: {weighting, t, v[4], u[4], lp, lp_old, advantage, a_max, advantage_max (0: None), clip_range, loss,
d loss / d lp, d loss / d v[4]} with the authors' loss_type 'exp_first' (one ratio per sample and noise level).
"""
import argparse
import ast
import textwrap
import types
import typing

import torch

DTYPE = torch.float64


def t64(values):
    return torch.tensor(values, dtype=DTYPE)


def lines_between(path, start, end, after=None, nth=1):
    """The lines of `path` from the first one containing `start` (after the first containing `after`, if given)
    through the nth one after it containing `end`, dedented and compiled."""
    with open(path) as source:
        lines = source.read().splitlines()
    begin = 0
    if after is not None:
        begin = next(i for i, line in enumerate(lines) if after in line)
    first = next(i for i in range(begin, len(lines)) if start in lines[i])
    last = [i for i in range(first, len(lines)) if end in lines[i]][nth - 1]
    return compile(textwrap.dedent("\n".join(lines[first:last + 1])), f"{path}:{first + 1}-{last + 1}", "exec")


def function_from(path, name, namespace):
    """Defines the top-level or method function `name` of `path` (without its decorators) in `namespace`."""
    with open(path) as source:
        tree = ast.parse(source.read(), path)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
    return namespace[name]


# ---------------------------------------------------------------------------------------------------------- NFT


def nft_upstream(block, beta, a_max, advantages, t, v_theta, v_old, x0, eps):
    """NVlabs' inline loss on a batch: returns (r, policy_loss, d policy_loss / d forward_prediction)."""
    x0 = t64(x0)
    eps = t64(eps)
    t_expanded = t64(t).view(-1, *([1] * (x0.ndim - 1)))
    forward_prediction = t64(v_theta).requires_grad_()
    namespace = {
        "torch": torch,
        "config": types.SimpleNamespace(beta=beta, train=types.SimpleNamespace(adv_clip_max=a_max)),
        "train_sample_batch": {"advantages": t64(advantages).view(-1, 1)},
        "j_idx": 0,
        "forward_prediction": forward_prediction,
        "old_prediction": t64(v_old),
        "x0": x0,
        "xt": (1 - t_expanded) * x0 + t_expanded * eps,  # as the training loop noises its samples
        "t_expanded": t_expanded,
        "loss_terms": {},
    }
    exec(block, namespace)
    namespace["policy_loss"].backward()
    return namespace["r"], namespace["policy_loss"].item(), forward_prediction.grad


def flow_factory_nft(block, beta, a_max, advantages, t, v_theta, v_old, x0, eps):
    x0 = t64(x0)
    sigma = t64(t).view(-1, *([1] * (x0.ndim - 1)))
    namespace = {
        "torch": torch,
        "self": types.SimpleNamespace(nft_beta=beta),
        "adv": t64(advantages).clamp(-a_max, a_max),
        "adv_clip_range": (-a_max, a_max),
        "new_v_pred": t64(v_theta),
        "old_v_pred": t64(v_old),
        "noised_latents": (1 - sigma) * x0 + sigma * t64(eps),
        "sigma_broadcast": sigma,
        "clean_latents": x0,
    }
    exec(block, namespace)
    return namespace["policy_loss"].item()


def shaped(values):
    return [values[0:2], values[2:4]]  # one sample of 2 x 2 latent elements


def nft_cases():
    """(beta, a_max, advantage, t, v_theta, v_old, x0, eps): general rows, then two rows whose upstream adaptive
    weights are 1 (mean |v+- - u| = t, see unit_row), then three rows of one batch."""
    x0 = [0.31, -1.12, 0.74, 0.05]
    eps = [-0.48, 0.93, 1.61, -0.27]
    v_theta = [-0.9, 1.7, 0.55, -0.2]
    v_old = [-0.7, 2.05, 0.95, -0.45]
    general = [(1.0, 5.0, 2.5, 0.6), (0.5, 5.0, -1.2, 0.3), (0.1, 5.0, 7.0, 0.85), (2.0, 5.0, -9.0, 0.45),
               (1.0, 1.0, 0.3, 0.95), (0.5, 5.0, 0.0, 0.15)]
    cases = [(b, a, adv, t, v_theta, v_old, x0, eps) for b, a, adv, t in general]
    cases.append(unit_row(0.5, 5.0, 1.5, 0.4, x0, eps, [1, -1, 1, 1], [-1, -1, 1, -1], [0.5, 1.5, 1.0, 1.0],
                          [2.0, 0.5, 1.0, 0.5]))
    cases.append(unit_row(1.0, 5.0, -2.0, 0.7, x0, eps, [-1, 1, 1, -1], [1, 1, -1, -1], [1.0, 1.0, 0.5, 1.5],
                          [0.25, 1.75, 1.0, 1.0]))
    batch = [(0.5, 5.0, 3.1, 0.25), (0.5, 5.0, -0.8, 0.55), (0.5, 5.0, 1.0, 0.9)]
    cases += [(b, a, adv, t, v_theta, v_old, x0, eps) for b, a, adv, t in batch]
    return cases


def unit_row(beta, a_max, advantage, t, x0, eps, plus_signs, minus_signs, plus_sizes, minus_sizes):
    """v_theta, v_old with v+ - u = t * plus_signs * plus_sizes and v- - u = t * minus_signs * minus_sizes (sizes of
    mean 1), so the upstream weight mean |x0_hat - x0| = t mean |v+- - u| is t^2 and its x0-space loss
    t^2 mean (v+- - u)^2 / t^2 is the velocity form's."""
    u = [e - x for x, e in zip(x0, eps)]
    plus = [ui + t * s * m for ui, s, m in zip(u, plus_signs, plus_sizes)]
    minus = [ui + t * s * m for ui, s, m in zip(u, minus_signs, minus_sizes)]
    v_old = [(p + m) / 2 for p, m in zip(plus, minus)]  # v+ + v- = 2 v_old
    v_theta = [(p - (1 - beta) * o) / beta for p, o in zip(plus, v_old)]
    return (beta, a_max, advantage, t, v_theta, v_old, x0, eps)


def print_nft(block, ff_block):
    cases = nft_cases()
    ff_gap = 0.0
    for beta, a_max, advantage, t, v_theta, v_old, x0, eps in cases:
        r, loss, grad = nft_upstream(block, beta, a_max, [advantage], [t], [shaped(v_theta)], [shaped(v_old)],
                                     [shaped(x0)], [shaped(eps)])
        u = [e - x for x, e in zip(x0, eps)]
        if ff_block is not None:
            theirs = flow_factory_nft(ff_block, beta, a_max, [advantage], [t], [shaped(v_theta)], [shaped(v_old)],
                                      [shaped(x0)], [shaped(eps)])
            ff_gap = max(ff_gap, abs(theirs - loss) / abs(loss))
        print(f"      {{{beta!r}, {a_max!r}, {advantage!r}, {t!r}, {row(v_theta)}, {row(v_old)}, {row(u)}, "
              f"{r.item()!r}, {loss!r}, {row(grad.flatten().tolist())}}},")
    batch = cases[-3:]
    _, loss, _ = nft_upstream(block, batch[0][0], batch[0][1], [c[2] for c in batch], [c[3] for c in batch],
                              [shaped(c[4]) for c in batch], [shaped(c[5]) for c in batch],
                              [shaped(c[6]) for c in batch], [shaped(c[7]) for c in batch])
    print(f"  // upstream loss of the last three rows as one batch: {loss!r}")
    if ff_block is not None:
        print(f"  // Flow-Factory nft.py on the same rows: max relative difference {ff_gap:.3g}")


# ---------------------------------------------------------------------------------------------------------- AWM


def awm_upstream(log_prob_awm, block, weighting, t, v, x0, eps, lp_old, advantage, a_max, advantage_max, clip_range):
    """The authors' compute_log_prob_awm and PPO block on one sample: (lp, loss, d loss / d lp, d loss / d v)."""
    velocity = t64([shaped(v)]).requires_grad_()
    x0 = t64([shaped(x0)])
    eps = t64([shaped(eps)])
    timestep = t64([t]).view(-1, 1, 1, 1)  # sigma in [0, 1], as the training loop passes it
    train = types.SimpleNamespace(cfg=False, ghuber_power=0.25, adv_clip_max=a_max,
                                  advantage_max=advantage_max or None, loss_type="exp_first", clip_range=clip_range,
                                  train_timesteps=1, batch_size=1)
    config = types.SimpleNamespace(train=train)
    transformer = lambda **kwargs: (velocity,)  # the velocity the policy predicts at x_t
    noised = (1 - timestep) * x0 + timestep * eps
    lp, _, _ = log_prob_awm(transformer, None, None, timestep, None, None, config, noised, x0, eps, weighting=weighting)
    lp.retain_grad()
    namespace = {
        "torch": torch,
        "config": config,
        "accelerator": types.SimpleNamespace(is_main_process=False),
        "sample": {"advantages": t64([[advantage]]), "log_probs": lp.reshape(1, 1), "old_log_probs": t64([[lp_old]])},
    }
    exec(block, namespace)
    loss = namespace["policy_loss"]
    loss.backward()
    return lp.item(), loss.item(), lp.grad.item(), velocity.grad.flatten().tolist()


def flow_factory_lp(method, weighting, t, v, x0, eps):
    model_output = t64([shaped(v)])
    target = t64([shaped(eps)]) - t64([shaped(x0)])
    return method(model_output, target, t64([1000.0 * t]), weighting=weighting).item()


AWM_WEIGHTINGS = {"Uniform": "uniform", "t": "t", "t**2": "t_squared"}


def awm_cases():
    """(weighting, t, v, x0, eps, lp_old - lp, advantage, a_max, advantage_max, clip_range)."""
    x0 = [0.31, -1.12, 0.74, 0.05]
    eps = [-0.48, 0.93, 1.61, -0.27]
    v = [-0.9, 1.7, 0.55, -0.2]
    w = [-0.5, 2.3, 0.4, -0.6]
    return [("Uniform", 0.6, v, x0, eps, 0.0, 1.3, 5.0, 0, 1e-4),
            ("Uniform", 0.6, v, x0, eps, -5e-5, -0.7, 5.0, 0, 1e-4),
            ("t", 0.3, v, x0, eps, -3e-4, 2.0, 5.0, 0, 1e-4),
            ("t", 0.3, w, x0, eps, -3e-4, -2.0, 5.0, 0, 1e-4),
            ("t**2", 0.85, w, x0, eps, 3e-4, 1.5, 5.0, 0, 1e-4),
            ("t**2", 0.85, v, x0, eps, 3e-4, -1.5, 5.0, 0, 1e-4),
            ("Uniform", 0.45, w, x0, eps, 0.1, 8.0, 5.0, 0, 0.2),
            ("t", 0.95, v, x0, eps, -0.25, -6.0, 5.0, 0, 0.2),
            ("t", 0.95, w, x0, eps, 0.05, 0.9, 5.0, 1.0, 0.2),  # the authors' recipes: advantage_max 1
            ("t**2", 0.15, v, x0, eps, -0.9, 2.0, 5.0, 1.0, 1.0)]  # ... and clip_range 1


def print_awm(log_prob_awm, block, ff_method):
    ff_gap = 0.0
    for weighting, t, v, x0, eps, gap, advantage, a_max, advantage_max, clip_range in awm_cases():
        probe, _, _, _ = awm_upstream(log_prob_awm, block, weighting, t, v, x0, eps, 0.0, advantage, a_max,
                                      advantage_max, clip_range)
        lp_old = probe + gap
        lp, loss, d_lp, d_v = awm_upstream(log_prob_awm, block, weighting, t, v, x0, eps, lp_old, advantage, a_max,
                                           advantage_max, clip_range)
        u = [e - x for x, e in zip(x0, eps)]
        if ff_method is not None:
            ff_gap = max(ff_gap, abs(flow_factory_lp(ff_method, weighting, t, v, x0, eps) - lp) / abs(lp))
        print(f"      {{time_weighting::{AWM_WEIGHTINGS[weighting]}, {t!r}, {row(v)}, {row(u)}, {lp!r}, {lp_old!r}, "
              f"{advantage!r}, {a_max!r}, {float(advantage_max)!r}, {clip_range!r}, {loss!r}, {d_lp!r}, {row(d_v)}}},")
    if ff_method is not None:
        print(f"  // Flow-Factory awm.py compute_weighted_log_prob (float32 result): max relative difference "
              f"{ff_gap:.3g}")


def row(values):
    return "{" + ", ".join(repr(float(value)) for value in values) + "}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("nft_script")
    parser.add_argument("awm_script")
    parser.add_argument("--flow-factory", dest="flow_factory")
    args = parser.parse_args()
    nft_block = lines_between(args.nft_script, "advantages_clip = torch.clamp(",
                              "policy_loss = (ori_policy_loss * config.train.adv_clip_max).mean()")
    # From the advantage clip through the second loss_type dispatch (the ratio's, then the policy loss's).
    awm_block = lines_between(args.awm_script, "advantages = torch.clamp(", "Unknown loss_type", after="# grpo logic",
                              nth=2)
    log_prob_awm = function_from(args.awm_script, "compute_log_prob_awm", {"torch": torch})
    ff_nft = ff_awm = None
    if args.flow_factory:
        ff_nft = lines_between(f"{args.flow_factory}/nft.py", "normalized_adv = (adv /",
                               "policy_loss = (ori_policy_loss * adv_clip_range[1]).mean()")
        sigma = lambda timestep: (timestep / 1000.0).clamp(0, 1)  # its flow_match_sigma
        ff_awm = function_from(f"{args.flow_factory}/awm.py", "compute_weighted_log_prob",
                               {"torch": torch, "Literal": typing.Literal, "flow_match_sigma": sigma})
    print("  // NFT rows (NVlabs/DiffusionNFT scripts/train_nft_sd3.py)")
    print_nft(nft_block, ff_nft)
    print("  // AWM rows (scxue/advantage_weighted_matching scripts/train_sd3_awm.py)")
    print_awm(log_prob_awm, awm_block, ff_awm)


if __name__ == "__main__":
    main()
