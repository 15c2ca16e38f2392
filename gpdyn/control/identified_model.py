"""A planning model that learns the plant's physical parameters online: Bayesian identification through MuJoCo.

The hybrid model (:mod:`gpdyn.control.hybrid_model`) learns what a plant change does as a
generalized force linear in the action. A weakened motor is such a force; a heavier torso is
not: it is a force ``ΔM(q) qdd + Δh(q, qd)`` that grows with the accelerations, and fitted as
``b + W u`` over a gait its inertial part is regressed onto the actions that caused the
accelerations, so the fitted ``W`` misstates what the actions do (with a heavier torso the
residual walker walked slower than the true-model planner and returned less than the frozen
model: docs/results/walk-learned-model/report.md). Halved foot friction is no force of the
action at all.

Here the learned part is the plant's own parameters instead, ``theta``: relative changes of
each body's mass and inertia (scaled together: the same shape, another density), each
actuator's gear and the sliding friction of named geoms. A plant whose parameters are
``(1 + theta) p_nominal`` is simulated by MuJoCo as it is, contacts included, so the planning
model is the nominal planning model with the identified parameters: one ``mujoco.rollout``
per plan, as the true-model planner does, and exactly that planner once ``theta`` is right.

Identification is Bayesian linear regression (a GP with a linear kernel whose basis functions
are the plant's parameter sensitivities; the semiparametric view of Nguyen-Tuong & Peters 2010,
as :class:`gpdyn.gp.rigid_body.RigidBodyGP` for the arms), linearised at the current estimate
as an iterated extended Kalman filter is: each executed transition ``s_t -> qvel_{t+stride}``
under its controls gives

    J_t = d qvel'(s_t, u, theta) / d theta  at theta_t     (finite differences: one rollout of P + 2 models)
    y_t = qvel_{t+stride} - qvel'(s_t, u, theta_t) + J_t theta_t  ~  J_t theta + noise

simulated at the plant's own resolution (RK4 at 2 ms for Walker2d), and the estimate is the
posterior mean over the last ``window`` transitions with a Gaussian prior ``N(0, prior_std^2 I)``:

    theta = (sum J_t' J_t / noise^2 + I / prior_std^2)^-1 sum J_t' y_t / noise^2

A parameter the walking does not excite keeps its prior mean, zero (the nominal value).
The same online check as the hybrid model's keeps the identified parameters in the planning
model only while, over the last ``gate_window`` transitions, each predicted before it was
learned, their one-step squared error is below ``gate_margin`` times the nominal plant's.
"""

from __future__ import annotations

import collections
import copy
from dataclasses import dataclass, field

import mujoco
import numpy as np
from mujoco import rollout as mj_rollout

from gpdyn.control.joint_force_gp import FORCE_STEP, JointForceGP
from gpdyn.control.online_check import OnlineCheck
from gpdyn.control.planner import PathModel
from gpdyn.control.spline_sampling import FORCE_SPEC, INTEGRATORS, StepwiseRollout, mujoco_rollout
from gpdyn.errors import InputError
from gpdyn.sim.rollout_states import RolloutStates


@dataclass
class IdentificationConfig:
    """What :class:`IdentifiedForward` identifies and how (module docs)."""

    bodies: bool = True  # each body with mass: its mass and inertia scaled together
    actuators: bool = True  # each actuator's gear
    friction_geoms: list[str] = field(default_factory=list)  # geoms whose sliding friction is identified
    prior_std: float = 0.5  # prior standard deviation of each relative change
    noise_std: float = 0.05  # per joint velocity after a planning step (rad/s, m/s): what the model cannot explain
    window: int = 300  # most recent transitions the estimate conditions on
    warmup: int = 20  # transitions observed before the identified parameters enter the planning model
    fd_step: float = 0.05  # relative step of the finite-difference sensitivities
    min_factor: float = 0.1  # an identified factor 1 + theta is kept in [min_factor, max_factor]: a physical plant
    max_factor: float = 3.0
    # where the sensitivities J come from: "plant" (finite differences of the plant-resolution step, P + 2 rollouts of
    # stride * frame_skip substeps each) or "planning" (of one planning-model step under the mean control: P + 1
    # single coarse steps; the prediction and the check stay at the plant's resolution)
    sensitivity: str = "plant"
    gate_window: int = 100  # the online check, as ResidualConfig's (0: always used after warmup)
    gate_margin: float = 0.9
    # a GP force of each actuated joint's own angle and velocity in the same regression (gpdyn.control.joint_force_gp):
    # grid points per input (0: none), its prior std at a state (N m), length scale (in half-widths of each input's
    # range) and the velocity range (rad/s) its grid covers
    joint_gp_points: int = 0
    joint_gp_std: float = 30.0
    joint_gp_lengthscale: float = 1.0
    joint_gp_velocity_range: float = 10.0
    # observed transitions before the GP's weights leave zero: until then the parameters are estimated as without the
    # GP (its columns are gathered from the start), so that its first estimates from few transitions do not enter
    joint_gp_warmup: int = 0

    def validate(self) -> None:
        """Raise InputError naming the first impossible option."""
        positive = ("prior_std", "noise_std", "fd_step", "min_factor", "joint_gp_std", "joint_gp_lengthscale",
                    "joint_gp_velocity_range")
        checks = [(name, np.isfinite(getattr(self, name)) and getattr(self, name) > 0) for name in positive]
        checks += [("window", self.window >= 1), ("warmup", 1 <= self.warmup <= max(self.window, 1)),
                   ("max_factor", np.isfinite(self.max_factor) and self.max_factor > max(self.min_factor, 1.0)),
                   ("min_factor", self.min_factor < 1.0), ("gate_window", self.gate_window >= 0),
                   ("gate_margin", np.isfinite(self.gate_margin) and 0 < self.gate_margin <= 1),
                   ("sensitivity", self.sensitivity in ("plant", "planning")),
                   ("joint_gp_points", self.joint_gp_points == 0 or self.joint_gp_points >= 4),
                   ("joint_gp_warmup", self.joint_gp_warmup >= 0),
                   ("friction_geoms", len(set(self.friction_geoms)) == len(self.friction_geoms)),
                   ("bodies", self.bodies or self.actuators or bool(self.friction_geoms))]
        for name, ok in checks:
            if not ok:
                extra = " (nothing to identify)" if name == "bodies" else ""
                raise InputError(f"identification: option {name}={getattr(self, name)!r} is out of range{extra}")


class PlantParameters:
    """The identified parameters of a MuJoCo model: their names, and models with ``(1 + theta)`` times the nominal values."""

    def __init__(self, model: mujoco.MjModel, config: IdentificationConfig) -> None:
        self.nominal = copy.deepcopy(model)
        self.bodies = [b for b in range(1, model.nbody) if model.body_mass[b] > 0] if config.bodies else []
        self.actuators = list(range(model.nu)) if config.actuators else []
        self.geoms = []
        for name in config.friction_geoms:
            geom = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, name)
            if geom < 0:
                raise InputError(f"identification: friction_geoms names {name!r}, which the model has no geom of")
            self.geoms.append(geom)
        # an unnamed actuator goes by its joint's name, an unnamed body or geom by its index
        actuator_names = [model.actuator(a).name or model.joint(model.actuator_trnid[a, 0]).name or str(a)
                          for a in self.actuators]
        self.names = ([f"mass:{model.body(b).name or b}" for b in self.bodies] + [f"gear:{n}" for n in actuator_names]
                      + [f"friction:{model.geom(g).name or g}" for g in self.geoms])
        self.size = len(self.names)
        if self.size == 0:
            raise InputError("identification: the model has none of the parameters to identify")
        self._slices = np.cumsum([0, len(self.bodies), len(self.actuators), len(self.geoms)])

    def apply(self, model: mujoco.MjModel, theta: np.ndarray) -> None:
        """Set ``model``'s identified fields to ``(1 + theta)`` times the nominal values (the others untouched)."""
        body, gear, friction = (theta[a:b] for a, b in zip(self._slices[:-1], self._slices[1:], strict=True))
        nominal = self.nominal
        if self.bodies:
            model.body_mass[self.bodies] = nominal.body_mass[self.bodies] * (1 + body)
            model.body_inertia[self.bodies] = nominal.body_inertia[self.bodies] * (1 + body)[:, None]
        if self.actuators:
            model.actuator_gear[self.actuators, 0] = nominal.actuator_gear[self.actuators, 0] * (1 + gear)
        if self.geoms:
            model.geom_friction[self.geoms, 0] = nominal.geom_friction[self.geoms, 0] * (1 + friction)

    def model(self, theta: np.ndarray, timestep: float | None = None, integrator: str | None = None) -> mujoco.MjModel:
        """A copy of the nominal model with ``theta`` applied (and the given time step and integrator)."""
        out = copy.deepcopy(self.nominal)
        if timestep is not None:
            out.opt.timestep = timestep
        if integrator is not None:
            out.opt.integrator = INTEGRATORS[integrator]
        self.apply(out, theta)
        return out


class IdentifiedForward(PathModel):
    """The nominal planning model with online-identified physical parameters (module docs): a
    :class:`~gpdyn.control.planner.PathModel` on numpy arrays over planning steps for ``SplineSampler(forward=...)``.

    ``model``: the nominal plant's ``MjModel`` (copied); plans run on a copy at the planning time step
    ``control_dt * stride`` with ``integrator``, identification on copies at the plant's own step.
    """

    def __init__(self, model: mujoco.MjModel, control_dt: float, stride: int = 2, integrator: str = "implicitfast",
                 config: IdentificationConfig | None = None) -> None:
        self.config = config or IdentificationConfig()
        self.config.validate()
        if integrator not in INTEGRATORS:
            raise InputError(f"identified model: integrator {integrator!r} is not one of {', '.join(INTEGRATORS)}")
        self.frame_skip = int(round(control_dt / model.opt.timestep))
        if stride < 1 or self.frame_skip < 1 or abs(self.frame_skip * model.opt.timestep - control_dt) > 1e-9:
            raise InputError(f"identified model: control_dt {control_dt} must be a multiple of the model's timestep "
                             f"{model.opt.timestep} and stride >= 1, got stride {stride}")
        self.parameters = PlantParameters(model, self.config)
        self.stride = int(stride)
        self.nq, self.nv, self.nu = model.nq, model.nv, model.nu
        size = self.parameters.size
        self.theta = np.zeros(size)  # the posterior mean of the relative changes
        # the models each observe rolls at the plant's resolution: theta, theta + fd_step along each parameter (for
        # sensitivity="plant"), and the nominal plant (for the check); and for sensitivity="planning" theta and its
        # perturbations at the planning model's resolution
        plant_sensitivity = self.config.sensitivity == "plant"
        self._probes = [self.parameters.model(np.zeros(size)) for _ in range(size + 2 if plant_sensitivity else 2)]
        self._probe_data = mujoco.MjData(self._probes[0])
        self._plan_probes = ([] if plant_sensitivity else
                             [self.parameters.model(np.zeros(size), control_dt * stride, integrator) for _ in range(size + 1)])
        self.nominal_plan = self.parameters.model(np.zeros(size), control_dt * stride, integrator)
        self.identified_plan = self.parameters.model(np.zeros(size), control_dt * stride, integrator)
        # the identified plant at its own resolution: what a residual on top of this model is learned against
        self.identified_plant = self.parameters.model(np.zeros(size))
        self._plan_data = mujoco.MjData(self.nominal_plan)
        self.states = RolloutStates(self.nominal_plan)
        cfg = self.config
        # the GP force of each actuated joint's angle and velocity, its whitened weights after theta in the regression
        self.joint_gp = (JointForceGP(model, cfg.joint_gp_points, cfg.joint_gp_std, cfg.joint_gp_lengthscale,
                                      cfg.joint_gp_velocity_range) if cfg.joint_gp_points else None)
        self._stepper = StepwiseRollout()  # plans with the GP force: it enters every planning step
        gp_size = 0 if self.joint_gp is None else self.joint_gp.size
        self._prior_precision = np.concatenate([np.full(size, 1.0 / cfg.prior_std**2), np.ones(gp_size)])
        # per transition in the window: A' A / noise^2 and A' y / noise^2 (A: theta's sensitivities, then the GP
        # force's basis through the force's sensitivities), and their running sums
        self._window: collections.deque[tuple[np.ndarray, np.ndarray]] = collections.deque()
        self._gram, self._moment = np.zeros((size + gp_size, size + gp_size)), np.zeros(size + gp_size)
        self.check = OnlineCheck(self.config.gate_window, self.config.gate_margin)
        self.observed = 0

    # ----------------------------------------------------------------- the model
    @property
    def active(self) -> bool:
        """Whether the identified parameters are built (``warmup`` transitions observed)."""
        return self.observed >= self.config.warmup

    @property
    def in_use(self) -> bool:
        """Whether plans use the identified parameters: built, and trusted by the online check."""
        return self.active and self.check.trusted

    @property
    def distrusted_steps(self) -> int:
        """Observed transitions after which the online check had the identified parameters off."""
        return self.check.distrusted_steps

    @property
    def planning_model(self) -> mujoco.MjModel:
        """The planning model plans use now: the identified one while it is in use, else the nominal one."""
        return self.identified_plan if self.in_use else self.nominal_plan

    @property
    def plant_model(self) -> mujoco.MjModel:
        """The plant at its own resolution as this model has it now (identified while in use, else nominal): the
        reference a residual on top of it learns against (:class:`gpdyn.control.hybrid_model.HybridForward`)."""
        return self.identified_plant if self.in_use else self._probes[-1]

    def factors(self) -> dict[str, float]:
        """The identified factors ``1 + theta`` by parameter name (as the planning model has them)."""
        return dict(zip(self.parameters.names, (1 + self._clipped()).tolist(), strict=True))

    def _clipped(self) -> np.ndarray:
        return np.clip(self.theta, self.config.min_factor - 1, self.config.max_factor - 1)

    def rollout(self, state: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """Planning states ``[K, H, nx]`` after each planning step of ``actions [K, H, nu]`` from ``state [nx]`` or
        ``[K, nx]``: the planning model with the identified parameters while they are in use, else the nominal one;
        with the joint GP (while in use) its force of each step's start state applied inside the step."""
        if self.joint_gp is None or not self.in_use:
            return mujoco_rollout(self.planning_model, self._plan_data, self.states, state, actions)
        k, h, _ = actions.shape
        paths = np.empty((k, h, self.states.size))
        current = self.states.start(state, k, "identified model")
        for t in range(h):
            force = self.joint_gp.force_of_states(current[:, self.states.planning], self.nq)
            paths[:, t] = self._stepper.step(self.identified_plan, self._plan_data, current, actions[:, t], force)
            current = paths[:, t]
        return paths[..., self.states.planning]

    # ----------------------------------------------------------------- learning
    def observe(self, qpos: np.ndarray, qvel: np.ndarray, controls: np.ndarray, next_qvel: np.ndarray) -> None:
        """One executed transition over a planning step: ``(qpos, qvel)`` under the control steps ``controls
        [stride, nu]`` to ``next_qvel``; updates the estimate, and the check with the estimate from before it."""
        qpos, qvel, next_qvel = (np.asarray(a, dtype=float).reshape(-1) for a in (qpos, qvel, next_qvel))
        controls = np.asarray(controls, dtype=float)
        if qpos.shape != (self.nq,) or qvel.shape != (self.nv,) or controls.shape != (self.stride, self.nu) \
                or next_qvel.shape != (self.nv,):
            raise InputError(f"identified model: observe got sizes {qpos.size}, {qvel.size}, controls {controls.shape}, "
                             f"{next_qvel.size}, expected {self.nq}, {self.nv}, ({self.stride}, {self.nu}), {self.nv}")
        if not all(np.isfinite(a).all() for a in (qpos, qvel, controls, next_qvel)):
            raise InputError("identified model: observe got a non-finite state or control")
        theta, gp = self._clipped(), self.joint_gp
        # the GP force at this state, held over the planning step as a plan holds it
        force = None if gp is None else gp.force(qpos[None], qvel[None])[0]
        self._perturb(self._probes[:-1], theta)  # the last probe stays the nominal plant
        probes = len(self._probes)
        # with the joint GP and sensitivity="plant": one more row per joint, theta with the force on it perturbed
        extra = gp.joints if gp is not None and not self._plan_probes else 0
        reached = self._reach(self._probes + [self._probes[0]] * extra, self._probe_data, qpos, qvel,
                              np.repeat(controls, self.frame_skip, axis=0), force, nominal_row=probes - 1,
                              force_rows=bool(extra))
        predicted, nominal = reached[0], reached[probes - 1]  # theta, (theta + step e_i,) nominal, (force rows)
        if self._plan_probes:  # one planning-model step of theta and of each perturbation, under the mean control
            self._perturb(self._plan_probes, theta)
            extra = 0 if gp is None else gp.joints
            reached = self._reach(self._plan_probes + [self._plan_probes[0]] * extra, self._plan_data, qpos, qvel,
                                  controls.mean(0, keepdims=True), force, force_rows=True)
            probes = len(self._plan_probes)
        jac = (reached[1 : self.parameters.size + 1] - reached[0]).T / self.config.fd_step  # [nv, P]
        weights = theta
        if gp is not None:  # joint j's GP columns: the force's sensitivity times its basis at this state
            force_jac = (reached[probes:] - reached[0]).T / FORCE_STEP  # [nv, joints]
            basis = gp.features(qpos, qvel)  # [joints, 2 points]
            jac = np.hstack([jac, (force_jac[:, :, None] * basis[None]).reshape(self.nv, -1)])
            weights = np.concatenate([theta, gp.weights])
        if self.active and self.config.gate_window:  # predicted with the estimate from before this transition
            self.check.add(predicted, nominal, next_qvel)
        y = next_qvel - predicted + jac @ weights
        weight = 1.0 / self.config.noise_std**2
        entry = (weight * jac.T @ jac, weight * jac.T @ y)
        self._window.append(entry)
        self._gram += entry[0]
        self._moment += entry[1]
        if len(self._window) > self.config.window:
            old_gram, old_moment = self._window.popleft()
            self._gram -= old_gram
            self._moment -= old_moment
        # the posterior mean over theta (and the GP's whitened weights; before joint_gp_warmup transitions theta's
        # given the weights at zero)
        self.observed += 1
        size = self.parameters.size if gp is None or self.observed < self.config.joint_gp_warmup else len(self._moment)
        mean = np.linalg.solve(self._gram[:size, :size] + np.diag(self._prior_precision[:size]), self._moment[:size])
        self.theta = mean[: self.parameters.size]
        if size > self.parameters.size:
            gp.set_weights(mean[self.parameters.size :])
        for model in (self.identified_plan, self.identified_plant):
            self.parameters.apply(model, self._clipped())

    def _reach(self, models: list[mujoco.MjModel], data: mujoco.MjData, qpos: np.ndarray, qvel: np.ndarray,
               controls: np.ndarray, force: np.ndarray | None, nominal_row: int | None = None,
               force_rows: bool = False) -> np.ndarray:
        """``qvel [rows, nv]`` that each of ``models`` reaches from ``(qpos, qvel)`` under ``controls [steps, nu]``.
        With the joint GP's ``force [nv]``: applied throughout on every row but ``nominal_row``; with ``force_rows``
        the last rows, one per joint of the GP, get ``FORCE_STEP`` more on their joint (the force's sensitivities)."""
        rows = len(models)
        per_step = np.repeat(controls[None], rows, 0)
        kwargs = {}
        if force is not None:
            forces = np.repeat(force[None], rows, 0)
            if nominal_row is not None:
                forces[nominal_row] = 0.0
            if force_rows:
                joints = self.joint_gp.joints
                forces[np.arange(rows - joints, rows), self.joint_gp.dofs] += FORCE_STEP
            per_step = np.concatenate([per_step, np.repeat(forces[:, None], controls.shape[0], 1)], -1)
            kwargs["control_spec"] = FORCE_SPEC
        out, _ = mj_rollout.rollout(models, data, self.states.initial(qpos, qvel, rows=rows), per_step, **kwargs)
        return out[:, -1, self.states.qvel]

    def _perturb(self, models: list[mujoco.MjModel], theta: np.ndarray) -> None:
        """``models[0]`` to ``theta``, ``models[i]`` to ``theta + fd_step e_i`` (as many as are given)."""
        step, size = self.config.fd_step, self.parameters.size
        for i, model in enumerate(models):
            self.parameters.apply(model, theta + step * (np.arange(size) == i - 1))

    def snapshot(self) -> IdentifiedForward:
        """A frozen copy for planning: the estimate and planning models as now (it shares the probe models)."""
        other = copy.copy(self)
        other.identified_plan = copy.deepcopy(self.identified_plan)
        other.identified_plant = copy.deepcopy(self.identified_plant)
        other._plan_data = mujoco.MjData(other.identified_plan)
        other._stepper = StepwiseRollout()
        other.theta = self.theta.copy()
        other.joint_gp = None if self.joint_gp is None else self.joint_gp.copy()
        other._window, other.check = copy.copy(self._window), self.check.copy()
        other._gram, other._moment = self._gram.copy(), self._moment.copy()
        return other


__all__ = ["IdentificationConfig", "IdentifiedForward", "PlantParameters"]
