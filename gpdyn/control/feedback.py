"""The feedback a computed-torque controller adds to its feed-forward: per-joint PD gains or the arm's inertia.

``diagonal`` (:class:`DiagonalFeedback`): ``Kp e + Kd e'`` with the gains of
:func:`gpdyn.robots.arm.pd_gains`, critically damped per joint on the smallest effective inertia
over the run's poses. At poses and loads where a joint feels more inertia, that joint's loop is
slower and under-damped, and the joints' errors are coupled through ``M(q)``: a torque error that
pushes the arm off its reference is recovered slowly (a 3 kg payload on the iiwa's flange, learnt
a few samples late, left 40-50 mrad on joints 3-5 that took 0.6 s to decay).

``inertia`` (:class:`InertiaFeedback`): ``M(q) (w^2 e + 2 w e')``, the outer loop of the
computed-torque law (Spong, Hutchinson & Vidyasagar, *Robot Modeling and Control*, 2006,
Sec. 8.3: ``tau = M(q) a + h(q, qd)`` with ``a = qdd_ref + Kp e + Kd e'``; here the feed-forward
supplies ``M qdd_ref + h`` at the reference and the feedback ``M(q)`` times the PD acceleration).
Where ``M`` is the arm's, every joint's error follows ``e'' = -w^2 e - 2 w e'``: critically damped
at ``w`` on every mode, whatever the pose and the load. ``M`` is the controller's own inertia model:
the plant's for ``true`` (:meth:`InertiaFeedback.of_plant`), the nominal arm's otherwise, and the
nominal arm's plus the identified load for the online controller's gain schedule
(:class:`gpdyn.control.gain_schedule.PayloadGains`). Each step costs one ``mj_forward`` of that
model at the measured ``q``.
"""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np

from gpdyn.errors import InputError
from gpdyn.robots.arm import inertia_matrix

# the share of the stable inertia ratio a bounded feedback keeps (the sampled loop's spectral radius then 0.90 at
# w dt = 0.2, 0.86 at 0.3, against 1 at the ratio)
BOUND_MARGIN = 0.85


class DiagonalFeedback:
    """``Kp e + Kd e'`` with ``Kp, Kd`` [n] (e.g. :func:`gpdyn.robots.arm.pd_gains`)."""

    def __init__(self, kp: np.ndarray, kd: np.ndarray) -> None:
        self.kp, self.kd = (np.asarray(g, dtype=np.float64) for g in (kp, kd))
        n = self.kp.shape[0] if self.kp.ndim == 1 else -1
        if self.kd.shape != (n,) or not (np.isfinite(self.kp).all() and np.isfinite(self.kd).all()):
            raise InputError(f"computed torque: gains must be two finite [n] vectors, got {self.kp.shape}, {self.kd.shape}")
        self.n = n

    def reset(self, env: Any) -> None:
        """Nothing to bind: the gains are fixed."""

    def torque(self, q: np.ndarray, error: np.ndarray, error_rate: np.ndarray) -> np.ndarray:
        return self.kp * error + self.kd * error_rate


def stable_inertia_ratio(omega: float, dt: float) -> float:
    """The largest ``lambda`` for which ``e'' = -lambda (w^2 e + 2 w e')``, the torque held for ``dt`` and integrated
    by semi-implicit Euler, is stable: Jury's test on ``z^2 - (2 - a - b) z + (1 - b)`` with ``a = lambda w^2 dt^2``,
    ``b = 2 lambda w dt`` needs ``b < 2`` and ``4 - a - 2 b > 0``. 4.76 at ``w dt = 0.2``, 3.10 at 0.3."""
    return min(1.0 / (omega * dt), 4.0 / ((omega * dt) ** 2 + 4.0 * omega * dt))


class InertiaFeedback:
    """``M(q) (w^2 e + 2 w e')`` with ``M`` the joint-space inertia of ``model`` (armature included) at the measured
    ``q`` (module notes). ``model`` None: the plant's own, bound at :meth:`reset` (see :meth:`of_plant`).

    ``bound = (reference, dt)``: ``M`` is held within :data:`BOUND_MARGIN` of :func:`stable_inertia_ratio` times the
    reference model's inertia in every direction (its generalised eigenvalues against the reference's clipped).
    Each mode of a plant at least as heavy as the reference then stays stable, whatever ``model`` adds: a model
    with an identified load that is not there (the filter's first samples can show one: 1.6 kg 22 cm from an iiwa's
    flange, 6-7 times the unloaded arm's inertia on one mode) would otherwise drive the unloaded wrist unstable."""

    def __init__(self, model: mujoco.MjModel | None, omega: float, n: int,
                 bound: tuple[mujoco.MjModel, float] | None = None) -> None:
        if not omega > 0:
            raise InputError(f"computed torque: the feedback's omega must be > 0 rad/s, got {omega}")
        for m in (model, bound[0] if bound is not None else None):
            if m is not None and m.nv != n:
                raise InputError(f"computed torque: the feedback's inertia model has {m.nv} joints, the arm {n}")
        self.omega, self.n = float(omega), int(n)
        self.model: mujoco.MjModel | None = None
        self._plant = model is None
        if model is not None:
            self._bind(model)
        self.reference: mujoco.MjModel | None = None
        if bound is not None:
            reference, dt = bound
            if not dt > 0:
                raise InputError(f"computed torque: the feedback's bound needs dt > 0 s, got {dt}")
            self.reference, self._reference_data = reference, mujoco.MjData(reference)
            self.max_ratio = BOUND_MARGIN * stable_inertia_ratio(self.omega, dt)

    @classmethod
    def of_plant(cls, omega: float, n: int) -> InertiaFeedback:
        """The feedback on the plant's own inertia (what the ``true`` controller knows), its payload included."""
        return cls(None, omega, n)

    def _bind(self, model: mujoco.MjModel) -> None:
        self.model, self.data = model, mujoco.MjData(model)

    def reset(self, env: Any) -> None:
        """Bind the plant's model (:meth:`of_plant`): a change to the plant shows in it from then on."""
        if self._plant:
            if env.model.nv != self.n:
                raise InputError(f"computed torque: feedback for {self.n} joints, the plant has {env.model.nv}")
            self._bind(env.model)

    def torque(self, q: np.ndarray, error: np.ndarray, error_rate: np.ndarray) -> np.ndarray:
        if self.model is None:
            raise InputError("computed torque: the plant's inertia feedback is used before reset(env)")
        inertia = inertia_matrix(self.model, q, self.data)
        if self.reference is not None:
            inertia = self._bounded(inertia, inertia_matrix(self.reference, q, self._reference_data))
        return inertia @ (self.omega**2 * error + 2.0 * self.omega * error_rate)

    def _bounded(self, inertia: np.ndarray, reference: np.ndarray) -> np.ndarray:
        """``inertia`` with its generalised eigenvalues against ``reference`` clipped to ``max_ratio``."""
        factor = np.linalg.cholesky(reference)
        whitened = np.linalg.solve(factor, np.linalg.solve(factor, inertia).T)  # L^-1 M L^-T (symmetric)
        ratios, vectors = np.linalg.eigh(0.5 * (whitened + whitened.T))
        if ratios.max() <= self.max_ratio:
            return inertia
        clipped = (vectors * np.minimum(ratios, self.max_ratio)) @ vectors.T
        return factor @ clipped @ factor.T


Feedback = DiagonalFeedback | InertiaFeedback

__all__ = ["BOUND_MARGIN", "DiagonalFeedback", "Feedback", "InertiaFeedback", "stable_inertia_ratio"]
