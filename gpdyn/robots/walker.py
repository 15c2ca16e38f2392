"""Walker2d as an MPC task: learned and true dynamics, the reward as a cost, plant changes.

State for planning: ``s = [qpos (9), qvel (9)]`` (raw simulator state, x position
included so that the forward reward can be computed). Action: the 6 normalised controls.

- :class:`LearnedWalkerDynamics`: any learner trained on ``walker-1`` predicts the 9
  velocities at t+1 from ``[qpos[1:], qvel, action]`` (normalised with the problem's
  :class:`~gpdyn.data.problems.Normalizer`), by default as the velocity change over the
  step (``target="change"``, see :data:`TARGETS`); positions follow by the trapezoid rule
  ``q' = q + dt/2 (v + v')`` (its one-step error is measured in docs/walker.md and by
  :func:`gpdyn.sim.walker.integration_errors`). Returns the predictive variance too, in
  physical units, for the uncertainty-aware planners.
- :class:`SimWalkerDynamics`: the true simulator (``mujoco.rollout`` from copied states,
  the same ``MjModel`` as the plant, so it sees plant changes): the upper bound.
- :class:`WalkerCost`: minus the Walker2d-v5 reward, ``x_velocity + healthy_reward -
  1e-3 |a|^2``, with its termination (z outside (0.8, 2), torso angle outside (-1, 1)),
  from gymnasium's ``walker2d_v5.py`` defaults.
- :class:`TorchPolicy`: the TRPO policy as a batched torch proposal.
- :data:`PLANT_CHANGES` / :func:`apply_plant_change`: torso mass +30 %, foot friction
  halved, right hip motor at half strength (the factors can be changed).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import mujoco
import numpy as np
import torch
from torch import Tensor

from gpdyn.data.problems import Normalizer
from gpdyn.errors import InputError
from gpdyn.gp.base import Learner
from gpdyn.sim.policy import WalkerPolicy

NQ = NV = 9
NU = 6
NX = NQ + NV
DT = 0.008  # Walker2d-v5: timestep 0.002 x frame_skip 4
FRAME_SKIP = 4
OBS_CLIP = 10.0  # Walker2d-v5 clips qvel to +-10 in the observation


# ---------------------------------------------------------------------------- task
@dataclass(frozen=True)
class WalkerCost:
    """Minus the Walker2d-v5 reward of one step, and its termination (gymnasium defaults)."""

    dt: float = DT
    forward_reward_weight: float = 1.0
    ctrl_cost_weight: float = 1e-3
    healthy_reward: float = 1.0
    healthy_z: tuple[float, float] = (0.8, 2.0)
    healthy_angle: tuple[float, float] = (-1.0, 1.0)

    def healthy(self, state: Tensor) -> Tensor:
        """``is_healthy`` of Walker2d-v5 on ``state [..., 18]`` (z and torso angle in range)."""
        z, angle = state[..., 1], state[..., 2]
        return (z > self.healthy_z[0]) & (z < self.healthy_z[1]) & (angle > self.healthy_angle[0]) & (angle < self.healthy_angle[1])

    def reward(self, state: Tensor, action: Tensor, next_state: Tensor) -> tuple[Tensor, Tensor]:
        """Reward ``[K]`` and ``terminated [K]`` of the step ``state -> next_state`` under ``action``."""
        x_velocity = (next_state[..., 0] - state[..., 0]) / self.dt
        ok = self.healthy(next_state)
        reward = (
            self.forward_reward_weight * x_velocity
            + self.healthy_reward * ok.to(state.dtype)
            - self.ctrl_cost_weight * (action * action).sum(-1)
        )
        return reward, ~ok

    def __call__(self, state: Tensor, action: Tensor, next_state: Tensor) -> tuple[Tensor, Tensor]:
        reward, done = self.reward(state, action, next_state)
        return -reward, done


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
    difference only while the online model keeps them (docs/control.md, tenth study). The
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
            policy_action = torch.clamp(self.policy(origin), -1.0, 1.0)  # Walker2d's action box
            nominal = self.reference(origin, policy_action)
        if isinstance(nominal, tuple):  # a probabilistic model: its mean
            nominal = nominal[0]
        error = (next_state[..., NQ:] - nominal[..., NQ:].to(next_state.dtype)).pow(2).sum(-1)
        if self.offset_weight:
            error = error + self.offset_weight * (action - policy_action).pow(2).sum(-1)
        return error, ~self.task.healthy(next_state)


def state_of(data: mujoco.MjData) -> np.ndarray:
    """The planning state ``[qpos, qvel]`` (18) of a simulator."""
    return np.concatenate([data.qpos, data.qvel])


# ---------------------------------------------------------------------------- learned model
# What the learner's outputs are: "change" = qvel[t+1] - qvel[t] (the problem's
# ``as_change_of(QVEL_INPUTS)``), "velocity" = qvel[t+1] (walker-1 as in the paper).
TARGETS = ("change", "velocity")
QVEL_INPUTS = slice(NQ - 1, NQ - 1 + NV)  # qvel's columns in the walker-1 input
ACTION_INPUTS = slice(NQ - 1 + NV, NQ - 1 + NV + NU)  # the action's columns in the walker-1 input


class LearnedWalkerDynamics:
    """Walker2d dynamics from a ``walker-1`` learner: velocities by GP, positions by the trapezoid rule.

    ``target`` says what the learner was trained on (:data:`TARGETS`); the normaliser's
    output statistics must be that target's.
    """

    def __init__(self, learner: Learner, normalizer: Normalizer, dt: float = DT, target: str = "change") -> None:
        if target not in TARGETS:
            raise InputError(f"LearnedWalkerDynamics: target must be one of {', '.join(TARGETS)}, got '{target}'")
        self.target = target
        if learner.input_dim != NQ - 1 + NV + NU or learner.output_dim != NV:
            raise InputError(
                f"LearnedWalkerDynamics: learner maps {learner.input_dim} -> {learner.output_dim}, walker-1 needs 23 -> 9"
            )
        if np.asarray(normalizer.x_mean).shape != (23,) or np.asarray(normalizer.y_mean).shape != (NV,):
            raise InputError("LearnedWalkerDynamics: the normalizer is not a walker-1 normalizer (23 inputs, 9 outputs)")
        self.learner, self.normalizer, self.dt = learner, normalizer, float(dt)
        kw = {"device": learner.device, "dtype": learner.dtype}
        self._x_mean = torch.as_tensor(normalizer.x_mean, **kw)
        self._x_std = torch.as_tensor(normalizer.x_std, **kw)
        self._y_mean = torch.as_tensor(normalizer.y_mean, **kw)
        self._y_std = torch.as_tensor(normalizer.y_std, **kw)

    @staticmethod
    def features(state: Tensor, action: Tensor) -> Tensor:
        """The walker-1 input ``[qpos[1:], qvel, action]`` (23), unnormalised."""
        return torch.cat([state[..., 1:NQ], state[..., NQ:], action], dim=-1)

    def training_pair(self, state: Tensor, action: Tensor, next_state: Tensor) -> tuple[Tensor, Tensor]:
        """One observed transition as a normalised ``(x [N, 23], y [N, 9])`` pair for the learner."""
        kw = {"device": self.learner.device, "dtype": self.learner.dtype}
        x = self.features(torch.as_tensor(state, **kw), torch.as_tensor(action, **kw)).reshape(-1, 23)
        y = torch.as_tensor(next_state, **kw)[..., NQ:].reshape(-1, NV)
        if self.target == "change":
            y = y - x[:, QVEL_INPUTS]
        return (x - self._x_mean) / self._x_std, (y - self._y_mean) / self._y_std

    def predict_inputs(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and variance of qvel at t+1 in physical units from unnormalised walker-1 inputs ``[K, 23]``."""
        x = x.to(self.learner.dtype)
        mean, var = self.learner.predict((x - self._x_mean) / self._x_std)
        mean = mean * self._y_std + self._y_mean
        if self.target == "change":
            mean = mean + x[..., QVEL_INPUTS]
        return mean, var * self._y_std**2

    def predict_velocity(self, state: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and variance of qvel at t+1 in physical units, ``[K, 9]`` each."""
        return self.predict_inputs(self.features(state, action))

    def __call__(self, state: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """``(next_state [K, 18], variance [K, 18])``; position variance through the same rule."""
        v1, var_v = self.predict_velocity(state, action)
        v1, var_v = v1.to(state.dtype), var_v.to(state.dtype)
        q0, v0 = state[..., :NQ], state[..., NQ:]
        q1 = q0 + 0.5 * self.dt * (v0 + v1)
        var_q = (0.5 * self.dt) ** 2 * var_v
        return torch.cat([q1, v1], dim=-1), torch.cat([var_q, var_v], dim=-1)


# ---------------------------------------------------------------------------- true model
class SimWalkerDynamics:
    """The true Walker2d simulator as a batched model: ``mujoco.rollout`` from copied states.

    Uses the plant's own ``MjModel`` (so plant changes apply) and a scratch ``MjData``
    (``mujoco.rollout`` overwrites the data it is given). One step holds the action for
    ``frame_skip`` simulator steps, as ``Walker2d-v5.step`` does.
    """

    def __init__(self, model: mujoco.MjModel, frame_skip: int = FRAME_SKIP) -> None:
        from mujoco import rollout

        self._rollout = rollout.rollout
        self.model, self.frame_skip = model, int(frame_skip)
        self.scratch = mujoco.MjData(model)
        self.spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
        self.nstate = mujoco.mj_stateSize(model, self.spec)
        # FULLPHYSICS layout: time, qpos, qvel, act, ...; Walker2d has no actuator state
        self._q = slice(1, 1 + model.nq)
        self._v = slice(1 + model.nq, 1 + model.nq + model.nv)

    def __call__(self, state: Tensor, action: Tensor) -> Tensor:
        s = state.detach().cpu().numpy().astype(np.float64)
        init = np.zeros((s.shape[0], self.nstate))
        init[:, self._q], init[:, self._v] = s[:, :NQ], s[:, NQ:]
        ctrl = np.repeat(action.detach().cpu().numpy().astype(np.float64)[:, None, :], self.frame_skip, axis=1)
        out, _ = self._rollout(self.model, self.scratch, init, ctrl)
        last = out[:, -1]
        nxt = np.concatenate([last[:, self._q], last[:, self._v]], axis=1)
        return torch.as_tensor(nxt, device=state.device, dtype=state.dtype)


# ---------------------------------------------------------------------------- policy
class TorchPolicy:
    """The TRPO policy, batched in torch on any device: ``state [K, 18] -> action [K, 6]``.

    Same transform as :meth:`gpdyn.sim.policy.WalkerPolicy.act`: the observation is
    ``[qpos[1:], clip(qvel, +-10)]``, normalised with the frozen VecNormalize statistics.
    """

    def __init__(self, policy: WalkerPolicy, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float64) -> None:
        kw = {"device": torch.device(device), "dtype": dtype}
        self.net = copy.deepcopy(policy.net).to(**kw).eval()
        self.value_net = copy.deepcopy(policy.value_net).to(**kw).eval() if policy.value_net is not None else None
        self.value_scale = float(policy.value_scale)
        for net in (self.net, self.value_net):
            for p in net.parameters() if net is not None else ():
                p.requires_grad_(False)
        self.mean = torch.as_tensor(policy.obs_mean, **kw)
        self.scale = torch.sqrt(torch.as_tensor(policy.obs_var, **kw) + policy.epsilon)
        self.clip_obs = float(policy.clip_obs)
        self.low = torch.as_tensor(policy.act_low, **kw)
        self.high = torch.as_tensor(policy.act_high, **kw)
        self.dtype = dtype

    def _normalized_obs(self, state: Tensor) -> Tensor:
        s = state.to(self.dtype)
        obs = torch.cat([s[..., 1:NQ], s[..., NQ:].clamp(-OBS_CLIP, OBS_CLIP)], dim=-1)
        return ((obs - self.mean) / self.scale).clamp(-self.clip_obs, self.clip_obs)

    def __call__(self, state: Tensor) -> Tensor:
        with torch.no_grad():
            return torch.clamp(self.net(self._normalized_obs(state)), self.low, self.high).to(state.dtype)

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
    "ACTION_INPUTS",
    "DT",
    "NU",
    "NX",
    "PLANT_CHANGES",
    "QVEL_INPUTS",
    "TARGETS",
    "LearnedWalkerDynamics",
    "NominalTrackingCost",
    "SimWalkerDynamics",
    "TorchPolicy",
    "WalkerCost",
    "apply_plant_change",
    "plant_change_factor",
    "state_of",
]
