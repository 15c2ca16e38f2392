"""Options and names shared by the command groups of the ``gpdyn`` command.

Learner, preset, problem and dtype names (:mod:`gpdyn.config`) come from their registries (:data:`gpdyn.gp.LEARNERS`,
:data:`gpdyn.gp.PRESETS`, :data:`gpdyn.data.problems.PROBLEMS`, :data:`gpdyn.device.DTYPES`). Those
modules import torch (about two seconds of CPU), which neither ``--help`` nor a command that only reads
files should pay: the help lists a copy of each registry's names (tests/test_cli_help.py checks that the
copies match), and a value given on the command line is checked against the registry itself.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

from gpdyn.config import DTYPE_NAMES, LEARNER_NAMES, PRESET_NAMES, PROBLEM_NAMES, PROTOCOL_NAMES

if TYPE_CHECKING:
    from gpdyn.runs import RunDir


def run_for_args(job: str, args: argparse.Namespace) -> RunDir:
    """The run folder of a command-line job (``args.out`` or ``logs/<job>-<time>``), its config
    the parsed arguments; prints its path.

    Jobs whose output is a store (collect, import) call this once the work has succeeded,
    so that bad input leaves no empty run folder behind.
    """
    from gpdyn.runs import RunDir

    config = {k: v for k, v in vars(args).items() if k not in ("handler", "out")}
    run = RunDir.create(job, config, out=getattr(args, "out", None))
    print(f"run folder: {run.path}")  # stdout, not the log: where the result is, for a script to read
    return run


def add_seed(p: argparse.ArgumentParser, what: str) -> None:
    """``--seed``: the seed of ``what`` (default 0)."""
    p.add_argument("--seed", type=SEED, default=0, help=f"seed of {what} (default %(default)s)")


def add_out(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=None, help="run folder (default logs/<job>-<time>)")


def add_device(p: argparse.ArgumentParser) -> None:
    """``--device``; :func:`gpdyn.cli.main` checks it with :func:`gpdyn.device.resolve_device` before any work."""
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda or cuda:INDEX (default cpu)")


def add_dtype(p: argparse.ArgumentParser) -> None:
    """``--dtype``: ``None`` when not given, which :func:`gpdyn.device.resolve_dtype` turns into the device's default."""
    p.add_argument("--dtype", choices=DTYPE_NAMES, default=None, metavar="DTYPE",
                   help="one of %(choices)s (default float32 on CUDA, float64 on the CPU)")


def add_learner(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--learner", choices=LEARNER_NAMES, required=required, metavar="NAME", help="learner: %(choices)s")


def add_preset(p: argparse.ArgumentParser, what: str = "the learner's") -> None:
    p.add_argument("--preset", choices=PRESET_NAMES, default=None, metavar="NAME",
                   help=f"{what} sizes at a named scale: %(choices)s (default: cpu on the CPU, paper on CUDA; "
                        "bases are capped at the training rows); --size overrides one of them, --n-delta sets N_Delta")


def add_protocol(p: argparse.ArgumentParser, help: str) -> None:
    """``--protocol``: which rows are held out (and, for ``ordered``, the order of training)."""
    p.add_argument("--protocol", choices=PROTOCOL_NAMES, default="iid", metavar="NAME",
                   help=f"%(choices)s (default %(default)s): {help}")


def add_problem(p: argparse.ArgumentParser) -> None:
    p.add_argument("--problem", choices=PROBLEM_NAMES, required=True, metavar="NAME", help="regression problem: %(choices)s")


class Number:
    """An argparse ``type``: a number of ``kind`` (int or float) in a range, finite.

    ``low``/``high`` bound it (``open_low``: strictly above ``low``); a value outside, NaN,
    inf or text that is no number is an argparse error naming the option (exit 2). Numbers
    that size memory are bounded where the memory is known (:func:`gpdyn.device.check_memory`).
    """

    def __init__(self, kind: type = int, low: float | None = None, high: float | None = None, *,
                 open_low: bool = False) -> None:
        self.kind, self.low, self.high, self.open_low = kind, low, high, open_low
        self.__name__ = "integer" if kind is int else "number"  # argparse names the type by it

    def describe(self) -> str:
        def show(v: float) -> str:
            return str(int(v)) if float(v).is_integer() else f"{v:g}"

        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.open_low else '>='} {show(self.low)}")
        if self.high is not None:
            parts.append(f"<= {show(self.high)}")
        return f"{'an integer' if self.kind is int else 'a finite number'}{' ' if parts else ''}{' and '.join(parts)}"

    def __call__(self, text: str) -> int | float:
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not {self.describe()}") from None
        ok = math.isfinite(value)
        if ok and self.low is not None:
            ok = value > self.low if self.open_low else value >= self.low
        if ok and self.high is not None:
            ok = value <= self.high
        if not ok:
            raise argparse.ArgumentTypeError(f"{text} is out of range: must be {self.describe()}")
        return value


class Numbers(Number):
    """An argparse ``type``: comma-separated numbers, each checked as :class:`Number` (``"0.5"`` or ``"0.5,0.5,0.3"``)."""

    def __call__(self, text: str) -> list[int | float]:  # type: ignore[override]
        items = [s.strip() for s in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"'{text}': expected comma-separated numbers, each {self.describe()}")
        return [super(Numbers, self).__call__(item) for item in items]


COUNT = Number(int, 1)  # iterations, episodes, samples, repeats: at least one
NON_NEGATIVE_INT = Number(int, 0)
SEED = Number(int, 0, 2**32 - 1)  # gpdyn.device.MAX_SEED (not imported here: it imports torch)
NON_NEGATIVE = Number(float, 0)  # noise levels, weights, masses
POSITIVE = Number(float, 0, open_low=True)  # rates, speeds, factors, step sizes
FRACTION = Number(float, 0, 1)
POSITIVE_LIST = Numbers(float, 0, open_low=True)  # velocity limits, torque scales, step sizes
NON_NEGATIVE_LIST = Numbers(float, 0)  # joint damping, armature, friction


def comma_list(text: str) -> list[str]:
    """``"a, b,"`` -> ``["a", "b"]`` (an argparse ``type``)."""
    return [s.strip() for s in text.split(",") if s.strip()]


def learner_list(text: str) -> list[str]:
    """``"svdgp, svi"`` -> ``["svdgp", "svi"]``, each a registered learner (an argparse ``type``)."""
    names = comma_list(text)
    unknown = [n for n in names if n not in LEARNER_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown learner(s) {unknown or 'none given'}; choose from {LEARNER_NAMES}")
    return names


def add_learners(p: argparse.ArgumentParser) -> None:
    action = p.add_argument("--learners", type=learner_list, required=True, metavar="A,B,...",
                            help="comma-separated learners from: %(names)s")
    action.names = LEARNER_NAMES  # argparse fills %(names)s in the help from the action's attributes
