"""Predictive sampling over spline action sequences, through a MuJoCo model (MuJoCo MPC's sampler).

The planner of MuJoCo MPC (Howell et al. 2022, "Predictive Sampling: Real-time Behaviour
Synthesis with MuJoCo"), which makes planar walkers walk in real time:

- an action sequence is a piecewise-linear spline with ``knots`` knots spread evenly
  over the horizon: the samples are temporally correlated, not white noise per step;
- each plan perturbs the nominal knots with Gaussian noise (sample 0 keeps the nominal
  unperturbed), clips them to the action box, rolls all ``K`` sequences through the model
  in one ``mujoco.rollout`` call and scores them with a task cost;
- the new nominal is the best sample, or (``temperature > 0``) the softmax average of
  the samples' knots with the temperature measured in units of the cost spread
  (median - best): the average stays near the best few and smooths their noise;
- warm start: the nominal spline is shifted by one control step before the next plan.

Every sample is free (no policy-following samples are mixed in: averaging a policy's
actions with free samples' made a plan that neither follows nor improves it).

The planning model is a copy of the plant's ``MjModel`` with a longer time step
(``stride`` control steps per planning step) and MuJoCo's implicit-in-velocity
integrator (``implicitfast``, damping taken implicitly; at 24 ms, 3 control steps, it
diverged on some rollouts, which then count as the worst). One planning step costs one ``mj_step`` instead of
the plant's eight RK4 steps: 20 samples x 0.5 s of horizon in about 7-8 ms of one core for
Walker2d (``scripts/walk_true_model.py`` measures it). The plant itself is untouched.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np
from mujoco import rollout as mj_rollout

from gpdyn.sim.loop import Controller
from gpdyn.errors import InputError
from gpdyn.sim.rollout_states import RolloutStates

#: ``(qpos [K, H, nq], qvel [K, H, nv], controls [K, H, nu]) -> cost [K]``, the states after each
#: planning step; non-finite costs (a diverged rollout) count as the worst
PathCost = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
#: a planning model other than MuJoCo's: ``(qpos, qvel, controls [K, H, nu]) -> (qpos [K, H, nq], qvel [K, H, nv])``
Forward = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
INTEGRATORS = {"euler": mujoco.mjtIntegrator.mjINT_EULER, "rk4": mujoco.mjtIntegrator.mjINT_RK4,
               "implicit": mujoco.mjtIntegrator.mjINT_IMPLICIT, "implicitfast": mujoco.mjtIntegrator.mjINT_IMPLICITFAST}


@dataclass
class SamplerConfig:
    """Sizes and noise of :class:`SplineSampler` (the defaults walk Walker2d; docs/control.md)."""

    samples: int = 20  # K sequences per plan, the nominal among them
    horizon: int = 32  # planning steps (of ``stride`` control steps each)
    stride: int = 2  # control steps per planning step
    knots: int = 5  # spline knots over the horizon
    noise_std: float = 0.3  # knot noise, action units
    temperature: float = 0.3  # softmax temperature in units of the cost spread; 0: the best sample alone
    integrator: str = "implicitfast"  # of the planning model

    def validate(self) -> None:
        """Raise InputError naming the first impossible option."""
        checks = (("samples", self.samples >= 2), ("horizon", self.horizon >= 2), ("stride", self.stride >= 1),
                  ("knots", 2 <= self.knots <= self.horizon), ("noise_std", np.isfinite(self.noise_std) and self.noise_std > 0),
                  ("temperature", np.isfinite(self.temperature) and self.temperature >= 0),
                  ("integrator", self.integrator in INTEGRATORS))
        for name, ok in checks:
            if not ok:
                raise InputError(f"spline sampler: option {name}={getattr(self, name)!r} is out of range")


def linear_spline_matrix(horizon: int, knots: int) -> np.ndarray:
    """``[horizon, knots]`` weights: row ``t`` interpolates the knots (evenly spaced over
    ``0..horizon-1``) linearly at step ``t``; each row sums to 1."""
    times = np.linspace(0.0, horizon - 1.0, knots)
    weights = np.zeros((horizon, knots))
    for t in range(horizon):
        j = min(int(np.searchsorted(times, t, side="right")) - 1, knots - 2)
        a = (t - times[j]) / (times[j + 1] - times[j])
        weights[t, j], weights[t, j + 1] = 1.0 - a, a
    return weights


class SplineSampler:
    """Predictive sampling (module docs) with ``model`` as the planning model.

    ``model``: the plant's ``MjModel`` (copied; the copy gets the planning time step and
    integrator). ``control_dt``: the plant's control period. ``low``/``high``: the action box.
    ``forward``: another planning model in place of MuJoCo's, ``(qpos [nq], qvel [nv],
    controls [K, H, nu]) -> (qpos [K, H, nq], qvel [K, H, nv])`` with each control held for
    ``stride`` control steps (e.g. :class:`LearnedForward`, a learned model).
    """

    def __init__(self, model: mujoco.MjModel, cost: PathCost, control_dt: float, low: np.ndarray, high: np.ndarray,
                 config: SamplerConfig | None = None, seed: int = 0, forward: Forward | None = None) -> None:
        self.config = config or SamplerConfig()
        self.config.validate()
        if model.na:
            raise InputError(f"spline sampler: the model has {model.na} actuator activation states, which [qpos, qvel] "
                             "does not carry")
        if not control_dt > 0:
            raise InputError(f"spline sampler: control_dt must be > 0, got {control_dt}")
        cfg = self.config
        self.model = copy.deepcopy(model)
        self.model.opt.timestep = control_dt * cfg.stride
        self.model.opt.integrator = INTEGRATORS[cfg.integrator]
        self.data = mujoco.MjData(self.model)
        self.cost = cost
        self.low, self.high = np.broadcast_to(low, (model.nu,)).astype(float), np.broadcast_to(high, (model.nu,)).astype(float)
        self.rng = np.random.default_rng(seed)
        self.spline = linear_spline_matrix(cfg.horizon, cfg.knots)
        self.knot_times = np.linspace(0.0, cfg.horizon - 1.0, cfg.knots)
        self.states = RolloutStates(self.model)
        self.forward = forward
        self.reset()

    def reset(self) -> None:
        """Forget the nominal plan (zero actions)."""
        self.nominal = np.zeros((self.config.knots, self.model.nu))

    def rollout(self, qpos: np.ndarray, qvel: np.ndarray, controls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """States after each planning step, ``(qpos [K, H, nq], qvel [K, H, nv])``, of ``controls [K, H, nu]``
        from ``(qpos, qvel)``."""
        if self.forward is not None:
            return self.forward(qpos, qvel, controls)
        init = self.states.initial(qpos, qvel, rows=controls.shape[0])
        states, _ = mj_rollout.rollout(self.model, self.data, init, controls)
        return states[..., self.states.qpos], states[..., self.states.qvel]

    def plan(self, qpos: np.ndarray, qvel: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """The action for the current state and a record of the plan (best cost, CPU seconds)."""
        start = time.process_time()
        cfg = self.config
        qpos, qvel = np.asarray(qpos, dtype=float), np.asarray(qvel, dtype=float)
        if qpos.shape != (self.model.nq,) or qvel.shape != (self.model.nv,):
            raise InputError(f"spline sampler: state of shapes {qpos.shape}, {qvel.shape}, expected "
                             f"({self.model.nq},), ({self.model.nv},)")
        knots = self.nominal + cfg.noise_std * self.rng.standard_normal((cfg.samples, cfg.knots, self.model.nu))
        knots[0] = self.nominal
        knots = np.clip(knots, self.low, self.high)
        controls = np.einsum("hn,knu->khu", self.spline, knots)
        path_q, path_v = self.rollout(qpos, qvel, controls)
        cost = self.cost(path_q, path_v, controls)
        cost = np.where(np.isfinite(cost), cost, np.inf)
        best = int(np.argmin(cost))
        if not np.isfinite(cost[best]):  # every rollout diverged: keep the nominal
            chosen = self.nominal
        elif cfg.temperature > 0:
            finite = np.isfinite(cost)
            spread = np.median(cost[finite]) - cost[best]
            weights = np.where(finite, np.exp(-(cost - cost[best]) / (cfg.temperature * spread + 1e-12)), 0.0)
            chosen = np.einsum("k,knu->nu", weights / weights.sum(), knots)
        else:
            chosen = knots[best]
        action = self.spline[0] @ chosen
        # warm start: the chosen spline, shifted by one control step (a fraction of a planning step)
        shifted = self.knot_times + 1.0 / cfg.stride
        self.nominal = np.stack([np.interp(shifted, self.knot_times, chosen[:, u]) for u in range(self.model.nu)], -1)
        return action, {"plan_cost": float(cost[best]), "plan_cpu_s": time.process_time() - start}


class SamplingController(Controller):
    """:class:`SplineSampler` on the episode's own plant, as a :class:`gpdyn.sim.loop.Controller`.

    At each episode's start the planning model is copied from the environment's ``MjModel``
    (so a plant change made before the episode is in the model; one made during it is not:
    that is the learned model's job). ``act`` plans from the simulator's raw state
    ``(qpos, qvel)``, not the observation (which may clip velocities).
    """

    def __init__(self, cost: PathCost, control_dt: float, config: SamplerConfig | None = None, seed: int = 0,
                 name: str = "true-sampling") -> None:
        self.cost, self.control_dt, self.config, self.seed, self.name = cost, control_dt, config or SamplerConfig(), seed, name
        self.config.validate()
        self.sampler: SplineSampler | None = None
        self._episodes = 0
        self._cpu: list[float] = []

    def reset(self, env: Any) -> None:
        model = env.unwrapped.model
        self.data = env.unwrapped.data
        self.sampler = SplineSampler(model, self.cost, self.control_dt, model.actuator_ctrlrange[:, 0],
                                     model.actuator_ctrlrange[:, 1], self.config, seed=self.seed + self._episodes)
        self._episodes += 1
        self._cpu = []

    def act(self, obs: np.ndarray, info: Any) -> tuple[np.ndarray, dict[str, Any]]:
        if self.sampler is None:
            raise InputError("SamplingController.act: reset(env) was not called")
        action, record = self.sampler.plan(self.data.qpos.copy(), self.data.qvel.copy())
        self._cpu.append(record["plan_cpu_s"])
        return action, record

    def summary(self) -> dict[str, Any]:
        cpu = np.asarray(self._cpu) if self._cpu else np.zeros(1)
        return {"plan_cpu_ms_mean": float(cpu.mean() * 1e3), "plan_cpu_ms_p95": float(np.percentile(cpu, 95) * 1e3)}



class LearnedForward:
    """A learned forward model as the sampler's planning model (``SplineSampler(forward=...)``).

    ``dynamics``: ``(state [K, nx], action [K, nu]) -> next_state [K, nx]`` over one control
    step in torch, e.g. ``LearnedDynamics.predict_mean`` (:mod:`gpdyn.control.dynamics`;
    the state is ``[qpos, qvel]``). Each planning step holds its control for ``stride``
    control steps, as the MuJoCo planning model does with its longer time step.

    A pure GP model of contact-rich walking does not rank the sampler's plans
    (``scripts/sampler_learned_model.py``); :class:`gpdyn.control.hybrid_model.HybridForward`
    keeps MuJoCo's nominal physics and learns only a GP residual on top of it.
    """

    def __init__(self, dynamics: Callable[[Any, Any], Any], nq: int, stride: int, device: Any = "cpu",
                 dtype: Any = None) -> None:
        import torch

        self.torch, self.dynamics, self.nq, self.stride = torch, dynamics, int(nq), int(stride)
        self.device, self.dtype = torch.device(device), dtype or torch.float64

    def __call__(self, qpos: np.ndarray, qvel: np.ndarray, controls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        torch = self.torch
        k, h, _ = controls.shape
        kw = {"device": self.device, "dtype": self.dtype}
        state = torch.as_tensor(np.concatenate([qpos, qvel]), **kw).expand(k, -1)
        u = torch.as_tensor(controls, **kw)
        path = torch.empty(k, h, state.shape[-1], **kw)
        with torch.no_grad():
            for t in range(h):
                for _ in range(self.stride):
                    state = self.dynamics(state, u[:, t])
                path[:, t] = state
        out = path.cpu().numpy().astype(np.float64)
        return out[..., : self.nq], out[..., self.nq :]
__all__ = ["INTEGRATORS", "Forward", "LearnedForward", "PathCost", "SamplerConfig", "SamplingController", "SplineSampler",
           "linear_spline_matrix"]
