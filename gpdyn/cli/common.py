"""Options and names shared by the command groups of the ``gpdyn`` command."""

from __future__ import annotations

import argparse
from pathlib import Path

LEARNER_NAMES = "svdgp, orth, orthnat, svi, ivsgpr, vsgpr, gpr, wiski, exact"
PROBLEM_NAMES = ("walker-1", "walker-2", "kuka")


def add_out(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=None, help="run folder (default logs/<job>-<time>)")


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default cpu)")
