"""Shared or per-output learned projection for WISKI, measured on a problem beside SVDGP.

WISKI's protocol (Sec. 5.1, Algorithm 1): pretrain on the first 5% of the training
stream, then one pass over the rest, ``observe`` + ``step`` per minibatch. SVDGP runs its
own protocol (DESIGN.md: minibatches sampled from the training split, observe + step)
for the same number of iterations. Metric: test nMSE per output (MSE over the variance
of the test targets, in normalised units), mean and std over outputs.

Usage: ``python -m gpdyn.experiments.wiski_projection STORE PROBLEM [--batch 32] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from gpdyn.data.problems import load_problem
from gpdyn.gp import make_learner
from gpdyn.gp.base import Learner
from gpdyn.gp.online import evaluate
from gpdyn.gp.wiski import WISKI


def test_nmse(learner: Learner, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Per-output test nMSE ``[P]``, as replay reports it."""
    return np.asarray(evaluate(learner, x, y)["nmse"])


def run_wiski(projection: str, x: torch.Tensor, y: torch.Tensor, batch: int, seed: int, grid_size: int) -> WISKI:
    learner = WISKI(x.shape[1], y.shape[1], seed=seed, projection=projection, grid_size=grid_size, pretrain_iters=100)
    n0 = max(1, int(0.05 * x.shape[0]))
    learner.pretrain(x[:n0], y[:n0])
    for start in tqdm(range(n0, x.shape[0], batch), desc=f"wiski {projection}", leave=False):
        xb, yb = x[start : start + batch], y[start : start + batch]
        learner.observe(xb, yb)
        learner.step(xb, yb)
    return learner


def run_svdgp(x: torch.Tensor, y: torch.Tensor, iterations: int, batch: int, seed: int) -> Learner:
    learner = make_learner("svdgp", x.shape[1], y.shape[1], seed=seed, m_alpha=512, m_beta=64, n_delta=64, n_columns=128)
    g = torch.Generator().manual_seed(seed)
    for _ in tqdm(range(iterations), desc="svdgp", leave=False):
        idx = torch.randint(0, x.shape[0], (batch,), generator=g)
        learner.observe(x[idx], y[idx])
        learner.step(x[idx], y[idx])
    return learner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("problem")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--grid-size", type=int, default=16)
    parser.add_argument("--svdgp-batch", type=int, default=128)
    parser.add_argument("--max-train", type=int, default=None, help="use the first N training points")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learners", default="shared,per-output,svdgp", help="any of shared, per-output, svdgp")
    parser.add_argument("--out", type=Path, default=None, help="write results.json here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    problem = load_problem(args.store, args.problem, "iid", args.seed)
    x, y = problem.tensors("train")
    if args.max_train:
        x, y = x[: args.max_train], y[: args.max_train]
    xt, yt = problem.tensors("test")
    results = {"store": str(args.store), "problem": args.problem, "n_train": x.shape[0], "n_test": xt.shape[0]}
    chosen = args.learners.split(",")
    # SVDGP gets as many iterations as WISKI has online minibatches
    iterations = -(-(x.shape[0] - max(1, int(0.05 * x.shape[0]))) // args.batch)
    for projection in [p for p in ("shared", "per-output") if p in chosen]:
        t0 = time.perf_counter()
        learner = run_wiski(projection, x, y, args.batch, args.seed, args.grid_size)
        e = test_nmse(learner, xt, yt)
        results[f"wiski-{projection}"] = {"nmse_mean": float(e.mean()), "nmse_std": float(e.std()), "seconds": time.perf_counter() - t0}
        print(projection, results[f"wiski-{projection}"], flush=True)
    if "svdgp" in chosen:
        t0 = time.perf_counter()
        e = test_nmse(run_svdgp(x, y, iterations, args.svdgp_batch, args.seed), xt, yt)
        results["svdgp"] = {"nmse_mean": float(e.mean()), "nmse_std": float(e.std()), "seconds": time.perf_counter() - t0, "iterations": iterations}
        print("svdgp", results["svdgp"], flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
