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

The lock file may sit in a folder other users can write (a shared data folder), so what
is at its path is not trusted: it is opened with ``O_NOFOLLOW`` and ``O_NONBLOCK`` and
must be a regular file with one link (a symbolic link, a hard link to another file, a
directory, a FIFO, a socket or a device is refused with the lock's error naming the
path, and nothing is written to it, so a link planted there cannot make gpdyn overwrite
the file it points to; a FIFO never blocks). The file's content is replaced only when it
is a lock record, empty, or only NUL bytes (a record torn by a crash); anything else is
someone's data and is refused.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from gpdyn.errors import InputError

#: a lock record is far shorter: a larger file at the lock's path is not one
MAX_RECORD_BYTES = 65536

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
                same = os.path.samestat(os.fstat(fd), os.lstat(self.path))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            try:
                self._check_content(fd)  # under the lock: no live holder is writing its record now
            except BaseException:
                os.close(fd)
                raise
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
        """A descriptor of the lock file, created when absent; anything at the path but a
        regular file with one link is refused before (and, against a swap, after) opening."""
        try:
            self._check_kind(os.lstat(self.path))  # a device is not even opened
        except FileNotFoundError:
            pass
        except OSError as err:
            raise self.error(f"{self.what}: cannot read the lock file {self.path} ({err.strerror})") from err
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as err:
            if err.errno == errno.ELOOP:  # O_NOFOLLOW: a link appeared since the check
                raise self.error(self._refusal("is a symbolic link")) from None
            if err.errno == errno.EISDIR:
                raise self.error(self._refusal("is a directory")) from None
            raise self.error(f"{self.what}: cannot create the lock file {self.path} ({err.strerror})") from err
        try:
            self._check_kind(os.fstat(fd))
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _check_kind(self, st: os.stat_result) -> None:
        """Refuse anything but a regular file with one link at the lock's path."""
        if stat.S_ISLNK(st.st_mode):
            try:
                target = f" (to {os.readlink(self.path)})"
            except OSError:
                target = ""
            raise self.error(self._refusal(f"is a symbolic link{target}"))
        if not stat.S_ISREG(st.st_mode):
            kinds = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket",
                     stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device"}
            kind = next((name for test, name in kinds.items() if test(st.st_mode)), "not a regular file")
            raise self.error(self._refusal(f"is {kind}"))
        if st.st_nlink != 1:
            raise self.error(self._refusal(f"has {st.st_nlink} hard links (another name for some other file)"))

    def _check_content(self, fd: int) -> None:
        """Refuse a file whose content is neither a lock record nor what a crash leaves of one."""
        try:
            data = os.pread(fd, MAX_RECORD_BYTES + 1, 0)
        except OSError as err:
            raise self.error(f"{self.what}: cannot read the lock file {self.path} ({err.strerror})") from err
        if not data.strip(b"\0 \t\r\n"):
            return  # empty, or zeros where a crash lost the record's data
        if len(data) <= MAX_RECORD_BYTES:
            try:
                record = json.loads(data.decode("utf-8"))
            except ValueError:
                record = None
            if isinstance(record, dict) and "pid" in record:
                return
        raise self.error(self._refusal(f"holds {len(data)}{'+' if len(data) > MAX_RECORD_BYTES else ''} bytes "
                                       "that are not a gpdyn lock record"))

    def _refusal(self, problem: str) -> str:
        return (f"{self.what}: the lock file {self.path} {problem}; gpdyn writes its lock only into a regular "
                "file of its own and leaves this untouched: remove it (or choose another path) if no gpdyn "
                "process uses it")

    @staticmethod
    def _read(fd: int) -> dict[str, Any]:
        try:
            text = os.pread(fd, MAX_RECORD_BYTES, 0).decode("utf-8", "replace")
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

