"""``gpdyn bench learners``: time and peak memory per step at the papers' sizes (N_m = 1024, D = 23, P = 9).

Configurations (SVDGP Section 4; ORTHDGP Fig. 2c): SVDGP M_alpha = 128^2, M_beta = 128
and M_alpha = 4096 for the linear-scaling check (the step time may grow at most 4.5x
for 4x M_alpha); SVI M = 1024; ORTHNAT |gamma| = 3500, |beta| = 1500 and at SVDGP's
sizes (|gamma| = 128^2, |beta| = 128). Bases are filled before timing.

Each configuration runs in a fresh process, so that one configuration's allocations
never hide another's. Peak memory is CUDA's allocator peak during the timed steps on a
GPU. On the CPU it is the process's peak resident set during the timed steps (Linux
``VmHWM``, reset through ``/proc/self/clear_refs`` just before them) and its growth over
the resident set just before them (parameters, optimiser state, data and the torch
runtime are in that base). Results go to ``bench.json`` and ``report.md`` in the run folder.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import torch

from gpdyn.device import dtype_name, resolve_device, resolve_dtype, set_threads
from gpdyn.errors import InputError
from gpdyn.gp import learner_class, make_learner, preset_options
from gpdyn.runs import RunDir

N_M, D, P = 1024, 23, 9


def _paper(name: str, **overrides: Any) -> dict[str, Any]:
    """The learner's "paper" preset with ``overrides``: the sizes a configuration times."""
    return {**preset_options(learner_class(name), "paper"), **overrides}


_SVDGP = _paper("svdgp")
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "svdgp-4096": ("svdgp", _paper("svdgp", m_alpha=_SVDGP["m_alpha"] // 4)),
    "svdgp-16384": ("svdgp", _SVDGP),
    "svi-1024": ("svi", _paper("svi")),
    "orthnat-3500-1500": ("orthnat", _paper("orthnat")),
    "orthnat-16384-128": ("orthnat", _paper("orthnat", m_gamma=_SVDGP["m_alpha"], m_beta=_SVDGP["m_beta"])),
}


def _status_mb(field: str) -> float | None:
    """A ``VmRSS``/``VmHWM`` line of ``/proc/self/status`` in MB (None off Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux ``clear_refs`` value 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def bench_one(name: str, sizes: dict[str, Any], device: str, dtype: torch.dtype, repeats: int) -> dict[str, Any]:
    """Median step time (s), predict time (s, for N_m points) and peak memory (MB) of one learner with full bases."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_M, D, generator=g, dtype=torch.float64).to(device, dtype)
    y = torch.sin(x[:, :P]).to(device, dtype)
    learner = make_learner(name, D, P, device=device, dtype=dtype, **{**sizes, "n_delta": N_M, "n_data": 100 * N_M})
    while True:  # fill every basis before timing
        before = learner.basis_counts
        learner.observe(torch.randn(N_M, D, generator=g, dtype=torch.float64).to(device, dtype), y)
        if learner.basis_counts == before:
            break
    learner.step(x, y)  # warm-up
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated() / 2**20
        torch.cuda.reset_peak_memory_stats()
        measured = True
    else:
        base = _status_mb("VmRSS")
        measured = base is not None and _reset_peak_rss()
    times, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = learner.step(x, y)["loss"]
        float(loss)  # one sync per timed step
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    if cuda:
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = _status_mb("VmHWM") if measured else None
    t0 = time.perf_counter()
    mean, _ = learner.predict(x)  # the first predict after a step also rebuilds the cache
    float(mean.sum())
    predict_s = time.perf_counter() - t0
    times.sort()
    cpu.sort()
    return {
        "learner": name,
        "sizes": sizes,
        "counts": learner.basis_counts,
        "step_s": times[len(times) // 2],
        "step_cpu_s": cpu[len(cpu) // 2],
        "predict_s": predict_s,
        "base_mb": base,
        "peak_mb": peak,
        "step_growth_mb": (peak - base) if (peak is not None and base is not None) else None,
    }


def _child(queue: Any, threads: int, args: tuple[Any, ...]) -> None:
    set_threads(threads)
    try:
        queue.put(("ok", bench_one(*args)))
    except Exception as err:  # reported by the parent with the configuration's name
        queue.put(("error", f"{type(err).__name__}: {err}"))


def run_isolated(name: str, sizes: dict[str, Any], device: str, dtype: torch.dtype, repeats: int) -> dict[str, Any]:
    """:func:`bench_one` in a fresh process (spawned: no inherited allocations or CUDA state)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, torch.get_num_threads(), (name, sizes, device, dtype, repeats)))
    proc.start()
    status, payload = queue.get()
    proc.join()
    if status != "ok":
        raise InputError(f"bench learners: {name} {sizes} failed: {payload}")
    return payload


def _fmt_mb(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}"


def bench_learners(
    device: str = "cpu", dtype: str | torch.dtype | None = None, repeats: int = 3, only: list[str] | None = None,
    out: str | Path | None = None,
) -> tuple[RunDir, dict[str, Any]]:
    """Time every configuration (or those named in ``only``), each in a fresh process; print the
    table and the M_alpha scaling ratio; write ``bench.json`` and ``report.md`` into a run folder."""
    device = str(resolve_device(device))
    dtype = resolve_dtype(dtype, device)
    if repeats < 1:
        raise InputError(f"--repeats must be >= 1, got {repeats}")
    names = list(CONFIGS) if not only else only
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise InputError(f"--only: unknown configuration(s) {unknown}; choose from {list(CONFIGS)}")
    cuda = device.startswith("cuda")
    run = RunDir.create("bench-learners", {"device": device, "dtype": dtype_name(dtype), "repeats": repeats, "N_m": N_M,
                                           "D": D, "P": P, "threads": torch.get_num_threads()}, out)
    mem = "CUDA allocator" if cuda else "process RSS"
    print(f"{'configuration':20s} {'ms/step':>10s} {'CPU ms':>10s} {'predict ms':>10s} {'base MB':>8s} {'peak MB':>8s} {'step +MB':>8s}   ({mem})", flush=True)
    results = {}
    for key in names:
        name, sizes = CONFIGS[key]
        r = run_isolated(name, sizes, device, dtype, repeats)
        results[key] = r
        run.log(config=key, **r)
        print(f"{key:20s} {r['step_s'] * 1e3:10.1f} {r['step_cpu_s'] * 1e3:10.1f} {r['predict_s'] * 1e3:10.1f} {_fmt_mb(r['base_mb']):>8s} {_fmt_mb(r['peak_mb']):>8s} "
              f"{_fmt_mb(r['step_growth_mb']):>8s}", flush=True)
    summary: dict[str, Any] = {"results": results, "memory": mem}
    if "svdgp-4096" in results and "svdgp-16384" in results:
        # on the CPU the process time is the one to compare: wall time also counts what
        # other processes on a shared machine take (the step uses the configured threads)
        key = "step_s" if cuda else "step_cpu_s"
        ratio = results["svdgp-16384"][key] / results["svdgp-4096"][key]
        wall_ratio = results["svdgp-16384"]["step_s"] / results["svdgp-4096"]["step_s"]
        summary["svdgp_ratio_16384_over_4096"] = ratio
        summary["svdgp_wall_ratio_16384_over_4096"] = wall_ratio
        print(f"SVDGP step time ratio M_alpha 16384 / 4096 ({'wall' if key == 'step_s' else 'CPU'} time): {ratio:.2f} "
              f"(linear: 4.0, limit 4.5) -> {'ok' if ratio <= 4.5 else 'TOO HIGH'}; wall-time ratio {wall_ratio:.2f}")
    run.write_json("bench.json", summary)
    lines = [f"# gpdyn bench learners ({device}, {dtype_name(dtype)}, N_m={N_M}, D={D}, P={P}, "
             f"{torch.get_num_threads()} thread(s))", "",
             f"Memory: {mem}; base = before the timed steps, peak = during them, step = peak - base.", "",
             "| configuration | ms/step (wall) | CPU ms/step | predict ms (N_m points) | base MB | peak MB | step MB |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {k} | {r['step_s'] * 1e3:.1f} | {r['step_cpu_s'] * 1e3:.1f} | {r['predict_s'] * 1e3:.1f} | {_fmt_mb(r['base_mb'])} | {_fmt_mb(r['peak_mb'])} | "
              f"{_fmt_mb(r['step_growth_mb'])} |" for k, r in results.items()]
    if "svdgp_ratio_16384_over_4096" in summary:
        lines += ["", f"SVDGP M_alpha 16384/4096 step-time ratio: {summary['svdgp_ratio_16384_over_4096']:.2f} (limit 4.5; "
                  f"{'wall' if cuda else 'CPU'} time; wall-time ratio {summary['svdgp_wall_ratio_16384_over_4096']:.2f})"]
    (run.path / "report.md").write_text("\n".join(lines) + "\n")
    print(f"run folder: {run.path}")
    return run, summary
