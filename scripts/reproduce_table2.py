"""Reproduce SVDGP Table 2 (KUKA1 and MUJOCO1 columns) with `gpdyn replay`.

Collects the two datasets if they are missing (the KUKA1-like simulated arm stream and
1,000 Walker2d episodes of the shipped TRPO policy), then replays every learner of the
paper's comparison on each under one seed, and copies each run's report, CSV files and
plots to ``docs/results/<dataset>/``.

    python scripts/reproduce_table2.py --scale paper   # T = 2000 and the paper's sizes (a GPU)
    python scripts/reproduce_table2.py --scale cpu     # reduced T and sizes for a 2-core CPU

``--select-lr 0.1,0.01,0.001`` picks each learner's gamma_0 as the paper does (the best
objective after ``--select-iterations`` = 100 iterations); without it every learner
uses its preset's. ``--iterations`` overrides the scale's T and ``--name`` the results
folder (default ``<dataset>-<scale>``).

The scales are written into each report's config, so every number says what made it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from gpdyn.device import resolve_device
from gpdyn.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
LEARNERS = ["svdgp", "svi", "ivsgpr", "vsgpr", "gpr", "orthnat", "wiski"]

# The protocol at each scale; the learners' sizes are their presets of the same name
# (``paper``: SVDGP Appendix B; ``cpu``: what fits a 2-core CPU in well under an hour
# per dataset, with the ratios between the models' sizes kept).
SCALES = {
    "paper": {"iterations": 2000, "batch_size": 1024, "n_delta": 128, "eval_every": 100},
    "cpu": {"iterations": 300, "batch_size": 512, "n_delta": 64, "eval_every": 25},
}
DATASETS = {
    # name: (store, problem, how to collect it, held-out rows scored at the CPU scale)
    "kuka1": ("data/kuka1.zarr", "kuka", ["collect", "kuka", "--store", "data/kuka1.zarr"], None),
    # walker-1's held-out split is 97k rows: scoring seven learners on all of it every 25
    # iterations would cost more than their training on a 2-core CPU
    "walker1": ("data/walker1000.zarr", "walker-1",
                ["collect", "walker", "--store", "data/walker1000.zarr", "--episodes", "1000", "--envs", "2"], 10000),
}


def gpdyn(*args: str) -> None:
    exe = Path(sys.executable).parent / "gpdyn"
    subprocess.run([str(exe), *args], cwd=ROOT, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=tuple(SCALES), default="cpu", help="protocol and learner preset (default cpu)")
    parser.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated: kuka1, walker1")
    parser.add_argument("--learners", default=",".join(LEARNERS))
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:INDEX (default cpu)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=None, help="T (default: the scale's)")
    parser.add_argument("--select-lr", default=None, help="gamma_0 candidates per learner, e.g. 0.1,0.01,0.001")
    parser.add_argument("--select-iterations", type=int, default=100)
    parser.add_argument("--name", default=None, help="results folder suffix (default: the scale)")
    args = parser.parse_args()
    try:
        # checked before the collections: a missing GPU should not surface an hour later in replay
        resolve_device(args.device)
    except InputError as err:
        parser.error(str(err))
    scale = SCALES[args.scale]
    learners = [s for s in args.learners.split(",") if s]
    for name in args.datasets.split(","):
        store, problem, collect, eval_rows = DATASETS[name]
        if not (ROOT / store).exists():
            gpdyn(*collect)
        tag = f"{name}-{args.name or args.scale}"
        out = ROOT / "logs" / f"table2-{tag}"
        replay = ["--store", store, "--problem", problem, "--learners", ",".join(learners),
                  "--iterations", str(args.iterations or scale["iterations"]), "--batch-size", str(scale["batch_size"]),
                  "--n-delta", str(scale["n_delta"]), "--eval-every", str(scale["eval_every"]),
                  "--preset", args.scale, "--seed", str(args.seed), "--device", args.device, "--out", str(out)]
        if eval_rows is not None and args.scale == "cpu":
            replay += ["--eval-rows", str(eval_rows)]
        if args.select_lr:
            replay += ["--select-lr", args.select_lr, "--select-iterations", str(args.select_iterations)]
        gpdyn("replay", *replay)  # resumes from out/ if an earlier run was interrupted
        target = ROOT / "docs" / "results" / tag
        target.mkdir(parents=True, exist_ok=True)
        for file in ("report.md", "curves.csv", "final.csv", "nmse.svg", "vlb.svg", "config.json", "step_size.json"):
            if (out / file).exists():  # step_size.json only with --select-lr
                shutil.copy2(out / file, target / file)
        print(f"reproduce_table2: {name} -> {target}")


if __name__ == "__main__":
    main()
