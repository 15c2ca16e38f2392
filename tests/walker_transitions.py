"""Executed Walker2d transitions of a (changed) plant, the learned walker models' test data."""

from __future__ import annotations

import numpy as np

from gpdyn.experiments.walk_learned_model import plant


def transitions(change: str, factor: float | None, steps: int, seed: int) -> list[tuple[np.ndarray, ...]]:
    """``(qpos, qvel, controls [2, 6], next_qvel)`` of planning steps of the (changed) plant under smooth random actions."""
    env, _ = plant(change, factor)
    env.reset(seed=seed)
    data, rng = env.unwrapped.data, np.random.default_rng(seed)
    base = 0.3 * rng.standard_normal(6)
    out = []
    for _ in range(steps):
        q, v = data.qpos.copy(), data.qvel.copy()
        controls = np.clip(base + 0.5 * rng.standard_normal((2, 6)), -1, 1)
        for a in controls:
            env.step(a)
        out.append((q, v, controls, data.qvel.copy()))
        base = 0.9 * base + 0.1 * rng.standard_normal(6)
    env.close()
    return out
