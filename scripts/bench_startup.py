"""CPU time of the commands that do not compute, against the 0.5 s target (issue #38).

Makes, in a temporary folder, a small arm store (random rows, 3 episodes), two small run
folders on it with ``gpdyn replay`` (the iid protocol, and the stream protocol) and a
6-step ``gpdyn control arm`` run of the shipped iiwa; then runs each fast command in a fresh
process ``--repeat`` times and prints the median user + system CPU seconds of the process
and the children it waited for (``gpdyn doctor`` runs some), from ``getrusage(RUSAGE_CHILDREN)``:

    gpdyn --help
    gpdyn inspect STORE
    gpdyn inspect RUN
    gpdyn report RUN            for each run: on a fresh copy without its plots (drawn), then
                                again on that copy (the plots are newer than the records: kept)
    gpdyn control recipes
    gpdyn doctor

    python scripts/bench_startup.py [--repeat 5] [--target 0.5] [--markdown]

``--markdown`` prints the table as Markdown (docs/results/startup.md). Exits 1 when a
command fails, not when one is over the target: the table says which are.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

# the installed command beside this interpreter (what a user runs), else the module
_SCRIPT = Path(sys.executable).parent / "gpdyn"
GPDYN = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "gpdyn"]


def make_store(path: Path) -> None:
    """A 7-joint arm store (q, qd, qdd, tau) of 3 episodes of random rows: 1 offline, 2 online."""
    from gpdyn.data.store import EpisodeStore, FieldSpec, numbered_columns

    rng = np.random.default_rng(0)
    fields = {name: FieldSpec(numbered_columns(name, 7)) for name in ("q", "qd", "qdd", "tau")}
    store = EpisodeStore.create(path, fields, source="bench", env_id="kuka", dt=0.01, seed=0,
                                episode_keys={"online": "int8"})
    store.append_episodes([{k: rng.normal(size=(n, 7)) for k in fields} for n in (60, 80, 70)],
                          [{"online": 0}, {"online": 1}, {"online": 1}])
    store.close()


def make_run(store: Path, out: Path, protocol: str) -> Path:
    """A finished ``gpdyn replay`` run of one small learner on ``store``, in the folder ``out``; return it."""
    extra = (["--init-rows", "40", "--chunk", "20", "--warm-rows", "40"] if protocol == "stream"
             else ["--iterations", "3", "--batch-size", "16", "--eval-every", "1"])
    subprocess.run([*GPDYN, "-q", "replay", "--store", str(store), "--problem", "kuka", "--learners", "svi",
                    "--protocol", protocol, "--size", "svi.m=8", "--seed", "0", "--out", str(out), *extra],
                   check=True, stdout=subprocess.DEVNULL)
    return out


def make_control_run(out: Path) -> Path:
    """A 6-step ``gpdyn control arm`` run of the shipped iiwa (PD and the true inverse dynamics, no learner)."""
    from gpdyn.robots.kuka import model_path

    subprocess.run([*GPDYN, "-q", "control", "arm", "--model", str(model_path()), "--controllers", "pd,true",
                    "--steps", "6", "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    return out


def cpu_seconds(argv: list[str], before: Callable[[], None] | None = None) -> float:
    """User + system CPU seconds of ``argv`` run to the end (its waited-for children included)."""
    if before is not None:
        before()
    start = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, text=True)
    end = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    return (end.ru_utime - start.ru_utime) + (end.ru_stime - start.ru_stime)


def fresh_copy(source: Path, target: Path) -> Callable[[], None]:
    """Replace ``target`` with a copy of ``source`` (its plots not drawn yet)."""
    def copy() -> None:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)
        for plot in [*target.glob("*.svg"), *target.glob("*.png")]:  # .png: the plots of older versions
            plot.unlink()
    return copy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per command (default 5); the median is shown")
    parser.add_argument("--target", type=float, default=0.5, help="CPU seconds a command should stay under")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, is {args.repeat}")
    with tempfile.TemporaryDirectory(prefix="gpdyn-bench-startup-") as tmp:
        tmp = Path(tmp)
        store = tmp / "arm.zarr"
        make_store(store)
        replay_run = make_run(store, tmp / "replay", "iid")
        commands: list[tuple[str, list[str], Callable[[], None] | None]] = [
            ("gpdyn --help", ["--help"], None),
            ("gpdyn inspect STORE", ["inspect", str(store)], None),
            ("gpdyn inspect RUN", ["inspect", str(replay_run)], None),
        ]
        runs = {"replay": replay_run, "stream": make_run(store, tmp / "stream", "stream"),
                "control arm": make_control_run(tmp / "control")}
        for kind, run in runs.items():
            copy = tmp / f"{run.name}-copy"
            commands += [(f"gpdyn report RUN ({kind}, plots drawn)", ["report", str(copy)], fresh_copy(run, copy)),
                         (f"gpdyn report RUN ({kind}, plots up to date)", ["report", str(copy)], None)]
        commands += [("gpdyn control recipes", ["control", "recipes"], None), ("gpdyn doctor", ["doctor"], None)]
        rows = []
        for name, argv, before in commands:
            times = [cpu_seconds([*GPDYN, *argv], before) for _ in range(args.repeat)]
            median = statistics.median(times)
            rows.append((name, median, min(times), max(times), "yes" if median < args.target else "NO"))
            print(f"{name}: {median:.3f} s", file=sys.stderr)
    header = ("command", "median CPU s", "min", "max", f"under {args.target:g} s")
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("| --- | ---: | ---: | ---: | --- |")
        for name, median, low, high, ok in rows:
            print(f"| `{name}` | {median:.3f} | {low:.3f} | {high:.3f} | {ok} |")
    else:
        width = max(len(r[0]) for r in rows)
        print(f"{header[0]:<{width}}  {header[1]:>12}  {header[2]:>6}  {header[3]:>6}  {header[4]}")
        for name, median, low, high, ok in rows:
            print(f"{name:<{width}}  {median:>12.3f}  {low:>6.3f}  {high:>6.3f}  {ok}")
    print(f"\n{args.repeat} runs each, user + system CPU seconds (children included), python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
