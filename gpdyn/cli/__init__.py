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

from gpdyn.errors import InputError

EXIT_INPUT = 2
EXIT_NOT_BUILT = 3

LEARNER_NAMES = "svdgp, orth, orthnat, svi, ivsgpr, vsgpr, gpr, wiski, exact"
PROBLEM_NAMES = ("walker-1", "walker-2", "kuka")


def _add_out(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=None, help="run folder (default logs/<job>-<time>)")


def _add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default cpu)")


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
    _add_out(p)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler="gpdyn.experiments.demo:cli_demo")

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
    _add_out(p)
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
    _add_out(p)
    p.set_defaults(handler="gpdyn.sim.kuka:cli_collect")

    imp = sub.add_parser("import", help="import a real dataset into a store").add_subparsers(
        dest="format", metavar="FORMAT", required=True
    )
    p = imp.add_parser("kuka-ilgr", help="KUKA1/KUKA2 text files (28 columns)")
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--store", type=Path, required=True)
    _add_out(p)
    p.set_defaults(handler="gpdyn.data.importers:cli_import")
    p = imp.add_parser("sarcos", help="SARCOS .mat files (sarcos_inv.mat)")
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--store", type=Path, required=True)
    _add_out(p)
    p.set_defaults(handler="gpdyn.data.importers:cli_import")

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
    _add_device(p)
    _add_out(p)
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
    _add_device(p)
    _add_out(p)
    p.set_defaults(handler="gpdyn.experiments.replay:cli_replay")

    p = sub.add_parser("control", help="online control with a learned model")
    p.add_argument("robot", choices=("walker", "kuka"))
    p.add_argument("--learner", required=True, help=LEARNER_NAMES)
    p.add_argument("--store", type=Path, default=None, help="rollouts to pretrain the model on (default: collect a few)")
    p.add_argument("--steps", type=int, default=None, help="control steps per episode (walker 100, kuka 400)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--episodes", type=int, default=None,
                   help="walker: consecutive episodes per controller and condition (default 1); the online model is "
                        "kept across them, the frozen one stays as pretrained")
    p.add_argument("--planner", choices=("mppi", "cem"), default=None, help="walker: MPC planner (default mppi)")
    p.add_argument("--cost", choices=("reward", "track"), default=None,
                   help="walker: what the planner minimises, minus the Walker2d reward (default) or the distance of the "
                        "predicted next velocities to those of the nominal plant under the TRPO policy (policy transfer)")
    p.add_argument("--track-offset-weight", type=float, default=None,
                   help="walker, --cost track: price of an action offset to the policy, (rad/s)^2 per unit^2 (default 10)")
    p.add_argument("--samples", type=int, default=None, help="walker: K sampled sequences (default 64; paper 1000)")
    p.add_argument("--sim-samples", type=int, default=None, help="walker: K for the true-simulator MPC (default 32)")
    p.add_argument("--horizon", type=int, default=None, help="walker: H steps (default 10; paper 30)")
    p.add_argument("--noise-std", type=float, default=None, help="walker: sampling noise, action units (default 0.2)")
    p.add_argument("--temperature", type=float, default=None,
                   help="walker: MPPI temperature, reward units (default 0.5): the larger, the more samples the plan averages")
    p.add_argument("--control-cost", type=float, default=None,
                   help="walker: weight in [0, 1] on MPPI's control cost lambda u'Sigma^-1 eps (default 0): 1 keeps the "
                        "plan a KL-regularised improvement of the TRPO proposal instead of drifting from it")
    p.add_argument("--relative-to-proposal", action="store_true", default=None,
                   help="walker: plan offsets to the TRPO policy's closed-loop actions (the zero offset is the policy)")
    p.add_argument("--proposal-tail", type=int, default=None,
                   help="walker: steps the TRPO policy alone runs through the model after the horizon, before the "
                        "terminal value (default 0)")
    p.add_argument("--cold-start", dest="warm_start", action="store_const", const=False, default=None,
                   help="walker: every plan starts afresh from the policy (zero offsets with --relative-to-proposal) "
                        "instead of the previous plan shifted; the weights then rest on the model's costs alone")
    p.add_argument("--uncertainty", choices=("mean", "penalty", "sample"), default=None, help="walker: use of the predictive variance")
    p.add_argument("--var-weight", type=float, default=None, help="walker: weight of the variance penalty")
    p.add_argument("--terminal-value", action="store_true", default=None,
                   help="walker: the TRPO critic's value of each sample's last state joins its cost")
    p.add_argument("--target", choices=("change", "velocity"), default=None,
                   help="walker: what the learner predicts, the velocity change over the step (default) or the next velocity")
    p.add_argument("--change", choices=("torso_mass", "foot_friction", "weak_motor"), default=None, help="walker: plant change")
    p.add_argument("--change-factor", type=float, default=None,
                   help="walker: scale of the plant change (default torso mass x1.3, foot friction x0.5, motor x0.5)")
    p.add_argument("--change-at", type=int, default=None, help="step of the plant change (walker: 0 = from the start)")
    p.add_argument("--controllers", default=None, help="comma-separated (walker: trpo,true,frozen,online; kuka: pd,true,frozen,online)")
    p.add_argument("--conditions", default=None, help="walker: comma-separated nominal,changed")
    p.add_argument("--payload", type=float, default=None, help="kuka: payload in kg added at --change-at (default 3)")
    p.add_argument("--scale", choices=("small", "paper"), default=None, help="learner sizes (default small)")
    p.add_argument("--pretrain-iterations", type=int, default=None,
                   help="minibatch steps on the stored data before control (default 100)")
    p.add_argument("--adapt", choices=("residual", "steps"), default=None,
                   help="online model: an exact GP on the frozen model's residuals (default), or the learner's own steps")
    p.add_argument("--residual-gate", action="store_true", default=None,
                   help="walker, --adapt residual: add the residual GP to an output's prediction only while it has "
                        "predicted that output better than the frozen model (prequential errors)")
    p.add_argument("--residual-gate-z", type=float, default=None,
                   help="walker, with --residual-gate: the residual goes in only once its average improvement is "
                        "this many standard errors above zero (default 0: the plain comparison)")
    p.add_argument("--residual-forget", type=float, default=None,
                   help="walker, --residual-kernel linear: weight forget**k on a transition k steps old (default 1: none)")
    p.add_argument("--residual-kernel", choices=("se", "linear"), default=None,
                   help="walker, --adapt residual: the residual GP's kernel, SE over all inputs (default) or linear "
                        "over the action alone (a bias plus a gain per action: how the plant answers the action)")
    p.add_argument("--dtype", choices=("float64", "float32"), default=None)
    p.add_argument("--video", action="store_true", default=None, help="walker: MP4 of the online episode on the changed plant")
    _add_device(p)
    _add_out(p)
    p.set_defaults(handler="gpdyn.experiments.control_walker:cli_control")

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
        _add_device(p)
        _add_out(p)
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
