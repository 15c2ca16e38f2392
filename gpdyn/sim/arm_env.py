"""Gymnasium environment of any arm (default the KUKA LBR iiwa 14) under joint-torque control.

The plant is :meth:`ArmModel.torque_model <gpdyn.robots.arm.ArmModel.torque_model>` of
the arm: its MJCF model with every actuator a direct joint-torque source. One
environment step holds the commanded torques for ``frame_skip`` simulation steps
(default: as many as make a 100 Hz control rate; 10 for the iiwa's 1 ms steps). The
task is tracking the rhythmic reference motion of a gpdyn trajectory family (see
:mod:`gpdyn.sim.arm`): the reward is minus the squared joint-position error after
the step, and ``info`` carries the reference (q, qd, qdd) at the new time so that a
computed-torque controller can use it. The payload can change mid-run
(:meth:`ArmEnv.set_payload`).

Observation: ``[q (n), qd (n)]`` in rad and rad/s. Action: joint torques in N m, in
joint order, inside the arm's torque limits (MuJoCo clamps commands to them).
``gymnasium.make("gpdyn/KukaIiwa-v0")`` gives the iiwa.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import mujoco
import numpy as np
from gymnasium import spaces
from gymnasium.envs.mujoco.mujoco_env import MujocoEnv

from gpdyn.errors import InputError
from gpdyn.robots.arm import DEFAULT_PAYLOAD_OFFSET, ArmModel
from gpdyn.robots.kuka import ENV_ID, kuka_arm
from gpdyn.sim.arm import DEFAULT_RATE_HZ, get_family


class ArmEnv(MujocoEnv):
    """An arm under torque control tracking a seeded rhythmic reference (default arm: the iiwa 14)."""

    metadata = {"render_modes": ["human", "rgb_array", "depth_array"], "render_fps": 100}

    def __init__(
        self,
        arm: ArmModel | None = None,
        frame_skip: int | None = None,
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
        self.arm = arm if arm is not None else kuka_arm()
        frame_skip = self.arm.steps_per_sample(DEFAULT_RATE_HZ) if frame_skip is None else int(frame_skip)
        if frame_skip < 1:
            raise InputError(f"{self.arm.path}: frame_skip must be >= 1 simulation step per control step, got {frame_skip}")
        self._payload = (float(payload_kg), tuple(float(v) for v in payload_offset))
        # the fps check of MujocoEnv must match this instance's control rate
        self.metadata = {**type(self).metadata, "render_fps": int(round(1.0 / (self.arm.timestep * frame_skip)))}
        n = self.arm.n
        observation_space = spaces.Box(low=-np.inf, high=np.inf, shape=(2 * n,), dtype=np.float64)
        # the model's first camera (the iiwa's "side"), else MuJoCo's free camera
        camera_id = 0 if self.arm.model.ncam and render_mode in ("rgb_array", "depth_array") else None
        super().__init__(
            str(self.arm.path.resolve()),
            frame_skip,
            observation_space,
            render_mode=render_mode,
            width=width,
            height=height,
            camera_id=camera_id,
            **kwargs,
        )
        self.speed = float(speed)
        self.reset_noise_scale = float(reset_noise_scale)
        self.pattern = get_family(family).pattern(pattern_seed, self.arm.limits)

    def _initialize_simulation(self) -> tuple[mujoco.MjModel, mujoco.MjData]:
        model = self.arm.torque_model(*self._payload)
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, self.width)
        model.vis.global_.offheight = max(model.vis.global_.offheight, self.height)
        return model, mujoco.MjData(model)

    def _set_action_space(self) -> spaces.Box:
        low, high = self.arm.limits.torque.T
        self.action_space = spaces.Box(low=low, high=high, dtype=np.float64)
        return self.action_space

    def set_payload(self, payload_kg: float, payload_offset: Sequence[float] = DEFAULT_PAYLOAD_OFFSET) -> None:
        """Change the payload; effective from the next step (a plant change)."""
        self.arm.set_payload(self.model, payload_kg, payload_offset)

    def add_joint_friction(self, coulomb: Sequence[float], viscous: Sequence[float]) -> None:
        """Add dry (Coulomb, N m) and viscous (N m s/rad) friction to each arm joint; effective from the next
        step (a plant change: worn gears, a cold joint). MuJoCo's ``frictionloss`` and ``damping`` of the dofs."""
        coulomb, viscous = (np.asarray(a, dtype=np.float64) for a in (coulomb, viscous))
        n = self.arm.n
        if coulomb.shape != (n,) or viscous.shape != (n,) or not (np.isfinite(coulomb).all() and np.isfinite(viscous).all()):
            raise InputError(f"{self.arm.path.name}: joint friction needs two finite [{n}] vectors, "
                             f"got {coulomb.shape}, {viscous.shape}")
        if (coulomb < 0).any() or (viscous < 0).any():
            raise InputError(f"{self.arm.path.name}: added joint friction must be >= 0, got {coulomb}, {viscous}")
        dofs = self.model.jnt_dofadr[: n]  # the arm's joints are the model's first n (ArmModel)
        self.model.dof_frictionloss[dofs] += coulomb
        self.model.dof_damping[dofs] += viscous

    def add_joint_spring(self, stiffness: Sequence[float], rest: Sequence[float]) -> None:
        """Add a torsion spring to each arm joint, ``-stiffness (q - rest)`` (N m/rad, rad); effective from the next
        step (a plant change: a cable harness, a spring balancer). MuJoCo's joint ``stiffness`` and ``springref``:
        a passive torque of the joint's position, which the rigid-body regressor (inertia, armature, damping,
        friction) has no column for."""
        stiffness, rest = (np.asarray(a, dtype=np.float64) for a in (stiffness, rest))
        n = self.arm.n
        if stiffness.shape != (n,) or rest.shape != (n,) or not (np.isfinite(stiffness).all() and np.isfinite(rest).all()):
            raise InputError(f"{self.arm.path.name}: a joint spring needs two finite [{n}] vectors, "
                             f"got {stiffness.shape}, {rest.shape}")
        if (stiffness < 0).any():
            raise InputError(f"{self.arm.path.name}: added joint spring stiffness must be >= 0, got {stiffness}")
        self.model.jnt_stiffness[:n] += stiffness
        self.model.qpos_spring[self.model.jnt_qposadr[:n]] = rest

    def scale_motor_gain(self, gain: float) -> None:
        """Scale the strength of every arm actuator (its gear: force = gain x command); effective from the next
        step (a plant change: a weaker motor or amplifier)."""
        if not (np.isfinite(gain) and gain > 0):
            raise InputError(f"{self.arm.path.name}: the motor gain factor must be finite and > 0, got {gain}")
        self.model.actuator_gear[self.arm.actuator_of_joint, 0] *= gain

    def reference(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Reference q, qd, qdd [n] at time ``t`` (s)."""
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
        ctrl = np.zeros(self.model.nu)
        ctrl[self.arm.actuator_of_joint] = np.asarray(action, dtype=np.float64)
        self.do_simulation(ctrl, self.frame_skip)
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
    gymnasium.register(id=ENV_ID, entry_point="gpdyn.sim.arm_env:ArmEnv",
                       max_episode_steps=1000)  # 10 s at the default 100 Hz control rate

__all__ = ["ArmEnv"]
