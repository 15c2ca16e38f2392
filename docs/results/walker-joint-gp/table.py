"""The tables of docs/results/walker-joint-gp from finished `gpdyn control walker` run folders.

usage: python docs/results/walker-joint-gp/table.py OUT.csv RUN[@NAME] ...

Every episode of the runs goes to OUT.csv (an online controller is renamed NAME where one is given); the
markdown table per plant goes to stdout: mean returns of true, frozen and each online model, falls, each
model's recovery ((online - frozen) / (true - frozen) of the means) and the paired difference of the last
model against the first (mean and standard error over seeds, wins).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np


def episodes(folder: str, name: str | None) -> list[dict]:
    out = []
    for line in (Path(folder) / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") != "episode":
            continue
        controller = record["controller"]
        out.append({"run": Path(folder).name, "plant": record["plant"],
                    "controller": name if name and controller == "online" else controller,
                    "seed": record["seed"], "steps": record["length"], "fell": int(record["fell"]),
                    "return": round(record["return"], 1), "speed_m_s": round(record["speed_m_s"], 3),
                    "cpu_ms_per_step": round(record["cpu_ms_per_step"], 1),
                    "distrusted_steps": record.get("residual_distrusted_steps", ""),
                    **{k: round(v, 2) for k, v in record.get("joint_gp", {}).items() if "leg_joint" in k}})
    return out


def main() -> None:
    out, runs = sys.argv[1], sys.argv[2:]
    rows = []
    for run in runs:
        folder, _, name = run.partition("@")
        rows += episodes(folder, name or None)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fields)
        writer.writeheader()
        writer.writerows(rows)
    models = [c for c in dict.fromkeys(r["controller"] for r in rows) if c not in ("true", "frozen")]
    first, last = models[0], models[-1]
    head = (["plant", "true", "frozen"] + models + ["falls true / frozen / " + " / ".join(models)]
            + [f"recovery {m}" for m in models] + [f"{last} - {first}, paired (wins)", f"CPU ms {' / '.join(models)}"])
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for plant in dict.fromkeys(r["plant"] for r in rows):
        by = {c: {r["seed"]: r for r in rows if r["plant"] == plant and r["controller"] == c}
              for c in ["true", "frozen", *models]}
        by = {c: v for c, v in by.items() if v}  # a model not run on this plant: "-"
        seeds = sorted(set.intersection(*(set(v) for v in by.values())))
        mean = {c: np.mean([by[c][s]["return"] for s in seeds]) for c in by}
        falls = " / ".join(str(sum(by[c][s]["fell"] for s in seeds)) if c in by else "-"
                           for c in ["true", "frozen", *models])
        lost = mean["true"] - mean["frozen"]
        recovery = [f"{(mean[m] - mean['frozen']) / lost:.2f}" if m in by and abs(lost) > 1e-9 else "-" for m in models]
        paired = cpu = "-"
        if first in by and last in by:
            diff = np.array([by[last][s]["return"] - by[first][s]["return"] for s in seeds])
            paired = f"{diff.mean():+.0f} ± {diff.std(ddof=1) / np.sqrt(len(diff)):.0f} ({(diff > 0).sum()} of {len(diff)})"
        cpu = " / ".join(f"{np.median([by[m][s]['cpu_ms_per_step'] for s in seeds]):.1f}" if m in by else "-"
                         for m in models)
        cells = ([plant.split(" (")[0], f"{mean['true']:.0f}", f"{mean['frozen']:.0f}"]
                 + [f"{mean[m]:.0f}" if m in by else "-" for m in models] + [falls] + recovery + [paired, cpu])
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
