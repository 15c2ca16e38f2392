"""`gpdyn control kuka|arm`: computed-torque tracking of the iiwa, or of any arm given as an MJCF file.

:func:`add_parsers` adds both subcommands to ``gpdyn control``. Their options are the settings of the
config tree :class:`~gpdyn.experiments.arm_config.ArmRunConfig`, one each (:mod:`gpdyn.cli.options`),
beside those of every run (``add_run_options``) and the options that pick the arm, which the
collectors share (:func:`gpdyn.cli.collect.add_arm_options`).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path

from gpdyn.cli.collect import add_arm_options

# the options of add_arm_options, copied into the config's mjcf section when given
MJCF_OPTIONS = ("joints", "velocity_limits", "payload_body", "damping", "armature", "friction")


def add_parsers(robots: argparse._SubParsersAction, add_run_options: Callable[[argparse.ArgumentParser], None],
                effective: Callable[[str, str], str]) -> None:
    from gpdyn.cli.options import add_config_options
    from gpdyn.experiments.arm_config import ArmRunConfig

    for robot, text in (("kuka", "KUKA iiwa: computed-torque tracking with learned inverse dynamics"),
                        ("arm", "any arm from an MJCF file: computed-torque tracking with learned inverse dynamics")):
        p = robots.add_parser(robot, help=text)
        add_run_options(p)
        add_arm_options(p, robot)
        options = add_config_options(p, ArmRunConfig, functools.partial(effective, robot), skip=("device",))
        p.set_defaults(handler="gpdyn.cli.control_arm:cli_control_arm", config_options=tuple(options))


def cli_control_arm(args: argparse.Namespace) -> int:
    """``gpdyn control kuka|arm``: the tracking run, its run folder and report.

    The options, the arm's MJCF file and the arm that ``--store`` or the ``--from-run`` learner records are checked
    before the run folder is made or any data collected.
    """
    from dataclasses import asdict

    from gpdyn.cli.control import check_store_exists, recipe_for
    from gpdyn.cli.options import apply_config_options
    from gpdyn.experiments.arm_config import ArmRunConfig
    from gpdyn.experiments.control_arm import check_sources, run_arm
    from gpdyn.runs import RunDir

    # kuka runs from a recipe (its default: kuka-payload); another arm has none unless given one
    recipe = recipe_for(args, "kuka") if args.robot == "kuka" or args.recipe is not None else None
    cfg = (recipe.build(robot=args.robot, device=args.device) if recipe
           else ArmRunConfig.of(robot=args.robot, device=args.device))
    if args.robot == "arm":
        cfg.mjcf.model = str(args.model)
        if recipe is None:
            cfg.plant.payload = 0.0
    given = apply_config_options(cfg, args, args.config_options)
    for name in MJCF_OPTIONS:
        value = getattr(args, name, None)
        if value is not None:
            setattr(cfg.mjcf, name, tuple(value) if isinstance(value, list) else value)
            given[name] = value
    if cfg.model.from_run is not None:
        cfg.model.from_run = str(cfg.model.from_run)
        if "learner" not in given:  # the learner is the run's, not the recipe's
            learner = _run_learner(cfg.model.from_run)
            cfg.model.learner = learner if learner is not None else cfg.model.learner
    derived = {}
    if args.steps is not None and args.change_at is None:  # the payload halfway through the run asked for
        cfg.plant.change_at = derived["change_at"] = cfg.steps // 2
    cfg.validate()
    check_store_exists(args.store, args.robot)
    arm = cfg.arm()
    cfg.check_arm(arm)
    check_sources(cfg, arm, args.store)  # a store or learner of another arm: refused before the run folder exists
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


__all__ = ["MJCF_OPTIONS", "add_parsers", "cli_control_arm"]
