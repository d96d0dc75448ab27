"""The C++ tool's iteration and the Python package's, side by side on the shipped FLUX model (models/shapes-tiny).

Both run one iteration of a method on the same weights, seed and prompts, scored by one function: the reward
server's ``shapes_alignment`` scorer (scripts/reward_scorers/shapes_alignment.py), which the tool reaches as its
``remote`` reward (scripts/reward_server.py) and the package calls in process. The tool writes its iteration with
``branchgrpo train --trace DIR``; the package runs ``rollout`` (diffusers' FluxTransformer2DModel through
``branchgrpo.flux.velocity``), ``score`` and ``credit``. python/tests/test_flux_equality.py holds the two equal with
these helpers; run as a script, this times them (docs/performance.md, "The package beside the tool"):

    .venv/bin/python bench/python_flux_side_by_side.py --rounds 3 --method branch --steps 20

The tool's time is its process (start, model load, the server check, the iteration with its update, a checkpoint)
and the iteration's own stages from metrics.jsonl; the package's is rollout + score + credit, and its whole
iteration, ``Trainer.step`` on a fresh copy of the weights (every parameter trained; the tool trains its LoRA).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from safetensors.torch import load_file

import branchgrpo
from branchgrpo import flux

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "shapes-tiny"
LATENT = [3, 16, 16]  # the shapes model's pixels (model.latent_height / width 0: 16)
sys.path.insert(0, str(ROOT / "scripts"))
from reward_scorers.scorer_api import Item  # noqa: E402  (the reward server's plug-ins)
from reward_scorers.shapes_alignment import Scorer  # noqa: E402

# with_method's recipes (include/branchgrpo/training/methods.hpp) as run-config sections.
RECIPES = {
    "dance": """[topology]
kind = "sequential"
group_size = 16
shared_root = true
[correlator]
kind = "independent"
[advantage]
kind = "leaf_group"
""",
    "branch": """[topology]
kind = "split_schedule"
split_steps = [0, 3, 6, 9]
branching = [2]
[correlator]
kind = "correlated"
s = 4.0
[advantage]
kind = "depth_wise"
scope = "per_tree"
""",
}


class Run(NamedTuple):
    """One iteration's settings, the same on both sides."""

    method: str
    steps: int
    prompts: int  # trees: prompt rows 0 .. prompts - 1 (the run's data.prompts_per_iteration at iteration 0)
    seed: int = 0
    shift: float = 3.0
    max_batch: int = 64


def cli_path() -> Path:
    """The C++ tool: $BRANCHGRPO_CLI (as ctest sets it, tests/python.cmake), else build/bin/branchgrpo."""
    return Path(os.environ.get("BRANCHGRPO_CLI", ROOT / "build" / "bin" / "branchgrpo"))


def run_config(run: Run, url: str, output: Path) -> str:
    """The TOML of ``run`` for ``branchgrpo train``: with_method's recipe, the remote shapes_alignment reward at
    ``url``, one iteration, no grids.

    >>> "kind = \\"sequential\\"" in run_config(Run("dance", 10, 1), "http://127.0.0.1:1", Path("out"))
    True
    """
    if run.method not in RECIPES:
        raise ValueError(f"method = {run.method!r}: the side-by-side runs {', '.join(RECIPES)}")
    return f"""[model]
dir = "{MODEL}"
device = "cpu"
[data]
prompts_per_iteration = {run.prompts}
[rollout]
steps = {run.steps}
shift = {run.shift}
stepper = "dance_sde"
eta = 0.3
max_batch = {run.max_batch}
{RECIPES[run.method]}[fusion]
kind = "uniform_mean"
[[rewards]]
name = "remote"
params = {{ url = "{url}", scorer = "shapes_alignment" }}
[run]
iterations = 1
seed = {run.seed}
output_dir = "{output}"
grid_every = 0
"""


@contextlib.contextmanager
def reward_server(directory: Path) -> Iterator[str]:
    """scripts/reward_server.py serving shapes_alignment on a free local port for the ``with`` block; yields its URL."""
    port_file = directory / "reward_server.port"
    log = open(directory / "reward_server.log", "w")
    command = [sys.executable, str(ROOT / "scripts" / "reward_server.py"), "--scorer", "shapes_alignment"]
    server = subprocess.Popen([*command, "--port-file", str(port_file)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"reward_server.py did not start: {(directory / 'reward_server.log').read_text()}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text().strip()}"
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


class ToolIteration(NamedTuple):
    """The tool's iteration: its trace's tensors, metrics.jsonl's row and the process's wall time."""

    trace: dict[str, torch.Tensor]
    metrics: dict[str, Any]
    seconds: float


def tool_iteration(run: Run, url: str, directory: Path) -> ToolIteration:
    """``branchgrpo train --trace`` of ``run`` in ``directory`` (a fresh one per call): its iteration 0."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "run.toml"
    config.write_text(run_config(run, url, directory / "out"))
    command = [str(cli_path()), "train", "--config", str(config), "--quiet", "--trace", str(directory / "trace")]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"branchgrpo train failed ({done.returncode}): {done.stderr.strip()}")
    metrics = json.loads((directory / "out" / "metrics.jsonl").read_text().splitlines()[0])
    return ToolIteration(load_file(str(directory / "trace" / "trace-000000.safetensors")), metrics, seconds)


def shapes_reward(texts: Sequence[str]) -> Any:
    """The reward server's shapes_alignment scorer as ``branchgrpo.score`` calls a reward: leaves [rows, 3, H, W]
    (the pixels, float64 as the server decodes the tool's float32) and their prompt rows."""
    scorer = Scorer({})

    def reward(leaves: torch.Tensor, prompts: torch.Tensor) -> list[float]:
        pixels = leaves.detach().cpu().double().numpy()
        rows = prompts.tolist()
        items = [Item(texts[p], p, 0, i, pixels[i], i) for i, p in enumerate(rows)]
        return scorer.score(items)[0]

    return reward


class PackageIteration(NamedTuple):
    """The package's iteration: rollout, rewards, credit and each stage's seconds."""

    result: branchgrpo.Rollout
    rewards: np.ndarray
    credit: branchgrpo.Credit
    seconds: dict[str, float]


def package_iteration(run: Run, model: Any, prompts: flux.Prompts) -> PackageIteration:
    """``rollout``, ``score`` and ``credit`` of ``run`` with diffusers' model (branchgrpo.flux) and shapes_alignment."""
    times = [time.perf_counter()]
    result = branchgrpo.rollout(
        flux.velocity(model, prompts),
        prompts=list(range(run.prompts)),
        latent_shape=LATENT,
        method=run.method,
        steps=run.steps,
        shift=run.shift,
        seed=run.seed,
        iteration=0,
        max_batch=run.max_batch,
    )
    times.append(time.perf_counter())
    rewards = branchgrpo.score(result, shapes_reward(prompts.texts))
    times.append(time.perf_counter())
    credit = branchgrpo.credit(result, rewards)
    times.append(time.perf_counter())
    stages = dict(zip(("rollout", "score", "credit"), np.diff(times).tolist(), strict=True))
    return PackageIteration(result, rewards, credit, stages)


def trainer_iteration(run: Run, prompts: flux.Prompts) -> dict[str, float]:
    """``Trainer.step`` of ``run`` on a fresh copy of the weights (the package's whole iteration: every parameter
    trained with AdamW, lr 1e-5, scored by shapes_alignment); its statistics with the stage and part times."""
    model = flux.load_model(MODEL)
    velocity = flux.velocity(model, prompts, gradients=True)
    policy = branchgrpo.Policy(velocity, torch.optim.AdamW(model.parameters(), lr=1e-5))
    trainer = branchgrpo.Trainer(
        policy,
        shapes_reward(prompts.texts),
        method=run.method,
        latent_shape=LATENT,
        steps=run.steps,
        shift=run.shift,
        seed=run.seed,
        max_batch=run.max_batch,
    )
    return trainer.step(list(range(run.prompts)))


def _float64(x: Any) -> np.ndarray:
    return x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)


def relative(got: Any, want: Any) -> float:
    """max |got - want| / max |want| in float64 (the absolute gap when want is 0).

    >>> relative(torch.tensor([1.0, 2.0]), np.array([1.0, 4.0]))
    0.5
    """
    gap, scale = np.abs(_float64(got) - _float64(want)).max(), np.abs(_float64(want)).max()
    return float(gap / scale) if scale > 0 else float(gap)


def step_zero_velocity_gap(package: PackageIteration, trace: dict[str, torch.Tensor], v: Any) -> float:
    """max |v_tool - v_package| / max |v_package| on the roots at step 0: both sides step each root's children from
    the same latents with the same noise and coefficients (step 0 is an SDE split in dance and branch), so their
    step-1 latents differ by velocity_coeff (v_tool - v_package) alone, and float32 rounding (1e-6 to 3e-6 of v)."""
    edges = branchgrpo.edges(package.result, package.credit)
    first = edges.step == 0
    coeff, sigma = float(edges.velocity_coeff[first][0]), float(edges.sigma[first][0])
    gap = (trace["latents.1"].double() - package.result.latents[1].double()) / coeff
    tree = package.result.tree
    prompts = torch.from_numpy(tree.prompts.astype(np.int64))
    velocity = v(package.result.latents[0], sigma, 0, prompts, torch.arange(tree.tree_count))
    return float(gap.abs().max() / velocity.double().abs().max())


def differences(tool: ToolIteration, package: PackageIteration, v: Any) -> dict[str, float]:
    """The package's iteration against the tool's, each a ``relative`` gap (the initial noise: the absolute one):
    the step-0 latents, the velocity at step 0, the latents of every later step (the worst), the leaves', the
    rewards, the rollout's log-probs and the advantage of every edge."""
    trace, latents = tool.trace, package.result.latents
    steps = range(1, len(latents))
    return {
        "initial noise (absolute)": float(np.abs(_float64(latents[0]) - _float64(trace["latents.0"])).max()),
        "velocity at step 0": step_zero_velocity_gap(package, trace, v),
        "latents, worst step": max(relative(latents[s], trace[f"latents.{s}"]) for s in steps),
        "leaf latents": relative(latents[-1], trace[f"latents.{len(latents) - 1}"]),
        "rewards": relative(package.rewards, trace["rewards"]),
        "log-probs": relative(package.result.log_probs, trace["log_probs"]),
        "edge advantages": relative(package.credit.edge_advantage, trace["edge_advantage"]),
    }


def median_line(name: str, values: Sequence[float]) -> str:
    """One timing line: the median and every value, in seconds."""
    return f"{name:34s} median {statistics.median(values):7.3f} s  ({', '.join(f'{v:.3f}' for v in values)})"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the tool and the package")
    parser.add_argument("--method", default="branch", choices=sorted(RECIPES))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=2, help="trees per iteration")
    args = parser.parse_args(argv)
    run = Run(args.method, args.steps, args.prompts)
    model, prompts = flux.load_model(MODEL), flux.load_prompts(MODEL)
    tool: dict[str, list[float]] = {"process": [], "rollout": [], "reward": [], "update": [], "iteration": []}
    package: dict[str, list[float]] = {"rollout": [], "score": [], "credit": [], "total": []}
    trainer: dict[str, list[float]] = {"iteration": [], "rollout": [], "update": [], "engine": []}
    with tempfile.TemporaryDirectory() as scratch, reward_server(Path(scratch)) as url:
        for r in range(args.rounds):
            cpp = tool_iteration(run, url, Path(scratch) / f"round-{r}")
            for key in ("rollout", "reward", "update"):
                tool[key].append(cpp.metrics[f"{key}_seconds"])
            tool["iteration"].append(cpp.metrics["seconds"])
            tool["process"].append(cpp.seconds)
            py = package_iteration(run, model, prompts)
            if r == 0:
                gaps = differences(cpp, py, flux.velocity(model, prompts))
            for key, seconds in py.seconds.items():
                package[key].append(seconds)
            package["total"].append(sum(py.seconds.values()))
            stats = trainer_iteration(run, prompts)
            for key in trainer:
                trainer[key].append(stats["seconds" if key == "iteration" else f"{key}_seconds"])
    print(f"{run.method}, {run.steps} steps, {run.prompts} trees, shapes-tiny, torch {torch.__version__}, CPU")
    for key, values in tool.items():
        print(median_line(f"tool {key}", values))
    for key, values in package.items():
        print(median_line(f"package {key}", values))
    for key, values in trainer.items():
        print(median_line(f"package Trainer.step {key}", values))
    cpp_stages = [a + b for a, b in zip(tool["rollout"], tool["reward"], strict=True)]
    ratio = statistics.median(package["total"]) / statistics.median(cpp_stages)
    print(f"package rollout+score+credit / tool rollout+reward: {ratio:.2f}")
    whole = statistics.median(trainer["iteration"]) / statistics.median(tool["iteration"])
    print(f"package Trainer.step / tool iteration: {whole:.2f}")
    for name, gap in gaps.items():
        print(f"{name:34s} {gap:.2e}")


if __name__ == "__main__":
    main()
