"""The settings of a legged task's control run (``gpdyn control walker|hopper``): one config tree.

:class:`LeggedRunConfig` is the root; its sections are the learned model
(:class:`ModelSettings`), the planner (:class:`PlannerSettings`, with the sampling planner's own
:class:`~gpdyn.control.mpc_config.MPCConfig`), the online adaptation
(:class:`AdaptationSettings`), the plant change (:class:`PlantSettings`) and where it computes
(:class:`~gpdyn.config.Compute`). Every setting is declared once (:func:`gpdyn.config.setting`):
the command line's options, a recipe's keys (by setting name), their checks and the report's
settings table come from here. Importing this module imports neither torch nor MuJoCo.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpdyn.config import LEARNER_NAMES, PRESET_NAMES, Compute, build, check, setting
from gpdyn.control.mpc_config import MPCConfig
from gpdyn.errors import InputError

CONTROLLERS = ("trpo", "true", "frozen", "online")
# what the planners minimise: "reward" = minus the task's reward (LeggedCost), "track" = the
# distance to the nominal plant's next velocities under the policy (NominalTrackingCost)
COSTS = ("reward", "track")
CONDITIONS = ("nominal", "changed")
ADAPT = ("steps", "residual")
TARGETS = ("change", "velocity")  # gpdyn.control.dynamics.TARGETS (that module imports torch)
RESIDUAL_KERNELS = ("se", "linear")  # gpdyn.gp.residual.RESIDUAL_KERNELS (likewise)
MAX_SEED = 2**32 - 1  # gpdyn.device.MAX_SEED (likewise)


@dataclass
class ModelSettings:
    """The learned forward model: which learner, its sizes and target, its pretraining data."""

    learner: str = setting("svdgp", choices=LEARNER_NAMES, metavar="NAME", help="learner of the model")
    target: str = setting("change", choices=TARGETS,
                          help="what the learner predicts: the velocity change over the step (change) or the next "
                               "velocity (velocity)")
    scale: str = setting("small", choices=PRESET_NAMES, metavar="PRESET", help="learner sizes, a preset")
    learner_options: dict[str, bool | int | float | str] = setting(default_factory=dict, cli=False,
                                              help="options of the learner's constructor over its preset")
    pretrain_iterations: int = setting(100, low=0, metavar="N", help="minibatch steps on the stored data before control")
    pretrain_batch: int = setting(128, low=1, metavar="N", help="rows per pretraining step")
    store_episodes: int = setting(4, low=1, metavar="N",
                                  help="policy episodes collected into the run folder when no --store is given")
    store_seed: int | None = setting(None, low=0, high=MAX_SEED, metavar="SEED", none_means="the run's seed",
                                     help="seed of that collection")

    def validate(self) -> None:
        from gpdyn.gp import learner_class, learner_options

        unknown = sorted(set(self.learner_options) - set(learner_options(learner_class(self.learner))))
        if unknown:
            raise InputError(f"learner_options: learner '{self.learner}' takes no option {', '.join(unknown)}")


def _legged_mpc() -> MPCConfig:
    """The planner's defaults for a legged task: short plans of few samples, in real time on a CPU."""
    return MPCConfig(horizon=10, samples=64, noise_std=0.2, temperature=0.5, iterations=2, terminal_cost=50.0,
                     uncertainty="penalty", var_weight=1.0)


@dataclass
class PlannerSettings:
    """The MPC planner: its kind, what it minimises, its samples and sampling (``mpc``)."""

    planner: str = setting("mppi", choices=("mppi", "cem"), help="MPC planner")
    cost: str = setting("reward", choices=COSTS,
                        help="what the planner minimises: minus the task's reward (reward) or the distance of the "
                             "predicted next velocities to those of the nominal plant under the policy (track: policy "
                             "transfer)")
    track_offset_weight: float = setting(10.0, low=0, metavar="W",
                                         help="--cost track: price of an action offset to the policy, (rad/s)^2 per "
                                              "unit^2 (without it an online model chases its own errors)")
    sim_samples: int = setting(32, low=2, metavar="K",
                               help="K for the true-simulator MPC (each sample is a MuJoCo rollout)")
    terminal_value: bool = setting(False, help="the policy critic's value of each sample's last state joins its cost")
    mpc: MPCConfig = field(default_factory=_legged_mpc)

    def validate(self) -> None:
        if self.cost == "track" and self.terminal_value:
            raise InputError("--terminal-value adds the critic's reward units to a cost in velocity units; it does not "
                             "apply with --cost track")


@dataclass
class AdaptationSettings:
    """How the online controller's model learns from each transition."""

    adapt: str = setting("residual", choices=ADAPT,
                         help="online model: an exact GP on the frozen model's residuals (residual) or the learner's "
                              "own observe and steps (steps)")
    online_batch: int = setting(64, low=1, metavar="N", help="rows per online step of the learner (steps)")
    updates: int = setting(1, low=0, metavar="N", help="learner steps per control step (steps)")
    window: int = setting(400, low=4, metavar="N", help="residual: the most recent transitions it conditions on")
    residual_lengthscale: float = setting(3.0, low=0, open_low=True, metavar="F",
                                          help="residual: factor on the median-trick lengthscales")
    residual_noise: float | None = setting(None, low=0, open_low=True, metavar="VAR",
                                           none_means="the kernel's: 0.001 (se), 0.3 (linear)",
                                           help="residual: noise variance, normalised output units")
    residual_kernel: str = setting("se", choices=RESIDUAL_KERNELS,
                                   help="residual: SE over all inputs (se) or linear over the action alone, a bias "
                                        "plus a gain per action: how the plant answers the action (linear)")
    residual_forget: float = setting(1.0, low=0, high=1, open_low=True, metavar="FORGET",
                                     help="residual, linear kernel: weight forget**k on a transition k steps old")
    residual_refit_iters: int = setting(10, low=0, metavar="N",
                                        help="residual, SE kernel: Adam steps on its marginal likelihood every 100 "
                                             "transitions (0: its hyperparameters stay as set, one kernel for every "
                                             "output)")
    residual_gate: bool = setting(False, help="residual: add it to an output's prediction only while it has predicted "
                                              "that output better than the frozen model (prequential errors)")
    residual_gate_z: float = setting(0.0, low=0, metavar="Z",
                                     help="with residual_gate: the residual's average improvement must be this many "
                                          "standard errors above zero (0: the plain comparison)")


@dataclass
class PlantSettings:
    """The plant conditions the controllers run on and the change of the changed one."""

    change: str = setting("torso_mass", metavar="NAME",
                          help="plant change of the changed condition, one of the task's (torso_mass, foot_friction, "
                               "weak_motor, joint_spring)")
    change_factor: float | None = setting(None, low=0, open_low=True, metavar="FACTOR",
                                          none_means="the change's own: torso mass x1.3, foot friction x0.5, motor "
                                                     "x0.5, spring x1",
                                          help="scale of the plant change")
    change_at: int = setting(0, low=0, metavar="STEP",
                             help="control step of the change, 0 = from the start; counted over the consecutive "
                                  "episodes, the plant stays changed after")
    conditions: tuple[str, ...] = setting(CONDITIONS, choices=CONDITIONS, metavar="A,B",
                                          help="plants to run on, comma-separated")


@dataclass
class LeggedRunConfig:
    """Settings of a legged task's control run. The defaults run in a few minutes on 2 cores.

    Paper scale: ``samples=1000, horizon=30, steps=1000, scale="paper"``. Build one from
    settings by name with :meth:`of`.
    """

    task: str = setting("walker", cli=False, recipe=False, help="the registered legged task")
    steps: int = setting(100, low=1, metavar="N", help="control steps per episode")
    episodes: int = setting(1, low=1, metavar="N",
                            help="consecutive episodes per controller and condition; the online model is kept across "
                                 "them, the frozen one stays as pretrained")
    controllers: tuple[str, ...] = setting(CONTROLLERS, choices=CONTROLLERS, metavar="A,B,...",
                                           help="controllers to compare, comma-separated")
    seed: int = setting(0, low=0, high=MAX_SEED, help="the run's seed")
    video: bool = setting(False, help="MP4 of the online controller's last episode on the changed plant")
    progress: bool = setting(True, cli=False, recipe=False, help="progress bars on a terminal")
    model: ModelSettings = field(default_factory=ModelSettings)
    planner: PlannerSettings = field(default_factory=PlannerSettings)
    adaptation: AdaptationSettings = field(default_factory=AdaptationSettings)
    plant: PlantSettings = field(default_factory=PlantSettings)
    compute: Compute = field(default_factory=lambda: Compute(dtype="float64"))

    @classmethod
    def of(cls, **values: Any) -> LeggedRunConfig:
        """A config with ``values`` (settings by name, e.g. ``horizon=3``) over the defaults."""
        return build(cls, values, where="LeggedRunConfig")

    @property
    def legged_task(self) -> Any:
        """The task this run controls (a :class:`~gpdyn.robots.legged.LeggedTask`; InputError for an unknown or
        non-legged one)."""
        from gpdyn.robots.legged import LeggedTask
        from gpdyn.robots.task import get_task

        task = get_task(self.task)
        if not isinstance(task, LeggedTask):
            raise InputError(f"control {self.task}: not a legged task (a {type(task).__name__})")
        return task

    def mpc(self, samples: int) -> MPCConfig:
        """The planner's settings with ``samples`` sequences (the learned models' or the simulator's)."""
        from dataclasses import replace

        return replace(self.planner.mpc, samples=samples)

    def validate(self) -> None:
        """Raise InputError naming the first bad setting (the device included: before any data is collected)."""
        where = f"control {self.task}"
        try:
            check(self, where, sections=False)
            for section in (self.model, self.planner, self.planner.mpc, self.adaptation, self.plant, self.compute):
                if hasattr(section, "validate"):
                    section.validate()
        except InputError as err:
            message = str(err)
            raise InputError(message if message.startswith(where) else f"{where}: {message}") from None
        task = self.legged_task
        for name, value in (("steps", self.steps), ("horizon", self.planner.mpc.horizon),
                            ("proposal_tail", self.planner.mpc.proposal_tail)):
            if value > task.episode_steps:  # past an episode's end they plan or run nothing
                raise InputError(f"{where}: {name} {value} is longer than an episode ({task.episode_steps} steps)")
        task.plant_change_factor(self.plant.change, self.plant.change_factor)
        if not self.plant.change_at < self.steps:
            raise InputError(f"{where}: --change-at must be in [0, steps={self.steps}), got {self.plant.change_at}")
        if not self.controllers or not self.plant.conditions:
            raise InputError(f"{where}: controllers and conditions must name at least one each")
        for samples in (self.planner.mpc.samples, self.planner.sim_samples):  # before any data is collected
            self.mpc(samples).check_memory(task.layout.nx, task.layout.nu, self.compute.torch_dtype,
                                           self.compute.device)


__all__ = ["ADAPT", "AdaptationSettings", "CONDITIONS", "CONTROLLERS", "COSTS", "LeggedRunConfig", "ModelSettings",
           "PlannerSettings", "PlantSettings"]
