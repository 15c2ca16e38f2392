"""The task contract and registry: what the generic stages need to know of a robot.

A :class:`Task` is a registered object that owns everything specific to one robot and
task: its environment factory, its state layout (from which its regression problems are
derived, so stored and live data share one encoder), its costs, its plant changes and its
proposal policy. The stages above (collection, learning, control, reports) take a task and
never branch on robot names.

A new robot is one module that builds a task and calls :func:`register_task` (the built-in
ones are listed in :data:`BUILTIN_TASKS` and imported on first use by :func:`get_task`); a
test or a user script may register its own the same way.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpdyn.data.problems import ProblemSpec, register_problem
from gpdyn.errors import InputError
from gpdyn.robots.layout import StateLayout

#: the tasks that ship with gpdyn: name -> the module that registers it
BUILTIN_TASKS: dict[str, str] = {"walker": "gpdyn.robots.walker", "hopper": "gpdyn.robots.hopper"}
#: every task registered in this process, by name
TASKS: dict[str, Task] = {}


@dataclass(frozen=True)
class PlantChange:
    """A named change of the plant: ``apply(model, factor)`` changes an ``MjModel`` in place;
    ``text`` describes it (``{f}`` is the factor); ``factor`` is its default."""

    text: str
    apply: Callable[[Any, float], None]
    factor: float


@dataclass(frozen=True, eq=False)
class Task:
    """A robot and its task, as the generic stages see it.

    ``make_env(**kwargs)`` builds its gymnasium environment; ``layout`` is its planning state
    and model input; ``problems`` maps each regression problem's name to its history (``{"walker-1": 1}``)
    and :attr:`problem_specs` derives them from the layout; ``state_rows(env)`` gives the raw
    simulator rows an episode keeps (:func:`gpdyn.sim.loop.run_episode`'s ``rows`` hook);
    ``plant_changes`` its named changes; ``policy_file`` its proposal policy (a
    :mod:`gpdyn.robots.policy` file; None: the task has none); ``frame_skip`` the simulator
    steps per control step; ``episode_steps`` its time limit.
    """

    name: str
    env_id: str
    layout: StateLayout
    make_env: Callable[..., Any]
    state_rows: Callable[[Any], dict[str, np.ndarray]]
    problems: Mapping[str, int]
    frame_skip: int
    episode_steps: int
    plant_changes: Mapping[str, PlantChange] = field(default_factory=dict)
    policy_file: Path | None = None
    checkpoint_files: Callable[[], list[Path]] | None = None
    description: str = ""

    @property
    def problem_specs(self) -> dict[str, ProblemSpec]:
        return {name: self.layout.problem_spec(name, history) for name, history in self.problems.items()}

    @property
    def default_problem(self) -> str:
        return next(iter(self.problems))

    def plant_change_factor(self, name: str, factor: float | None = None) -> float:
        """The factor of change ``name``: ``factor``, or the change's own when None; InputError when impossible."""
        if name not in self.plant_changes:
            raise InputError(f"{self.name}: unknown plant change '{name}'; choose one of {', '.join(self.plant_changes)}")
        factor = self.plant_changes[name].factor if factor is None else float(factor)
        if not (np.isfinite(factor) and factor > 0):
            raise InputError(f"{self.name}: plant change '{name}': factor must be finite and > 0, got {factor}")
        return factor

    def apply_plant_change(self, model: Any, name: str, factor: float | None = None) -> str:
        """Change ``model`` (an ``MjModel``) in place by change ``name``; returns its description."""
        factor = self.plant_change_factor(name, factor)
        change = self.plant_changes[name]
        change.apply(model, factor)
        return change.text.format(f=factor)


def _identity(task: Task) -> tuple[Any, ...]:
    return (type(task).__qualname__, task.env_id, task.layout, tuple(task.problems.items()))


def register_task(task: Task) -> Task:
    """Register ``task`` and its problems and return the registered task: the same task again
    (or a copy of it, e.g. unpickled in a worker process) keeps the one registered first;
    another task under a taken name is an error."""
    known = TASKS.get(task.name)
    if known is not None:
        if _identity(known) != _identity(task):
            raise InputError(f"task '{task.name}' is already registered (environment {known.env_id})")
        return known
    for spec in task.problem_specs.values():
        register_problem(spec)
    TASKS[task.name] = task
    return task


def task_names() -> list[str]:
    """The built-in tasks and any registered in this process."""
    return list(dict.fromkeys([*BUILTIN_TASKS, *TASKS]))


def get_task(name: str) -> Task:
    """The registered task ``name`` (a built-in one is imported on first use)."""
    if name not in TASKS and name in BUILTIN_TASKS:
        importlib.import_module(BUILTIN_TASKS[name])
    if name not in TASKS:
        raise InputError(f"unknown task '{name}'; choose one of {', '.join(task_names())}")
    return TASKS[name]


def task_for_env(env_id: str, where: str = "env_id") -> Task:
    """The task whose environment is ``env_id`` (ids come from files: a store's attributes, a policy file)."""
    for task in load_builtin_tasks().values():
        if task.env_id == env_id:
            return task
    raise InputError(f"{where} {env_id!r}: no registered task has this environment "
                     f"(known: {', '.join(t.env_id for t in TASKS.values())})")


def load_builtin_tasks() -> dict[str, Task]:
    """Every built-in task, registered (and with them their problems)."""
    for name in BUILTIN_TASKS:
        get_task(name)
    return TASKS


__all__ = ["BUILTIN_TASKS", "PlantChange", "TASKS", "Task", "get_task", "load_builtin_tasks", "register_task",
           "task_for_env", "task_names"]
