"""Walker2d walking by predictive sampling on a learned model after a plant change: true / frozen / online.

    .venv/bin/python scripts/walk_learned_model.py --changes torso_mass --out logs/torso   # walker-learned-parameters
    .venv/bin/python scripts/walk_learned_model.py --recipe walker-learned-hip --out logs/hip30   # the GP force residual
    .venv/bin/python scripts/walk_learned_model.py --changes weak_motor:0.3 --seeds 200,201 --out logs/hip30-dev
    .venv/bin/python scripts/walk_learned_model.py --combine logs/torso,logs/hip30  # one table of finished runs

The sampler, cost, learned model, seeds, plant changes and controllers come from a
``walker-learned`` recipe (``--recipe``, default ``walker-learned-parameters``: gpdyn/recipes/);
the options given here override its values. Each ``--changes`` item is CHANGE[:FACTOR] (a name
of the task's ``plant_changes``, or ``none`` for the nominal plant). The learned model is
the nominal plant's MuJoCo planning model with its physical parameters identified online
(``--model parameters``, gpdyn/control/identified_model.py) or plus a GP residual per planning
step (``--model residual``, gpdyn/control/hybrid_model.py). Writes the run folder's
metrics.jsonl, report.md and recipe.json (return, steps, falls, speed, CPU ms per control
step, model checks, the identified parameters, and paired over seeds the differences of
returns and the recovery fraction with a bootstrap interval); see
gpdyn/experiments/walk_learned_model.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from gpdyn.cli.logs import configure as configure_logs
from gpdyn.device import set_threads
from gpdyn.errors import InputError
from gpdyn.experiments.walk_learned_model import CONTROLLERS, MODELS, combine, run
from gpdyn.recipes import load_recipe


def parse_changes(text: str) -> tuple[list[str], dict[str, float]]:
    """``"weak_motor:0.3,torso_mass"`` -> (names, factors); InputError on a malformed item."""
    names, factors = [], {}
    for item in (s.strip() for s in text.split(",") if s.strip()):
        name, _, factor = item.partition(":")
        names.append(name)
        if factor:
            try:
                factors[name] = float(factor)
            except ValueError:
                raise InputError(f"--changes: factor of {name!r} must be a number, got {factor!r}") from None
    if not names:
        raise InputError("--changes: name at least one plant change (or none)")
    return names, factors


RECIPE = "walker-learned-parameters"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default=RECIPE, help=f"a walker-learned recipe, name or TOML file (default {RECIPE})")
    p.add_argument("--seeds", default=None, help="comma-separated episode seeds (default: the recipe's)")
    p.add_argument("--changes", default=None, help="CHANGE[:FACTOR],... (none: the nominal plant; default: the recipe's)")
    p.add_argument("--controllers", default=None, help=f"comma-separated, of {', '.join(CONTROLLERS)}")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--explore", type=float, default=None, help="action noise while learning")
    p.add_argument("--model", default=None, choices=MODELS, help="what the online model learns")
    p.add_argument("--kernel", default=None, help="residual GP kernel: se or linear")
    p.add_argument("--linear-inputs", default=None, help="linear kernel over: all or action")
    p.add_argument("--space", default=None, help="residual as a velocity change or a generalized force")
    p.add_argument("--window", type=int, default=None, help="transitions the learned model conditions on")
    p.add_argument("--noise", type=float, default=None, help="residual GP noise (scaled targets)")
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--combine", default=None, help="comma-separated finished run folders: print their joint tables, run nothing")
    args = p.parse_args(argv)
    configure_logs(logging.INFO, "walk_learned_model.py")  # gpdyn's messages and progress lines on stderr, as the command
    set_threads(1)
    try:
        if args.combine:
            print(combine([s.strip() for s in args.combine.split(",") if s.strip()]))
            return 0
        recipe = load_recipe(args.recipe, "walker-learned")
        residual = dataclasses.replace(recipe.build("residual"), **{k: v for k, v in (
            ("kernel", args.kernel), ("space", args.space), ("linear_inputs", args.linear_inputs),
            ("window", args.window), ("noise", args.noise)) if v is not None})
        config = recipe.build("run", sampler=recipe.build("sampler"), residual=residual,
                              identification=recipe.build("identification"))
        if args.window is not None:  # both learned models condition on a window of recent transitions
            config.identification.window = args.window
        if args.model is not None:
            config.model = args.model
        if args.seeds is not None:
            config.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        if args.changes is not None:
            config.changes, config.factors = parse_changes(args.changes)
        if args.controllers is not None:
            config.controllers = [c.strip() for c in args.controllers.split(",") if c.strip()]
        for name, value in (("steps", args.steps), ("explore_std", args.explore), ("eval_every", args.eval_every)):
            if value is not None:
                setattr(config, name, value)
        print(f"walk_learned_model: recipe {recipe.name}")
        folder = run(config, recipe.build("cost"), out=args.out, progress=not args.no_progress)
        recipe.write_summary(folder, vars(args), not_options=("no_progress", "combine"))
    except (InputError, ValueError) as err:
        print(f"walk_learned_model: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
