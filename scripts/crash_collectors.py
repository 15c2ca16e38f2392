"""Crash campaign against the collectors: kill `gpdyn collect walker|kuka` at random points, check, resume.

    .venv/bin/python scripts/crash_collectors.py --collector walker --trials 20 --kinds SIGKILL --work /tmp/crash
    .venv/bin/python scripts/crash_collectors.py --collector kuka --trials 20 --kinds SIGKILL --work /tmp/crash

Each trial runs the collector as a subprocess on a store and, at a seeded random point
(after a random number of further commits, then a random delay), sends it SIGKILL,
SIGTERM or SIGINT, or SIGKILLs one of the walker's worker processes. It then checks that
the process ended (no hang) with the status and message that signal calls for, that
none of its processes is left behind, and that the store opens and every committed
episode equals the same episode of an uninterrupted collection (so its rows are intact
and finite and ``episode_ends`` is consistent). The next trial resumes the same store;
once a run completes it, the store must equal the uninterrupted one and a new store
begins. At the end the last store is completed by a plain rerun. Prints one line per
trial and the counts; exits 1 if any check failed.

tests/test_crash.py runs a few trials of each collector through :func:`campaign`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpdyn.data.store import EpisodeStore

KINDS = ("SIGKILL", "SIGTERM", "SIGINT", "worker SIGKILL")
TIMEOUT = 120.0  # seconds a collector may take after the kill before it counts as hung


@dataclass
class Collector:
    """A collector command (without ``--store``/``--out``), the function that makes its uninterrupted store,
    and the kinds of kill that apply to it."""

    name: str
    args: list[str]
    reference: Callable[[Path], Any]
    kinds: tuple[str, ...]


def walker(episodes: int = 12, commit_seconds: float | None = None) -> Collector:
    from gpdyn.sim.legged import collect_legged
    from gpdyn.robots.walker import WALKER

    options = dict(envs=2, seed=5, noise=0.05)
    args = ["collect", "walker", "--episodes", str(episodes), "--envs", "2", "--seed", "5", "--noise", "0.05"]
    if commit_seconds is not None:
        args += ["--commit-seconds", str(commit_seconds)]
    return Collector("walker", args, lambda path: collect_legged(WALKER, path, episodes, progress=False, **options), KINDS)


def kuka(offline: int = 2000, online: int = 8000) -> Collector:
    from gpdyn.sim.arm import collect_arm

    args = ["collect", "kuka", "--offline", str(offline), "--online", str(online), "--seed", "3"]
    return Collector("kuka", args, lambda path: collect_arm(path, offline=offline, online=online, seed=3,
                                                             progress=False), KINDS[:3])


# ---------------------------------------------------------------------------- processes
def committed(store: Path) -> int:
    """Episodes in the store's commit record, read the way a reader would while the collector runs (0: none yet)."""
    try:
        return int(json.loads((store / "zarr.json").read_text())["attributes"]["commit"]["episodes"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def descendants(pid: int) -> list[tuple[int, int]]:
    """``(pid, depth)`` of every process below ``pid`` (1: its children, 2: theirs ...), from /proc."""
    out, todo = [], [(pid, 0)]
    while todo:
        p, depth = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out += [(c, depth + 1) for c in children]
            todo += [(c, depth + 1) for c in children]
    return out


def _default_signals() -> None:
    """In the collector, before it starts: SIGINT and SIGTERM act as in a foreground job, also when this
    campaign runs in the background (where a shell starts it with SIGINT ignored, and its children inherit that)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _forked_by_the_server(pid: int) -> bool:
    """A walker worker: a process forked by the fork server (so with its command line), two levels below the
    collector. (Other processes run there too: importing glfw starts a version check in a subprocess.)"""
    try:
        return b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@dataclass
class Trial:
    kind: str
    landed: bool = False  # the collector was still running when the signal was sent
    status: int | None = None
    committed_before: int = 0
    committed_after: int = 0
    hung: bool = False
    left_behind: list[int] = field(default_factory=list)
    message: str = ""
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        what = "kill landed" if self.landed else "finished first"
        text = (f"{self.kind:<15} {what:<14} status {self.status!s:>4}  episodes {self.committed_before:>3} -> "
                f"{self.committed_after:>3}")
        return text + (f"  PROBLEMS: {'; '.join(self.problems)}" if self.problems else "")


def run_trial(collector: Collector, store: Path, out: Path, kind: str, rng: np.random.Generator, planned: int) -> Trial:
    """Start the collector on ``store``, kill it as ``kind`` says at a random point, check how it ended.

    ``planned``: the episodes of a finished store. ``kind`` "none" lets the run finish.
    """
    trial = Trial(kind, committed_before=committed(store))
    commits, delay = int(rng.integers(0, 3)), float(rng.uniform(0.0, 1.0))
    proc = subprocess.Popen([sys.executable, "-m", "gpdyn", *collector.args, "--store", str(store), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
    deadline = time.monotonic() + (TIMEOUT if kind != "none" else 0.0)  # "none": let it finish
    while proc.poll() is None and committed(store) < trial.committed_before + commits and time.monotonic() < deadline:
        time.sleep(0.02)
    tree: list[int] = []
    if kind != "none":
        time.sleep(delay)
    if kind != "none" and proc.poll() is None:
        if kind == "worker SIGKILL":
            workers: list[int] = []
            while proc.poll() is None and not workers and time.monotonic() < deadline:
                workers = [p for p, depth in descendants(proc.pid) if depth == 2 and _forked_by_the_server(p)]
                time.sleep(0.02)
            tree = [p for p, _ in descendants(proc.pid)]
            if workers and proc.poll() is None:
                os.kill(workers[0], signal.SIGKILL)
                trial.landed = True
        else:
            tree = [p for p, _ in descendants(proc.pid)]
            proc.send_signal(getattr(signal, kind))
            trial.landed = True
    try:
        _, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        trial.hung = True
        for p in [proc.pid, *tree]:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, err = proc.communicate()
        trial.problems.append(f"hung for {TIMEOUT:.0f} s after the signal")
    trial.status = proc.returncode
    trial.message = next((line for line in reversed(err.splitlines()) if line.startswith("gpdyn ")), "")
    gone = time.monotonic() + 10
    while any(alive(p) for p in tree) and time.monotonic() < gone:
        time.sleep(0.05)
    trial.left_behind = [p for p in tree if alive(p)]
    if trial.left_behind:
        trial.problems.append(f"processes left running: {trial.left_behind}")
    trial.committed_after = committed(store)
    _check_status(trial, err, planned)
    return trial


def _died_in_import(err: str) -> bool:
    """Whether the traceback in ``err`` ends in an import statement (the innermost frame's line)."""
    frames = [line.strip() for line in err.splitlines() if line.startswith("    ") and not line.startswith("     ")]
    return bool(frames) and frames[-1].startswith(("import ", "from "))


def _check_status(trial: Trial, err: str, planned: int) -> None:
    """The exit status and message the kill calls for."""
    if trial.hung:
        return
    status, message = trial.status, trial.message
    # Outside the collection (Python starting and importing, or the summary after the
    # last commit) a signal acts as on any process: by then this run has committed
    # nothing, or everything.
    early = trial.committed_after == trial.committed_before or trial.committed_after == planned
    if not trial.landed or (trial.committed_after == planned and status == 0):  # it finished all the same
        ok = status == 0
    elif trial.kind == "SIGKILL":
        ok = status == -signal.SIGKILL
    elif trial.kind == "SIGTERM":
        ok = (status == 128 + signal.SIGTERM and "stopped by SIGTERM" in message) or (early and status == -signal.SIGTERM)
    elif trial.kind == "SIGINT":
        # early: Python's own KeyboardInterrupt (-2), the command's "interrupted" (130), or a
        # traceback (1) when the KeyboardInterrupt lands inside a module's import: an ImportError
        # caused by it, or a module left half-initialised that fails in an import at its next
        # use (seen: a RecursionError in numpy's __getattr__)
        ok = (status == 128 + signal.SIGINT and "stopped by SIGINT" in message) or (
            early and (status in (-signal.SIGINT, 128 + signal.SIGINT)
                       or (status == 1 and ("KeyboardInterrupt" in err or _died_in_import(err)))))
    else:  # worker SIGKILL
        ok = status == 1 and "was killed by SIGKILL" in message
    if not ok:
        trial.problems.append(f"exit status {status} ({message or err[-300:]!r}) after {trial.kind}")


# ---------------------------------------------------------------------------- stores
def check_store(store: Path, reference: EpisodeStore) -> int:
    """Open ``store`` and compare every committed episode with the uninterrupted ``reference``; return its count.

    Raises AssertionError on any difference (opening and reading also check the commit
    record, every chunk and that values are finite).
    """
    if not store.exists():
        return 0
    s = EpisodeStore.open(store)
    n = s.n_episodes
    assert n <= reference.n_episodes, f"{store}: {n} episodes, more than the {reference.n_episodes} planned"
    ends = s.episode_ends
    assert np.all(np.diff(np.concatenate([[0], ends])) > 0), f"{store}: episode_ends not increasing: {ends}"
    np.testing.assert_array_equal(ends, reference.episode_ends[:n], err_msg=f"{store}: episode_ends")
    for name in reference.fields:
        rows = s.read(name)
        if rows.dtype.kind == "f":
            assert np.isfinite(rows).all(), f"{store}: {name} holds non-finite values"
        np.testing.assert_array_equal(rows, reference.read(name, 0, s.n_rows), err_msg=f"{store}: field {name}")
    for key in reference.episode_keys:
        np.testing.assert_array_equal(s.episode_values(key), reference.episode_values(key)[:n],
                                      err_msg=f"{store}: per-episode {key}")
    return n


def campaign(collector: Collector, work: Path, trials: int, seed: int = 0, kinds: tuple[str, ...] | None = None,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """``trials`` kills of ``collector`` (cycling over ``kinds``) on stores in ``work``, then a rerun to complete."""
    rng = np.random.default_rng(seed)
    kinds = kinds or collector.kinds
    reference_path = work / f"{collector.name}-reference.zarr"
    collector.reference(reference_path)
    reference = EpisodeStore.open(reference_path)
    counts = {"trials": 0, "landed": 0, "problems": 0, "hung": 0, "left_behind": 0, "stores_completed": 0,
              "completed_equal": 0, "episodes_committed_by_killed_runs": 0}
    number = 0
    store = work / f"{collector.name}-0.zarr"
    for i in range(trials):
        kind = kinds[i % len(kinds)]
        trial = run_trial(collector, store, work / f"run-{collector.name}-{i}", kind, rng, reference.n_episodes)
        try:
            n = check_store(store, reference)
        except AssertionError as err:
            trial.problems.append(f"store damaged: {err}")
            n = -1
        counts["trials"] += 1
        counts["landed"] += trial.landed
        counts["hung"] += trial.hung
        counts["left_behind"] += bool(trial.left_behind)
        counts["problems"] += bool(trial.problems)
        if trial.landed:
            counts["episodes_committed_by_killed_runs"] += max(0, trial.committed_after - trial.committed_before)
        log(f"{collector.name} trial {i:>3}: {trial.line()}")
        if n == reference.n_episodes:
            counts["stores_completed"] += 1
            counts["completed_equal"] += 1
            number += 1
            store = work / f"{collector.name}-{number}.zarr"
        elif n < 0:  # a damaged store cannot be resumed: go on with a new one
            number += 1
            store = work / f"{collector.name}-{number}.zarr"
    # the last store, completed by a plain rerun
    final = run_trial(collector, store, work / f"run-{collector.name}-final", "none", rng, reference.n_episodes)
    try:
        complete = check_store(store, reference) == reference.n_episodes
    except AssertionError as err:
        final.problems.append(f"store damaged: {err}")
        complete = False
    if final.status != 0 or not complete:
        final.problems.append(f"the rerun did not complete the store (status {final.status}, {final.message!r})")
    counts["stores_completed"] += 1
    counts["completed_equal"] += complete and not final.problems
    counts["problems"] += bool(final.problems)
    log(f"{collector.name} final rerun: {final.line()}")
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--collector", choices=("walker", "kuka"), required=True)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--kinds", default=None, help=f"comma-separated kinds of kill (default all of: {', '.join(KINDS)})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--episodes", type=int, default=12, help="walker episodes per store")
    ap.add_argument("--offline", type=int, default=4000, help="kuka offline samples per store")
    ap.add_argument("--online", type=int, default=40000, help="kuka online samples per store")
    ap.add_argument("--commit-seconds", type=float, default=None, help="walker: --commit-seconds (default the collector's)")
    ap.add_argument("--work", type=Path, required=True, help="a new folder for the stores and run folders")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=False)
    collector = walker(args.episodes, args.commit_seconds) if args.collector == "walker" else kuka(args.offline, args.online)
    kinds = tuple(k.strip() for k in args.kinds.split(",")) if args.kinds else None
    counts = campaign(collector, args.work, args.trials, args.seed, kinds)
    print(json.dumps(counts))
    return 1 if counts["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
