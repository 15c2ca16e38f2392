"""Progress of long work: a tqdm bar on a terminal, a logged line now and then elsewhere.

A bar redraws itself with carriage returns, which a file or a pipe keeps as one endless
line. :func:`progress_bar` therefore draws only when stderr is a terminal; otherwise it
returns a bar that draws nothing and logs its state (``gpdyn.progress`` at INFO) at most
every :data:`LOG_SECONDS`, and once more when a kept bar (``leave=True``) closes. Under
``gpdyn --quiet`` (the ``gpdyn`` logger set above INFO) there is neither.

Every bar in gpdyn comes from here: the functions that take an open bar (``bar=``) take
what :func:`progress_bar` returns, a :class:`tqdm.tqdm`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable
from typing import Any

from tqdm import tqdm

#: the shortest time between two logged lines of one bar, in seconds
LOG_SECONDS = 10.0

log = logging.getLogger(__name__)


def _stderr_is_terminal() -> bool:
    stream = sys.stderr
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # no stream, or a closed one
        return False


def _quiet() -> bool:
    """Whether the ``gpdyn`` logger was set above INFO (``--quiet``). Unset (a library
    caller that configured nothing) is not quiet: a terminal still gets its bars."""
    level = logging.getLogger("gpdyn").level
    return level > logging.INFO


def progress_bar(iterable: Iterable[Any] | None = None, *, disable: bool = False, **options: Any) -> tqdm:
    """A :class:`tqdm.tqdm` over ``iterable`` (or updated by hand, with ``total=``), drawn
    only on a terminal; ``options`` are tqdm's (``desc``, ``total``, ``unit``, ``leave``, ...)."""
    if disable or _quiet():
        return tqdm(iterable, disable=True, **options)
    if _stderr_is_terminal():
        return tqdm(iterable, **options)
    if not log.isEnabledFor(logging.INFO):  # its lines would go nowhere
        return tqdm(iterable, disable=True, **options)
    return LoggedProgress(iterable, **options)


class _Discard:
    """Where a :class:`LoggedProgress` sends tqdm's own drawing: nowhere."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


class LoggedProgress(tqdm):
    """A tqdm that draws nothing and logs one line at a time instead: at most every
    :data:`LOG_SECONDS` while it runs, and a last one when it closes if it is kept
    (``leave=True``; an inner bar with ``leave=False`` closes without a line)."""

    KNOWN_TOTAL = "{desc}: {n_fmt}/{total_fmt} {unit} ({percentage:.0f}%) in {elapsed}, {remaining} left, {rate_fmt}{postfix}"
    UNKNOWN_TOTAL = "{desc}: {n_fmt} {unit} in {elapsed}, {rate_fmt}{postfix}"

    def __init__(self, iterable: Iterable[Any] | None = None, **options: Any) -> None:
        self._started = False  # tqdm displays once when created: nothing worth a line yet
        options.pop("file", None)
        options.pop("bar_format", None)
        options.setdefault("desc", "progress")
        # tqdm's own refresh then comes no more often than a line may be logged
        options.update(file=_Discard(), mininterval=LOG_SECONDS, maxinterval=max(LOG_SECONDS, options.get("maxinterval", 0)))
        super().__init__(iterable, **options)
        self._logged_at = time.monotonic()
        self._started = True

    def line(self) -> str:
        """The bar's state in one line, without the bar."""
        known = self.total is not None and self.total > 0
        state = self.format_dict
        # tqdm.set_description appends ": " to the description; the line puts its own
        state["prefix"] = (state.get("prefix") or "progress").removesuffix(": ")
        return self.format_meter(**{**state, "bar_format": self.KNOWN_TOTAL if known else self.UNKNOWN_TOTAL})

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if not self._started or msg is not None:  # created, or tqdm clearing its bar (msg='')
            return True
        closing = self.disable  # tqdm.close disables the bar before its last display
        now = time.monotonic()
        if closing or now - self._logged_at >= LOG_SECONDS:
            self._logged_at = now
            log.info(self.line())
        return True
