"""KUKA tracking through a 3 kg payload: every prior learner, several seeds, one table.

    .venv/bin/python scripts/kuka_table.py --out docs/results/kuka-payload --seeds 1,2,3

For each prior learner (``--learners``, default svdgp, wiski, exact) and seed, one
``gpdyn control kuka`` run of the ``kuka-payload`` recipe (400 steps at 100 Hz, 3 kg at
step 200) with that learner and seed with the controllers pd, true, frozen and online, written to
``OUT/runs/<learner>-s<seed>``. ``--variants`` adds online-only runs with other online
models (``isotropic-reset``: the rigid-body GP re-opening every parameter alike at a
detected change; ``residual``: the exact GP on the frozen model's residuals). Then
``OUT/report.md`` and ``OUT/results.json``: the tracking RMSE after the payload (mean over
joints) per controller, mean ± standard error over the seeds, the ratio of PD's to the
online model's, and the online model's CPU time per control step (feed-forward prediction
plus update; the control period is 10 ms).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from pathlib import Path

import numpy as np
import torch

from gpdyn.cli.logs import configure as configure_logs
from gpdyn.experiments.control_report import mean_se
from gpdyn.experiments.demo import control_stage
from gpdyn.runs import RunDir

VARIANTS = {"isotropic-reset": {"adapt": "rigid-body", "change_bodies": ()}, "residual": {"adapt": "residual"}}


def one_run(out: Path, name: str, **options) -> dict:
    """One run of the ``kuka-payload`` recipe with ``options`` over it (the demo's control stage)."""
    folder = out / "runs" / name
    t0 = time.perf_counter()
    summary = control_stage(folder, **options)
    steps = [r for r in RunDir(folder).metrics() if r.get("kind") == "step" and r.get("controller") == "online"]
    # CPU time of one control step of the online model: its feed-forward prediction and its update
    updates = [r["feedforward_seconds"] + r["update_seconds"] for r in steps if "update_seconds" in r]
    print(f"{name}: {time.perf_counter() - t0:.0f} s")
    return {"rmse_after": summary["rmse_after"], "rmse_before": summary["rmse_before"],
            "update_ms": [1e3 * float(np.mean(updates)), 1e3 * float(np.percentile(updates, 95))] if updates else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--learners", default="svdgp,wiski,exact")
    parser.add_argument("--variants", default="", help=f"comma-separated, of {', '.join(VARIANTS)} (svdgp prior)")
    args = parser.parse_args()
    configure_logs(logging.INFO, "kuka_table.py")  # gpdyn's messages and progress lines on stderr, as the command
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    learners = [s for s in args.learners.split(",") if s]
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        parser.error(f"--variants: unknown {bad}; choose from {', '.join(VARIANTS)}")
    results: dict[str, dict[int, dict]] = {}
    for learner in learners:
        results[learner] = {s: one_run(args.out, f"{learner}-s{s}", learner=learner, seed=s) for s in seeds}
    for variant in variants:
        results[f"svdgp/{variant}"] = {s: one_run(args.out, f"svdgp-{variant}-s{s}", learner="svdgp", seed=s,
                                                  controllers=("online",), **VARIANTS[variant]) for s in seeds}

    lines = ["# KUKA tracking through a 3 kg payload", "",
             f"`python scripts/kuka_table.py --out {args.out} --seeds {args.seeds} --learners {args.learners}"
             + (f" --variants {args.variants}`" if variants else "`"), "",
             f"{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, one torch thread; "
             f"seeds {args.seeds}; 400 steps at 100 Hz, +3 kg at step 200; tracking RMSE (rad, mean over the 7 joints) "
             "after the payload, mean ± s.e. over the seeds; CPU ms per control step of the online model, its "
             "feed-forward prediction and its update (mean / p95; the control period is 10 ms).", "",
             "| prior | pd | true | frozen | online | pd / online | online before | CPU ms per step |",
             "|---|---|---|---|---|---|---|---|"]
    for key, per_seed in results.items():
        runs = list(per_seed.values())
        cell = {c: mean_se([r["rmse_after"][c] for r in runs], 4) if c in runs[0]["rmse_after"] else ""
                for c in ("pd", "true", "frozen", "online")}
        online = np.mean([r["rmse_after"]["online"] for r in runs])
        pd = [r["rmse_after"]["pd"] for r in runs if "pd" in r["rmse_after"]]
        ratio = f"{np.mean(pd) / online:.0f}x" if pd else ""
        before = mean_se([r["rmse_before"]["online"] for r in runs], 4)
        ms = np.mean([r["update_ms"] for r in runs], axis=0)
        lines.append(f"| {key} | {cell['pd']} | {cell['true']} | {cell['frozen']} | {cell['online']} | {ratio} | "
                     f"{before} | {ms[0]:.1f} / {ms[1]:.1f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
