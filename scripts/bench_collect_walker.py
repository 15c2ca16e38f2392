"""Time and memory of a large Walker2d collection (issue: 1,000 episodes in < 15 min on 2 cores).

    .venv/bin/python scripts/bench_collect_walker.py --store /tmp/walker1000.zarr --episodes 1000 --envs 2

Samples the resident memory of the collector and its worker processes (from /proc)
every second while ``gpdyn.sim.walker.collect_walker`` runs, and prints wall time,
transitions per second, and the memory at 10%, 50% and 100% of the episodes, so a
memory that grows with the number of episodes would show.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

from gpdyn.data.store import EpisodeStore
from gpdyn.sim.legged import collect_legged
from gpdyn.robots.walker import WALKER


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, required=True, help="a new store path (it must not exist)")
    ap.add_argument("--episodes", type=int, default=1000)
    ap.add_argument("--envs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--noise", type=float, default=0.0)
    ap.add_argument("--mix", action="store_true")
    args = ap.parse_args()
    if args.store.exists():
        ap.error(f"{args.store} exists; the benchmark needs a new store")

    samples: list[tuple[float, int, float, float]] = []  # time, episodes, parent MiB, total MiB
    done = threading.Event()

    def sample() -> None:
        me = os.getpid()
        while not done.wait(1.0):
            try:
                n = EpisodeStore.open(args.store).n_episodes if args.store.exists() else 0
            except Exception:  # a store mid-creation
                n = samples[-1][1] if samples else 0
            pids = _tree(me)
            samples.append((time.perf_counter(), n, _rss_mib(me), sum(_rss_mib(p) for p in pids)))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    result = collect_legged(WALKER, args.store, args.episodes, envs=args.envs, seed=args.seed, noise=args.noise, mix=args.mix)
    done.set()
    thread.join()

    marks = {}
    for frac in (0.1, 0.5, 1.0):
        hit = [s for s in samples if s[1] >= frac * args.episodes]
        s = hit[0] if hit else (samples[-1] if samples else None)
        if s is not None:
            marks[f"{int(frac * 100)}%"] = {"episodes": s[1], "collector_MiB": round(s[2], 1), "with_workers_MiB": round(s[3], 1)}
    store = EpisodeStore.open(args.store)
    disk = sum(f.stat().st_size for f in args.store.rglob("*") if f.is_file())
    report = {
        "episodes": store.n_episodes,
        "transitions": store.n_rows,
        "envs": args.envs,
        "cpus": os.cpu_count(),
        "load_average_1min_at_end": os.getloadavg()[0],
        "wall_seconds": round(result["seconds"], 1),
        "transitions_per_second": round(result["steps_per_second"], 1),
        "peak_with_workers_MiB": round(max((s[3] for s in samples), default=0.0), 1),
        "memory": marks,
        "store_MiB_on_disk": round(disk / 2**20, 1),
        "mean_episode_length": float(store.episode_lengths.mean()),
        "mean_return": float(store.episode_values("return").mean()),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
