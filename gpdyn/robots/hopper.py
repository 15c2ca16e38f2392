"""Hopper (MuJoCo, gymnasium ``Hopper-v5``): the :data:`HOPPER` task.

A one-legged planar hopper: qpos ``[rootx, rootz, rooty, thigh, leg, foot]`` (6), three
motors, the control step 0.008 s (timestep 0.002 x frame skip 4). Reward and termination
of ``hopper_v5.py``: healthy while the torso is above 0.7 m, its pitch in (-0.2, 0.2) and
every value of ``state[2:]`` in (-100, 100). Problems ``hopper-1`` (inputs ``[qpos[1:], qvel,
action]``, 14, the next qvel, 6) and ``hopper-2``. Plant changes as every legged task's
(:func:`gpdyn.robots.legged.legged_changes`), the weak motor being the thigh's. The shipped
TRPO policy (``HOPPER.policy_file``) was trained by ``scripts/train_policy.py --env Hopper-v5``.
"""

from __future__ import annotations

import functools
import math

from gpdyn.robots.legged import POLICY_DIR, legged_task, shipped_checkpoints
from gpdyn.robots.task import register_task

ENV_ID = "Hopper-v5"

HOPPER = register_task(legged_task(
    "hopper", ENV_ID, ("rootx", "rootz", "rooty", "thigh", "leg", "foot"), nu=3, healthy_z=(0.7, math.inf),
    healthy_angle=(-0.2, 0.2), healthy_state=100.0, feet=("foot_geom",), motor=(0, "thigh"), spring_joint="leg_joint",
    policy_file=POLICY_DIR / "hopper_trpo.pt", checkpoint_files=functools.partial(shipped_checkpoints, "hopper_trpo"),
    description="a one-legged planar hopper (gymnasium Hopper-v5) and its TRPO policy"))

__all__ = ["ENV_ID", "HOPPER"]
