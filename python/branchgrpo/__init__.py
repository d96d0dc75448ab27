"""BranchGRPO's C++ engine from Python: tree plans, trees and methods (docs/python.md).

The package binds the one engine the C++ library and the ``branchgrpo`` tool run; every name, rule and number comes
from the library's own descriptions.

>>> import branchgrpo
>>> branchgrpo.method_plan("branch", 20).leaf_count
16
>>> branchgrpo.method_plan("dance", 20).evaluations
305
"""

from __future__ import annotations

from typing import Any

from branchgrpo import _core
from branchgrpo._core import Tree, TreePlan

__version__ = "0.1.0"

__all__ = ["Tree", "TreePlan", "__version__", "method_plan", "methods", "plan", "topologies"]


def plan(kind: str, steps: int, **params: Any) -> TreePlan:
    """The tree plan of topology ``kind`` over ``steps`` denoising steps, with its parameters set by name.

    The parameters and their rules are the topology's own (``topologies()``), as a run config's ``[topology]``
    section takes them; a bad one raises ``ValueError`` naming it.

    >>> p = plan("split_schedule", 20, split_steps=[0, 3, 6, 9], branching=[2])
    >>> (p.node_count, p.leaf_count, p.evaluations, p.edge_count)
    (219, 16, 203, 218)
    >>> p.branching_steps
    [0, 3, 6, 9]
    >>> plan("sequential", 20, group_size=4).roots
    1
    >>> plan("split_schedule", 20, branchng=[2])
    Traceback (most recent call last):
    ValueError: topology.branchng: unknown key (split_schedule has: split_steps, branching)
    """
    return _core.plan(kind, steps, **params)


def topologies() -> list[dict[str, Any]]:
    """Every topology: its name, summary and parameters (name, default, rule, meaning).

    >>> [t["name"] for t in topologies()]
    ['split_schedule', 'sequential', 'flow_grpo_fast']
    >>> topologies()[1]["parameters"][0]["name"]
    'group_size'
    """
    return _core.topologies()


def methods() -> list[str]:
    """Every method name the engine knows (``with_method``), dance first.

    >>> methods()[:3]
    ['dance', 'branch', 'branch-widpru']
    """
    return _core.methods()


def method_plan(name: str, steps: int) -> TreePlan:
    """The tree plan of method ``name`` over ``steps`` steps.

    >>> method_plan("branch-mix-flash", 20).kinds[:3]
    ['sde', 'sde', 'sde']
    >>> method_plan("grpo", 20)
    Traceback (most recent call last):
    ValueError: unknown method 'grpo' ...
    """
    return _core.method_plan(name, steps)
