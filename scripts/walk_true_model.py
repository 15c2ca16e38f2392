"""Walker2d walking by predictive sampling on the true model, one episode per seed.

    .venv/bin/python scripts/walk_true_model.py --seeds 100,101,102,103,104 --steps 1000 --out logs/walk-true

The sampler, the walking cost, the seeds and the steps come from a ``walker-sampling``
recipe (``--recipe``, default ``walker-true-model-walk``: gpdyn/recipes/); the options
given here override its values. Writes the run folder's report.md (steps, distance,
speed, return, planner CPU ms per control step) and recipe.json (the recipe and the options
that overrode it), and prints the table; see
gpdyn/experiments/walk_true_model.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from gpdyn.cli.logs import configure as configure_logs
from gpdyn.device import set_threads
from gpdyn.errors import InputError
from gpdyn.experiments.walk_true_model import run
from gpdyn.recipes import load_recipe

RECIPE = "walker-true-model-walk"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default=RECIPE, help=f"a walker-sampling recipe, name or TOML file (default {RECIPE})")
    p.add_argument("--seeds", default=None, help="comma-separated episode seeds (default: the recipe's)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--samples", type=int, default=None)
    p.add_argument("--horizon", type=int, default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    configure_logs(logging.INFO, "walk_true_model.py")  # gpdyn's messages and progress lines on stderr, as the command
    set_threads(1)
    try:
        recipe = load_recipe(args.recipe, "walker-sampling")
        sampler, cost, episodes = recipe.build("sampler"), recipe.build("cost"), recipe.build("run")
        given = {k: v for k, v in (("samples", args.samples), ("horizon", args.horizon)) if v is not None}
        sampler = dataclasses.replace(sampler, **given)
        seeds = list(episodes.seeds) if args.seeds is None else [int(s) for s in args.seeds.split(",") if s.strip()]
        steps = episodes.steps if args.steps is None else args.steps
        print(f"walk_true_model: recipe {recipe.name}")
        folder = run(seeds, steps, sampler, cost, out=args.out)
        recipe.write_summary(folder, vars(args))
    except (InputError, ValueError) as err:
        print(f"walk_true_model: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
