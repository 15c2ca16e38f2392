"""The WISKI table of docs/results/wiski-table: the paper's 2-D WISKI, the additive WISKI and SVI.

For each dataset it runs ``gpdyn replay`` twice on the same seeded iid minibatches (SVDGP
Algorithm 1, ``--preset cpu``, T iterations of N_m = 1024): once with ``wiski,svi`` (the
additive structure, WISKI's default for D > 2) and once with ``wiski`` alone at
``structure=single`` (the paper's learned 2-D projection per output, WISKI Sec. 5.1).
Every learner therefore sees the same T x 1024 streamed points. It then writes
``OUT/table.md`` (nMSE and NLL, mean ± std over outputs at the last iteration, the ratio
of each WISKI's nMSE to SVI's, the training wall seconds of the replay records),
``OUT/results.json`` (those figures and each learner's resolved options) and
``OUT/commands.txt`` (the commands it ran); the report around the table is written by hand.

    .venv/bin/python scripts/wiski_table.py --work /tmp/wiski --out docs/results/wiski-table \
        [--iterations 300] [--datasets sarcos,kuka,walker-1] [--size wiski.components=42 ...]

Stores are made under ``--work`` where missing: ``gpdyn import sarcos`` of
``--sarcos-file``, ``gpdyn collect kuka`` (defaults), ``gpdyn collect walker --episodes 20``.
The replay run folders go to ``WORK/runs/<dataset>-<variant>`` and resume if interrupted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpdyn.runs import RunDir

GPDYN = str(Path(sys.executable).with_name("gpdyn"))
DATASETS = {
    # name: (store file, problem, protocol, the command that makes the store)
    "sarcos": ("sarcos.zarr", "arm", "iid", lambda store, a: [GPDYN, "import", "sarcos", str(a.sarcos_file),
                                                               "--store", str(store)]),
    "kuka": ("kuka1.zarr", "kuka", "iid", lambda store, a: [GPDYN, "collect", "kuka", "--store", str(store)]),
    "walker-1": ("walker.zarr", "walker-1", "iid", lambda store, a: [GPDYN, "collect", "walker", "--store", str(store),
                                                                     "--episodes", "20"]),
}
#: variant -> (learners, extra --size options): the paper's 2-D WISKI is the same learner at structure=single
VARIANTS = {
    "additive": ("wiski,svi", []),
    "paper-2d": ("wiski", ["wiski.structure=single", "wiski.projection=per-output"]),
}


def run(cmd: list[str]) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def final_records(folder: Path, iterations: int) -> dict[str, dict[str, Any]]:
    """The evaluation record at the last iteration of each learner in a replay run folder."""
    out: dict[str, dict[str, Any]] = {}
    for record in RunDir(folder).metrics():
        if record.get("kind") == "eval" and record.get("iteration") == iterations:
            out[record["learner"]] = record
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="stores and replay run folders")
    parser.add_argument("--out", type=Path, required=True, help="folder of report.md and results.json")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--sarcos-file", type=Path, default=Path("/work/shared/data/sarcos/sarcos_inv_test.mat"))
    parser.add_argument("--size", action="append", default=[], help="extra replay --size for the additive run")
    parser.add_argument("--eval-every", type=int, default=100)
    args = parser.parse_args(argv)
    names = [n for n in args.datasets.split(",") if n]
    unknown = set(names) - set(DATASETS)
    if unknown:
        parser.error(f"unknown datasets {sorted(unknown)}; choose from {', '.join(DATASETS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    commands: list[str] = []
    for name in names:
        file, problem, protocol, make = DATASETS[name]
        store = args.work / file
        if not store.exists():
            cmd = make(store, args) + ["--out", str(args.work / "runs" / f"make-{name}")]
            commands.append(" ".join(cmd))
            run(cmd)
        rows: dict[str, Any] = {}
        for variant, (learners, sizes) in VARIANTS.items():
            folder = args.work / "runs" / f"{name}-{variant}"
            cmd = [GPDYN, "replay", "--store", str(store), "--problem", problem, "--protocol", protocol,
                   "--learners", learners, "--preset", "cpu", "--iterations", str(args.iterations),
                   "--batch-size", "1024", "--eval-every", str(args.eval_every), "--seed", "0", "--threads", "1",
                   "--out", str(folder)]
            for size in sizes + (args.size if variant == "additive" else []):
                cmd += ["--size", size]
            commands.append(" ".join(cmd))
            run(cmd)
            finals = final_records(folder, args.iterations)
            config = RunDir(folder).config().get("learner_config", {})
            for learner, record in finals.items():
                key = "svi" if learner == "svi" else f"wiski ({variant})"
                rows[key] = {
                    "nmse_mean": record["nmse_mean"], "nmse_std": record["nmse_std"],
                    "nll_mean": record["nll_mean"], "nll_std": record["nll_std"],
                    "seconds": record["seconds"], "options": config.get(learner, {}),
                }
        results[name] = rows
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    lines = [
        "| dataset | learner | nMSE | NLL | nMSE / SVI's | training wall s (1 thread, shared machine) |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for name, rows in results.items():
        svi = rows.get("svi", {}).get("nmse_mean")
        for key in ("wiski (paper-2d)", "wiski (additive)", "svi"):
            if key not in rows:
                continue
            r = rows[key]
            ratio = f"{r['nmse_mean'] / svi:.2f}" if svi else "-"
            lines.append(f"| {name} | {key} | {r['nmse_mean']:.4f} ± {r['nmse_std']:.3f} | "
                         f"{r['nll_mean']:.3f} ± {r['nll_std']:.2f} | {ratio} | {r['seconds']:.0f} |")
    table = "\n".join(lines)
    (args.out / "table.md").write_text(table + "\n")
    (args.out / "commands.txt").write_text("\n".join(commands) + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
