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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpdyn.control.controllers import MPCController
from gpdyn.control.dynamics import TARGETS, LearnedDynamics, SimDynamics, env_state
from gpdyn.control.mpc import MPCConfig, make_planner
from gpdyn.device import MAX_SEED, resolve_device, resolve_dtype
from gpdyn.errors import InputError
from gpdyn.experiments.control import run_control
from gpdyn.gp import LEARNERS, PRESETS, Learner, learner_class, learner_options, make_learner
from gpdyn.gp.online import nmse
from gpdyn.gp.residual import RESIDUAL_KERNELS, ResidualGP
from gpdyn.gp.training import OnlineUpdater, pretrain_learner
from gpdyn.robots.legged import LeggedTask, NominalTrackingCost, TorchPolicy
from gpdyn.robots.task import get_task
from gpdyn.runs import RunDir
from gpdyn.sim.loop import Controller, Episode, PolicyController

log = logging.getLogger(__name__)

CONTROLLERS = ("trpo", "true", "frozen", "online")
# what the planners minimise: "reward" = minus the task's reward (LeggedCost), "track" = the
# distance to the nominal plant's next velocities under the policy (NominalTrackingCost)
COSTS = ("reward", "track")
CONDITIONS = ("nominal", "changed")
ADAPT = ("steps", "residual")
# ResidualGP noise variance by kernel, normalised output units. SE: small, so the residual
# follows the samples it has seen; linear: about the pretrained model's own held-out error
# (test nMSE 0.28 on a 20-episode store), which the bias and gains are fitted through
RESIDUAL_NOISE = {"se": 1e-3, "linear": 0.3}


@dataclass
class LeggedRunConfig:
    """Settings of a legged task's control run. The defaults run in a few minutes on 2 cores.

    Paper scale: ``samples=1000, horizon=30, steps=1000, scale="paper"``.
    """

    task: str = "walker"  # the registered legged task (gpdyn.robots.task)
    learner: str = "svdgp"
    target: str = "change"  # the learner's outputs: "change" (qvel[t+1] - qvel[t]) or "velocity" (qvel[t+1], the -1 problem as is)
    scale: str = "small"  # learner sizes: a preset of the learner's size table (gpdyn.gp.PRESETS)
    planner: str = "mppi"
    cost: str = "reward"  # COSTS: the task's reward, or tracking the nominal plant under the policy
    # cost="track": price of an action offset to the policy, (rad/s)^2 per unit^2 (NominalTrackingCost);
    # without it the online model chased its own errors on the mild changes and fell
    track_offset_weight: float = 10.0
    steps: int = 100  # control steps per episode (the task's episodes end at its time limit)
    episodes: int = 1  # consecutive episodes per controller and condition; the online model is kept across them
    samples: int = 64  # K for the learned model
    sim_samples: int = 32  # K for the true-simulator model (each sample is a MuJoCo rollout)
    horizon: int = 10
    noise_std: float = 0.2
    temperature: float = 0.5
    control_cost: float = 0.0  # MPPI's pull back to the proposal (MPCConfig.control_cost)
    iterations: int = 2  # CEM only
    uncertainty: str = "penalty"
    var_weight: float = 1.0
    proposal_fraction: float = 0.5
    relative_to_proposal: bool = False  # plan offsets to the TRPO policy's closed-loop actions
    proposal_tail: int = 0  # steps the TRPO policy alone runs through the model after the horizon (MPCConfig)
    warm_start: bool = True  # False: every plan starts from zero offsets / the policy's rollout (MPCConfig)
    compiled_planner: bool = False  # the cost and the TRPO proposal as compiled programs (MPCConfig.compiled)
    terminal_cost: float = 50.0
    terminal_value: bool = False  # subtract the TRPO critic's value of the horizon's last state
    pretrain_iterations: int = 100
    pretrain_batch: int = 128
    online_batch: int = 64
    updates: int = 1
    adapt: str = "residual"  # online model: "residual" (ResidualGP on the frozen one) or "steps" (the learner's own observe/step)
    window: int = 400  # ResidualGP: most recent transitions it conditions on
    # ResidualGP: factor on the median-trick lengthscales. Replayed on stored episodes, x3 had
    # the lowest one-step error of x1, x3, x10 and per-input choices: changed plant 2.04 (x1)
    # -> 1.77, nominal 1.69 -> 1.59
    residual_lengthscale: float = 3.0
    residual_noise: float | None = None  # ResidualGP noise variance, normalised output units (None: RESIDUAL_NOISE)
    # ResidualGP: the residual's kernel, RESIDUAL_KERNELS: "se" over all inputs, or "linear" over the
    # action alone, r(s, a) = b + W a: how the plant answers the action, what a weakened motor changes
    residual_kernel: str = "se"
    residual_forget: float = 1.0  # linear kernel: weight forget**k on a sample k steps old (LinearKernelGP)
    # ResidualGP: use the residual on an output only while it predicts it better than the
    # frozen model (ResidualGP.gated)
    residual_gate: bool = False
    # the gate's evidence: the residual's average improvement must exceed this many standard
    # errors (ResidualGP.gate_z; 0 = the plain comparison)
    residual_gate_z: float = 0.0
    store_episodes: int = 4  # collected into the run folder when no store is given
    store_seed: int | None = None  # seed of that collection (None: the run's seed)
    change: str = "torso_mass"
    change_factor: float | None = None  # None: the change's own (torso mass x1.3, friction x0.5, motor x0.5)
    # 0: the plant is changed from the start; t > 0: at control step t of the condition's run,
    # counted over its consecutive episodes, and it stays changed in the episodes after
    change_at: int = 0
    controllers: tuple[str, ...] = CONTROLLERS
    conditions: tuple[str, ...] = CONDITIONS
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float64"
    video: bool = False
    progress: bool = True
    # options of the learner's constructor over its preset (e.g. compiled_mean for wiski, shared_kernel for svdgp)
    learner_options: dict[str, bool | int | float | str] = field(default_factory=dict)

    @property
    def legged_task(self) -> LeggedTask:
        """The task this run controls (InputError for an unknown or non-legged one)."""
        task = get_task(self.task)
        if not isinstance(task, LeggedTask):
            raise InputError(f"control {self.task}: not a legged task (a {type(task).__name__})")
        return task

    def validate(self) -> None:
        """Raise InputError naming the first bad option (the device included: before any data is collected)."""
        task = self.legged_task
        if self.learner not in LEARNERS:
            raise InputError(f"control {self.task}: unknown learner '{self.learner}'; choose one of {', '.join(LEARNERS)}")
        unknown = sorted(set(self.learner_options) - set(learner_options(learner_class(self.learner))))
        if unknown:
            raise InputError(f"control {self.task}: learner_options: learner '{self.learner}' takes no option {', '.join(unknown)}")
        if self.steps < 1 or self.episodes < 1 or self.store_episodes < 1 or self.pretrain_iterations < 0:
            raise InputError(f"control {self.task}: steps, episodes, store_episodes >= 1 and pretrain_iterations >= 0 needed, "
                             f"got {self.steps}, {self.episodes}, {self.store_episodes}, {self.pretrain_iterations}")
        for name in ("steps", "horizon", "proposal_tail"):  # past an episode's end they plan or run nothing
            if getattr(self, name) > task.episode_steps:
                raise InputError(f"control {self.task}: {name} {getattr(self, name)} is longer than an episode "
                                 f"({task.episode_steps} steps)")
        for name in ("seed", "store_seed"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_SEED:
                raise InputError(f"control {self.task}: {name} must be in [0, {MAX_SEED}], got {value}")
        if self.pretrain_batch < 1 or self.online_batch < 1:
            raise InputError(f"control {self.task}: pretrain_batch and online_batch must be >= 1, got {self.pretrain_batch}, "
                             f"{self.online_batch}")
        if self.scale not in PRESETS:
            raise InputError(f"control {self.task}: scale must be one of {', '.join(PRESETS)}, got '{self.scale}'")
        task.plant_change_factor(self.change, self.change_factor)
        if not 0 <= self.change_at < self.steps:
            raise InputError(f"control {self.task}: --change-at must be in [0, steps={self.steps}), got {self.change_at}")
        for name, given, allowed in (("controllers", self.controllers, CONTROLLERS), ("conditions", self.conditions, CONDITIONS)):
            bad = [c for c in given if c not in allowed]
            if bad or not given:
                raise InputError(f"control {self.task}: {name} {bad or '(none)'} not in {', '.join(allowed)}")
        if self.target not in TARGETS:
            raise InputError(f"control {self.task}: target must be one of {', '.join(TARGETS)}, got '{self.target}'")
        if self.cost not in COSTS:
            raise InputError(f"control {self.task}: cost must be one of {', '.join(COSTS)}, got '{self.cost}'")
        if not (self.track_offset_weight >= 0 and np.isfinite(self.track_offset_weight)):
            raise InputError(f"control {self.task}: track_offset_weight must be finite and >= 0, got {self.track_offset_weight}")
        if self.cost == "track" and self.terminal_value:
            raise InputError(f"control {self.task}: --terminal-value adds the critic's reward units to a cost in velocity "
                             "units; it does not apply with --cost track")
        if self.adapt not in ADAPT:
            raise InputError(f"control {self.task}: adapt must be one of {', '.join(ADAPT)}, got '{self.adapt}'")
        if self.residual_kernel not in RESIDUAL_KERNELS:
            raise InputError(f"control {self.task}: residual_kernel must be one of {', '.join(RESIDUAL_KERNELS)}, "
                             f"got '{self.residual_kernel}'")
        if not 0 < self.residual_forget <= 1:
            raise InputError(f"control {self.task}: residual_forget must be in (0, 1], got {self.residual_forget}")
        if not (self.residual_gate_z >= 0 and np.isfinite(self.residual_gate_z)):
            raise InputError(f"control {self.task}: residual_gate_z must be finite and >= 0, got {self.residual_gate_z}")
        noise_ok = self.residual_noise is None or (self.residual_noise > 0 and np.isfinite(self.residual_noise))
        if self.window < 4 or self.updates < 0 or not (self.residual_lengthscale > 0 and noise_ok):
            raise InputError(f"control {self.task}: need window >= 4, updates >= 0, residual_lengthscale > 0 and "
                             f"residual_noise > 0, got {self.window}, {self.updates}, {self.residual_lengthscale}, "
                             f"{self.residual_noise}")
        resolve_device(self.device)
        resolve_dtype(self.dtype, self.device, option=f"control {self.task}: dtype")
        if self.sim_samples < 2:
            raise InputError(f"control {self.task}: sim_samples must be >= 2, got {self.sim_samples}")
        self.mpc(self.samples).validate()
        for samples in (self.samples, self.sim_samples):  # before any data is collected or model trained
            self.mpc(samples).check_memory(task.layout.nx, task.layout.nu, self.torch_dtype, self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        return resolve_dtype(self.dtype, self.device)

    def mpc(self, samples: int) -> MPCConfig:
        return MPCConfig(
            horizon=self.horizon, samples=samples, noise_std=self.noise_std, temperature=self.temperature,
            control_cost=self.control_cost,
            iterations=self.iterations, terminal_cost=self.terminal_cost, uncertainty=self.uncertainty,
            var_weight=self.var_weight, proposal_fraction=self.proposal_fraction,
            relative_to_proposal=self.relative_to_proposal, proposal_tail=self.proposal_tail,
            warm_start=self.warm_start, compiled=self.compiled_planner,
        )


# ---------------------------------------------------------------------------- model
def _task_store(run: RunDir, cfg: LeggedRunConfig, store: str | Path | None) -> Path:
    if store is not None:
        path = Path(store)
        if not path.exists():
            raise InputError(f"control {cfg.task}: --store {path} does not exist")
        return path
    from gpdyn.sim.legged import collect_legged

    path = run.path / f"{cfg.task}.zarr"
    seed = cfg.seed if cfg.store_seed is None else cfg.store_seed
    collect_legged(cfg.legged_task, path, cfg.store_episodes, envs=1, seed=seed, progress=cfg.progress)
    return path


def pretrained_model(cfg: LeggedRunConfig, store: str | Path) -> tuple[Learner, LearnedDynamics, dict[str, float]]:
    """Pretrain ``cfg.learner`` on the training split of the task's ``-1`` problem; returns it, its dynamics and
    test errors.

    Test errors: nMSE of the learner's own target and the next velocity's RMSE in
    physical units (comparable across targets), beside that of "the velocity persists".
    """
    from gpdyn.data.problems import load_problem

    task = cfg.legged_task
    layout, velocities = task.layout, task.layout.velocity_inputs
    one_step = load_problem(store, task.default_problem, protocol="iid", seed=cfg.seed)
    problem = one_step.as_change_of(velocities) if cfg.target == "change" else one_step
    dtype = cfg.torch_dtype
    x, y = problem.tensors("train", cfg.device, dtype)
    learner = make_learner(cfg.learner, layout.input_dim, layout.nv, preset=cfg.scale, device=cfg.device, dtype=dtype,
                            seed=cfg.seed, **cfg.learner_options)
    t0 = time.perf_counter()
    fit = pretrain_learner(learner, x, y, iterations=cfg.pretrain_iterations, batch=cfg.pretrain_batch,
                           seed=cfg.seed, progress=cfg.progress)
    seconds = time.perf_counter() - t0
    dynamics = LearnedDynamics.from_learner(learner, problem.normalizer, layout, cfg.target)
    x_raw, y_raw = problem.tensors("test", cfg.device, dtype, normalize=False)
    with torch.no_grad():
        velocity, _ = dynamics.model.predict(x_raw)
    next_velocity = torch.as_tensor(one_step.y_test, device=cfg.device, dtype=dtype)
    # nMSE is per output and invariant to the normaliser's affine map: the learner's own
    # target in physical units scores as its normalised prediction would
    err = nmse(velocity - x_raw[:, velocities] if cfg.target == "change" else velocity, y_raw)
    stats = {"pretrain_seconds": seconds, "target": cfg.target, "test_nmse_mean": float(err.mean()),
             "test_nmse_max": float(err.max()),
             "test_velocity_rmse": float((velocity - next_velocity).pow(2).mean().sqrt()),
             "test_persistence_rmse": float((x_raw[:, velocities] - next_velocity).pow(2).mean().sqrt()),
             "train_rows": int(x.shape[0]), **{f"pretrain_{k}": v for k, v in fit.items()}}
    return learner, dynamics, stats


def train_inputs(cfg: LeggedRunConfig, store: str | Path) -> torch.Tensor:
    """The normalised training inputs of the task's ``-1`` problem (the residual GP's lengthscale reference)."""
    from gpdyn.data.problems import load_problem

    return load_problem(store, cfg.legged_task.default_problem, protocol="iid", seed=cfg.seed).tensors("train", cfg.device, cfg.torch_dtype)[0]


def residual_gp(prior: Learner, reference_x: torch.Tensor, cfg: LeggedRunConfig) -> ResidualGP:
    """The online model of ``adapt="residual"``: a ResidualGP on ``prior`` with the configured kernel and gate."""
    noise = RESIDUAL_NOISE[cfg.residual_kernel] if cfg.residual_noise is None else cfg.residual_noise
    return ResidualGP(prior, reference_x, window=cfg.window, lengthscale_factor=cfg.residual_lengthscale,
                      amplitude=1.0, noise=noise, gated=cfg.residual_gate, gate_z=cfg.residual_gate_z,
                      kernel=cfg.residual_kernel, forget=cfg.residual_forget,
                      linear_inputs=range(prior.input_dim)[cfg.legged_task.layout.action_inputs])


def copy_learner(learner: Learner, cfg: LeggedRunConfig) -> Learner:
    """A new learner of the same kind and sizes holding ``learner``'s state (the contract's checkpoint)."""
    twin = make_learner(cfg.learner, learner.input_dim, learner.output_dim, preset=cfg.scale, device=cfg.device,
                         dtype=cfg.torch_dtype, seed=cfg.seed, **cfg.learner_options)
    twin.load_state_dict(learner.state_dict())
    return twin


def online_model(learner: Learner, frozen: LearnedDynamics, cfg: LeggedRunConfig,
                        residual_reference: torch.Tensor | None) -> tuple[LearnedDynamics, OnlineUpdater]:
    """The online controller's model, a copy of the pretrained ``learner`` (wrapped in a
    ResidualGP with ``adapt="residual"``), and the updater that feeds it every transition."""
    twin = copy_learner(learner, cfg)
    if cfg.adapt == "residual":
        if residual_reference is None:
            raise InputError(f"control {cfg.task}: adapt='residual' needs the training inputs as its reference")
        twin = residual_gp(twin, residual_reference, cfg)
    dynamics = LearnedDynamics.from_learner(twin, frozen.model.normalizer, cfg.legged_task.layout, cfg.target)
    return dynamics, OnlineUpdater(twin, batch=cfg.online_batch, updates=cfg.updates)


def episode_reset_seed(seed: int, episode: int) -> int:
    """The reset seed of consecutive episode ``episode``: the same for every controller and condition."""
    return int(np.random.default_rng([seed, 8]).integers(2**31 - 1)) + episode


def legged_planner(cfg: LeggedRunConfig, model: Any, sim: Any, policy: Any, samples: int, reference: Any = None):
    """The configured MPPI/CEM planner on ``model`` with the TRPO policy as proposal and, as the
    cost, the task's reward in env ``sim`` (with ``terminal_value``, the policy's critic after
    the horizon) or, with ``cost="track"``, the distance to what the nominal model ``reference``
    does under the policy."""
    proposal = TorchPolicy(policy, cfg.device, cfg.torch_dtype)
    task = cfg.legged_task.cost(dt=float(sim.dt))
    if cfg.cost == "track":
        if reference is None:
            raise InputError(f"control {cfg.task}: --cost track needs a nominal reference model")
        task = NominalTrackingCost(reference, proposal, task, cfg.track_offset_weight)
    return make_planner(cfg.planner, model, task, sim.action_space.low, sim.action_space.high,
                        cfg.mpc(samples), proposal=proposal, terminal_value=proposal.value if cfg.terminal_value else None,
                        device=cfg.device, dtype=cfg.torch_dtype, seed=cfg.seed)


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
            nominal = SimDynamics(copy.deepcopy(sim.model), frame_skip) if cfg.cost == "track" else None
            return legged_planner(cfg, SimDynamics(sim.model, frame_skip), sim, policy, cfg.sim_samples, nominal)

        return MPCController(name, true_planner, env_state, device=cfg.device, dtype=cfg.torch_dtype)
    if name in ("frozen", "online"):
        if model is None:
            raise InputError(f"control {cfg.task}: the {name} controller needs a learned model")
        return MPCController(name, lambda env: legged_planner(cfg, model, env.unwrapped, policy, cfg.samples, reference),
                             env_state, model=model, updater=updater if name == "online" else None,
                             device=cfg.device, dtype=cfg.torch_dtype)
    raise InputError(f"control {cfg.task}: unknown controller '{name}'; choose one of {', '.join(CONTROLLERS)}")


# ---------------------------------------------------------------------------- episodes
def _episodes_store(path: Path, cfg: LeggedRunConfig):
    from gpdyn.data.store import EpisodeStore
    from gpdyn.sim.legged import legged_fields

    return EpisodeStore.create(
        path, legged_fields(cfg.legged_task), source="gpdyn-control", env_id=cfg.legged_task.env_id,
        dt=cfg.legged_task.layout.dt, seed=cfg.seed,
        episode_keys={"controller": "int64", "condition": "int64", "episode": "int64", "return": "float64"},
        extra_attrs={"controllers": list(CONTROLLERS), "conditions": list(CONDITIONS), "change": cfg.change,
                     "change_at": cfg.change_at},
    )


def plant_change_step(cfg: LeggedRunConfig, condition: str, elapsed: int) -> int | None:
    """The step of an episode at which the plant changes, after ``elapsed`` control steps of
    the condition's earlier episodes: ``cfg.change_at`` counts steps over the consecutive
    episodes, so a plant changed in mid-episode stays changed in the episodes after (a motor
    that weakens does not mend at the next reset). 0: changed from the start; None: the
    nominal condition."""
    return max(0, cfg.change_at - elapsed) if condition == "changed" else None


class LeggedPlan:
    """The legged experiment as :func:`gpdyn.experiments.control.run_control` runs it: the TRPO
    policy, the pretrained model (``learner``/``dynamics``, None without learned controllers),
    one online model per condition, every episode stored in ``episodes``."""

    next_rows = ("qpos", "qvel")

    def __init__(self, cfg: LeggedRunConfig, policy: Any, learner: Learner | None, dynamics: LearnedDynamics | None,
                 residual_reference: torch.Tensor | None, episodes: Any) -> None:
        self.cfg, self.task = cfg, cfg.legged_task
        self.robot, self.conditions, self.controllers = cfg.task, cfg.conditions, cfg.controllers
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
            return self.task.apply_plant_change(env.unwrapped.model, self.cfg.change, self.cfg.change_factor)

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
        run.log(kind="pretrain", robot=cfg.task, learner=cfg.learner, store=str(store_path), **fit)
        log.info(f"   pretrained {cfg.learner} ({cfg.target}) on {fit['train_rows']} {task.default_problem} rows in "
                 f"{fit['pretrain_seconds']:.1f} s: test nMSE {fit['test_nmse_mean']:.3f}, next-velocity RMSE "
                 f"{fit['test_velocity_rmse']:.2f} (velocity persists: {fit['test_persistence_rmse']:.2f})")
    residual_reference = (train_inputs(cfg, store_path)
                          if "online" in cfg.controllers and cfg.adapt == "residual" else None)
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


__all__ = ["ADAPT", "CONDITIONS", "CONTROLLERS", "COSTS", "LeggedRunConfig", "RESIDUAL_NOISE", "copy_learner",
           "episode_reset_seed", "legged_controller", "legged_planner", "online_model", "plant_change_step",
           "pretrained_model", "residual_gp", "run_legged", "LeggedPlan", "train_inputs"]
