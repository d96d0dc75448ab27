"""Plans, trees and methods of the package against hand-computed values and the C++ tool's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import branchgrpo

ROOT = Path(__file__).resolve().parents[2]


def test_dense_plan_counts_by_hand() -> None:
    # Splits at 0, 3, 6, 9 by 2: 1, 2, 2, 2, 4, 4, 4, 8, 8, 8, then 16 nodes at each of steps 10..20.
    plan = branchgrpo.plan("split_schedule", 20, split_steps=[0, 3, 6, 9], branching=[2])
    counts = [plan.node_count_at_step(s) for s in range(21)]
    assert counts == [1, 2, 2, 2, 4, 4, 4, 8, 8, 8] + [16] * 11
    assert plan.node_count == sum(counts) == 219
    assert plan.edge_count == 218
    assert plan.evaluations == 219 - 16  # every node but the leaves is evaluated once
    assert plan.kinds == ["sde"] * 20
    assert plan.branching_steps == [0, 3, 6, 9]


def test_tree_arrays_are_read_only_views_of_the_forest() -> None:
    plan = branchgrpo.plan("split_schedule", 4, split_steps=[0, 2], branching=[2, 3])
    tree = branchgrpo.Tree(plan, trees=2)
    # One tree: root 0; 1 2 (step 1); 3 4 (step 2); 5..10 (step 3, 3 per node); 11..16 (leaves, step 4).
    assert tree.nodes_per_tree == 17 and tree.node_count == 34
    assert tree.parent[:11].tolist() == [-1, 0, 0, 1, 2, 3, 3, 3, 4, 4, 4]
    assert tree.sibling_rank[5:8].tolist() == [0, 1, 2]
    assert tree.leaves.tolist() == list(range(11, 17)) + list(range(28, 34))
    assert tree.parent[17] == -1 and tree.parent[18] == 17  # the second tree's root and first child
    assert tree.step.dtype == np.int32 and tree.kind.dtype == np.uint8
    assert not tree.parent.flags.writeable
    with pytest.raises(ValueError):
        tree.parent[0] = 5
    assert tree.evaluations == 2 * (17 - 6)


def test_plans_equal_the_cli_tree_report() -> None:
    names = branchgrpo.methods()
    assert names[0] == "dance" and "branch-mix-flash" in names and "branch-awm" in names
    binary = Path(os.environ.get("BRANCHGRPO_CLI", ROOT / "build" / "bin" / "branchgrpo"))
    if not binary.exists():
        pytest.skip(f"the C++ tool is not built ({binary})")
    cases = [
        (["--split-steps", "0,3,6,9", "--branching", "2"], branchgrpo.method_plan("branch", 20)),
        (["--sequential", "16"], branchgrpo.method_plan("dance", 20)),
        (
            ["--flow-grpo-fast", "8", "--split-step", "4", "--sde-steps", "2"],
            branchgrpo.plan("flow_grpo_fast", 20, group_size=8, split_step=4, sde_steps=2),
        ),
    ]
    for flags, plan in cases:
        out = subprocess.run([str(binary), "tree", "--json", *flags], capture_output=True, text=True, check=True)
        report = json.loads(out.stdout)
        assert (plan.roots, plan.node_count, plan.leaf_count) == (report["roots"], report["nodes"], report["leaves"])
        assert (plan.evaluations, plan.edge_count) == (report["evaluations"], report["edges"])
        assert (plan.branching, plan.kinds) == (report["branching"], report["kinds"])


def test_topologies_describe_their_parameters() -> None:
    described = {t["name"]: t for t in branchgrpo.topologies()}
    assert list(described) == ["split_schedule", "sequential", "flow_grpo_fast", "adaptive_branching"]
    group = described["sequential"]["parameters"][0]
    assert group["name"] == "group_size" and group["default"] == "16"


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: branchgrpo.plan("nope", 20), ValueError, "unknown topology 'nope'"),
        (lambda: branchgrpo.plan("split_schedule", 20, branchng=[2]), ValueError, "topology.branchng: unknown key"),
        (lambda: branchgrpo.plan("split_schedule", 20, branching=2), TypeError, "topology.branching = 2: must be"),
        (lambda: branchgrpo.plan("split_schedule", 20, branching=[0]), ValueError, "topology.branching = [0]"),
        (lambda: branchgrpo.plan("split_schedule", 20, split_steps=[25]), ValueError, "split step 25 is not in"),
        (lambda: branchgrpo.plan("sequential", 20, shared_root=1), TypeError, "topology.shared_root = 1"),
        (lambda: branchgrpo.plan("sequential", 0), ValueError, "steps"),
        (lambda: branchgrpo.Tree(branchgrpo.plan("sequential", 20), trees=0), ValueError, "trees = 0"),
        (lambda: branchgrpo.method_plan("grpo", 20), ValueError, "grpo"),
    ],
)
def test_bad_input_is_one_exception_naming_the_value(call, error, message) -> None:
    with pytest.raises(error) as raised:
        call()
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_bad_input_never_crashes_the_interpreter() -> None:
    # Each case in a fresh interpreter: an abort or a segfault would end it with a signal.
    cases = [
        "branchgrpo.plan('split_schedule', 20, branching=[2] * 100000)",
        "branchgrpo.plan('split_schedule', 20, split_steps=[0, 3] * 40, branching=[2])",
        "branchgrpo.Tree(branchgrpo.plan('split_schedule', 20, split_steps=list(range(20)), branching=[4]))",
        "branchgrpo.plan('sequential', 10**6)",
        "branchgrpo.plan('sequential', 20, group_size=2**40)",
    ]
    for case in cases:
        code = (
            f"import branchgrpo\ntry:\n    {case}\nexcept (ValueError, TypeError, OverflowError) as e:\n    print(e)\n"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
        assert done.returncode == 0, (case, done.returncode, done.stderr)
