"""Rollouts of a legged task's policy into an episode store (``gpdyn collect walker|hopper``).

Each episode is one :func:`gpdyn.sim.loop.run_episode` of a
:class:`~gpdyn.sim.loop.PolicyController` (the episode loop of control too), in worker processes.

Every row of the store is one transition: the raw simulator state ``qpos``/``qvel``
at step t (from ``env.unwrapped.data``, not the observation, whose ``qvel`` is clipped
to ±10), the observation, the applied action, the reward, ``terminated``/``truncated``
and the raw state after the step (``next_qpos``/``next_qvel``), so the last transition
of an episode is kept too.

Reproducibility: episode ``i`` depends only on ``(seed, i)`` (its reset seed and its
action-noise generator come from ``numpy.random.default_rng([seed, i])``) and on its
policy, ``policies[i % len(policies)]``. Which worker runs it does not matter, so the
same seed gives the same store for any ``--envs``, and a rerun on an existing store
continues at episode ``n_episodes`` and never duplicates one.
"""

from __future__ import annotations

import hashlib
import math
import multiprocessing as mp
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import numpy as np

from gpdyn.data.store import DEFAULT_CHUNK_ROWS, EpisodeStore, FieldSpec, StoreError, numbered_columns
from gpdyn.errors import InputError
from gpdyn.robots.legged import LeggedTask
from gpdyn.robots.policy import Policy, PolicyError, load_policy
from gpdyn.robots.task import register_task
from gpdyn.sim.loop import PolicyController, run_episode
from gpdyn.sim.stopping import CollectionStopped, StopSignals, signal_name

# Finished episodes wait at most this long before they are committed. A commit costs
# tens of milliseconds whatever its size (a write per field and the commit record), so
# committing every episode as it comes would take that from the workers' cores.
COMMIT_SECONDS = 1.0
POLL_SECONDS = 0.2  # how often the parent looks at the stop flag while it waits for workers


def source(task: LeggedTask) -> str:
    """The ``source`` attribute of the task's rollout stores."""
    return f"{task.name}-trpo"


def legged_fields(task: LeggedTask) -> dict[str, FieldSpec]:
    """The per-step fields of a legged task's store."""
    qvel_names = tuple(f"d{n}" for n in task.qpos_names)
    qvel_text = f"clip(qvel, ±{task.obs_clip:g})" if math.isfinite(task.obs_clip) else "qvel"
    return {
        "qpos": FieldSpec(task.qpos_names, unit="m or rad"),
        "qvel": FieldSpec(qvel_names, unit="m/s or rad/s"),
        "obs": FieldSpec(numbered_columns("obs", task.nobs), unit=f"observation (qpos[1:], {qvel_text})"),
        "action": FieldSpec(numbered_columns("u", task.layout.nu), unit="normalised control in [-1, 1] (times the gear)"),
        "reward": FieldSpec(("reward",)),
        "terminated": FieldSpec(("terminated",), dtype="bool"),
        "truncated": FieldSpec(("truncated",), dtype="bool"),
        "next_qpos": FieldSpec(task.qpos_names, unit="m or rad"),
        "next_qvel": FieldSpec(qvel_names, unit="m/s or rad/s"),
    }


EPISODE_KEYS = {"reset_seed": "int64", "policy": "int64", "return": "float64"}


@dataclass(frozen=True)
class CollectConfig:
    """What decides the data of every episode; stored in the store's attributes. The task
    travels to the worker processes with it (a task registered by a script or a test too)."""

    task: LeggedTask
    policies: tuple[Path, ...]
    seed: int = 0
    noise: float = 0.0

    @property
    def env_id(self) -> str:
        return self.task.env_id


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def episode_rng(seed: int, index: int) -> tuple[int, np.random.Generator]:
    """The reset seed and action-noise generator of episode ``index`` of a ``seed`` collection."""
    rng = np.random.default_rng([seed, index])
    return int(rng.integers(2**31 - 1)), rng


def rollout(task: LeggedTask, env: Any, policy: Policy, reset_seed: int, noise: float = 0.0,
            rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
    """One episode as a dict of per-step arrays (the fields of :func:`legged_fields`), by the
    episode loop of control (:func:`gpdyn.sim.loop.run_episode`) under the policy.

    The action is the policy's deterministic action plus ``N(0, noise²)`` noise,
    clipped to the action box: the stored action is the control the simulator applied.
    """
    if noise and rng is None:
        raise InputError("rollout: noise needs a random generator")
    low, high = env.action_space.low, env.action_space.high

    def act(obs: np.ndarray) -> np.ndarray:
        action = policy.act(obs)
        return np.clip(action + noise * rng.standard_normal(action.shape), low, high) if noise else action

    steps = env.spec.max_episode_steps or task.episode_steps
    episode = run_episode(env, PolicyController(act), steps=steps, reset_seed=reset_seed, rows=task.state_rows,
                          next_rows=("qpos", "qvel"))
    return episode.rows


# ---------------------------------------------------------------- worker processes
_WORKER: dict[str, Any] = {}


def _init_worker(config: CollectConfig) -> None:
    import signal

    # Ctrl-C reaches the whole process group: it is the parent's to handle (it commits the
    # finished episodes and ends the workers)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    torch.set_num_threads(1)  # one process per core; more threads only contend
    task = register_task(config.task)
    _WORKER["task"] = task
    _WORKER["env"] = task.make_env()
    _WORKER["policies"] = [load_policy(p) for p in config.policies]
    _WORKER["config"] = config


def _run_episode(index: int) -> tuple[int, dict[str, np.ndarray]]:
    config: CollectConfig = _WORKER["config"]
    policies = _WORKER["policies"]
    reset_seed, rng = episode_rng(config.seed, index)
    policy_index = index % len(policies)
    episode = rollout(_WORKER["task"], _WORKER["env"], policies[policy_index], reset_seed, config.noise, rng)
    return index, episode


def _worker_main(config: CollectConfig, conn: Connection) -> None:
    """A worker: receive an episode index, send ``(index, episode, None)`` back; ``None`` ends it.

    A failure is sent as ``(index, None, exception)`` for the parent to raise. When the
    parent is gone (its end of the pipe closed, however it ended) the worker ends too.
    """
    index = None
    try:
        _init_worker(config)
        while (index := conn.recv()) is not None:
            conn.send((*_run_episode(index), None))
    except (EOFError, BrokenPipeError):
        return
    except BaseException as err:  # handed to the parent, which commits what it can and raises it
        try:
            conn.send((index, None, err))
        except Exception:  # an exception that does not pickle: its text is enough
            conn.send((index, None, RuntimeError(f"{type(err).__name__}: {err}")))


class _Worker:
    """One worker process and the parent's end of its own pipe.

    The pipe is the worker's alone (the parent closes the worker's end once it has
    started), so the worker's death, however it dies, reads as end-of-file here: a shared
    result queue would wait forever for a message a killed worker never finished.
    """

    def __init__(self, ctx: Any, config: CollectConfig, number: int) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(config, child), name=f"collect-{config.task.name}-{number}",
                                   daemon=True)
        self.process.start()
        child.close()
        self.index: int | None = None  # the episode it is running

    def give(self, index: int) -> bool:
        """Send the worker episode ``index``; False if it has died."""
        self.index = index
        try:
            self.conn.send(index)
        except OSError:
            return False
        return True

    def death(self) -> str:
        """How the worker ended, after its pipe closed: exit status or signal."""
        self.process.join(timeout=5)
        code = self.process.exitcode
        if code is None:
            return "closed its pipe"
        return f"was killed by {signal_name(-code)}" if code < 0 else f"exited with status {code}"

    def stop(self, wait: bool) -> None:
        """End the worker: politely between episodes (``wait``), else at once."""
        if wait and self.process.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


# ---------------------------------------------------------------- collection
def _config_attrs(config: CollectConfig) -> dict[str, Any]:
    return {
        "collector": f"gpdyn collect {config.task.name}",
        "noise": config.noise,
        "policies": [
            {"file": str(p), "name": p.name, "sha256": _sha256(p), "timesteps": load_policy(p).meta.get("timesteps")}
            for p in config.policies
        ],
        "frame_skip": config.task.frame_skip,
        "row": "transition t -> t+1: state, obs and action at t, reward and state after the step",
    }


def _open_or_create(path: Path, config: CollectConfig) -> EpisodeStore:
    """Create the store, or reopen it and check it was collected with the same settings."""
    attrs = _config_attrs(config)
    if not path.exists():
        env = config.task.make_env()
        try:
            dt = float(env.unwrapped.dt)
        finally:
            env.close()
        try:
            return EpisodeStore.create(
                path, legged_fields(config.task), source=source(config.task), env_id=config.env_id, dt=dt, seed=config.seed,
                episode_keys=EPISODE_KEYS, extra_attrs=attrs,
            )
        except StoreError:
            if not path.exists():
                raise
            # another collector created it meanwhile: continue it, or be refused by its lock
    store = EpisodeStore.open(path, mode="a")
    try:
        _check_settings(store, config, attrs)
    except BaseException:
        store.close()
        raise
    return store


def _hashes(policies: Any) -> Any:
    """The sha256 of each policy entry of the attribute ``policies`` (a damaged attribute as it is)."""
    if isinstance(policies, list) and all(isinstance(p, dict) for p in policies):
        return [p.get("sha256") for p in policies]
    return policies


def _check_settings(store: EpisodeStore, config: CollectConfig, attrs: dict[str, Any]) -> None:
    """Refuse to continue a store collected with other settings."""
    path, old = store.path, store.attrs
    want = source(config.task)
    if old.get("source") != want or old.get("env_id") != config.env_id:
        raise StoreError(f"{path}: holds {old.get('source')}/{old.get('env_id')} data, not {want}/{config.env_id}")
    mismatched = [
        name
        for name, have, want in (
            ("seed", old.get("seed"), config.seed),
            ("noise", old.get("noise"), attrs["noise"]),
            ("policies (sha256)", _hashes(old.get("policies")), _hashes(attrs["policies"])),
        )
        if have != want
    ]
    if mismatched:
        raise StoreError(
            f"{path}: was collected with different {', '.join(mismatched)}; continuing it would mix settings "
            "(use the same --seed/--noise/--policy, or a new --store)"
        )


def resolve_policies(task: LeggedTask, policy: Sequence[Path] | None = None, mix: bool = False) -> tuple[Path, ...]:
    """The policy files of a collection: the named ones, plus the task's shipped checkpoints with ``mix``.

    Nothing named and no ``mix``: the task's shipped policy.
    """
    paths = [Path(p) for p in (policy or [])]
    if mix:
        if task.checkpoint_files is None:
            raise InputError(f"collect {task.name}: --mix needs training checkpoints, and this task ships none")
        paths += task.checkpoint_files()
        if task.policy_file not in paths:
            paths.append(task.policy_file)
    if not paths:
        if task.policy_file is None:
            raise InputError(f"collect {task.name}: the task has no policy; name one with --policy")
        paths = [task.policy_file]
    for p in paths:
        if not p.is_file():
            raise PolicyError(f"{p}: no such policy file")
    return tuple(p.resolve() for p in paths)


def _context() -> Any:
    """The start method of the workers: a fork server where there is one (never a fork of the parent,
    whose open files and threads a worker must not share), else spawn."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # the server imports the simulator once and every worker starts from it, instead of
    # each importing torch, gymnasium and MuJoCo again
    ctx.set_forkserver_preload([__name__])
    return ctx


class _Committer:
    """Finished episodes into the store, in episode order, in whole-episode batches.

    Workers finish episodes out of order; an episode is committed once every episode
    before it has been. A batch is written when ``every`` seconds have passed since the
    last commit (or it fills a zarr chunk), and on :meth:`commit` with ``force``.
    """

    def __init__(self, store: EpisodeStore, config: CollectConfig, every: float) -> None:
        self.store = store
        self.config = config
        self.every = every
        self.ready: dict[int, dict[str, np.ndarray]] = {}
        self.next = store.n_episodes  # the index of the next episode to commit
        self.last = time.monotonic()

    def commit(self, force: bool = False) -> None:
        batch = []
        while self.next + len(batch) in self.ready:
            batch.append(self.next + len(batch))
        rows = sum(self.ready[i]["reward"].shape[0] for i in batch)
        if not batch or not (force or rows >= DEFAULT_CHUNK_ROWS or time.monotonic() - self.last >= self.every):
            return
        episodes = [self.ready.pop(i) for i in batch]
        values = [
            {"reset_seed": episode_rng(self.config.seed, i)[0], "policy": i % len(self.config.policies),
             "return": float(ep["reward"].sum())}
            for i, ep in zip(batch, episodes)
        ]
        self.store.append_episodes(episodes, values)
        self.next += len(batch)
        self.last = time.monotonic()

    def kept(self) -> str:
        return f"{self.store.path} holds {self.store.n_episodes} committed episodes ({self.store.n_rows} transitions)"


def _collect(store: EpisodeStore, config: CollectConfig, episodes: int, envs: int, stop: StopSignals, bar: Any,
             commit_seconds: float) -> None:
    """Run episodes ``store.n_episodes .. episodes - 1`` in ``envs`` workers and commit them.

    On a stop signal, a worker that dies or an error, the finished episodes that can be
    committed in order are committed first; then :class:`CollectionStopped` (or the
    error) is raised.
    """
    committer = _Committer(store, config, commit_seconds)
    todo = iter(range(store.n_episodes, episodes))
    ctx = _context()
    workers: list[_Worker] = []
    dead: _Worker | None = None
    finished = False
    try:
        for number in range(min(envs, episodes - store.n_episodes)):
            workers.append(_Worker(ctx, config, number))
            if not workers[-1].give(next(todo)):
                dead = workers[-1]
                break
        while committer.next < episodes and stop.signum is None and dead is None:
            busy = {w.conn: w for w in workers if w.index is not None}
            for conn in wait(list(busy), timeout=POLL_SECONDS):
                worker = busy[conn]
                try:
                    index, episode, error = conn.recv()
                except (EOFError, OSError):  # the worker died: its pipe closed, maybe mid-message
                    dead = worker
                    break
                if error is not None:
                    raise error
                worker.index = None
                committer.ready[index] = episode
                bar.update(1)
                following = next(todo, None)
                if following is not None and not worker.give(following):
                    dead = worker
                    break
            # with every worker idle nothing more can come: commit now rather than wait for the interval
            committer.commit(force=all(w.index is None for w in workers))
        finished = committer.next == episodes
    finally:
        try:
            committer.commit(force=True)
        finally:
            for worker in workers:
                worker.stop(wait=finished)
    if finished:  # a signal that came with the last episode has nothing left to stop
        return
    # a stop signal first: the same SIGTERM may have ended a worker too (sent to the process group)
    stop.check(committer.kept())
    if dead is not None:
        raise CollectionStopped(
            f"worker process {dead.process.pid} {dead.death()} while running episode {dead.index}; "
            f"{committer.kept()}. Rerun the same command to continue.",
            1,
        )


def collect_legged(
    task: LeggedTask,
    store_path: str | Path,
    episodes: int,
    *,
    policies: Sequence[Path] | None = None,
    mix: bool = False,
    noise: float = 0.0,
    envs: int = 2,
    seed: int = 0,
    progress: bool = True,
    commit_seconds: float = COMMIT_SECONDS,
) -> dict[str, Any]:
    """Fill ``store_path`` up to ``episodes`` episodes with rollouts of ``task``'s policy.

    A store that exists is continued (same seed, noise and policies required).
    Episodes run in ``envs`` worker processes and are committed in order, whole
    episodes at a time, at most ``commit_seconds`` after they finish, so that a crash
    loses only those and the ones still running, and memory does not grow with
    ``episodes``. SIGTERM or SIGINT, or a worker that dies, commits what has finished
    and raises :class:`~gpdyn.sim.stopping.CollectionStopped`. Returns counts and timing.
    """
    from gpdyn.progress import progress_bar

    if episodes < 1:
        raise InputError(f"--episodes must be >= 1, got {episodes}")
    if envs < 1:
        raise InputError(f"--envs must be >= 1, got {envs}")
    if not np.isfinite(noise) or noise < 0:
        raise InputError(f"--noise must be a finite std >= 0, got {noise}")
    if not np.isfinite(commit_seconds) or commit_seconds < 0:
        raise InputError(f"--commit-seconds must be a finite time >= 0, got {commit_seconds}")
    config = CollectConfig(task=task, policies=resolve_policies(task, policies, mix), seed=int(seed), noise=float(noise))
    probe = task.make_env()
    try:  # fail in the parent, with the file named, before any worker starts
        for p in config.policies:
            load_policy(p, env=probe)
    finally:
        probe.close()
    t0 = time.perf_counter()
    with StopSignals() as stop:
        store = _open_or_create(Path(store_path), config)
        try:
            start, rows_before = store.n_episodes, store.n_rows
            if start < episodes:
                with progress_bar(total=episodes - start, unit="ep", desc=f"collect {task.name} ({envs} envs)",
                          disable=not progress) as bar:
                    _collect(store, config, episodes, envs, stop, bar, commit_seconds)
        finally:
            store.close()
    seconds = time.perf_counter() - t0
    rows = store.n_rows - rows_before
    return {
        "store": str(store.path),
        "episodes_before": start,
        "episodes_added": store.n_episodes - start,
        "episodes": store.n_episodes,
        "rows_added": rows,
        "rows": store.n_rows,
        "seconds": seconds,
        "steps_per_second": rows / seconds if seconds > 0 else float("nan"),
    }


def integration_errors(store: EpisodeStore, positions: slice = slice(1, None)) -> dict[str, dict[str, np.ndarray]]:
    """Error of recovering positions from velocities over one step, per position.

    For each transition, ``q_{t+1}`` is predicted from ``q_t`` and the velocities by the
    trapezoid rule ``q_t + dt/2 (v_t + v_{t+1})`` and, for comparison, by forward
    (``dt v_t``) and backward (``dt v_{t+1}``) Euler. Returns, per rule, the mean and
    max absolute error per position (default the positions ``qpos[1:]``).
    """
    dt = float(store.attrs["dt"])
    sums: dict[str, np.ndarray] = {}
    maxes: dict[str, np.ndarray] = {}
    n = 0
    for start in range(0, store.n_rows, DEFAULT_CHUNK_ROWS):
        stop = start + DEFAULT_CHUNK_ROWS
        q0, q1 = store.read("qpos", start, stop)[:, positions], store.read("next_qpos", start, stop)[:, positions]
        v0, v1 = store.read("qvel", start, stop)[:, positions], store.read("next_qvel", start, stop)[:, positions]
        for rule, pred in (
            ("trapezoid", q0 + 0.5 * dt * (v0 + v1)),
            ("forward_euler", q0 + dt * v0),
            ("backward_euler", q0 + dt * v1),
        ):
            err = np.abs(q1 - pred)
            sums[rule] = sums.get(rule, 0.0) + err.sum(axis=0)
            maxes[rule] = np.maximum(maxes.get(rule, 0.0), err.max(axis=0))
        n += q0.shape[0]
    if n == 0:
        raise StoreError(f"{store.path}: no transitions")
    return {rule: {"mean": sums[rule] / n, "max": maxes[rule]} for rule in sums}


__all__ = ["CollectConfig", "collect_legged", "episode_rng", "integration_errors", "legged_fields", "resolve_policies",
           "rollout", "source"]
