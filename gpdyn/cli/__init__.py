"""The ``gpdyn`` command: one subcommand per job (docs/architecture.md, "Command line").

All argparse code lives in this package: :mod:`gpdyn.cli.jobs` (demo, inspect, learn,
replay, bench, report, render, doctor), :mod:`gpdyn.cli.collect` (collect, import),
:mod:`gpdyn.cli.control` (control walker, and the options every robot's run takes) and
:mod:`gpdyn.cli.control_arm` (control kuka, control arm); :mod:`gpdyn.cli.common` holds
the shared options and the registries' names. A subcommand's handler (a function, or
``"module:function"``) takes the parsed arguments and returns an exit status; it imports
its stage only when it runs, so that ``--help`` needs neither torch nor MuJoCo.

Before any handler runs, :func:`main` applies ``--threads`` and checks ``--device``
through :mod:`gpdyn.device`, except for the commands that only read files or print
(``inspect``, ``report``, ``control recipes``, ``doctor``: ``reads_only`` in their parser's
defaults), which never import torch or MuJoCo (``doctor --deep`` loads both itself). Bad
input (:class:`gpdyn.errors.InputError`) exits 2
with its message, as argparse does for a malformed option; a run folder the failed command
made and left holding nothing but its config is removed (:func:`gpdyn.runs.discard_empty_new_runs`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
from collections.abc import Callable, Sequence

from gpdyn import __version__
from gpdyn.cli import collect, control, jobs, logs
from gpdyn.environment import check as check_environment
from gpdyn.errors import InputError
from gpdyn.sim.stopping import StopSignals

EXIT_INPUT = 2

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpdyn",
        description="Learn robot dynamics online with Gaussian processes and control robots with them.",
        epilog="Run 'gpdyn COMMAND --help' for the options of a command. --threads, --quiet and --verbose go "
               "before the command or after it. Messages and progress go to stderr (progress bars only on a "
               "terminal, elsewhere a line every 10 s); a command's result (tables, paths) goes to stdout.",
    )
    parser.add_argument("--version", action="version", version=f"gpdyn {__version__}")
    _add_threads(parser, default=1)
    _add_verbosity(parser, default=logging.INFO)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, help="the job to run")
    jobs.add_demo(sub)
    collect.add_parsers(sub)
    jobs.add_inspect(sub)
    jobs.add_learn(sub)
    jobs.add_replay(sub)
    control.add_parsers(sub)
    jobs.add_bench(sub)
    jobs.add_report(sub)
    jobs.add_render(sub)
    jobs.add_doctor(sub)
    _finish(sub)
    return parser


def _add_threads(p: argparse.ArgumentParser, default: int | str) -> None:
    p.add_argument("--threads", type=int, default=default,
                   help="torch CPU threads (default 1: a second thread gains little on 2 cores)")


def _add_verbosity(p: argparse.ArgumentParser, default: int | str) -> None:
    # messages go to stderr through the gpdyn loggers (gpdyn.cli.logs); a command's result goes to stdout
    group = p.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", dest="log_level", action="store_const", const=logging.WARNING, default=default,
                       help="only warnings and errors on stderr, no progress (default: messages and progress)")
    group.add_argument("-v", "--verbose", dest="log_level", action="store_const", const=logging.DEBUG, default=default,
                       help="also debug messages (default: messages and progress)")


def _finish(sub: argparse._SubParsersAction) -> None:
    """Every command also takes ``--threads``, ``--quiet`` and ``--verbose`` after its name
    (``gpdyn learn ... --threads 2 --quiet``),
    and a group's line in ``gpdyn --help`` ends with its subcommands, e.g. ``(walker, kuka)``."""
    for line in sub._choices_actions:
        parser = sub.choices[line.dest]
        groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if groups:
            line.help = f"{line.help} ({', '.join(groups[0].choices)})"
            _finish(groups[0])
        else:
            _add_threads(parser, default=argparse.SUPPRESS)  # absent: the value before the command stands
            _add_verbosity(parser, default=argparse.SUPPRESS)


def _handler(args: argparse.Namespace) -> Callable[[argparse.Namespace], int | None]:
    """The subcommand's handler: a function, or ``"module:function"`` imported now."""
    if callable(args.handler):
        return args.handler
    module_name, func_name = args.handler.split(":")
    return getattr(importlib.import_module(module_name), func_name)


def _out_of_memory(err: RuntimeError) -> bool:
    """Whether torch's allocator refused (CPU: "can't allocate memory"; CUDA: torch.OutOfMemoryError)."""
    import torch

    return isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in str(err)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in ``argv`` (default ``sys.argv[1:]``); return its exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help (0) or a malformed option (2, argparse has printed why)
        return int(done.code or 0)
    name = " ".join(str(getattr(args, k)) for k in ("command", "source", "format", "target", "robot") if getattr(args, k, None))
    logs.configure(args.log_level, f"gpdyn {name}")
    # a collector stops between episodes on SIGTERM or SIGINT: from here on, so that one landing while torch or
    # MuJoCo is imported (a C extension's import or callback aborts the process) waits for its first check too
    stopping = StopSignals() if args.command == "collect" else contextlib.nullcontext()
    with stopping:
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """The command of ``args`` with its errors as exit statuses (see :func:`main`)."""
    removed: list = []  # run folders the failed command made and left bare (gpdyn.runs.discard_empty_new_runs)
    try:
        check_environment()  # MUJOCO_GL and GPDYN_NATIVE, before MuJoCo or the native kernel reads them
        if not getattr(args, "reads_only", False) or "torch" in sys.modules:
            from gpdyn.device import resolve_device, set_threads  # imports torch: not for --help

            set_threads(args.threads)
            if hasattr(args, "device"):
                # checked before any work: a missing GPU is an input error, not a traceback midway
                args.device = str(resolve_device(args.device))
        from gpdyn.runs import discard_empty_new_runs

        log.debug("options: %s", {k: v for k, v in vars(args).items() if k != "handler"})
        with discard_empty_new_runs() as removed:
            return int(_handler(args)(args) or 0)
    except InputError as err:
        log.error("%s", err)  # "gpdyn COMMAND: error: ...", as argparse words a malformed option
        for path in removed:
            log.warning("removed the run folder %s: it held nothing but its config", path)
        return EXIT_INPUT
    except (MemoryError, RuntimeError) as err:
        # sizes that the options' own checks (gpdyn.device.check_memory) could not foresee:
        # the allocator's refusal is still the user's sizes, not a bug
        if not isinstance(err, MemoryError) and not _out_of_memory(err):
            raise
        log.error("out of memory (%s); choose smaller sizes", str(err).splitlines()[0][:200])
        return EXIT_INPUT
    except KeyboardInterrupt:
        log.warning("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
