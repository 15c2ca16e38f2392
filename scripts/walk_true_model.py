"""Walker2d walking by predictive sampling on the true model: the ``walker-sampling`` recipes, as `gpdyn control walker` runs them.

    .venv/bin/gpdyn control walker --recipe walker-true-model-walk --seeds 100,101 --steps 1000 --out logs/walk-true

This script is that command for the recipes of this kind alone (default recipe
``walker-true-model-walk``), with the options it had before the command ran them (the
commands in docs/results still run); gpdyn/cli/control_sampling.py holds both.
"""

from __future__ import annotations

import argparse
import logging
import sys

from gpdyn.cli.control_sampling import add_sampling_options, run_sampling_recipe
from gpdyn.cli.logs import configure as configure_logs
from gpdyn.device import set_threads
from gpdyn.errors import InputError
from gpdyn.recipes import load_recipe

RECIPE = "walker-true-model-walk"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sampling_options(p, kinds=("walker-sampling",), shared=True, legacy=True)
    p.set_defaults(recipe=RECIPE)
    args = p.parse_args(argv)
    configure_logs(logging.INFO, "walk_true_model.py")  # gpdyn's messages and progress lines on stderr, as the command
    set_threads(1)
    try:
        return run_sampling_recipe(load_recipe(args.recipe, "walker-sampling"), args)
    except (InputError, ValueError) as err:
        print(f"walk_true_model: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
