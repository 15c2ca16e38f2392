"""Crash test of the collectors: kill `gpdyn collect walker` and `gpdyn collect kuka` at seeded random points.

Each trial runs the command as a subprocess, sends SIGKILL, SIGTERM or SIGINT (or
SIGKILLs a walker worker) after a random number of commits and a random delay, and
checks the exit status and message, that no process is left behind, and that every
committed episode equals the same episode of an uninterrupted collection; the next
trial resumes the store, and a final rerun must complete it to the uninterrupted store.
The trial machinery is scripts/crash_collectors.py, which also runs longer campaigns.
"""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tqdm import tqdm

from gpdyn.data.problems import load_problem
from gpdyn.data.store import EpisodeStore
from gpdyn.errors import InputError
from gpdyn.sim.arm import collect_arm
from gpdyn.sim.stopping import CollectionStopped, StopSignals

_spec = importlib.util.spec_from_file_location("crash_collectors", Path(__file__).parents[1] / "scripts" / "crash_collectors.py")
crash = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))  # dataclasses look it up there
_spec.loader.exec_module(crash)

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs /proc (finds the worker processes there)")


def _no_problems(counts: dict, lines: list[str]) -> None:
    assert counts["problems"] == 0, "\n".join(lines)
    assert counts["landed"] >= 1, "\n".join(lines)  # at least one kill hit a running collector
    assert counts["completed_equal"] == counts["stores_completed"] >= 1, "\n".join(lines)


@pytest.mark.slow
def test_walker_killed_at_random_points_keeps_its_episodes_and_a_rerun_completes_it(tmp_path: Path) -> None:
    lines: list[str] = []
    # committing each episode as it finishes gives the kills many commit points to fall between
    collector = crash.walker(episodes=8, commit_seconds=0)
    counts = crash.campaign(collector, tmp_path, trials=3, seed=22, kinds=("SIGKILL", "worker SIGKILL", "SIGTERM"),
                            log=lines.append)
    _no_problems(counts, lines)


@pytest.mark.slow
def test_kuka_killed_at_random_points_resumes_to_the_uninterrupted_store(tmp_path: Path) -> None:
    lines: list[str] = []
    counts = crash.campaign(crash.kuka(offline=1500, online=6000), tmp_path, trials=3, seed=22, log=lines.append)
    _no_problems(counts, lines)


@pytest.mark.slow
def test_partial_arm_store_is_refused_as_a_problem(tmp_path: Path) -> None:
    """A killed arm collection is not a problem until a rerun finishes it; other settings cannot finish it."""
    path = tmp_path / "part.zarr"
    # a long online part: the kill lands after the offline episodes, long before the end
    proc = subprocess.Popen([sys.executable, "-m", "gpdyn", "collect", "kuka", "--store", str(path), "--offline", "300",
                             "--online", "600000", "--out", str(tmp_path / "run")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None and crash.committed(path) < 1:
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait()
    store = EpisodeStore.open(path)
    assert 1 <= store.n_episodes < 9 and store.attrs["planned_rows"] == 600300
    with pytest.raises(InputError, match=f"holds {store.n_rows} of its 600300 planned rows"):
        load_problem(path, "kuka")
    with pytest.raises(InputError, match="different seed"), pytest.warns(UserWarning, match="stale lock of pid"):
        collect_arm(path, offline=300, online=600000, seed=2, progress=False)  # the killed run's lock is taken over
    with pytest.raises(InputError, match="different online_samples, planned_rows"):
        collect_arm(path, offline=300, online=6000, progress=False)


def test_rerun_of_a_finished_arm_store_adds_nothing(tmp_path: Path) -> None:
    first = collect_arm(tmp_path / "k.zarr", offline=50, online=90, progress=False)
    again = collect_arm(tmp_path / "k.zarr", offline=50, online=90, progress=False)
    assert again.n_episodes == first.n_episodes == 9 and (again.read("tau") == first.read("tau")).all()


def test_sigterm_is_a_flag_inside_the_context_and_the_old_handler_after() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        signal.raise_signal(signal.SIGTERM)
        assert stop.signum == signal.SIGTERM
        with pytest.raises(CollectionStopped, match="stopped by SIGTERM; 3 kept") as stopped:
            stop.check("3 kept")
        assert stopped.value.exit_status == 143
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_before_the_collector_starts_reaches_its_check() -> None:
    """The command's context (entered before its imports) and the collector's share one flag."""
    before = signal.getsignal(signal.SIGINT)
    with StopSignals() as command:
        signal.raise_signal(signal.SIGINT)  # while torch or MuJoCo would be importing
        with StopSignals() as collector:
            assert collector.signum == signal.SIGINT
            with pytest.raises(CollectionStopped) as stopped:
                collector.check("0 kept")
            assert stopped.value.exit_status == 130
        assert signal.getsignal(signal.SIGINT) == command._handle  # the inner one restored nothing
    assert signal.getsignal(signal.SIGINT) is before


def test_collect_commands_run_inside_a_stop_context(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpdyn import cli

    handlers = []
    monkeypatch.setattr(cli, "_run", lambda args: handlers.append(signal.getsignal(signal.SIGINT)) or 0)
    cli.main(["collect", "kuka", "--store", "unused.zarr"])
    cli.main(["inspect", "unused"])  # not a collector: the handler it found
    assert isinstance(getattr(handlers[0], "__self__", None), StopSignals)
    assert handlers[1] is signal.getsignal(signal.SIGINT) and not isinstance(getattr(handlers[1], "__self__", None), StopSignals)


@pytest.mark.slow
def test_an_exception_in_a_worker_reaches_the_collector_after_it_commits(tmp_path: Path) -> None:
    from gpdyn.robots.policy import PolicyError
    from gpdyn.sim.legged import CollectConfig, _collect, collect_legged
    from gpdyn.robots.walker import WALKER

    path = tmp_path / "w.zarr"
    collect_legged(WALKER, path, 1, envs=1, progress=False)
    store = EpisodeStore.open(path, mode="a")
    # the worker, not the collector, meets the missing policy file
    config = CollectConfig(task=WALKER, policies=(tmp_path / "gone.pt",))
    with store, pytest.raises(PolicyError, match="gone.pt"):
        _collect(store, config, 3, 1, StopSignals(), tqdm(disable=True), commit_seconds=0)
    assert EpisodeStore.open(path).n_episodes == 1


def test_an_ignored_signal_stays_ignored() -> None:
    """A shell starts a background job with SIGINT ignored; the collector keeps it so."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopSignals() as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            signal.raise_signal(signal.SIGINT)
            assert stop.signum is None
    finally:
        signal.signal(signal.SIGINT, before)
