"""WISKI with a shared or a per-output learned projection, beside SVDGP, on a stored problem.

    .venv/bin/python scripts/wiski_projection.py STORE PROBLEM [--batch 32] [--max-train N] [--out DIR]

The protocol and metric are those of :mod:`gpdyn.experiments.wiski_projection`; with
``--out`` the results also go to ``DIR/results.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from gpdyn.cli.logs import configure as configure_logs
from gpdyn.device import set_threads
from gpdyn.errors import InputError
from gpdyn.experiments.wiski_projection import compare_projections


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("problem")
    parser.add_argument("--batch", type=int, default=32, help="WISKI minibatch (default 32)")
    parser.add_argument("--grid-size", type=int, default=16, help="WISKI grid points per dimension (default 16)")
    parser.add_argument("--svdgp-batch", type=int, default=128, help="SVDGP minibatch (default 128)")
    parser.add_argument("--max-train", type=int, default=None, help="use the first N training points")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learners", default="shared,per-output,svdgp", help="any of shared, per-output, svdgp")
    parser.add_argument("--out", type=Path, default=None, help="write results.json here")
    args = parser.parse_args(argv)
    configure_logs(logging.INFO, "wiski_projection.py")  # gpdyn's messages and progress lines on stderr, as the command
    set_threads(1)
    try:
        results = compare_projections(
            args.store, args.problem, batch=args.batch, grid_size=args.grid_size, svdgp_batch=args.svdgp_batch,
            max_train=args.max_train, seed=args.seed, learners=tuple(s.strip() for s in args.learners.split(",")),
        )
    except InputError as err:
        print(f"wiski_projection: error: {err}", file=sys.stderr)
        return 2
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
