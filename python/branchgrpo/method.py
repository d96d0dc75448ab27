"""Methods: a named recipe of the engine (``with_method``) with the run config's sections overriding its components.

A section is a dict like the TOML table of the same name (docs/config.md): ``topology``, ``rollout`` (its
``stepper`` and the stepper's parameters), ``correlator``, ``fusion``, ``advantage``, ``pruning`` and
``objective``. Each policy is set through its own description (``parameters()`` in C++), so the keys, defaults
and rules are the config's; a section's ``kind`` defaults to the method's own component, whose parameters it then
overrides.
"""

from __future__ import annotations

from typing import Any

import torch

from branchgrpo import _core


class Method(_core.Method):
    """A method by name, with sections overriding its components; it keeps its normalizer's state.

    >>> m = Method("branch", correlator={"s": 2.0}, advantage={"kind": "per_prompt_running"})
    >>> m.components["correlator"], m.components["advantage"], m.plan(20).evaluations
    ('correlated', 'per_prompt_running', 203)
    >>> Method("branch", correlator={"s": -1.0})
    Traceback (most recent call last):
    ValueError: correlator.s = -1.0: must be in [0, 1000]
    >>> Method("dance", rollout={"steps": 10})
    Traceback (most recent call last):
    ValueError: rollout.steps: is rollout()'s argument, not a Method key (rollout has: stepper and its parameters)
    """

    def __repr__(self) -> str:
        sections = "".join(f", {key}={value!r}" for key, value in self.sections.items())
        return f"Method({self.name!r}{sections})"

    def state_dict(self) -> dict[str, Any]:
        """The method's name and sections and its normalizer's state (float64 tensors), for ``torch.save``.

        >>> Method("branch").state_dict()
        {'name': 'branch', 'sections': {}, 'normalizer': {}}
        """
        buffers = {key: torch.tensor(values, dtype=torch.float64) for key, values in self.state().items()}
        return {"name": self.name, "sections": self.sections, "normalizer": buffers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores ``state_dict()``'s normalizer state; the name and sections must be this method's.

        >>> m = Method("dance")
        >>> m.load_state_dict(Method("branch").state_dict())
        Traceback (most recent call last):
        ValueError: load_state_dict: the state is of Method('branch'), this is Method('dance')
        """
        for key in ("name", "sections", "normalizer"):
            if key not in state:
                raise ValueError(f"load_state_dict: the state has no {key!r} (keys: {sorted(state)})")
        if state["name"] != self.name or state["sections"] != self.sections:
            shown = f"Method({state['name']!r}" + "".join(f", {k}={v!r}" for k, v in state["sections"].items()) + ")"
            raise ValueError(f"load_state_dict: the state is of {shown}, this is {self!r}")
        buffers = {}
        for key, values in state["normalizer"].items():
            tensor = torch.as_tensor(values, dtype=torch.float64)
            buffers[key] = tensor.reshape(-1).tolist()
        self.load_state(buffers)


def as_method(method: str | Method) -> Method:
    """``method`` itself, or the Method of that name.

    >>> as_method("dance").name
    'dance'
    >>> as_method(3)
    Traceback (most recent call last):
    TypeError: method = 3: must be a method name or a Method
    """
    if isinstance(method, Method):
        return method
    if isinstance(method, str):
        return Method(method)
    raise TypeError(f"method = {method!r}: must be a method name or a Method")
