"""Tables of docs/results/walker-learned-1000/README.md from `gpdyn control walker` run folders.

    python docs/results/walker-learned-1000/tables.py --csv episodes.csv VARIANT=FOLDER_GLOB ...

One folder per seed (``--episodes 1``); VARIANT names the online model's setting. Per plant
(nominal, changed) and controller: episodes that walked all steps, return median and worst,
CPU ms per control step (mean of the episodes' means, worst episode's 95th percentile), the
online learner and its updates (median over seeds); then, on each plant, each controller
against TRPO alone and the online model against the frozen one, paired by seed. Reads only
config.json and metrics.jsonl; folders without report.md (unfinished runs) are left out.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
from pathlib import Path

import numpy as np


def records(folder: Path) -> tuple[dict, list[dict]]:
    config = json.loads((folder / "config.json").read_text())
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return config, [r for r in rows if r.get("kind") == "episode" and r.get("robot") == "walker"]


def find(config: dict, key: str):
    stack = [config]
    while stack:
        node = stack.pop()
        if key in node and not isinstance(node[key], dict):
            return node[key]
        stack.extend(v for v in node.values() if isinstance(v, dict))
    raise KeyError(key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="VARIANT=GLOB of run folders")
    parser.add_argument("--csv", help="write one row per episode here")
    args = parser.parse_args()
    rows = []
    for spec in args.runs:
        variant, pattern = spec.split("=", 1)
        folders = sorted(Path(p) for p in glob.glob(pattern) if (Path(p) / "report.md").is_file())  # finished runs
        if not folders:
            raise SystemExit(f"{pattern}: no run folder")
        for folder in folders:
            config, episodes = records(folder)
            steps, seed = find(config, "steps"), find(config, "seed")
            for r in episodes:
                rows.append(dict(variant=variant, seed=seed, plant=r["condition"], controller=r["controller"],
                                 steps=r["length"], walked=int(r["length"] >= steps), ret=round(r["return"], 1),
                                 cpu_ms_mean=round(r["cpu_ms_per_step"], 3), cpu_ms_p95=round(r["cpu_ms_per_step_p95"], 3),
                                 online_learner=r.get("online_learner", ""), gp_updates=r.get("gp_updates", "")))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    order = {"trpo": 0, "true": 1, "frozen": 2, "online": 3}
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == variant]
        seeds = sorted({r["seed"] for r in mine})
        print(f"\n#### {variant}: seeds {seeds[0]}-{seeds[-1]} ({len(seeds)})\n")
        print("| plant | controller | walked 1000 | return median | return worst | CPU ms/step mean | p95 (worst) | online learner | updates (median) |")
        print("|---|---|---:|---:|---:|---:|---:|---|---:|")
        for plant in ("nominal", "changed"):
            for ctl in sorted({r["controller"] for r in mine if r["plant"] == plant}, key=order.get):
                group = [r for r in mine if r["plant"] == plant and r["controller"] == ctl]
                ret = np.array([r["ret"] for r in group])
                upd = [r["gp_updates"] for r in group if r["gp_updates"] != ""]
                print(f"| {'hip 30 %' if plant == 'changed' else plant} | {ctl} | {sum(r['walked'] for r in group)} of {len(group)} "
                      f"| {np.median(ret):.0f} | {ret.min():.0f} | {np.mean([r['cpu_ms_mean'] for r in group]):.2f} "
                      f"| {max(r['cpu_ms_p95'] for r in group):.2f} | {group[0]['online_learner'] or '-'} "
                      f"| {f'{np.median(upd):.0f}' if upd else '-'} |")
        print("\nPaired by seed (return difference; mean ± s.e., median, wins):\n")
        print("| plant | difference | mean ± s.e. | median | wins | steps median (first / second) |")
        print("|---|---|---:|---:|---|---|")
        for plant in ("nominal", "changed"):
            for ctl, ref in (("true", "trpo"), ("frozen", "trpo"), ("online", "trpo"), ("online", "frozen")):
                base = {r["seed"]: r for r in mine if r["plant"] == plant and r["controller"] == ref}
                pairs = [(r, base[r["seed"]]) for r in mine
                         if r["plant"] == plant and r["controller"] == ctl and r["seed"] in base]
                if not pairs:
                    continue
                d = np.array([a["ret"] - b["ret"] for a, b in pairs])
                se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
                print(f"| {'hip 30 %' if plant == 'changed' else plant} | {ctl} − {ref} | {d.mean():+.0f} ± {se:.0f} "
                      f"| {np.median(d):+.0f} | {int((d > 0).sum())} of {len(d)} "
                      f"| {np.median([a['steps'] for a, _ in pairs]):.0f} / {np.median([b['steps'] for _, b in pairs]):.0f} |")


if __name__ == "__main__":
    main()
