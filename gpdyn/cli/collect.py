"""`gpdyn collect` and `gpdyn import`: the commands that fill an episode store."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpdyn.cli.common import add_device, add_out


def add_parsers(sub: argparse._SubParsersAction) -> None:
    collect = sub.add_parser("collect", help="collect episodes into a store").add_subparsers(
        dest="source", metavar="SOURCE", required=True
    )
    p = collect.add_parser("walker", help="Walker2d rollouts of a TRPO policy")
    p.add_argument("--store", type=Path, required=True, help="zarr store (created, or continued if it exists)")
    p.add_argument("--episodes", type=int, required=True, help="total episodes the store should hold")
    p.add_argument(
        "--policy", type=Path, action="append", default=None,
        help="policy file (default: the shipped policy); repeat it to cycle episodes over several policies",
    )
    p.add_argument(
        "--mix", action="store_true",
        help="cycle episodes over the shipped training checkpoints and the final policy (several gaits)",
    )
    p.add_argument("--noise", type=float, default=0.0, help="std of Gaussian action noise")
    p.add_argument("--envs", type=int, default=2, help="environments in parallel")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--video", type=Path, default=None, help="also write an MP4 of the first episode")
    add_out(p)
    p.set_defaults(handler="gpdyn.sim.walker:cli_collect")

    p = collect.add_parser("kuka", help="simulated KUKA iiwa inverse-dynamics stream")
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--offline", type=int, default=17560, help="offline samples (default 17560, as KUKA1)")
    p.add_argument("--online", type=int, default=180360, help="online samples (default 180360, as KUKA1)")
    p.add_argument("--payload", type=float, default=0.0, help="end-effector payload in kg")
    p.add_argument("--family", choices=("kuka1", "kuka2"), default="kuka1", help="trajectory family")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", type=float, default=100.0, help="sample rate in Hz, a whole number of 1 ms steps")
    p.add_argument("--torque-noise", type=float, default=0.0, help="std of torque sensor noise, N m")
    p.add_argument("--position-noise", type=float, default=0.0, help="std of position sensor noise, rad")
    p.add_argument(
        "--derivatives", choices=("exact", "fd"), default="exact", help="exact qd, qdd or finite differences of measured q"
    )
    add_out(p)
    p.set_defaults(handler="gpdyn.sim.kuka:cli_collect")

    imp = sub.add_parser("import", help="import a real dataset into a store").add_subparsers(
        dest="format", metavar="FORMAT", required=True
    )
    p = imp.add_parser("kuka-ilgr", help="KUKA1/KUKA2 text files (28 columns)")
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--store", type=Path, required=True)
    add_out(p)
    p.set_defaults(handler="gpdyn.data.importers:cli_import")
    p = imp.add_parser("sarcos", help="SARCOS .mat files (sarcos_inv.mat)")
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--store", type=Path, required=True)
    add_out(p)
    p.set_defaults(handler="gpdyn.data.importers:cli_import")

