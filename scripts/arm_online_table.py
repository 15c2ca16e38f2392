"""The arm table of docs/control.md: online models for computed-torque tracking over fresh seeds.

For every plant change and every online model, one ``control kuka`` (or ``control arm``) run per
seed with the ``online`` controller alone, on one store per seed collected as the run itself
would (``collect_arm`` with the run's settings); prints a markdown table of the tracking RMSE
after the change (median and worst over the seeds) and the controller's CPU time per step
(mean and worst episode's 95th percentile), and writes it with the per-seed rows as CSV under
``--out``. ``--merge`` tables the ``runs.csv`` of several such folders (seeds run in parallel).

    python scripts/arm_online_table.py --seeds 1000-1004 --out /tmp/a &
    python scripts/arm_online_table.py --seeds 1005-1009 --out /tmp/b
    python scripts/arm_online_table.py --merge /tmp/a /tmp/b --out docs/results/arm-online
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from gpdyn.experiments.arm_config import ArmRunConfig
from gpdyn.experiments.control_arm import run_arm
from gpdyn.runs import RunDir

# online model -> ArmRunConfig fields (adapt rigid-body throughout: the rigid-body filter, its GP frozen or learning)
# (the GP of the joint angles in the filter's state only where the name says "angle-gp")
MODELS = {
    "filter": {"learner": "wiski", "gp_online": False},  # the rigid-body filter alone learns (the GP is frozen)
    "filter+wiski": {"learner": "wiski", "gp_online": True},
    "filter+svdgp": {"learner": "svdgp", "gp_online": True},
    "filter+svdgp-stream": {"learner": "svdgp-stream", "gp_online": True},
    "filter+angle-gp": {"learner": "wiski", "gp_online": False, "angle_gp_points": 6},
    "filter+angle-gp+wiski": {"learner": "wiski", "gp_online": True, "angle_gp_points": 6},  # filter+wiski and the GP
    "filter+angle-gp+svdgp-stream": {"learner": "svdgp-stream", "gp_online": True, "angle_gp_points": 6},
}
MODELS = {name: {"angle_gp_points": 0, **fields} for name, fields in MODELS.items()}
STORED_START = "@stored-start"  # a model name's suffix: its filter starts from the stored samples (--start-filter)


def model_fields(name: str) -> dict:
    """The ArmRunConfig fields of a model name: one of MODELS, optionally with STORED_START."""
    base = name.removesuffix(STORED_START)
    if base not in MODELS:
        raise SystemExit(f"--models: unknown model {name!r}; known: {', '.join(MODELS)} (each also with {STORED_START})")
    return {**MODELS[base], **({"start_filter": True} if name.endswith(STORED_START) else {})}


CHANGES = {"payload": {"change": "payload"}, "joint-friction": {"change": "joint-friction"},
           "motor-gain": {"change": "motor-gain"}, "joint-spring": {"change": "joint-spring"}}


def seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def one(cfg: ArmRunConfig, store: Path, work: Path) -> dict[str, float]:
    run = RunDir.create("t", {}, out=Path(tempfile.mkdtemp(dir=work)) / "run")
    result = run_arm(run, cfg, store)
    episode = next(r for r in run.metrics() if r.get("kind") == "episode")
    return {"after": float(np.mean(result["rmse"]["online"]["after"])),
            "before": float(np.mean(result["rmse"]["online"]["before"])),
            "cpu_ms": episode["cpu_ms_per_step"], "cpu_ms_p95": episode["cpu_ms_per_step_p95"],
            "online_learner": episode.get("online_learner"), "gp_updates": episode.get("gp_updates")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1000-1009", help="first-last seed (default 1000-1009, never tuned on)")
    ap.add_argument("--changes", default=",".join(CHANGES), help="comma list of %s" % ", ".join(CHANGES))
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma list of the model names (see MODELS; NAME{STORED_START}: the filter starts from the stored samples)")
    ap.add_argument("--model", default=None, help="MJCF file of the arm (default: the shipped iiwa, `control kuka`)")
    ap.add_argument("--payload", type=float, default=3.0, help="the payload change's mass in kg (default 3)")
    ap.add_argument("--out", type=Path, required=True, help="folder for table.md and runs.csv")
    ap.add_argument("--merge", type=Path, nargs="+", default=None, help="table the runs.csv of these folders instead")
    args = ap.parse_args(argv)
    for model in args.models.split(","):  # refused before any run
        model_fields(model)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        rows = [r for folder in args.merge for r in csv.DictReader(open(folder / "runs.csv"))]
        for r in rows:
            r.update({k: float(r[k]) for k in ("after", "before", "cpu_ms", "cpu_ms_p95")}, seed=int(r["seed"]))
    else:
        rows = run_all(args)
    with open(args.out / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    changes, models = list(dict.fromkeys(r["change"] for r in rows)), list(dict.fromkeys(r["model"] for r in rows))
    ran = sorted({r["seed"] for r in rows})
    lines = [f"Seeds {ran[0]}-{ran[-1]} ({len(ran)}), the `online` controller of `control {rows[0]['robot']}`; RMSE after "
             "the change, mean over the joints [rad]; CPU time per control step of the controller [ms].", "",
             "| change | online model | after: median | after: worst | before: median | CPU ms: mean | CPU ms: worst p95 |",
             "|---|---|---|---|---|---|---|"]
    for change in changes:
        for model in models:
            rs = [r for r in rows if r["change"] == change and r["model"] == model]
            if not rs:  # a model run on some changes only
                continue
            after = [r["after"] for r in rs]
            lines.append(f"| {change} | {model} | {np.median(after):.4f} | {np.max(after):.4f} | "
                         f"{np.median([r['before'] for r in rs]):.4f} | {np.mean([r['cpu_ms'] for r in rs]):.2f} | "
                         f"{np.max([r['cpu_ms_p95'] for r in rs]):.2f} |")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def run_all(args: argparse.Namespace) -> list[dict]:
    """Every (change, model, seed) run; one store per seed."""
    from gpdyn.sim.arm import collect_arm

    torch.set_num_threads(1)
    robot = "arm" if args.model else "kuka"
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for seed in seeds(args.seeds):
            base = ArmRunConfig.of(robot=robot, model=args.model, seed=seed, progress=False)
            store = Path(work) / f"{seed}.zarr"  # what run_arm collects when given no store
            collect_arm(store, offline=base.model.offline, online=max(100, base.model.offline // 10),
                        family=base.reference.family, seed=seed,
                        arm=base.arm(), rate_hz=base.reference.rate_hz, progress=False)
            for change in args.changes.split(","):
                for model in args.models.split(","):
                    cfg = ArmRunConfig.of(robot=robot, model=args.model, seed=seed, controllers=("online",),
                                          progress=False,
                                       payload=args.payload, **CHANGES[change], **model_fields(model))
                    r = one(cfg, store, Path(work))
                    rows.append({"robot": robot, "change": change, "model": model, "seed": seed, **r})
                    print(f"{change:15s} {model:32s} seed {seed}: after {r['after']:.5f} rad, "
                          f"{r['cpu_ms']:.2f} ms/step", file=sys.stderr, flush=True)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
