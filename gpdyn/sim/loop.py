"""The one episode loop: act -> step the simulator -> observe (learn) -> act again.

A :class:`Controller` is anything with a ``name`` and ``reset``/``act``/``observe``/``summary``;
:func:`run_episode` runs one episode of any gymnasium-style environment under it, for
every robot and every use: collecting rollouts of a policy (:class:`PolicyController`),
MPC on a learned model, arm computed torque (:mod:`gpdyn.control`). Robot- and experiment-specific parts come
in as arguments: a plant change (``before_step``), extra columns per step (``rows``),
where logs go (``log``) and what labels them (``tags``). The loop knows no controller by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

import time

import numpy as np

from gpdyn.errors import InputError
from gpdyn.progress import progress_bar


class Controller(Protocol):
    """An online controller. Subclasses inherit the defaults of ``reset``, ``observe`` and ``summary``.

    - ``reset(env)``: a new episode starts in ``env`` (already reset); keep what ``act`` needs
      from it (e.g. the simulator's full state, the plant's model for a true-model planner).
    - ``act(obs, info) -> (action, record)``: the action for this step and what to log
      about choosing it (planning time, fallbacks); ``info`` is the env's reset/step info.
    - ``observe(obs, action, next_obs, info) -> record``: the transition just seen: learn
      from it, measure the model's error; returns what to log.
    - ``summary() -> dict``: the episode's totals for its record (means, counters), called
      once at the end of each episode.
    """

    name: str

    def reset(self, env: Any) -> None:
        return None

    def act(self, obs: np.ndarray, info: Mapping[str, Any]) -> tuple[np.ndarray, dict[str, Any]]: ...

    def observe(self, obs: np.ndarray, action: np.ndarray, next_obs: np.ndarray, info: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    def summary(self) -> dict[str, Any]:
        return {}


def position(info: Mapping[str, Any]) -> dict[str, float]:
    """The robot's x position after the step, where the environment's step info has it."""
    return {"x_position": float(info["x_position"])} if "x_position" in info else {}


class PolicyController(Controller):
    """A fixed policy: ``policy(obs) -> action``; it neither plans nor learns. Logs the robot's
    ``x_position`` after every step where the environment reports it (the distance walked)."""

    def __init__(self, policy: Callable[[np.ndarray], np.ndarray], name: str = "policy") -> None:
        self.policy, self.name = policy, name

    def act(self, obs: np.ndarray, info: Mapping[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
        return self.policy(obs), {}

    def observe(self, obs: np.ndarray, action: np.ndarray, next_obs: np.ndarray, info: Mapping[str, Any]) -> dict[str, Any]:
        return position(info)


class Episode(NamedTuple):
    """What :func:`run_episode` returns: the episode's record (as logged) and its rows ``{field: [T, width]}``."""

    record: dict[str, Any]
    rows: dict[str, np.ndarray]


BASE_ROWS = ("obs", "action", "reward", "terminated", "truncated")


def run_episode(
    env: Any,
    controller: Controller,
    *,
    steps: int,
    reset_seed: int,
    before_step: Callable[[int, Any], str | None] | None = None,
    rows: Callable[[Any], Mapping[str, Any]] | None = None,
    next_rows: tuple[str, ...] = (),
    log: Callable[..., Any] | None = None,
    tags: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> Episode:
    """Run ``controller`` in ``env`` for at most ``steps`` steps from ``env.reset(seed=reset_seed)``.

    - ``before_step(t, env)``: called before step ``t`` acts; a plant change returns its
      description (e.g. "torso mass x1.3"), else None. Steps log ``changed`` (a change has
      happened in this episode) and the record keeps the last description as ``change``.
    - ``rows(env)``: robot-specific columns of a step, read before it (e.g. the raw
      ``qpos``/``qvel``); the names in ``next_rows`` are read again after it as ``next_<name>``.
      Every episode has :data:`BASE_ROWS`; ``reward``, ``terminated``, ``truncated`` are ``[T, 1]``.
    - ``log(**fields)``: receives a ``kind="step"`` record per step (``t``, ``reward``,
      ``changed``, ``cpu_ms``, the controller's act and observe records) and the
      ``kind="episode"`` record; both carry ``tags`` (robot, controller, condition, episode, ...).
    The episode ends at ``steps`` or when the env terminates or truncates it.

    ``cpu_ms`` is the process CPU time of the controller's ``act`` plus ``observe`` in the
    step (planning or feed-forward, and the model update; the simulator's step is not
    counted, nor is the env's reset); the episode record has its mean ``cpu_ms_per_step``
    and 95th percentile ``cpu_ms_per_step_p95``, to compare with the control period. CPU
    time, not wall time: on a shared machine the wall clock counts the neighbours' work.
    It includes what the controller measures for its log (e.g. a model's one-step error),
    so it is an upper bound on what control alone needs.
    """
    if steps < 1:
        raise InputError(f"run_episode: steps must be >= 1, got {steps}")
    tags = dict(tags or {})
    obs, info = env.reset(seed=reset_seed)
    controller.reset(env)
    collected: dict[str, list[np.ndarray]] = {k: [] for k in BASE_ROWS}
    total, change, t = 0.0, "", 0
    cpu_ms: list[float] = []
    label = "/".join(str(v) for v in tags.values()) or controller.name
    bar = progress_bar(range(steps), desc=label, disable=not progress, leave=False)
    for t in bar:
        if before_step is not None:
            change = before_step(t, env) or change
        extra = dict(rows(env)) if rows is not None else {}
        started = time.process_time()
        action, record = controller.act(obs, info)
        acted = time.process_time()
        action = np.asarray(action, dtype=np.float64)
        for k, v in (("obs", obs), ("action", action), *extra.items()):
            collected.setdefault(k, []).append(np.array(v, dtype=np.float64))
        next_obs, reward, terminated, truncated, info = env.step(action)
        observing = time.process_time()
        record = {**record, **controller.observe(obs, action, next_obs, info)}
        cpu_ms.append(1e3 * (acted - started + time.process_time() - observing))
        total += float(reward)
        after = dict(rows(env)) if rows is not None and next_rows else {}
        for k in next_rows:
            collected.setdefault(f"next_{k}", []).append(np.array(after[k], dtype=np.float64))
        for k, v in (("reward", reward), ("terminated", terminated), ("truncated", truncated)):
            collected[k].append(np.array([v]))
        if log is not None:
            log(kind="step", **tags, t=t, reward=float(reward), changed=bool(change), cpu_ms=cpu_ms[-1], **record)
        bar.set_postfix(ret=f"{total:.0f}", refresh=False)
        obs = next_obs
        if terminated or truncated:
            break
    summary = {"kind": "episode", **tags, "return": total, "length": t + 1, "change": change,
               "cpu_ms_per_step": float(np.mean(cpu_ms)), "cpu_ms_per_step_p95": float(np.percentile(cpu_ms, 95)),
               **controller.summary()}
    if log is not None:
        log(**summary)
    arrays = {k: np.stack(v).reshape(len(v), -1) for k, v in collected.items()}
    arrays["terminated"] = arrays["terminated"].astype(bool)
    arrays["truncated"] = arrays["truncated"].astype(bool)
    return Episode(summary, arrays)


__all__ = ["BASE_ROWS", "Controller", "Episode", "PolicyController", "position", "run_episode"]
