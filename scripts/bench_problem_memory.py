"""Peak memory of building a regression problem from a large store, as a ratio.

Writes (once) a walker-schema store of ``--rows`` rows (default 1M, 1000-step
episodes), then, in a fresh process, builds ``walker-1`` from it and prints the peak
resident memory added by ``load_problem`` against the size of the problem's own arrays.
Target (docs/architecture.md): below 3x.

    python scripts/bench_problem_memory.py [--rows 1000000] [--store /tmp/gpdyn-1m.zarr]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def write_store(path: Path, rows: int, episode_length: int = 1000) -> None:
    from tqdm import tqdm

    from gpdyn.data.store import EpisodeStore, FieldSpec, numbered_columns

    fields = {
        "qpos": FieldSpec(numbered_columns("qpos", 9)),
        "qvel": FieldSpec(numbered_columns("qvel", 9)),
        "obs": FieldSpec(numbered_columns("obs", 17)),
        "action": FieldSpec(numbered_columns("a", 6), "float32"),
        "reward": FieldSpec(("reward",)),
    }
    store = EpisodeStore.create(path, fields, source="bench", env_id="Walker2d-v5", dt=0.008, seed=0)
    rng = np.random.default_rng(0)
    per_write = 20
    for _ in tqdm(range(rows // (episode_length * per_write)), desc="writing store", unit="x20 episodes"):
        store.append_episodes(
            [{k: rng.normal(size=(episode_length, s.width)).astype(s.dtype) for k, s in fields.items()}
             for _ in range(per_write)]
        )


def measure(path: Path) -> dict[str, float]:
    from gpdyn.data.problems import load_problem

    before = _rss_mb()
    t0 = time.perf_counter()
    p = load_problem(path, "walker-1")
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    own = sum(a.nbytes for a in (p.x_train, p.y_train, p.x_test, p.y_test, p.x_init, p.y_init)) / 2**20
    return {"rows": len(p.x_train) + len(p.x_test), "arrays_mb": own, "peak_added_mb": peak - before,
            "ratio": (peak - before) / own, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--store", type=Path, default=Path("/tmp/gpdyn-bench-1m.zarr"))
    parser.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_only:
        print(json.dumps(measure(args.store)))
        return
    if not args.store.exists():
        write_store(args.store, args.rows)
    # a fresh process, so that writing the store does not count in the peak
    out = subprocess.run([sys.executable, __file__, "--store", str(args.store), "--measure-only"],
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    print(f"walker-1 from {args.store}: {r['rows']:,} samples in {r['seconds']:.1f} s")
    print(f"problem arrays {r['arrays_mb']:.0f} MB, peak memory added {r['peak_added_mb']:.0f} MB, "
          f"ratio {r['ratio']:.2f} (target < 3)")


if __name__ == "__main__":
    main()
