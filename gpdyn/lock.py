"""One writer per folder: an advisory lock file that names its holder.

An episode store and a run folder each take a :class:`WriterLock` before their first
write. The lock is ``flock(2)`` on a lock file, so the kernel drops it when the holder
dies however it dies (``kill -9`` included): a lock left by a dead process is stale by
construction and the next writer takes it over, with a warning naming the dead holder.
The file records the holder's pid, host, start time and command line, for the message
that refuses a second writer. Readers never lock.

A process forked while it holds a lock does not hold it in the child (the child's copy
of the descriptor is closed at fork), so a collector's worker processes can neither keep
a dead parent's lock alive nor release the parent's lock when they exit.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from gpdyn.errors import InputError

# descriptors of the locks this process holds, closed in a forked child
_HELD: dict[int, "WriterLock"] = {}


def _after_fork_in_child() -> None:
    for lock in list(_HELD.values()):
        lock._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)


def describe(holder: dict[str, Any]) -> str:
    """``pid 123 on host h since 2024-01-01 12:00:00 (gpdyn collect walker ...)``."""
    text = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        text += " (this process)"
    if holder.get("started"):
        text += f" since {holder['started']}"
    if holder.get("command"):
        text += f" ({holder['command']})"
    return text


class WriterLock:
    """An exclusive, non-blocking lock on ``path`` (the lock file), held until :meth:`release`.

    ``what`` names the locked thing in messages (``"store x.zarr"``); ``error`` is the
    :class:`InputError` subclass raised when another writer holds it.
    """

    def __init__(self, path: str | Path, what: str, error: type[InputError] = InputError) -> None:
        self.path = Path(path)
        self.what = what
        self.error = error
        self._fd: int | None = None
        self._pid = os.getpid()

    @property
    def held(self) -> bool:
        return self._fd is not None and self._pid == os.getpid()

    def acquire(self) -> WriterLock:
        """Take the lock or raise ``error`` naming the holder; a stale lock is taken over."""
        if self.held:
            return self
        for _ in range(10):  # only a holder releasing at the same moment makes this loop
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self._read(fd)
                os.close(fd)
                raise self.error(
                    f"{self.what} is open for writing by {describe(holder)}; one writer at a time "
                    f"(lock file {self.path}; it is released when that process ends)"
                ) from None
            except OSError as err:
                os.close(fd)
                if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise self.error(
                        f"{self.what}: the file system does not support locks ({err.strerror}); "
                        f"cannot guarantee one writer (lock file {self.path})"
                    ) from err
                raise
            # The previous holder unlinks the file while it holds the lock: a lock on an
            # unlinked file guards nothing, so make sure the path still names our file.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            previous = self._read(fd)
            if previous:
                # a release removes the file: one still there with a record is a holder
                # that died without releasing (kill -9, power loss), and the kernel freed it
                warnings.warn(
                    f"{self.what}: taking over the stale lock of {describe(previous)}, which ended without "
                    "releasing it",
                    stacklevel=3,
                )
            self._fd = fd
            self._pid = os.getpid()
            self._write(fd)
            _HELD[id(self)] = self
            return self
        raise self.error(f"{self.what}: could not take the lock file {self.path} (it keeps changing)")

    def release(self) -> None:
        """Drop the lock and remove the lock file; a no-op when not held (or in a forked child)."""
        if not self.held:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still locked: see acquire
        finally:
            self._forget()

    def _forget(self) -> None:
        """Close the descriptor without touching the file (a forked child's copy)."""
        _HELD.pop(id(self), None)
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise self.error(f"{self.what}: cannot create the lock file {self.path} ({err.strerror})") from err

    @staticmethod
    def _read(fd: int) -> dict[str, Any]:
        try:
            text = os.pread(fd, 65536, 0).decode("utf-8", "replace")
            holder = json.loads(text) if text.strip() else {}
        except (OSError, ValueError):
            return {}
        return holder if isinstance(holder, dict) else {}

    def _write(self, fd: int) -> None:
        pid = os.getpid()
        record = {
            "pid": pid,
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv)[:500],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)

    def __enter__(self) -> WriterLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

