"""Planar legged robots of gymnasium's MuJoCo suite (Walker2d, Hopper, HalfCheetah): one task class.

Their environments share one structure: the state ``[qpos (nq), qvel (nv)]`` with qpos
``[rootx, rootz, rooty, joints...]``, the observation ``[qpos[1:], clip(qvel, +-obs_clip)]``
(Walker2d and Hopper clip at 10, HalfCheetah not at all), the reward
``forward_reward_weight * x_velocity + healthy_reward * healthy - ctrl_cost_weight |a|^2``
and termination when unhealthy (torso height and pitch out of range, for the Hopper also any
of ``state[2:]`` out of +-100; HalfCheetah never terminates and has no healthy reward), from
gymnasium's ``walker2d_v5.py``, ``hopper_v5.py`` and ``half_cheetah_v5.py``. A
:class:`LeggedTask` holds one robot's numbers; :mod:`gpdyn.robots.walker` and
:mod:`gpdyn.robots.hopper` each build and register one (``tests/test_task_api.py`` a HalfCheetah one).

- :class:`LeggedCost`: minus the reward of one step, and the termination (torch, the planners');
- :class:`NominalTrackingCost`: track the nominal plant under the policy (policy transfer);
- :class:`WalkingCost`: a shaped walking cost for the spline sampler (numpy);
- :class:`TorchPolicy`: the task's policy as a batched torch proposal for the planners;
- plant changes: torso mass, foot friction, one motor's strength, and a joint spring-damper
  (a change the mass/gear/friction parameters of the identified model cannot represent).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import mujoco
import numpy as np
import torch
from torch import Tensor

from gpdyn.errors import InputError
from gpdyn.robots.layout import StateLayout
from gpdyn.robots.task import PlantChange, Task, task_for_env

if TYPE_CHECKING:
    from gpdyn.robots.policy import Policy

OBS_CLIP = 10.0  # Walker2d's and Hopper's observation clips qvel to +-10 (LeggedTask.obs_clip's default)
#: the shipped policies and their training checkpoints (package data)
POLICY_DIR = Path(__file__).resolve().parents[1] / "policies"


def shipped_checkpoints(stem: str) -> list[Path]:
    """The committed training checkpoints ``checkpoints/<stem>_<steps>.pt``, earliest first (for a mix of gaits)."""
    folder = POLICY_DIR / "checkpoints"
    files = sorted(folder.glob(f"{stem}_*.pt"), key=lambda p: (len(p.stem), p.stem))
    if not files:
        raise InputError(f"{folder}: no checkpoint files {stem}_*.pt")
    return files
ACTION_LOW, ACTION_HIGH = -1.0, 1.0  # the action box of both (ctrlrange)


def make_gym_env(env_id: str, **kwargs: Any):
    """``gymnasium.make(env_id)``, for a task's own id only: ids that reach gpdyn from files (a
    store's attributes, a policy file) go through :func:`gpdyn.robots.task.task_for_env` first,
    because ``gymnasium.make("module:Name")`` imports ``module``, which would run code the file names."""
    import gymnasium as gym

    return gym.make(env_id, **kwargs)


def state_rows(env: Any) -> dict[str, np.ndarray]:
    """The raw simulator state of ``env`` (the observation clips qvel): the ``rows`` hook of
    :func:`gpdyn.sim.loop.run_episode`, with ``next_rows=("qpos", "qvel")``."""
    data = env.unwrapped.data
    return {"qpos": data.qpos.copy(), "qvel": data.qvel.copy()}


def observation(state: Tensor, nq: int, clip: float = OBS_CLIP) -> Tensor:
    """The observation ``[qpos[1:], clip(qvel, +-clip)]`` of planning states ``[..., nq + nv]`` (``clip`` inf: none)."""
    return torch.cat([state[..., 1:nq], state[..., nq:].clamp(-clip, clip)], dim=-1)


# ---------------------------------------------------------------------------- costs
@dataclass(frozen=True)
class LeggedCost:
    """Minus the gymnasium reward of one step of a planar legged robot, and its termination.

    ``healthy_z``/``healthy_angle``: the torso height and pitch ranges; ``healthy_state``: the
    bound on ``|state[2:]|`` (Hopper), None for none (Walker2d). Build it from a task
    (:meth:`LeggedTask.cost`).
    """

    traceable: ClassVar[bool] = True  # straight-line tensor code: a planner may compile it (gpdyn.compiled.traced)
    dt: float
    nq: int
    healthy_z: tuple[float, float]
    healthy_angle: tuple[float, float]
    healthy_state: float | None = None
    forward_reward_weight: float = 1.0
    ctrl_cost_weight: float = 1e-3
    healthy_reward: float = 1.0
    action_bounds: tuple[float, float] = (ACTION_LOW, ACTION_HIGH)

    def healthy(self, state: Tensor) -> Tensor:
        """``is_healthy`` of the environment on ``state [..., nq + nv]`` (z and pitch in range; NaN is not)."""
        low, high = _interval_bounds(self.healthy_z, self.healthy_angle, state.device, state.dtype)
        z_angle = state[..., 1:3]  # both intervals tested at once: four ops, not seven (``all(-1)`` is slower still)
        inside = torch.gt(z_angle, low).logical_and_(torch.lt(z_angle, high))
        ok = torch.logical_and(inside[..., 0], inside[..., 1])
        if self.healthy_state is not None:
            ok.logical_and_(state[..., 2:].abs().lt(self.healthy_state).all(-1))
        return ok

    def _progress_and_control(self, state: Tensor, action: Tensor, next_state: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``forward_reward_weight * x_velocity + healthy_reward * healthy``, ``ctrl_cost_weight * |a|^2``
        and ``healthy``: the reward's terms as the environment computes them, each a fresh tensor
        (ops in place: the rollouts call the cost once per step, and its op count is its time)."""
        ok = self.healthy(next_state)
        progress = torch.sub(next_state[..., 0], state[..., 0]).div_(self.dt)  # the x velocity
        if self.forward_reward_weight != 1.0:  # times 1 is exact
            progress.mul_(self.forward_reward_weight)
        progress.add_(ok, alpha=self.healthy_reward)  # healthy_reward * {0, 1}: exact
        return progress, (action * action).sum(-1).mul_(self.ctrl_cost_weight), ok

    def reward(self, state: Tensor, action: Tensor, next_state: Tensor) -> tuple[Tensor, Tensor]:
        """Reward ``[K]`` and ``terminated [K]`` of the step ``state -> next_state`` under ``action``."""
        progress, control, ok = self._progress_and_control(state, action, next_state)
        return progress.sub_(control), ok.logical_not_()

    def __call__(self, state: Tensor, action: Tensor, next_state: Tensor) -> tuple[Tensor, Tensor]:
        progress, control, ok = self._progress_and_control(state, action, next_state)
        return control.sub_(progress), ok.logical_not_()  # -(progress - control), exactly


@functools.cache
def _interval_bounds(z: tuple[float, float], angle: tuple[float, float], device: torch.device,
                     dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The lower and upper bounds ``[2]`` of (z, angle), made once per device and dtype."""
    return (torch.tensor([z[0], angle[0]], device=device, dtype=dtype),
            torch.tensor([z[1], angle[1]], device=device, dtype=dtype))


@dataclass(frozen=True)
class WalkingCost:
    """A shaped cost for walking, for :class:`gpdyn.control.spline_sampling.SplineSampler`.

    The Gym reward (forward speed + alive bonus) tells a short-horizon planner nothing about
    balance until the walker has fallen. Following MuJoCo MPC's walker task (Howell et al.
    2022), each planning step pays quadratic residuals: torso height from ``height``, torso
    pitch from upright, forward speed from ``target_speed``, control effort; and a state
    past the margins ``min_height``/``max_pitch`` (tighter than Walker2d's termination at
    0.8 m and 1 rad, so that the plan turns back before the plant ends the episode) counts
    as fallen: ``fall_penalty`` once per sample plus ``fall_step_penalty`` per fallen step
    (an early fall costs more than a late one).
    """

    target_speed: float = 1.4  # m/s
    height: float = 1.25  # m, the torso's standing height
    height_weight: float = 10.0
    pitch_weight: float = 3.0
    speed_weight: float = 1.0
    control_weight: float = 0.1
    min_height: float = 1.0
    max_pitch: float = 1.0
    fall_penalty: float = 1000.0
    fall_step_penalty: float = 200.0

    def __call__(self, qpos: np.ndarray, qvel: np.ndarray, controls: np.ndarray) -> np.ndarray:
        """Cost ``[K]`` of paths ``qpos [K, H, nq]``, ``qvel [K, H, nv]``, ``controls [K, H, nu]`` (planar legged
        robots: qpos ``[x, z, pitch, joints...]``)."""
        z, pitch, speed = qpos[..., 1], qpos[..., 2], qvel[..., 0]
        step = (self.height_weight * (z - self.height) ** 2 + self.pitch_weight * pitch**2
                + self.speed_weight * (speed - self.target_speed) ** 2 + self.control_weight * (controls**2).sum(-1))
        fallen = (z < self.min_height) | (np.abs(pitch) > self.max_pitch)
        return step.sum(-1) + self.fall_penalty * fallen.any(-1) + self.fall_step_penalty * fallen.sum(-1)


@dataclass(frozen=True)
class NominalTrackingCost:
    """Track the nominal plant under the policy: the cost of a step is how far the next
    velocities the planner's model predicts for a candidate action lie from those the
    nominal plant (``reference``) reaches under the policy's own action from the same state,
    ``|v'_model(s, a) - v'_nominal(s, pi(s))|^2`` (physical units), plus ``offset_weight`` times the
    squared action offset to the policy ``|a - pi(s)|^2``, with the task's termination.

    The policy was trained on the nominal plant, so on a changed plant the best action is
    the one that makes the changed plant move as the nominal one would: policy transfer by
    a learned dynamics correction (Christiano et al. 2016, "Transfer from simulation to real
    world through learning deep inverse dynamics model"). A model that does not know of the
    change (``reference`` itself, the frozen model) scores the policy's action best; a model
    that has learned the change asks for the action that undoes it, e.g. more control on a
    weakened motor. The true controller tracks a copy of the simulator made before the
    change; the learned ones track the pretrained model, whose own errors cancel in the
    difference only while the online model keeps them. The offset price is a trust region: a model's error in how the plant answers an action
    (poorly identified from policy rollouts) otherwise buys large offsets for small
    predicted gains.
    """

    reference: Callable[[Tensor, Tensor], Tensor | tuple[Tensor, Tensor]]
    policy: Callable[[Tensor], Tensor]
    task: LeggedCost
    offset_weight: float = 0.0

    def __call__(self, state: Tensor, action: Tensor, next_state: Tensor) -> tuple[Tensor, Tensor]:
        # the first planned step starts every sample from the measured state (with H = 1, every
        # step does): the policy and the reference then run once, not K times
        origin = state[:1] if bool((state == state[:1]).all()) else state
        with torch.no_grad():
            policy_action = torch.clamp(self.policy(origin), *self.task.action_bounds)
            nominal = self.reference(origin, policy_action)
        if isinstance(nominal, tuple):  # a probabilistic model: its mean
            nominal = nominal[0]
        nq = self.task.nq
        error = (next_state[..., nq:] - nominal[..., nq:].to(next_state.dtype)).pow(2).sum(-1)
        if self.offset_weight:
            error = error + self.offset_weight * (action - policy_action).pow(2).sum(-1)
        return error, ~self.task.healthy(next_state)


# ---------------------------------------------------------------------------- policy (torch proposal)
class FastTanh(torch.nn.Module):
    """``tanh(x) = 2 sigmoid(2x) - 1``: the same function (to 2e-7 in float32), faster than torch's CPU
    ``tanh``, which made the TRPO proposal most of a planning step (``gpdyn bench mpc``, planner alone)."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(2.0 * x).mul_(2.0).sub_(1.0)


def _fast_activations(net: torch.nn.Module) -> torch.nn.Module:
    """``net`` with every ``nn.Tanh`` replaced by :class:`FastTanh` (in place)."""
    for name, child in net.named_children():
        if isinstance(child, torch.nn.Tanh):
            setattr(net, name, FastTanh())
        else:
            _fast_activations(child)
    return net


class _SigmoidMLP(torch.nn.Module):
    """``Linear, sigmoid, ..., Linear`` as plain tensors: per hidden layer one ``linear`` (an
    ``addmm``) and one in-place ``sigmoid``, without ``nn.Sequential``'s module call per layer
    and activation (a noticeable part of the small TRPO net's time: docs/results/implementation-timings.md)."""

    def __init__(self, weights: list[Tensor], biases: list[Tensor]) -> None:
        super().__init__()
        for i, (w, b) in enumerate(zip(weights, biases)):
            self.register_buffer(f"weight{i}", w)
            self.register_buffer(f"bias{i}", b)

    def forward(self, x: Tensor) -> Tensor:
        # the buffers in registration order (weight0, bias0, weight1, ...), read from the dict
        # at once: a Module attribute lookup costs microseconds
        tensors = list(self._buffers.values())
        for i in range(0, len(tensors), 2):
            x = torch.nn.functional.linear(x, tensors[i], tensors[i + 1])
            if i + 2 < len(tensors):
                x.sigmoid_()  # a fresh layer output
        return x


def _fast_net(net: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``net`` that computes the same function faster: for a ``Linear, Tanh, ...,
    Linear`` stack, each ``tanh(z) = 2 sigmoid(2z) - 1`` folded into the linear layers around
    it (the 2 into the weights before, ``2 s - 1`` into the weights and bias after; done in
    float64), so a hidden layer costs one ``addmm`` and one in-place ``sigmoid`` and no
    elementwise scaling, in a :class:`_SigmoidMLP`;
    any other net with :class:`FastTanh` in place of its ``Tanh``."""
    mods = list(net.children()) if isinstance(net, torch.nn.Sequential) else []
    linears, acts = mods[::2], mods[1::2]
    if not (len(mods) % 2 == 1 and all(isinstance(m, torch.nn.Linear) for m in linears)
            and all(isinstance(m, torch.nn.Tanh) for m in acts)):
        return _fast_activations(copy.deepcopy(net))
    weights, biases = [], []
    for i, lin in enumerate(linears):
        w = lin.weight.detach().to(torch.float64)
        b = lin.bias.detach().to(torch.float64) if lin.bias is not None else torch.zeros(w.shape[0], dtype=torch.float64)
        if i > 0:  # the input is tanh = 2 s - 1 of the sigmoid s before
            w, b = 2.0 * w, b - w.sum(1)
        if i < len(acts):  # the sigmoid after takes 2 z
            w, b = 2.0 * w, 2.0 * b
        weights.append(w.clone())
        biases.append(b.clone())
    return _SigmoidMLP(weights, biases)


class TorchPolicy:
    """A legged task's policy, batched in torch on any device: ``state [K, nq + nv] -> action [K, nu]``.

    Same transform as :meth:`gpdyn.robots.policy.Policy.act`: the observation is
    ``[qpos[1:], clip(qvel, +-obs_clip)]``, normalised with the frozen VecNormalize statistics.
    ``obs_clip`` None: the clip of the environment the policy was trained on, its task's
    :attr:`LeggedTask.obs_clip` (the policy file names the environment).
    """

    traceable: ClassVar[bool] = True  # straight-line tensor code: a planner may compile it (gpdyn.compiled.traced)

    def __init__(self, policy: Policy, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float64,
                 obs_clip: float | None = None) -> None:
        nq = (policy.obs_dim + 1) // 2  # the observation [qpos[1:], qvel] of nq == nv joints
        if obs_clip is None:
            obs_clip = policy_task(policy).obs_clip
        kw = {"device": torch.device(device), "dtype": dtype}
        self.net = _fast_net(policy.net).to(**kw).eval()
        self.value_net = _fast_net(policy.value_net).to(**kw).eval() if policy.value_net is not None else None
        self.value_scale = float(policy.value_scale)
        for net in (self.net, self.value_net):
            for p in net.parameters() if net is not None else ():
                p.requires_grad_(False)
        self.mean = torch.as_tensor(policy.obs_mean, **kw)
        self.scale = torch.sqrt(torch.as_tensor(policy.obs_var, **kw) + policy.epsilon)
        self.clip_obs = float(policy.clip_obs)
        # the observation's clip of qvel, clip(v, -10, 10), taken after the normalisation:
        # normalising is increasing, so clipping the normalised value to the normalised
        # bounds (computed by the same ops in the same dtype) gives the same numbers; with
        # the clip to +-clip_obs, one clamp of the state's columns 1: (no concatenation)
        clip = torch.full_like(self.mean, math.inf)
        clip[nq - 1:] = obs_clip
        self.obs_low = ((-clip - self.mean) / self.scale).clamp(-self.clip_obs, self.clip_obs)
        self.obs_high = ((clip - self.mean) / self.scale).clamp(-self.clip_obs, self.clip_obs)
        self.low = torch.as_tensor(policy.act_low, **kw)
        self.high = torch.as_tensor(policy.act_high, **kw)
        # two numbers when every action shares its bounds: a scalar clamp is several times faster on the CPU
        same = bool((self.low == self.low[0]).all() and (self.high == self.high[0]).all())
        self._bounds: tuple[Any, Any] = (float(self.low[0]), float(self.high[0])) if same else (self.low, self.high)
        self.dtype = dtype

    def _normalized_obs(self, state: Tensor) -> Tensor:
        """``clip((observation(state) - mean) / scale, +-clip_obs)``, the clip of qvel in ``observation`` folded in."""
        s = state.to(self.dtype)
        return ((s[..., 1:] - self.mean) / self.scale).clamp_(self.obs_low, self.obs_high)

    def __call__(self, state: Tensor) -> Tensor:
        with torch.no_grad():
            return torch.clamp(self.net(self._normalized_obs(state)), *self._bounds).to(state.dtype)

    def value(self, state: Tensor) -> Tensor:
        """The critic's discounted return ``[K]`` from ``state [K, nq + nv]``, raw reward units."""
        if self.value_net is None:
            raise InputError("TorchPolicy.value: the policy file holds no critic")
        with torch.no_grad():
            return (self.value_scale * self.value_net(self._normalized_obs(state))[..., 0]).to(state.dtype)


def policy_task(policy: Policy) -> LeggedTask:
    """The registered legged task of the environment ``policy`` was trained on (its file's ``env_id``)."""
    env_id = policy.meta.get("env_id")
    task = task_for_env(str(env_id), where=f"policy {policy.name}: env_id")
    if not isinstance(task, LeggedTask):
        raise InputError(f"policy {policy.name}: environment {env_id} is task '{task.name}', not a legged task")
    return task


# ---------------------------------------------------------------------------- plant changes
def torso_mass(model: mujoco.MjModel, factor: float) -> None:
    body = model.body("torso").id
    model.body_mass[body] *= factor
    model.body_inertia[body] *= factor  # same shape, denser: inertia scales with mass


def scale_foot_friction(model: mujoco.MjModel, factor: float, geoms: tuple[str, ...]) -> None:
    """Scale the sliding friction of the foot geoms ``geoms``: contact friction is the max over the
    pair, and the feet's dominates the floor's (0.7) in both robots, so every foot contact changes."""
    for name in geoms:
        model.geom_friction[model.geom(name).id, 0] *= factor


def scale_motor(model: mujoco.MjModel, factor: float, actuator: int) -> None:
    """Scale actuator ``actuator``'s gear: less (or more) torque per unit control."""
    model.actuator_gear[actuator, 0] *= factor


def add_joint_spring(model: mujoco.MjModel, factor: float, joint: str, stiffness: float) -> None:
    """Add a spring ``factor * stiffness`` (N m/rad, about the joint's reference) and a damper of a
    tenth of it (N m s/rad) to hinge ``joint``: a force of the joint's position, which no mass, gear
    or friction factor of the nominal model can represent."""
    jid = model.joint(joint).id
    model.jnt_stiffness[jid] += factor * stiffness
    model.dof_damping[model.jnt_dofadr[jid]] += 0.1 * factor * stiffness


def legged_changes(feet: tuple[str, ...], motor: tuple[int, str], spring_joint: str) -> dict[str, PlantChange]:
    """The plant changes every legged task offers: torso mass x1.3, foot friction x0.5, motor
    ``motor = (actuator, name)`` at half strength, and a 50 N m/rad spring-damper at ``spring_joint``."""
    return {
        "torso_mass": PlantChange("torso mass x{f:g}", torso_mass, 1.3),
        "foot_friction": PlantChange("foot friction x{f:g}", functools.partial(scale_foot_friction, geoms=feet), 0.5),
        "weak_motor": PlantChange(f"{motor[1]} motor strength x{{f:g}}",
                                  functools.partial(scale_motor, actuator=motor[0]), 0.5),
        "joint_spring": PlantChange(f"{spring_joint} spring-damper x{{f:g}} (50 N m/rad, 5 N m s/rad)",
                                    functools.partial(add_joint_spring, joint=spring_joint, stiffness=50.0), 1.0),
    }


# ---------------------------------------------------------------------------- the task
@dataclass(frozen=True, eq=False)
class LeggedTask(Task):
    """A planar legged robot of gymnasium's MuJoCo suite: a :class:`~gpdyn.robots.task.Task` with
    the numbers of its reward and termination (:meth:`cost`) and of its observation's clip of
    qvel (``obs_clip``, inf for none). The defaults of the reward weights are Walker2d's and
    Hopper's; a task that never terminates keeps the infinite healthy ranges."""

    qpos_names: tuple[str, ...] = ()
    healthy_z: tuple[float, float] = (-math.inf, math.inf)
    healthy_angle: tuple[float, float] = (-math.inf, math.inf)
    healthy_state: float | None = None
    obs_clip: float = OBS_CLIP
    forward_reward_weight: float = 1.0
    ctrl_cost_weight: float = 1e-3
    healthy_reward: float = 1.0

    @property
    def nobs(self) -> int:
        return self.layout.nq - 1 + self.layout.nv

    def cost(self, **overrides: Any) -> LeggedCost:
        """Minus the environment's reward, with its termination; ``overrides``: fields of :class:`LeggedCost`."""
        values = dict(dt=self.layout.dt, nq=self.layout.nq, healthy_z=self.healthy_z, healthy_angle=self.healthy_angle,
                      healthy_state=self.healthy_state, forward_reward_weight=self.forward_reward_weight,
                      ctrl_cost_weight=self.ctrl_cost_weight, healthy_reward=self.healthy_reward)
        return LeggedCost(**{**values, **overrides})

    def observation(self, state: Tensor) -> Tensor:
        return observation(state, self.layout.nq, self.obs_clip)


def legged_task(name: str, env_id: str, qpos_names: tuple[str, ...], nu: int, *, healthy_z: tuple[float, float],
                healthy_angle: tuple[float, float], healthy_state: float | None, feet: tuple[str, ...],
                motor: tuple[int, str], spring_joint: str, policy_file: Path | None,
                checkpoint_files: Callable[[], list[Path]] | None = None, frame_skip: int = 4,
                timestep: float = 0.002, episode_steps: int = 1000, description: str = "", obs_clip: float = OBS_CLIP,
                forward_reward_weight: float = 1.0, ctrl_cost_weight: float = 1e-3,
                healthy_reward: float = 1.0) -> LeggedTask:
    """A legged task of ``env_id`` with its ``-1`` problem (inputs ``[qpos[1:], qvel, action]``, target
    the next qvel) and its ``-2`` (two steps of inputs). ``obs_clip`` and the reward weights are the
    environment's (the defaults: Walker2d-v5's and Hopper-v5's)."""
    if not obs_clip > 0:  # NaN too
        raise InputError(f"legged_task {name}: obs_clip must be > 0 (inf: no clip), got {obs_clip}")
    for what, value in (("forward_reward_weight", forward_reward_weight), ("ctrl_cost_weight", ctrl_cost_weight),
                        ("healthy_reward", healthy_reward)):
        if not math.isfinite(value):
            raise InputError(f"legged_task {name}: {what} must be finite, got {value}")
    nq = len(qpos_names)
    layout = StateLayout(nq=nq, nv=nq, nu=nu, dt=timestep * frame_skip, position_inputs=tuple(range(1, nq)))
    return LeggedTask(
        name=name, env_id=env_id, layout=layout,
        make_env=functools.partial(make_gym_env, env_id),
        state_rows=state_rows, problems={f"{name}-1": 1, f"{name}-2": 2}, frame_skip=frame_skip,
        episode_steps=episode_steps, plant_changes=legged_changes(feet, motor, spring_joint), policy_file=policy_file,
        checkpoint_files=checkpoint_files, description=description, qpos_names=qpos_names, healthy_z=healthy_z,
        healthy_angle=healthy_angle, healthy_state=healthy_state, obs_clip=float(obs_clip),
        forward_reward_weight=float(forward_reward_weight), ctrl_cost_weight=float(ctrl_cost_weight),
        healthy_reward=float(healthy_reward))


__all__ = ["POLICY_DIR", "shipped_checkpoints", "ACTION_HIGH", "ACTION_LOW", "LeggedCost", "LeggedTask", "NominalTrackingCost", "OBS_CLIP", "TorchPolicy",
           "WalkingCost", "legged_changes", "legged_task", "make_gym_env", "observation", "policy_task", "state_rows"]
