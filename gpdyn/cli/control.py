"""`gpdyn control ROBOT`: online control experiments, one subcommand per robot, and `gpdyn control recipes`.

Options every robot's run takes are added by :func:`add_common`; each robot adds its own.
A run starts from a recipe (:mod:`gpdyn.recipes`: ``--recipe NAME|FILE.toml``, else the
robot's default); the options given on the command line override the recipe's values.

An option's help states its effective default with ``%(effective)s``: the value of the
robot's default recipe where it sets one, else the default of the robot's run config
(:func:`effective_default`). Both are read from files, the recipe's TOML and the config's
source, when the help is printed: the configs' modules import torch and MuJoCo.
"""

from __future__ import annotations

import argparse
import ast
import functools
from pathlib import Path
from typing import Any

from gpdyn.cli.common import (COUNT, DTYPE_NAMES, FRACTION, LEARNER_NAMES, NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE,
                              PRESET_NAMES, SEED, Number, add_device, add_out)
from gpdyn.cli.jobs import size_option
from gpdyn.config import LEGGED_TASKS
from gpdyn.errors import InputError


SAMPLES = Number(int, 2)  # a sampling planner compares at least two sequences

# the run config each robot's command builds: its source file (under gpdyn/) and class
RUN_CONFIGS = {"walker": ("experiments/control_legged.py", "LeggedRunConfig"),
               "hopper": ("experiments/control_legged.py", "LeggedRunConfig"),
               "kuka": ("experiments/control_arm.py", "ArmRunConfig"),
               "arm": ("experiments/control_arm.py", "ArmRunConfig")}
# what `control arm` sets over ArmRunConfig's defaults when no recipe is given (cli_control_arm)
ARM_WITHOUT_RECIPE = {"payload": 0.0}
# how --help words a default of None: what the run does then
NONE_MEANS = {"dtype": "the device's: float64 on the CPU, float32 on CUDA",
              "change_factor": "the change's own: torso mass x1.3, foot friction x0.5, motor x0.5"}


@functools.cache
def config_defaults(source: str, class_name: str) -> dict[str, Any]:
    """The defaults of the dataclass ``class_name`` in ``gpdyn/<source>`` that are literals or module-level
    literal constants, read from the source without importing it. Other defaults (``field(...)``, calls)
    are left out; tests/test_cli_help.py checks what --help states against the dataclasses themselves."""
    tree = ast.parse((Path(__file__).resolve().parents[1] / source).read_text())
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    defaults = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            if isinstance(node.value, ast.Name) and node.value.id in constants:
                defaults[node.target.id] = constants[node.value.id]
                continue
            try:
                defaults[node.target.id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return defaults


def effective_default(robot: str, key: str) -> str:
    """What ``gpdyn control ROBOT`` uses for config field ``key`` when no option sets it, as --help says it:
    the robot's default recipe's value (naming the recipe), else its run config's default."""
    from gpdyn.recipes import DEFAULT_RECIPES, read_recipe, show_value

    recipe = DEFAULT_RECIPES.get(robot)
    if key == "recipe":
        return recipe or "none: the run config's defaults, without a payload"
    values = read_recipe(recipe).values["config"] if recipe else {}
    if key in values:
        value, source = values[key], f", from recipe {recipe}"
    elif robot == "arm" and key in ARM_WITHOUT_RECIPE:
        value, source = ARM_WITHOUT_RECIPE[key], ""
    else:
        value, source = config_defaults(*RUN_CONFIGS[robot])[key], ""
    if value is None:
        return NONE_MEANS[key] + source
    return ("on" if value else "off") + source if isinstance(value, bool) else show_value(value) + source


class EffectiveDefault:
    """An option's ``%(effective)s`` in its help: :func:`effective_default`, worked out when the help is printed."""

    def __init__(self, robot: str, key: str) -> None:
        self.robot, self.key = robot, key

    def __str__(self) -> str:
        return effective_default(self.robot, self.key)


def state_effective_defaults(p: argparse.ArgumentParser, robot: str) -> None:
    """Give each option of ``p`` whose help says ``%(effective)s`` its robot's effective default."""
    for action in p._actions:
        if action.help and "%(effective)s" in action.help:
            action.effective = EffectiveDefault(robot, action.dest)


def add_common(p: argparse.ArgumentParser) -> None:
    """The options of every control run: the recipe, the learner, its data, the run's length and seed, the controllers."""
    p.add_argument("--recipe", default=None, metavar="NAME|FILE.toml",
                   help="the run's settings: a shipped recipe (`gpdyn control recipes` lists them) or your own TOML "
                        "file; the options below override its values (default %(effective)s)")
    p.add_argument("--learner", choices=LEARNER_NAMES, default=None, metavar="NAME",
                   help="learner of the model: %(choices)s (default %(effective)s)")
    p.add_argument("--store", type=Path, default=None,
                   help="rollouts to pretrain the model on (default: a small collection into the run folder, "
                        "the recipe's store_episodes for a legged robot, offline samples for an arm)")
    p.add_argument("--steps", type=COUNT, default=None, metavar="N",
                   help="control steps per episode (default %(effective)s)")
    p.add_argument("--seed", type=SEED, default=None, help="the run's seed (default %(effective)s)")
    p.add_argument("--change-at", type=NON_NEGATIVE_INT, default=None, metavar="STEP",
                   help="step of the plant change, 0 = from the start (default %(effective)s)")
    p.add_argument("--controllers", default=None, metavar="A,B,...",
                   help="comma-separated controllers to compare (default %(effective)s)")
    p.add_argument("--scale", choices=PRESET_NAMES, default=None, metavar="PRESET",
                   help="learner sizes, a preset of %(choices)s (default %(effective)s)")
    p.add_argument("--pretrain-iterations", type=NON_NEGATIVE_INT, default=None, metavar="N",
                   help="minibatch steps on the stored data before control (default %(effective)s)")
    p.add_argument("--adapt", choices=("rigid-body", "residual", "steps"), default=None,
                   help="online model: a GP on the arm's rigid-body features and the frozen model (rigid-body, "
                        "kuka and arm only); an exact GP on the frozen model's residuals (residual); or the "
                        "learner's own steps (default %(effective)s)")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default=None, metavar="DTYPE",
                   help="%(choices)s (default %(effective)s)")
    add_device(p)
    add_out(p)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    robots = sub.add_parser("control", help="online control with a learned model").add_subparsers(
        dest="robot", metavar="ROBOT", required=True, help="the robot to control, or recipes to list the settings"
    )
    for task in LEGGED_TASKS:
        add_legged_parser(robots, task)

    from gpdyn.cli import control_arm

    control_arm.add_parsers(robots, add_common)
    for robot in RUN_CONFIGS:
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


def add_legged_parser(robots: argparse._SubParsersAction, task: str) -> None:
    """``gpdyn control TASK`` for a legged task: MPC with learned and true models beside the task's policy."""
    p = robots.add_parser(task, help=f"{task}: MPC with a learned model beside the TRPO policy and the true model")
    add_common(p)
    p.add_argument("--episodes", type=COUNT, default=None, metavar="N",
                   help="consecutive episodes per controller and condition; the online model is kept across "
                        "them, the frozen one stays as pretrained (default %(effective)s)")
    p.add_argument("--planner", choices=("mppi", "cem"), default=None, help="MPC planner (default %(effective)s)")
    p.add_argument("--cost", choices=("reward", "track"), default=None,
                   help="what the planner minimises, minus the task's reward (reward) or the distance of the "
                        "predicted next velocities to those of the nominal plant under the TRPO policy (track: "
                        "policy transfer; default %(effective)s)")
    p.add_argument("--track-offset-weight", type=NON_NEGATIVE, default=None, metavar="W",
                   help="--cost track: price of an action offset to the policy, (rad/s)^2 per unit^2 "
                        "(default %(effective)s)")
    p.add_argument("--samples", type=SAMPLES, default=None, metavar="K",
                   help="K sampled sequences (default %(effective)s; paper 1000)")
    p.add_argument("--sim-samples", type=SAMPLES, default=None, metavar="K",
                   help="K for the true-simulator MPC (default %(effective)s)")
    p.add_argument("--horizon", type=COUNT, default=None, metavar="H",
                   help="H steps (default %(effective)s; paper 30)")
    p.add_argument("--noise-std", type=POSITIVE, default=None, metavar="STD",
                   help="sampling noise, action units (default %(effective)s)")
    p.add_argument("--temperature", type=POSITIVE, default=None,
                   help="MPPI temperature, reward units: the larger, the more samples the plan averages "
                        "(default %(effective)s)")
    p.add_argument("--control-cost", type=FRACTION, default=None, metavar="WEIGHT",
                   help="weight in [0, 1] on MPPI's control cost lambda u'Sigma^-1 eps: 1 keeps the plan a "
                        "KL-regularised improvement of the TRPO proposal instead of drifting from it "
                        "(default %(effective)s)")
    p.add_argument("--relative-to-proposal", action=argparse.BooleanOptionalAction, default=None,
                   help="plan offsets to the TRPO policy's closed-loop actions, the zero offset being the policy "
                        "(default %(effective)s)")
    p.add_argument("--proposal-tail", type=NON_NEGATIVE_INT, default=None, metavar="N",
                   help="steps the TRPO policy alone runs through the model after the horizon, before the "
                        "terminal value (default %(effective)s)")
    p.add_argument("--cold-start", dest="warm_start", action="store_const", const=False, default=None,
                   help="every plan starts afresh from the policy (zero offsets with --relative-to-proposal) "
                        "instead of the previous plan shifted; the weights then rest on the model's costs alone "
                        "(warm start by default: %(effective)s)")
    p.add_argument("--warm-start", dest="warm_start", action="store_const", const=True, default=None,
                   help="start each plan from the previous one shifted, undoing a recipe's cold start "
                        "(warm start by default: %(effective)s)")
    p.add_argument("--compiled-planner", action=argparse.BooleanOptionalAction, default=None,
                   help="run the task's cost and the TRPO proposal as compiled programs (needs a C++ compiler; "
                        "about 2 ms less per K = 1000, H = 30 plan; default %(effective)s)")
    p.add_argument("--uncertainty", choices=("mean", "penalty", "sample"), default=None,
                   help="use of the predictive variance: none (mean), a cost on it (penalty) or sampled "
                        "predictions (sample; default %(effective)s)")
    p.add_argument("--var-weight", type=NON_NEGATIVE, default=None, metavar="W",
                   help="weight of the variance penalty (default %(effective)s)")
    p.add_argument("--terminal-value", action=argparse.BooleanOptionalAction, default=None,
                   help="the TRPO critic's value of each sample's last state joins its cost (default %(effective)s)")
    p.add_argument("--target", choices=("change", "velocity"), default=None,
                   help="what the learner predicts, the velocity change over the step (change) or the next "
                        "velocity (velocity; default %(effective)s)")
    p.add_argument("--change", choices=("torso_mass", "foot_friction", "weak_motor", "joint_spring"), default=None,
                   help="plant change (default %(effective)s)")
    p.add_argument("--change-factor", type=POSITIVE, default=None, metavar="FACTOR",
                   help="scale of the plant change (default %(effective)s; with another --change, that change's "
                        "own: torso mass x1.3, foot friction x0.5, motor x0.5)")
    p.add_argument("--conditions", default=None, metavar="A,B",
                   help="comma-separated plants to run on, of nominal,changed (default %(effective)s)")
    p.add_argument("--residual-gate", action=argparse.BooleanOptionalAction, default=None,
                   help="--adapt residual: add the residual GP to an output's prediction only while it has "
                        "predicted that output better than the frozen model, by prequential errors "
                        "(default %(effective)s)")
    p.add_argument("--residual-gate-z", type=NON_NEGATIVE, default=None, metavar="Z",
                   help="with --residual-gate: the residual goes in only once its average improvement is "
                        "this many standard errors above zero, 0 being the plain comparison (default %(effective)s)")
    p.add_argument("--residual-forget", type=Number(float, 0, 1, open_low=True), default=None, metavar="FORGET",
                   help="--residual-kernel linear: weight forget**k on a transition k steps old, 1 weighing all "
                        "alike (default %(effective)s)")
    p.add_argument("--residual-kernel", choices=("se", "linear"), default=None,
                   help="--adapt residual: the residual GP's kernel, SE over all inputs (se) or linear over the "
                        "action alone, a bias plus a gain per action: how the plant answers the action (linear; "
                        "default %(effective)s)")
    p.add_argument("--video", action="store_true", default=None,
                   help="MP4 of the online episode on the changed plant (default %(effective)s)")
    p.add_argument("--learner-option", type=size_option, action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the learner's constructor over its preset and the recipe's, e.g. "
                        "compiled_mean=true (wiski) or shared_kernel=true (svdgp); repeatable (default: none)")
    p.set_defaults(handler="gpdyn.cli.control:cli_control", task=task)


# the legged tasks' options copied onto LeggedRunConfig when given
LEGGED_OPTIONS = ("learner", "seed", "steps", "planner", "cost", "samples", "sim_samples", "horizon", "noise_std", "temperature", "episodes",
                  "control_cost", "track_offset_weight", "residual_gate", "residual_gate_z", "residual_kernel",
                  "residual_forget", "uncertainty", "var_weight", "terminal_value", "relative_to_proposal",
                  "proposal_tail", "warm_start", "compiled_planner", "target", "change", "change_factor", "change_at", "controllers",
                  "conditions", "scale", "adapt", "dtype", "video", "pretrain_iterations")


def copy_options(cfg: Any, args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    """Copy the command-line options that were given onto ``cfg`` (comma lists become tuples); returns them."""
    given = {}
    for name in names:
        value = getattr(args, name, None)
        if value is None:
            continue
        if name in ("controllers", "conditions"):
            value = tuple(v.strip() for v in value.split(",") if v.strip())
        setattr(cfg, name, value)
        given[name] = str(value) if isinstance(value, Path) else value
    return given


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

    recipe = recipe_for(args, args.task)
    cfg = recipe.build(device=args.device)
    given = copy_options(cfg, args, LEGGED_OPTIONS)
    if args.learner_option:
        cfg.learner_options = {**cfg.learner_options, **dict(args.learner_option)}
        given["learner_options"] = cfg.learner_options
    if "change" in given and "change_factor" not in given:
        cfg.change_factor = None  # a recipe's factor belongs to its change: another change takes its own
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
