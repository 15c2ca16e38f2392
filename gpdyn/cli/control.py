"""`gpdyn control ROBOT`: online control experiments, one subcommand per robot, and `gpdyn control recipes`.

Options every robot's run takes are added by :func:`add_common`; each robot adds its own.
A run starts from a recipe (:mod:`gpdyn.recipes`: ``--recipe NAME|FILE.toml``, else the
robot's default); the options given on the command line override the recipe's values.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpdyn.cli.common import (COUNT, DTYPE_NAMES, FRACTION, NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE, PRESET_NAMES, SEED,
                              Number, add_device, add_learner, add_out)
from gpdyn.cli.jobs import size_option


SAMPLES = Number(int, 2)  # a sampling planner compares at least two sequences


def add_common(p: argparse.ArgumentParser) -> None:
    """The options of every control run: the recipe, the learner, its data, the run's length and seed, the controllers."""
    p.add_argument("--recipe", default=None, metavar="NAME|FILE.toml",
                   help="the run's settings: a shipped recipe (`gpdyn control recipes` lists them) or your own TOML "
                        "file; the options below override its values (default: the robot's default recipe)")
    add_learner(p, required=False)
    p.add_argument("--store", type=Path, default=None, help="rollouts to pretrain the model on (default: collect a few)")
    p.add_argument("--steps", type=COUNT, default=None, help="control steps per episode")
    p.add_argument("--seed", type=SEED, default=None, help="the run's seed (default: the recipe's, else 0)")
    p.add_argument("--change-at", type=NON_NEGATIVE_INT, default=None, help="step of the plant change (walker: 0 = from the start)")
    p.add_argument("--controllers", default=None, help="comma-separated (walker: trpo,true,frozen,online; kuka: pd,true,frozen,online)")
    p.add_argument("--scale", choices=PRESET_NAMES, default=None, metavar="PRESET",
                   help="learner sizes, a preset of %(choices)s (default small)")
    p.add_argument("--pretrain-iterations", type=NON_NEGATIVE_INT, default=None,
                   help="minibatch steps on the stored data before control (default 100)")
    p.add_argument("--adapt", choices=("rigid-body", "residual", "steps"), default=None,
                   help="online model: kuka/arm only, a GP on the arm's rigid-body features and the frozen model "
                        "(rigid-body, their default); an exact GP on the frozen model's residuals (residual, the "
                        "walker's default); or the learner's own steps")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default=None, metavar="DTYPE", help="%(choices)s (default float64)")
    add_device(p)
    add_out(p)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    robots = sub.add_parser("control", help="online control with a learned model").add_subparsers(
        dest="robot", metavar="ROBOT", required=True
    )
    p = robots.add_parser("walker", help="Walker2d: MPC with a learned model beside the TRPO policy and the true model")
    add_common(p)
    p.add_argument("--episodes", type=COUNT, default=None,
                   help="consecutive episodes per controller and condition (default 1); the online model is "
                        "kept across them, the frozen one stays as pretrained")
    p.add_argument("--planner", choices=("mppi", "cem"), default=None, help="MPC planner (default mppi)")
    p.add_argument("--cost", choices=("reward", "track"), default=None,
                   help="what the planner minimises, minus the Walker2d reward (default) or the distance of the "
                        "predicted next velocities to those of the nominal plant under the TRPO policy (policy transfer)")
    p.add_argument("--track-offset-weight", type=NON_NEGATIVE, default=None,
                   help="--cost track: price of an action offset to the policy, (rad/s)^2 per unit^2 (default 10)")
    p.add_argument("--samples", type=SAMPLES, default=None, help="K sampled sequences (default 64; paper 1000)")
    p.add_argument("--sim-samples", type=SAMPLES, default=None, help="K for the true-simulator MPC (default 32)")
    p.add_argument("--horizon", type=COUNT, default=None, help="H steps (default 10; paper 30)")
    p.add_argument("--noise-std", type=POSITIVE, default=None, help="sampling noise, action units (default 0.2)")
    p.add_argument("--temperature", type=POSITIVE, default=None,
                   help="MPPI temperature, reward units (default 0.5): the larger, the more samples the plan averages")
    p.add_argument("--control-cost", type=FRACTION, default=None,
                   help="weight in [0, 1] on MPPI's control cost lambda u'Sigma^-1 eps (default 0): 1 keeps the "
                        "plan a KL-regularised improvement of the TRPO proposal instead of drifting from it")
    p.add_argument("--relative-to-proposal", action=argparse.BooleanOptionalAction, default=None,
                   help="plan offsets to the TRPO policy's closed-loop actions (the zero offset is the policy)")
    p.add_argument("--proposal-tail", type=NON_NEGATIVE_INT, default=None,
                   help="steps the TRPO policy alone runs through the model after the horizon, before the "
                        "terminal value (default 0)")
    p.add_argument("--cold-start", dest="warm_start", action="store_const", const=False, default=None,
                   help="every plan starts afresh from the policy (zero offsets with --relative-to-proposal) "
                        "instead of the previous plan shifted; the weights then rest on the model's costs alone")
    p.add_argument("--warm-start", dest="warm_start", action="store_const", const=True, default=None,
                   help="start each plan from the previous one shifted (undoes a recipe's cold start)")
    p.add_argument("--compiled-planner", action=argparse.BooleanOptionalAction, default=None,
                   help="run the walker cost and the TRPO proposal as compiled programs (needs a C++ compiler; "
                        "about 2 ms less per K = 1000, H = 30 plan)")
    p.add_argument("--uncertainty", choices=("mean", "penalty", "sample"), default=None, help="use of the predictive variance")
    p.add_argument("--var-weight", type=NON_NEGATIVE, default=None, help="weight of the variance penalty")
    p.add_argument("--terminal-value", action=argparse.BooleanOptionalAction, default=None,
                   help="the TRPO critic's value of each sample's last state joins its cost")
    p.add_argument("--target", choices=("change", "velocity"), default=None,
                   help="what the learner predicts, the velocity change over the step (default) or the next velocity")
    p.add_argument("--change", choices=("torso_mass", "foot_friction", "weak_motor"), default=None, help="plant change")
    p.add_argument("--change-factor", type=POSITIVE, default=None,
                   help="scale of the plant change (default: the recipe's when --change is not given, else the "
                        "change's own: torso mass x1.3, foot friction x0.5, motor x0.5)")
    p.add_argument("--conditions", default=None, help="comma-separated nominal,changed")
    p.add_argument("--residual-gate", action=argparse.BooleanOptionalAction, default=None,
                   help="--adapt residual: add the residual GP to an output's prediction only while it has "
                        "predicted that output better than the frozen model (prequential errors)")
    p.add_argument("--residual-gate-z", type=NON_NEGATIVE, default=None,
                   help="with --residual-gate: the residual goes in only once its average improvement is "
                        "this many standard errors above zero (default 0: the plain comparison)")
    p.add_argument("--residual-forget", type=Number(float, 0, 1, open_low=True), default=None,
                   help="--residual-kernel linear: weight forget**k on a transition k steps old (default 1: none)")
    p.add_argument("--residual-kernel", choices=("se", "linear"), default=None,
                   help="--adapt residual: the residual GP's kernel, SE over all inputs (default) or linear "
                        "over the action alone (a bias plus a gain per action: how the plant answers the action)")
    p.add_argument("--video", action="store_true", default=None, help="MP4 of the online episode on the changed plant")
    p.add_argument("--learner-option", type=size_option, action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the learner's constructor over its preset and the recipe's, e.g. "
                        "compiled_mean=true (wiski) or shared_kernel=true (svdgp); repeatable")
    p.set_defaults(handler="gpdyn.cli.control:cli_control")

    from gpdyn.cli import control_arm

    control_arm.add_parsers(robots, add_common)
    p = robots.add_parser("recipes", help="the shipped recipes: what each runs, what it is for, what it reproduces")
    p.add_argument("names", nargs="*", metavar="NAME|FILE.toml", help="only these (default: every shipped recipe)")
    p.set_defaults(handler="gpdyn.cli.control:cli_recipes")


# the walker options copied onto WalkerRunConfig when given
WALKER_OPTIONS = ("learner", "seed", "steps", "planner", "cost", "samples", "sim_samples", "horizon", "noise_std", "temperature", "episodes",
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


def recipe_for(args: argparse.Namespace, robot: str):
    """The recipe of a control run: ``--recipe`` (a shipped name or a TOML file), else the robot's default."""
    from gpdyn.recipes import default_recipe, load_recipe

    return load_recipe(args.recipe, robot) if args.recipe is not None else default_recipe(robot)


def cli_control(args: argparse.Namespace) -> int:
    """``gpdyn control walker``: the online control experiment, its run folder and report.

    The recipe and the options (the device among them) are checked before the run folder is
    made or any data collected. config.json records the resolved settings and the recipe.
    """
    from dataclasses import asdict

    from gpdyn.experiments.control_walker import run_walker
    from gpdyn.runs import RunDir

    recipe = recipe_for(args, "walker")
    cfg = recipe.build(device=args.device)
    given = copy_options(cfg, args, WALKER_OPTIONS)
    if args.learner_option:
        cfg.learner_options = {**cfg.learner_options, **dict(args.learner_option)}
        given["learner_options"] = cfg.learner_options
    if "change" in given and "change_factor" not in given:
        cfg.change_factor = None  # a recipe's factor belongs to its change: another change takes its own
    cfg.validate()
    run = RunDir.create("control-walker", {"robot": "walker", **asdict(cfg), **recipe.record(given)},
                        out=args.out)
    print(f"gpdyn control walker: recipe {recipe.name}, run folder {run.path}")
    result = run_walker(run, cfg, args.store)
    print(f"gpdyn control walker: report {result['report']}")
    return 0


def cli_recipes(args: argparse.Namespace) -> int:
    """``gpdyn control recipes``: each recipe's name, robot, description, use, reported result and values."""
    from gpdyn.recipes import RUNNERS, all_recipes, describe, load_recipe

    recipes = [load_recipe(n) for n in args.names] if args.names else all_recipes()
    print("\n\n".join(describe(r) for r in recipes))
    print("\nRun one with the command of its robot, options after it overriding the recipe's values: "
          + "; ".join(f"{kind}: {command} --recipe NAME" for kind, command in RUNNERS.items()))
    return 0
