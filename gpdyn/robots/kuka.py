"""The KUKA LBR iiwa 14, gpdyn's default arm.

The model is the shipped MJCF ``gpdyn/robots/assets/kuka_iiwa.xml``: MuJoCo Menagerie's
and Drake's public iiwa 14 rigid body (link masses, centres of mass, diagonal
inertias, joint ranges, torque limits 320, 320, 176, 176, 110, 40, 40 N m). What the
file adds beyond the rigid body are *estimates*, not identified values: joint damping
(0.5 N m s/rad on every joint), rotor armature (0.1 to 0.02 kg m^2) and dry friction
(0.5 to 0.1 N m), round numbers of the right order for a harmonic-drive arm, so that
the data has the non-rigid-body terms a learner must capture. Joint 7's torque on
slow motions is almost entirely these guessed terms. They are options here
(:func:`kuka_arm`, ``gpdyn collect kuka --damping/--armature/--friction``); by default
the file's values are kept.

The velocity limits (1.484 to 2.356 rad/s) are the published ones; MJCF has no such
property, so they live here and bound the trajectories.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from gpdyn.robots.arm import ArmModel

ENV_ID = "gpdyn/KukaIiwa-v0"  # registered with gymnasium by gpdyn.sim.arm_env
VELOCITY_LIMITS = (1.484, 1.484, 1.745, 1.309, 2.269, 2.356, 2.356)  # rad/s, iiwa 14 data sheet
CAMERA = "side"  # the file's camera for rendering


def model_path() -> Path:
    """The shipped iiwa MJCF file (package data of :mod:`gpdyn.robots`)."""
    return Path(str(resources.files("gpdyn.robots").joinpath("assets", "kuka_iiwa.xml")))


def kuka_arm(
    *,
    damping: float | Sequence[float] | None = None,
    armature: float | Sequence[float] | None = None,
    friction: float | Sequence[float] | None = None,
) -> ArmModel:
    """The iiwa 14 as an :class:`ArmModel`; each estimate (one value or seven) replaces the file's when given."""
    return ArmModel(model_path(), velocity_limits=VELOCITY_LIMITS, payload_body="payload", damping=damping,
                    armature=armature, friction=friction, env_id=ENV_ID)


__all__ = ["CAMERA", "ENV_ID", "VELOCITY_LIMITS", "kuka_arm", "model_path"]
