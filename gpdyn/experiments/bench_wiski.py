"""``gpdyn bench wiski``: WISKI's update cost against n, beside the exact GP, and its mean-only predict.

Times one observe + step (WISKI Algorithm 1: condition on one point, one Adam step on
the hyperparameters) after the caches already hold n points, for n = 1e3, 1e4, 1e5
(and 1e6 on a GPU) with m = 256 and m = 1024 grid points, on a synthetic 2-D stream
generated in chunks (the n points are never held in memory at once), and the same for
the additive structure at the mission's input dimension (D = 21 inputs, P = 7 outputs,
``ADDITIVE`` options; M = C g + D + 1 basis functions). The learners for the different
n are timed round-robin so that load from other processes hits every n alike; the
figure is the median (process CPU time on the CPU, wall time with a device sync on a
GPU). The ratio of the largest to the smallest n must be <= 1.3. The exact GP
(incremental Cholesky, one full-likelihood step per point) is timed beside it for
growing n until one update takes longer than ``EXACT_LIMIT_S``.

Mean-only predict (:func:`bench_predict_mean`): ``WISKI.predict_mean`` of ``N`` points
against a plain gather of the same number of points, ``torch.gather`` of ``K`` indices
per point and output from a ``[P, M]`` table, times ``K`` weights, summed: the fused
path must cost at most ``MAX_MEAN_RATIO`` times the 16-weight gather (the paper's 2-D
structure, K = 16) and is also reported against the gather of its own row length (the
additive structure's K = 4 C + D + 1). Both are timed in one run with
``time.process_time()``, interleaved, float32, one thread; the figure is the best of
``rounds`` rounds (the least disturbed by other processes).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import torch

from gpdyn.device import device_name, dtype_name, resolve_device, resolve_dtype, seconds
from gpdyn.gp.exact import ExactOnlineGP
from gpdyn.gp.wiski import WISKI
from gpdyn.progress import progress_bar
from gpdyn.runs import RunDir

GRID_SIZES = {256: 16, 1024: 32}  # m -> points per dimension in 2-D
MAX_RATIO = 1.3
MAX_MEAN_RATIO = 3.0
#: the additive structure timed at the mission's size: D inputs, P outputs (and the default
#: C = 2D components of 8 grid points: M = 17 D + 1 = 358)
ADDITIVE = {"input_dim": 21, "output_dim": 7}
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


def _stream_d(n: int, seed: int, device: torch.device, dtype: torch.dtype, d: int, p: int):
    """Chunks of a synthetic ``d``-input, ``p``-output stream (inputs N(0, 1), a smooth non-additive target)."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, p, generator=g, dtype=dtype) / d**0.5
    done = 0
    while done < n:
        q = min(CHUNK, n - done)
        x = torch.randn(q, d, generator=g, dtype=dtype)
        y = torch.sin(x @ mix) + x[:, :1] * x[:, 1:2] + 0.1 * torch.randn(q, p, generator=g, dtype=dtype)
        yield x.to(device), y.to(device)
        done += q


def bench_wiski(ns: list[int], m: int, repeats: int, device: torch.device, dtype: torch.dtype, seed: int = 0,
                additive: bool = False) -> dict[int, float]:
    """Median seconds per observe + step of WISKI with ``m`` grid points (2-D inputs, one output)
    at each ``n``; ``additive``: the additive structure at :data:`ADDITIVE` instead (``m`` ignored)."""
    learners = {}
    d, p = (ADDITIVE["input_dim"], ADDITIVE["output_dim"]) if additive else (2, 1)

    def stream(n: int, s: int):
        return _stream_d(n, s, device, dtype, d, p) if additive else _stream(n, s, device, dtype)

    label = "additive" if additive else f"m={m}"
    for n in progress_bar(ns, desc=f"fill caches {label}", leave=False):
        if additive:
            learner = WISKI(d, p, device=device, dtype=dtype, seed=seed, structure="additive", validate=False)
        else:
            learner = WISKI(2, 1, device=device, dtype=dtype, seed=seed, grid_size=GRID_SIZES[m], bounds=(-1, 1),
                            validate=False)
        for x, y in stream(n, seed):
            learner.observe(x, y)
        learners[n] = learner
    probe = list(stream(repeats + 2, seed + 1))[0]
    times: dict[int, list[float]] = {n: [] for n in ns}
    for r in progress_bar(range(repeats + 2), desc=f"time {label}", leave=False):
        x, y = probe[0][r : r + 1], probe[1][r : r + 1]
        for n in ns:  # round-robin: background load hits every n alike
            learner = learners[n]
            t = seconds(lambda: (learner.observe(x, y), learner.step(x, y)), device)
            if r >= 2:  # two warm-up rounds
                times[n].append(t)
    return {n: statistics.median(ts) for n, ts in times.items()}


def bench_predict_mean(device: torch.device, points: int = 4096, rounds: int = 15, reps: int = 10,
                       seed: int = 0) -> list[dict[str, Any]]:
    """``predict_mean`` of ``points`` points against plain gathers, per structure (see the module docs).

    Float32, the :data:`ADDITIVE` sizes (D = 21, P = 7) and each structure's default grid: the
    paper's 2-D structure (``structure="single"``, a learned 2-D projection per output, 16 x 16
    grid, K = 16) and the additive one (C = 42 components of 8 points, K = 4 C + D + 1 = 190),
    on the CPU also the additive one with ``compiled_mean=True`` (its dense kernel through
    :func:`torch.compile`; the compile happens in the warm-up call, outside the timing).
    Returns per structure: K, the seconds per call of predict_mean, of predict (mean and
    variance), of the 16-weight gather and of the K-weight gather, and the two ratios.
    """
    dtype = torch.float32
    d, p = ADDITIVE["input_dim"], ADDITIVE["output_dim"]
    gen = torch.Generator().manual_seed(seed)
    x_fit, y_fit = next(_stream_d(4096, seed, device, dtype, d, p))
    x = torch.randn(points, d, generator=gen, dtype=dtype).to(device)
    rows = []
    variants = [("single", False), ("additive", False)] + ([("additive", True)] if device.type == "cpu" else [])
    for structure, compiled in variants:
        learner = WISKI(d, p, device=device, dtype=dtype, seed=seed, structure=structure, validate=False,
                        compiled_mean=compiled)
        learner.observe(x_fit, y_fit)
        learner.predict_mean(x)  # the cache refresh (and the compile), outside the timing
        idx, _, _ = learner._rows(x[:1])
        k_own, m = idx.shape[-1], learner.num_inducing
        table = torch.randn(p, m, generator=gen, dtype=dtype).to(device)
        gathers = {}
        for k in (16, k_own):
            index = torch.randint(0, m, (p, points * k), generator=gen).to(device)
            weight = torch.randn(p, points, k, generator=gen, dtype=dtype).to(device)
            gathers[k] = lambda index=index, weight=weight, k=k: (table.gather(1, index).view(p, points, k) * weight).sum(-1)
        calls = {"predict_mean": lambda: learner.predict_mean(x), "gather16": gathers[16],
                 f"gather{k_own}": gathers[k_own]}
        best = {name: math.inf for name in calls}
        with torch.no_grad():
            for _ in range(rounds):  # interleaved: load from other processes hits every call alike
                for name, fn in calls.items():
                    best[name] = min(best[name], seconds(lambda fn=fn: [fn() for _ in range(reps)], device) / reps)
            t_predict = min(seconds(lambda: learner.predict(x), device) for _ in range(3))
        rows.append({
            "structure": structure + (" (compiled mean)" if compiled else ""), "K": k_own, "M": m, "points": points,
            "predict_mean_s": best["predict_mean"], "predict_s": t_predict,
            "gather16_s": best["gather16"], "gather_own_s": best[f"gather{k_own}"],
            "ratio_gather16": best["predict_mean"] / best["gather16"],
            "ratio_gather_own": best["predict_mean"] / best[f"gather{k_own}"],
        })
    return rows


def bench_exact(device: torch.device, dtype: torch.dtype, seed: int = 0, repeats: int = 3) -> list[dict[str, float]]:
    """Exact GP: seconds per observe (incremental Cholesky) and per observe + one full-MLL step."""
    rows = []
    for n in progress_bar(EXACT_NS, desc="exact GP", leave=False):
        gp = ExactOnlineGP(2, 1, device=device, dtype=dtype, seed=seed, refit_every=1, refit_iters=1, max_points=n + repeats + 2)
        for x, y in _stream(n, seed, device, dtype):
            for start in range(0, x.shape[0], 500):
                gp.observe(x[start : start + 500], y[start : start + 500])
        x, y = next(_stream(repeats, seed + 1, device, dtype))
        obs = [seconds(lambda i=i: gp.observe(x[i : i + 1], y[i : i + 1]), device) for i in range(repeats)]
        t_step = seconds(lambda: gp.step(x[:1], y[:1]), device)
        rows.append({"n": n, "observe_s": statistics.median(obs), "observe_step_s": statistics.median(obs) + t_step})
        if t_step > EXACT_LIMIT_S:
            break
    return rows


def _report(wiski: dict[Any, dict[int, float]], exact: list[dict[str, float]], ratios: dict[Any, float], device: str,
            means: list[dict[str, Any]] | None = None) -> str:
    ms = list(wiski)
    ns = sorted(next(iter(wiski.values())))
    a = ADDITIVE

    def head(m: Any) -> str:
        return f"WISKI m={m} (ms)" if isinstance(m, int) else f"additive D={a['input_dim']}, P={a['output_dim']} (ms)"

    lines = [
        f"# WISKI update cost against n ({device})",
        "",
        "Median seconds per observe + step (one point conditioned, one Adam step): the 2-D structure with 1 output "
        f"and 2-D inputs, and the additive structure ({a['input_dim']} inputs, {a['output_dim']} outputs, "
        f"C = {2 * a['input_dim']} components of 8 points plus the linear term, M = {17 * a['input_dim'] + 1}).",
        "",
        "| n | " + " | ".join(head(m) for m in ms) + " |",
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
    if means:
        lines += ["", _mean_report(means)]
    return "\n".join(lines) + "\n"


def _mean_report(means: list[dict[str, Any]]) -> str:
    """The mean-only predict table of :func:`bench_predict_mean`."""
    n = means[0]["points"]
    lines = [
        f"Mean-only predict of {n:,} points (float32, process CPU time, best of interleaved rounds) against a plain "
        "gather: torch.gather of K indices per point and output from a [P, M] table, times K weights, summed. "
        f"Target: predict_mean <= {MAX_MEAN_RATIO:g}x the 16-weight gather.",
        "",
        "| structure | M | K (weights per row) | predict_mean (ms) | predict (ms) | 16-weight gather (ms) | "
        "K-weight gather (ms) | ratio to 16-weight gather | ratio to K-weight gather |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in means:
        lines.append(f"| {r['structure']} | {r['M']} | {r['K']} | {1e3 * r['predict_mean_s']:.2f} | "
                     f"{1e3 * r['predict_s']:.1f} | {1e3 * r['gather16_s']:.2f} | {1e3 * r['gather_own_s']:.2f} | "
                     f"{r['ratio_gather16']:.2f} | {r['ratio_gather_own']:.2f} |")
    return "\n".join(lines)


def run_benchmark(device: str | torch.device = "cpu", out: str | Path | None = None) -> tuple[RunDir, float]:
    """Run the benchmark into a run folder (``report.md``, ``metrics.jsonl``); return it and the
    worst largest/smallest-n ratio (the check: at most :data:`MAX_RATIO`). The mean-only predict
    ratios are printed and logged beside it."""
    device = resolve_device(device)
    dtype = resolve_dtype(None, device)
    ns = [1_000, 10_000, 100_000] + ([1_000_000] if device.type == "cuda" else [])
    repeats = {256: 30, 1024: 10, "additive": 10}
    config: dict[str, Any] = {"device": str(device), "device_name": device_name(device), "dtype": dtype_name(dtype), "ns": ns, "ms": list(GRID_SIZES),
                              "repeats": repeats, "threads": torch.get_num_threads(), "exact_ns": list(EXACT_NS)}
    run = RunDir.create("bench-wiski", config, out)
    print(f"run folder: {run.path}")  # the run folder and the tables: results, on stdout
    means = bench_predict_mean(device)
    for row in means:
        run.log(learner="wiski", kind="predict_mean", **row)
    print(_mean_report(means))
    wiski: dict[Any, dict[int, float]] = {}
    ratios: dict[Any, float] = {}
    for m in [*GRID_SIZES, "additive"]:
        wiski[m] = bench_wiski(ns, m if m != "additive" else 0, repeats[m], device, dtype, additive=m == "additive")
        ratios[m] = wiski[m][ns[-1]] / wiski[m][ns[0]]
        for n, t in wiski[m].items():
            run.log(learner="wiski", m=m, n=n, seconds_per_update=t)
        run.log(learner="wiski", m=m, ratio_largest_smallest=ratios[m])
    exact = bench_exact(device, dtype)
    for row in exact:
        run.log(learner="exact", **row)
    report = _report(wiski, exact, ratios, f"{device}, {dtype_name(dtype)}", means)
    (run.path / "report.md").write_text(report)
    print(report)
    return run, max(ratios.values())
