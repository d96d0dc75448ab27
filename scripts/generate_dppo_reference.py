#!/usr/bin/env python3
"""Reference cases of Flow-DPPO's per-edge rule (arXiv 2606.11025) from the authors' own code, as a C++ header.

Reads unirl/algorithms/flowdppo.py of Tencent-Hunyuan/UniRL, either from a checkout (the file in its work tree) or
from a git directory (a bare mirror: `git show HEAD:unirl/algorithms/flowdppo.py`), takes only its two loss helpers
`_gaussian_kl_div` and `_flowdppo_kl_adv_loss` out of it with `ast` (so neither the unirl package nor its
dependencies are imported) and runs them with torch in float64 on seeded cases. For each case it records the inputs
(per row: new and old log-prob, new and old transition means, sigma_t, advantage; the KL threshold) and UniRL's
outputs per row: kl_per_sample, loss_per_elem, the removal mask (KL high and ratio moving with the advantage) and the
gradient of sum(loss_per_elem) with respect to new_logp by autograd. None of UniRL's code is written out.

Layout: UniRL's tensors are new_logp [B, S'] and means [B, S', *latent]; here sigma_t is given per row,
[B, S', 1, ...] (UniRL's own caller passes [1, S', 1, 1, 1]), and the advantages per row. Row r = b * S' + s.

Usage: python3 scripts/generate_dppo_reference.py UNIRL_CHECKOUT_OR_MIRROR [--out tests/unit/dppo_reference_cases.hpp]
The header is formatted with clang-format (the repository's .clang-format) when clang-format is on the PATH.
"""

import __future__

import argparse
import ast
import math
import os
import shutil
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = "unirl/algorithms/flowdppo.py"
FUNCTIONS = ("_gaussian_kl_div", "_flowdppo_kl_adv_loss")
DTYPE = torch.float64


def git(location, *args):
    """git's output in location, or None when git fails there."""
    try:
        return subprocess.run(["git", "-C", location, *args], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def read_unirl(location):
    """(source text of flowdppo.py, commit hash or None, how it was read) from a checkout or a git directory."""
    path = os.path.join(location, SOURCE)
    if os.path.isfile(path):
        # The commit only when location is the top of its own git work tree (not a copy inside another repository).
        top = git(location, "rev-parse", "--show-toplevel")
        commit = None
        if top is not None and os.path.realpath(top.strip()) == os.path.realpath(location):
            commit = git(location, "rev-parse", "HEAD").strip()
            if git(location, "status", "--porcelain", "--", SOURCE):
                commit += " with local changes to " + SOURCE
        return open(path, encoding="utf-8").read(), commit, "work tree"
    if (git(location, "rev-parse", "--is-bare-repository") or "").strip() != "true":
        sys.exit(f"{location}: neither a checkout holding {SOURCE} nor a bare git directory (mirror)")
    commit = git(location, "rev-parse", "HEAD").strip()
    text = git(location, "show", f"HEAD:{SOURCE}")
    if text is None:
        sys.exit(f"{location}: HEAD has no {SOURCE}")
    return text, commit, "git HEAD"


def load_functions(text):
    """The two helpers, compiled from their own source only (annotations left unevaluated, as in the module)."""
    tree = ast.parse(text)
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in FUNCTIONS]
    if sorted(node.name for node in found) != sorted(FUNCTIONS):
        sys.exit(f"{SOURCE}: expected top-level functions {FUNCTIONS}, found {[node.name for node in found]}")
    module = ast.Module(body=found, type_ignores=[])
    namespace = {"torch": torch}
    code = compile(module, SOURCE, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)  # noqa: S102 - UniRL's two loss helpers, nothing else
    return namespace["_gaussian_kl_div"], namespace["_flowdppo_kl_adv_loss"]


def unirl_sigma_t(sigmas, steps, eta):
    """sigma_t = std_dev_t * sqrt(-dt) of UniRL's FlowDPPO._compute_sigma_t (re-derived here, in float64)."""
    out = []
    for i in steps:
        s, s_next = sigmas[i], sigmas[i + 1]
        out.append(math.sqrt(s / (1.0 - min(s, 0.99))) * eta * math.sqrt(s - s_next))
    return out


class Builder:
    """Rows of one case: the KL of each row is set through its means, the log-ratio through its log-probs."""

    def __init__(self, seed):
        self.generator = torch.Generator().manual_seed(seed)

    def randn(self, *shape):
        return torch.randn(*shape, generator=self.generator, dtype=DTYPE)

    def uniform(self, low, high):
        return low + (high - low) * torch.rand((), generator=self.generator, dtype=DTYPE).item()

    def means(self, latent, kl, sigma):
        """(new, old) means of one row whose KL mean_i (new_i - old_i)^2 / (2 sigma^2) is kl (up to rounding)."""
        old = 0.5 * self.randn(*latent)
        if kl == 0.0:
            return old.clone(), old
        u = self.randn(*latent)
        u = u / u.pow(2).mean().sqrt()
        return old + sigma * math.sqrt(2.0 * kl) * u, old


def nudge(value, direction):
    return math.nextafter(value, math.inf if direction > 0 else -math.inf)


def run_case(functions, name, description, batch, steps, latent, threshold, rows, seed):
    """rows: batch * steps tuples (kl, log_diff, advantage, sigma[, old_log_prob]); log_diff may be a float or
    ('ulp', +-1) (new = old moved by one ulp)."""
    gaussian_kl_div, kl_adv_loss = functions
    assert len(rows) == batch * steps, name
    builder = Builder(seed)
    new_logp, old_logp, new_means, old_means, sigmas, advantages, intended_kl = [], [], [], [], [], [], []
    for row in rows:
        kl, log_diff, advantage, sigma = row[:4]
        old = row[4] if len(row) > 4 else builder.uniform(-2.5, -0.2)
        new = nudge(old, log_diff[1]) if isinstance(log_diff, tuple) else old + log_diff
        new_mean, old_mean = builder.means(latent, kl, sigma)
        new_logp.append(new)
        old_logp.append(old)
        new_means.append(new_mean)
        old_means.append(old_mean)
        sigmas.append(sigma)
        advantages.append(advantage)
        intended_kl.append(kl)

    def shaped(values):
        return torch.tensor(values, dtype=DTYPE).reshape(batch, steps)

    new_logp_t = shaped(new_logp).requires_grad_(True)
    old_logp_t = shaped(old_logp)
    new_means_t = torch.stack(new_means).reshape(batch, steps, *latent)
    old_means_t = torch.stack(old_means).reshape(batch, steps, *latent)
    sigma_t = shaped(sigmas).reshape(batch, steps, *([1] * len(latent)))
    advantages_t = shaped(advantages)

    loss, _ = kl_adv_loss(
        new_logp=new_logp_t,
        old_logp=old_logp_t,
        new_means=new_means_t,
        old_means=old_means_t,
        advantages=advantages_t,
        sigma_t=sigma_t,
        kl_mask_threshold=threshold,
    )
    loss.sum().backward()
    gradient = new_logp_t.grad.reshape(-1)
    loss = loss.detach().reshape(-1)

    # The same quantities UniRL computes inside _flowdppo_kl_adv_loss (its metrics hold only their means).
    kl_elem = gaussian_kl_div(new_means_t, old_means_t, sigma_t)
    kl = kl_elem.mean(dim=tuple(range(2, kl_elem.ndim))).reshape(-1)
    ratio = torch.exp(new_logp_t.detach() - old_logp_t).reshape(-1)
    adv = advantages_t.reshape(-1)
    high = ~(kl < threshold)
    masked = high & (((ratio > 1.0) & (adv > 0)) | ((ratio < 1.0) & (adv < 0)))
    for r in range(len(rows)):
        assert loss[r].item() == (0.0 if masked[r] else (-adv[r] * ratio[r]).item()), (name, r)
        # A ratio within an ulp or two of 1 could compare otherwise under another exp: only exactly 1 (from a log
        # ratio under 2^-54 in magnitude, where any faithful exp gives 1) or clearly away from it.
        log_ratio = new_logp[r] - old_logp[r]
        assert (ratio[r] == 1.0 and abs(log_ratio) < 2.0**-54) or abs(ratio[r].item() - 1.0) > 4e-16, (name, r)
        # The library recomputes the KL from a log-prob (cancellation ~1e-16 absolute): keep clear of the threshold.
        assert abs(kl[r].item() - threshold) > 1e-6 * threshold, (name, r, kl[r].item(), threshold)
        if intended_kl[r] > 0:
            assert abs(kl[r].item() / intended_kl[r] - 1) < 1e-9, (name, r)

    return {
        "name": name,
        "description": description,
        "batch": batch,
        "steps": steps,
        "shape": list(latent),
        "kl_threshold": threshold,
        "new_log_prob": new_logp_t.detach().reshape(-1).tolist(),
        "old_log_prob": old_logp_t.reshape(-1).tolist(),
        "new_mean": new_means_t.reshape(-1).tolist(),
        "old_mean": old_means_t.reshape(-1).tolist(),
        "sigma": sigmas,
        "advantage": adv.tolist(),
        "kl": kl.tolist(),
        "ratio": ratio.tolist(),
        "loss": loss.tolist(),
        "loss_gradient": gradient.tolist(),
        "masked": masked.tolist(),
    }


def random_rows(seed, count, threshold):
    """count random rows: KL log-uniform in [threshold / 100, threshold * 100] (not within 0.1% of the threshold),
    log-ratio ~ N(0, 0.1^2) or exactly 0, advantage ~ N(0, 1) or exactly 0, sigma log-uniform in [0.02, 1]."""
    g = torch.Generator().manual_seed(seed)

    def u():
        return torch.rand((), generator=g, dtype=DTYPE).item()

    rows = []
    for _ in range(count):
        kl = threshold * 10 ** (4 * u() - 2)
        while abs(kl / threshold - 1) < 1e-3:
            kl = threshold * 10 ** (4 * u() - 2)
        log_diff = 0.0 if u() < 1 / 6 else 0.1 * torch.randn((), generator=g, dtype=DTYPE).item()
        advantage = 0.0 if u() < 1 / 6 else torch.randn((), generator=g, dtype=DTYPE).item()
        sigma = 0.02 * 50 ** u()
        rows.append((kl, log_diff, advantage, sigma))
    return rows


def build_cases(functions):
    t = 1e-5  # UniRL's default kl_mask_threshold
    cases = []

    def add(*args):
        cases.append(run_case(functions, *args))

    add(
        "below_threshold",
        "KL below the threshold (0 included): every row kept, whatever the ratio and the advantage",
        2,
        3,
        (2, 3),
        t,
        [
            (0.0, 0.2, 1.3, 0.3),
            (0.01 * t, -0.2, -0.7, 0.05),
            (0.3 * t, 0.0, 0.5, 0.8),
            (0.9 * t, 0.05, 2.0, 0.12),
            (0.5 * t, -0.4, -1.5, 0.6),
            (0.99 * t, 0.01, 0.0, 0.2),
        ],
        11,
    )
    add(
        "above_threshold_all_directions",
        "KL above the threshold, ratio > 1 / < 1 / = 1 against advantage > 0 / < 0 / = 0",
        3,
        3,
        (2, 3),
        t,
        [
            (kl * t, log_diff, advantage, sigma)
            for (log_diff, kl, sigma) in ((0.1, 3.0, 0.4), (-0.1, 20.0, 0.07), (0.0, 100.0, 1.1))
            for advantage in (1.2, -0.9, 0.0)
        ],
        12,
    )
    sigmas = [1.0 - i / 10 for i in range(11)]  # a 10-step linear flow schedule
    sigma_t = unirl_sigma_t(sigmas, [1, 3, 5, 7], eta=0.7)
    add(
        "unirl_caller_layout",
        "UniRL's own caller: advantage per batch row, sigma_t = std_dev_t sqrt(-dt) per step (eta 0.7), KL around "
        "the default threshold",
        2,
        4,
        (2, 3),
        t,
        [
            (kl * t, log_diff, advantage, sigma)
            for advantage, kls, diffs in (
                (1.1, (0.2, 5.0, 0.7, 40.0), (0.03, 0.08, -0.02, -0.15)),
                (-0.6, (8.0, 0.05, 2.0, 0.9), (-0.04, -0.11, 0.06, 0.2)),
            )
            for kl, log_diff, sigma in zip(kls, diffs, sigma_t, strict=True)
        ],
        13,
    )
    add(
        "ratio_exactly_one",
        "log_prob == old_log_prob (ratio 1): never removed, above or below the threshold",
        2,
        3,
        (2, 3),
        t,
        [
            (5.0 * t, 0.0, 0.8, 0.3),
            (50.0 * t, 0.0, -1.4, 0.3),
            (2.0 * t, 0.0, 0.0, 0.3),
            (0.5 * t, 0.0, 0.8, 0.3),
            (0.1 * t, 0.0, -1.4, 0.3),
            (7.0 * t, 0.0, 2.5, 0.9),
        ],
        14,
    )
    add(
        "ratio_rounds_to_one",
        "log_prob one ulp from old_log_prob (|log ratio| ~ 2.8e-17): exp rounds the ratio to exactly 1, so UniRL keeps "
        "the row although log_prob != old_log_prob; a log ratio of 2^-50 or -2^-50 gives a ratio != 1 and the row is "
        "removed",
        2,
        3,
        (2, 3),
        t,
        # Old log-probs in [-0.25, -0.125): one ulp is 2^-55, a quarter of the spacing of doubles below 1, so any
        # faithful exp gives exactly 1 (one ulp of a value in [0.25, 0.5) would be a tie below 1).
        [
            (10.0 * t, ("ulp", +1), 1.0, 0.25, -0.1875),
            (10.0 * t, ("ulp", -1), -1.0, 0.25, -0.1875),
            (10.0 * t, ("ulp", +1), 0.6, 0.5, -0.15625),
            (10.0 * t, 2.0**-50, 1.0, 0.25, -0.1875),
            (10.0 * t, -(2.0**-50), -1.0, 0.25, -0.1875),
            (10.0 * t, ("ulp", -1), -0.6, 0.5, -0.15625),
        ],
        15,
    )
    add(
        "extreme_ratios",
        "log ratio 700 (ratio ~1e304) or -800 (ratio 0) with a high KL: removed rows are exactly 0 with gradient 0, "
        "kept rows -advantage * ratio (ratio 0 with advantage > 0: loss -0)",
        1,
        4,
        (2, 3),
        t,
        # Not log ratio 800: exp overflows to inf, and although UniRL's forward gives 0 (torch.where), autograd's
        # gradient of a removed row is then NaN (0 * inf in exp's backward), where the rule says 0.
        [
            (30.0 * t, 700.0, 1.5, 0.2),
            (30.0 * t, 700.0, -1.5, 0.2),
            (30.0 * t, -800.0, -1.5, 0.2),
            (30.0 * t, -800.0, 1.5, 0.2),
        ],
        16,
    )
    add(
        "large_threshold",
        "threshold 0.05, sigma from 0.01 to 2",
        2,
        3,
        (2, 3),
        0.05,
        [
            (0.2, 0.25, 0.9, 0.01),
            (0.01, 0.25, 0.9, 2.0),
            (0.06, -0.3, -1.2, 0.5),
            (0.04, -0.3, -1.2, 0.05),
            (1.5, -0.3, 0.7, 1.0),
            (3.0, 0.5, -0.4, 0.02),
        ],
        17,
    )
    add(
        "three_dim_latent",
        "latent 1 x 2 x 2 (C, H, W), mixed rows",
        2,
        2,
        (1, 2, 2),
        1e-3,
        [(4e-3, 0.07, 0.4, 0.15), (2e-4, 0.07, 0.4, 0.15), (9e-3, -0.2, -2.0, 0.7), (1e-3 * 1.01, -0.2, 0.3, 0.7)],
        18,
    )
    add(
        "one_dim_latent",
        "latent of 5 elements in one dimension, mixed rows",
        1,
        3,
        (5,),
        2e-4,
        [(1e-3, 0.12, 1.1, 0.35), (1e-3, -0.12, -1.1, 0.35), (1e-5, 0.12, 1.1, 0.35)],
        19,
    )
    for k, (seed, threshold, batch, steps) in enumerate(((101, 1e-5, 3, 4), (102, 1e-3, 2, 4), (103, 3e-2, 4, 3))):
        add(
            f"random_{k}",
            f"random rows (seed {seed}): KL log-uniform within 100x of the threshold, log ratio ~ N(0, 0.1^2), "
            "advantage ~ N(0, 1), some exactly 0",
            batch,
            steps,
            (2, 3),
            threshold,
            random_rows(seed, batch * steps, threshold),
            seed,
        )
    return cases


def literal(x):
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(x)
    assert math.isfinite(x), x
    return repr(float(x))  # shortest round-trip form: the C++ literal is the same double


def header(cases, commit, command):
    lines = [
        "// Generated by scripts/generate_dppo_reference.py; do not edit. Regenerate with",
        f"//   {command}",
        f"// Reference: Tencent-Hunyuan/UniRL at commit {commit}, {SOURCE}: its functions",
        "// _gaussian_kl_div and _flowdppo_kl_adv_loss, run in float64 with torch; the gradient is autograd's of",
        "// sum(loss_per_elem) with respect to new_logp. No UniRL code is copied here, only numbers.",
        "// Row r of a case is UniRL's [b, s] with r = b * steps + s; new_mean / old_mean hold rows x elements values,",
        "// row-major; kl is UniRL's kl_per_sample, masked its rm_mask (kl >= threshold and the ratio moving with the",
        "// advantage), loss its loss_per_elem.",
        "#pragma once",
        "",
        "#include <array>",
        "#include <cstdint>",
        "#include <span>",
        "",
        "namespace branchgrpo::dppo_reference {",
        "",
        "struct dppo_case {",
        "  const char* name;",
        "  const char* description;",
        "  std::int64_t batch;",
        "  std::int64_t steps;",
        "  std::span<const std::int64_t> shape;",
        "  double kl_threshold;",
        "  std::span<const double> new_log_prob;",
        "  std::span<const double> old_log_prob;",
        "  std::span<const double> new_mean;",
        "  std::span<const double> old_mean;",
        "  std::span<const double> sigma;",
        "  std::span<const double> advantage;",
        "  std::span<const double> kl;",
        "  std::span<const double> ratio;",
        "  std::span<const double> loss;",
        "  std::span<const double> loss_gradient;",
        "  std::span<const bool> masked;",
        "};",
        "",
    ]
    arrays = (
        ("std::int64_t", "shape"),
        ("double", "new_log_prob"),
        ("double", "old_log_prob"),
        ("double", "new_mean"),
        ("double", "old_mean"),
        ("double", "sigma"),
        ("double", "advantage"),
        ("double", "kl"),
        ("double", "ratio"),
        ("double", "loss"),
        ("double", "loss_gradient"),
        ("bool", "masked"),
    )
    for case in cases:
        lines.append(f"// {case['description']}")
        lines.append(f"namespace {case['name']} {{")
        for kind, key in arrays:
            values = ", ".join(literal(v) for v in case[key])
            lines.append(f"inline constexpr {kind} {key}[] = {{{values}}};")
        lines.append(f"}}  // namespace {case['name']}")
        lines.append("")
    lines.append(f"inline constexpr std::array<dppo_case, {len(cases)}> cases{{{{")
    for case in cases:
        n = case["name"]
        members = ", ".join(f"{n}::{key}" for _, key in arrays[1:])
        lines.append(
            f'    {{"{n}", "{case["description"]}", {case["batch"]}, {case["steps"]}, {n}::shape, '
            f"{literal(case['kl_threshold'])}, {members}}},"
        )
    lines.append("}};")
    lines.append("")
    lines.append("}  // namespace branchgrpo::dppo_reference")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("unirl", help="a UniRL checkout, or a git directory (mirror) whose HEAD is read")
    parser.add_argument("--out", default=os.path.join(ROOT, "tests", "unit", "dppo_reference_cases.hpp"))
    args = parser.parse_args()

    text, commit, how = read_unirl(args.unirl)
    torch.set_default_dtype(DTYPE)
    cases = build_cases(load_functions(text))
    out = os.path.relpath(os.path.abspath(args.out), ROOT)
    command = f"python3 scripts/generate_dppo_reference.py UNIRL_CHECKOUT_OR_MIRROR --out {out}"
    result = header(cases, commit or "unknown (not a git checkout)", command)
    clang_format = shutil.which("clang-format")
    if clang_format:
        result = subprocess.run(
            [clang_format, f"--style=file:{os.path.join(ROOT, '.clang-format')}", "--assume-filename=cases.hpp"],
            input=result,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(result)
    rows = sum(len(case["loss"]) for case in cases)
    masked = sum(sum(case["masked"]) for case in cases)
    print(f"{args.out}: {len(cases)} cases, {rows} rows ({masked} removed)")
    print(f"UniRL {commit} ({how}), torch {torch.__version__}")


if __name__ == "__main__":
    main()
