"""The state vectors of ``mujoco.rollout``: one home for their layout.

``mujoco.rollout.rollout`` takes and returns ``mjSTATE_FULLPHYSICS`` vectors: time, qpos,
qvel, actuator activations, then the rest of the physics state. The planners and learned
models (``SplineSampler``, ``HybridForward``, ``IdentifiedForward``, ``SimDynamics``) start
rollouts from ``(qpos, qvel)`` and read ``qpos``/``qvel`` back out of them.
"""

from __future__ import annotations

import mujoco
import numpy as np

from gpdyn.errors import InputError


class RolloutStates:
    """The FULLPHYSICS layout of one model's rollout states: ``size``, and the ``qpos`` and ``qvel`` slices."""

    def __init__(self, model: mujoco.MjModel) -> None:
        self.size = mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_FULLPHYSICS)
        self.qpos = slice(1, 1 + model.nq)  # after the time
        self.qvel = slice(1 + model.nq, 1 + model.nq + model.nv)
        self.planning = slice(1, 1 + model.nq + model.nv)  # a planning state [qpos, qvel] (adjacent here)

    def initial(self, qpos: np.ndarray, qvel: np.ndarray, rows: int | None = None) -> np.ndarray:
        """Initial states ``[rows, size]`` at ``qpos``, ``qvel`` (``[rows, n]``, or one state broadcast to
        ``rows``), everything else zero: time 0 and no actuator activation."""
        state = np.zeros((qpos.shape[0] if rows is None else rows, self.size))
        state[:, self.qpos], state[:, self.qvel] = qpos, qvel
        return state


    def start(self, state: np.ndarray, rows: int, who: str) -> np.ndarray:
        """Initial states ``[rows, size]`` from a planning state ``[qpos, qvel]``: one ``[nx]`` for every row or one
        per row ``[rows, nx]``; InputError naming ``who`` on another shape."""
        nq, nx = self.qpos.stop - self.qpos.start, self.planning.stop - self.planning.start
        state = np.asarray(state, dtype=float)
        if state.shape[-1] != nx or state.ndim not in (1, 2):
            raise InputError(f"{who}: state of shape {state.shape}, expected [{nx}] or [K, {nx}]")
        return self.initial(state[..., :nq], state[..., nq:], rows=rows)


__all__ = ["RolloutStates"]
