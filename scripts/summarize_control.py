"""Summarise several `gpdyn control walker` run folders (one per seed) as one markdown table.

    .venv/bin/python scripts/summarize_control.py logs/ctl3-weak_motor-s0 logs/ctl3-weak_motor-s1 ...

Per seed (and episode, for runs of ``--episodes`` > 1): each controller's return in each
condition (episode length in brackets when the walker fell); then mean ± standard error,
online − frozen on the changed plant paired by seed and episode (over all episodes, per
episode, and after the first), how often the online model wins, the falls, and the mean
one-step velocity RMSE of the learned models over each episode's last 50 steps. Reads
only ``config.json`` and ``metrics.jsonl``; a folder without a finished episode table is
named in the error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from gpdyn.config import flatten_dict
from gpdyn.experiments.control_report import mean_se, planner_text


Episodes = dict[tuple[str, str], list[dict]]  # (condition, controller) -> episode records in episode order
Errors = dict[tuple[str, str, int], list[float]]  # (condition, controller, episode) -> per-step model errors


def load_run(folder: Path) -> tuple[dict, Episodes, Errors]:
    """The run's config, its episode records and its per-step model errors.

    An episode's index is its ``episode`` field, or for run folders written before
    ``--episodes`` existed its place among the records of its controller and condition.
    """
    config_path, metrics_path = folder / "config.json", folder / "metrics.jsonl"
    for path in (config_path, metrics_path):
        if not path.is_file():
            raise SystemExit(f"{folder}: no {path.name}; is this a `gpdyn control walker` run folder?")
    config = flatten_dict(json.loads(config_path.read_text()))  # a config tree's sections, or an older flat config
    episodes: Episodes = {}
    errors: Errors = {}
    for line_no, line in enumerate(metrics_path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise SystemExit(f"{metrics_path}:{line_no}: not JSON ({err})") from err
        key = (record.get("condition"), record.get("controller"))
        if record.get("kind") == "episode" and record.get("robot") == "walker":
            episodes.setdefault(key, []).append(record)
        elif record.get("kind") == "step" and "model_rmse" in record:
            # a step belongs to the episode after the last finished one of its controller
            index = record.get("episode", len(episodes.get(key, [])))
            errors.setdefault((*key, index), []).append(record["model_rmse"])
    if not episodes:
        raise SystemExit(f"{metrics_path}: no finished episode")
    return config, episodes, errors


def cell(record: dict | None, steps: int) -> str:
    if record is None:
        return "-"
    fell = f" ({record['length']})" if record["length"] < steps else ""
    return f"{record['return']:.1f}{fell}"


def _online_minus_frozen(runs: list[tuple[dict, Episodes, Errors]], steps: int, episodes: range | None = None) -> str | None:
    """Online − frozen on the changed plant, paired by seed and episode, over the episode indices ``episodes`` (None: all)."""
    diffs, falls = [], {"frozen": 0, "online": 0}
    for _, eps, _ in runs:
        frozen, online = eps.get(("changed", "frozen"), []), eps.get(("changed", "online"), [])
        for k, (f, o) in enumerate(zip(frozen, online)):
            if episodes is None or k in episodes:
                diffs.append(o["return"] - f["return"])
                falls["frozen"] += f["length"] < steps
                falls["online"] += o["length"] < steps
    if not diffs:
        return None
    return (f"{mean_se(diffs)}; online wins {sum(d > 0 for d in diffs)} of {len(diffs)}; falls: frozen "
            f"{falls['frozen']}, online {falls['online']}")


def summarize(folders: list[Path]) -> str:
    runs = [load_run(f) for f in folders]
    config = runs[0][0]
    controllers, conditions, steps = config["controllers"], config["conditions"], config["steps"]
    n_episodes = max(len(e) for _, eps, _ in runs for e in eps.values())
    columns = [(ctrl, cond) for ctrl in controllers for cond in conditions]
    change = next((e["change"] for _, eps, _ in runs for es in eps.values() for e in es if e.get("change")),
                  config["change"])
    lines = [
        f"Plant change: {change}; {len(runs)} seeds"
        + (f" x {n_episodes} consecutive episodes (the online model kept across them)" if n_episodes > 1 else "")
        + f"; learner `{config['learner']}` (target `{config.get('target', 'velocity')}`), "
        f"{planner_text(config)}, {steps} steps.",
        "",
        "| seed | " + ("episode | " if n_episodes > 1 else "") + " | ".join(f"{ctrl} {cond}" for ctrl, cond in columns) + " |",
        "|---|" + ("---|" if n_episodes > 1 else "") + "---|" * len(columns),
    ]
    returns: dict[tuple[str, str], list[float]] = {c: [] for c in columns}
    for cfg, episodes, _ in runs:
        for k in range(n_episodes):
            records = {c: es[k] if k < len(es) else None for c, es in episodes.items()}
            lines.append(f"| {cfg['seed']} | " + (f"{k + 1} | " if n_episodes > 1 else "")
                         + " | ".join(cell(records.get((cond, ctrl)), steps) for ctrl, cond in columns) + " |")
            for ctrl, cond in columns:
                if records.get((cond, ctrl)):
                    returns[(ctrl, cond)].append(records[(cond, ctrl)]["return"])
    lines.append("| mean ± se | " + ("| " if n_episodes > 1 else "")
                 + " | ".join(mean_se(returns[c]) if returns[c] else "-" for c in columns) + " |")
    lines.append("")
    overall = _online_minus_frozen(runs, steps)
    if overall:
        lines.append(f"Online − frozen on the changed plant: {overall}.")
        if n_episodes > 1:
            lines += [f"- episode {k + 1}: {_online_minus_frozen(runs, steps, range(k, k + 1)) or '-'}"
                      for k in range(n_episodes)]
            lines += [f"- episodes 2–{n_episodes} (after the online model has learned): "
                      f"{_online_minus_frozen(runs, steps, range(1, n_episodes)) or '-'}", ""]
    error_rows = []
    for cond in conditions:
        for ctrl in ("frozen", "online"):
            for k in range(n_episodes):
                tails = [np.mean(errs[(cond, ctrl, k)][-50:]) for _, _, errs in runs if errs.get((cond, ctrl, k))]
                if tails:
                    error_rows.append(f"{ctrl} {cond}" + (f" episode {k + 1}" if n_episodes > 1 else "")
                                      + f" {np.mean(tails):.2f}")
    if error_rows:
        lines.append("One-step velocity RMSE of the model, last 50 steps of each episode, mean over seeds: "
                     + "; ".join(error_rows) + ".")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="run folders of one study, one per seed")
    args = parser.parse_args(argv)
    sys.stdout.write(summarize(args.folders))
    return 0


if __name__ == "__main__":
    sys.exit(main())
