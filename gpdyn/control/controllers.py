"""Controllers for :func:`gpdyn.sim.loop.run_episode` that plan: MPC on any model (the fixed
policy's, :class:`~gpdyn.sim.loop.PolicyController`, lives with the loop).

- :class:`MPCController`: a planner of :mod:`gpdyn.control.mpc` built for each episode from
  its environment (so that a true-model planner plans on the episode's own plant), fed the
  robot's planning state: the :class:`~gpdyn.control.planner.PlanningController` that
  converts to and from torch and logs :class:`~gpdyn.control.mpc.PlanInfo`. With a learned
  forward model (:class:`~gpdyn.control.dynamics.LearnedDynamics`) it measures the model's
  one-step error on every transition, and with an ``updater``
  (:class:`gpdyn.gp.training.OnlineUpdater`; its learner may be a :class:`gpdyn.gp.residual.ResidualGP`
  on a frozen model) it learns from it: the online loop plan -> act -> observe -> update -> replan.
  A transition the updater cannot learn from (NaN or inf in it or in the model's prediction
  there) is skipped and counted (``update_skipped`` per step, ``updates_skipped`` per
  episode); the episode goes on, and the planner's own checks keep a non-finite
  prediction away from the actuators.

It logs the robot's ``x_position`` after every step where the environment reports it
(Walker2d's step info does): the distance walked, for the control report's plots.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from gpdyn.control.dynamics import LearnedDynamics
from gpdyn.control.mpc import MPPI, PlanInfo, Planner
from gpdyn.control.planner import PlanningController
from gpdyn.sim.loop import position


class MPCController(PlanningController):
    """Model-predictive control: at every step ``planner.plan(state(env))``, the planner made by
    ``make_planner(env)`` at each episode's start.

    ``model``: the learned forward model the planner uses, when it is one; every transition
    then logs its one-step velocity error ``model_rmse`` and summed predictive variance
    ``pred_variance``, and ``updater(*model.training_pair(...))`` learns from it when given.
    """

    def __init__(
        self,
        name: str,
        make_planner: Callable[[Any], Planner],
        state: Callable[[Any], np.ndarray],
        *,
        model: LearnedDynamics | None = None,
        updater: Callable[[torch.Tensor, torch.Tensor], Mapping[str, float]] | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__(name, make_planner, state)
        self.model, self.updater = model, updater
        self.device, self.dtype = torch.device(device), dtype
        self._stats: dict[str, list[Any]] = {}

    def start_episode(self) -> None:
        self._stats = {"seconds": [], "effective": [], "spreads": [], "fallbacks": [], "skipped": []}

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(a, device=self.device, dtype=self.dtype)

    def planning_state(self, state: np.ndarray) -> torch.Tensor:
        return self._tensor(state)

    def action_array(self, action: torch.Tensor) -> np.ndarray:
        return action.detach().cpu().numpy().astype(np.float64)

    def record(self, plan: PlanInfo) -> dict[str, Any]:  # type: ignore[override]
        self._stats["seconds"].append(plan.seconds)
        self._stats["effective"].append(plan.effective_samples)
        self._stats["fallbacks"].append(bool(plan.fallback))
        if isinstance(self.planner, MPPI):  # the log-weight spreads are MPPI's
            self._stats["spreads"].append((plan.cost_spread, plan.control_spread))
        return {"plan_seconds": plan.seconds, "plan_cost": plan.cost, "plan_variance": plan.variance,
                "finite_fraction": plan.finite_fraction, "effective_samples": plan.effective_samples,
                "cost_spread": plan.cost_spread, "control_spread": plan.control_spread, "fallback": plan.fallback}

    def observe(self, obs: np.ndarray, action: np.ndarray, next_obs: np.ndarray, info: Mapping[str, Any]) -> dict[str, Any]:
        if self.model is None:
            return position(info)
        state, next_state = self._tensor(self._state)[None], self._tensor(self.state(self.env))[None]
        act = self._tensor(action)[None]
        with torch.no_grad():
            velocity, variance = self.model.predict_velocity(state, act)
        err = velocity[0] - next_state[0, self.model.layout.nq :]
        record: dict[str, Any] = {"model_rmse": float(err.pow(2).mean().sqrt()), "pred_variance": float(variance.sum()),
                                  **position(info)}
        if self.updater is not None:
            t0 = time.perf_counter()
            metrics = self.updater(*self.model.training_pair(state, act, next_state))
            record.update(update_seconds=time.perf_counter() - t0, **{f"update_{k}": v for k, v in metrics.items()})
            self._stats["skipped"].append(bool(metrics.get("skipped")))
        return record

    def summary(self) -> dict[str, Any]:
        s = self._stats
        out: dict[str, Any] = {
            "fallbacks": int(sum(s["fallbacks"])),
            "plan_seconds_mean": float(np.mean(s["seconds"])) if s["seconds"] else None,
            "effective_samples_mean": float(np.mean(s["effective"])) if s["effective"] else None,
        }
        if s["spreads"]:
            out.update(cost_spread_mean=float(np.mean([c for c, _ in s["spreads"]])),
                       control_spread_mean=float(np.mean([c for _, c in s["spreads"]])))
        if self.updater is not None:  # transitions the updater could not learn from (NaN/inf), run kept going
            out["updates_skipped"] = int(sum(s["skipped"]))
            out.update(getattr(self.updater, "summary", dict)())  # online_learner, gp_updates
        if self.model is not None:  # the learner's counters, read once per episode (a device sync)
            out.update(self.model.model.diagnostics())
        return out


__all__ = ["MPCController"]
