"""Walker2d walking by predictive sampling on the true model, one episode per seed.

    .venv/bin/python scripts/walk_true_model.py --seeds 100,101,102,103,104 --steps 1000 --out logs/walk-true

Writes the run folder's report.md (steps, distance, speed, return, planner CPU ms per
control step) and prints the table; see gpdyn/experiments/walk_true_model.py.
"""

from __future__ import annotations

import argparse
import sys

from gpdyn.control.spline_sampling import SamplerConfig
from gpdyn.device import set_threads
from gpdyn.errors import InputError
from gpdyn.experiments.walk_true_model import run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2", help="comma-separated episode seeds")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--samples", type=int, default=SamplerConfig.samples)
    p.add_argument("--horizon", type=int, default=SamplerConfig.horizon)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    set_threads(1)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        run(seeds, args.steps, SamplerConfig(samples=args.samples, horizon=args.horizon), out=args.out)
    except (InputError, ValueError) as err:
        print(f"walk_true_model: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
