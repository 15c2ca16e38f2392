"""Run folders: ``logs/<job>-<time>/`` with ``config.json`` and ``metrics.jsonl``.

One process writes a run folder at a time: a :class:`RunDir` takes the folder's
:class:`gpdyn.lock.WriterLock` (``.gpdyn-writer.lock`` inside it) when it is created,
resumed or first written to. Reading (``config``, ``metrics``, ``summary``) needs no lock.
``metrics.jsonl`` is appended one line per record; a run killed mid-write leaves a torn
last line, which readers skip with a warning and the next writer removes.

Completion: the jobs that resume (``learn``, ``replay``; :mod:`gpdyn.experiments.resume`)
name ``finished.json`` under ``completion_marker`` in their config and write it, whole, as
their last act (:meth:`RunDir.finish`). A folder without it is unfinished: a stopped run,
or one still running. :meth:`RunDir.status` says which and how far it got, so that
``gpdyn inspect`` and ``gpdyn report`` never show a stopped run's numbers as final.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
import warnings
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpdyn.errors import InputError
from gpdyn.lock import WriterLock

LOCK_FILE = ".gpdyn-writer.lock"
METRICS_FILE = "metrics.jsonl"
FINISHED_FILE = "finished.json"
#: the config key of a run that writes FINISHED_FILE when it is done (its value: that file's name)
COMPLETION_KEY = "completion_marker"
#: the jobs whose folders say how far they got (RunDir.status)
RESUMABLE_JOBS = ("learn", "replay")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if hasattr(value, "tolist"):  # torch tensors, without importing torch here
        return value.tolist()
    return value


def read_json(path: Path) -> Any:
    """The JSON document in ``path``; unreadable or malformed is an InputError naming the file and line."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: unreadable ({err})") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: line {err.lineno}, column {err.colno}: not valid JSON ({err.msg})") from None


def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for each JSON object line of ``path`` (blank lines skipped).

    An unterminated last line that does not parse is a record cut by a crash: skipped
    with a warning. Any other line that is not a JSON object is an InputError naming it.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as err:
        raise InputError(f"{path}: unreadable ({err})") from err
    lines = data.split(b"\n")
    records = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        torn = number == len(lines)  # no newline after it: the write may have been cut
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            if torn:
                warnings.warn(f"{path}: line {number} is incomplete (the run stopped while writing it); skipped",
                              stacklevel=2)
                continue
            raise InputError(f"{path}: line {number}: not valid JSON ({err})") from None
        if not isinstance(record, dict):
            raise InputError(f"{path}: line {number}: expected a JSON object, found {type(record).__name__}")
        records.append((number, record))
    return records


class RunDir:
    """One run's folder. ``metrics.jsonl`` gets one JSON object per :meth:`log` call."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock: WriterLock | None = None

    @classmethod
    def create(cls, job: str, config: Mapping[str, Any], out: str | Path | None = None, logs: str | Path = "logs") -> RunDir:
        """Make the folder (``out`` or ``logs/<job>-<time>``), take its writer lock and write ``config.json``."""
        if out is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            made = _missing_folders(Path(logs))
            Path(logs).mkdir(parents=True, exist_ok=True)
            suffix = 1
            while True:  # two runs in one second: mkdir decides which gets the name
                path = Path(logs) / (f"{job}-{stamp}" + (f"-{suffix}" if suffix > 1 else ""))
                try:
                    path.mkdir()
                    break
                except FileExistsError:
                    suffix += 1
            made.insert(0, path)
        else:
            path = Path(out)
            _check_empty(path)
            made = _missing_folders(path)
            path.mkdir(parents=True, exist_ok=True)
        run = cls(path)
        run._hold()
        try:
            _check_empty(path)  # again, under the lock: another run may have filled it meanwhile
            run.write_json("config.json", {"job": job, **config})
        except BaseException:
            run.close()
            raise
        for watch in _NEW_RUN_WATCHES:
            watch.append(_NewRun(run, made))
        return run

    @classmethod
    def resume(cls, path: str | Path) -> RunDir:
        """An existing run folder, opened to write more: takes its writer lock (refused while another run holds it)."""
        run = cls(path)
        if not is_run_dir(run.path):
            raise InputError(f"{run.path}: not a run folder (no config.json)")
        run._hold()
        return run

    def close(self) -> None:
        """Release the writer lock, if this object holds it."""
        if self._lock is not None:
            self._lock.release()

    def _hold(self) -> None:
        """Take the folder's writer lock (once); after a crash, drop the torn last line of metrics.jsonl."""
        if self._lock is not None and self._lock.held:
            return
        self._lock = WriterLock(self.path / LOCK_FILE, f"run folder {self.path}")
        self._lock.acquire()
        weakref.finalize(self, self._lock.release)
        self._repair_metrics()

    def _repair_metrics(self) -> None:
        """Make ``metrics.jsonl`` end with a newline, so that the next record starts its own line.

        A last line without one was cut by a crash: it is completed when it parses
        (only the newline was lost), and removed otherwise.
        """
        file = self.path / METRICS_FILE
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            return
        if not data or data.endswith(b"\n"):
            return
        head, _, tail = data.rpartition(b"\n")
        try:
            json.loads(tail.decode("utf-8"))
            with open(file, "ab") as f:
                f.write(b"\n")
        except (UnicodeDecodeError, json.JSONDecodeError):
            line = head.count(b"\n") + (2 if head else 1)
            warnings.warn(f"{file}: removing the incomplete line {line} a stopped run left", stacklevel=3)
            os.truncate(file, len(head) + 1 if head else 0)

    def write_json(self, name: str, obj: Any) -> Path:
        self._hold()
        target = self.path / name
        tmp = target.with_name(target.name + ".tmp")
        # written whole, then renamed: a crash never leaves a half-written JSON file
        tmp.write_text(json.dumps(_jsonable(obj), indent=2, sort_keys=False) + "\n")
        tmp.replace(target)
        return target

    def log(self, **metrics: Any) -> None:
        """Append one record to ``metrics.jsonl`` (one write, flushed at once, so a crash keeps it)."""
        self._hold()
        line = json.dumps(_jsonable({"time": time.time(), **metrics})) + "\n"
        with open(self.path / METRICS_FILE, "a") as f:
            f.write(line)

    def numbered_metrics(self) -> list[tuple[int, dict[str, Any]]]:
        """``(line number, record)`` of every record in ``metrics.jsonl``, for messages that name the line."""
        return read_jsonl(self.path / METRICS_FILE)

    def metrics(self) -> list[dict[str, Any]]:
        return [record for _, record in self.numbered_metrics()]

    def config(self) -> dict[str, Any]:
        file = self.path / "config.json"
        config = read_json(file)
        if not isinstance(config, dict):
            raise InputError(f"{file}: expected a JSON object, found {type(config).__name__}")
        return config

    def finish(self, **info: Any) -> Path:
        """Mark the run finished: ``finished.json`` (``info`` and the time), written whole as the run's last act."""
        return self.write_json(FINISHED_FILE, {"finished": time.strftime("%Y-%m-%d %H:%M:%S"), **info})

    def finished(self) -> dict[str, Any] | None:
        """The contents of ``finished.json``, or None while the run is not finished."""
        file = self.path / FINISHED_FILE
        if not file.exists():
            return None
        marker = read_json(file)
        if not isinstance(marker, dict):
            raise InputError(f"{file}: expected a JSON object, found {type(marker).__name__}")
        return marker

    def status(self) -> RunStatus | None:
        """How far a ``learn`` or ``replay`` run got (None for the folders of other jobs, and for
        a folder made before the completion marker whose config says nothing of its plan)."""
        config = self.config()
        if config.get("job") not in RESUMABLE_JOBS:
            return None
        stream = config.get("protocol") == "stream"
        records = self.numbered_metrics()
        learners = config.get("learners") if config.get("job") == "replay" else [config.get("learner")]
        if not (isinstance(learners, list) and learners and all(isinstance(n, str) for n in learners)):
            # a config that does not say: the learners of the records, in their order
            learners = list(dict.fromkeys(r["learner"] for _, r in records if isinstance(r.get("learner"), str)))
            if not learners:
                return None
        if stream:
            summary = config.get("problem_summary") or config.get("problem")
            planned = summary.get("train") if isinstance(summary, dict) else None
        else:
            planned = config.get("planned_iterations", config.get("iterations"))
        if isinstance(planned, bool) or not isinstance(planned, int):
            planned = None
        done = {name: 0 for name in learners}
        streamed: set[str] = set()
        for _, r in records:
            name = r.get("learner", learners[0] if len(learners) == 1 else None)
            if name not in done:
                continue
            if stream and r.get("kind") == "stream" and isinstance(r.get("rows"), int):
                done[name] = max(done[name], r["rows"])
                if r.get("final") is True:
                    streamed.add(name)
            elif not stream and r.get("kind", "eval") == "eval" and isinstance(r.get("iteration"), int):
                done[name] = max(done[name], r["iteration"])
        if config.get(COMPLETION_KEY):
            finished = self.finished() is not None
        elif planned is None and not stream:  # a run made before the marker that says nothing of its plan
            return None
        elif stream:  # a run made before the marker: done when every stream finished
            finished = streamed == set(learners)
        else:
            finished = planned is not None and all(d >= planned for d in done.values())
        return RunStatus(self.path, finished, not finished and _writer_alive(self.path / LOCK_FILE),
                         "row" if stream else "iteration", planned, done)

    def summary(self) -> dict[str, Any]:
        """What ``gpdyn inspect`` shows: the config, the status of a learn or replay run, the number
        of metric records, the last one (partial when the run is unfinished), the files."""
        metrics = self.metrics()
        status = self.status()
        head: dict[str, Any] = {"run": str(self.path)}
        if status is not None:
            head["status"] = status.describe()
        last = "last_metrics" if status is None or status.finished else "last_metrics (partial, not final)"
        return {
            **head,
            "config": self.config(),
            "metric_records": len(metrics),
            last: metrics[-1] if metrics else None,
            "files": sorted(p.name for p in self.path.iterdir() if p.name != LOCK_FILE),
        }


@dataclass
class RunStatus:
    """How far a run got: ``done`` maps each learner to its last recorded iteration (or streamed
    row, ``unit == "row"``) of ``planned`` (None where the config does not say)."""

    path: Path
    finished: bool
    running: bool
    unit: str
    planned: int | None
    done: dict[str, int] = field(default_factory=dict)

    def _of(self, n: int) -> str:
        return f"{self.unit} {n}" + (f" of {self.planned}" if self.planned is not None else "")

    def describe(self) -> str:
        """One line: ``finished: 400 iterations``, ``stopped at iteration 40 of 400; rerun the same
        command to continue (with --out PATH)``, or per learner where a run has several."""
        several = len(self.done) > 1
        if self.finished:
            total = self.planned if self.planned is not None else max(self.done.values(), default=0)
            return f"finished: {total} {self.unit}s" + (" per learner" if several else "")
        if several:
            where = ", ".join(f"{name} at {self._of(n)}" if n else f"{name} not started" for name, n in self.done.items())
            where = f": {where}"
        else:
            where = f" at {self._of(next(iter(self.done.values())))}"
        if self.running:
            return f"running{where} so far (another process is writing this folder)"
        restart = " (an unfinished stream starts again from its first row)" if self.unit == "row" else ""
        return f"stopped{where}; rerun the same command to continue (with --out {self.path}){restart}"


def _writer_alive(lock_file: Path) -> bool:
    """Whether a live process holds the folder's writer lock (a killed writer's lock is free:
    the kernel drops it). Probed with a shared lock taken and dropped at once; only a writer
    starting at that very instant would find it taken and be refused."""
    try:
        fd = os.open(lock_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as err:
        return err.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


@dataclass
class _NewRun:
    """A run folder :meth:`RunDir.create` wrote its config into, and the folders it made for it
    (the run's own first, then the missing parents, deepest first; empty when ``--out`` existed)."""

    run: RunDir
    made: list[Path]


# the lists of :func:`discard_empty_new_runs` blocks that are running: RunDir.create adds to each
_NEW_RUN_WATCHES: list[list[_NewRun]] = []
# what a run folder holds before its job has written anything: its config and its writer lock
# (config.json.tmp: a config write that was cut short)
_BARE_RUN_FILES = frozenset({"config.json", "config.json.tmp", LOCK_FILE})


def _missing_folders(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    for folder in (path, *path.parents):
        if folder.exists() or folder == folder.parent or str(folder) in ("", "."):
            break
        missing.append(folder)
    return missing


def _holds_only_its_config(path: Path) -> bool:
    """Whether a run folder holds nothing but :data:`_BARE_RUN_FILES` and empty folders."""
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            if any(entry.iterdir()):
                return False
        elif entry.name not in _BARE_RUN_FILES:
            return False
    return True


@contextmanager
def discard_empty_new_runs() -> Iterator[list[Path]]:
    """Remove the run folders made inside the block when it fails, if they hold only their config.

    A command that stops on bad input after :meth:`RunDir.create` (a store that does not open,
    a learner option the learner refuses) would otherwise leave ``logs/<job>-<time>/config.json``
    behind, a folder that records no run. Only folders created inside the block whose job wrote
    nothing beyond ``config.json`` (empty folders aside) go, then the parents made for them
    (``logs/`` itself when it was new) if empty; a folder ``--out`` named that existed before
    keeps existing, without the config. Anything a job wrote (data, metrics, checkpoints) keeps
    its folder. The error goes on as raised; the list the block gets names the folders removed.
    """
    made: list[_NewRun] = []
    removed: list[Path] = []
    _NEW_RUN_WATCHES.append(made)
    try:
        yield removed
    except BaseException:
        for new in reversed(made):  # the newest first: a nested run folder before the one that holds it
            if _discard_if_bare(new):
                removed.append(new.run.path)
        raise
    finally:
        _NEW_RUN_WATCHES.remove(made)


def _discard_if_bare(new: _NewRun) -> bool:
    """Remove a run folder that holds only its config (see :func:`discard_empty_new_runs`); whether it did."""
    path = new.run.path
    try:
        if not path.is_dir() or not _holds_only_its_config(path):
            return False
        new.run.close()  # releasing the writer lock removes its file
        for entry in sorted(path.iterdir(), key=lambda e: e.is_dir()):
            if entry.is_dir():
                entry.rmdir()
            elif entry.name in _BARE_RUN_FILES:
                entry.unlink(missing_ok=True)
    except OSError:
        return False  # best effort: a folder that cannot go stays, the command's own error is what matters
    try:
        for folder in new.made:
            folder.rmdir()  # OSError when not empty (another run's folder in logs/): stops here
    except OSError:
        pass
    return True


def _check_empty(path: Path) -> None:
    """Refuse a folder that holds anything but a lock file (appending would mix two runs under one config)."""
    if path.exists() and (not path.is_dir() or any(p.name != LOCK_FILE for p in path.iterdir())):
        raise InputError(f"{path}: already exists and is not empty; choose another --out")


def is_run_dir(path: str | Path) -> bool:
    return (Path(path) / "config.json").is_file()
