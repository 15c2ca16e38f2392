"""``gpdyn bench mpc``: MPC control steps per second with learned Walker2d models.

One control step is one :meth:`~gpdyn.control.mpc.Planner.plan` call: K sampled sequences
of H steps through the learned walker-1 dynamics (H batched ``predict`` calls on K
points), the Walker2d cost and the TRPO proposal. Models: SVDGP with M_alpha = 128^2
(M_beta = 128, the paper's sizes) and WISKI (its defaults: 16 x 16 grid on a learned 2-D
projection per output), both with full bases, on random normalised inputs (the cost of
``predict`` does not depend on the values). Walker2d real time is 125 control steps per
second (dt = 8 ms); the table gives the ratio.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpdyn.control.dynamics import LearnedDynamics
from gpdyn.control.mpc import MPCConfig, make_planner
from gpdyn.data.problems import Normalizer
from gpdyn.device import resolve_device, sync
from gpdyn.errors import InputError
from gpdyn.gp import make_learner
from gpdyn.robots.walker import ACTION_HIGH, ACTION_LOW, DT, LAYOUT, NU, NX, TorchPolicy, WalkerCost
from gpdyn.runs import RunDir

REAL_TIME_HZ = 1.0 / DT  # 125 control steps per second
BENCH_MODELS = ("svdgp", "wiski")  # at their "paper" preset


def filled_model(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LearnedDynamics:
    """A walker-1 model of bench size with every basis function in place (random inputs)."""
    d, p = LAYOUT.input_dim, LAYOUT.nv
    learner = make_learner(name, d, p, preset="paper", device=device, dtype=dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    n = 2048
    per_round = n // 2 if learner.can("n_delta") else n
    if learner.can("n_delta"):
        learner.set_n_delta(per_round)  # fill the bases in a few rounds
    rounds = max(1, -(-max(learner.basis_capacity.values(), default=n) // per_round))
    for _ in range(rounds):
        x = torch.randn(n, d, generator=gen, dtype=dtype).to(device)
        y = torch.randn(n, p, generator=gen, dtype=dtype).to(device)
        learner.observe(x, y)
    normalizer = Normalizer(np.zeros(d), np.ones(d), np.zeros(p), np.ones(p))
    return LearnedDynamics.from_learner(learner, normalizer, LAYOUT)


def bench_mpc(
    models: list[str], samples: int, horizon: int, repeats: int, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> list[dict[str, Any]]:
    """Seconds per control step and steps per second for each model."""
    from gpdyn.sim.policy import load_policy

    proposal = TorchPolicy(load_policy(), device, dtype)
    cfg = MPCConfig(horizon=horizon, samples=samples, uncertainty="penalty", var_weight=1.0)
    state = torch.zeros(NX, device=device, dtype=dtype)
    state[1] = 1.25  # standing height: the rollouts stay healthy
    rows = []
    for name in models:
        dyn = filled_model(name, device, dtype, seed)
        planner = make_planner("mppi", dyn, WalkerCost(), [ACTION_LOW] * NU, [ACTION_HIGH] * NU, cfg, proposal=proposal,
                               device=device, dtype=dtype, seed=seed)
        planner.plan(state)  # warm-up: caches, allocator
        sync(device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            planner.plan(state)
        sync(device)
        sec = (time.perf_counter() - t0) / repeats
        rows.append({"model": name, "device": str(device), "dtype": str(dtype).replace("torch.", ""), "K": samples,
                     "H": horizon, "seconds_per_step": sec, "steps_per_second": 1.0 / sec,
                     "real_time_ratio": (1.0 / sec) / REAL_TIME_HZ})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`bench_mpc`'s rows."""
    lines = ["| model | device | dtype | K | H | s/step | steps/s | x real time (125/s) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['device']} | {r['dtype']} | {r['K']} | {r['H']} | {r['seconds_per_step']:.3f} "
                     f"| {r['steps_per_second']:.3g} | {r['real_time_ratio']:.3g} |")
    return "\n".join(lines)


def run_benchmark(
    models: list[str] | None = None, samples: int = 1000, horizon: int = 30, repeats: int = 1,
    device: str | torch.device = "cpu", out: str | Path | None = None,
) -> RunDir:
    """``gpdyn bench mpc``: the planning-rate table of ``models`` (default all of
    :data:`BENCH_MODELS`) into a run folder's ``report.md`` and on screen."""
    device = resolve_device(device)
    models = list(models or BENCH_MODELS)
    bad = [m for m in models if m not in BENCH_MODELS]
    if bad or samples < 2 or horizon < 1 or repeats < 1:
        raise InputError(f"bench mpc: models from {', '.join(BENCH_MODELS)} (got {bad}), samples >= 2, horizon >= 1, repeats >= 1")
    dtype = torch.float32  # the hot path of a controller; float64 doubles memory and time
    MPCConfig(horizon=horizon, samples=samples).check_memory(NX, NU, dtype, device)  # before the run folder
    run = RunDir.create("bench-mpc", {"models": models, "samples": samples, "horizon": horizon, "repeats": repeats,
                                      "device": str(device), "dtype": "float32", "threads": torch.get_num_threads()},
                        out=out)
    print(f"gpdyn bench mpc: run folder {run.path}")
    rows = bench_mpc(models, samples, horizon, repeats, device, dtype)
    for r in rows:
        run.log(**r)
    text = table(rows)
    (run.path / "report.md").write_text(f"# MPC planning rate\n\nWalker2d real time: {REAL_TIME_HZ:.0f} control steps/s.\n\n{text}\n")
    print(text)
    return run


__all__ = ["BENCH_MODELS", "REAL_TIME_HZ", "bench_mpc", "filled_model", "run_benchmark", "table"]
