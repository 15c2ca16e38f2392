"""How a collector stops early: on SIGTERM or SIGINT, or when one of its worker processes dies.

A collector commits whole episodes to its store (docs/reliability.md "Collectors"). While
:class:`StopSignals` is active, SIGTERM and SIGINT only set a flag, so that they never
land in the middle of a store write; the collector checks the flag between episodes,
commits what has finished and raises :class:`CollectionStopped`, which the command line
reports with the counts kept and exits ``128 + signal`` (143 for SIGTERM, 130 for SIGINT),
as a shell reports a process ended by that signal. A dead worker exits 1.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any, ClassVar

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class CollectionStopped(Exception):
    """A collection that ended before its last episode; what it committed stays in the store.

    ``exit_status`` is what the command exits with; the message says what was kept and
    how to continue.
    """

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class StopSignals:
    """A context in which SIGTERM and SIGINT set :attr:`signum` instead of ending the process.

    The previous handlers come back on exit. A signal the process ignores stays ignored.
    Outside the main thread Python cannot install handlers: there the context does
    nothing and the signals act as before. Contexts nest: an inner one shares the outermost
    one's handlers and flag, so that a command can enter one before its imports (a signal
    landing inside a C extension's import or callback aborts the process) and the
    collector's own context still sees a signal that came during them.
    """

    _outermost: ClassVar[StopSignals | None] = None

    def __init__(self) -> None:
        self._signum: int | None = None
        self._outer: StopSignals | None = None
        self._previous: dict[int, Any] = {}

    @property
    def signum(self) -> int | None:
        return self._outer.signum if self._outer is not None else self._signum

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._signum = signum

    def __enter__(self) -> StopSignals:
        if StopSignals._outermost is not None:
            self._outer = StopSignals._outermost
            return self
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                # an ignored signal stays ignored: a shell starts background jobs with SIGINT ignored
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._handle)
            StopSignals._outermost = self
        return self

    def __exit__(self, *exc: object) -> None:
        if self._outer is not None:
            self._outer = None
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if StopSignals._outermost is self:
            StopSignals._outermost = None

    def check(self, kept: str) -> None:
        """Raise :class:`CollectionStopped` if a stop signal came; ``kept`` says what the store holds."""
        if self.signum is not None:
            raise CollectionStopped(
                f"stopped by {signal_name(self.signum)}; {kept}. Rerun the same command to continue.",
                128 + self.signum,
            )


__all__ = ["CollectionStopped", "StopSignals", "signal_name"]
