"""The command line's messages: the ``gpdyn`` loggers, set up once by :func:`gpdyn.cli.main`.

gpdyn's modules log through ``logging.getLogger(__name__)`` and configure nothing; the
command sends the ``gpdyn`` hierarchy to stderr, one compact line a message:

- INFO, the default: the message as it is (``pretrained svdgp on 17560 kuka rows in 3.1 s``);
- WARNING and ERROR: ``gpdyn COMMAND: warning: ...``, ``gpdyn COMMAND: error: ...``, as
  argparse words its own errors;
- DEBUG (``--verbose``): ``gpdyn COMMAND: debug: MODULE: ...``.

``--quiet`` keeps warnings and errors only, and turns progress off (:mod:`gpdyn.progress`).
What a command prints as its result (tables, report and run-folder paths) goes to stdout
and is not logged.
"""

from __future__ import annotations

import logging
import sys

#: the logger every gpdyn module's logger descends from
ROOT = "gpdyn"


class _Stderr(logging.Handler):
    """Writes to whatever ``sys.stderr`` is when a message comes (a test's capture, a
    redirect made after setup); on a terminal through ``tqdm.write``, so that a progress
    bar being drawn there moves below the line instead of being cut by it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            stream = sys.stderr
            if stream is None:
                return
            if stream.isatty():
                from tqdm import tqdm

                tqdm.write(text, file=stream)
            else:
                stream.write(text + "\n")
                stream.flush()
        except Exception:  # noqa: BLE001 -- logging's own rule: a failing message must not stop the run
            self.handleError(record)


class _CompactFormatter(logging.Formatter):
    def __init__(self, command: str) -> None:
        super().__init__()
        self.command = command

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.ERROR:
            return f"{self.command}: error: {text}"
        if record.levelno >= logging.WARNING:
            return f"{self.command}: warning: {text}"
        if record.levelno < logging.INFO:
            return f"{self.command}: debug: {record.name}: {text}"
        return text


def configure(level: int, command: str = "gpdyn") -> None:
    """Send the ``gpdyn`` loggers' messages at ``level`` and above to stderr, prefixed for
    warnings and errors by ``command`` (e.g. ``gpdyn learn``). Called again (another
    ``main`` in the same process), it replaces what it set before."""
    logger = logging.getLogger(ROOT)
    for handler in [h for h in logger.handlers if isinstance(h, _Stderr)]:
        logger.removeHandler(handler)
    handler = _Stderr()
    handler.setFormatter(_CompactFormatter(command))
    logger.addHandler(handler)
    logger.setLevel(level)
    # the lines are written here; a handler on the root logger (an embedding program's,
    # pytest's caplog) still receives them, since propagation stays on
