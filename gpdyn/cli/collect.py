"""`gpdyn collect` and `gpdyn import`: the commands that fill an episode store, and their handlers.

The handlers turn parsed options into calls of the stages' plain functions
(:func:`gpdyn.sim.legged.collect_legged`, :func:`gpdyn.sim.arm.collect_arm`, the
importers); the stages are imported only when a command runs, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpdyn.cli.common import (COUNT, NON_NEGATIVE, NON_NEGATIVE_INT, NON_NEGATIVE_LIST, POSITIVE, POSITIVE_LIST, Number,
                              add_out, add_seed, comma_list)
from gpdyn.config import FAMILY_NAMES, LEGGED_TASKS, RegistryNames

if TYPE_CHECKING:
    from gpdyn.sim.stopping import CollectionStopped

log = logging.getLogger(__name__)

IMPORT_UNITS = RegistryNames("gpdyn.data.importers", "UNITS", ("physical", "normalised"))  # what imported input columns hold


ENVS = Number(int, 1, 4 * (os.cpu_count() or 1))  # worker processes: past the cores they only wait


def add_arm_options(p: argparse.ArgumentParser, robot: str) -> None:
    """The options that pick the arm: ``--model FILE.xml`` for ``arm``; the estimated joint terms for both."""
    if robot == "arm":
        p.add_argument("--model", type=Path, required=True, help="MJCF file of the arm (hinge joints, one motor or "
                                                                  "position actuator per joint)")
        p.add_argument("--joints", type=comma_list, default=None, metavar="NAME[,NAME...]",
                       help="the arm's joints, in the file's order, where the file holds more (targets, objects on "
                            "slide or free joints): every other joint is removed and its body fixed where the file "
                            "puts it (default: every joint of the file)")
        p.add_argument("--velocity-limits", type=POSITIVE_LIST, default=None, metavar="V[,V...]",
                       help="joint velocity limits in rad/s that trajectories keep inside (MJCF has none; default: "
                            "positions bound the motion alone)")
        p.add_argument("--payload-body", default=None,
                       help="massless body that carries --payload (default: the body named 'payload', if any)")
    note = ("replaces the file's value" if robot == "arm"
            else "replaces the shipped estimate (a guess, not an identified value)")
    for option, text in (("damping", "joint damping, N m s/rad"), ("armature", "rotor armature, kg m^2"),
                         ("friction", "dry joint friction, N m")):
        p.add_argument(f"--{option}", type=NON_NEGATIVE_LIST, default=None, metavar="V[,V...]",
                       help=f"{text}, one value or one per joint; {note}")


def arm_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~gpdyn.robots.arm.ArmModel` that ``add_arm_options`` described (the iiwa without ``--model``)."""
    terms = {k: getattr(args, k, None) for k in ("damping", "armature", "friction")}
    if getattr(args, "model", None) is None:
        from gpdyn.robots.kuka import kuka_arm

        return kuka_arm(**terms)
    from gpdyn.robots.arm import ArmModel

    return ArmModel(args.model, joints=args.joints, velocity_limits=args.velocity_limits, payload_body=args.payload_body,
                    **terms)


def _add_legged_parser(collect: argparse._SubParsersAction, task: str) -> None:
    """``gpdyn collect TASK`` for a legged task: rollouts of its policy."""
    p = collect.add_parser(task, help=f"{task} rollouts of a policy (the task's shipped TRPO policy by default)")
    p.add_argument("--store", type=Path, required=True, help="zarr store (created, or continued if it exists)")
    p.add_argument("--episodes", type=COUNT, required=True, help="total episodes the store should hold")
    p.add_argument(
        "--policy", type=Path, action="append", default=None,
        help="policy file (default: the task's shipped policy); repeat it to cycle episodes over several policies",
    )
    p.add_argument(
        "--mix", action="store_true",
        help="cycle episodes over the shipped training checkpoints and the final policy (several gaits)",
    )
    p.add_argument("--noise", type=NON_NEGATIVE, default=0.0,
                   help="std of Gaussian action noise, action units (default %(default)s)")
    p.add_argument("--envs", type=ENVS, default=2,
                   help="environments in parallel, one worker process each (default %(default)s)")
    add_seed(p, "the episodes' initial states and action noise")
    p.add_argument("--commit-seconds", type=NON_NEGATIVE, default=None, metavar="S",
                   help="commit finished episodes at least this often (default 1; 0: each as it finishes, at some "
                        "cost in speed); a crash loses the episodes running and those finished since")
    p.add_argument("--video", type=Path, default=None, help="also write an MP4 of the first episode")
    add_out(p)
    p.set_defaults(handler="gpdyn.cli.collect:collect_legged", task=task)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    collect = sub.add_parser("collect", help="collect episodes into a store").add_subparsers(
        dest="source", metavar="SOURCE", required=True, help="what the episodes come from"
    )
    for task in LEGGED_TASKS:
        _add_legged_parser(collect, task)

    for robot, text in (("kuka", "simulated KUKA iiwa inverse-dynamics stream"),
                        ("arm", "inverse-dynamics stream of any arm given as an MJCF file")):
        p = collect.add_parser(robot, help=text)
        if robot == "arm":
            add_arm_options(p, robot)
        p.add_argument("--store", type=Path, required=True,
                       help="zarr store (created, or continued if a stopped collection with the same settings left it)")
        p.add_argument("--offline", type=NON_NEGATIVE_INT, default=17560,
                       help="offline samples (default %(default)s, as KUKA1)")
        p.add_argument("--online", type=NON_NEGATIVE_INT, default=180360,
                       help="online samples (default %(default)s, as KUKA1)")
        p.add_argument("--payload", type=NON_NEGATIVE, default=0.0,
                       help="end-effector payload in kg (default %(default)s: none)")
        p.add_argument("--family", choices=FAMILY_NAMES, default="kuka1", metavar="NAME",
                       help="trajectory family: %(choices)s (default %(default)s)")
        add_seed(p, "the reference trajectories and the sensor noise")
        p.add_argument("--rate", type=POSITIVE, default=100.0,
                       help="sample rate in Hz: a whole number of the model's simulation steps per sample, "
                            "from 1 Hz to one sample per simulation step (default %(default)s)")
        p.add_argument("--torque-noise", type=NON_NEGATIVE, default=0.0,
                       help="std of torque sensor noise, N m (default %(default)s)")
        p.add_argument("--position-noise", type=NON_NEGATIVE, default=0.0,
                       help="std of position sensor noise, rad (default %(default)s)")
        p.add_argument(
            "--derivatives", choices=("exact", "fd"), default="exact",
            help="exact qd, qdd or finite differences of measured q (default %(default)s)",
        )
        if robot == "kuka":
            add_arm_options(p, robot)
        add_out(p)
        p.set_defaults(handler="gpdyn.cli.collect:collect_arm")

    imp = sub.add_parser("import", help="import a real dataset into a store").add_subparsers(
        dest="format", metavar="FORMAT", required=True, help="the dataset's file format"
    )
    for fmt, text, scale, units in (
        ("kuka-ilgr", "KUKA1/KUKA2 text files, plain or .txt.gz (28 columns)",
         "40,40,20,20,4,4,2, the real KUKA1/KUKA2 files; the simulated ones use 50,70,20,20,4,4,2", "normalised"),
        ("sarcos", "SARCOS .mat files (sarcos_inv.mat, sarcos_inv_test.mat)", "1, torques in N m", "physical"),
    ):
        p = imp.add_parser(fmt, help=text)
        p.add_argument("files", nargs="+", type=Path,
                       help="the dataset's files, one episode each, in this order (a test file or a name with "
                            "'online' marks the online part)")
        p.add_argument("--store", type=Path, required=True, help="zarr store to create (it must not exist yet)")
        p.add_argument("--torque-scale", type=POSITIVE_LIST, default=None, metavar="S[,S...]",
                       help=f"factors the file's torques were divided by (N m = value x factor), one value or one "
                            f"per joint; kept in the store attribute tau_scale (default {scale})")
        p.add_argument("--units", choices=IMPORT_UNITS, default=units, metavar="UNITS",
                       help="what the position, velocity and acceleration columns hold: %(choices)s; kept in the "
                            "store attribute input_units and the field units (default %(default)s)")
        add_out(p)
        p.set_defaults(handler="gpdyn.cli.collect:import_files")


# ---------------------------------------------------------------------------- handlers
def _report_stop(args: argparse.Namespace, stopped: CollectionStopped) -> int:
    """A collection that stopped early (:class:`~gpdyn.sim.stopping.CollectionStopped`): say why and what is kept."""
    log.warning("%s", stopped)
    return stopped.exit_status


def collect_legged(args: argparse.Namespace) -> int:
    """``gpdyn collect walker|hopper``: fill a store, print a summary, optionally render a video."""
    from gpdyn.data.store import EpisodeStore
    from gpdyn.errors import InputError
    from gpdyn.cli.common import run_for_args
    from gpdyn.sim.stopping import CollectionStopped
    from gpdyn.robots.task import get_task
    from gpdyn.sim.legged import collect_legged as collect

    try:
        every = {} if args.commit_seconds is None else {"commit_seconds": args.commit_seconds}
        result = collect(get_task(args.task), args.store, args.episodes, policies=args.policy, mix=args.mix, noise=args.noise,
                         envs=args.envs, seed=args.seed, **every)
    except CollectionStopped as stopped:
        return _report_stop(args, stopped)
    run_for_args(f"collect-{args.task}", args).log(**result)
    # the summary, the torque table and the per-file lines below are the command's result: stdout, not the log
    print(
        f"{result['store']}: {result['episodes']} episodes, {result['rows']} transitions "
        f"(+{result['episodes_added']} episodes, {result['rows_added']} transitions in {result['seconds']:.1f} s, "
        f"{result['steps_per_second']:.0f} steps/s)"
    )
    if args.video is not None:
        from gpdyn.sim.render import render_episode

        store = EpisodeStore.open(args.store)
        if store.n_episodes == 0:
            raise InputError(f"{args.store}: no episode to render")
        index = result["episodes_before"] if result["episodes_added"] else 0
        render_episode(store, index, args.video)
        print(f"video of episode {index}: {args.video}")
    return 0


def collect_arm(args: argparse.Namespace) -> int:
    """``gpdyn collect kuka|arm``: collect, then print time and torque ranges beside the limits.

    Samples with a torque beyond an actuator's range are counted per joint in the summary
    and, when there are any, in a warning on stderr.
    """
    import warnings

    from gpdyn.cli.common import run_for_args
    from gpdyn.sim.arm import SensorConfig, TorqueLimitWarning, collect_arm as collect, torque_ranges
    from gpdyn.sim.stopping import CollectionStopped

    arm = arm_from_args(args)
    arm.steps_per_sample(args.rate, option="--rate")  # refused here, naming the option
    sensors = SensorConfig(torque_noise=args.torque_noise, position_noise=args.position_noise,
                           derivatives=args.derivatives)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TorqueLimitWarning)  # said below, per joint, without a source line
            store = collect(args.store, offline=args.offline, online=args.online, payload=args.payload,
                            family=args.family, seed=args.seed, arm=arm, rate_hz=args.rate, sensors=sensors)
    except CollectionStopped as stopped:
        return _report_stop(args, stopped)
    elapsed = time.perf_counter() - start
    ranges, over = torque_ranges(store, arm.limits.torque)
    samples_over = int(store.episode_values("tau_over_limits").sum())
    run_for_args(f"collect-{args.source}", args).log(
        store=str(store.path), model_file=str(arm.path), model_sha256=arm.sha256, episodes=store.n_episodes,
        rows=store.n_rows, seconds=elapsed, tau_min=ranges[:, 0], tau_max=ranges[:, 1],
        tau_over_limits=over, samples_over_limits=samples_over)
    print(f"{store.path}: {store.n_rows} samples of {arm.path.name} ({arm.n} joints) in {store.n_episodes} episodes, "
          f"{elapsed:.1f} s")
    width = max(14, *(len(name) for name in arm.joint_names))  # the columns stay aligned under long joint names
    print(f"{'joint':<{width + 3}} tau min [N m]  tau max [N m]  limits [N m]  samples beyond")
    for name, (lo, hi), (lim_lo, lim_hi), count in zip(arm.joint_names, ranges, arm.limits.torque, over):
        print(f"  {name:<{width}} {lo:12.2f}  {hi:12.2f}   {lim_lo:g} .. {lim_hi:g}  {count:d}")
    if samples_over:
        log.warning(f"{samples_over} of {store.n_rows} samples have a joint torque beyond its actuator's range "
                    f"({', '.join(f'{n} {c}' for n, c in zip(arm.joint_names, over) if c)}): motions the arm's "
                    "motors cannot make with this payload at these speeds")
    return 0


def import_files(args: argparse.Namespace) -> int:
    """``gpdyn import kuka-ilgr|sarcos FILE... --store PATH [--torque-scale S,...] [--units UNITS]``."""
    from gpdyn.data.importers import import_kuka_ilgr, import_sarcos
    from gpdyn.cli.common import run_for_args

    importers = {"kuka-ilgr": import_kuka_ilgr, "sarcos": import_sarcos}
    options = {"units": args.units}
    if args.torque_scale is not None:
        options["torque_scale"] = args.torque_scale
    store = importers[args.format](args.files, args.store, **options)
    parts = store.episode_values("online")
    attrs = store.attrs
    run_for_args(f"import-{args.format}", args).log(store=str(store.path), episodes=store.n_episodes, rows=store.n_rows,
                                                    offline_episodes=int((parts == 0).sum()),
                                                    files=attrs["imported_files"], tau_scale=attrs["tau_scale"],
                                                    input_units=attrs["input_units"])
    for entry, ends in zip(attrs["imported_files"], store.episode_ends):
        part = "online" if entry["online"] else "offline"
        print(f"  {entry['file']}: {entry['rows']} rows -> {part} part, {entry['split']} split (rows to {int(ends)})")
    print(f"{store.path}: {store.n_rows} rows in {store.n_episodes} episodes ({int((parts == 0).sum())} offline); "
          f"inputs {attrs['input_units']}, torque {store.fields['tau'].unit}")
    return 0


__all__ = ["IMPORT_UNITS", "add_arm_options", "add_parsers", "arm_from_args", "collect_arm", "collect_legged",
           "import_files"]
