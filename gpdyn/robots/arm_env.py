"""Gymnasium environment of the KUKA LBR iiwa 14 arm under joint-torque control.

The plant is ``gpdyn/robots/assets/kuka_iiwa.xml`` (1 ms Euler steps, implicit joint damping);
one environment step holds the commanded torques for ``frame_skip`` simulation
steps (default 10: a 100 Hz control rate). The task is tracking the rhythmic
reference motion of a gpdyn trajectory family (see :mod:`gpdyn.sim.kuka`): the
reward is minus the squared joint-position error after the step, and ``info``
carries the reference (q, qd, qdd) at the new time so that a computed-torque
controller can use it. The payload at the flange can change mid-run
(:meth:`KukaIiwaEnv.set_payload`).

Observation: ``[q (7), qd (7)]`` in rad and rad/s. Action: joint torques in N m,
inside the iiwa torque limits (MuJoCo clamps commands to them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np
import gymnasium
from gymnasium import spaces
from gymnasium.envs.mujoco.mujoco_env import MujocoEnv

from gpdyn.sim.kuka import (
    DEFAULT_PAYLOAD_OFFSET,
    ENV_ID,
    get_family,
    load_model,
    model_limits,
    model_path,
    set_payload,
)


class KukaIiwaEnv(MujocoEnv):
    """KUKA iiwa 14, torque control, tracking a seeded rhythmic reference."""

    metadata = {"render_modes": ["human", "rgb_array", "depth_array"], "render_fps": 100}

    def __init__(
        self,
        frame_skip: int = 10,
        family: str = "kuka1",
        speed: float = 1.0,
        pattern_seed: int = 0,
        payload_kg: float = 0.0,
        payload_offset: Sequence[float] = DEFAULT_PAYLOAD_OFFSET,
        reset_noise_scale: float = 0.01,
        render_mode: str | None = None,
        width: int = 480,
        height: int = 480,
        **kwargs: Any,
    ) -> None:
        self._payload = (float(payload_kg), tuple(float(v) for v in payload_offset))
        # the fps check of MujocoEnv must match this instance's control rate
        self.metadata = {**type(self).metadata, "render_fps": int(round(1.0 / (0.001 * frame_skip)))}
        observation_space = spaces.Box(low=-np.inf, high=np.inf, shape=(14,), dtype=np.float64)
        super().__init__(
            str(model_path()),
            frame_skip,
            observation_space,
            render_mode=render_mode,
            width=width,
            height=height,
            camera_name="side" if render_mode in ("rgb_array", "depth_array") else None,
            **kwargs,
        )
        self.speed = float(speed)
        self.reset_noise_scale = float(reset_noise_scale)
        self.pattern = get_family(family).pattern(pattern_seed, model_limits(self.model))

    def _initialize_simulation(self) -> tuple[mujoco.MjModel, mujoco.MjData]:
        model = load_model(*self._payload)
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, self.width)
        model.vis.global_.offheight = max(model.vis.global_.offheight, self.height)
        return model, mujoco.MjData(model)

    def set_payload(self, payload_kg: float, payload_offset: Sequence[float] = DEFAULT_PAYLOAD_OFFSET) -> None:
        """Change the flange payload; effective from the next step (a plant change)."""
        set_payload(self.model, payload_kg, payload_offset)

    def reference(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Reference q, qd, qdd [7] at time ``t`` (s)."""
        q, qd, qdd = self.pattern.evaluate(np.array([t]), self.speed)
        return q[0], qd[0], qdd[0]

    def _get_obs(self) -> np.ndarray:
        return np.concatenate([self.data.qpos, self.data.qvel]).astype(np.float64)

    def _info(self) -> dict[str, Any]:
        q_ref, qd_ref, qdd_ref = self.reference(self.data.time)
        return {
            "t": float(self.data.time),
            "q_ref": q_ref,
            "qd_ref": qd_ref,
            "qdd_ref": qdd_ref,
            "tracking_error": float(np.linalg.norm(self.data.qpos - q_ref)),
        }

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.do_simulation(np.asarray(action, dtype=np.float64), self.frame_skip)
        info = self._info()
        reward = -info["tracking_error"] ** 2
        if self.render_mode == "human":
            self.render()
        return self._get_obs(), reward, False, False, info

    def reset_model(self) -> np.ndarray:
        q_ref, qd_ref, _ = self.reference(0.0)
        noise = self.reset_noise_scale
        qpos = q_ref + self.np_random.uniform(-noise, noise, size=self.model.nq)
        qvel = qd_ref + self.np_random.uniform(-noise, noise, size=self.model.nv)
        self.set_state(qpos, qvel)
        return self._get_obs()

    def _get_reset_info(self) -> dict[str, Any]:
        return self._info()


if ENV_ID not in gymnasium.registry:  # gymnasium.make("gpdyn/KukaIiwa-v0") after importing this module
    gymnasium.register(id=ENV_ID, entry_point="gpdyn.robots.arm_env:KukaIiwaEnv",
                       max_episode_steps=1000)  # 10 s at the default 100 Hz control rate

__all__ = ["KukaIiwaEnv"]
