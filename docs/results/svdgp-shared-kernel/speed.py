"""Speed of SVDGP's prediction with ``shared_kernel=True`` against the per-output model, in one process.

The small preset (M_alpha = 512, M_beta = 64) on walker-1's sizes (D = 23, P = 9), float32,
one torch thread, every basis function in place (``gpdyn.experiments.bench_mpc.filled_learner``):

- ``per output``: distinct length scales per output, as training leaves them (one kernel per output);
- ``fresh``: the per-output model before training (every output shares its starting values);
- ``shared kernel``: ``shared_kernel=True``, outputs given distinct amplitudes (its one kernel stays).

CPU time of this process (``time.process_time``): ``predict_mean`` and ``predict`` at N = 1000
points, the three models timed in turn, round after round (median over rounds), then MPPI
planning steps (K = 1000, H = 30, the bench's ``planning_seconds``: two steps after a warm-up
one) per model and mode, again in turn over five rounds (median over rounds). Last, one
training step (SVDGP Algorithm 1's Adam step) of the ``cpu`` preset (M_alpha = 1024,
M_beta = 64, N_c = 256) in float64 on a minibatch of 512, per output against shared kernel,
in turn over rounds (median).

    .venv/bin/python docs/results/svdgp-shared-kernel/speed.py [OUT.json]
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from gpdyn.control.mpc import MPCConfig
from gpdyn.device import device_name, set_threads
from gpdyn.experiments.bench_mpc import filled_learner, filled_model, planning_seconds
from gpdyn.robots.legged import TorchPolicy
from gpdyn.robots.policy import load_policy

N, ROUNDS, CALLS, PLAN_ROUNDS, PLAN_REPEATS = 1000, 15, 5, 5, 2
MODELS = {"per output": (True, None), "fresh": (False, None), "shared kernel": (True, {"shared_kernel": True})}


def main(out: str | None = None) -> dict:
    set_threads(1)
    cpu, dtype = torch.device("cpu"), torch.float32
    learners = {k: filled_learner("svdgp", cpu, dtype, "small", 0, distinct, opts) for k, (distinct, opts) in MODELS.items()}
    x = torch.randn(N, 23, generator=torch.Generator().manual_seed(1)).to(dtype)
    for name, learner in learners.items():
        learner.predict_mean(x)
        shared = learner._cache["fa"].dim() == 2
        print(f"{name}: one kernel for all outputs: {shared}")
    times: dict[str, dict[str, list[float]]] = {k: {"predict_mean": [], "predict": []} for k in learners}
    with torch.no_grad():
        for _ in range(ROUNDS):
            for name, learner in learners.items():
                for what, fn in (("predict_mean", learner.predict_mean), ("predict", learner.predict)):
                    t0 = time.process_time()
                    for _ in range(CALLS):
                        fn(x)
                    times[name][what].append((time.process_time() - t0) / CALLS)
    result: dict = {"N": N, "D": 23, "P": 9, "preset": "small", "dtype": "float32", "threads": torch.get_num_threads(),
                    "cpu": device_name(cpu), "torch": torch.__version__, "rounds": ROUNDS, "calls_per_round": CALLS,
                    "predict_ms": {}, "planning": {}}
    for name in learners:
        result["predict_ms"][name] = {w: 1e3 * statistics.median(v) for w, v in times[name].items()}
    proposal = TorchPolicy(load_policy(), cpu, dtype)
    modes = {"mean": MPCConfig(horizon=30, samples=1000, uncertainty="mean"),
             "mean+variance": MPCConfig(horizon=30, samples=1000, uncertainty="penalty", var_weight=1.0)}
    dyns = {name: filled_model("svdgp", cpu, dtype, 0, "small", distinct, opts) for name, (distinct, opts) in MODELS.items()}
    plan: dict[str, dict[str, list[float]]] = {name: {m: [] for m in modes} for name in dyns}
    for _ in range(PLAN_ROUNDS):  # the models in turn, round after round: load on the machine hits all alike
        for name, dyn in dyns.items():
            for m, cfg in modes.items():
                plan[name][m].append(planning_seconds(dyn, proposal, cfg, PLAN_REPEATS, cpu, dtype))
    result["planning_rounds"], result["planning_steps_per_round"] = PLAN_ROUNDS, PLAN_REPEATS
    result["planning"] = {name: {m: statistics.median(v) for m, v in modes_.items()} for name, modes_ in plan.items()}
    result["step_ms"] = step_ms()
    base = result["predict_ms"]["per output"]
    for name, r in result["predict_ms"].items():
        p = result["planning"][name]
        print(f"{name:14s} predict_mean {r['predict_mean']:7.2f} ms ({base['predict_mean'] / r['predict_mean']:.2f}x)  "
              f"predict {r['predict']:7.2f} ms ({base['predict'] / r['predict']:.2f}x)  planning mean "
              f"{p['mean']:.3f} s/step = {1 / p['mean']:.2f} steps/s, mean+variance {1 / p['mean+variance']:.2f} steps/s")
    s = result["step_ms"]
    print(f"training step (cpu preset, float64, N_m = 512): per output {s['per output']:.1f} ms, shared kernel "
          f"{s['shared kernel']:.1f} ms ({s['per output'] / s['shared kernel']:.2f}x)")
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
    return result


def step_ms(rounds: int = 5, steps: int = 3) -> dict[str, float]:
    """CPU ms per ``step`` of the cpu-preset SVDGP, per output and shared kernel, full bases."""
    from gpdyn.gp import make_learner

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 23, generator=g, dtype=torch.float64)
    y = torch.randn(2048, 9, generator=g, dtype=torch.float64)
    learners = {}
    for name, opts in (("per output", {}), ("shared kernel", {"shared_kernel": True})):
        learner = make_learner("svdgp", 23, 9, preset="cpu", **opts)
        learner.set_n_delta(1024)
        learner.observe(x[:1024], y[:1024])
        learner.observe(x[1024:], y[1024:])
        learner.step(x[:512], y[:512])  # warm-up
        learners[name] = learner
    times: dict[str, list[float]] = {k: [] for k in learners}
    for _ in range(rounds):
        for name, learner in learners.items():
            t0 = time.process_time()
            for _ in range(steps):
                learner.step(x[:512], y[:512])
            times[name].append((time.process_time() - t0) / steps)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
