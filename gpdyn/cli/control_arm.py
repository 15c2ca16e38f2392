"""`gpdyn control kuka|arm`: computed-torque tracking of the iiwa, or of any arm given as an MJCF file.

:func:`add_parsers` adds both subcommands to ``gpdyn control``; the options every control
run takes come from the caller's ``add_common``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from gpdyn.cli.collect import FAMILY_NAMES, add_arm_options
from gpdyn.cli.common import NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE

# the options copied onto ArmRunConfig when given
ARM_OPTIONS = ("learner", "seed", "steps", "change_at", "change", "payload", "joint_friction", "motor_gain", "gp_online",
               "gp_steps", "controllers", "scale", "adapt", "dtype", "pretrain_iterations",
               "family", "speed", "from_run", "joints", "velocity_limits", "payload_body", "damping", "armature", "friction")


def add_parsers(robots: argparse._SubParsersAction, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    for robot, text in (("kuka", "KUKA iiwa: computed-torque tracking with learned inverse dynamics"),
                        ("arm", "any arm from an MJCF file: computed-torque tracking with learned inverse dynamics")):
        p = robots.add_parser(robot, help=text)
        add_common(p)
        add_arm_options(p, robot)
        p.add_argument("--payload", type=NON_NEGATIVE, default=None,
                       help="payload in kg added at --change-at (default %(effective)s)")
        # checked by ArmRunConfig.validate against control_arm.CHANGES (imported there with torch and MuJoCo)
        p.add_argument("--change", default=None, metavar="NAME",
                       help="the plant change at --change-at: payload, joint-friction or motor-gain "
                            "(default %(effective)s)")
        p.add_argument("--joint-friction", type=NON_NEGATIVE, default=None, metavar="FRACTION",
                       help="--change joint-friction: dry friction of this fraction of each joint's torque limit and "
                            "viscous friction of the same fraction per rad/s (default %(effective)s)")
        p.add_argument("--motor-gain", type=POSITIVE, default=None, metavar="FACTOR",
                       help="--change motor-gain: the actuators' strength factor (default %(effective)s)")
        p.add_argument("--gp-online", choices=("on", "off"), default=None,
                       help="--adapt rigid-body: the learner keeps learning what the rigid-body term leaves, one "
                            "observe per control step (on), or stays frozen and the rigid-body filter alone learns "
                            "(off; default %(effective)s)")
        p.add_argument("--gp-steps", type=NON_NEGATIVE_INT, default=None, metavar="N",
                       help="--adapt rigid-body with --gp-online on: the learner's optimiser steps per control step "
                            "(default %(effective)s, observing only: an SVDGP step costs more CPU than the 10 ms "
                            "control period, docs/control.md)")
        p.add_argument("--from-run", type=Path, default=None,
                       help="a `gpdyn learn` run folder on this arm's store (problem arm or kuka): its learner is "
                            "the model instead of one pretrained here; its store is the default --store (default: "
                            "none, a learner pretrained here)")
        p.add_argument("--family", choices=FAMILY_NAMES, default=None, metavar="NAME",
                       help="trajectory family of the reference motion: %(choices)s (default %(effective)s)")
        p.add_argument("--speed", type=POSITIVE, default=None, metavar="FACTOR",
                       help="speed factor of the reference motion (default %(effective)s)")
        p.set_defaults(handler="gpdyn.cli.control_arm:cli_control_arm")


def cli_control_arm(args: argparse.Namespace) -> int:
    """``gpdyn control kuka|arm``: the tracking run, its run folder and report.

    The options, the arm's MJCF file and the arm that ``--store`` or the ``--from-run`` learner records are checked
    before the run folder is made or any data collected.
    """
    from dataclasses import asdict

    from gpdyn.cli.control import check_store_exists, copy_options, recipe_for
    from gpdyn.experiments.control_arm import ArmRunConfig, run_arm
    from gpdyn.runs import RunDir

    # kuka runs from a recipe (its default: kuka-payload); another arm has none unless given one
    recipe = recipe_for(args, "kuka") if args.robot == "kuka" or args.recipe is not None else None
    cfg = recipe.build(robot=args.robot, device=args.device) if recipe else ArmRunConfig(robot=args.robot,
                                                                                          device=args.device)
    if args.robot == "arm":
        cfg.model = str(args.model)
        if recipe is None:
            cfg.payload = 0.0
    if args.gp_online is not None:
        args.gp_online = args.gp_online == "on"
    given = copy_options(cfg, args, ARM_OPTIONS)
    if cfg.from_run is not None:
        cfg.from_run = str(cfg.from_run)
        if "learner" not in given:  # the learner is the run's, not the recipe's
            learner = _run_learner(cfg.from_run)
            cfg.learner = learner if learner is not None else cfg.learner
    derived = {}
    if args.steps is not None and args.change_at is None:  # the payload halfway through the run asked for
        cfg.change_at = derived["change_at"] = cfg.steps // 2
    cfg.validate()
    check_store_exists(args.store, args.robot)
    arm = cfg.arm()
    cfg.check_arm(arm)
    cfg.check_sources(arm, args.store)  # a store or learner of another arm: refused before the run folder exists
    record = recipe.record(given) if recipe else {"recipe": None, "options_given": given}
    record["options_derived"] = derived
    run = RunDir.create(f"control-{args.robot}", {**asdict(cfg), "model_sha256": arm.sha256, **record}, out=args.out)
    print(f"gpdyn control {args.robot}: {arm.path.name} ({arm.n} joints)"
          + (f", recipe {recipe.name}" if recipe else "") + f", run folder {run.path}")
    result = run_arm(run, cfg, args.store)
    print(f"gpdyn control {args.robot}: report {result['report']}")
    return 0


def _run_learner(run_dir: str) -> str | None:
    """The learner a ``gpdyn learn`` run folder holds, from its config (None when it says none)."""
    from gpdyn.runs import RunDir

    if not (Path(run_dir) / "config.json").is_file():
        return None  # ArmRunConfig.validate names the missing run folder
    learner = RunDir(Path(run_dir)).config().get("learner")
    return learner if isinstance(learner, str) else None


__all__ = ["ARM_OPTIONS", "add_parsers", "cli_control_arm"]
