"""Walker2d walking by predictive sampling on a learned (hybrid) model after a plant change: true / frozen / online.

    .venv/bin/python scripts/walk_learned_model.py --seeds 200,201,202,203,204,205,206,207 \
        --changes weak_motor:0.3 --steps 1000 --out logs/walk-learned
    .venv/bin/python scripts/walk_learned_model.py --combine logs/walk-learned,logs/other-run  # one table of finished runs

Each ``--changes`` item is CHANGE[:FACTOR] (a name of gpdyn.robots.walker.PLANT_CHANGES, or
``none`` for the nominal plant). The learned model is the nominal plant's MuJoCo planning
model plus a GP residual on the velocity change per planning step, learned online
(gpdyn/control/hybrid_model.py). Writes the run folder's metrics.jsonl and report.md
(return, steps, falls, speed, CPU ms per control step, recovery fraction, model checks);
see gpdyn/experiments/walk_learned_model.py.
"""

from __future__ import annotations

import argparse
import sys

from gpdyn.control.hybrid_model import ResidualConfig
from gpdyn.control.spline_sampling import SamplerConfig
from gpdyn.device import set_threads
from gpdyn.errors import InputError
from gpdyn.experiments.walk_learned_model import CONTROLLERS, WalkLearnedConfig, combine, run


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="200,201,202,203,204,205,206,207", help="comma-separated episode seeds")
    p.add_argument("--changes", default="weak_motor:0.3", help="CHANGE[:FACTOR],... (none: the nominal plant)")
    p.add_argument("--controllers", default=",".join(CONTROLLERS))
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--explore", type=float, default=WalkLearnedConfig.explore_std, help="action noise while learning")
    p.add_argument("--kernel", default=ResidualConfig.kernel, help="residual GP kernel: se or linear")
    p.add_argument("--linear-inputs", default=ResidualConfig.linear_inputs, help="linear kernel over: all or action")
    p.add_argument("--space", default=ResidualConfig.space, help="residual as a velocity change or a generalized force")
    p.add_argument("--window", type=int, default=ResidualConfig.window)
    p.add_argument("--noise", type=float, default=ResidualConfig.noise, help="residual GP noise (scaled targets)")
    p.add_argument("--eval-every", type=int, default=WalkLearnedConfig.eval_every)
    p.add_argument("--out", default=None)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--combine", default=None, help="comma-separated finished run folders: print their joint tables, run nothing")
    args = p.parse_args(argv)
    set_threads(1)
    try:
        if args.combine:
            print(combine([s.strip() for s in args.combine.split(",") if s.strip()]))
            return 0
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        changes, factors = parse_changes(args.changes)
        residual = ResidualConfig(kernel=args.kernel, space=args.space, linear_inputs=args.linear_inputs, window=args.window, noise=args.noise)
        config = WalkLearnedConfig(seeds=seeds, steps=args.steps, changes=changes, factors=factors,
                                   controllers=[c.strip() for c in args.controllers.split(",") if c.strip()],
                                   explore_std=args.explore, eval_every=args.eval_every, sampler=SamplerConfig(),
                                   residual=residual)
        run(config, out=args.out, progress=not args.no_progress)
    except (InputError, ValueError) as err:
        print(f"walk_learned_model: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
