"""Planner overhead before and after, and pytorch-mppi, in one process (docs/results/mppi-peer/report.md).

    python scripts/mppi_ab_planner.py [--base dc721a3] [--steps 20] [--out DIR]

The baseline is gpdyn/control/mpc.py at ``--base`` (read with ``git show``, loaded as its own
module) with the TRPO proposal as it was there (``FastTanh`` in place of ``tanh``); the new one
is the working tree's. Each case builds both planners (and pytorch-mppi's where it applies) on
the same model, cost and sizes (K = 1000, H = 30, float32, one torch thread) and times them
alternately, one planning step at a time, after one warm-up step each, with
``gpdyn.device.seconds`` (process CPU time). Prints a markdown table; writes ab.json to --out.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from gpdyn.control import mpc as new_mpc
from gpdyn.device import seconds
from gpdyn.experiments.bench_mpc import DoubleIntegrator, TrackingCost, import_peer
from gpdyn.robots.walker import ACTION_HIGH, ACTION_LOW, NU, NX, TorchPolicy, WalkerCost, _fast_activations
from gpdyn.sim.policy import load_policy


def baseline_module(base: str):
    """gpdyn/control/mpc.py at commit ``base``, imported as ``mpc_base``."""
    root = Path(__file__).resolve().parents[3]
    text = subprocess.run(["git", "show", f"{base}:gpdyn/control/mpc.py"], cwd=root, check=True, capture_output=True,
                          text=True).stdout
    path = Path(tempfile.mkdtemp()) / "mpc_base.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("mpc_base", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["mpc_base"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="dc721a3", help="the baseline commit (default dc721a3)")
    ap.add_argument("--steps", type=int, default=20, help="timed planning steps per planner and case")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dtype, k, h = torch.float32, 1000, 30
    old_mpc = baseline_module(args.base)
    policy = load_policy()
    new_policy = TorchPolicy(policy, "cpu", dtype)
    old_policy = TorchPolicy(policy, "cpu", dtype)
    old_policy.net = _fast_activations(copy.deepcopy(policy.net)).to(dtype=dtype).eval()  # as at the baseline
    state = torch.zeros(NX, dtype=dtype)
    state[1] = 1.25
    bounds = ([ACTION_LOW] * NU, [ACTION_HIGH] * NU)
    tracking = TrackingCost()

    def tracking_with_done(x, a, nxt):  # the baseline needs a terminated mask
        return tracking.step(nxt, a), torch.zeros(a.shape[0], dtype=torch.bool)

    identity = lambda x, a: x  # noqa: E731
    trivial = DoubleIntegrator(torch.device("cpu"), dtype)
    cases = [  # name, model, (baseline cost, new cost), (baseline proposal, new proposal), extra config
        ("planner alone as in bench mpc (identity model, Gym-reward cost, TRPO proposal on half)", identity,
         (WalkerCost(), WalkerCost()), (old_policy, new_policy), {}),
        ("identity model, Gym-reward cost, no proposal", identity, (WalkerCost(), WalkerCost()), (None, None), {}),
        ("double integrator, tracking cost, no proposal (the peer's setting)", trivial,
         (tracking_with_done, tracking), (None, None), {"control_cost": 1.0, "noise_std": 0.3}),
    ]
    try:
        PeerMPPI = import_peer("pytorch-mppi")
    except Exception:  # noqa: BLE001  the peer column stays empty without it
        PeerMPPI = None
    rows = []
    for name, model, costs, proposals, extra in cases:
        planners = {}
        for label, module, cost, proposal in (("baseline", old_mpc, costs[0], proposals[0]),
                                              ("new", new_mpc, costs[1], proposals[1])):
            cfg = module.MPCConfig(horizon=h, samples=k, uncertainty="mean", **extra)
            planner = module.make_planner("mppi", model, cost, *bounds, cfg, proposal=proposal, dtype=dtype)
            planners[label] = lambda p=planner: p.plan(state)
        if "control_cost" in extra:  # the new planner with the baseline's cost (a terminated mask of zeros)
            cfg = new_mpc.MPCConfig(horizon=h, samples=k, uncertainty="mean", **extra)
            planner = new_mpc.make_planner("mppi", model, costs[0], *bounds, cfg, dtype=dtype)
            planners["new, cost with a mask"] = lambda p=planner: p.plan(state)
        if PeerMPPI is not None and proposals[1] is None and "control_cost" in extra:
            torch.manual_seed(0)
            sigma = torch.eye(NU, dtype=dtype) * extra["noise_std"] ** 2
            peer = PeerMPPI(model, tracking.step, NX, sigma, num_samples=k, horizon=h, lambda_=1.0,
                            u_min=torch.full((NU,), ACTION_LOW, dtype=dtype), u_max=torch.full((NU,), ACTION_HIGH, dtype=dtype))
            planners["pytorch-mppi"] = lambda p=peer: p.command(state)
        times = {label: [] for label in planners}
        with torch.no_grad():
            for fn in planners.values():
                fn()
            for _ in range(args.steps):
                for label, fn in planners.items():
                    times[label].append(seconds(fn, "cpu", 1))
        ms = {label: 1e3 * sum(t) / len(t) for label, t in times.items()}
        row = {"case": name, "steps": args.steps, **{f"{label}_ms": v for label, v in ms.items()},
               "new_over_baseline": ms["new"] / ms["baseline"]}
        if "new, cost with a mask" in ms:
            row["new_masked_over_peer"] = ms["new, cost with a mask"] / ms.get("pytorch-mppi", float("nan"))
        if "pytorch-mppi" in ms:
            row["baseline_over_peer"] = ms["baseline"] / ms["pytorch-mppi"]
            row["new_over_peer"] = ms["new"] / ms["pytorch-mppi"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    lines = [f"| case | baseline ({args.base}) CPU-ms/step | new CPU-ms/step | new / baseline | new, cost with a mask "
             "| pytorch-mppi CPU-ms/step | baseline / peer | new / peer | new with a mask / peer |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        masked = f"{r['new, cost with a mask_ms']:.2f}" if "new, cost with a mask_ms" in r else ""
        peer = (f"{r['pytorch-mppi_ms']:.2f} | {r['baseline_over_peer']:.2f} | {r['new_over_peer']:.2f} | "
                f"{r['new_masked_over_peer']:.2f}" if "pytorch-mppi_ms" in r else " | | | ")
        lines.append(f"| {r['case']} | {r['baseline_ms']:.2f} | {r['new_ms']:.2f} | {r['new_over_baseline']:.2f} | "
                     f"{masked} | {peer} |")
    print("\n".join(lines))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ab.json").write_text(json.dumps({"base": args.base, "K": k, "H": h, "dtype": "float32",
                                                      "threads": 1, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
