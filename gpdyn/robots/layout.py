"""A robot's state layout: the one description from which its stored samples and its
planning model's inputs are both encoded.

:class:`StateLayout` says how a planning state ``[qpos (nq), qvel (nv)]`` and an action
``(nu)`` become a forward model's input ``[qpos[position_inputs], qvel, action]`` (torch, the
planners' hot path: :meth:`StateLayout.features`), and :meth:`StateLayout.problem_spec` cuts the
same columns from an episode store's ``qpos``/``qvel``/``action`` fields (numpy, through
:func:`gpdyn.data.problems.load_problem`), so live and stored data cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from gpdyn.data.problems import ProblemSpec
from gpdyn.errors import InputError


@dataclass(frozen=True)
class StateLayout:
    """A robot's planning state ``[qpos (nq), qvel (nv)]``, its action (nu), control step ``dt``, and
    the forward model's input ``[qpos[position_inputs], qvel, action]``.

    ``position_inputs`` leaves out positions the dynamics do not depend on (a legged robot's
    x position: its ``-1`` problem drops it); they must be the positions from some index on,
    so that a store's ``qpos`` field gives them by dropping its leading columns.
    """

    nq: int
    nv: int
    nu: int
    dt: float
    position_inputs: tuple[int, ...]

    def __post_init__(self) -> None:
        if min(self.nq, self.nv, self.nu) < 1 or not (np.isfinite(self.dt) and self.dt > 0):
            raise InputError(f"StateLayout: need nq, nv, nu >= 1 and dt > 0, got {self.nq}, {self.nv}, {self.nu}, {self.dt}")
        if any(not 0 <= i < self.nq for i in self.position_inputs):
            raise InputError(f"StateLayout: position_inputs {self.position_inputs} outside the {self.nq} positions")

    @property
    def nx(self) -> int:
        return self.nq + self.nv

    @property
    def input_dim(self) -> int:
        return len(self.position_inputs) + self.nv + self.nu

    @property
    def velocity_inputs(self) -> slice:
        """qvel's columns in the model input."""
        return slice(len(self.position_inputs), len(self.position_inputs) + self.nv)

    @property
    def action_inputs(self) -> slice:
        """The action's columns in the model input."""
        start = len(self.position_inputs) + self.nv
        return slice(start, start + self.nu)

    def features(self, state: Tensor, action: Tensor) -> Tensor:
        """The model input ``[qpos[position_inputs], qvel, action]`` of ``state [..., nx]``, ``action [..., nu]``."""
        return torch.cat([state[..., self._positions], state[..., self.nq :], action.to(state.dtype)], dim=-1)

    def integrate(self, state: Tensor, v1: Tensor) -> Tensor:
        """The next state ``[q', v1]`` from ``state [..., nx]`` and the next velocities ``v1``, by the
        trapezoid rule ``q' = q + dt/2 (v + v1)`` (needs ``nq == nv``)."""
        q1 = state[..., : self.nq] + 0.5 * self.dt * (state[..., self.nq :] + v1)
        return torch.cat([q1, v1], dim=-1)

    def problem_spec(self, name: str, history: int = 1) -> ProblemSpec:
        """The regression problem ``name`` of this layout: the inputs :meth:`features` makes, read
        from a store's ``qpos``/``qvel``/``action`` fields (``history`` consecutive rows stacked),
        and the next ``qvel`` as the target (a store's ``next_qvel`` when it keeps one)."""
        first = self.position_inputs[0] if self.position_inputs else self.nq
        if tuple(self.position_inputs) != tuple(range(first, self.nq)):
            raise InputError(f"StateLayout: problem {name!r}: a store field gives the positions from one index on, "
                             f"not {self.position_inputs}")
        return ProblemSpec(name, (("qpos", first), ("qvel", 0), ("action", 0)), "qvel", history=history, target_shift=1,
                           widths=(("qpos", self.nq), ("qvel", self.nv), ("action", self.nu)), next_field="next_qvel")

    @property
    def _positions(self) -> slice | list[int]:
        # a run of columns as a slice: a view, where a list of indices would copy in the planner's hot path
        cols = list(self.position_inputs)
        if cols and cols == list(range(cols[0], cols[0] + len(cols))):
            return slice(cols[0], cols[0] + len(cols))
        return cols


__all__ = ["StateLayout"]
