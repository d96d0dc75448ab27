"""The package and the C++ tool are one engine (docs/python.md, "Equality with the C++ tool"): one iteration of dance
and of branch on the shipped FLUX model, the tool's (``branchgrpo train --trace``) against the package's (rollout
with diffusers' FluxTransformer2DModel, score, credit) on the same weights, seed and prompts, both scored by the
reward server's shapes_alignment. The initial noise is equal bit for bit; the velocity at step 0, every step's
latents, the rewards and every edge's advantage within 1e-4 relative (two FLUX implementations in float32).
The helpers are bench/python_flux_side_by_side.py's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from branchgrpo import flux

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import python_flux_side_by_side as side  # noqa: E402

TOLERANCE = 1e-4
# 10 steps: the fewest the dense tree's splits {0, 3, 6, 9} fit; dance on one prompt keeps the tool's update short.
RUNS = [side.Run("dance", 10, 1), side.Run("branch", 10, 2)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    if not side.cli_path().exists():
        pytest.skip(f"the C++ tool is not built ({side.cli_path()})")
    with side.reward_server(tmp_path_factory.mktemp("server")) as url:
        yield url


@pytest.fixture(scope="module")
def model() -> tuple:
    return flux.load_model(side.MODEL), flux.load_prompts(side.MODEL)


@pytest.mark.parametrize("run", RUNS, ids=[r.method for r in RUNS])
def test_one_iteration_equals_the_tools(run: side.Run, server: str, model: tuple, tmp_path: Path) -> None:
    tool = side.tool_iteration(run, server, tmp_path)
    package = side.package_iteration(run, *model)
    trace = tool.trace
    assert trace["prompts"].tolist() == list(range(run.prompts))
    assert len(package.result.latents) == run.steps + 1 == sum(k.startswith("latents.") for k in trace)
    assert torch.equal(trace["latents.0"], package.result.latents[0])  # the initial noise, bit for bit
    assert package.credit.trained.tolist() == trace["trained"].tolist()
    gaps = side.differences(tool, package, flux.velocity(*model))
    assert {name: gap for name, gap in gaps.items() if not gap < TOLERANCE} == {}
