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
integrator (``implicitfast``, damping taken implicitly; a stride of 3 control steps diverged on
some rollouts, which then count as the worst). One planning step costs one ``mj_step`` instead of
the plant's eight RK4 steps, which keeps a plan within the control period (the ``walker-sampling``
recipes' reports give the times). The plant itself is untouched.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np
from mujoco import rollout as mj_rollout

from gpdyn.control.planner import PathModel, Planner, PlanningController
from gpdyn.errors import InputError
from gpdyn.sim.rollout_states import RolloutStates

#: ``(qpos [K, H, nq], qvel [K, H, nv], controls [K, H, nu]) -> cost [K]``, the states after each
#: planning step; non-finite costs (a diverged rollout) count as the worst
PathCost = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
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


def mujoco_rollout(model: mujoco.MjModel, data: mujoco.MjData, states: RolloutStates, state: np.ndarray,
                   controls: np.ndarray, control_spec: int | None = None) -> np.ndarray:
    """The planning states ``[K, H, nx]`` (a view of ``mujoco.rollout``'s output) after each step of ``model`` under
    ``controls [K, H, ...]`` from ``state [nx]`` or ``[K, nx]``: MuJoCo's rollout as a
    :class:`~gpdyn.control.planner.PathModel` (``control_spec``: what each control row holds, default the actuators')."""
    init = states.start(state, controls.shape[0], "planning model")
    kwargs = {} if control_spec is None else {"control_spec": control_spec}
    out, _ = mj_rollout.rollout(model, data, init, controls, **kwargs)
    return out[..., states.planning]


#: what each control row of a rollout holds when a generalized force enters every step: the actuators' controls, then
#: ``qfrc_applied [nv]``
FORCE_SPEC = mujoco.mjtState.mjSTATE_CTRL.value | mujoco.mjtState.mjSTATE_QFRC_APPLIED.value


class StepwiseRollout:
    """One planning step at a time through a persistent ``mujoco.rollout.Rollout`` without its per-call checks and
    allocations, so that a learned term computed from each step's states can enter the next step and ``H``
    one-step calls cost about one whole-horizon call (docs/results/implementation-timings.md)."""

    def __init__(self) -> None:
        self._runner: Any = None  # made at the first step (a Rollout does not copy)
        self._models: list[mujoco.MjModel] = []
        self._out = self._no_sensors = np.empty(0)

    def step(self, model: mujoco.MjModel, data: mujoco.MjData, states: np.ndarray, controls: np.ndarray,
             force: np.ndarray | None = None) -> np.ndarray:
        """The rollout states ``[K, size]`` after one step of ``model`` from ``states [K, size]`` under ``controls
        [K, nu]`` and (if given) the generalized force ``force [K, nv]`` applied inside the step. The result is this
        object's buffer: the next call overwrites it."""
        k = states.shape[0]
        if self._runner is None:
            self._runner = mj_rollout.Rollout(nthread=0)
        if len(self._models) != k or self._models[0] is not model:
            self._models = [model] * k
            self._out, self._no_sensors = np.empty((k, 1, states.shape[1])), np.empty((k, 1, model.nsensordata))
        rows = controls if force is None else np.concatenate([controls, force], -1)
        self._runner.rollout(self._models, [data], states, np.ascontiguousarray(rows[:, None], dtype=np.float64),
                             skip_checks=True, nstep=1,
                             control_spec=mujoco.mjtState.mjSTATE_CTRL.value if force is None else FORCE_SPEC,
                             state=self._out, sensordata=self._no_sensors)
        return self._out[:, 0]


def split_state(states: np.ndarray, nq: int) -> tuple[np.ndarray, np.ndarray]:
    """``(qpos, qvel)`` views of planning states ``[..., nx]``."""
    return states[..., :nq], states[..., nq:]


class MujocoForward(PathModel):
    """A MuJoCo model as the sampler's planning model: a copy of ``model`` with the planning time step
    ``control_dt * stride`` and ``integrator`` (module docs), a :class:`~gpdyn.control.planner.PathModel` on numpy
    arrays whose step is one planning step. The true-model planner's, on a copy of the plant's own ``MjModel``."""

    def __init__(self, model: mujoco.MjModel, control_dt: float, stride: int = 2, integrator: str = "implicitfast") -> None:
        if integrator not in INTEGRATORS:
            raise InputError(f"planning model: integrator {integrator!r} is not one of {', '.join(INTEGRATORS)}")
        if not (control_dt > 0 and stride >= 1):
            raise InputError(f"planning model: need control_dt > 0 and stride >= 1, got {control_dt}, {stride}")
        if model.na:
            raise InputError(f"planning model: the model has {model.na} actuator activation states, which [qpos, qvel] "
                             "does not carry")
        self.model = copy.deepcopy(model)
        self.model.opt.timestep = control_dt * stride
        self.model.opt.integrator = INTEGRATORS[integrator]
        self.data = mujoco.MjData(self.model)
        self.states = RolloutStates(self.model)

    def rollout(self, state: np.ndarray, actions: np.ndarray) -> np.ndarray:
        return mujoco_rollout(self.model, self.data, self.states, state, actions)


class SplineSampler(Planner):
    """Predictive sampling (module docs), a :class:`~gpdyn.control.planner.Planner` on numpy arrays.

    ``model``: the plant's ``MjModel`` (its sizes; with no ``forward``, its copy at the planning
    time step and integrator is the planning model, :class:`MujocoForward`). ``control_dt``: the
    plant's control period. ``low``/``high``: the action box. ``forward``: another planning model,
    a :class:`~gpdyn.control.planner.PathModel` on numpy arrays whose step holds each control for
    ``stride`` control steps (e.g. :class:`LearnedForward`, a learned model).
    """

    def __init__(self, model: mujoco.MjModel, cost: PathCost, control_dt: float, low: np.ndarray, high: np.ndarray,
                 config: SamplerConfig | None = None, seed: int = 0, forward: PathModel | None = None) -> None:
        self.config = config or SamplerConfig()
        self.config.validate()
        if model.na:
            raise InputError(f"spline sampler: the model has {model.na} actuator activation states, which [qpos, qvel] "
                             "does not carry")
        if not control_dt > 0:
            raise InputError(f"spline sampler: control_dt must be > 0, got {control_dt}")
        cfg = self.config
        self.nq, self.nx, self.nu = model.nq, model.nq + model.nv, model.nu
        self.cost = cost
        self.low, self.high = np.broadcast_to(low, (model.nu,)).astype(float), np.broadcast_to(high, (model.nu,)).astype(float)
        self.rng = np.random.default_rng(seed)
        self.spline = linear_spline_matrix(cfg.horizon, cfg.knots)
        self.knot_times = np.linspace(0.0, cfg.horizon - 1.0, cfg.knots)
        self.forward: PathModel = forward if forward is not None else MujocoForward(model, control_dt, cfg.stride,
                                                                                    cfg.integrator)
        self.reset()

    def reset(self) -> None:
        """Forget the nominal plan (zero actions)."""
        self.nominal = np.zeros((self.config.knots, self.nu))

    def rollout(self, state: np.ndarray, controls: np.ndarray) -> np.ndarray:
        """Planning states after each planning step, ``[K, H, nx]``, of ``controls [K, H, nu]`` from ``state [nx]``."""
        return self.forward.rollout(state, controls)

    def controls(self, knots: np.ndarray) -> np.ndarray:
        """The control sequences ``[K, H, nu]`` of spline knots ``[K, knots, nu]``."""
        return np.einsum("hn,knu->khu", self.spline, knots)

    def plan(self, state: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """The action for the planning state ``[qpos, qvel]`` and a record of the plan (best cost, CPU seconds)."""
        start = time.process_time()
        cfg = self.config
        state = np.asarray(state, dtype=float)
        if state.shape != (self.nx,):
            raise InputError(f"spline sampler: state of shape {state.shape}, expected ({self.nx},) = [qpos, qvel]")
        knots = self.nominal + cfg.noise_std * self.rng.standard_normal((cfg.samples, cfg.knots, self.nu))
        knots[0] = self.nominal
        knots = np.clip(knots, self.low, self.high)
        controls = self.controls(knots)
        path_q, path_v = split_state(self.rollout(state, controls), self.nq)
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
        self.nominal = np.stack([np.interp(shifted, self.knot_times, chosen[:, u]) for u in range(self.nu)], -1)
        return action, {"plan_cost": float(cost[best]), "plan_cpu_s": time.process_time() - start}


class SamplingController(PlanningController):
    """:class:`SplineSampler` on the episode's own plant: the :class:`~gpdyn.control.planner.PlanningController`
    of the spline sampler.

    At each episode's start the planning model is copied from the environment's ``MjModel``
    (so a plant change made before the episode is in the model; one made during it is not:
    that is the learned model's job). ``act`` plans from the simulator's raw state
    ``[qpos, qvel]``, not the observation (which may clip velocities).
    """

    def __init__(self, cost: PathCost, control_dt: float, config: SamplerConfig | None = None, seed: int = 0,
                 name: str = "true-sampling") -> None:
        super().__init__(name, self.make_sampler)
        self.cost, self.control_dt, self.config, self.seed = cost, control_dt, config or SamplerConfig(), seed
        self.config.validate()
        self._episodes = 0
        self._cpu: list[float] = []

    def make_sampler(self, env: Any) -> SplineSampler:
        """The episode's sampler on a copy of the environment's model (a fresh seed per episode)."""
        model = env.unwrapped.model
        self._episodes += 1
        return SplineSampler(model, self.cost, self.control_dt, model.actuator_ctrlrange[:, 0],
                             model.actuator_ctrlrange[:, 1], self.config, seed=self.seed + self._episodes - 1)

    @property
    def sampler(self) -> SplineSampler | None:
        """The episode's sampler (None before the first episode)."""
        return self.planner

    def start_episode(self) -> None:
        self._cpu = []

    def record(self, plan: Mapping[str, Any]) -> dict[str, Any]:
        self._cpu.append(plan["plan_cpu_s"])
        return dict(plan)

    def summary(self) -> dict[str, Any]:
        cpu = np.asarray(self._cpu) if self._cpu else np.zeros(1)
        return {"plan_cpu_ms_mean": float(cpu.mean() * 1e3), "plan_cpu_ms_p95": float(np.percentile(cpu, 95) * 1e3)}


class LearnedForward(PathModel):
    """A torch planning model as the sampler's planning model (``SplineSampler(forward=...)``): a
    :class:`~gpdyn.control.planner.PathModel` on numpy arrays over planning steps.

    ``dynamics``: a torch :class:`~gpdyn.control.planner.PlanningModel` over one control step, e.g.
    :class:`~gpdyn.control.dynamics.LearnedDynamics` (its ``predict_mean`` is called; the state is
    ``[qpos, qvel]``), or such a step function ``(state [K, nx], action [K, nu]) -> next_state [K, nx]``.
    Each planning step holds its control for ``stride`` control steps, as the MuJoCo planning model does
    with its longer time step.

    A pure GP model of contact-rich walking does not rank the sampler's plans
    (``scripts/sampler_learned_model.py``); :class:`gpdyn.control.hybrid_model.HybridForward`
    keeps MuJoCo's nominal physics and learns only a GP residual on top of it.
    """

    def __init__(self, dynamics: Any, nq: int, stride: int, device: Any = "cpu", dtype: Any = None) -> None:
        import torch

        step = getattr(dynamics, "predict_mean", dynamics)
        if not callable(step):
            raise InputError(f"LearnedForward: dynamics must be a planning model or a step function, got {dynamics!r}")
        self.torch, self.dynamics, self.nq, self.stride = torch, step, int(nq), int(stride)
        self.device, self.dtype = torch.device(device), dtype or torch.float64

    def rollout(self, state: np.ndarray, actions: np.ndarray) -> np.ndarray:
        torch = self.torch
        k, h, _ = actions.shape
        kw = {"device": self.device, "dtype": self.dtype}
        x = torch.as_tensor(np.asarray(state, dtype=float), **kw).expand(k, -1)
        u = torch.as_tensor(actions, **kw)
        path = torch.empty(k, h, x.shape[-1], **kw)
        with torch.no_grad():
            for t in range(h):
                for _ in range(self.stride):
                    x = self.dynamics(x, u[:, t])
                path[:, t] = x
        return path.cpu().numpy().astype(np.float64)


__all__ = ["INTEGRATORS", "LearnedForward", "MujocoForward", "PathCost", "SamplerConfig", "SamplingController",
           "SplineSampler", "linear_spline_matrix", "mujoco_rollout", "split_state"]
