"""Walker2d walking by predictive sampling on a learned model after a plant change: the ``walker-learned`` recipes, as `gpdyn control walker` runs them.

    .venv/bin/gpdyn control walker --recipe walker-learned-hip --changes weak_motor:0.1 --out logs/hip10
    .venv/bin/gpdyn control walker --recipe walker-learned-hip --combine logs/hip30,logs/hip10   # one table of finished runs

This script is that command for the recipes of this kind alone (default recipe
``walker-learned-parameters``), with the option names it had before the command ran them
(``--model``, ``--kernel``, ``--linear-inputs``, ``--space``, ``--window``, ``--noise``,
``--explore``, ``--no-progress``: the commands in docs/results still run);
gpdyn/cli/control_sampling.py holds both.
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

RECIPE = "walker-learned-parameters"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sampling_options(p, kinds=("walker-learned",), shared=True, legacy=True)
    p.set_defaults(recipe=RECIPE)
    args = p.parse_args(argv)
    configure_logs(logging.INFO, "walk_learned_model.py")  # gpdyn's messages and progress lines on stderr, as the command
    set_threads(1)
    try:
        return run_sampling_recipe(load_recipe(args.recipe, "walker-learned"), args)
    except (InputError, ValueError) as err:
        print(f"walk_learned_model: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
