"""The SARCOS summary table of docs/results/README.md from the replay run folders.

Reads ``final.csv`` of each run folder given (one per protocol) and prints one markdown
row per learner and protocol: nMSE, NLL, MSLL and 95% coverage as mean ± std over the
seven torques, then joint 1 alone (column ``tau0[t]``), the output that Rasmussen &
Williams (2006, Sec. 2.5) report SMSE and MSLL for. nMSE is GPML's SMSE (the mean
squared error over the variance of the test targets).

With ``--store``, each protocol also gets a row ``linear``: least squares on the same
split with a Gaussian noise of the training residuals' variance, the reference GPML
Sec. 2.5 gives beside its GP (its linear regression: SMSE 0.075 on joint 1).

    python scripts/sarcos_table.py docs/results/sarcos-iid-cpu docs/results/sarcos-block-cpu \
        --store data/sarcos-test.zarr
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from gpdyn.errors import InputError

METRICS = ("nmse", "nll", "msll", "coverage")
JOINT_1 = "tau0[t]"
Table = dict[str, dict[str, dict[str, float]]]  # learner -> metric -> {"mean", "std", JOINT_1}


def read_final(folder: Path) -> tuple[dict, Table]:
    """The run's config and ``{learner: {metric: {"mean", "std", JOINT_1}}}`` from its final.csv."""
    from gpdyn.runs import RunDir

    config = RunDir(folder).config()
    final = folder / "final.csv"
    if not final.is_file():
        raise InputError(f"{final}: no such file (`gpdyn replay` and `gpdyn report` write it)")
    table: Table = {}
    with final.open(newline="") as f:
        for row in csv.DictReader(f):
            if row.get("metric") in METRICS:
                values = {k: float(row[k]) for k in ("mean", "std", JOINT_1)}
                table.setdefault(row["learner"], {})[row["metric"]] = values
    if not table:
        raise InputError(f"{final}: no rows of the metrics {', '.join(METRICS)}")
    return config, table


def linear_reference(store: Path, config: dict) -> dict[str, dict[str, float]]:
    """Least squares with a bias on the run's own split, scored like the learners (per output, then mean ± std)."""
    from gpdyn.data.problems import load_problem

    problem = load_problem(store, config["problem"], protocol=config["protocol"], seed=config["seed"])
    design = np.column_stack([problem.x_train, np.ones(len(problem.x_train))])
    weights, *_ = np.linalg.lstsq(design, problem.y_train, rcond=None)
    noise = (problem.y_train - design @ weights).var(axis=0)
    mean = np.column_stack([problem.x_test, np.ones(len(problem.x_test))]) @ weights
    y = problem.y_test

    def nll(centre: np.ndarray, var: np.ndarray) -> np.ndarray:
        return (0.5 * np.log(2 * np.pi * var) + 0.5 * (y - centre) ** 2 / var).mean(axis=0)

    z = 1.959963984540054  # the central 95% interval of a Gaussian
    per_output = {
        "nmse": ((y - mean) ** 2).mean(axis=0) / y.var(axis=0),
        # NLL in the units the replay reports use: outputs normalised by the training sd
        "nll": nll(mean, noise) - np.log(problem.y_train.std(axis=0, ddof=1)),
        "msll": nll(mean, noise) - nll(problem.y_train.mean(axis=0), problem.y_train.var(axis=0, ddof=1)),
        "coverage": (np.abs(y - mean) <= z * np.sqrt(noise)).mean(axis=0),
    }
    return {m: {"mean": float(v.mean()), "std": float(v.std()), JOINT_1: float(v[0])} for m, v in per_output.items()}


def markdown(runs: list[tuple[str, Table]]) -> str:
    lines = [
        "| learner | protocol | nMSE | NLL | MSLL | 95% coverage | joint 1 nMSE | joint 1 MSLL |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    learners = list(dict.fromkeys(name for _, table in runs for name in table))
    for learner in learners:
        for protocol, table in runs:
            metrics = table.get(learner)
            if metrics is None or any(m not in metrics for m in METRICS):
                continue
            cells = [f"{metrics[m]['mean']:.4g} ± {metrics[m]['std']:.2g}" for m in METRICS]
            joint = [f"{metrics[m][JOINT_1]:.4g}" for m in ("nmse", "msll")]
            lines.append(f"| {learner} | {protocol} | " + " | ".join(cells + joint) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path, help="replay run folders (final.csv, config.json)")
    p.add_argument("--store", type=Path, default=None,
                   help="the runs' store: add the least-squares reference on each run's split")
    args = p.parse_args(argv)
    runs = []
    try:
        for folder in args.folders:
            config, table = read_final(folder)
            if args.store is not None:
                table["linear"] = linear_reference(args.store, config)
            runs.append((config.get("protocol", "?"), table))
    except InputError as err:
        print(f"sarcos_table: error: {err}", file=sys.stderr)
        return 2
    print(markdown(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
