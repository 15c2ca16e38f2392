"""Computed-torque tracking of any arm with learned inverse dynamics (``gpdyn control kuka|arm``).

For every controller of :data:`ARM_CONTROLLERS` one episode of
:func:`gpdyn.sim.loop.run_episode` on the arm's :class:`~gpdyn.sim.arm_env.ArmEnv`,
with a :class:`~gpdyn.control.computed_torque.ComputedTorqueController` whose
feed-forward is nothing (``pd``), the plant's own inverse dynamics (``true``), the
pretrained learner (``frozen``) or a model updated online (``online``, ``adapt``):
``rigid-body`` (default), a :class:`~gpdyn.gp.rigid_body.RigidBodyGP` whose features are the
arm's rigid-body regressor (from its MJCF kinematics) and the frozen learner, updated by a
Kalman filter at every step; ``residual``, a :class:`~gpdyn.gp.residual.ResidualGP` on the
frozen learner; ``steps``, the learner's own optimiser steps.

The learner comes from a ``gpdyn learn`` run folder on the ``arm``/``kuka`` problem
(``from_run``), or is pretrained here on the offline part of a store (``--store``, or a
small collection of the same arm when none is given). A store that records the arm it
was collected from (``model_sha256``, the identity of the MJCF file with its includes,
and ``joint_names``; simulated stores do) must record this arm: a store or a learner of
another arm is refused (:func:`check_recorded_arm`), whatever its joint count.

PD gains (:func:`gpdyn.robots.arm.pd_gains`): critically damped per joint on the
*effective* inertia, its minimum over the reference poses of the run. Gains built on the
diagonal of M made the sampled 100 Hz loop of the iiwa unstable (spectral radius up to
1.78, :func:`gpdyn.robots.arm.sampled_loop_radius`): it chattered at the Nyquist rate
against the torque limits, which was a 0.04-0.05 rad "true model" error on joints 2 and 4.

The plant changes at step ``change_at`` (:data:`CHANGES`, :func:`apply_change`): a payload at
the arm's payload body (none when ``payload`` is 0), dry and viscous friction added to every
joint, or the motors' strength scaled. Tracking RMSE per joint is reported before and after
the change for each controller.

The recommended online model (``adapt="rigid-body"``, ``gp_online``): the rigid-body filter
above, with the learner (WISKI, SVDGP, ...) as its prior basis function learning online what
the rigid-body term leaves, one observe per control step (:class:`~gpdyn.gp.rigid_body.RigidBodyGP`'s
``learn_prior``); a WISKI learner then keeps its posterior current by rank-one updates
(``incremental_rows``) instead of a full solve per step.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
import torch

from gpdyn.control.computed_torque import ComputedTorqueController
from gpdyn.control.dynamics import LearnedModel
from gpdyn.device import DTYPES, MAX_SEED, check_memory, resolve_dtype
from gpdyn.errors import InputError
from gpdyn.gp import make_learner
from gpdyn.gp.residual import ResidualGP
from gpdyn.gp.rigid_body import RigidBodyGP
from gpdyn.gp.training import OnlineUpdater, pretrain_learner
from gpdyn.robots.arm import ArmModel, pd_gains, without_contacts
from gpdyn.robots.regressor import InertialRegressor, moving_bodies
from gpdyn.experiments.control import run_control
from gpdyn.runs import RunDir
from gpdyn.sim.loop import Episode

log = logging.getLogger(__name__)

ARM_CONTROLLERS = ("pd", "true", "frozen", "online")
# plant changes at change_at: a load at the payload body, added joint friction, weaker (or stronger) motors
CHANGES = ("payload", "joint-friction", "motor-gain")
FEEDFORWARD = {"pd": "none", "true": "true", "frozen": "learned", "online": "learned"}
# online model: "rigid-body" (RigidBodyGP: rigid-body features and the frozen model as a basis function,
# Kalman updates), "residual" (ResidualGP, an exact GP on the frozen model's residuals) or "steps"
# (the learner's own optimiser steps)
ADAPT = ("rigid-body", "residual", "steps")
# rows a WISKI learner updated online takes by the Woodbury identity between full refreshes of its posterior
INCREMENTAL_ROWS = 1000
PROBLEM = "arm"  # the inverse-dynamics problem of any arm store, [q, qd, qdd] -> tau
# memory per control step: the episode's rows (a few small arrays per step, with Python's
# overhead) and the reference poses; generous for arms of up to ~30 joints
STEP_BYTES = 4096


@dataclass
class ArmRunConfig:
    """Settings of an arm tracking run; defaults (the iiwa) run in about a minute on 2 cores.

    The arm: ``model`` (an MJCF file; None: the shipped iiwa 14) with the
    :class:`~gpdyn.robots.arm.ArmModel` options ``joints`` (the arm's joints where the file
    holds more; None: all), ``velocity_limits``, ``payload_body`` and the joint terms
    ``damping``, ``armature``, ``friction`` (None: the file's values).
    """

    robot: str = "kuka"  # the name runs and logs carry: "kuka" or "arm"
    model: str | None = None
    joints: tuple[str, ...] | None = None
    velocity_limits: tuple[float, ...] | None = None
    payload_body: str | None = None
    damping: tuple[float, ...] | None = None
    armature: tuple[float, ...] | None = None
    friction: tuple[float, ...] | None = None
    learner: str = "svdgp"
    from_run: str | None = None  # a `gpdyn learn` run folder: its learner is the model, not pretrained here
    scale: str = "small"
    steps: int = 400  # control steps
    change_at: int = 200
    change: str = "payload"  # the plant change at change_at, one of CHANGES
    payload: float = 3.0  # change "payload": kg at the payload body (0: no change)
    # change "joint-friction": dry friction of this fraction of each joint's torque limit, and viscous friction of
    # the same fraction per rad/s
    joint_friction: float = 0.05
    motor_gain: float = 0.7  # change "motor-gain": the actuators' strength factor
    family: str = "kuka1"
    speed: float = 1.0
    rate_hz: float = 100.0  # control rate; a whole number of the model's simulation steps
    offline: int = 3000  # samples collected to pretrain on when no store is given
    pretrain_iterations: int = 100
    pretrain_batch: int = 128
    online_batch: int = 64
    updates: int = 1
    adapt: str = "rigid-body"  # online model, one of ADAPT
    # rigid-body: True: the learner keeps learning what the rigid-body term leaves (an observe per control step),
    # with gp_steps optimiser steps per control step; False (default): it stays frozen and the filter alone learns,
    # which tracked as well or better over fresh seeds (docs/control.md, "Arms: the GP learning online")
    gp_online: bool = False
    gp_steps: int = 0
    # rigid-body: the bodies whose parameters a detected change re-opens widely (None: the arm's payload body)
    change_bodies: tuple[str, ...] | None = None
    window: int = 400  # ResidualGP: most recent samples it conditions on
    qdd_lengthscale: float = 10.0  # ResidualGP: factor on the median-trick lengthscales of the accelerations
    omega: float = 20.0  # PD bandwidth, rad/s
    controllers: tuple[str, ...] = ARM_CONTROLLERS
    seed: int = 0
    device: str = "cpu"
    dtype: str | None = None  # None: the device's default (gpdyn.device.resolve_dtype)
    progress: bool = True

    @property
    def dt(self) -> float:
        return 1.0 / self.rate_hz

    def arm(self) -> ArmModel:
        """The arm this run controls."""
        terms = {"damping": self.damping, "armature": self.armature, "friction": self.friction}
        if self.model is None:
            from gpdyn.robots.kuka import kuka_arm

            return kuka_arm(**terms)
        return ArmModel(self.model, joints=self.joints, velocity_limits=self.velocity_limits,
                        payload_body=self.payload_body, **terms)

    def validate(self) -> None:
        """Raise InputError naming the first bad option."""
        where = f"control {self.robot}"
        if self.steps < 2 or not 0 <= self.change_at < self.steps:
            raise InputError(f"{where}: need --steps >= 2 and 0 <= --change-at < --steps, got {self.steps}, {self.change_at}")
        if self.change not in CHANGES:
            raise InputError(f"{where}: --change must be one of {', '.join(CHANGES)}, got '{self.change}'")
        if not (np.isfinite(self.joint_friction) and self.joint_friction >= 0):
            raise InputError(f"{where}: --joint-friction must be a finite fraction >= 0, got {self.joint_friction}")
        if not (np.isfinite(self.motor_gain) and self.motor_gain > 0):
            raise InputError(f"{where}: --motor-gain must be a finite factor > 0, got {self.motor_gain}")
        if not np.isfinite(self.payload) or self.payload < 0:
            raise InputError(f"{where}: --payload must be a finite mass >= 0 kg, got {self.payload}")
        for name in ("speed", "rate_hz"):
            if not (np.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise InputError(f"{where}: {name} must be finite and > 0, got {getattr(self, name)}")
        if not 0 <= self.seed <= MAX_SEED:
            raise InputError(f"{where}: seed must be in [0, {MAX_SEED}], got {self.seed}")
        if self.offline < 1 or self.pretrain_iterations < 0 or self.pretrain_batch < 1 or self.online_batch < 1:
            raise InputError(f"{where}: need offline, pretrain_batch, online_batch >= 1 and pretrain_iterations >= 0, got "
                             f"{self.offline}, {self.pretrain_batch}, {self.online_batch}, {self.pretrain_iterations}")
        # an episode keeps its rows in memory: refused here rather than by the allocator after pretraining
        check_memory(self.steps * STEP_BYTES, f"{where}: --steps {self.steps}", self.device)
        if not self.omega > 0:
            raise InputError(f"{where}: omega must be > 0, got {self.omega}")
        bad = [c for c in self.controllers if c not in ARM_CONTROLLERS]
        if bad or not self.controllers:
            raise InputError(f"{where}: controllers {bad or '(none)'} not in {', '.join(ARM_CONTROLLERS)}")
        if self.adapt not in ADAPT:
            raise InputError(f"{where}: adapt must be one of {', '.join(ADAPT)}, got '{self.adapt}'")
        if self.gp_steps < 0:
            raise InputError(f"{where}: --gp-steps must be >= 0, got {self.gp_steps}")
        if self.window < 4 or self.updates < 0 or not self.qdd_lengthscale > 0:
            raise InputError(f"{where}: need window >= 4, updates >= 0 and qdd_lengthscale > 0, got "
                             f"{self.window}, {self.updates}, {self.qdd_lengthscale}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise InputError(f"{where}: dtype must be one of {', '.join(DTYPES)}, got '{self.dtype}'")
        if self.from_run is not None and not (Path(self.from_run) / "config.json").is_file():
            raise InputError(f"{where}: --from-run {self.from_run} is not a run folder of `gpdyn learn`")

    def resolved_change_bodies(self, arm: ArmModel) -> list[str]:
        """``change_bodies``, or the arm's payload body (where a load attaches) when it is None."""
        if self.change_bodies is not None:
            return list(self.change_bodies)
        return [arm.payload_body] if arm.payload_body else []

    def check_arm(self, arm: ArmModel) -> None:
        """Raise InputError if ``arm`` cannot run at ``rate_hz`` or the online model cannot be built for it (checked
        before any data is collected)."""
        arm.steps_per_sample(self.rate_hz, option=f"control {self.robot}: rate_hz")
        if self.change == "payload" and self.payload > 0:  # the load goes on at change_at, after pretraining
            arm.set_payload(arm.new_model(), self.payload)  # no payload body: refused naming --payload-body
        if "online" not in self.controllers or self.adapt != "rigid-body":
            return
        where = f"control {self.robot}: --adapt rigid-body"
        model = arm.torque_model()
        if model.nq != model.nv:
            raise InputError(f"{where} needs hinge or slide joints (nq = nv); {arm.path.name} has nq={model.nq}, "
                             f"nv={model.nv}: use --adapt residual")
        known = {mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, b) for b in moving_bodies(model)}
        unknown = [b for b in self.resolved_change_bodies(arm) if b not in known]
        if unknown:
            raise InputError(f"{where}: change_bodies {unknown} are not moving bodies of {arm.path.name} "
                             f"({', '.join(sorted(str(b) for b in known))})")


    def check_sources(self, arm: ArmModel, store: str | Path | None) -> None:
        """Raise InputError if ``store`` or the store the ``from_run`` learner was trained on records another arm."""
        where = f"control {self.robot}"
        if store is not None:
            check_recorded_arm(store, arm, where, f"--store {store}")
        if self.from_run is not None:
            trained_on = _recorded_store(self.from_run)
            if trained_on is not None:
                check_recorded_arm(trained_on, arm, where,
                                   f"the learner of --from-run {self.from_run} was trained on {trained_on}, which")


def _recorded_store(run_dir: str | Path) -> str | None:
    """The store a ``gpdyn learn`` run records as its problem's source, or None where it records none."""
    if not (Path(run_dir) / "config.json").is_file():
        return None
    problem = RunDir(Path(run_dir)).config().get("problem")
    source = problem.get("source") if isinstance(problem, dict) else None
    return source if isinstance(source, str) else None


def check_recorded_arm(store: str | Path, arm: ArmModel, where: str, what: str) -> None:
    """Raise InputError if ``store`` records an arm other than ``arm``: another identity hash or other joints.

    The record is the store's ``model_sha256`` (:func:`gpdyn.robots.arm.mjcf_identity`) and
    ``joint_names``, which simulated collections write; a store without them (imported
    data, a missing store) is not checked here, only its joint count is, when loaded.
    """
    from gpdyn.data.store import EpisodeStore, is_store

    if not is_store(store):
        return
    attrs = EpisodeStore.open(store).attrs
    recorded, names = attrs.get("model_sha256"), attrs.get("joint_names")
    if recorded is None and names is None:
        return
    if recorded == arm.sha256 and (names is None or list(names) == list(arm.joint_names)):
        return
    raise InputError(
        f"{where}: {what} was collected from another arm: {attrs.get('model_file')} (sha256 {recorded}, joints "
        f"{names}), not {arm.path} (sha256 {arm.sha256}, joints {list(arm.joint_names)}); its torques are not this "
        "arm's (use a store, or a learner, of this arm's file with its included files as they are now)")


def _problem(run: RunDir, cfg: ArmRunConfig, arm: ArmModel, store: str | Path | None):
    """The ``arm`` problem of ``store`` (collected into the run folder when None), checked against the arm."""
    from gpdyn.data.problems import load_problem
    from gpdyn.sim.arm import collect_arm

    if store is None:
        store = run.path / f"{cfg.robot}.zarr"
        collect_arm(store, offline=cfg.offline, online=max(100, cfg.offline // 10), family=cfg.family, seed=cfg.seed,
                    arm=arm, rate_hz=cfg.rate_hz, progress=cfg.progress)
    elif not Path(store).exists():
        raise InputError(f"control {cfg.robot}: --store {store} does not exist")
    else:
        check_recorded_arm(store, arm, f"control {cfg.robot}", f"--store {store}")
    problem = load_problem(store, PROBLEM, protocol="ordered", seed=cfg.seed)
    if problem.output_dim != arm.n:
        raise InputError(f"control {cfg.robot}: {store} holds a {problem.output_dim}-joint arm, "
                         f"{arm.path.name} has {arm.n} joints")
    return problem


def _pretrained(run: RunDir, cfg: ArmRunConfig, arm: ArmModel, store: str | Path | None) -> tuple[LearnedModel, torch.Tensor]:
    """The frozen model and the normalised inputs it was trained on (the residual GP's lengthscales come from them)."""
    from gpdyn.experiments.learned import load_learned as load

    if cfg.from_run is not None:
        learner, normalizer = load(cfg.from_run, device=cfg.device)
        if learner.name != cfg.learner:
            raise InputError(f"control {cfg.robot}: --learner {cfg.learner}, but {cfg.from_run} holds a {learner.name}")
        if store is None:  # the store the learner was trained on
            store = run_store(cfg.from_run)
        problem = _problem(run, cfg, arm, store)
        x_raw = torch.as_tensor(np.concatenate([problem.x_init, problem.x_train]), device=learner.device,
                                dtype=learner.dtype)
        return LearnedModel(learner, normalizer), normalizer.normalize_x(x_raw)
    problem = _problem(run, cfg, arm, store)
    dtype = resolve_dtype(cfg.dtype, cfg.device)
    parts = [problem.tensors(s, cfg.device, dtype) for s in ("init", "train") if len(problem.split(s)[0])]
    x_train, y_train = torch.cat([a for a, _ in parts]), torch.cat([b for _, b in parts])
    learner = make_learner(cfg.learner, 3 * arm.n, arm.n, preset=cfg.scale, device=cfg.device, dtype=dtype, seed=cfg.seed)
    t0 = time.perf_counter()
    fit = pretrain_learner(learner, x_train, y_train, iterations=cfg.pretrain_iterations, batch=cfg.pretrain_batch,
                           seed=cfg.seed, progress=cfg.progress)
    seconds = time.perf_counter() - t0
    run.log(kind="pretrain", robot=cfg.robot, learner=cfg.learner, rows=int(x_train.shape[0]), seconds=seconds, **fit)
    log.info(f"   pretrained {cfg.learner} on {x_train.shape[0]} {cfg.robot} rows in {seconds:.1f} s")
    return LearnedModel(learner, problem.normalizer), x_train


def run_store(run_dir: str | Path) -> str:
    """The store a ``gpdyn learn`` run trained on, from its config."""
    config = RunDir(Path(run_dir)).config()
    try:
        store = str(config["problem"]["source"])
    except (KeyError, TypeError):
        raise InputError(f"{run_dir}: its config names no store (problem.source); give --store") from None
    if Path(store).exists():  # the store at that path now must be the one the learner read
        from gpdyn.experiments.resume import check_recorded_store

        check_recorded_store(run_dir, store, "Give the store it was trained on with --store, or learn again")
    return store


def _controller(name: str, cfg: ArmRunConfig, arm: ArmModel, gains: tuple[np.ndarray, np.ndarray],
                frozen: LearnedModel | None, x_train: torch.Tensor | None) -> ComputedTorqueController:
    n = arm.n
    if name in ("pd", "true"):
        return ComputedTorqueController(name, FEEDFORWARD[name], gains, cfg.dt)
    assert frozen is not None and x_train is not None
    if name == "frozen":
        return ComputedTorqueController(name, "learned", gains, cfg.dt, model=frozen)
    learner = copy.deepcopy(frozen.learner)  # the frozen controller keeps the pretrained one
    if cfg.adapt == "rigid-body" and cfg.gp_online and learner.config.get("incremental_rows") == 0:
        # WISKI predicts after every transition here: its posterior follows by rank-one updates, not full solves
        learner.incremental_rows = learner.config["incremental_rows"] = INCREMENTAL_ROWS
    if cfg.adapt == "rigid-body":
        stats = tuple(getattr(frozen.normalizer, k) for k in ("x_mean", "x_std", "y_mean", "y_std"))
        # the regressor's inverse dynamics, like the data's, leaves contacts out
        learner = RigidBodyGP(learner, InertialRegressor(without_contacts(arm.torque_model())), stats, x_train,
                              change_bodies=cfg.resolved_change_bodies(arm), learn_prior=cfg.gp_online,
                              prior_steps=cfg.gp_steps, prior_batch=cfg.online_batch)
    elif cfg.adapt == "residual":
        factors = [1.0] * (2 * n) + [cfg.qdd_lengthscale] * n
        learner = ResidualGP(learner, x_train, window=cfg.window, amplitude=1.0, lengthscale_factor=factors)
    updater = OnlineUpdater(learner, batch=cfg.online_batch, updates=cfg.updates)
    return ComputedTorqueController(name, "learned", gains, cfg.dt, model=LearnedModel(learner, frozen.normalizer),
                                    updater=updater)


def apply_change(cfg: ArmRunConfig, env: Any) -> str | None:
    """Apply ``cfg.change`` to the plant of ``env`` (an :class:`~gpdyn.sim.arm_env.ArmEnv`); its description,
    or None where the change is nothing (no payload)."""
    if cfg.change == "payload":
        if cfg.payload == 0:
            return None
        env.set_payload(cfg.payload)
        return f"+{cfg.payload:g} kg"
    if cfg.change == "joint-friction":
        limit = np.abs(env.arm.limits.torque).max(axis=1)  # [n] N m
        env.add_joint_friction(cfg.joint_friction * limit, cfg.joint_friction * limit)
        return f"joint friction +{cfg.joint_friction:g} of the torque limits"
    env.scale_motor_gain(cfg.motor_gain)
    return f"motor gain x{cfg.motor_gain:g}"


class ArmPlan:
    """The arm experiment as :func:`gpdyn.experiments.control.run_control` runs it: one tracking episode
    per controller on one plant (changed at ``cfg.change_at``), its joint error kept per step."""

    conditions = ("changed",)
    episodes = 1
    next_rows = ("q_error",)

    def __init__(self, run: RunDir, cfg: ArmRunConfig, arm: ArmModel, gains: tuple[np.ndarray, np.ndarray],
                 frozen: LearnedModel | None, x_train: torch.Tensor | None) -> None:
        self.run, self.cfg, self.arm, self.gains, self.frozen, self.x_train = run, cfg, arm, gains, frozen, x_train
        self.robot, self.controllers, self.steps, self.progress = cfg.robot, cfg.controllers, cfg.steps, cfg.progress
        self.joint_rmse: dict[str, dict[str, list[float]]] = {}

    def controller(self, name: str, condition: str) -> ComputedTorqueController:
        return _controller(name, self.cfg, self.arm, self.gains, self.frozen, self.x_train)

    def make_env(self) -> Any:
        from gpdyn.sim.arm_env import ArmEnv

        return ArmEnv(self.arm, frame_skip=self.arm.steps_per_sample(self.cfg.rate_hz), family=self.cfg.family,
                      speed=self.cfg.speed, pattern_seed=self.cfg.seed)

    def reset_seed(self, episode: int) -> int:
        return self.cfg.seed

    def plant_change(self, condition: str, elapsed: int) -> Callable[[int, Any], str | None]:
        def change(t: int, env: Any) -> str | None:
            return apply_change(self.cfg, env.unwrapped) if t == self.cfg.change_at else None

        return change

    def rows(self, env: Any) -> dict[str, np.ndarray]:
        sim = env.unwrapped
        return {"q_error": sim.data.qpos - sim.reference(sim.data.time)[0]}

    def record(self, episode: Episode, condition: str, name: str, index: int) -> None:
        errors = episode.rows["next_q_error"]
        phases = {"before": errors[: self.cfg.change_at], "after": errors[self.cfg.change_at :]}
        self.joint_rmse[name] = {k: np.sqrt((v**2).mean(0)).tolist() for k, v in phases.items() if len(v)}
        self.run.log(kind="tracking", robot=self.robot, controller=name, rmse=self.joint_rmse[name])
        log.info(f"   {name:<7} " + "  ".join(f"{k} RMSE {np.mean(v):.4f} rad" for k, v in self.joint_rmse[name].items()))

    def finish(self, run: RunDir) -> dict[str, Any]:
        from gpdyn.experiments.control_report import write_arm_report

        report = write_arm_report(run, self.cfg, self.arm, self.joint_rmse)
        return {"rmse": self.joint_rmse, "report": str(report)}


def run_arm(run: RunDir, cfg: ArmRunConfig, store: str | Path | None = None) -> dict[str, Any]:
    """Get the model, track with every controller (the plant changed mid-run, :func:`run_control`), write the report."""
    from gpdyn.sim.arm import get_family

    cfg.validate()
    arm = cfg.arm()
    cfg.check_arm(arm)
    cfg.check_sources(arm, store)
    frozen = x_train = None
    if any(FEEDFORWARD[c] == "learned" for c in cfg.controllers):
        frozen, x_train = _pretrained(run, cfg, arm, store)
    pattern = get_family(cfg.family).pattern(cfg.seed, arm.limits)
    poses = pattern.evaluate(np.arange(0.0, cfg.steps * cfg.dt, 0.05), cfg.speed)[0]
    return run_control(run, ArmPlan(run, cfg, arm, pd_gains(arm.torque_model(), poses, cfg.omega), frozen, x_train))


__all__ = ["ARM_CONTROLLERS", "ArmRunConfig", "check_recorded_arm", "run_arm", "run_store"]
