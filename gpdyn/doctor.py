"""`gpdyn doctor`: versions, devices, threads and a MuJoCo smoke check."""

from __future__ import annotations

import os
import platform

from gpdyn.data.store import package_versions


def report() -> dict[str, object]:
    """What this installation has: versions, devices, thread settings, MuJoCo rendering."""
    import torch

    from gpdyn.device import DEVICE_TYPES, dtype_name, resolve_dtype

    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    info: dict[str, object] = {
        "platform": platform.platform(),
        "versions": package_versions(),
        "torch build": f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})",
        "devices": devices,
        "default dtype": ", ".join(f"{d} {dtype_name(resolve_dtype(None, d))}" for d in DEVICE_TYPES),
        "torch threads": torch.get_num_threads(),
        "cpu cores": os.cpu_count(),
        "MUJOCO_GL": os.environ.get("MUJOCO_GL", "(unset: set MUJOCO_GL=egl for offscreen rendering)"),
    }
    try:
        import gymnasium as gym

        env = gym.make("Walker2d-v5")
        env.reset(seed=0)
        info["Walker2d-v5"] = f"ok (nq={env.unwrapped.model.nq}, dt={env.unwrapped.dt})"
        env.close()
    except Exception as err:  # report, don't crash: doctor exists to diagnose
        info["Walker2d-v5"] = f"FAILED: {type(err).__name__}: {err}"
    return info
