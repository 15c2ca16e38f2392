"""The settings of an arm's tracking run (``gpdyn control kuka|arm``): one config tree.

:class:`ArmRunConfig` is the root; its sections are the arm's MJCF file and options
(:class:`MjcfSettings`), the learned inverse-dynamics model (:class:`ArmModelSettings`), the
reference motion and the PD loop (:class:`ReferenceSettings`), the plant change
(:class:`ArmPlantSettings`), the online adaptation (:class:`ArmAdaptationSettings`) and where it
computes (:class:`~gpdyn.config.Compute`). Every setting is declared once
(:func:`gpdyn.config.setting`): the command line's options, a recipe's keys, their checks and
the report's settings come from here. The options that pick the arm (``--model``, ``--joints``,
...) are the collectors' too and are declared with them (:func:`gpdyn.cli.collect.add_arm_options`).
Importing this module imports neither torch nor MuJoCo.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpdyn.config import FAMILY_NAMES, LEARNER_NAMES, PRESET_NAMES, Compute, build, check, setting
from gpdyn.errors import InputError

if TYPE_CHECKING:
    from gpdyn.robots.arm import ArmModel

ARM_CONTROLLERS = ("pd", "true", "frozen", "online")
# plant changes at change_at: a load at the payload body, added joint friction, weaker (or stronger) motors, and a
# torsion spring at every joint (a torque of the joint's position: outside the rigid-body regressor's class)
CHANGES = ("payload", "joint-friction", "motor-gain", "joint-spring")
# online model: "rigid-body" (RigidBodyGP: rigid-body features and the frozen model as a basis function,
# Kalman updates), "residual" (ResidualGP, an exact GP on the frozen model's residuals) or "steps"
# (the learner's own optimiser steps)
ADAPT = ("rigid-body", "residual", "steps")
# the feedback around the feed-forward (gpdyn.control.feedback): per-joint gains, or through the arm's inertia
FEEDBACK = ("diagonal", "inertia")
MAX_SEED = 2**32 - 1  # gpdyn.device.MAX_SEED (that module imports torch)
# memory per control step: the episode's rows (a few small arrays per step, with Python's
# overhead) and the reference poses; generous for arms of up to ~30 joints
STEP_BYTES = 4096


@dataclass
class MjcfSettings:
    """The arm: an MJCF file and the :class:`~gpdyn.robots.arm.ArmModel` options (None: the file's values)."""

    model: str | None = setting(None, cli=False, none_means="the shipped iiwa 14", help="MJCF file of the arm")
    joints: tuple[str, ...] | None = setting(None, cli=False, none_means="every joint of the file",
                                             help="the arm's joints where the file holds more")
    velocity_limits: tuple[float, ...] | None = setting(None, cli=False, low=0, open_low=True, none_means="none",
                                                        help="joint velocity limits, rad/s")
    payload_body: str | None = setting(None, cli=False, none_means="the body named 'payload', if any",
                                       help="massless body that carries the payload")
    damping: tuple[float, ...] | None = setting(None, cli=False, low=0, none_means="the file's",
                                                help="joint damping, N m s/rad")
    armature: tuple[float, ...] | None = setting(None, cli=False, low=0, none_means="the file's",
                                                 help="rotor armature, kg m^2")
    friction: tuple[float, ...] | None = setting(None, cli=False, low=0, none_means="the file's",
                                                 help="dry joint friction, N m")


@dataclass
class ArmModelSettings:
    """The learned inverse-dynamics model: which learner, from where, its pretraining."""

    # WISKI by default: as the online model's residual it takes one exact rank-one posterior update per control step
    # (gpdyn.gp.wiski.for_control), where an SVDGP's observe only adds bases and its steps cost several periods
    learner: str = setting("wiski", choices=LEARNER_NAMES, metavar="NAME", help="learner of the model")
    from_run: str | None = setting(None, metavar="LEARN_RUN", none_means="none, a learner pretrained here",
                                   help="a `gpdyn learn` run folder on this arm's store (problem arm or kuka): its "
                                        "learner is the model; its store is the default --store")
    scale: str = setting("small", choices=PRESET_NAMES, metavar="PRESET", help="learner sizes, a preset")
    offline: int = setting(3000, low=1, metavar="N", help="samples collected to pretrain on when no --store is given")
    pretrain_iterations: int = setting(100, low=0, metavar="N", help="minibatch steps on the stored data before control")
    pretrain_batch: int = setting(128, low=1, metavar="N", help="rows per pretraining step")

    def validate(self) -> None:
        if self.from_run is not None and not (Path(self.from_run) / "config.json").is_file():
            raise InputError(f"--from-run {self.from_run} is not a run folder of `gpdyn learn`")


@dataclass
class ReferenceSettings:
    """The reference motion the arm tracks and the PD loop around the feed-forward."""

    family: str = setting("kuka1", choices=FAMILY_NAMES, metavar="NAME", help="trajectory family of the reference motion")
    speed: float = setting(1.0, low=0, open_low=True, metavar="FACTOR", help="speed factor of the reference motion")
    rate_hz: float = setting(100.0, low=0, open_low=True, metavar="HZ",
                             help="control rate: a whole number of the model's simulation steps per control step")
    # 30 rad/s (w dt = 0.3 at 100 Hz): against 20, the payload's transient on every development seed is smaller
    # (docs/results/arm-inertia-feedback); the simulated arm has no sensor noise, a real one bounds w by its own
    omega: float = setting(30.0, low=0, open_low=True, metavar="RAD_S",
                           help="feedback bandwidth w, rad/s (the PD acceleration's, or the gains' on the effective inertia)")
    feedback: str = setting("inertia", choices=FEEDBACK, metavar="LAW",
                            help="the feedback around the feed-forward: M(q) (w^2 e + 2 w e') through the "
                                 "controller's inertia model, the plant's for true, the nominal arm's, and the nominal "
                                 "arm's plus the identified load for online (inertia); or per-joint PD gains critically "
                                 "damped on the smallest effective inertia (diagonal)")


@dataclass
class ArmPlantSettings:
    """The plant change at ``change_at``."""

    change: str = setting("payload", choices=CHANGES, metavar="NAME", help="the plant change at --change-at")
    change_at: int = setting(200, low=0, metavar="STEP", help="control step of the plant change, 0 = from the start")
    payload: float = setting(3.0, low=0, metavar="KG", help="--change payload: kg added at the payload body (0: none)")
    joint_friction: float = setting(0.05, low=0, metavar="FRACTION",
                                    help="--change joint-friction: dry friction of this fraction of each joint's "
                                         "torque limit and viscous friction of the same fraction per rad/s")
    motor_gain: float = setting(0.7, low=0, open_low=True, metavar="FACTOR",
                                help="--change motor-gain: the actuators' strength factor")
    joint_spring: float = setting(0.1, low=0, open_low=True, metavar="FRACTION",
                                  help="--change joint-spring: a torsion spring at each joint, its stiffness this "
                                       "fraction of the joint's torque limit per rad, at rest where the arm is at "
                                       "the change")


@dataclass
class ArmAdaptationSettings:
    """How the online controller's model learns from each transition."""

    adapt: str = setting("rigid-body", choices=ADAPT,
                         help="online model: a GP on the arm's rigid-body features and the frozen model (rigid-body); "
                              "an exact GP on the frozen model's residuals (residual); or the learner's own steps")
    gp_online: bool = setting(True, help="rigid-body: the learner keeps learning what the rigid-body term leaves, one "
                                         "observe per control step (off: it stays frozen and the filter alone learns)")
    start_filter: bool = setting(False, help="rigid-body: the filter starts from its posterior on the stored samples "
                                              "the learner was pretrained on: no start transient, but slower after a "
                                              "payload (docs/results/arm-filter-start; off: from its prior, learning "
                                              "~100 parameters from the first control samples)")
    gp_steps: int = setting(0, low=0, metavar="N",
                            help="rigid-body with --gp-online: the learner's optimiser steps per control step (0: "
                                 "observing only; an SVDGP step costs more CPU than the 10 ms period)")
    online_batch: int = setting(64, low=1, metavar="N", help="rows per online step of the learner")
    updates: int = setting(1, low=0, metavar="N", help="steps: learner steps per control step")
    change_bodies: tuple[str, ...] | None = setting(None, metavar="BODY,...", none_means="the arm's payload body",
                                                    help="rigid-body: the bodies whose parameters a detected change "
                                                         "re-opens widely")
    change_terms: tuple[str, ...] | None = setting(None, metavar="TERM,...",
                                                   none_means="their mass and first moment (a compact load)",
                                                   help="rigid-body: which of the change bodies' terms (m, mcx, mcy, mcz, "
                                                        "Ixx, Iyy, Izz, Ixy, Ixz, Iyz) a detected change re-opens widely")
    change_window: int = setting(10, low=0, metavar="N",
                                 help="rigid-body: the change test also sums the innovations of the last N control steps "
                                      "(a persistent error too small for one sample's test; 0: each sample alone)")
    change_friction_std: float = setting(3.0, low=0, metavar="NM",
                                         help="rigid-body: a detected change also re-opens the dry friction of each "
                                              "joint whose torque rose along its motion, with this std (N m; 0: as "
                                              "every other parameter, 0.3)")
    angle_gp_points: int = setting(0, low=0, metavar="N",
                                   help="rigid-body: grid points per joint angle of the GP of the angles in the filter's "
                                        "state (a torque of the configuration the rigid-body class cannot say, e.g. a "
                                        "spring; 0: none; else >= 4)")
    angle_gp_std: float = setting(3.0, low=0, open_low=True, metavar="NM",
                                  help="rigid-body: prior std per joint of the GP of the angles (N m)")
    angle_gp_reset_std: float = setting(1.5, low=0, open_low=True, metavar="NM",
                                        help="rigid-body: a detected change re-opens the GP of the angles along its "
                                             "prior with this std (N m)")
    payload_gains: bool = setting(True, help="rigid-body with one change body: after a detected change, rebuild the "
                                             "PD gains on the load the filter identifies there (off: the gains stay "
                                             "those of the unloaded arm)")
    window: int = setting(400, low=4, metavar="N", help="residual: the most recent samples it conditions on")
    qdd_lengthscale: float = setting(10.0, low=0, open_low=True, metavar="F",
                                     help="residual: factor on the median-trick lengthscales of the accelerations")


@dataclass
class ArmRunConfig:
    """Settings of an arm tracking run; defaults (the iiwa) run in about a minute on 2 cores. Build one from
    settings by name with :meth:`of`."""

    robot: str = setting("kuka", cli=False, recipe=False, choices=("kuka", "arm"),
                         help="the name runs and logs carry: kuka (the shipped iiwa) or arm (any MJCF file)")
    steps: int = setting(400, low=2, metavar="N", help="control steps")
    controllers: tuple[str, ...] = setting(ARM_CONTROLLERS, choices=ARM_CONTROLLERS, metavar="A,B,...",
                                           help="controllers to compare, comma-separated")
    seed: int = setting(0, low=0, high=MAX_SEED, help="the run's seed")
    progress: bool = setting(True, cli=False, recipe=False, help="progress bars on a terminal")
    mjcf: MjcfSettings = field(default_factory=MjcfSettings)
    model: ArmModelSettings = field(default_factory=ArmModelSettings)
    reference: ReferenceSettings = field(default_factory=ReferenceSettings)
    plant: ArmPlantSettings = field(default_factory=ArmPlantSettings)
    adaptation: ArmAdaptationSettings = field(default_factory=ArmAdaptationSettings)
    compute: Compute = field(default_factory=Compute)

    @classmethod
    def of(cls, **values: Any) -> ArmRunConfig:
        """A config with ``values`` (settings by name, e.g. ``payload=1.5``) over the defaults."""
        return build(cls, values, where="ArmRunConfig")

    @property
    def dt(self) -> float:
        return 1.0 / self.reference.rate_hz

    def arm(self) -> ArmModel:
        """The arm this run controls."""
        from gpdyn.robots.arm import ArmModel

        m = self.mjcf
        terms = {"damping": m.damping, "armature": m.armature, "friction": m.friction}
        if m.model is None:
            from gpdyn.robots.kuka import kuka_arm

            return kuka_arm(**terms)
        return ArmModel(m.model, joints=m.joints, velocity_limits=m.velocity_limits, payload_body=m.payload_body,
                        **terms)

    def validate(self) -> None:
        """Raise InputError naming the first bad setting."""
        from gpdyn.device import check_memory

        where = f"control {self.robot}"
        try:
            check(self, where, sections=False)
            for section in (self.model, self.compute):
                section.validate()
        except InputError as err:
            message = str(err)
            raise InputError(message if message.startswith(where) else f"{where}: {message}") from None
        if not 0 <= self.plant.change_at < self.steps:
            raise InputError(f"{where}: need 0 <= --change-at < --steps, got {self.plant.change_at}, {self.steps}")
        if not self.controllers:
            raise InputError(f"{where}: controllers must name at least one")
        if 0 < self.adaptation.angle_gp_points < 4:
            raise InputError(f"{where}: --angle-gp-points must be 0 (none) or >= 4 (cubic interpolation), "
                             f"got {self.adaptation.angle_gp_points}")
        # an episode keeps its rows in memory: refused here rather than by the allocator after pretraining
        check_memory(self.steps * STEP_BYTES, f"{where}: --steps {self.steps}", self.compute.device)

    def resolved_change_bodies(self, arm: ArmModel) -> list[str]:
        """``change_bodies``, or the arm's payload body (where a load attaches) when it is None."""
        if self.adaptation.change_bodies is not None:
            return list(self.adaptation.change_bodies)
        return [arm.payload_body] if arm.payload_body else []

    def check_arm(self, arm: ArmModel) -> None:
        """Raise InputError if ``arm`` cannot run at ``rate_hz`` or the online model cannot be built for it (checked
        before any data is collected)."""
        import mujoco

        from gpdyn.robots.regressor import BODY_TERMS, moving_bodies

        arm.steps_per_sample(self.reference.rate_hz, option=f"control {self.robot}: rate_hz")
        if self.plant.change == "payload" and self.plant.payload > 0:  # the load goes on at change_at, after pretraining
            arm.set_payload(arm.new_model(), self.plant.payload)  # no payload body: refused naming --payload-body
        if "online" not in self.controllers or self.adaptation.adapt != "rigid-body":
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
        odd = [t for t in self.adaptation.change_terms or () if t not in BODY_TERMS]
        if odd or self.adaptation.change_terms == ():
            raise InputError(f"{where}: change_terms must name some of {', '.join(BODY_TERMS)}, got "
                             f"{list(self.adaptation.change_terms or ())}")


__all__ = ["ADAPT", "ARM_CONTROLLERS", "ArmAdaptationSettings", "ArmModelSettings", "ArmPlantSettings", "ArmRunConfig",
           "CHANGES", "FEEDBACK", "MjcfSettings", "ReferenceSettings"]
