"""``gpdyn bench wiski``: WISKI's update cost against n, beside the exact GP.

Times one observe + step (WISKI Algorithm 1: condition on one point, one Adam step on
the hyperparameters) after the caches already hold n points, for n = 1e3, 1e4, 1e5
(and 1e6 on a GPU) with m = 256 and m = 1024 grid points, on a synthetic 2-D stream
generated in chunks (the n points are never held in memory at once). The learners for
the different n are timed round-robin so that load from other processes hits every n
alike; the figure is the median. The ratio of the largest to the smallest n must be
<= 1.3. The exact GP (incremental Cholesky, one full-likelihood step per point) is
timed beside it for growing n until one update takes longer than ``EXACT_LIMIT_S``.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from gpdyn.device import dtype_name, resolve_device, resolve_dtype, sync
from gpdyn.gp.exact import ExactOnlineGP
from gpdyn.gp.wiski import WISKI
from gpdyn.runs import RunDir

GRID_SIZES = {256: 16, 1024: 32}  # m -> points per dimension in 2-D
MAX_RATIO = 1.3
EXACT_NS = (250, 500, 1000, 2000, 4000)
EXACT_LIMIT_S = 3.0
CHUNK = 10_000


def _stream(n: int, seed: int, device: torch.device, dtype: torch.dtype):
    """Chunks of a synthetic 2-D regression stream on [-1, 1]^2 (seeded)."""
    g = torch.Generator().manual_seed(seed)
    done = 0
    while done < n:
        q = min(CHUNK, n - done)
        x = torch.rand(q, 2, generator=g, dtype=dtype) * 2 - 1
        y = torch.sin(3 * x[:, :1]) + torch.cos(2 * x[:, 1:]) + 0.1 * torch.randn(q, 1, generator=g, dtype=dtype)
        yield x.to(device), y.to(device)
        done += q


def _timed(fn, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def bench_wiski(ns: list[int], m: int, repeats: int, device: torch.device, dtype: torch.dtype, seed: int = 0) -> dict[int, float]:
    """Median seconds per observe + step of WISKI with ``m`` grid points at each ``n``."""
    learners = {}
    for n in tqdm(ns, desc=f"fill caches m={m}", leave=False):
        learner = WISKI(2, 1, device=device, dtype=dtype, seed=seed, grid_size=GRID_SIZES[m], bounds=(-1, 1), validate=False)
        for x, y in _stream(n, seed, device, dtype):
            learner.observe(x, y)
        learners[n] = learner
    probe = list(_stream(repeats + 2, seed + 1, device, dtype))[0]
    times: dict[int, list[float]] = {n: [] for n in ns}
    for r in tqdm(range(repeats + 2), desc=f"time m={m}", leave=False):
        x, y = probe[0][r : r + 1], probe[1][r : r + 1]
        for n in ns:  # round-robin: background load hits every n alike
            learner = learners[n]
            t = _timed(lambda: (learner.observe(x, y), learner.step(x, y)), device)
            if r >= 2:  # two warm-up rounds
                times[n].append(t)
    return {n: statistics.median(ts) for n, ts in times.items()}


def bench_exact(device: torch.device, dtype: torch.dtype, seed: int = 0, repeats: int = 3) -> list[dict[str, float]]:
    """Exact GP: seconds per observe (incremental Cholesky) and per observe + one full-MLL step."""
    rows = []
    for n in tqdm(EXACT_NS, desc="exact GP", leave=False):
        gp = ExactOnlineGP(2, 1, device=device, dtype=dtype, seed=seed, refit_every=1, refit_iters=1, max_points=n + repeats + 2)
        for x, y in _stream(n, seed, device, dtype):
            for start in range(0, x.shape[0], 500):
                gp.observe(x[start : start + 500], y[start : start + 500])
        x, y = next(_stream(repeats, seed + 1, device, dtype))
        obs = [_timed(lambda i=i: gp.observe(x[i : i + 1], y[i : i + 1]), device) for i in range(repeats)]
        t_step = _timed(lambda: gp.step(x[:1], y[:1]), device)
        rows.append({"n": n, "observe_s": statistics.median(obs), "observe_step_s": statistics.median(obs) + t_step})
        if t_step > EXACT_LIMIT_S:
            break
    return rows


def _report(wiski: dict[int, dict[int, float]], exact: list[dict[str, float]], ratios: dict[int, float], device: str) -> str:
    ms = sorted(wiski)
    ns = sorted(next(iter(wiski.values())))
    lines = [
        f"# WISKI update cost against n ({device})",
        "",
        "Median seconds per observe + step (one point conditioned, one Adam step), 1 output, 2-D inputs.",
        "",
        "| n | " + " | ".join(f"WISKI m={m} (ms)" for m in ms) + " |",
        "|---|" + "---|" * len(ms),
    ]
    for n in ns:
        lines.append(f"| {n:,} | " + " | ".join(f"{1e3 * wiski[m][n]:.2f}" for m in ms) + " |")
    lines.append("| ratio largest/smallest n | " + " | ".join(f"{ratios[m]:.3f}" for m in ms) + " |")
    lines += [
        "",
        f"Exact GP (incremental Cholesky; one step = one Adam step on the full likelihood + refactorisation; stops past {EXACT_LIMIT_S:.0f} s):",
        "",
        "| n | observe (ms) | observe + step (ms) |",
        "|---|---|---|",
    ]
    for row in exact:
        lines.append(f"| {row['n']:,} | {1e3 * row['observe_s']:.2f} | {1e3 * row['observe_step_s']:.1f} |")
    return "\n".join(lines) + "\n"


def run_benchmark(device: str | torch.device = "cpu", out: str | Path | None = None) -> tuple[RunDir, float]:
    """Run the benchmark into a run folder (``report.md``, ``metrics.jsonl``); return it and the
    worst largest/smallest-n ratio (the check: at most :data:`MAX_RATIO`)."""
    device = resolve_device(device)
    dtype = resolve_dtype(None, device)
    ns = [1_000, 10_000, 100_000] + ([1_000_000] if device.type == "cuda" else [])
    repeats = {256: 30, 1024: 10}
    config: dict[str, Any] = {"device": str(device), "dtype": dtype_name(dtype), "ns": ns, "ms": list(GRID_SIZES),
                              "repeats": repeats, "threads": torch.get_num_threads(), "exact_ns": list(EXACT_NS)}
    run = RunDir.create("bench-wiski", config, out)
    print(f"run folder: {run.path}")
    wiski: dict[int, dict[int, float]] = {}
    ratios: dict[int, float] = {}
    for m in GRID_SIZES:
        wiski[m] = bench_wiski(ns, m, repeats[m], device, dtype)
        ratios[m] = wiski[m][ns[-1]] / wiski[m][ns[0]]
        for n, t in wiski[m].items():
            run.log(learner="wiski", m=m, n=n, seconds_per_update=t)
        run.log(learner="wiski", m=m, ratio_largest_smallest=ratios[m])
    exact = bench_exact(device, dtype)
    for row in exact:
        run.log(learner="exact", **row)
    report = _report(wiski, exact, ratios, f"{device}, {dtype_name(dtype)}")
    (run.path / "report.md").write_text(report)
    print(report)
    return run, max(ratios.values())
