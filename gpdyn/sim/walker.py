"""Walker2d rollouts of a TRPO policy into an episode store (``gpdyn collect walker``).

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
import multiprocessing as mp
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpdyn.data.store import DEFAULT_CHUNK_ROWS, EpisodeStore, FieldSpec, StoreError, numbered_columns
from gpdyn.errors import InputError
from gpdyn.robots.walker import ENV_ID, FRAME_SKIP, NOBS, NQ, NU, OBS_CLIP, QPOS_NAMES, make_env
from gpdyn.sim.policy import SHIPPED_POLICY, PolicyError, WalkerPolicy, load_policy, shipped_checkpoints

SOURCE = "walker-trpo"


def walker_fields() -> dict[str, FieldSpec]:
    """The per-step fields of a Walker2d store."""
    qvel_names = tuple(f"d{n}" for n in QPOS_NAMES)
    return {
        "qpos": FieldSpec(QPOS_NAMES, unit="m or rad"),
        "qvel": FieldSpec(qvel_names, unit="m/s or rad/s"),
        "obs": FieldSpec(numbered_columns("obs", NOBS), unit=f"observation (qpos[1:], clip(qvel, ±{OBS_CLIP:g}))"),
        "action": FieldSpec(numbered_columns("u", NU), unit="normalised control in [-1, 1] (gear 100)"),
        "reward": FieldSpec(("reward",)),
        "terminated": FieldSpec(("terminated",), dtype="bool"),
        "truncated": FieldSpec(("truncated",), dtype="bool"),
        "next_qpos": FieldSpec(QPOS_NAMES, unit="m or rad"),
        "next_qvel": FieldSpec(qvel_names, unit="m/s or rad/s"),
    }


EPISODE_KEYS = {"reset_seed": "int64", "policy": "int64", "return": "float64"}


@dataclass(frozen=True)
class CollectConfig:
    """What decides the data of every episode; stored in the store's attributes."""

    policies: tuple[Path, ...]
    seed: int = 0
    noise: float = 0.0
    env_id: str = ENV_ID


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def episode_rng(seed: int, index: int) -> tuple[int, np.random.Generator]:
    """The reset seed and action-noise generator of episode ``index`` of a ``seed`` collection."""
    rng = np.random.default_rng([seed, index])
    return int(rng.integers(2**31 - 1)), rng


def rollout(env: Any, policy: WalkerPolicy, reset_seed: int, noise: float = 0.0, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
    """One episode as a dict of per-step arrays (the fields of :func:`walker_fields`).

    The action is the policy's deterministic action plus ``N(0, noise²)`` noise,
    clipped to the action box: the stored action is the control the simulator applied.
    """
    if noise and rng is None:
        raise InputError("rollout: noise needs a random generator")
    sim = env.unwrapped
    data = sim.data
    horizon = env.spec.max_episode_steps or 1000
    out = {
        "qpos": np.empty((horizon, sim.model.nq)),
        "qvel": np.empty((horizon, sim.model.nv)),
        "obs": np.empty((horizon,) + env.observation_space.shape),
        "action": np.empty((horizon,) + env.action_space.shape),
        "reward": np.empty((horizon, 1)),
        "terminated": np.zeros((horizon, 1), dtype=bool),
        "truncated": np.zeros((horizon, 1), dtype=bool),
        "next_qpos": np.empty((horizon, sim.model.nq)),
        "next_qvel": np.empty((horizon, sim.model.nv)),
    }
    low, high = env.action_space.low, env.action_space.high
    obs, _ = env.reset(seed=reset_seed)
    t = 0
    while True:
        out["qpos"][t] = data.qpos
        out["qvel"][t] = data.qvel
        out["obs"][t] = obs
        action = policy.act(obs)
        if noise:
            action = np.clip(action + noise * rng.standard_normal(action.shape), low, high)
        out["action"][t] = action
        obs, reward, terminated, truncated, _ = env.step(action)
        out["reward"][t] = reward
        out["terminated"][t] = terminated
        out["truncated"][t] = truncated
        out["next_qpos"][t] = data.qpos
        out["next_qvel"][t] = data.qvel
        t += 1
        if terminated or truncated:
            break
    return {k: v[:t] for k, v in out.items()}


# ---------------------------------------------------------------- worker processes
_WORKER: dict[str, Any] = {}


def _init_worker(config: CollectConfig) -> None:
    import signal

    import torch

    # Ctrl-C is the parent's to handle (it keeps the finished episodes and terminates
    # the pool); a worker killed by it while holding the task queue lock would hang the pool
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)  # one process per core; more threads only contend
    _WORKER["env"] = make_env(config.env_id)
    _WORKER["policies"] = [load_policy(p) for p in config.policies]
    _WORKER["config"] = config


def _run_episode(index: int) -> tuple[int, dict[str, np.ndarray]]:
    config: CollectConfig = _WORKER["config"]
    policies = _WORKER["policies"]
    reset_seed, rng = episode_rng(config.seed, index)
    policy_index = index % len(policies)
    episode = rollout(_WORKER["env"], policies[policy_index], reset_seed, config.noise, rng)
    return index, episode


# ---------------------------------------------------------------- collection
def _config_attrs(config: CollectConfig) -> dict[str, Any]:
    return {
        "collector": "gpdyn collect walker",
        "noise": config.noise,
        "policies": [
            {"file": str(p), "name": p.name, "sha256": _sha256(p), "timesteps": load_policy(p).meta.get("timesteps")}
            for p in config.policies
        ],
        "frame_skip": FRAME_SKIP,
        "row": "transition t -> t+1: state, obs and action at t, reward and state after the step",
    }


def _open_or_create(path: Path, config: CollectConfig) -> EpisodeStore:
    """Create the store, or reopen it and check it was collected with the same settings."""
    attrs = _config_attrs(config)
    if not path.exists():
        env = make_env(config.env_id)
        try:
            dt = float(env.unwrapped.dt)
        finally:
            env.close()
        return EpisodeStore.create(
            path, walker_fields(), source=SOURCE, env_id=config.env_id, dt=dt, seed=config.seed,
            episode_keys=EPISODE_KEYS, extra_attrs=attrs,
        )
    store = EpisodeStore.open(path, mode="a")
    old = store.attrs
    if old.get("source") != SOURCE or old.get("env_id") != config.env_id:
        raise StoreError(f"{path}: holds {old.get('source')}/{old.get('env_id')} data, not {SOURCE}/{config.env_id}")
    mismatched = [
        name
        for name, have, want in (
            ("seed", old.get("seed"), config.seed),
            ("noise", old.get("noise"), attrs["noise"]),
            ("policies (sha256)", [p["sha256"] for p in old.get("policies", [])], [p["sha256"] for p in attrs["policies"]]),
        )
        if have != want
    ]
    if mismatched:
        raise StoreError(
            f"{path}: was collected with different {', '.join(mismatched)}; continuing it would mix settings "
            "(use the same --seed/--noise/--policy, or a new --store)"
        )
    return store


def resolve_policies(policy: Sequence[Path] | None = None, mix: bool = False) -> tuple[Path, ...]:
    """The policy files of a collection: the named ones, plus the shipped checkpoints with ``mix``.

    Nothing named and no ``mix``: the shipped policy.
    """
    paths = [Path(p) for p in (policy or [])]
    if mix:
        paths += shipped_checkpoints()
        if SHIPPED_POLICY not in paths:
            paths.append(SHIPPED_POLICY)
    if not paths:
        paths = [SHIPPED_POLICY]
    for p in paths:
        if not p.is_file():
            raise PolicyError(f"{p}: no such policy file")
    return tuple(p.resolve() for p in paths)


def collect_walker(
    store_path: str | Path,
    episodes: int,
    *,
    policies: Sequence[Path] | None = None,
    mix: bool = False,
    noise: float = 0.0,
    envs: int = 2,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Fill ``store_path`` up to ``episodes`` episodes with Walker2d rollouts.

    A store that exists is continued (same seed, noise and policies required).
    Episodes run in ``envs`` worker processes and are written in order, in buffered
    batches of about one zarr chunk, so memory does not grow with ``episodes``.
    Returns counts and timing.
    """
    from tqdm import tqdm

    if episodes < 1:
        raise InputError(f"--episodes must be >= 1, got {episodes}")
    if envs < 1:
        raise InputError(f"--envs must be >= 1, got {envs}")
    if not np.isfinite(noise) or noise < 0:
        raise InputError(f"--noise must be a finite std >= 0, got {noise}")
    config = CollectConfig(policies=resolve_policies(policies, mix), seed=int(seed), noise=float(noise))
    probe = make_env(config.env_id)
    try:  # fail in the parent, with the file named, before any worker starts
        for p in config.policies:
            load_policy(p, env=probe)
    finally:
        probe.close()
    store = _open_or_create(Path(store_path), config)
    start = store.n_episodes
    todo = range(start, episodes)
    t0 = time.perf_counter()
    rows = 0
    buffer: list[dict[str, np.ndarray]] = []
    values: list[dict[str, Any]] = []

    def flush() -> None:
        if buffer:
            store.append_episodes(buffer, values)
            buffer.clear()
            values.clear()

    if len(todo):
        ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
        bar = tqdm(total=len(todo), unit="ep", desc=f"collect walker ({envs} envs)", disable=not progress)
        buffered_rows = 0
        try:
            with ctx.Pool(min(envs, len(todo)), initializer=_init_worker, initargs=(config,)) as pool:
                for index, episode in pool.imap(_run_episode, todo):
                    n = episode["reward"].shape[0]
                    buffer.append(episode)
                    values.append(
                        {"reset_seed": episode_rng(config.seed, index)[0], "policy": index % len(config.policies),
                         "return": float(episode["reward"].sum())}
                    )
                    buffered_rows += n
                    rows += n
                    if buffered_rows >= DEFAULT_CHUNK_ROWS:
                        flush()
                        buffered_rows = 0
                    bar.update(1)
                    bar.set_postfix(steps=rows, refresh=False)
        finally:
            flush()  # whole episodes collected before an interruption are kept
            bar.close()
    seconds = time.perf_counter() - t0
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


def integration_errors(store: EpisodeStore, positions: slice = slice(1, NQ)) -> dict[str, dict[str, np.ndarray]]:
    """Error of recovering positions from velocities over one step, per position.

    For each transition, ``q_{t+1}`` is predicted from ``q_t`` and the velocities by the
    trapezoid rule ``q_t + dt/2 (v_t + v_{t+1})`` and, for comparison, by forward
    (``dt v_t``) and backward (``dt v_{t+1}``) Euler. Returns, per rule, the mean and
    max absolute error per position (default the 8 positions ``qpos[1:]``).
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


__all__ = [
    "CollectConfig",
    "collect_walker",
    "episode_rng",
    "integration_errors",
    "resolve_policies",
    "rollout",
    "walker_fields",
]
