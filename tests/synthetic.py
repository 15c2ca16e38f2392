"""Small stores with the walker and KUKA schemas, filled with seeded random data."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpdyn.data.store import EpisodeStore, FieldSpec, numbered_columns

WALKER_FIELDS = {
    "qpos": FieldSpec(numbered_columns("qpos", 9), "float64", "m|rad"),
    "qvel": FieldSpec(numbered_columns("qvel", 9), "float64", "m/s|rad/s"),
    "action": FieldSpec(numbered_columns("a", 6), "float32", "1"),
    "done": FieldSpec(("terminated",), "bool", ""),
}


def random_walker_episode(rng: np.random.Generator, length: int) -> dict[str, np.ndarray]:
    return {
        "qpos": rng.normal(size=(length, 9)),
        "qvel": rng.normal(size=(length, 9)),
        "action": rng.uniform(-1, 1, size=(length, 6)).astype(np.float32),
        "done": np.zeros((length, 1), dtype=bool),
    }


def make_walker_store(path: Path, lengths: list[int], seed: int = 0) -> EpisodeStore:
    rng = np.random.default_rng(seed)
    store = EpisodeStore.create(
        path, WALKER_FIELDS, source="test", env_id="Walker2d-v5", dt=0.008, seed=seed, episode_keys={"seed": "int64"}
    )
    store.append_episodes([random_walker_episode(rng, n) for n in lengths], [{"seed": i} for i in range(len(lengths))])
    return store


def make_kuka_store(
    path: Path, offline: list[int], online: list[int], seed: int = 0, n_joints: int = 7, widths: dict[str, int] | None = None
) -> EpisodeStore:
    """An arm store of ``n_joints`` joints (``widths`` overrides a field's width, to make a broken one)."""
    rng = np.random.default_rng(seed)
    width = {name: n_joints for name in ("q", "qd", "qdd", "tau")} | (widths or {})
    fields = {name: FieldSpec(numbered_columns(name, w), "float64", "") for name, w in width.items()}
    store = EpisodeStore.create(
        path, fields, source="test", env_id="kuka", dt=0.01, seed=seed, episode_keys={"online": "int8"}
    )
    episodes = [{k: rng.normal(size=(n, w)) for k, w in width.items()} for n in offline + online]
    store.append_episodes(episodes, [{"online": 0}] * len(offline) + [{"online": 1}] * len(online))
    return store
