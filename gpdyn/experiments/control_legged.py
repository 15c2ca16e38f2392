"""The online control experiment of a legged task (``gpdyn control walker|hopper``): plan -> act -> observe ->
update -> replan.

A learner is pretrained on stored rollouts of the task (its ``-1`` problem, e.g. ``walker-1``),
then every controller runs
``episodes`` consecutive episodes per plant condition, episode k of every controller from
the same reset seed, each by :func:`gpdyn.sim.loop.run_episode`:

==========  ===============================================================================
trpo        the TRPO policy alone (:class:`~gpdyn.control.controllers.PolicyController`)
true        MPC with the true simulator as its model (copied states, ``sim_samples`` samples)
frozen      MPC with the pretrained learned model, never updated
online      MPC with the same learned model, updated at every step from the transition seen:
            ``adapt="residual"`` (default) conditions a ResidualGP on the frozen model's
            residuals, ``adapt="steps"`` uses the learner's own ``observe``/``step``
==========  ===============================================================================

The online model is kept from one episode to the next of a condition, so with
``episodes > 1`` it keeps learning while the robot runs, while the frozen model stays as
pretrained. Conditions: ``nominal`` and ``changed`` (a plant change of
:data:`~the task's ``plant_changes```, from the start or at step
``change_at``). Logs per step (reward, planning time, model prediction error, predictive
variance, fallbacks) and per episode (return, length) go to ``metrics.jsonl``; every
episode is also stored in ``episodes.zarr`` (the task's rollout store layout), from which the
optional video is rendered. ``report.md`` and plots are written at the end
(:mod:`gpdyn.experiments.control_report`).
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

from gpdyn.control.controllers import MPCController
from gpdyn.control.dynamics import LearnedDynamics, SimDynamics, env_state
from gpdyn.control.mpc import make_planner
from gpdyn.errors import InputError
from gpdyn.experiments.control import run_control
from gpdyn.gp import Learner, make_learner
from gpdyn.gp.online import nmse
from gpdyn.gp.residual import ResidualGP
from gpdyn.gp.training import OnlineUpdater, pretrain_learner
from gpdyn.experiments.legged_config import CONDITIONS, CONTROLLERS, LeggedRunConfig
from gpdyn.robots.legged import NominalTrackingCost, TorchPolicy
from gpdyn.runs import RunDir
from gpdyn.sim.loop import Controller, Episode, PolicyController

log = logging.getLogger(__name__)

# ResidualGP noise variance by kernel, normalised output units. SE: small, so the residual
# follows the samples it has seen; linear: about the pretrained model's own held-out error,
# which the bias and gains are fitted through
RESIDUAL_NOISE = {"se": 1e-3, "linear": 0.3}


# ---------------------------------------------------------------------------- model
def _task_store(run: RunDir, cfg: LeggedRunConfig, store: str | Path | None) -> Path:
    if store is not None:
        path = Path(store)
        if not path.exists():
            raise InputError(f"control {cfg.task}: --store {path} does not exist")
        return path
    from gpdyn.sim.legged import collect_legged

    path = run.path / f"{cfg.task}.zarr"
    seed = cfg.seed if cfg.model.store_seed is None else cfg.model.store_seed
    collect_legged(cfg.legged_task, path, cfg.model.store_episodes, envs=1, seed=seed, progress=cfg.progress)
    return path


def pretrained_model(cfg: LeggedRunConfig, store: str | Path) -> tuple[Learner, LearnedDynamics, dict[str, float]]:
    """Pretrain ``cfg.model.learner`` on the training split of the task's ``-1`` problem; returns it, its dynamics and
    test errors.

    Test errors: nMSE of the learner's own target and the next velocity's RMSE in
    physical units (comparable across targets), beside that of "the velocity persists".
    """
    from gpdyn.data.problems import load_problem

    task, model, on = cfg.legged_task, cfg.model, cfg.compute.kwargs()
    layout, velocities = task.layout, task.layout.velocity_inputs
    one_step = load_problem(store, task.default_problem, protocol="iid", seed=cfg.seed)
    problem = one_step.as_change_of(velocities) if model.target == "change" else one_step
    x, y = problem.tensors("train", **on)
    learner = make_learner(model.learner, layout.input_dim, layout.nv, preset=model.scale, seed=cfg.seed,
                           **on, **model.learner_options)
    t0 = time.perf_counter()
    fit = pretrain_learner(learner, x, y, iterations=model.pretrain_iterations, batch=model.pretrain_batch,
                           seed=cfg.seed, progress=cfg.progress)
    seconds = time.perf_counter() - t0
    dynamics = LearnedDynamics.from_learner(learner, problem.normalizer, layout, model.target)
    x_raw, y_raw = problem.tensors("test", **on, normalize=False)
    with torch.no_grad():
        velocity, _ = dynamics.model.predict(x_raw)
    next_velocity = torch.as_tensor(one_step.y_test, **on)
    # nMSE is per output and invariant to the normaliser's affine map: the learner's own
    # target in physical units scores as its normalised prediction would
    err = nmse(velocity - x_raw[:, velocities] if model.target == "change" else velocity, y_raw)
    stats = {"pretrain_seconds": seconds, "target": model.target, "test_nmse_mean": float(err.mean()),
             "test_nmse_max": float(err.max()),
             "test_velocity_rmse": float((velocity - next_velocity).pow(2).mean().sqrt()),
             "test_persistence_rmse": float((x_raw[:, velocities] - next_velocity).pow(2).mean().sqrt()),
             "train_rows": int(x.shape[0]), **{f"pretrain_{k}": v for k, v in fit.items()}}
    return learner, dynamics, stats


def train_inputs(cfg: LeggedRunConfig, store: str | Path) -> torch.Tensor:
    """The normalised training inputs of the task's ``-1`` problem (the residual GP's lengthscale reference)."""
    from gpdyn.data.problems import load_problem

    problem = load_problem(store, cfg.legged_task.default_problem, protocol="iid", seed=cfg.seed)
    return problem.tensors("train", **cfg.compute.kwargs())[0]


def residual_gp(prior: Learner, reference_x: torch.Tensor, cfg: LeggedRunConfig) -> ResidualGP:
    """The online model of ``adapt="residual"``: a ResidualGP on ``prior`` with the configured kernel and gate."""
    a = cfg.adaptation
    noise = RESIDUAL_NOISE[a.residual_kernel] if a.residual_noise is None else a.residual_noise
    return ResidualGP(prior, reference_x, window=a.window, lengthscale_factor=a.residual_lengthscale, amplitude=1.0,
                      noise=noise, refit_iters=a.residual_refit_iters, gated=a.residual_gate, gate_z=a.residual_gate_z,
                      kernel=a.residual_kernel, forget=a.residual_forget,
                      linear_inputs=range(prior.input_dim)[cfg.legged_task.layout.action_inputs])


def copy_learner(learner: Learner, cfg: LeggedRunConfig) -> Learner:
    """A new learner of the same kind and sizes holding ``learner``'s state (the contract's checkpoint)."""
    twin = make_learner(cfg.model.learner, learner.input_dim, learner.output_dim, preset=cfg.model.scale, seed=cfg.seed,
                        **cfg.compute.kwargs(), **cfg.model.learner_options)
    twin.load_state_dict(learner.state_dict())
    return twin


def online_model(learner: Learner, frozen: LearnedDynamics, cfg: LeggedRunConfig,
                 residual_reference: torch.Tensor | None) -> tuple[LearnedDynamics, OnlineUpdater]:
    """The online controller's model, a copy of the pretrained ``learner`` (wrapped in a
    ResidualGP with ``adapt="residual"``), and the updater that feeds it every transition."""
    twin = copy_learner(learner, cfg)
    if cfg.adaptation.adapt == "residual":
        if residual_reference is None:
            raise InputError(f"control {cfg.task}: adapt='residual' needs the training inputs as its reference")
        twin = residual_gp(twin, residual_reference, cfg)
    dynamics = LearnedDynamics.from_learner(twin, frozen.model.normalizer, cfg.legged_task.layout, cfg.model.target)
    # one prediction builds the copy's prediction caches (an SVDGP's features and factors) now, as the
    # pretrained model's test predictions built its own: the first control step then pays for
    # planning only, not for a setup of several ms that the frozen controller never pays
    with torch.no_grad():
        twin.predict(torch.zeros(1, twin.input_dim, device=twin.device, dtype=twin.dtype))
    return dynamics, OnlineUpdater(twin, batch=cfg.adaptation.online_batch, updates=cfg.adaptation.updates)


def episode_reset_seed(seed: int, episode: int) -> int:
    """The reset seed of consecutive episode ``episode``: the same for every controller and condition."""
    return int(np.random.default_rng([seed, 8]).integers(2**31 - 1)) + episode


def legged_planner(cfg: LeggedRunConfig, model: Any, sim: Any, policy: Any, samples: int, reference: Any = None):
    """The configured MPPI/CEM planner on ``model`` with the TRPO policy as proposal and, as the
    cost, the task's reward in env ``sim`` (with ``terminal_value``, the policy's critic after
    the horizon) or, with ``cost="track"``, the distance to what the nominal model ``reference``
    does under the policy."""
    proposal = TorchPolicy(policy, **cfg.compute.kwargs())
    task = cfg.legged_task.cost(dt=float(sim.dt))
    if cfg.planner.cost == "track":
        if reference is None:
            raise InputError(f"control {cfg.task}: --cost track needs a nominal reference model")
        task = NominalTrackingCost(reference, proposal, task, cfg.planner.track_offset_weight)
    terminal_value = proposal.value if cfg.planner.terminal_value else None
    return make_planner(cfg.planner.planner, model, task, sim.action_space.low, sim.action_space.high, cfg.mpc(samples),
                        proposal=proposal, terminal_value=terminal_value, seed=cfg.seed, **cfg.compute.kwargs())


def legged_controller(name: str, cfg: LeggedRunConfig, policy: Any, model: LearnedDynamics | None = None,
                      updater: OnlineUpdater | None = None, reference: LearnedDynamics | None = None) -> Controller:
    """The experiment's controller ``name`` (:data:`CONTROLLERS`).

    ``model``: the learned dynamics of ``frozen`` and ``online`` (``updater`` learns from every
    transition for ``online``); ``reference``: the pretrained model, the nominal plant the
    learned controllers track with ``cost="track"`` (the true controller tracks a copy of its
    episode's simulator made before the plant changes).
    """
    if name == "trpo":
        return PolicyController(policy.act, name)
    if name == "true":
        def true_planner(env: Any) -> Any:
            sim = env.unwrapped
            frame_skip = cfg.legged_task.frame_skip
            nominal = SimDynamics(copy.deepcopy(sim.model), frame_skip) if cfg.planner.cost == "track" else None
            return legged_planner(cfg, SimDynamics(sim.model, frame_skip), sim, policy, cfg.planner.sim_samples, nominal)

        return MPCController(name, true_planner, env_state, **cfg.compute.kwargs())
    if name in ("frozen", "online"):
        if model is None:
            raise InputError(f"control {cfg.task}: the {name} controller needs a learned model")
        def learned_planner(env: Any) -> Any:
            return legged_planner(cfg, model, env.unwrapped, policy, cfg.planner.mpc.samples, reference)

        return MPCController(name, learned_planner, env_state, model=model,
                             updater=updater if name == "online" else None, **cfg.compute.kwargs())
    raise InputError(f"control {cfg.task}: unknown controller '{name}'; choose one of {', '.join(CONTROLLERS)}")


# ---------------------------------------------------------------------------- episodes
def _episodes_store(path: Path, cfg: LeggedRunConfig):
    from gpdyn.data.store import EpisodeStore
    from gpdyn.sim.legged import legged_fields

    return EpisodeStore.create(
        path, legged_fields(cfg.legged_task), source="gpdyn-control", env_id=cfg.legged_task.env_id,
        dt=cfg.legged_task.layout.dt, seed=cfg.seed,
        episode_keys={"controller": "int64", "condition": "int64", "episode": "int64", "return": "float64"},
        extra_attrs={"controllers": list(CONTROLLERS), "conditions": list(CONDITIONS), "change": cfg.plant.change,
                     "change_at": cfg.plant.change_at},
    )


def plant_change_step(cfg: LeggedRunConfig, condition: str, elapsed: int) -> int | None:
    """The step of an episode at which the plant changes, after ``elapsed`` control steps of
    the condition's earlier episodes: ``cfg.plant.change_at`` counts steps over the consecutive
    episodes, so a plant changed in mid-episode stays changed in the episodes after (a motor
    that weakens does not mend at the next reset). 0: changed from the start; None: the
    nominal condition."""
    return max(0, cfg.plant.change_at - elapsed) if condition == "changed" else None


class LeggedPlan:
    """The legged experiment as :func:`gpdyn.experiments.control.run_control` runs it: the TRPO
    policy, the pretrained model (``learner``/``dynamics``, None without learned controllers),
    one online model per condition, every episode stored in ``episodes``."""

    next_rows = ("qpos", "qvel")

    def __init__(self, cfg: LeggedRunConfig, policy: Any, learner: Learner | None, dynamics: LearnedDynamics | None,
                 residual_reference: torch.Tensor | None, episodes: Any) -> None:
        self.cfg, self.task = cfg, cfg.legged_task
        self.robot, self.conditions, self.controllers = cfg.task, cfg.plant.conditions, cfg.controllers
        self.episodes, self.steps, self.progress = cfg.episodes, cfg.steps, cfg.progress
        self.policy, self.learner, self.dynamics = policy, learner, dynamics
        self.residual_reference = residual_reference
        self.store = episodes
        self.results: list[dict[str, Any]] = []

    def controller(self, name: str, condition: str) -> Controller:
        model, updater = self.dynamics, None
        if name == "online":  # one online model per condition, kept over its episodes
            if self.learner is None or self.dynamics is None:
                raise InputError(f"control {self.robot}: the online controller needs a pretrained model")
            model, updater = online_model(self.learner, self.dynamics, self.cfg, self.residual_reference)
        return legged_controller(name, self.cfg, self.policy, model, updater, reference=self.dynamics)

    def make_env(self) -> Any:
        return self.task.make_env()

    def reset_seed(self, episode: int) -> int:
        return episode_reset_seed(self.cfg.seed, episode)

    def plant_change(self, condition: str, elapsed: int) -> Callable[[int, Any], str | None]:
        change_step = plant_change_step(self.cfg, condition, elapsed)

        def change(t: int, env: Any) -> str | None:
            if t != change_step:
                return None
            return self.task.apply_plant_change(env.unwrapped.model, self.cfg.plant.change, self.cfg.plant.change_factor)

        return change

    def rows(self, env: Any) -> dict[str, Any]:
        return self.task.state_rows(env)

    def record(self, episode: Episode, condition: str, name: str, index: int) -> None:
        rec = episode.record
        self.store.append_episode(episode.rows, controller=CONTROLLERS.index(name),
                                  condition=CONDITIONS.index(condition), episode=index, **{"return": rec["return"]})
        self.results.append(rec)
        plan = rec.get("plan_seconds_mean")
        log.info(f"   {condition:<8} {name:<7}" + (f" episode {index}" if self.episodes > 1 else "")
                 + f" return {rec['return']:8.1f}  length {rec['length']:4d}"
                 + (f"  plan {1e3 * plan:.0f} ms/step" if plan else ""))

    def finish(self, run: RunDir) -> dict[str, Any]:
        from gpdyn.experiments.control_report import write_legged_report

        if self.cfg.video:
            _video(run, self.store, self.results)
        return {"episodes": self.results, "report": str(write_legged_report(run, self.cfg))}


def run_legged(run: RunDir, cfg: LeggedRunConfig, store: str | Path | None = None) -> dict[str, Any]:
    """The whole experiment into ``run``: pretrain, every controller x condition (:func:`run_control`), report."""
    from gpdyn.robots.policy import load_policy

    cfg.validate()
    torch.manual_seed(cfg.seed)
    store_path = _task_store(run, cfg, store)
    task = cfg.legged_task
    if task.policy_file is None:
        raise InputError(f"control {cfg.task}: the task has no policy for the planners' proposal")
    policy = load_policy(task.policy_file)
    learner, dynamics, fit = (None, None, {})
    if any(c in ("frozen", "online") for c in cfg.controllers):
        learner, dynamics, fit = pretrained_model(cfg, store_path)
        run.log(kind="pretrain", robot=cfg.task, learner=cfg.model.learner, store=str(store_path), **fit)
        log.info(f"   pretrained {cfg.model.learner} ({cfg.model.target}) on {fit['train_rows']} {task.default_problem} rows in "
                 f"{fit['pretrain_seconds']:.1f} s: test nMSE {fit['test_nmse_mean']:.3f}, next-velocity RMSE "
                 f"{fit['test_velocity_rmse']:.2f} (velocity persists: {fit['test_persistence_rmse']:.2f})")
    residual_reference = (train_inputs(cfg, store_path)
                          if "online" in cfg.controllers and cfg.adaptation.adapt == "residual" else None)
    # after the store is read: a run that fails on its input leaves a folder with nothing logged, which the CLI removes
    run.log(kind="task", robot=cfg.task, env_id=task.env_id, control_period_s=task.layout.dt)
    plan = LeggedPlan(cfg, policy, learner, dynamics, residual_reference,
                      _episodes_store(run.path / "episodes.zarr", cfg))
    return {**run_control(run, plan), "pretrain": fit}


def _video(run: RunDir, store: Any, results: list[dict[str, Any]]) -> None:
    from gpdyn.sim.render import render_episode

    # the online controller's last episode on the changed plant when it ran (the most it has learned), else the last episode
    index = max((i for i, r in enumerate(results) if r["controller"] == "online" and r["condition"] == "changed"),
                default=len(results) - 1)
    path = render_episode(store, index, run.path / "control.mp4")
    log.info(f"   video: {path}")


__all__ = ["LeggedPlan", "RESIDUAL_NOISE", "copy_learner", "episode_reset_seed", "legged_controller", "legged_planner",
           "online_model", "plant_change_step", "pretrained_model", "residual_gp", "run_legged", "train_inputs"]
