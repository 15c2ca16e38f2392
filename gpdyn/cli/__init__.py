"""The ``gpdyn`` command: one subcommand per job (DESIGN.md "Command line").

Each subcommand's handler lives with its stage as ``module:function`` taking the
parsed arguments and returning an exit status; the module is imported only when the
subcommand runs. Bad input (:class:`gpdyn.errors.InputError`) exits 2 with its
message; a stage that is not built yet says so and exits 3.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from gpdyn.cli import collect, control
from gpdyn.cli.common import LEARNER_NAMES, PROBLEM_NAMES, add_device, add_out
from gpdyn.errors import InputError

EXIT_INPUT = 2
EXIT_NOT_BUILT = 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpdyn",
        description="Learn robot dynamics online with Gaussian processes and control robots with them.",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (default 1: a second thread gains little on 2 cores)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("demo", help="the main job: the whole pipeline on a small default")
    add_out(p)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler="gpdyn.experiments.demo:cli_demo")

    collect.add_parsers(sub)
    p = sub.add_parser("inspect", help="summary of a store or a run folder")
    p.add_argument("path", type=Path)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler="gpdyn.cli:cli_inspect")

    p = sub.add_parser("learn", help="run the online learning protocol of one learner on a problem")
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--problem", choices=PROBLEM_NAMES, required=True)
    p.add_argument("--learner", required=True, help=LEARNER_NAMES)
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=1024, help="minibatch N_m (default 1024)")
    p.add_argument("--n-delta", type=int, default=128, help="basis functions added per iteration (default 128)")
    p.add_argument("--eval-every", type=int, default=100, help="iterations between held-out evaluations")
    p.add_argument("--dtype", choices=("float32", "float64"), default=None, help="default float32 on CUDA, float64 on CPU")
    p.add_argument("--size", action="append", default=[], metavar="KEY=VALUE", help="learner option, e.g. m_alpha=4096 (repeatable)")
    add_device(p)
    add_out(p)
    p.set_defaults(handler="gpdyn.experiments.learn:cli_learn")

    p = sub.add_parser("replay", help="several learners on one dataset, side by side (SVDGP Table 2)")
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--problem", choices=PROBLEM_NAMES, required=True)
    p.add_argument("--learners", required=True, help=f"comma-separated: {LEARNER_NAMES}")
    p.add_argument("--protocol", choices=("iid", "ordered"), default="iid",
                   help="iid minibatches (SVDGP), or init on the offline part then stream in order (ILGR)")
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=1024, help="minibatch N_m (default 1024)")
    p.add_argument("--n-delta", type=int, default=128, help="basis functions added per iteration (default 128)")
    p.add_argument("--eval-every", type=int, default=100, help="iterations between held-out evaluations")
    p.add_argument("--init-iterations", type=int, default=200, help="ordered protocol: iterations on the offline part")
    p.add_argument("--eval-rows", type=int, default=None,
                   help="score on a seeded subset of this many held-out rows (default: all of them)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "float64"), default=None, help="default float32 on CUDA, float64 on CPU")
    p.add_argument("--size", action="append", default=[], metavar="LEARNER.KEY=VALUE",
                   help="learner option, e.g. svdgp.m_alpha=4096 (repeatable)")
    p.add_argument("--select-lr", default=None, metavar="G1,G2,...",
                   help="choose each learner's step size gamma_0 from these by its objective after "
                        "--select-iterations iterations, as SVDGP Section 4 (e.g. 0.1,0.01,0.001)")
    p.add_argument("--select-iterations", type=int, default=100)
    add_device(p)
    add_out(p)
    p.set_defaults(handler="gpdyn.experiments.replay:cli_replay")

    control.add_parsers(sub)
    bench = sub.add_parser("bench", help="benchmarks that print ratios measured in one run").add_subparsers(
        dest="target", metavar="TARGET", required=True
    )
    for target, handler, text in (
        ("learners", "gpdyn.experiments.bench_learners:cli_bench", "time and memory per step of the learners"),
        ("wiski", "gpdyn.experiments.bench_wiski:cli_bench", "WISKI update cost against n, beside the exact GP"),
        ("mpc", "gpdyn.experiments.bench_mpc:cli_bench", "MPC control steps per second with learned models"),
    ):
        p = bench.add_parser(target, help=text)
        if target == "learners":
            p.add_argument("--repeats", type=int, default=3, help="timed steps per configuration (default 3)")
            p.add_argument("--dtype", choices=("float32", "float64"), default=None, help="default float32 on CUDA, float64 on CPU")
            p.add_argument("--only", default=None, help="comma-separated configuration names to run")
        elif target == "mpc":
            p.add_argument("--samples", type=int, default=1000, help="K sampled sequences (default 1000)")
            p.add_argument("--horizon", type=int, default=30, help="H steps (default 30)")
            p.add_argument("--repeats", type=int, default=1, help="timed control steps per model after a warm-up")
            p.add_argument("--models", default="svdgp,wiski", help="comma-separated: svdgp (M_alpha 128^2), wiski")
        add_device(p)
        add_out(p)
        p.set_defaults(handler=handler)

    p = sub.add_parser("report", help="tables and plots of a finished run")
    p.add_argument("run_dir", type=Path)
    p.set_defaults(handler="gpdyn.experiments.report:cli_report")

    p = sub.add_parser("render", help="video of a stored episode, replayed from its states")
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--episode", type=int, required=True)
    p.add_argument("--out", type=Path, required=True, help="output .mp4 or .gif")
    p.set_defaults(handler="gpdyn.sim.render:cli_render")

    p = sub.add_parser("doctor", help="versions, devices, threads")
    p.set_defaults(handler="gpdyn.doctor:cli_doctor")
    return parser


def _resolve(handler: str):
    module_name, func_name = handler.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name == module_name:
            return None
        raise
    return getattr(module, func_name, None)


def cli_inspect(args: argparse.Namespace) -> int:
    """Summarise an episode store or a run folder."""
    from gpdyn.data.store import EpisodeStore, is_store
    from gpdyn.runs import RunDir, is_run_dir

    path: Path = args.path
    if not path.exists():
        raise InputError(f"{path}: no such file or folder")
    if is_run_dir(path):
        run = RunDir(path)
        metrics = run.metrics()
        summary = {
            "run": str(path),
            "config": run.config(),
            "metric_records": len(metrics),
            "last_metrics": metrics[-1] if metrics else None,
            "files": sorted(p.name for p in path.iterdir()),
        }
    elif is_store(path):
        summary = EpisodeStore.open(path).summary()
    else:
        raise InputError(f"{path}: neither an episode store (zarr.json + data/) nor a run folder (config.json)")
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_tree(summary)
    return 0


def _print_tree(d: dict, indent: int = 0) -> None:
    for key, value in d.items():
        if isinstance(value, dict) and value:
            print(" " * indent + f"{key}:")
            _print_tree(value, indent + 2)
        else:
            print(" " * indent + f"{key}: {value}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    import torch

    if args.threads < 1:
        parser.error("--threads must be >= 1")
    torch.set_num_threads(args.threads)
    name = " ".join(str(getattr(args, k)) for k in ("command", "source", "format", "target", "robot") if getattr(args, k, None))
    handler = _resolve(args.handler)
    if handler is None:
        print(f"gpdyn {name}: this stage is not built yet in this version of gpdyn", file=sys.stderr)
        return EXIT_NOT_BUILT
    try:
        return int(handler(args) or 0)
    except InputError as err:
        print(f"gpdyn {name}: error: {err}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print(f"gpdyn {name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
