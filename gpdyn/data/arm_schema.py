"""The store schema of arm inverse-dynamics data (simulated from any MJCF arm, or imported).

One home for the contract the ``arm`` and ``kuka`` regression problems read: fields
``q``, ``qd``, ``qdd``, ``tau`` (n columns each, one per joint, float64) and the
per-episode key ``online`` (int8: 0 = offline part, 1 = online part; episodes in time
order). ``tau`` is the generalised force on each joint (what ``mj_inverse`` returns),
not the actuator command: the two differ by the gear ratio.
"""

from __future__ import annotations

from gpdyn.data.store import FieldSpec, numbered_columns
from gpdyn.errors import InputError

ARM_FIELD_NAMES = ("q", "qd", "qdd", "tau")
OFFLINE, ONLINE = 0, 1


def arm_fields(n_joints: int, tau_unit: str = "N m") -> dict[str, FieldSpec]:
    """Field specs of an arm store with ``n_joints`` joints; ``tau_unit`` differs for scaled imported files."""
    if int(n_joints) < 1:
        raise InputError(f"an arm store needs at least one joint, got {n_joints}")
    units = {"q": "rad", "qd": "rad/s", "qdd": "rad/s^2", "tau": tau_unit}
    return {name: FieldSpec(numbered_columns(name, int(n_joints)), "float64", units[name]) for name in ARM_FIELD_NAMES}


def arm_episode_keys(**extra: str) -> dict[str, str]:
    """Per-episode keys: ``online`` (int8) plus any ``extra`` name -> dtype."""
    return {"online": "int8", **extra}


__all__ = ["ARM_FIELD_NAMES", "OFFLINE", "ONLINE", "arm_episode_keys", "arm_fields"]
