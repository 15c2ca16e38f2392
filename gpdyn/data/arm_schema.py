"""The store schema of KUKA-style inverse-dynamics data (simulated or imported).

One home for the contract the ``kuka`` regression problem reads: fields ``q``,
``qd``, ``qdd``, ``tau`` (7 columns each, float64) and the per-episode key
``online`` (int8: 0 = offline part, 1 = online part; episodes in time order).
"""

from __future__ import annotations

from gpdyn.data.store import FieldSpec, numbered_columns

N_JOINTS = 7
KUKA_FIELD_NAMES = ("q", "qd", "qdd", "tau")
OFFLINE, ONLINE = 0, 1


def kuka_fields(tau_unit: str = "N m") -> dict[str, FieldSpec]:
    """Field specs of a KUKA store; ``tau_unit`` differs for scaled imported files."""
    units = {"q": "rad", "qd": "rad/s", "qdd": "rad/s^2", "tau": tau_unit}
    return {name: FieldSpec(numbered_columns(name, N_JOINTS), "float64", units[name]) for name in KUKA_FIELD_NAMES}


def kuka_episode_keys(**extra: str) -> dict[str, str]:
    """Per-episode keys: ``online`` (int8) plus any ``extra`` name -> dtype."""
    return {"online": "int8", **extra}


__all__ = ["N_JOINTS", "KUKA_FIELD_NAMES", "OFFLINE", "ONLINE", "kuka_fields", "kuka_episode_keys"]
