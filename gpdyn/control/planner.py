"""The planner and planning-model interfaces of :mod:`gpdyn.control`, and the one controller that drives any planner.

A planning state is the robot's ``[qpos, qvel]`` (``nx = nq + nv`` numbers: the raw
simulator state, not the policy's observation), read by :func:`env_state`.

:class:`Planner`, what a planner offers:

- ``reset()``: forget the warm start (the start of an episode);
- ``plan(state [nx]) -> (action [nu], info)``: the action to apply now and a mapping of
  what planning did (names to numbers or text).

Implemented by the torch planners :class:`~gpdyn.control.mpc.MPPI` and
:class:`~gpdyn.control.mpc.CEM` (state and action are tensors, ``info`` a
:class:`~gpdyn.control.mpc.PlanInfo`, a mapping with attributes) and by the spline sampler
:class:`~gpdyn.control.spline_sampling.SplineSampler` (numpy arrays, ``info`` a dict).

:class:`PlanningModel`, what a planning model offers: ``predict_mean(state [K, nx], action
[K, nu]) -> next_state [K, nx]``, the (mean) next planning states of ``K`` states under
``K`` actions over one step of the model. :class:`PathModel` adds ``rollout(state [nx] or
[K, nx], actions [K, H, nu]) -> states [K, H, nx]``, the open-loop states after each of
``H`` steps in one batched call (a default ``predict_mean`` comes with it: a rollout of one
step). Arrays are those of the planner that uses the model:

- torch tensors, one control step, for MPPI and CEM (which call ``predict_mean`` when their
  cost ignores the predictive variance, else ``model(state, action)``, which may also return
  the variance): :class:`~gpdyn.control.dynamics.LearnedDynamics` (a learned model of the
  next velocities) and :class:`~gpdyn.control.dynamics.SimDynamics` (the true simulator);
- numpy arrays, one planning step of ``stride`` control steps, for the spline sampler, which
  needs a :class:`PathModel` (a whole plan in one call): the true MuJoCo model
  (:class:`~gpdyn.control.spline_sampling.MujocoForward`), the hybrid model
  (:class:`~gpdyn.control.hybrid_model.HybridForward`), the identified model
  (:class:`~gpdyn.control.identified_model.IdentifiedForward`) and any torch planning model
  lifted to numpy and to the planning step (:class:`~gpdyn.control.spline_sampling.LearnedForward`).

:class:`PlanningController` runs any :class:`Planner` in :func:`gpdyn.sim.loop.run_episode`:
a planner made for each episode from its environment, fed the planning state at every step.
:class:`~gpdyn.control.controllers.MPCController` (the torch planners, with online learning)
and :class:`~gpdyn.control.spline_sampling.SamplingController` (the spline sampler) are it
with their planners' conversions and records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from gpdyn.errors import InputError
from gpdyn.sim.loop import Controller


@runtime_checkable
class Planner(Protocol):
    """What a planner offers (module docs): ``reset()`` and ``plan(state) -> (action, info)``."""

    def reset(self) -> None:
        """Forget the warm start (call at the start of an episode)."""
        ...

    def plan(self, state: Any) -> tuple[Any, Mapping[str, Any]]:
        """The action ``[nu]`` to apply at the planning state ``state [nx]`` and what planning did."""
        ...


@runtime_checkable
class PlanningModel(Protocol):
    """What a planning model offers (module docs): the next planning states of a batch, over one model step."""

    def predict_mean(self, state: Any, action: Any) -> Any:
        """``next_state [K, nx]`` of ``state [K, nx]`` under ``action [K, nu]``."""
        ...


@runtime_checkable
class PathModel(PlanningModel, Protocol):
    """A :class:`PlanningModel` that rolls a whole batch of action sequences out in one call (module docs)."""

    def rollout(self, state: Any, actions: Any) -> Any:
        """``states [K, H, nx]`` after each step of ``actions [K, H, nu]`` from ``state [nx]`` (every sample's
        start) or ``[K, nx]`` (one start per sample)."""
        ...

    def predict_mean(self, state: Any, action: Any) -> Any:
        """One step: the rollout of ``action [K, nu]`` as a one-step sequence from ``state [K, nx]``."""
        return self.rollout(state, action[:, None, :])[:, 0]


def state_of(data: Any) -> np.ndarray:
    """The planning state ``[qpos, qvel]`` of a simulator's ``MjData``."""
    return np.concatenate([data.qpos, data.qvel])


def env_state(env: Any) -> np.ndarray:
    """The planning state ``[qpos, qvel]`` of a gymnasium MuJoCo environment (raw, not its observation)."""
    return state_of(env.unwrapped.data)


class PlanningController(Controller):
    """Any :class:`Planner` as a :class:`gpdyn.sim.loop.Controller`.

    ``make_planner(env)`` makes the episode's planner at its start (so that a planner on the
    true model plans on the episode's own plant); ``state(env)`` reads the planning state at
    every step. A subclass converts the state to the planner's arrays (:meth:`planning_state`)
    and its action back (:meth:`action_array`), and turns the planner's ``info`` into the
    step's record (:meth:`record`, which may also keep statistics for :meth:`summary`).
    """

    def __init__(self, name: str, make_planner: Callable[[Any], Planner],
                 state: Callable[[Any], np.ndarray] = env_state) -> None:
        self.name, self.make_planner, self.state = name, make_planner, state
        self.env: Any = None
        self.planner: Any = None
        self._state: np.ndarray | None = None  # the planning state of the last act, as numpy

    def reset(self, env: Any) -> None:
        self.env = env
        self.planner = self.make_planner(env)
        self.planner.reset()
        self.start_episode()

    def act(self, obs: np.ndarray, info: Mapping[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
        if self.planner is None:
            raise InputError(f"{type(self).__name__}.act: reset(env) was not called")
        self._state = np.asarray(self.state(self.env), dtype=np.float64).copy()
        action, plan = self.planner.plan(self.planning_state(self._state))
        return self.action_array(action), self.record(plan)

    # -- what a subclass changes ----------------------------------------------------------
    def start_episode(self) -> None:
        """Called at each episode's start, after the planner is made and reset."""

    def planning_state(self, state: np.ndarray) -> Any:
        """The planning state ``[nx]`` as the planner takes it (numpy here)."""
        return state

    def action_array(self, action: Any) -> np.ndarray:
        """The planner's action as the float64 numpy array the environment takes."""
        return np.asarray(action, dtype=np.float64)

    def record(self, plan: Mapping[str, Any]) -> dict[str, Any]:
        """The step's record of what planning did (the planner's ``info`` as a dict here)."""
        return dict(plan)


__all__ = ["PathModel", "Planner", "PlanningController", "PlanningModel", "env_state", "state_of"]
