"""Computed-torque tracking of any arm, with the true or a learned inverse dynamics.

Control law (feed-forward plus feedback, as in learned inverse-dynamics control,
Nguyen-Tuong & Peters 2011)::

    tau = f(q_ref, qd_ref, qdd_ref) + Kp (q_ref - q) + Kd (qd_ref - qd)

or, with the feedback through the arm's inertia (:mod:`gpdyn.control.feedback`),
``f(...) + M(q) (w^2 e + 2 w e')``; clipped to the arm's torque limits, with ``f`` one of
(:data:`FEEDFORWARD`): nothing
(``none``: PD alone), MuJoCo's inverse dynamics of the actual plant (``true``, payload
included, divided by the actuators' gear so that a weakened motor is driven harder), or a
learned model (``learned``: a :class:`~gpdyn.control.dynamics.LearnedModel` of the
``arm``/``kuka`` problem, ``[q, qd, qdd] -> tau``). The torque is held for the
whole control step, so ``f`` is evaluated at the reference of the middle of the step
(``t + dt/2``), the same point its training pairs describe.

Online learning: after each step the applied torque is the target for the state at the
middle of the step and the finite-difference acceleration,
``x = [(q + q')/2, (qd + qd')/2, (qd' - qd)/dt]``, ``y = tau``, passed to ``updater``
(:class:`gpdyn.gp.training.OnlineUpdater`, whose learner may be a
:class:`gpdyn.gp.residual.ResidualGP` on a frozen model).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import mujoco
import numpy as np
import torch

from gpdyn.control.dynamics import LearnedModel
from gpdyn.control.feedback import DiagonalFeedback
from gpdyn.sim.loop import Controller
from gpdyn.errors import InputError
from gpdyn.robots.arm import inverse_dynamics

if TYPE_CHECKING:
    from gpdyn.control.feedback import Feedback
    from gpdyn.control.gain_schedule import PayloadGains

FEEDFORWARD = ("none", "true", "learned")


class ComputedTorqueController(Controller):
    """Feed-forward plus feedback on an :class:`~gpdyn.sim.arm_env.ArmEnv` (see the module notes).

    ``feedback``: a :class:`~gpdyn.control.feedback.DiagonalFeedback` or
    :class:`~gpdyn.control.feedback.InertiaFeedback` (or ``(Kp, Kd)`` [n], diagonal gains); ``dt``: the
    control
    step (s). With ``feedforward="learned"``, ``model`` is the learned inverse dynamics and
    every step logs ``ff_error``, its command minus the plant's own (:meth:`_plant_command`, N m per joint), and
    ``feedforward_seconds``, the CPU time of its prediction; ``updater`` (optional) learns
    from each transition (``update_seconds``: its CPU time). ``gain_schedule`` (optional, a
    :class:`gpdyn.control.gain_schedule.PayloadGains`): asked after each update for a new feedback.
    """

    def __init__(
        self,
        name: str,
        feedforward: str,
        feedback: Feedback | tuple[np.ndarray, np.ndarray],
        dt: float,
        *,
        model: LearnedModel | None = None,
        updater: Callable[[torch.Tensor, torch.Tensor], Mapping[str, float]] | None = None,
        gain_schedule: PayloadGains | None = None,
    ) -> None:
        if feedforward not in FEEDFORWARD:
            raise InputError(f"computed torque: feedforward must be one of {', '.join(FEEDFORWARD)}, got '{feedforward}'")
        if (feedforward == "learned") != (model is not None) or (updater is not None and model is None):
            raise InputError("computed torque: a learned model goes with feedforward='learned' (and an updater needs one)")
        if isinstance(feedback, tuple):
            feedback = DiagonalFeedback(*feedback)
        self.feedback = feedback
        n = feedback.n
        if model is not None and (model.input_dim != 3 * n or model.output_dim != n):
            raise InputError(f"computed torque: the learned model maps {model.input_dim} -> {model.output_dim}, "
                             f"a {n}-joint arm needs {3 * n} -> {n} ([q, qd, qdd] -> tau)")
        if not dt > 0:
            raise InputError(f"computed torque: dt must be > 0 s, got {dt}")
        self.name, self.feedforward, self.dt, self.n = name, feedforward, float(dt), n
        self.model, self.updater, self.gain_schedule = model, updater, gain_schedule
        self.env: Any = None
        self._fallbacks = 0
        self._skipped = 0  # transitions the updater could not learn from (NaN/inf), see OnlineUpdater

    def reset(self, env: Any) -> None:
        self.env = env.unwrapped
        if self.env.arm.n != self.n:
            raise InputError(f"computed torque: feedback for {self.n} joints, the arm has {self.env.arm.n}")
        self.scratch = mujoco.MjData(self.env.model)
        self.feedback.reset(self.env)
        self.low, self.high = self.env.arm.limits.torque.T
        self._fallbacks = self._skipped = 0

    def _plant_command(self, q: np.ndarray, qd: np.ndarray, qdd: np.ndarray) -> np.ndarray:
        """The command that makes the plant's own inverse-dynamics torque (its current model, a payload
        change included): the joint torque over the actuator's gear, 1 on the torque model
        (:meth:`~gpdyn.robots.arm.ArmModel.torque_model`) until a motor-gain change scales it."""
        torque = inverse_dynamics(self.env.model, self.scratch, q[None], qd[None], qdd[None])[0]
        return torque / self.env.model.actuator_gear[self.env.arm.actuator_of_joint, 0]

    def act(self, obs: np.ndarray, info: Mapping[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
        q, qd = obs[: self.n], obs[self.n :]
        mid = self.env.reference(info["t"] + 0.5 * self.dt)  # the torque is held over the whole step
        record: dict[str, Any] = {}
        if self.feedforward == "none":
            ff = np.zeros(self.n)
        elif self.feedforward == "true":
            ff = self._plant_command(*mid)
        else:
            assert self.model is not None
            t0 = time.process_time()
            with torch.no_grad():  # the feed-forward needs the mean alone
                mean = self.model.predict_mean(np.concatenate(mid))
            ff = mean.cpu().numpy().astype(np.float64)
            record["feedforward_seconds"] = time.process_time() - t0
            record["ff_error"] = (ff - self._plant_command(*mid)).tolist()
        record["fallback"] = ""
        if not np.isfinite(ff).all():  # a non-finite model output never reaches the motors: PD alone this step
            ff = np.zeros(self.n)
            record["fallback"] = "feed-forward not finite"
            self._fallbacks += 1
        tau = ff + self.feedback.torque(q, info["q_ref"] - q, info["qd_ref"] - qd)
        return np.clip(tau, self.low, self.high), record

    def observe(self, obs: np.ndarray, action: np.ndarray, next_obs: np.ndarray, info: Mapping[str, Any]) -> dict[str, Any]:
        record: dict[str, Any] = {"tracking_error": float(info["tracking_error"])}
        if self.updater is not None:
            assert self.model is not None
            q, qd, q1, qd1 = obs[: self.n], obs[self.n :], next_obs[: self.n], next_obs[self.n :]
            x = np.concatenate([0.5 * (q + q1), 0.5 * (qd + qd1), (qd1 - qd) / self.dt])
            t0 = time.process_time()  # CPU time: on a shared machine the wall clock counts the neighbours' work
            metrics = self.updater(*self.model.training_pair(x, action))
            record.update(update_seconds=time.process_time() - t0, **{f"update_{k}": v for k, v in metrics.items()})
            self._skipped += bool(metrics.get("skipped"))
        if self.gain_schedule is not None:  # the feedback rebuilt on what the model has identified
            feedback = self.gain_schedule.update()
            if feedback is not None:
                self.feedback = feedback
                record["gains_rebuilt"] = True
        return record

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fallbacks": self._fallbacks}
        if self.updater is not None:
            out["updates_skipped"] = self._skipped
            out.update(getattr(self.updater, "summary", dict)())  # online_learner, gp_updates
        if self.model is not None:
            out.update(self.model.diagnostics())
        if self.gain_schedule is not None:
            out["gains_rebuilt"] = self.gain_schedule.rebuilt
        return out


__all__ = ["FEEDFORWARD", "ComputedTorqueController"]
