"""Walker2d (MuJoCo, gymnasium ``Walker2d-v5``): the :data:`WALKER` task and its constants.

- the model: :data:`ENV_ID`, :data:`NQ`/:data:`NV`/:data:`NU`, the control step :data:`DT`
  (timestep 0.002 x :data:`FRAME_SKIP` 4), the joint names :data:`QPOS_NAMES`;
- the planning state ``s = [qpos (9), qvel (9)]`` (raw simulator state, x position included
  so that the forward reward can be computed) and the ``walker-1`` feature layout
  :data:`LAYOUT` (``[qpos[1:], qvel, action]``: :data:`QVEL_INPUTS`, :data:`ACTION_INPUTS`)
  that :class:`gpdyn.control.dynamics.LearnedDynamics` integrates by the trapezoid rule;
- the reward and termination of ``walker2d_v5.py`` (z in (0.8, 2), torso angle in (-1, 1)):
  ``WALKER.cost()``, a :class:`~gpdyn.robots.legged.LeggedCost`;
- plant changes (``WALKER.plant_changes``): torso mass +30 %, foot friction halved, right hip
  motor at half strength, a spring-damper at the right knee;
- the shipped TRPO policy (``WALKER.policy_file``) and its training checkpoints.
"""

from __future__ import annotations

import functools

from gpdyn.robots.legged import POLICY_DIR, legged_task, shipped_checkpoints
from gpdyn.robots.task import register_task

ENV_ID = "Walker2d-v5"
QPOS_NAMES = ("rootx", "rootz", "rooty", "thigh", "leg", "foot", "thigh_left", "leg_left", "foot_left")


WALKER = register_task(legged_task(
    "walker", ENV_ID, QPOS_NAMES, nu=6, healthy_z=(0.8, 2.0), healthy_angle=(-1.0, 1.0), healthy_state=None,
    feet=("foot_geom", "foot_left_geom"), motor=(0, "right hip"), spring_joint="leg_joint",
    policy_file=POLICY_DIR / "walker2d_trpo.pt",
    checkpoint_files=functools.partial(shipped_checkpoints, "walker2d_trpo"),
    description="a two-legged planar walker (gymnasium Walker2d-v5) and its TRPO policy"))

LAYOUT = WALKER.layout
NQ, NV, NU = LAYOUT.nq, LAYOUT.nv, LAYOUT.nu
NX = LAYOUT.nx
NOBS = WALKER.nobs  # qpos[1:] and qvel
FRAME_SKIP = WALKER.frame_skip
DT = LAYOUT.dt  # Walker2d-v5: timestep 0.002 x frame_skip 4
QVEL_INPUTS = LAYOUT.velocity_inputs  # qvel's columns in the walker-1 input
ACTION_INPUTS = LAYOUT.action_inputs  # the action's columns in the walker-1 input
make_env = WALKER.make_env

__all__ = ["ACTION_INPUTS", "DT", "ENV_ID", "FRAME_SKIP", "LAYOUT", "NOBS", "NQ", "NU", "NV", "NX",
           "QPOS_NAMES", "QVEL_INPUTS", "WALKER", "make_env"]
