"""Policies of the legged tasks: a safe, self-contained file format and a numpy actor.

A TRPO policy trained with sb3-contrib (``scripts/train_policy.py``) is exported to a
single ``.pt`` file holding plain tensors and scalars only: the actor MLP weights, the
observation-normalisation statistics of ``VecNormalize`` and the spaces it was trained
on. Loading uses ``torch.load(weights_only=True)``, so no pickled Python object is ever
executed; a file whose spaces do not match the environment is refused with
:class:`PolicyError`.

The actor reproduces sb3's ``ActorCriticPolicy`` deterministic action:
``clip(action_net(mlp_pi(clip((obs - mean) / sqrt(var + eps), ±clip_obs))), low, high)``.
A file may also hold the critic, ``value_net(mlp_vf(...))`` on the same normalised
observation, with ``value_scale`` = VecNormalize's reward scale ``sqrt(ret_var + eps)``,
so that :meth:`Policy.value` is in raw reward units (discounted by the training
``gamma``); the MPC uses it as a terminal value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gpdyn.errors import InputError
from gpdyn.robots.task import get_task, task_for_env
from gpdyn.torch_check import require_safe_torch_load

POLICY_FORMAT = "gpdyn.policy"
POLICY_VERSION = 1

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


class PolicyError(InputError):
    """A policy file that is missing, malformed, or does not fit the environment."""


@dataclass
class Policy:
    """A deterministic MLP actor with observation normalisation (numpy in, numpy out)."""

    net: nn.Sequential
    obs_mean: np.ndarray
    obs_var: np.ndarray
    clip_obs: float
    epsilon: float
    act_low: np.ndarray
    act_high: np.ndarray
    meta: dict[str, Any]
    path: Path | None = None
    value_net: nn.Sequential | None = None  # the critic, on the same normalised observation
    value_scale: float = 1.0  # critic output -> raw discounted return

    @property
    def obs_dim(self) -> int:
        return int(self.obs_mean.shape[0])

    @property
    def act_dim(self) -> int:
        return int(self.act_low.shape[0])

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """VecNormalize's observation transform (its frozen statistics)."""
        return np.clip((obs - self.obs_mean) / np.sqrt(self.obs_var + self.epsilon), -self.clip_obs, self.clip_obs)

    def __post_init__(self) -> None:
        # numpy float64 copies of the layers: a 64-wide MLP on one observation per step
        # is much faster in numpy than through torch's per-call overhead
        linears = [m for m in self.net if isinstance(m, nn.Linear)]
        self._layers = [(m.weight.detach().double().numpy().T.copy(), m.bias.detach().double().numpy()) for m in linears]
        self._hidden_act = np.tanh if isinstance(self.net[1], nn.Tanh) else (lambda z: np.maximum(z, 0.0))

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic actions for observations ``[..., obs_dim]`` (clipped to the action box)."""
        obs = np.asarray(obs, dtype=np.float64)
        if obs.shape[-1] != self.obs_dim:
            raise PolicyError(f"policy {self.name}: observation has {obs.shape[-1]} values, expected {self.obs_dim}")
        x = self.normalize(obs)
        for i, (w, b) in enumerate(self._layers):
            x = x @ w + b
            if i < len(self._layers) - 1:
                x = self._hidden_act(x)
        if not np.isfinite(x).all():  # never sent to the simulator: clip keeps NaN
            bad = "observation" if not np.isfinite(obs).all() else "weights"
            raise PolicyError(f"policy {self.path or self.name}: the action is NaN or inf (from the {bad})")
        return np.clip(x, self.act_low, self.act_high)

    def value(self, obs: np.ndarray) -> np.ndarray:
        """The critic's discounted return estimate for observations ``[..., obs_dim]``, raw reward units."""
        if self.value_net is None:
            raise PolicyError(f"policy {self.name}: the file holds no critic (re-export it with scripts/train_policy.py)")
        z = torch.as_tensor(self.normalize(np.asarray(obs, dtype=np.float64)), dtype=torch.float32)
        with torch.no_grad():
            return self.value_scale * self.value_net(z)[..., 0].double().numpy()

    @property
    def name(self) -> str:
        return self.path.name if self.path is not None else str(self.meta.get("name", "policy"))

    def check_env(self, env: Any) -> None:
        """Refuse an environment whose observation or action space differs from training."""
        obs_space, act_space = env.observation_space, env.action_space
        where = f"policy {self.path or self.name}"
        if tuple(obs_space.shape) != (self.obs_dim,):
            raise PolicyError(
                f"{where}: trained on observations of shape ({self.obs_dim},), "
                f"the environment gives {tuple(obs_space.shape)}"
            )
        if tuple(act_space.shape) != (self.act_dim,):
            raise PolicyError(
                f"{where}: outputs actions of shape ({self.act_dim},), the environment expects {tuple(act_space.shape)}"
            )
        if not (np.allclose(act_space.low, self.act_low) and np.allclose(act_space.high, self.act_high)):
            raise PolicyError(
                f"{where}: action bounds [{self.act_low.tolist()}, {self.act_high.tolist()}] differ from the "
                f"environment's [{np.asarray(act_space.low).tolist()}, {np.asarray(act_space.high).tolist()}]"
            )


def _mlp(obs_dim: int, hidden: Sequence[int], act_dim: int, activation: str) -> nn.Sequential:
    """The sb3 actor path: ``mlp_extractor.policy_net`` then ``action_net``."""
    act_cls = _ACTIVATIONS[activation]
    layers: list[nn.Module] = []
    last = obs_dim
    for width in hidden:
        layers += [nn.Linear(last, width), act_cls()]
        last = width
    layers.append(nn.Linear(last, act_dim))
    return nn.Sequential(*layers)


def save_policy(
    path: str | Path,
    state_dict: Mapping[str, torch.Tensor],
    *,
    value_state_dict: Mapping[str, torch.Tensor] | None = None,
    value_scale: float = 1.0,
    hidden: Sequence[int],
    activation: str,
    obs_mean: np.ndarray,
    obs_var: np.ndarray,
    clip_obs: float,
    epsilon: float,
    act_low: np.ndarray,
    act_high: np.ndarray,
    env_id: str,
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """Write a policy file of plain tensors and scalars (loadable with ``weights_only=True``).

    ``state_dict`` is the actor ``nn.Sequential``'s (keys ``0.weight`` ... as built by
    :func:`_mlp`); ``value_state_dict`` the critic's (same hidden sizes, one output),
    optional, with ``value_scale`` taking its output to raw reward units.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": POLICY_FORMAT,
        "version": POLICY_VERSION,
        "env_id": env_id,
        "hidden": [int(h) for h in hidden],
        "activation": activation,
        "obs_mean": torch.as_tensor(np.asarray(obs_mean, dtype=np.float64)),
        "obs_var": torch.as_tensor(np.asarray(obs_var, dtype=np.float64)),
        "clip_obs": float(clip_obs),
        "epsilon": float(epsilon),
        "act_low": torch.as_tensor(np.asarray(act_low, dtype=np.float64)),
        "act_high": torch.as_tensor(np.asarray(act_high, dtype=np.float64)),
        "state_dict": {k: v.detach().cpu().float().clone() for k, v in state_dict.items()},
        "meta": {str(k): v for k, v in (meta or {}).items()},
    }
    if value_state_dict is not None:
        payload["value_state_dict"] = {k: v.detach().cpu().float().clone() for k, v in value_state_dict.items()}
        payload["value_scale"] = float(value_scale)
    torch.save(payload, path)
    return path


def _vector(payload: Mapping[str, Any], key: str, path: Path) -> np.ndarray:
    """``payload[key]`` as a finite 1-D float64 array."""
    value = payload[key]
    if not isinstance(value, torch.Tensor) or value.ndim != 1 or not value.is_floating_point():
        raise PolicyError(f"{path}: '{key}' must be a 1-D floating tensor, got {_describe(value)}")
    array = value.numpy().astype(np.float64)
    if not np.isfinite(array).all():
        raise PolicyError(f"{path}: '{key}' holds NaN or inf")
    return array


def _number(payload: Mapping[str, Any], key: str, path: Path, low: float, default: float | None = None) -> float:
    """``payload[key]`` (or ``default`` when absent) as a finite float >= ``low``."""
    value = payload.get(key, default) if default is not None else payload[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= low):
        raise PolicyError(f"{path}: '{key}' must be a finite number >= {low:g}, got {value!r}")
    return float(value)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r}"[:80]


def _check_layers(state: Any, sizes: Sequence[int], key: str, path: Path) -> None:
    """Raise PolicyError unless ``state`` holds the finite weights of the MLP ``sizes[0] -> ... -> sizes[-1]``.

    Checked before any layer is built, so that the sizes a file claims cannot make the
    loader allocate more than the file itself holds.
    """
    if not isinstance(state, Mapping):
        raise PolicyError(f"{path}: '{key}' must be a dict of tensors, got {_describe(state)}")
    expected = {}
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        expected[f"{2 * i}.weight"], expected[f"{2 * i}.bias"] = (n_out, n_in), (n_out,)
    if set(state) != set(expected):
        raise PolicyError(f"{path}: '{key}' holds {sorted(map(str, state))}, the layers {list(sizes)} need "
                          f"{sorted(expected)}")
    for name, shape in expected.items():
        tensor = state[name]
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or tuple(tensor.shape) != shape:
            raise PolicyError(f"{path}: '{key}.{name}' must be a floating tensor of shape {shape}, got {_describe(tensor)}")
        if not bool(torch.isfinite(tensor).all()):
            raise PolicyError(f"{path}: '{key}.{name}' holds NaN or inf")


#: observations the loader feeds a policy to check that its actions are finite: the
#: normalised observation ranges over [-clip_obs, clip_obs]; these are its centre, its
#: corners and seeded points between
_PROBES = 16


def load_policy(path: str | Path | None = None, env: Any | None = None) -> Policy:
    """Load a policy file (default: the Walker2d's shipped policy), never unpickling objects.

    Raises :class:`PolicyError` naming the file for a missing, foreign or malformed file
    (every tensor is checked for its shape and for NaN or inf, the environment id must be a
    registered task's (:func:`gpdyn.robots.task.task_for_env`), and the actor must give finite
    actions on probe observations), and, when ``env`` is given, for observation or action
    spaces that differ from the environment's (:meth:`Policy.check_env`).
    """
    path = Path(path) if path is not None else get_task("walker").policy_file
    if not path.is_file():
        raise PolicyError(f"{path}: no such policy file")
    require_safe_torch_load()
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a zip from sb3, a pickle, a truncated file ...
        raise PolicyError(
            f"{path}: not a gpdyn policy file ({type(err).__name__}); export sb3 models with "
            "scripts/train_policy.py"
        ) from err
    if not isinstance(payload, dict) or payload.get("format") != POLICY_FORMAT:
        raise PolicyError(f"{path}: not a gpdyn policy file (format {payload.get('format') if isinstance(payload, dict) else type(payload).__name__!r})")
    if payload.get("version") != POLICY_VERSION:
        raise PolicyError(f"{path}: policy format version {payload.get('version')!r}, this gpdyn reads {POLICY_VERSION}")
    try:
        meta = payload.get("meta", {})
        if not isinstance(meta, Mapping):
            raise PolicyError(f"{path}: 'meta' must be a dict, got {_describe(meta)}")
        meta = {**dict(meta), "env_id": payload.get("env_id") or get_task("walker").env_id}  # files before the id: Walker2d's
        try:  # only a registered task's id: gymnasium would import the module an id names
            task_for_env(meta["env_id"])
        except InputError as err:
            raise PolicyError(f"{path}: {err}") from None
        obs_mean, obs_var = _vector(payload, "obs_mean", path), _vector(payload, "obs_var", path)
        act_low, act_high = _vector(payload, "act_low", path), _vector(payload, "act_high", path)
        if obs_var.shape != obs_mean.shape or (obs_var < 0).any():
            raise PolicyError(f"{path}: 'obs_var' must be {obs_mean.shape[0]} values >= 0 like 'obs_mean'")
        if act_high.shape != act_low.shape or not (act_low <= act_high).all():
            raise PolicyError(f"{path}: 'act_low' and 'act_high' must be bounds of the same length, low <= high")
        clip_obs, epsilon = _number(payload, "clip_obs", path, 0.0), _number(payload, "epsilon", path, 0.0)
        value_scale = _number(payload, "value_scale", path, 0.0, default=1.0)
        activation, hidden = payload["activation"], payload["hidden"]
        if activation not in _ACTIVATIONS:
            raise PolicyError(f"{path}: unknown activation {activation!r}; gpdyn reads {', '.join(_ACTIVATIONS)}")
        if not isinstance(hidden, (list, tuple)) or not all(type(h) is int and h >= 1 for h in hidden):
            raise PolicyError(f"{path}: 'hidden' must be a list of layer widths >= 1, got {_describe(hidden)}")
        _check_layers(payload["state_dict"], [obs_mean.shape[0], *hidden, act_low.shape[0]], "state_dict", path)
        net = _mlp(obs_mean.shape[0], hidden, act_low.shape[0], activation)
        net.load_state_dict(payload["state_dict"])
        value_net = None
        if "value_state_dict" in payload:
            _check_layers(payload["value_state_dict"], [obs_mean.shape[0], *hidden, 1], "value_state_dict", path)
            value_net = _mlp(obs_mean.shape[0], hidden, 1, activation)
            value_net.load_state_dict(payload["value_state_dict"])
            value_net.eval()
    except KeyError as err:
        raise PolicyError(f"{path}: malformed policy file (no {err})") from err
    net.eval()
    policy = Policy(
        net=net, obs_mean=obs_mean, obs_var=obs_var, clip_obs=clip_obs, epsilon=epsilon, act_low=act_low,
        act_high=act_high, meta=meta, path=path, value_net=value_net, value_scale=value_scale,
    )
    _probe(policy)
    if env is not None:
        policy.check_env(env)
    return policy


def _probe(policy: Policy) -> None:
    """Refuse a policy whose actor (or critic) gives NaN or inf on the probe observations.

    Finite weights can still overflow (float32 weights near 1e38) or subtract infinities;
    such a policy is refused here rather than when its first action reaches MuJoCo.
    """
    scale = np.sqrt(policy.obs_var + policy.epsilon)
    rng = np.random.default_rng(0)
    unit = np.concatenate([np.zeros((1, policy.obs_dim)), np.ones((1, policy.obs_dim)), -np.ones((1, policy.obs_dim)),
                           rng.uniform(-1, 1, size=(_PROBES - 3, policy.obs_dim))])
    obs = policy.obs_mean + policy.clip_obs * unit * scale
    policy.act(obs)  # raises PolicyError on a non-finite action
    with torch.no_grad():  # the float32 network the planners' proposal copies (float64 above may not overflow)
        torch_action = policy.net(torch.as_tensor(policy.normalize(obs), dtype=torch.float32))
    if not bool(torch.isfinite(torch_action).all()):
        raise PolicyError(f"{policy.path}: the actor gives NaN or inf in float32 on probe observations")
    if policy.value_net is not None and not np.isfinite(policy.value(obs)).all():
        raise PolicyError(f"{policy.path}: the critic gives NaN or inf on probe observations")


def export_sb3(model: Any, vecnormalize: Any, path: str | Path, env_id: str, meta: Mapping[str, Any] | None = None) -> Path:
    """Export an sb3 ``ActorCriticPolicy`` model of environment ``env_id`` and its ``VecNormalize`` to a policy file."""
    policy = model.policy
    hidden = [m.out_features for m in policy.mlp_extractor.policy_net if isinstance(m, nn.Linear)]
    activation = next(
        (name for name, cls in _ACTIVATIONS.items() if isinstance(policy.mlp_extractor.policy_net[1], cls)), None
    )
    if activation is None:
        raise PolicyError(f"{path}: unsupported activation {type(policy.mlp_extractor.policy_net[1]).__name__}")
    def copy(extractor: nn.Sequential, head: nn.Linear) -> nn.Sequential:
        linears = [m for m in extractor if isinstance(m, nn.Linear)] + [head]
        net = _mlp(linears[0].in_features, hidden, head.out_features, activation)
        for dst, src in zip([m for m in net if isinstance(m, nn.Linear)], linears):
            dst.load_state_dict(src.state_dict())
        return net

    net = copy(policy.mlp_extractor.policy_net, policy.action_net)
    critic = copy(policy.mlp_extractor.value_net, policy.value_net)
    # VecNormalize trains the critic on rewards divided by the running std of the return
    reward_scale = math.sqrt(float(vecnormalize.ret_rms.var) + vecnormalize.epsilon) if vecnormalize.norm_reward else 1.0
    rms = vecnormalize.obs_rms
    space = model.action_space
    return save_policy(
        path,
        net.state_dict(),
        value_state_dict=critic.state_dict(),
        value_scale=reward_scale,
        hidden=hidden,
        activation=activation,
        obs_mean=rms.mean,
        obs_var=rms.var,
        clip_obs=vecnormalize.clip_obs,
        epsilon=vecnormalize.epsilon,
        act_low=space.low,
        act_high=space.high,
        env_id=env_id,
        meta=meta,
    )


def episode_returns(env: Any, act: Callable[[np.ndarray], np.ndarray], episodes: int = 10, seed: int = 0) -> np.ndarray:
    """Undiscounted returns of ``episodes`` episodes of ``env`` under ``act(obs) -> action`` (reset seeds
    ``seed + i``); closes ``env``."""
    returns = np.zeros(episodes)
    try:
        for i in range(episodes):
            obs, _ = env.reset(seed=seed + i)
            done = False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(act(obs))
                returns[i] += float(reward)
                done = terminated or truncated
    finally:
        env.close()
    return returns


def evaluate_policy(policy: Policy, episodes: int = 10, seed: int = 0) -> np.ndarray:
    """Undiscounted returns of ``episodes`` deterministic episodes of the policy's environment (reset seeds ``seed + i``)."""
    env = task_for_env(policy.meta["env_id"], where=f"{policy.path}: env_id").make_env()
    policy.check_env(env)
    return episode_returns(env, policy.act, episodes, seed)
