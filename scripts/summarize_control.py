"""Summarise several `gpdyn control walker` run folders (one per seed) as one markdown table.

    .venv/bin/python scripts/summarize_control.py logs/ctl3-weak_motor-s0 logs/ctl3-weak_motor-s1 ...

Per seed: each controller's return in each condition (episode length in brackets when the
walker fell); then mean ± standard error over seeds, online − frozen on the changed plant
per seed, how many seeds the online model wins, and the mean one-step velocity RMSE of
the learned models over each episode's last 50 steps. Reads only ``config.json`` and
``metrics.jsonl``; a folder without a finished episode table is named in the error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from gpdyn.control.report import walker_planner_text


def load_run(folder: Path) -> tuple[dict, dict[tuple[str, str], dict], dict[tuple[str, str], list[float]]]:
    """The run's config, its episode records and its per-step model errors, by (condition, controller)."""
    config_path, metrics_path = folder / "config.json", folder / "metrics.jsonl"
    for path in (config_path, metrics_path):
        if not path.is_file():
            raise SystemExit(f"{folder}: no {path.name}; is this a `gpdyn control walker` run folder?")
    config = json.loads(config_path.read_text())
    episodes: dict[tuple[str, str], dict] = {}
    errors: dict[tuple[str, str], list[float]] = {}
    for line_no, line in enumerate(metrics_path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise SystemExit(f"{metrics_path}:{line_no}: not JSON ({err})") from err
        key = (record.get("condition"), record.get("controller"))
        if record.get("kind") == "episode" and record.get("robot") == "walker":
            episodes[key] = record
        elif record.get("kind") == "step" and "model_rmse" in record:
            errors.setdefault(key, []).append(record["model_rmse"])
    if not episodes:
        raise SystemExit(f"{metrics_path}: no finished episode")
    return config, episodes, errors


def cell(record: dict | None, steps: int) -> str:
    if record is None:
        return "-"
    fell = f" ({record['length']})" if record["length"] < steps else ""
    return f"{record['return']:.1f}{fell}"


def summarize(folders: list[Path]) -> str:
    runs = [load_run(f) for f in folders]
    config = runs[0][0]
    controllers, conditions, steps = config["controllers"], config["conditions"], config["steps"]
    columns = [(ctrl, cond) for ctrl in controllers for cond in conditions]
    change = next((e["change"] for _, eps, _ in runs for e in eps.values() if e.get("change")), config["change"])
    lines = [
        f"Plant change: {change}; {len(runs)} seeds; learner `{config['learner']}` "
        f"(target `{config.get('target', 'velocity')}`), {walker_planner_text(config)}, {steps} steps.",
        "",
        "| seed | " + " | ".join(f"{ctrl} {cond}" for ctrl, cond in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    returns: dict[tuple[str, str], list[float]] = {c: [] for c in columns}
    for folder, (cfg, episodes, _) in zip(folders, runs):
        lines.append(f"| {cfg['seed']} | " + " | ".join(cell(episodes.get((cond, ctrl)), steps) for ctrl, cond in columns) + " |")
        for ctrl, cond in columns:
            if (cond, ctrl) in episodes:
                returns[(ctrl, cond)].append(episodes[(cond, ctrl)]["return"])
    stats = []
    for column in columns:
        values = np.asarray(returns[column])
        se = values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else float("nan")
        stats.append(f"{values.mean():.1f} ± {se:.1f}" if len(values) else "-")
    lines.append("| mean ± se | " + " | ".join(stats) + " |")
    lines.append("")
    pairs = [(eps.get(("changed", "online")), eps.get(("changed", "frozen"))) for _, eps, _ in runs]
    diffs = [o["return"] - f["return"] for o, f in pairs if o and f]
    if diffs:
        falls = {name: sum(1 for _, eps, _ in runs if (e := eps.get(("changed", name))) and e["length"] < steps)
                 for name in ("frozen", "online")}
        lines.append(f"Online − frozen on the changed plant, per seed: {[round(d, 1) for d in diffs]}; mean "
                     f"{np.mean(diffs):.1f}; online wins {sum(d > 0 for d in diffs)} of {len(diffs)}; falls: frozen "
                     f"{falls['frozen']}, online {falls['online']}.")
    error_rows = []
    for cond in conditions:
        for ctrl in ("frozen", "online"):
            tails = [np.mean(errs[(cond, ctrl)][-50:]) for _, _, errs in runs if errs.get((cond, ctrl))]
            if tails:
                error_rows.append(f"{ctrl} {cond} {np.mean(tails):.2f}")
    if error_rows:
        lines.append("One-step velocity RMSE of the model, last 50 steps, mean over seeds: " + "; ".join(error_rows) + ".")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="run folders of one study, one per seed")
    args = parser.parse_args(argv)
    sys.stdout.write(summarize(args.folders))
    return 0


if __name__ == "__main__":
    sys.exit(main())
