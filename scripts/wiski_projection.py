"""A past study, outside the package: WISKI with a shared or a per-output learned projection of the 2-D
structure (``structure="single"``), beside SVDGP, on a stored problem (docs/wiski.md, "Shared or per-output
projection").

    .venv/bin/python scripts/wiski_projection.py STORE PROBLEM [--batch 32] [--max-train N] [--out DIR]

Shared or per-output learned projection for WISKI, measured on a problem beside SVDGP.

WISKI's protocol (Sec. 5.1, Algorithm 1): pretrain on the first 5% of the training
stream, then one pass over the rest, ``observe`` + ``step`` per minibatch. SVDGP runs its
own protocol (docs/architecture.md: minibatches sampled from the training split, observe + step)
for the same number of iterations. Metric: test nMSE per output (MSE over the variance
of the test targets, in normalised units), mean and std over outputs.

With ``--out`` the results also go to ``DIR/results.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import gpdyn.robots.tasks  # noqa: F401  (registers every built-in task and its problems: walker-1, hopper-1, ...)
from gpdyn.cli.logs import configure as configure_logs
from gpdyn.data.problems import load_problem
from gpdyn.device import set_threads
from gpdyn.errors import InputError
from gpdyn.gp import make_learner
from gpdyn.gp.base import Learner
from gpdyn.gp.online import evaluate
from gpdyn.gp.wiski import WISKI
from gpdyn.progress import progress_bar

log = logging.getLogger(__name__)


def test_nmse(learner: Learner, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Per-output test nMSE ``[P]``, as replay reports it."""
    return np.asarray(evaluate(learner, x, y)["nmse"])


def run_wiski(projection: str, x: torch.Tensor, y: torch.Tensor, batch: int, seed: int, grid_size: int) -> WISKI:
    learner = WISKI(x.shape[1], y.shape[1], seed=seed, structure="single", projection=projection, grid_size=grid_size,
                    pretrain_iters=100)
    n0 = max(1, int(0.05 * x.shape[0]))
    learner.pretrain(x[:n0], y[:n0])
    for start in progress_bar(range(n0, x.shape[0], batch), desc=f"wiski {projection}", leave=False):
        xb, yb = x[start : start + batch], y[start : start + batch]
        learner.observe(xb, yb)
        learner.step(xb, yb)
    return learner


def run_svdgp(x: torch.Tensor, y: torch.Tensor, iterations: int, batch: int, seed: int) -> Learner:
    # the small preset with the measurement's N_Delta and sampled columns (docs/wiski.md)
    learner = make_learner("svdgp", x.shape[1], y.shape[1], seed=seed, preset="small", n_delta=64, n_columns=128)
    g = torch.Generator().manual_seed(seed)
    for _ in progress_bar(range(iterations), desc="svdgp", leave=False):
        idx = torch.randint(0, x.shape[0], (batch,), generator=g)
        learner.observe(x[idx], y[idx])
        learner.step(x[idx], y[idx])
    return learner


PROJECTIONS = ("shared", "per-output")


def compare_projections(
    store: str | Path,
    problem: str,
    *,
    batch: int = 32,
    grid_size: int = 16,
    svdgp_batch: int = 128,
    max_train: int | None = None,
    seed: int = 0,
    learners: tuple[str, ...] = ("shared", "per-output", "svdgp"),
) -> dict[str, Any]:
    """Test nMSE (mean, std over outputs) and seconds of each of ``learners`` on ``problem``:
    WISKI with a shared or a per-output projection, and SVDGP for as many iterations as
    WISKI has online minibatches. ``max_train`` keeps the first N training points."""
    unknown = sorted(set(learners) - {*PROJECTIONS, "svdgp"})
    if unknown:
        raise InputError(f"--learners: unknown {unknown}; choose from {', '.join((*PROJECTIONS, 'svdgp'))}")
    loaded = load_problem(store, problem, "iid", seed)
    x, y = loaded.tensors("train")
    if max_train:
        x, y = x[:max_train], y[:max_train]
    xt, yt = loaded.tensors("test")
    results: dict[str, Any] = {"store": str(store), "problem": problem, "n_train": x.shape[0], "n_test": xt.shape[0]}
    # SVDGP gets as many iterations as WISKI has online minibatches
    iterations = -(-(x.shape[0] - max(1, int(0.05 * x.shape[0]))) // batch)
    for projection in [p for p in PROJECTIONS if p in learners]:
        t0 = time.perf_counter()
        e = test_nmse(run_wiski(projection, x, y, batch, seed, grid_size), xt, yt)
        results[f"wiski-{projection}"] = {"nmse_mean": float(e.mean()), "nmse_std": float(e.std()),
                                          "seconds": time.perf_counter() - t0}
        log.info(f"wiski-{projection}: {results[f'wiski-{projection}']}")
    if "svdgp" in learners:
        t0 = time.perf_counter()
        e = test_nmse(run_svdgp(x, y, iterations, svdgp_batch, seed), xt, yt)
        results["svdgp"] = {"nmse_mean": float(e.mean()), "nmse_std": float(e.std()),
                            "seconds": time.perf_counter() - t0, "iterations": iterations}
        log.info(f"svdgp: {results['svdgp']}")
    return results


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
