"""MuJoCo models and gymnasium environments of gpdyn.

Importing this package registers ``gpdyn/KukaIiwa-v0`` (KUKA LBR iiwa 14, torque
control; see :class:`envs.kuka.KukaIiwaEnv`), so that
``gymnasium.make("gpdyn/KukaIiwa-v0")`` works after ``import envs``.
"""

from __future__ import annotations

import gymnasium

KUKA_ENV_ID = "gpdyn/KukaIiwa-v0"

if KUKA_ENV_ID not in gymnasium.registry:
    gymnasium.register(
        id=KUKA_ENV_ID,
        entry_point="envs.kuka:KukaIiwaEnv",
        max_episode_steps=1000,  # 10 s at the default 100 Hz control rate
    )

__all__ = ["KUKA_ENV_ID"]
