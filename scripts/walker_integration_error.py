"""Error of recovering the 8 Walker2d positions (qpos[1:]) from velocities, per position.

    .venv/bin/python scripts/walker_integration_error.py --store /tmp/walker1000.zarr

Prints a Markdown table (mean and max absolute one-step error of the trapezoid rule,
with forward and backward Euler beside it) for docs/walker.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpdyn.data.store import EpisodeStore
from gpdyn.robots.walker import QPOS_NAMES
from gpdyn.sim.legged import integration_errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, required=True)
    args = ap.parse_args()
    store = EpisodeStore.open(args.store)
    errs = integration_errors(store)
    print(f"{store.n_rows} transitions, {store.n_episodes} episodes, dt = {store.attrs['dt']} s\n")
    rules = ("trapezoid", "forward_euler", "backward_euler")
    print("| position | " + " | ".join(f"{r} mean | {r} max" for r in rules) + " |")
    print("|---" * (1 + 2 * len(rules)) + "|")
    for j, name in enumerate(QPOS_NAMES[1:]):
        cells = [f"{errs[r][s][j]:.2e}" for r in rules for s in ("mean", "max")]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
