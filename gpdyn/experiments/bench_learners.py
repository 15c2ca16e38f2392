"""``gpdyn bench learners``: time and peak memory per step at the papers' sizes (N_m = 1024, D = 23, P = 9).

Configurations (SVDGP Section 4; ORTHDGP Fig. 2c): SVDGP M_alpha = 128^2, M_beta = 128;
SVI M = 1024; ORTHNAT |gamma| = 3500, |beta| = 1500; and SVDGP at M_alpha = 4096 and
16384 for the linear-scaling check (the step time may grow at most 4.5x for 4x M_alpha).
Bases are filled before timing. Peak memory is CUDA's allocator peak on a GPU and the
growth of the process's peak resident set on the CPU (0 when an earlier configuration
already reached it). Results go to ``bench.json`` and ``report.md`` in the run folder.
"""

from __future__ import annotations

import argparse
import resource
import time
from typing import Any

import torch

from gpdyn.errors import InputError
from gpdyn.experiments.learn import check_device, resolve_dtype
from gpdyn.gp import make_learner
from gpdyn.runs import RunDir

N_M, D, P = 1024, 23, 9
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "svdgp-4096": ("svdgp", {"m_alpha": 4096, "m_beta": 128}),
    "svdgp-16384": ("svdgp", {"m_alpha": 16384, "m_beta": 128}),
    "svi-1024": ("svi", {"m": 1024}),
    "orthnat-3500-1500": ("orthnat", {"m_gamma": 3500, "m_beta": 1500}),
}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def bench_one(name: str, sizes: dict[str, Any], device: str, dtype: torch.dtype, repeats: int) -> dict[str, Any]:
    """Median step time (s) and peak memory (MB) of one learner with full bases."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_M, D, generator=g, dtype=torch.float64).to(device, dtype)
    y = torch.sin(x[:, :P]).to(device, dtype)
    learner = make_learner(name, D, P, device=device, dtype=dtype, n_delta=N_M, n_data=100 * N_M, **sizes)
    while True:  # fill every basis before timing
        before = dict(learner.counts)
        learner.observe(torch.randn(N_M, D, generator=g, dtype=torch.float64).to(device, dtype), y)
        if learner.counts == before:
            break
    learner.step(x, y)  # warm-up
    rss0 = _peak_rss_mb()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        loss = learner.step(x, y)["loss"]
        float(loss)  # one sync per timed step
        times.append(time.perf_counter() - t0)
    if device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = max(0.0, _peak_rss_mb() - rss0)
    times.sort()
    return {"learner": name, "sizes": sizes, "counts": dict(learner.counts), "step_s": times[len(times) // 2], "peak_mb": peak}


def cli_bench(args: argparse.Namespace) -> int:
    """Time every configuration and print the table and the M_alpha scaling ratio."""
    check_device(args.device)
    if args.repeats < 1:
        raise InputError(f"--repeats must be >= 1, got {args.repeats}")
    dtype = resolve_dtype(args.dtype, args.device)
    names = list(CONFIGS) if not args.only else [s.strip() for s in args.only.split(",")]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise InputError(f"--only: unknown configuration(s) {unknown}; choose from {list(CONFIGS)}")
    run = RunDir.create("bench-learners", {"device": args.device, "dtype": str(dtype), "repeats": args.repeats, "N_m": N_M, "D": D, "P": P}, args.out)
    results = {}
    for key in names:
        name, sizes = CONFIGS[key]
        results[key] = bench_one(name, sizes, args.device, dtype, args.repeats)
        run.log(config=key, **results[key])
        print(f"{key:20s} {results[key]['step_s'] * 1e3:10.1f} ms/step  peak {results[key]['peak_mb']:8.0f} MB", flush=True)
    summary: dict[str, Any] = {"results": results}
    if "svdgp-4096" in results and "svdgp-16384" in results:
        ratio = results["svdgp-16384"]["step_s"] / results["svdgp-4096"]["step_s"]
        summary["svdgp_ratio_16384_over_4096"] = ratio
        print(f"SVDGP step time ratio M_alpha 16384 / 4096: {ratio:.2f} (linear: 4.0, limit 4.5) -> {'ok' if ratio <= 4.5 else 'TOO HIGH'}")
    run.write_json("bench.json", summary)
    lines = [f"# gpdyn bench learners ({args.device}, {str(dtype).removeprefix('torch.')}, N_m={N_M}, D={D}, P={P})", "",
             "| configuration | ms/step | peak MB |", "|---|---|---|"]
    lines += [f"| {k} | {r['step_s'] * 1e3:.1f} | {r['peak_mb']:.0f} |" for k, r in results.items()]
    if "svdgp_ratio_16384_over_4096" in summary:
        lines += ["", f"SVDGP M_alpha 16384/4096 step-time ratio: {summary['svdgp_ratio_16384_over_4096']:.2f} (limit 4.5)"]
    (run.path / "report.md").write_text("\n".join(lines) + "\n")
    print(f"run folder: {run.path}")
    return 0
