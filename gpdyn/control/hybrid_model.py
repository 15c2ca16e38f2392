"""A hybrid planning model for the spline sampler: nominal MuJoCo physics plus a GP residual learned online.

What the "learned model" is here: the sampler's planning model of the NOMINAL plant (a
copy of its ``MjModel`` at the planning step, :class:`gpdyn.control.spline_sampling.SplineSampler`)
plus a Gaussian-process residual of each planning step (a generalized force by default, or
a joint-velocity change), learned online from the controller's own executed transitions (residual physics:
Zeng et al. 2020, "TossingBot"; Johannink et al. 2019, "Residual Reinforcement Learning
for Robot Control"; with a GP residual as in Deisenroth & Rasmussen 2011's GP dynamics
and Nguyen-Tuong & Peters 2010, "Using model knowledge for learning inverse dynamics").
A pure 17-D GP of contact-rich walking does not rank 0.5 s plans as the plant does
(``scripts/sampler_learned_model.py``; docs/control.md, "Walker2d: a learned model under the
planner"); the physics prior carries the contacts and the GP only the difference a plant
change makes.

One planning step from ``s = (qpos, qvel)`` under control ``u`` (held for ``stride``
control steps), ``space="force"`` (the default):

    tau = GP(u)                                               # a generalized force of the action alone
    (qpos', qvel') = mj_step_nominal(s, u, qfrc_applied=tau)  # applied inside MuJoCo's step: contacts answer it

so a whole K x H plan needs one GP prediction and one ``mujoco.rollout`` call. A registered learner over all
inputs (``learner="wiski"``, ...) makes the force a function of the state too, ``tau = GP(x)`` with ``x`` as
below: it is then predicted step by step from each planning step's own state, still applied inside the step. Its
targets (``force_target="contact"``) are the forces that, applied through the nominal
plant's own steps, reproduce each observed ``qvel_{t+stride}``, contacts included
(:meth:`HybridForward.contact_force`); ``"inertia"`` takes ``M(q_t) (qvel_{t+stride} -
qvel_nominal) / (stride dt)`` through the nominal mass matrix, which ignores the contacts.
A weakened motor is exactly such a force, ``-(1 - f) gear u`` on its joint, whatever the
state. An online check keeps the residual in the planning model only while it predicts the
executed transitions better than the nominal plant (``gate_window``). ``space="velocity"``:

    (qpos', qvel') = mj_step_nominal(s, u)                    # the nominal planning model
    r = GP(x),  x = [qpos[1:], qvel, u]                       # walker-1's input layout
    qvel' += r,  qpos' += dt_plan * r                         # the velocity change enters the position by the same step

Targets: an executed transition over ``stride`` control steps ``s_t -> s_{t+stride}``
under the controls ``a_t .. a_{t+stride-1}`` gives ``x = [qpos_t[1:], qvel_t, mean(a)]`` and
``r = qvel_{t+stride} - qvel_nominal(s_t, a_t .. a_{t+stride-1})``, where (``target="plant"``,
the default) ``qvel_nominal`` is the NOMINAL PLANT simulated at its own resolution (RK4 at
2 ms for Walker2d) under the executed controls: what the plant change did, and nothing
else. ``target="planning"`` takes the nominal planning model's one coarse step under
``mean(a)`` instead; its residual then also carries the coarse model's own error (implicit
16 ms steps against RK4 2 ms), which through contacts is large and unpredictable from ``x``
on held-out transitions (docs/results/walk-learned-model/report.md): it drowns the plant
change. The true-model planner plans with the same coarse model of the changed plant, so
the plant-resolution target is the one that makes the hybrid model approach it. The
residual GP is gpdyn's :class:`gpdyn.gp.residual.ResidualGP`
with a zero prior (a sliding-window exact SE-ARD GP, rank-q Cholesky updates, or a
linear-kernel GP), on inputs and targets scaled by the first ``warmup`` transitions'
spread. Its predictions are batched over the ``K`` samples at each planning step.

On top of the identified parameters (``HybridForward(identification=...)``, the walker's
``parameters+residual`` model): the plant's physical parameters are identified online as
:class:`gpdyn.control.identified_model.IdentifiedForward` does, and the residual is learned
against the identified plant and added to the identified planning model (each while its own
online check trusts it). The parameters carry what the 15 factors can represent (a weak
motor, a heavier body, slipping feet) and the GP only what they cannot (a joint spring).
Each transition's residual target and check are against the identified model from before
the transition; the identification learns it after them (with ``update_every`` n > 1 it
learns the transitions the residual learns, every n-th).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import mujoco
import numpy as np
import torch
from mujoco import rollout as mj_rollout

from gpdyn.control.identified_model import IdentificationConfig, IdentifiedForward
from gpdyn.control.joint_force_gp import FORCE_STEP
from gpdyn.control.online_check import OnlineCheck
from gpdyn.control.planner import PathModel
from gpdyn.control.spline_sampling import (FORCE_SPEC, INTEGRATORS, PathCost, SamplerConfig, SamplingController,
                                           SplineSampler, StepwiseRollout, mujoco_rollout, split_state)
from gpdyn.errors import InputError
from gpdyn.gp import make_learner
from gpdyn.gp.wiski import for_control
from gpdyn.sim.rollout_states import RolloutStates


@dataclass
class ResidualConfig:
    """The residual GP of :class:`HybridForward` (a :class:`gpdyn.gp.residual.ResidualGP` with a zero prior)."""

    # "linear" (default): a linear-kernel GP (Bayesian linear regression) over ``linear_inputs``; "se": an exact
    # SE-ARD GP over all 23 inputs, whose median-trick lengthscales in 23-D predict ~0 away from the window's points
    # (held-out residual error unchanged on the weak hip, tests/test_walk_learned_model.py)
    kernel: str = "linear"
    # the residual's learner: "residual" (gpdyn's ResidualGP with ``kernel`` above) or any registered online learner
    # ("wiski", "svdgp", "ssgp", ...) at ``learner_preset`` with ``learner_options``, over all 23 inputs, as a
    # velocity change or a force: a change that depends on the state (a joint spring) is within its reach, where
    # the ResidualGP's force is linear in the action alone. It observes every transition and takes ``learner_steps``
    # optimiser steps on it (0: its hyperparameters stay those of its start on the warm-up transitions, and an
    # observe is the exact posterior update: WISKI's constant-time caches, kept current by Woodbury updates,
    # gpdyn.gp.wiski.for_control)
    learner: str = "residual"
    learner_preset: str = "small"
    learner_options: dict[str, bool | int | float | str] = field(default_factory=dict)
    learner_steps: int = 0
    window: int = 300  # most recent transitions it conditions on
    warmup: int = 30  # transitions that fix the input/target scales and median lengthscales before it predicts
    amplitude: float = 1.0  # SE prior standard deviation**2 (scaled targets)
    noise: float = 0.1  # noise variance (scaled targets)
    lengthscale_factor: float = 1.0  # times the median-trick lengthscales
    refit_every: int = 100  # SE: observed transitions between refits of the hyperparameters
    refit_iters: int = 0  # SE: Adam steps per refit (0: never)
    forget: float = 1.0  # linear: forgetting factor per transition
    # linear: over the "action" alone (r = b + W u over the sliding window: a locally linear actuator residual) or "all" 23 inputs
    linear_inputs: str = "action"
    # "velocity": the GP predicts the velocity change added after each planning step; "force": it predicts a
    # generalized force (the velocity residual times the nominal mass matrix, per second) that MuJoCo applies
    # inside every step (``qfrc_applied``), so that contacts and inertia answer it; with learner "residual" it
    # needs the action-only linear kernel
    space: str = "force"
    target: str = "plant"  # "plant": residual against the nominal plant simulated at its own step; "planning": against the planning model
    # force space: how a transition's velocity residual becomes its force target. "contact": the force that, applied
    # through the nominal plant's own step (contacts included), reproduces the observed velocity (Gauss-Newton on
    # a finite-difference Jacobian); "inertia": M(q) dv / dt, which ignores the contacts (HybridForward.target)
    force_target: str = "contact"
    force_iterations: int = 3  # "contact": Gauss-Newton (chord) iterations
    # force space: the generalized coordinates the force acts on: "all", or "actuated" (the actuators' joints only:
    # no force on the floating base, where a target's unidentifiable part otherwise lands as a bias)
    force_dofs: str = "all"
    # control steps between the transitions it learns, and the work of each spread over them. 1: at every control step
    # the planning step that ends there (consecutive transitions share stride - 1 control steps), its target, check
    # and update all at that step. n > 1: the planning step ending at every n-th control step (with n = stride: one
    # per planning step, none overlapping), its nominal step, target (the contact target's Jacobian rows in chunks
    # and iterations) and update cut into n pieces of about equal plant simulation, one per control step
    # (HybridForward.observe_in_pieces), so that no control step carries a whole update; the targets are the same.
    # The online check still predicts the planning step ending at every control step (check_transition: two plant
    # rows), so that it switches a residual off as soon after the warm-up as with n = 1
    update_every: int = 1
    # the online check: each transition is predicted before it is learned, and over the last gate_window of them the
    # residual is used only while its one-step squared error is below the nominal plant's (0: always used). A plant
    # change the residual's form cannot express (feet that slip: foot friction x0.5) otherwise makes it worse than none
    gate_window: int = 100
    # ... and below gate_margin times it: a residual that explains less than (1 - gate_margin) of the nominal plant's
    # squared error is noise the planner pays for (1.0: any improvement). 0.9 keeps a residual that cannot express the
    # change (halved foot friction) out without switching off one that can (a weak hip): the development runs that chose
    # it are in docs/results/walk-learned-model/report.md
    gate_margin: float = 0.9

    def validate(self) -> None:
        """Raise InputError naming the first impossible option."""
        from gpdyn.config import LEARNER_NAMES, PRESET_NAMES

        checks = (("kernel", self.kernel in ("se", "linear")), ("target", self.target in ("plant", "planning")),
                  ("learner", self.learner in LEARNER_NAMES),
                  ("learner_preset", self.learner_preset in PRESET_NAMES), ("learner_steps", self.learner_steps >= 0),
                  ("linear_inputs", self.linear_inputs in ("all", "action")),
                  ("space", self.space == "velocity" or (self.space == "force" and self.target == "plant" and (
                      self.learner != "residual" or (self.kernel == "linear" and self.linear_inputs == "action")))),
                  ("window", self.window >= 4),
                  ("warmup", 2 <= self.warmup <= self.window), ("amplitude", np.isfinite(self.amplitude) and self.amplitude > 0),
                  ("noise", np.isfinite(self.noise) and self.noise > 0),
                  ("lengthscale_factor", np.isfinite(self.lengthscale_factor) and self.lengthscale_factor > 0),
                  ("refit_every", self.refit_every >= 1), ("refit_iters", self.refit_iters >= 0),
                  ("forget", 0 < self.forget <= 1), ("force_target", self.force_target in ("contact", "inertia")),
                  ("force_iterations", self.force_iterations >= 1), ("force_dofs", self.force_dofs in ("all", "actuated")),
                  ("update_every", self.update_every >= 1),
                  ("gate_window", self.gate_window >= 0),
                  ("gate_margin", np.isfinite(self.gate_margin) and 0 < self.gate_margin <= 1))
        for name, ok in checks:
            if not ok:
                extra = (" (the force space needs target='plant' and, with learner='residual', kernel='linear' and "
                         "linear_inputs='action'; use space='velocity' otherwise)" if name == "space" and self.space == "force"
                         else "")
                raise InputError(f"residual model: option {name}={getattr(self, name)!r} is out of range{extra}")


def _finish(steps: Iterator[Any]) -> Any:
    """Run the rest of a generator of pieces (:meth:`HybridForward.observe_in_pieces`, its contact target) at
    once; what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


class _Pieces:
    """The plant-rollout rows one piece of :meth:`HybridForward.observe_in_pieces` may run (``per``) and has run."""

    def __init__(self, per: float) -> None:
        self.per, self.used = per, 0

    def room(self) -> Iterator[None]:
        """Yield (end the piece) where this one has no room left: before the next rollout."""
        if self.used >= self.per:
            yield
            self.used = 0


class HybridForward(PathModel):
    """Nominal planning model + online GP residual (force or velocity, module docs), a
    :class:`~gpdyn.control.planner.PathModel` on numpy arrays over planning steps for ``SplineSampler(forward=...)``.

    ``model``: the nominal plant's ``MjModel`` (copied; the copy gets the planning time step
    ``control_dt * stride`` and ``integrator``, as the sampler's own planning model).
    Until ``warmup`` transitions are observed (and always, if none are) the residual is zero
    and a rollout is the sampler's MuJoCo rollout itself.
    """

    def __init__(self, model: mujoco.MjModel, control_dt: float, stride: int = 2, integrator: str = "implicitfast",
                 config: ResidualConfig | None = None, seed: int = 0,
                 identification: IdentificationConfig | None = None) -> None:
        self.config = config or ResidualConfig()
        self.config.validate()
        if integrator not in INTEGRATORS:
            raise InputError(f"hybrid model: integrator {integrator!r} is not one of {', '.join(INTEGRATORS)}")
        if not (control_dt > 0 and stride >= 1):
            raise InputError(f"hybrid model: need control_dt > 0 and stride >= 1, got {control_dt}, {stride}")
        if model.nq != model.nv:
            raise InputError(f"hybrid model: needs nq == nv (hinge and slide joints), got {model.nq}, {model.nv}")
        self.plant_model = copy.deepcopy(model)  # the nominal plant at its own resolution: the residual's reference
        self.plant_data = mujoco.MjData(self.plant_model)
        self.frame_skip = int(round(control_dt / model.opt.timestep))
        if self.frame_skip < 1 or abs(self.frame_skip * model.opt.timestep - control_dt) > 1e-9:
            raise InputError(f"hybrid model: control_dt {control_dt} is not a multiple of the model's timestep {model.opt.timestep}")
        self.model = copy.deepcopy(model)
        self.model.opt.timestep = control_dt * stride
        self.model.opt.integrator = INTEGRATORS[integrator]
        self.data = mujoco.MjData(self.model)
        self.dt, self.stride, self.seed = float(self.model.opt.timestep), int(stride), int(seed)
        self._control_dt = float(control_dt)
        self.nq, self.nv, self.nu = model.nq, model.nv, model.nu
        self.states = RolloutStates(self.model)
        # the coordinates the residual force acts on (the velocity space: every qvel)
        actuated = sorted({int(model.jnt_dofadr[j]) for j in model.actuator_trnid[:, 0]})
        self.force_dofs = np.array(actuated if self.config.space == "force" and self.config.force_dofs == "actuated"
                                   else range(model.nv))
        self.learner: Any = None
        self._stepper = StepwiseRollout()
        self._plant_runner: Any = None  # mujoco.rollout.Rollout of nominal_plant, made at its first call
        self._plant_buffers: dict[int, tuple[list[mujoco.MjModel], np.ndarray, np.ndarray]] = {}
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self.observed = 0
        self.x_mean = self.x_scale = self.r_scale = None
        self.check = OnlineCheck(self.config.gate_window, self.config.gate_margin)
        # the physical parameters identified under the residual: it is then learned against (and added to) the
        # identified plant instead of the nominal one
        if identification is not None and identification.joint_gp_points:
            raise InputError("hybrid model: a residual on top of identified parameters with the joint GP "
                             "(joint_gp_points > 0) is not supported: the joint GP is the residual there")
        self.identified = (None if identification is None else
                           IdentifiedForward(model, control_dt, stride, integrator, identification))

    # ----------------------------------------------------------------- the model
    @property
    def planning_model(self) -> mujoco.MjModel:
        """The planning model the residual adds to: the nominal one, or the identified one while it is in use."""
        return self.model if self.identified is None else self.identified.planning_model

    @property
    def reference_plant(self) -> mujoco.MjModel:
        """The plant at its own resolution that the residual's targets and checks are against: the nominal plant,
        or the identified one while it is in use."""
        return self.plant_model if self.identified is None else self.identified.plant_model

    def nominal_step(self, qpos: np.ndarray, qvel: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One nominal planning step of ``K`` states ``qpos, qvel [K, n]`` under ``u [K, nu]``."""
        out, _ = mj_rollout.rollout(self.planning_model, self.data, self.states.initial(qpos, qvel), u[:, None, :])
        return out[:, 0, self.states.qpos], out[:, 0, self.states.qvel]

    def features(self, qpos: np.ndarray, qvel: np.ndarray, u: np.ndarray) -> np.ndarray:
        """The residual's input ``[qpos[1:], qvel, u]`` (walker-1's layout; x position does not matter)."""
        return np.concatenate([qpos[..., 1:], qvel, u], axis=-1)

    @property
    def action_only(self) -> bool:
        """Whether the residual is a function of the action alone (the linear ResidualGP over the action): then
        a plan's residuals are predicted for all its K x H steps at once, not step by step from the states."""
        cfg = self.config
        return cfg.learner == "residual" and cfg.kernel == "linear" and cfg.linear_inputs == "action"

    @property
    def active(self) -> bool:
        """Whether the residual is built (``warmup`` transitions observed)."""
        return self.learner is not None

    @property
    def in_use(self) -> bool:
        """Whether the planning model adds the residual: built, and trusted by the online check (``gate_window``)."""
        return self.learner is not None and self.check.trusted

    @property
    def distrusted_steps(self) -> int:
        """Observed transitions after which the online check had the residual off."""
        return self.check.distrusted_steps

    def residual(self, qpos: np.ndarray, qvel: np.ndarray, u: np.ndarray) -> np.ndarray:
        """The residual's mean ``[K, nv]`` as the planning model adds it, one batched prediction (zeros before
        warm-up and while the online check distrusts it): the velocity change per planning step, or
        (``space="force"``) the generalized force."""
        return self._learned(qpos, qvel, u) if self.in_use else np.zeros(qvel.shape)

    def _learned(self, qpos: np.ndarray, qvel: np.ndarray, u: np.ndarray) -> np.ndarray:
        x = torch.as_tensor((self.features(qpos, qvel, u) - self.x_mean) / self.x_scale)
        with torch.no_grad():
            r = self.learner.predict_mean(x).numpy()
        out = np.zeros(qvel.shape)
        out[..., self.force_dofs] = r * self.r_scale
        return out

    def rollout(self, state: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """Planning states ``[K, H, nx]`` after each planning step of ``actions [K, H, nu]`` from ``state [nx]``
        or ``[K, nx]``: the nominal planning model with the residual (module docs)."""
        planning = self.planning_model
        if not self.in_use:  # zero residual: the planning model's one rollout call
            return mujoco_rollout(planning, self.data, self.states, state, actions)
        k, h, _ = actions.shape
        init = self.states.start(state, k, "hybrid model")
        state = np.asarray(state, dtype=float)
        # each (sample, step) row's start state [K * H, nx], the state part of a residual of the action alone
        # (which ignores it): one start broadcast without a copy, or each sample's repeated over the steps
        starts = np.broadcast_to(state, (k * h, state.shape[-1])) if state.ndim == 1 else np.repeat(state, h, axis=0)
        starts_q, starts_v = split_state(starts, self.nq)
        force_space = self.config.space == "force"
        if force_space and self.action_only:  # a force of the action alone: predicted for all K x H, one rollout call
            force = self.residual(starts_q, starts_v, actions.reshape(k * h, -1)).reshape(k, h, self.nv)
            return mujoco_rollout(planning, self.data, self.states, state, np.concatenate([actions, force], -1),
                                  FORCE_SPEC)
        # one planning step at a time: the residual enters between steps
        controls = np.ascontiguousarray(actions, dtype=np.float64)
        paths = np.empty((k, h, self.states.size))
        current = init
        # a residual of the action alone does not depend on the rolled-out states: one batched prediction for all K x H
        ahead = None
        if self.action_only:
            ahead = self.residual(starts_q, starts_v, controls.reshape(k * h, -1)).reshape(k, h, self.nv)
        for t in range(h):
            r = ahead[:, t] if ahead is not None else self.residual(current[:, self.states.qpos],
                                                                    current[:, self.states.qvel], controls[:, t])
            # in the force space the force of this step's state and action, applied inside MuJoCo's step
            nxt = paths[:, t]
            nxt[:] = self._stepper.step(planning, self.data, current, controls[:, t], r if force_space else None)
            if not force_space:  # the velocity change after the nominal step, into the position by the same step
                nxt[:, self.states.qvel] += r
                nxt[:, self.states.qpos] += self.dt * r
            current = nxt
        return paths[..., self.states.planning]

    # ----------------------------------------------------------------- learning
    def nominal_plant(self, qpos: np.ndarray, qvel: np.ndarray, controls: np.ndarray,
                      force: np.ndarray | None = None) -> np.ndarray:
        """``qvel [K, nv]`` of the nominal plant (:attr:`reference_plant`: the identified one under ``identification``)
        at its own time step after the control steps ``controls [K, stride, nu]``, with the generalized force
        ``force [K, nv]`` applied throughout when given."""
        per_substep = np.repeat(controls, self.frame_skip, axis=1)
        spec = mujoco.mjtState.mjSTATE_CTRL.value
        if force is not None:
            per_substep = np.concatenate([per_substep, np.repeat(force[:, None, :], per_substep.shape[1], axis=1)], -1)
            spec |= mujoco.mjtState.mjSTATE_QFRC_APPLIED.value
        # through a persistent Rollout without its per-call checks and allocations (a transition's update makes
        # several small calls): its buffers kept per batch size, the result copied out of them
        per_substep = np.ascontiguousarray(per_substep, dtype=np.float64)
        n, nstep = per_substep.shape[:2]
        if self._plant_runner is None:
            self._plant_runner = mj_rollout.Rollout(nthread=0)
        reference = self.reference_plant
        buffers = self._plant_buffers.get(n)
        if buffers is None or buffers[1].shape[1] != nstep or buffers[0][0] is not reference:
            buffers = self._plant_buffers[n] = ([reference] * n, np.empty((n, nstep, self.states.size)),
                                                np.empty((n, nstep, self.plant_model.nsensordata)))
        models, out, sensors = buffers
        self._plant_runner.rollout(models, [self.plant_data], self.states.initial(qpos, qvel), per_substep,
                                   skip_checks=True, nstep=nstep, control_spec=spec, state=out, sensordata=sensors)
        return out[:, -1, self.states.qvel].copy()

    def contact_force(self, qpos: np.ndarray, qvel: np.ndarray, controls: np.ndarray, next_qvel: np.ndarray,
                      start: np.ndarray) -> np.ndarray:
        """The generalized force ``[K, nv]`` that, applied through the nominal plant's own steps (contacts and all),
        takes ``(qpos, qvel) [K, n]`` under ``controls [K, stride, nu]`` to ``next_qvel [K, nv]``: Gauss-Newton from
        ``start [K, nv]`` (on :attr:`force_dofs`, zero elsewhere) with the finite-difference Jacobian
        ``J = d qvel' / d force`` taken once there (one rollout call of the forces and their perturbations) and
        kept (the chord method: one rollout per further iteration), each step the damped least squares
        ``(J^T J + lambda I)^-1 J^T (next_qvel - qvel'(force))``. With a foot on the ground the plant's response to
        a force is not ``M^-1 force dt``: the contact takes up part of it, so the inertia inversion spreads a
        weakened hip's torque over the other joints, which these targets do not (the fitted hip columns of both:
        docs/results/walk-learned-model/report.md)."""
        return _finish(self._contact_force(qpos, qvel, controls, next_qvel, start, _Pieces(np.inf)))

    def _contact_force(self, qpos: np.ndarray, qvel: np.ndarray, controls: np.ndarray, next_qvel: np.ndarray,
                       start: np.ndarray, pieces: _Pieces) -> Generator[None, None, np.ndarray]:
        """:meth:`contact_force` as a generator that yields where ``pieces`` has no room left for the next rollout:
        the Jacobian's rows in chunks, each iteration's one row (:meth:`observe_in_pieces`); returns the force."""
        k, nv = qvel.shape
        dofs = self.force_dofs  # the force acts on these coordinates only (config.force_dofs)
        m = len(dofs)
        force = np.zeros((k, nv))
        force[:, dofs] = start[:, dofs]
        perturb = np.zeros((m + 1, nv))
        perturb[np.arange(1, m + 1), dofs] = FORCE_STEP
        trial = (force[:, None, :] + perturb[None]).reshape(-1, nv)
        rows_q, rows_v, rows_u = np.repeat(qpos, m + 1, 0), np.repeat(qvel, m + 1, 0), np.repeat(controls, m + 1, 0)
        reached = np.empty((k * (m + 1), nv))
        done = 0
        while done < len(trial):  # the rows in chunks that fit the pieces (one call when they all fit)
            yield from pieces.room()
            rows = slice(done, done + int(min(pieces.per - pieces.used, len(trial) - done)))
            reached[rows] = self.nominal_plant(rows_q[rows], rows_v[rows], rows_u[rows], trial[rows])
            pieces.used += rows.stop - done
            done = rows.stop
        reached = reached.reshape(k, m + 1, nv)
        jac = (reached[:, 1:] - reached[:, :1]).transpose(0, 2, 1) / FORCE_STEP  # [K, nv (qvel), m (force)]
        gram = jac.transpose(0, 2, 1) @ jac
        damping = 1e-6 * np.trace(gram, axis1=1, axis2=2)[:, None, None] * np.eye(m)
        lift = np.zeros((m, nv))
        lift[np.arange(m), dofs] = 1.0
        step_of = lift.T @ np.linalg.solve(gram + damping, jac.transpose(0, 2, 1))  # [K, nv, nv]: velocity miss -> force step
        # each transition keeps its best force so far: where a contact comes or goes within the step the
        # Jacobian at the start can point the wrong way, and a step that misses more is not taken
        best, best_velocity = force, reached[:, 0]
        miss = np.linalg.norm(next_qvel - best_velocity, axis=1)
        for _ in range(self.config.force_iterations):
            yield from pieces.room()
            trial = best + (step_of @ (next_qvel - best_velocity)[..., None])[..., 0]
            velocity = self.nominal_plant(qpos, qvel, controls, trial)
            pieces.used += k
            trial_miss = np.linalg.norm(next_qvel - velocity, axis=1)
            better = trial_miss < miss
            if not better.any():
                break
            best = np.where(better[:, None], trial, best)
            best_velocity = np.where(better[:, None], velocity, best_velocity)
            miss = np.where(better, trial_miss, miss)
        return best

    def mass_matrix(self, qpos: np.ndarray) -> np.ndarray:
        """The joint-space inertia ``M(q) [nv, nv]`` of the nominal plant (:attr:`reference_plant`)."""
        reference = self.reference_plant
        self.plant_data.qpos[:] = qpos
        mujoco.mj_kinematics(reference, self.plant_data)
        mujoco.mj_comPos(reference, self.plant_data)
        mujoco.mj_crb(reference, self.plant_data)
        full = np.zeros((self.nv, self.nv))
        mujoco.mj_fullM(reference, self.plant_data, full)
        return full

    def inertia_force(self, qpos: np.ndarray, dv: np.ndarray) -> np.ndarray:
        """``M(q) dv / dt [K, nv]`` through the nominal mass matrix over the planning step (the "inertia" target and
        the contact target's start)."""
        return np.stack([self.mass_matrix(q) @ d for q, d in zip(qpos, dv, strict=True)]) / (self.stride * self._control_dt)

    def target(self, qpos: np.ndarray, qvel: np.ndarray, controls: np.ndarray, next_qvel: np.ndarray,
               nominal: np.ndarray | None = None) -> np.ndarray:
        """The residual targets ``[K, nv]`` of transitions ``(qpos, qvel) [K, n]`` under ``controls [K, stride, nu]``
        to ``next_qvel [K, nv]``: observed minus nominal (``config.target``: the nominal plant or planning model;
        ``nominal``: the nominal plant's next ``qvel`` when the caller has it)."""
        if nominal is None and (self.config.space == "force" or self.config.target == "plant"):
            nominal = self.nominal_plant(qpos, qvel, controls)
        if self.config.space == "force":  # the generalized force that makes this velocity change
            inertia = self.inertia_force(qpos, next_qvel - nominal)
            if self.config.force_target == "inertia":  # M(q) dv / dt
                return inertia
            return self.contact_force(qpos, qvel, controls, next_qvel, start=inertia)
        if self.config.target == "plant":
            return next_qvel - nominal
        return next_qvel - self.nominal_step(qpos, qvel, controls.mean(1))[1]

    def observe(self, qpos: np.ndarray, qvel: np.ndarray, controls: np.ndarray, next_qvel: np.ndarray) -> None:
        """One executed transition over a planning step: ``(qpos, qvel)`` under the control steps
        ``controls [stride, nu]`` to ``next_qvel``; the GP's input takes their mean as the planning step's control."""
        _finish(self.observe_in_pieces(qpos, qvel, controls, next_qvel, 1))

    def observe_in_pieces(self, qpos: np.ndarray, qvel: np.ndarray, controls: np.ndarray, next_qvel: np.ndarray,
                          pieces: int, check: bool = True) -> Iterator[None]:
        """:meth:`observe` in ``pieces`` parts of about equal plant simulation (the nominal step, the contact target's
        Jacobian rows, each of its iterations, the check's prediction: one rollout row each): a generator that
        yields between the parts, for a controller to run one part per control step (``ResidualConfig.update_every``).
        The input is checked at its first part; the model changes at its last, with the check and the update.
        ``check=False``: without the online check (the caller gives this transition to :meth:`check_transition`)."""
        if pieces < 1:
            raise InputError(f"hybrid model: observe_in_pieces needs pieces >= 1, got {pieces}")
        qpos, qvel, controls, next_qvel = self._transition(qpos, qvel, controls, next_qvel)
        cfg = self.config
        contact = cfg.space == "force" and cfg.force_target == "contact"
        checked = check and self.learner is not None and bool(cfg.gate_window)
        rows = 1 + (len(self.force_dofs) + 1 + cfg.force_iterations if contact else 0) + checked
        part = _Pieces(np.inf if pieces == 1 else -(-rows // pieces))
        u = controls.mean(0, keepdims=True)
        nominal = self.nominal_plant(qpos, qvel, controls[None])
        part.used += 1
        # the check's predictions come first (the learner does not change before this update's end) and its
        # verdict last, so that the pieces after it hold the target's rows and the learner's update
        predictions = self._check_predictions(qpos, qvel, controls, u, nominal) if checked else None
        part.used += checked
        if contact:
            start = self.inertia_force(qpos, next_qvel - nominal)
            target = yield from self._contact_force(qpos, qvel, controls[None], next_qvel, start, part)
        else:
            target = self.target(qpos, qvel, controls[None], next_qvel, nominal)
        x = self.features(qpos, qvel, u)[0]
        r = target[0, self.force_dofs]
        self.observed += 1
        if self.learner is None:
            self._pending.append((x, r))
            if len(self._pending) >= cfg.warmup:
                self._build()
        else:
            if predictions is not None:
                self.check.add(*predictions, next_qvel)
            self._observe_scaled(x[None], r[None])
        if self.identified is not None:  # last: this transition's target and check were against the model before it
            self.identified.observe(qpos[0], qvel[0], controls, next_qvel[0])

    def _transition(self, qpos: np.ndarray, qvel: np.ndarray, controls: np.ndarray,
                    next_qvel: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """An executed transition as ``[1, n]`` rows and ``controls [stride, nu]``; InputError on wrong widths or a
        non-finite value."""
        qpos, qvel, next_qvel = (np.asarray(a, dtype=float).reshape(1, -1) for a in (qpos, qvel, next_qvel))
        controls = np.asarray(controls, dtype=float)
        if (qpos.shape[1] != self.nq or qvel.shape[1] != self.nv or controls.shape != (self.stride, self.nu)
                or next_qvel.shape[1] != self.nv):
            raise InputError(f"hybrid model: observe got widths {qpos.shape[1]}, {qvel.shape[1]}, controls "
                             f"{controls.shape}, {next_qvel.shape[1]}, expected {self.nq}, {self.nv}, "
                             f"({self.stride}, {self.nu}), {self.nv}")
        if not all(np.isfinite(a).all() for a in (qpos, qvel, controls, next_qvel)):
            raise InputError("hybrid model: observe got a non-finite state or control")
        return qpos, qvel, controls, next_qvel

    def check_transition(self, qpos: np.ndarray, qvel: np.ndarray, controls: np.ndarray, next_qvel: np.ndarray) -> None:
        """The online check alone on one executed transition (as :meth:`observe` checks it; nothing is learned),
        for a controller that learns every n-th transition but checks each (``ResidualConfig.update_every``), so
        that the check switches a residual off as many control steps after its warm-up as when it learns each.
        Nothing before the warm-up, or with ``gate_window`` 0. In the force space one rollout call of two rows:
        the nominal plant with and without the residual's force."""
        if self.learner is None or not self.config.gate_window:
            return
        qpos, qvel, controls, next_qvel = self._transition(qpos, qvel, controls, next_qvel)
        self.check.add(*self._check_predictions(qpos, qvel, controls, controls.mean(0, keepdims=True)), next_qvel)

    def _check_predictions(self, qpos: np.ndarray, qvel: np.ndarray, controls: np.ndarray, u: np.ndarray,
                           nominal: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The online check's (``gate_window``) two predictions of a transition's next velocity, with the residual
        (predicted before the transition is learned) and without it, for :meth:`OnlineCheck.add`: the residual stays
        in use while its summed squared error over the window is below ``gate_margin`` times the nominal's (after
        :data:`~gpdyn.control.online_check.GATE_MIN` checked transitions; in use before). ``nominal``: the nominal
        plant's next velocity when the caller has it; else made here (in the force space in the same rollout call
        as the prediction with the residual, two rows)."""
        learned = self._learned(qpos, qvel, u)
        if self.config.space == "force":
            if nominal is None:
                forces = np.concatenate([np.zeros((1, self.nv)), learned])
                nominal, predicted = self.nominal_plant(np.repeat(qpos, 2, 0), np.repeat(qvel, 2, 0),
                                                        np.repeat(controls[None], 2, 0), forces)
                return predicted[None], nominal[None]
            return self.nominal_plant(qpos, qvel, controls[None], learned), nominal
        # the residual adds to what it was learned against: the nominal plant or the planning model
        if self.config.target == "plant":
            base = nominal if nominal is not None else self.nominal_plant(qpos, qvel, controls[None])
        else:
            base = self.nominal_step(qpos, qvel, u)[1]
        return base + learned, base

    def _observe_scaled(self, x: np.ndarray, r: np.ndarray) -> None:
        xs = torch.as_tensor((x - self.x_mean) / self.x_scale)
        rs = torch.as_tensor(r / self.r_scale)
        self.learner.observe(xs, rs)
        for _ in range(1 if self.config.learner == "residual" else self.config.learner_steps):
            self.learner.step(xs, rs)

    def _build(self) -> None:
        """The residual GP, its scales fixed by the warm-up transitions, conditioned on them."""
        cfg = self.config
        x = np.stack([p[0] for p in self._pending])
        r = np.stack([p[1] for p in self._pending])
        self.x_mean, self.x_scale = x.mean(0), x.std(0) + 1e-3
        self.r_scale = r.std(0) + 1e-3
        d, p = x.shape[1], r.shape[1]
        if cfg.learner != "residual":
            self.learner = make_learner(cfg.learner, d, p, preset=cfg.learner_preset, dtype=torch.float64, seed=self.seed,
                                        **cfg.learner_options)
            for_control(self.learner)  # it predicts after every transition
        elif cfg.kernel == "se":
            self.learner = make_learner(
                "residual", d, p, prior=None, reference_x=torch.as_tensor((x - self.x_mean) / self.x_scale),
                window=cfg.window, amplitude=cfg.amplitude, noise=cfg.noise, lengthscale_factor=cfg.lengthscale_factor,
                refit_every=cfg.refit_every, refit_iters=cfg.refit_iters, dtype=torch.float64, seed=self.seed)
        else:
            self.learner = make_learner("residual", d, p, prior=None, kernel="linear",
                                        linear_inputs=list(range(d) if cfg.linear_inputs == "all" else range(d - self.nu, d)),
                                        window=cfg.window, noise=cfg.noise, forget=cfg.forget, dtype=torch.float64,
                                        seed=self.seed)
        self._observe_scaled(x, r)
        self._pending = []

    def snapshot(self) -> HybridForward:
        """A frozen copy (the learner's state as now; the MuJoCo model shared)."""
        other = copy.copy(self)
        other._stepper = StepwiseRollout()  # its own rollout buffers
        other._plant_runner, other._plant_buffers = None, {}
        other.learner = copy.deepcopy(self.learner)
        other._pending = list(self._pending)
        other.check = self.check.copy()
        if self.identified is not None:
            other.identified = self.identified.snapshot()
        return other


class HybridSamplingController(SamplingController):
    """The spline sampler planning through a learned model of the NOMINAL plant: a :class:`HybridForward`
    (``learned``: a :class:`ResidualConfig`, or None for its default) or, given an
    :class:`~gpdyn.control.identified_model.IdentificationConfig`, an
    :class:`~gpdyn.control.identified_model.IdentifiedForward` (identified physical parameters).

    ``nominal``: the nominal plant's ``MjModel`` (the plant the controller acts on may have
    changed). ``learn``: observe every executed transition into the model (``"online"``)
    or never (``"frozen"``: the nominal model). ``explore_std``: Gaussian noise added to the
    executed action while learning (actions the sampler alone would not try). The learned
    model lives across episodes; ``act`` + ``observe`` CPU time is the control step's.
    ``identification`` with a :class:`ResidualConfig`: the residual on top of identified parameters.
    """

    def __init__(self, cost: PathCost, control_dt: float, nominal: mujoco.MjModel, config: SamplerConfig | None = None,
                 learned: ResidualConfig | IdentificationConfig | None = None, learn: bool = True,
                 explore_std: float = 0.0, seed: int = 0, name: str | None = None,
                 identification: IdentificationConfig | None = None) -> None:
        super().__init__(cost, control_dt, config, seed, name or ("online-hybrid" if learn else "frozen-hybrid"))
        if not (np.isfinite(explore_std) and explore_std >= 0):
            raise InputError(f"hybrid controller: explore_std must be finite and >= 0, got {explore_std}")
        self.nominal, self.learn, self.explore_std = nominal, bool(learn), float(explore_std)
        if identification is not None and isinstance(learned, IdentificationConfig):
            raise InputError("hybrid controller: identification under a residual needs learned to be a ResidualConfig")
        self.forward: HybridForward | IdentifiedForward = (
            IdentifiedForward(nominal, control_dt, self.config.stride, self.config.integrator, learned)
            if isinstance(learned, IdentificationConfig)
            else HybridForward(nominal, control_dt, self.config.stride, self.config.integrator, learned, seed,
                               identification))
        self.rng = np.random.default_rng(seed + 7919)
        self.low, self.high = nominal.actuator_ctrlrange[:, 0], nominal.actuator_ctrlrange[:, 1]
        self._history: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        # ResidualConfig.update_every: control steps between learned transitions, each one's update spread over them
        self._every = self.forward.config.update_every if isinstance(self.forward, HybridForward) else 1
        self._since = 0  # control steps since the last learned transition ended
        self._unfinished: Iterator[None] | None = None  # its update's remaining pieces

    def make_sampler(self, env: Any) -> SplineSampler:
        """The episode's sampler on the learned model of the nominal plant (a fresh seed per episode)."""
        self._episodes += 1
        return SplineSampler(self.nominal, self.cost, self.control_dt, self.low, self.high, self.config,
                             seed=self.seed + self._episodes - 1, forward=self.forward)

    def start_episode(self) -> None:
        super().start_episode()
        self._history = []
        self._since = 0
        self._finish_update()  # the last episode's last transition, between episodes (no control step's time)

    def act(self, obs: np.ndarray, info: Any) -> tuple[np.ndarray, dict[str, Any]]:
        start = time.process_time()
        action, record = super().act(obs, info)
        if self.learn and self.explore_std > 0:
            action = np.clip(action + self.explore_std * self.rng.standard_normal(action.shape), self.low, self.high)
        assert self._state is not None
        self._history.append((self._state[: self.nominal.nq], self._state[self.nominal.nq :], np.asarray(action, dtype=float)))
        self._cpu[-1] = time.process_time() - start
        return action, record

    def observe(self, obs: np.ndarray, action: np.ndarray, next_obs: np.ndarray, info: Any) -> dict[str, Any]:
        """Learn the planning step that ends here: at every control step, or with ``ResidualConfig.update_every``
        n > 1 at every n-th, its update in n pieces, one per control step (this one's first), and the online check
        on every one."""
        if not self.learn:
            return {}
        start = time.process_time()
        self._since += 1
        if self._unfinished is not None:
            self._advance()
        if len(self._history) >= self.config.stride:
            qpos, qvel, _ = self._history[-self.config.stride]
            controls = np.stack([h[2] for h in self._history[-self.config.stride:]])
            next_qvel = self.state(self.env)[self.nominal.nq :]
            if self._every == 1:
                self.forward.observe(qpos, qvel, controls, next_qvel)
                self._since = 0
            else:  # the online check on every transition, the update on every n-th
                assert isinstance(self.forward, HybridForward)
                self.forward.check_transition(qpos, qvel, controls, next_qvel)
                if self._since >= self._every:
                    self._finish_update()  # (pieces that did not fit: never with n pieces in n steps)
                    self._unfinished = self.forward.observe_in_pieces(qpos, qvel, controls, next_qvel, self._every,
                                                                      check=False)
                    self._advance()
                    self._since = 0
        del self._history[: -self.config.stride]  # older entries are no longer needed
        self._cpu[-1] += time.process_time() - start
        return {}

    def _finish_update(self) -> None:
        """The rest of the unfinished update at once, if any."""
        if self._unfinished is not None:
            _finish(self._unfinished)
            self._unfinished = None

    def _advance(self) -> None:
        """The next piece of the unfinished update."""
        assert self._unfinished is not None
        if next(self._unfinished, StopIteration) is StopIteration:
            self._unfinished = None

    def summary(self) -> dict[str, Any]:
        # the residual learner (ResidualConfig.learner, a registered learner) or the identified parameters' Bayesian
        # regression ("parameters", --learned-model parameters; "parameters+joint-gp" with the joint GP) takes one
        # observe per transition
        if isinstance(self.forward, HybridForward):
            learner = self.forward.config.learner
        else:  # the parameters' regression, with the joint GP's weights in it where there is one
            learner = "parameters" if self.forward.joint_gp is None else "parameters+joint-gp"
        return {**super().summary(), "online_learner": learner, "gp_updates": self.forward.observed,
                "residual_points": float(self.forward.observed), "residual_active": self.forward.active,
                "residual_distrusted_steps": float(self.forward.distrusted_steps)}


__all__ = ["HybridForward", "HybridSamplingController", "ResidualConfig"]
