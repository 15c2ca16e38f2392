"""`gpdyn control ROBOT`: online control experiments, one subcommand per robot, and `gpdyn control recipes`.

A run's options are its config tree's settings, one option each (:mod:`gpdyn.cli.options`;
:mod:`gpdyn.experiments.legged_config` for a legged task, :mod:`gpdyn.experiments.arm_config`
for an arm). Every run takes :func:`add_run_options` beside them.
A run starts from a recipe (:mod:`gpdyn.recipes`: ``--recipe NAME|FILE.toml``, else the
robot's default); the options given on the command line override the recipe's values.

An option's help states its effective default with ``%(effective)s``: the value of the
robot's default recipe where it sets one, else the default of the robot's run config
(:func:`effective_default`). Both are read from files, the recipe's TOML and the config's
source, when the help is printed: the configs' modules import torch and MuJoCo.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from gpdyn.cli.common import add_device, add_out
from gpdyn.cli.jobs import size_option
from gpdyn.config import LEGGED_TASKS
from gpdyn.errors import InputError


# what `control arm` sets over ArmRunConfig's defaults when no recipe is given (cli_control_arm)
ARM_WITHOUT_RECIPE = {"payload": 0.0}


def run_config(robot: str) -> type:
    """The config tree of ``gpdyn control ROBOT``'s run (light modules: no torch)."""
    if robot in ("kuka", "arm"):
        from gpdyn.experiments.arm_config import ArmRunConfig

        return ArmRunConfig
    from gpdyn.experiments.legged_config import LeggedRunConfig

    return LeggedRunConfig


def effective_default(robot: str, key: str) -> str:
    """What ``gpdyn control ROBOT`` uses for setting ``key`` when no option sets it, as --help says it:
    the robot's default recipe's value (naming the recipe), else its config tree's default."""
    from gpdyn.config import flat, leaves
    from gpdyn.recipes import DEFAULT_RECIPES, read_recipe, show_value

    recipe = DEFAULT_RECIPES.get(robot)
    if key == "recipe":
        return recipe or "none: the run config's defaults, without a payload"
    values = read_recipe(recipe).values["config"] if recipe else {}
    cls = run_config(robot)
    if key in values:
        value, source = values[key], f", from recipe {recipe}"
    elif robot == "arm" and key in ARM_WITHOUT_RECIPE:
        value, source = ARM_WITHOUT_RECIPE[key], ""
    else:
        value, source = flat(cls())[key], ""
    if value is None:
        return f"{leaves(cls)[key].meta['none_means']}{source}"
    return ("on" if value else "off") + source if isinstance(value, bool) else show_value(value) + source


def state_effective_defaults(p: argparse.ArgumentParser, robot: str) -> None:
    """Give each option of ``p`` whose help says ``%(effective)s`` (and has none yet) its robot's effective default."""
    from gpdyn.cli.options import EffectiveDefault

    for action in p._actions:
        if action.help and "%(effective)s" in action.help and not hasattr(action, "effective"):
            action.effective = EffectiveDefault(functools.partial(effective_default, robot), action.dest)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    robots = sub.add_parser("control", help="online control with a learned model").add_subparsers(
        dest="robot", metavar="ROBOT", required=True, help="the robot to control, or recipes to list the settings"
    )
    for task in LEGGED_TASKS:
        add_legged_parser(robots, task)

    from gpdyn.cli import control_arm

    control_arm.add_parsers(robots, add_run_options, effective_default)
    for robot in (*LEGGED_TASKS, "kuka", "arm"):
        state_effective_defaults(robots.choices[robot], robot)
    p = robots.add_parser("recipes", help="the shipped recipes, one line each (NAME --explain: what one runs, what "
                                          "it is for, what it reproduces)")
    p.add_argument("names", nargs="*", metavar="NAME|FILE.toml",
                   help="only these: shipped recipes, or your own TOML files, whose values are then checked in full "
                        "(default: every shipped recipe)")
    p.add_argument("--explain", action="store_true",
                   help="print each recipe's description, use, reported result and every value instead of the "
                        "one-line table")
    p.set_defaults(handler="gpdyn.cli.control:cli_recipes", reads_only=True)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of every control run that are not settings of its config: the recipe, the data, the device, the
    folder."""
    p.add_argument("--recipe", default=None, metavar="NAME|FILE.toml",
                   help="the run's settings: a shipped recipe (`gpdyn control recipes` lists them) or your own TOML "
                        "file; the options below override its values (default %(effective)s)")
    p.add_argument("--store", type=Path, default=None,
                   help="rollouts to pretrain the model on (default: a small collection into the run folder, "
                        "the recipe's store_episodes for a legged robot, offline samples for an arm)")
    add_device(p)
    add_out(p)


def add_legged_parser(robots: argparse._SubParsersAction, task: str) -> None:
    """``gpdyn control TASK`` for a legged task: MPC with learned and true models beside the task's policy. Its
    options are the settings of :class:`~gpdyn.experiments.legged_config.LeggedRunConfig`, one each."""
    from gpdyn.cli.options import add_config_options
    from gpdyn.experiments.legged_config import LeggedRunConfig

    p = robots.add_parser(task, help=f"{task}: MPC with a learned model beside the TRPO policy and the true model")
    add_run_options(p)
    options = add_config_options(p, LeggedRunConfig, functools.partial(effective_default, task), skip=("device",))
    p.add_argument("--learner-option", type=size_option, action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the learner's constructor over its preset and the recipe's, e.g. "
                        "compiled_mean=true (wiski) or shared_kernel=true (svdgp); repeatable (default: none)")
    if task == "walker":  # the walker's spline-sampling recipes run from its command too; added last (they check
        # that no option of the MPC run above was given with them)
        from gpdyn.cli.control_sampling import add_sampling_options

        add_sampling_options(p)
    p.set_defaults(handler="gpdyn.cli.control:cli_control", task=task, config_options=tuple(options))


def check_store_exists(store: Path | None, robot: str) -> None:
    """``--store`` names something that exists: refused before the run folder is made, not after."""
    if store is not None and not Path(store).exists():
        raise InputError(f"control {robot}: --store {store} does not exist")


def recipe_for(args: argparse.Namespace, robot: str):
    """The recipe of a control run: ``--recipe`` (a shipped name or a TOML file), else the robot's default."""
    from gpdyn.recipes import default_recipe, load_recipe

    return load_recipe(args.recipe, robot) if args.recipe is not None else default_recipe(robot)


def cli_control(args: argparse.Namespace) -> int:
    """``gpdyn control walker|hopper``: the online control experiment of a legged task, its run folder and report.

    The recipe and the options (the device among them) are checked before the run folder is
    made or any data collected. config.json records the resolved settings and the recipe.
    """
    from dataclasses import asdict

    from gpdyn.experiments.control_legged import run_legged
    from gpdyn.runs import RunDir

    from gpdyn.cli.control_sampling import is_sampling_recipe, run_sampling_recipe
    from gpdyn.cli.options import apply_config_options

    if args.task == "walker" and args.recipe is not None and is_sampling_recipe(args.recipe):
        return run_sampling_recipe(args.recipe, args)
    recipe = recipe_for(args, args.task)
    cfg = recipe.build(device=args.device)
    given = apply_config_options(cfg, args, args.config_options)
    if args.learner_option:
        cfg.model.learner_options = {**cfg.model.learner_options, **dict(args.learner_option)}
        given["learner_options"] = cfg.model.learner_options
    if "change" in given and "change_factor" not in given:
        cfg.plant.change_factor = None  # a recipe's factor belongs to its change: another change takes its own
    cfg.validate()
    check_store_exists(args.store, args.task)
    run = RunDir.create(f"control-{args.task}", {"robot": args.task, **asdict(cfg), **recipe.record(given)},
                        out=args.out)
    print(f"gpdyn control {args.task}: recipe {recipe.name}, run folder {run.path}")
    result = run_legged(run, cfg, args.store)
    print(f"gpdyn control {args.task}: report {result['report']}")
    return 0


def cli_recipes(args: argparse.Namespace) -> int:
    """``gpdyn control recipes [NAME|FILE.toml ...] [--explain]``: one line per recipe (name, robot, title, main
    settings), or with ``--explain`` each one's description, use, reported result and values.

    Shipped recipes are read from their files alone (the test suite checks their values), so that
    listing them imports neither torch nor MuJoCo; a file of the user's is checked in full.
    """
    from gpdyn.recipes import RUNNERS, describe, is_shipped, load_recipe, read_recipe, recipe_names, recipe_table

    names = args.names or recipe_names()
    recipes = [read_recipe(n) if is_shipped(n) else load_recipe(n) for n in names]
    if args.explain:
        print("\n\n".join(describe(r) for r in recipes))
    else:
        print(recipe_table(recipes))
        print("\n* the robot's default (its command without --recipe). "
              "What a recipe runs and why: gpdyn control recipes NAME --explain")
    print("\nRun one with the command of its robot, options after it overriding the recipe's values: "
          + "; ".join(f"{kind}: {command} --recipe NAME" for kind, command in RUNNERS.items()))
    return 0
