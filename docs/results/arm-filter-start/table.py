"""The paired tables of README.md from runs of scripts/arm_online_table.py: each model plain (the filter
from its prior) and as NAME@stored-start (the filter from the stored samples), on the same seeds.

    python docs/results/arm-filter-start/table.py RUNS.csv [RUNS.csv ...]
"""

import csv
import sys

import numpy as np

STORED = "@stored-start"


def paired(started: dict[int, dict], prior: dict[int, dict], key: str) -> str:
    """started - prior over the seeds both have [mrad]: mean ± standard error (seeds better/worse)."""
    seeds = [s for s in started if s in prior]
    d = np.array([float(started[s][key]) - float(prior[s][key]) for s in seeds]) * 1e3
    return f"{d.mean():+.2f} ± {d.std(ddof=1) / np.sqrt(len(d)):.2f} ({(d < 0).sum()}/{(d > 0).sum()})"


def main(paths: list[str]) -> None:
    rows = [r for path in paths for r in csv.DictReader(open(path))]
    changes = list(dict.fromkeys(r["change"] for r in rows))
    models = [m for m in dict.fromkeys(r["model"] for r in rows) if not m.endswith(STORED)]
    print("| change | model | start | after: median / worst | before: median / worst | after: started − prior "
          "(better/worse) | before: started − prior (better/worse) | CPU ms mean / worst p95 |")
    print("|---|---|---|---|---|---|---|---|")
    for change in changes:
        for model in models:
            runs = {name: {int(r["seed"]): r for r in rows if r["change"] == change and r["model"] == name}
                    for name in (model, model + STORED)}
            for name, by_seed in runs.items():
                if not by_seed:
                    continue
                after = np.array([float(r["after"]) for r in by_seed.values()]) * 1e3
                before = np.array([float(r["before"]) for r in by_seed.values()]) * 1e3
                cpu = np.mean([float(r["cpu_ms"]) for r in by_seed.values()])
                p95 = max(float(r["cpu_ms_p95"]) for r in by_seed.values())
                started = name.endswith(STORED)
                pairs = [paired(by_seed, runs[model], k) if started else "" for k in ("after", "before")]
                print(f"| {change} | {model} | {'stored' if started else 'prior'} | {np.median(after):.2f} / "
                      f"{after.max():.2f} | {np.median(before):.2f} / {before.max():.2f} | {pairs[0]} | {pairs[1]} | "
                      f"{cpu:.1f} / {p95:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
