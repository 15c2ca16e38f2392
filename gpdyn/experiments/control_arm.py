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

The feedback (``feedback``, :mod:`gpdyn.control.feedback`): by default through each controller's
inertia model, ``M(q) (w^2 e + 2 w e')``; or per-joint PD gains (``diagonal``,
:func:`gpdyn.robots.arm.pd_gains`), critically damped per joint on the
*effective* inertia, its minimum over the reference poses of the run. Gains built on the
diagonal of M made the sampled 100 Hz loop of the iiwa unstable (spectral radius up to
1.78, :func:`gpdyn.robots.arm.sampled_loop_radius`): it chattered at the Nyquist rate
against the torque limits, which was a 0.04-0.05 rad "true model" error on joints 2 and 4.
The online rigid-body model's controller rebuilds its feedback on the load the filter identifies after a
detected change (``payload_gains``, :class:`gpdyn.control.gain_schedule.PayloadGains`).

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
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpdyn.control.computed_torque import ComputedTorqueController
from gpdyn.control.dynamics import LearnedModel
from gpdyn.control.feedback import DiagonalFeedback, Feedback, InertiaFeedback
from gpdyn.control.gain_schedule import PayloadGains
from gpdyn.errors import InputError
from gpdyn.gp import make_learner
from gpdyn.gp.residual import ResidualGP
from gpdyn.gp.rigid_body import RigidBodyGP
from gpdyn.gp.training import OnlineUpdater, pretrain_learner
from gpdyn.gp.wiski import for_control
from gpdyn.robots.arm import ArmModel, pd_gains, without_contacts
from gpdyn.robots.regressor import InertialRegressor
from gpdyn.experiments.arm_config import ARM_CONTROLLERS, ArmRunConfig
from gpdyn.experiments.control import run_control
from gpdyn.runs import RunDir
from gpdyn.sim.loop import Episode

log = logging.getLogger(__name__)

FEEDFORWARD = {"pd": "none", "true": "true", "frozen": "learned", "online": "learned"}
PROBLEM = "arm"  # the inverse-dynamics problem of any arm store, [q, qd, qdd] -> tau


def check_sources(cfg: ArmRunConfig, arm: ArmModel, store: str | Path | None) -> None:
    """Raise InputError if ``store`` or the store the ``from_run`` learner was trained on records another arm."""
    where = f"control {cfg.robot}"
    if store is not None:
        check_recorded_arm(store, arm, where, f"--store {store}")
    if cfg.model.from_run is not None:
        trained_on = _recorded_store(cfg.model.from_run)
        if trained_on is not None:
            check_recorded_arm(trained_on, arm, where,
                               f"the learner of --from-run {cfg.model.from_run} was trained on {trained_on}, which")


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
        collect_arm(store, offline=cfg.model.offline, online=max(100, cfg.model.offline // 10), family=cfg.reference.family, seed=cfg.seed,
                    arm=arm, rate_hz=cfg.reference.rate_hz, progress=cfg.progress)
    elif not Path(store).exists():
        raise InputError(f"control {cfg.robot}: --store {store} does not exist")
    else:
        check_recorded_arm(store, arm, f"control {cfg.robot}", f"--store {store}")
    problem = load_problem(store, PROBLEM, protocol="ordered", seed=cfg.seed)
    if problem.output_dim != arm.n:
        raise InputError(f"control {cfg.robot}: {store} holds a {problem.output_dim}-joint arm, "
                         f"{arm.path.name} has {arm.n} joints")
    return problem


def _pretrained(run: RunDir, cfg: ArmRunConfig, arm: ArmModel,
                store: str | Path | None) -> tuple[LearnedModel, torch.Tensor, torch.Tensor]:
    """The frozen model and the normalised samples it was trained on, inputs and torques (the residual GP's
    lengthscales and the rigid-body filter's start come from them)."""
    from gpdyn.experiments.prior_mean import load_learned_model

    if cfg.model.from_run is not None:
        if store is None:  # the store the learner was trained on
            store = run_store(cfg.model.from_run)
        problem = _problem(run, cfg, arm, store)
        # a learner of the residual of a prior mean (--prior-mean) comes with its prior: the model of the torques
        learner, normalizer = load_learned_model(cfg.model.from_run, store, problem, device=cfg.compute.device)
        trained = getattr(learner, "base", learner).name
        if trained != cfg.model.learner:
            raise InputError(f"control {cfg.robot}: --learner {cfg.model.learner}, but {cfg.model.from_run} holds a "
                             f"{trained}")
        x_raw, y_raw = (torch.as_tensor(np.concatenate(pair), device=learner.device, dtype=learner.dtype)
                        for pair in ((problem.x_init, problem.x_train), (problem.y_init, problem.y_train)))
        return LearnedModel(learner, normalizer), normalizer.normalize_x(x_raw), normalizer.normalize_y(y_raw)
    problem = _problem(run, cfg, arm, store)
    on = cfg.compute.kwargs()
    parts = [problem.tensors(s, **on) for s in ("init", "train") if len(problem.split(s)[0])]
    x_train, y_train = torch.cat([a for a, _ in parts]), torch.cat([b for _, b in parts])
    learner = make_learner(cfg.model.learner, 3 * arm.n, arm.n, preset=cfg.model.scale, seed=cfg.seed, **on)
    t0 = time.perf_counter()
    fit = pretrain_learner(learner, x_train, y_train, iterations=cfg.model.pretrain_iterations,
                           batch=cfg.model.pretrain_batch, seed=cfg.seed, progress=cfg.progress)
    seconds = time.perf_counter() - t0
    run.log(kind="pretrain", robot=cfg.robot, learner=cfg.model.learner, rows=int(x_train.shape[0]), seconds=seconds, **fit)
    log.info(f"   pretrained {cfg.model.learner} on {x_train.shape[0]} {cfg.robot} rows in {seconds:.1f} s")
    return LearnedModel(learner, problem.normalizer), x_train, y_train


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


def _feedback(name: str, cfg: ArmRunConfig, arm: ArmModel, gains: tuple[np.ndarray, np.ndarray]) -> Feedback:
    """The controller's feedback (``cfg.reference.feedback``): the gains, or the inertia of what it knows of the arm."""
    if cfg.reference.feedback == "diagonal":
        return DiagonalFeedback(*gains)
    if name == "true":
        return InertiaFeedback.of_plant(cfg.reference.omega, arm.n)
    return InertiaFeedback(arm.torque_model(), cfg.reference.omega, arm.n)


def _controller(name: str, cfg: ArmRunConfig, arm: ArmModel, gains: tuple[np.ndarray, np.ndarray], poses: np.ndarray,
                frozen: LearnedModel | None, stored: tuple[torch.Tensor, torch.Tensor] | None) -> ComputedTorqueController:
    """``stored``: the normalised samples ``(x, y)`` the frozen model was pretrained on."""
    n = arm.n
    feedback = _feedback(name, cfg, arm, gains)
    if name in ("pd", "true"):
        return ComputedTorqueController(name, FEEDFORWARD[name], feedback, cfg.dt)
    assert frozen is not None and stored is not None
    x_train = stored[0]
    if name == "frozen":
        return ComputedTorqueController(name, "learned", feedback, cfg.dt, model=frozen)
    learner = copy.deepcopy(frozen.learner)  # the frozen controller keeps the pretrained one
    if cfg.adaptation.adapt == "rigid-body" and cfg.adaptation.gp_online:
        for_control(learner)  # it predicts after every transition: WISKI by rank-one updates, not full solves
    if cfg.adaptation.adapt == "rigid-body":
        stats = tuple(getattr(frozen.normalizer, k) for k in ("x_mean", "x_std", "y_mean", "y_std"))
        # the regressor's inverse dynamics, like the data's, leaves contacts out
        terms = {} if cfg.adaptation.change_terms is None else {"change_terms": cfg.adaptation.change_terms}
        learner = RigidBodyGP(learner, InertialRegressor(without_contacts(arm.torque_model())), stats, x_train,
                              change_bodies=cfg.resolved_change_bodies(arm), change_window=cfg.adaptation.change_window,
                              change_friction_std=cfg.adaptation.change_friction_std,
                              learn_prior=cfg.adaptation.gp_online,
                              prior_steps=cfg.adaptation.gp_steps, prior_batch=cfg.adaptation.online_batch,
                              angle_gp_points=cfg.adaptation.angle_gp_points, angle_gp_std=cfg.adaptation.angle_gp_std,
                              angle_gp_reset_std=cfg.adaptation.angle_gp_reset_std,
                              **terms)
        if cfg.adaptation.start_filter:
            learner.start_from(*stored)
    elif cfg.adaptation.adapt == "residual":
        factors = [1.0] * (2 * n) + [cfg.adaptation.qdd_lengthscale] * n
        learner = ResidualGP(learner, x_train, window=cfg.adaptation.window, amplitude=1.0, lengthscale_factor=factors)
    updater = OnlineUpdater(learner, batch=cfg.adaptation.online_batch, updates=cfg.adaptation.updates)
    schedule = None
    bodies = cfg.resolved_change_bodies(arm)
    if isinstance(learner, RigidBodyGP) and cfg.adaptation.payload_gains and len(bodies) == 1:  # a load at one body
        schedule = PayloadGains(learner, arm.torque_model(), bodies[0], poses, cfg.reference.omega, cfg.dt,
                                inertia=cfg.reference.feedback == "inertia")
    return ComputedTorqueController(name, "learned", feedback, cfg.dt, model=LearnedModel(learner, frozen.normalizer),
                                    updater=updater, gain_schedule=schedule)


def apply_change(cfg: ArmRunConfig, env: Any) -> str | None:
    """Apply ``cfg.plant.change`` to the plant of ``env`` (an :class:`~gpdyn.sim.arm_env.ArmEnv`); its description,
    or None where the change is nothing (no payload)."""
    if cfg.plant.change == "payload":
        if cfg.plant.payload == 0:
            return None
        env.set_payload(cfg.plant.payload)
        return f"+{cfg.plant.payload:g} kg"
    if cfg.plant.change == "joint-friction":
        limit = np.abs(env.arm.limits.torque).max(axis=1)  # [n] N m
        env.add_joint_friction(cfg.plant.joint_friction * limit, cfg.plant.joint_friction * limit)
        return f"joint friction +{cfg.plant.joint_friction:g} of the torque limits"
    if cfg.plant.change == "joint-spring":
        limit = np.abs(env.arm.limits.torque).max(axis=1)  # [n] N m
        env.add_joint_spring(cfg.plant.joint_spring * limit, env.data.qpos[env.model.jnt_qposadr[: env.arm.n]])
        return f"joint spring {cfg.plant.joint_spring:g} of the torque limits per rad"
    env.scale_motor_gain(cfg.plant.motor_gain)
    return f"motor gain x{cfg.plant.motor_gain:g}"


class ArmPlan:
    """The arm experiment as :func:`gpdyn.experiments.control.run_control` runs it: one tracking episode
    per controller on one plant (changed at ``cfg.plant.change_at``), its joint error kept per step."""

    conditions = ("changed",)
    episodes = 1
    next_rows = ("q_error",)

    def __init__(self, run: RunDir, cfg: ArmRunConfig, arm: ArmModel, poses: np.ndarray,
                 frozen: LearnedModel | None, stored: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        self.run, self.cfg, self.arm, self.poses, self.frozen, self.stored = run, cfg, arm, poses, frozen, stored
        self.gains = pd_gains(arm.torque_model(), poses, cfg.reference.omega)  # on the poses of the run's reference
        self.robot, self.controllers, self.steps, self.progress = cfg.robot, cfg.controllers, cfg.steps, cfg.progress
        self.joint_rmse: dict[str, dict[str, list[float]]] = {}

    def controller(self, name: str, condition: str) -> ComputedTorqueController:
        return _controller(name, self.cfg, self.arm, self.gains, self.poses, self.frozen, self.stored)

    def make_env(self) -> Any:
        from gpdyn.sim.arm_env import ArmEnv

        return ArmEnv(self.arm, frame_skip=self.arm.steps_per_sample(self.cfg.reference.rate_hz), family=self.cfg.reference.family,
                      speed=self.cfg.reference.speed, pattern_seed=self.cfg.seed)

    def reset_seed(self, episode: int) -> int:
        return self.cfg.seed

    def plant_change(self, condition: str, elapsed: int) -> Callable[[int, Any], str | None]:
        def change(t: int, env: Any) -> str | None:
            return apply_change(self.cfg, env.unwrapped) if t == self.cfg.plant.change_at else None

        return change

    def rows(self, env: Any) -> dict[str, np.ndarray]:
        sim = env.unwrapped
        return {"q_error": sim.data.qpos - sim.reference(sim.data.time)[0]}

    def record(self, episode: Episode, condition: str, name: str, index: int) -> None:
        errors = episode.rows["next_q_error"]
        phases = {"before": errors[: self.cfg.plant.change_at], "after": errors[self.cfg.plant.change_at :]}
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
    check_sources(cfg, arm, store)
    frozen = stored = None
    if any(FEEDFORWARD[c] == "learned" for c in cfg.controllers):
        frozen, x_stored, y_stored = _pretrained(run, cfg, arm, store)
        stored = (x_stored, y_stored)
    pattern = get_family(cfg.reference.family).pattern(cfg.seed, arm.limits)
    poses = pattern.evaluate(np.arange(0.0, cfg.steps * cfg.dt, 0.05), cfg.reference.speed)[0]
    return run_control(run, ArmPlan(run, cfg, arm, poses, frozen, stored))


__all__ = ["ARM_CONTROLLERS", "ArmRunConfig", "check_recorded_arm", "run_arm", "run_store"]
