"""The one control driver: every robot's control experiment is this loop over a :class:`ControlPlan`.

:func:`run_control` runs, for each plant condition and each controller, ``episodes``
consecutive episodes through :func:`gpdyn.sim.loop.run_episode`, the controller kept across
them (so an online model keeps what it learned), the plant changed when the plan says, every
step logged to the run folder; then the plan writes its report. What differs between robots
is the plan: how its models are trained and its controllers built
(:mod:`gpdyn.experiments.control_legged`: MPC beside a policy on a legged task;
:mod:`gpdyn.experiments.control_arm`: computed-torque tracking on an MJCF arm), what a plant
change is, which extra columns a step keeps and what the report shows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from gpdyn.runs import RunDir
from gpdyn.sim.loop import Controller, Episode, run_episode

log = logging.getLogger(__name__)


class ControlPlan(Protocol):
    """What :func:`run_control` asks of a robot's experiment, once its models are ready.

    - ``robot``: the name steps and episodes are tagged with; ``conditions`` the plant
      conditions, ``controllers`` the controllers' names, ``episodes`` per controller and
      condition, ``steps`` at most per episode, ``progress`` a bar per episode.
    - ``controller(name, condition)``: a new controller (one per condition: an online model
      starts from the pretrained one on each plant).
    - ``make_env()``: a fresh environment for an episode; ``reset_seed(episode)`` its seed.
    - ``plant_change(condition, elapsed)``: the ``before_step`` hook of an episode after
      ``elapsed`` steps of the condition (None: the plant stays as it is).
    - ``rows`` / ``next_rows``: the extra columns a step keeps (:func:`run_episode`).
    - ``record(episode, condition, name, index)``: keep an episode's result; ``finish(run)``:
      write the report, return the run's summary.
    """

    robot: str
    conditions: tuple[str, ...]
    controllers: tuple[str, ...]
    episodes: int
    steps: int
    progress: bool
    next_rows: tuple[str, ...]

    def controller(self, name: str, condition: str) -> Controller: ...

    def make_env(self) -> Any: ...

    def reset_seed(self, episode: int) -> int: ...

    def plant_change(self, condition: str, elapsed: int) -> Callable[[int, Any], str | None] | None: ...

    def rows(self, env: Any) -> dict[str, Any]: ...

    def record(self, episode: Episode, condition: str, name: str, index: int) -> None: ...

    def finish(self, run: RunDir) -> dict[str, Any]: ...


def run_control(run: RunDir, plan: ControlPlan) -> dict[str, Any]:
    """Every controller x condition x episode of ``plan`` into ``run``; returns ``plan.finish(run)``."""
    for condition in plan.conditions:
        for name in plan.controllers:
            controller = plan.controller(name, condition)
            elapsed = 0  # control steps of this controller and condition so far
            for index in range(plan.episodes):
                env = plan.make_env()
                try:
                    episode = run_episode(env, controller, steps=plan.steps, reset_seed=plan.reset_seed(index),
                                          before_step=plan.plant_change(condition, elapsed), rows=plan.rows,
                                          next_rows=plan.next_rows, log=run.log, progress=plan.progress,
                                          tags={"robot": plan.robot, "controller": name, "condition": condition,
                                                "episode": index})
                finally:
                    env.close()
                elapsed += episode.record["length"]
                plan.record(episode, condition, name, index)
    return plan.finish(run)


__all__ = ["ControlPlan", "run_control"]
