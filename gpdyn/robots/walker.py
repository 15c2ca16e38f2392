"""Walker2d (MuJoCo, gymnasium ``Walker2d-v5``): everything specific to this robot.

- the model and its constants: :data:`ENV_ID`, :data:`NQ`/:data:`NV`/:data:`NU`, the
  control step :data:`DT` (timestep 0.002 x :data:`FRAME_SKIP` 4), the joint names
  :data:`QPOS_NAMES`, the observation ``[qpos[1:], clip(qvel, +-OBS_CLIP)]`` (:func:`observation`);
- the planning state ``s = [qpos (9), qvel (9)]`` (raw simulator state, x position included
  so that the forward reward can be computed) and the ``walker-1`` feature layout
  :data:`LAYOUT` (``[qpos[1:], qvel, action]``: :data:`QVEL_INPUTS`, :data:`ACTION_INPUTS`)
  that :class:`gpdyn.control.dynamics.LearnedDynamics` integrates by the trapezoid rule
  (its one-step error is measured by :func:`gpdyn.sim.walker.integration_errors`);
- the task: :class:`WalkerCost`, minus the Walker2d-v5 reward ``x_velocity +
  healthy_reward - 1e-3 |a|^2``, with its termination (z outside (0.8, 2), torso angle
  outside (-1, 1)), from gymnasium's ``walker2d_v5.py`` defaults; and
  :class:`NominalTrackingCost` (policy transfer by tracking the nominal plant);
- :class:`TorchPolicy`: the TRPO policy as a batched torch proposal for the planners;
- plant changes, :data:`PLANT_CHANGES` / :func:`apply_plant_change`: torso mass +30 %, foot
  friction halved, right hip motor at half strength (the factors can be changed);
- :func:`make_env`, :func:`state_rows` (the raw state columns an episode keeps).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import mujoco
import numpy as np
import torch
from torch import Tensor

from gpdyn.control.dynamics import StateLayout
from gpdyn.errors import InputError

if TYPE_CHECKING:  # sim.policy reads ENV_ID from here
    from gpdyn.sim.policy import WalkerPolicy

ENV_ID = "Walker2d-v5"
QPOS_NAMES = ("rootx", "rootz", "rooty", "thigh", "leg", "foot", "thigh_left", "leg_left", "foot_left")
NQ = NV = 9
NU = 6
NX = NQ + NV
NOBS = 17  # qpos[1:] and qvel
FRAME_SKIP = 4
DT = 0.008  # Walker2d-v5: timestep 0.002 x frame_skip 4
OBS_CLIP = 10.0  # Walker2d-v5 clips qvel to +-10 in the observation
ACTION_LOW, ACTION_HIGH = -1.0, 1.0  # the action box (ctrlrange), gear 100
# walker-1's input [qpos[1:], qvel, action]: the x position does not change the dynamics
LAYOUT = StateLayout(nq=NQ, nv=NV, nu=NU, dt=DT, position_inputs=tuple(range(1, NQ)))
QVEL_INPUTS = LAYOUT.velocity_inputs  # qvel's columns in the walker-1 input
ACTION_INPUTS = LAYOUT.action_inputs  # the action's columns in the walker-1 input


def make_env(env_id: str = ENV_ID, *, where: str = "env_id", **kwargs: Any):
    """A gymnasium Walker2d environment (with its TimeLimit).

    ``env_id`` must be :data:`ENV_ID`: ids reach here from files (a store's attributes, a
    policy file), and ``gymnasium.make("module:Name")`` imports ``module`` first, which
    would run code named by the file. ``where`` names the id's origin in the error.
    """
    import gymnasium as gym

    if env_id != ENV_ID:
        raise InputError(f"{where} {env_id!r}: not a Walker2d environment gpdyn makes (only {ENV_ID!r})")
    return gym.make(env_id, **kwargs)


def state_rows(env: Any) -> dict[str, np.ndarray]:
    """The raw simulator state of ``env`` (the observation clips qvel): the ``rows`` hook of
    :func:`gpdyn.control.loop.run_episode`, with ``next_rows=("qpos", "qvel")``."""
    data = env.unwrapped.data
    return {"qpos": data.qpos.copy(), "qvel": data.qvel.copy()}


def observation(state: Tensor) -> Tensor:
    """The Walker2d-v5 observation ``[qpos[1:], clip(qvel, +-10)]`` of planning states ``[..., 18]``."""
    return torch.cat([state[..., 1:NQ], state[..., NQ:].clamp(-OBS_CLIP, OBS_CLIP)], dim=-1)


# ---------------------------------------------------------------------------- task
@dataclass(frozen=True)
class WalkerCost:
    """Minus the Walker2d-v5 reward of one step, and its termination (gymnasium defaults)."""

    traceable: ClassVar[bool] = True  # straight-line tensor code: a planner may compile it (gpdyn.compiled.traced)
    dt: float = DT
    forward_reward_weight: float = 1.0
    ctrl_cost_weight: float = 1e-3
    healthy_reward: float = 1.0
    healthy_z: tuple[float, float] = (0.8, 2.0)
    healthy_angle: tuple[float, float] = (-1.0, 1.0)

    def healthy(self, state: Tensor) -> Tensor:
        """``is_healthy`` of Walker2d-v5 on ``state [..., 18]`` (z and torso angle in range; NaN is not)."""
        low, high = _interval_bounds(self.healthy_z, self.healthy_angle, state.device, state.dtype)
        z_angle = state[..., 1:3]  # both intervals tested at once: four ops, not seven (``all(-1)`` is slower still)
        inside = torch.gt(z_angle, low).logical_and_(torch.lt(z_angle, high))
        return torch.logical_and(inside[..., 0], inside[..., 1])

    def _progress_and_control(self, state: Tensor, action: Tensor, next_state: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``forward_reward_weight * x_velocity + healthy_reward * healthy``, ``ctrl_cost_weight * |a|^2``
        and ``healthy``: the reward's terms as Walker2d-v5 computes them, each a fresh tensor
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
        """Cost ``[K]`` of paths ``qpos [K, H, 9]``, ``qvel [K, H, 9]``, ``controls [K, H, 6]``."""
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
    difference only while the online model keeps them. The
    offset price is a trust region: a model's error in how the plant answers an action
    (poorly identified from policy rollouts) otherwise buys large offsets for small
    predicted gains.
    """

    reference: Callable[[Tensor, Tensor], Tensor | tuple[Tensor, Tensor]]
    policy: Callable[[Tensor], Tensor]
    task: WalkerCost = WalkerCost()
    offset_weight: float = 0.0

    def __call__(self, state: Tensor, action: Tensor, next_state: Tensor) -> tuple[Tensor, Tensor]:
        # the first planned step starts every sample from the measured state (with H = 1, every
        # step does): the policy and the reference then run once, not K times
        origin = state[:1] if bool((state == state[:1]).all()) else state
        with torch.no_grad():
            policy_action = torch.clamp(self.policy(origin), ACTION_LOW, ACTION_HIGH)
            nominal = self.reference(origin, policy_action)
        if isinstance(nominal, tuple):  # a probabilistic model: its mean
            nominal = nominal[0]
        error = (next_state[..., NQ:] - nominal[..., NQ:].to(next_state.dtype)).pow(2).sum(-1)
        if self.offset_weight:
            error = error + self.offset_weight * (action - policy_action).pow(2).sum(-1)
        return error, ~self.task.healthy(next_state)


# ---------------------------------------------------------------------------- policy
class FastTanh(torch.nn.Module):
    """``tanh(x) = 2 sigmoid(2x) - 1``: the same function (to 2e-7 in float32), 2-3x faster than
    torch's CPU ``tanh`` (0.25 G elements/s against 1.0 for ``sigmoid`` on this AVX2 CPU), which
    made the TRPO proposal most of a planning step (``gpdyn bench mpc``, planner alone)."""

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
    and activation (~25 us of the TRPO net's ~215 us at 500 rows, one float32 CPU thread)."""

    def __init__(self, weights: list[Tensor], biases: list[Tensor]) -> None:
        super().__init__()
        for i, (w, b) in enumerate(zip(weights, biases)):
            self.register_buffer(f"weight{i}", w)
            self.register_buffer(f"bias{i}", b)

    def forward(self, x: Tensor) -> Tensor:
        # the buffers in registration order (weight0, bias0, weight1, ...), read from the dict
        # at once: a Module attribute lookup costs ~3 us
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
    elementwise scaling (the TRPO proposal 1.7x faster at 500 rows), in a :class:`_SigmoidMLP`;
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
    """The TRPO policy, batched in torch on any device: ``state [K, 18] -> action [K, 6]``.

    Same transform as :meth:`gpdyn.sim.policy.WalkerPolicy.act`: the observation is
    ``[qpos[1:], clip(qvel, +-10)]``, normalised with the frozen VecNormalize statistics.
    """

    traceable: ClassVar[bool] = True  # straight-line tensor code: a planner may compile it (gpdyn.compiled.traced)

    def __init__(self, policy: WalkerPolicy, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float64) -> None:
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
        clip[NQ - 1:] = OBS_CLIP
        self.obs_low = ((-clip - self.mean) / self.scale).clamp(-self.clip_obs, self.clip_obs)
        self.obs_high = ((clip - self.mean) / self.scale).clamp(-self.clip_obs, self.clip_obs)
        self.low = torch.as_tensor(policy.act_low, **kw)
        self.high = torch.as_tensor(policy.act_high, **kw)
        # two numbers when every action shares its bounds: a scalar clamp is ~4x faster on the CPU
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
        """The TRPO critic's discounted return ``[K]`` from ``state [K, 18]``, raw reward units."""
        if self.value_net is None:
            raise InputError("TorchPolicy.value: the policy file holds no critic")
        with torch.no_grad():
            return (self.value_scale * self.value_net(self._normalized_obs(state))[..., 0]).to(state.dtype)


# ---------------------------------------------------------------------------- plant changes
def _torso_mass(model: mujoco.MjModel, factor: float) -> None:
    body = model.body("torso").id
    model.body_mass[body] *= factor
    model.body_inertia[body] *= factor  # same shape, denser: inertia scales with mass


def _foot_friction(model: mujoco.MjModel, factor: float) -> None:
    # contact friction is the max over the pair; the feet (1.9) dominate the floor (0.7),
    # so halving the feet (0.95) changes every foot contact
    for name in ("foot_geom", "foot_left_geom"):
        model.geom_friction[model.geom(name).id, 0] *= factor


def _weak_motor(model: mujoco.MjModel, factor: float) -> None:
    model.actuator_gear[0, 0] *= factor  # right hip ("thigh_joint"): less torque per unit control


# name -> (what changes, how, the default factor)
PLANT_CHANGES: dict[str, tuple[str, Callable[[mujoco.MjModel, float], None], float]] = {
    "torso_mass": ("torso mass x{f:g}", _torso_mass, 1.3),
    "foot_friction": ("foot friction x{f:g}", _foot_friction, 0.5),
    "weak_motor": ("right hip motor strength x{f:g}", _weak_motor, 0.5),
}


def plant_change_factor(name: str, factor: float | None = None) -> float:
    """The factor of the named change: ``factor``, or the change's own when None; InputError when impossible."""
    if name not in PLANT_CHANGES:
        raise InputError(f"unknown plant change '{name}'; choose one of {', '.join(PLANT_CHANGES)}")
    factor = PLANT_CHANGES[name][2] if factor is None else float(factor)
    if not (np.isfinite(factor) and factor > 0):
        raise InputError(f"plant change '{name}': factor must be finite and > 0, got {factor}")
    return factor


def apply_plant_change(model: mujoco.MjModel, name: str, factor: float | None = None) -> str:
    """Change ``model`` in place by the named change, scaled by ``factor`` (default: the change's own);
    returns its description."""
    factor = plant_change_factor(name, factor)
    text, fn, _ = PLANT_CHANGES[name]
    fn(model, factor)
    return text.format(f=factor)


__all__ = [
    "ACTION_INPUTS", "ACTION_HIGH", "ACTION_LOW", "DT", "ENV_ID", "FRAME_SKIP", "LAYOUT", "NOBS", "NQ", "NU", "NV", "NX",
    "OBS_CLIP", "PLANT_CHANGES", "QPOS_NAMES", "QVEL_INPUTS", "NominalTrackingCost", "TorchPolicy", "WalkerCost",
    "apply_plant_change", "make_env", "observation", "plant_change_factor", "state_rows",
]
