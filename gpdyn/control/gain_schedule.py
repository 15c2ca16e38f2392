"""The feedback (PD gains, or the inertia it acts through) rebuilt on the load the rigid-body filter identifies.

The computed-torque controller's gains are critically damped on the arm's smallest effective
inertia over the run's poses (:func:`gpdyn.robots.arm.pd_gains`). A grasped load raises the
wrist's inertia, and with the gains of the unloaded arm its joints are under-damped and slow
to reject the feed-forward's errors. :class:`PayloadGains` rebuilds the gains on the load the
filter (:class:`gpdyn.gp.rigid_body.RigidBodyGP`) has identified: a detected change (a
covariance reset) takes the change body's mass and first moment just before it as the base,
and the change since then, ``(dm, dm c)``, as a compact load ``dm`` at ``c`` in the body's frame.
Added to the nominal arm's model that is a physical arm whatever the rest of the estimate is
(the filter's whole estimate is not: the prior carries part of the arm, and as an inertia the
estimate is indefinite at most poses). The gains are rebuilt ``first`` control steps after the
change and then at doubling intervals (``first``, ``2 first``, ... up to ``horizon``), so that
they follow the estimate while it settles at a few rebuilds per change (each costs a few ms of
CPU: the inertia at every pose), and kept only where the sampled loop stays stable
(:func:`gpdyn.robots.arm.sampled_loop_radius` below 1). Resets within ``gap`` steps of the
previous one belong to the same change (a load sets off several).

Only a load the body could hold is taken: at least ``min_mass`` and centred within
``max_offset`` of the body's frame (a load at the flange). The filter's first samples move the
estimate a long way and may trip the change test before any change (its prior is the pretrained
learner, not the arm): the "load" then found is a fraction of a kilogram a metre away, gains
built on it are far too stiff for the arm, and on one seed of nine they made its tracking
worse before the change and after it (docs/control.md, the arm's gain schedule). A change that
takes a load off (a mass change below ``min_mass``) leaves the gains as they are.

With the feedback through the arm's inertia (``inertia=True``, :mod:`gpdyn.control.feedback`)
the same load goes into the model whose ``M(q)`` the feedback multiplies: the loaded model is positive
definite by construction and the loop critically damped on every mode where the load is right. A model
heavier than the plant drives it harder than critically, unstably beyond a ratio of inertias
(:func:`gpdyn.control.feedback.stable_inertia_ratio`), and the filter's first samples can show a "load" that is
not there: the loaded model's inertia is bounded against the nominal arm's (``InertiaFeedback(bound=...)``).
"""

from __future__ import annotations

import copy

import mujoco
import numpy as np

from gpdyn.control.feedback import DiagonalFeedback, Feedback, InertiaFeedback
from gpdyn.errors import InputError
from gpdyn.gp.rigid_body import RigidBodyGP
from gpdyn.robots.arm import pd_gains, sampled_loop_radius
from gpdyn.robots.regressor import body_linear, set_body_linear


#: radius (m) of the solid sphere a load is taken to be: its own inertia keeps the body's principal moments positive
LOAD_RADIUS = 0.02


def compact_load(mass: float, position: np.ndarray) -> np.ndarray:
    """``(m, m c, I_O)`` of a solid sphere of ``mass`` and radius :data:`LOAD_RADIUS` centred at ``position`` [3]:
    its inertia about the frame origin."""
    c = np.asarray(position, dtype=np.float64)
    inertia = mass * (c @ c * np.eye(3) - np.outer(c, c) + 0.4 * LOAD_RADIUS**2 * np.eye(3))
    return np.concatenate([[mass], mass * c, [inertia[0, 0], inertia[1, 1], inertia[2, 2],
                                              inertia[0, 1], inertia[0, 2], inertia[1, 2]]])


class PayloadGains:
    """The feedback rebuilt on the load identified at ``body`` (module notes). ``model``: the nominal arm's torque
    model; ``poses [N, n]``, ``omega``, ``dt``: as for the initial gains; ``inertia``: the feedback through the
    loaded arm's inertia instead of its gains. Call :meth:`update` after each filter update: the new feedback when
    due (and, for gains, stable), else None."""

    def __init__(self, learner: RigidBodyGP, model: mujoco.MjModel, body: str, poses: np.ndarray, omega: float,
                 dt: float, *, first: int = 10, horizon: int = 160, gap: int = 50, min_mass: float = 0.3,
                 max_offset: float = 0.25, inertia: bool = False) -> None:
        self.body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, body)
        if self.body < 0:
            raise InputError(f"gain schedule: the arm has no body {body!r}")
        if not (first >= 1 and horizon >= first and gap >= 0 and min_mass > 0 and max_offset > 0):
            raise InputError(f"gain schedule: need first >= 1, horizon >= first, gap >= 0, min_mass > 0 and "
                             f"max_offset > 0, got {first}, {horizon}, {gap}, {min_mass}, {max_offset}")
        self.learner, self.model, self.body_name = learner, model, body
        self.poses, self.omega, self.dt = np.asarray(poses, dtype=np.float64), float(omega), float(dt)
        self.gap, self.min_mass, self.max_offset = int(gap), float(min_mass), float(max_offset)
        self.inertia = bool(inertia)
        self._due = {first * 2**k for k in range(horizon.bit_length()) if first * 2**k <= horizon}  # steps after a change
        learner.body_estimate(body)  # a body the filter has columns of (LearnerError otherwise)
        self._resets, self._steps, self._last_reset = learner.resets, 0, None
        self._base: np.ndarray | None = None  # the body's estimate before the current change's first reset
        self._since = 0  # control steps since that reset
        self.rebuilt = 0  # feedbacks rebuilt and taken
        self.load: tuple[float, list[float]] | None = None  # the last load they were built on (kg, m)

    def update(self) -> Feedback | None:
        learner = self.learner
        self._steps += 1
        if learner.resets > self._resets:
            if self._last_reset is None or self._steps - self._last_reset > self.gap:  # a new change
                self._base, self._since = learner.body_estimate(self.body_name, learner.theta_before_reset), 0
            self._resets, self._last_reset = learner.resets, self._steps
        if self._base is None:
            return None
        self._since += 1
        if self._since not in self._due:
            return None
        change = learner.body_estimate(self.body_name)[:4] - self._base[:4]
        mass = float(change[0])
        if mass < self.min_mass:
            return None
        position = change[1:] / mass
        if np.linalg.norm(position) > self.max_offset:  # no load the body holds
            return None
        loaded = copy.deepcopy(self.model)
        set_body_linear(loaded, self.body, body_linear(loaded, self.body) + compact_load(mass, position))
        if self.inertia:
            feedback: Feedback = InertiaFeedback(loaded, self.omega, loaded.nv, bound=(self.model, self.dt))
        else:
            kp, kd = pd_gains(loaded, self.poses, self.omega)
            if sampled_loop_radius(loaded, self.poses, kp, kd, self.dt) >= 1:
                return None
            feedback = DiagonalFeedback(kp, kd)
        self.rebuilt += 1
        self.load = (mass, position.tolist())
        return feedback


__all__ = ["LOAD_RADIUS", "PayloadGains", "compact_load"]
