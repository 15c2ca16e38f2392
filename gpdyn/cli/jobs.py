"""The jobs of the ``gpdyn`` command that are not a robot's: demo, inspect, learn, replay,
bench, report, render, doctor. Each ``add_*`` function adds a subcommand's parser with
its handler; a handler turns the parsed options into the stage's plain call, importing
the stage only when it runs (torch and MuJoCo take seconds to import).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gpdyn.cli.common import (
    COUNT,
    DTYPE_NAMES,
    LEARNER_NAMES,
    NON_NEGATIVE_INT,
    POSITIVE,
    POSITIVE_LIST,
    PRESET_NAMES,
    PROBLEM_NAMES,
    Number,
    add_device,
    add_dtype,
    add_learner,
    add_learners,
    add_out,
    add_preset,
    add_problem,
    add_protocol,
    add_seed,
    comma_list,
    learner_list,
)
from gpdyn.errors import InputError


def _number_or_text(raw: str) -> Any:
    """``"4096"`` -> 4096, ``"0.1"`` -> 0.1, ``"none"`` -> None, ``"true"``/``"false"`` -> bool,
    anything else stays text (a learner refuses text where it takes a number or a switch)."""
    raw = raw.strip()
    words = {"none": None, "true": True, "false": False}
    if raw.lower() in words:
        return words[raw.lower()]
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def size_option(text: str) -> tuple[str, Any]:
    """``--size m_alpha=4096`` -> ``("m_alpha", 4096)`` (an argparse ``type``)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"'{text}': expected KEY=VALUE, e.g. m_alpha=4096")
    return key.strip().replace("-", "_"), _number_or_text(raw)


def learner_size_option(text: str) -> tuple[str, str, Any]:
    """``--size svdgp.m_alpha=4096`` -> ``("svdgp", "m_alpha", 4096)`` (an argparse ``type``)."""
    learner, dot, rest = text.partition(".")
    if not dot or "=" not in rest or learner not in LEARNER_NAMES:
        raise argparse.ArgumentTypeError(f"'{text}': expected LEARNER.KEY=VALUE, e.g. svdgp.m_alpha=4096")
    return (learner, *size_option(rest))


def _add_protocol(p: argparse.ArgumentParser) -> None:
    """The options of SVDGP Algorithm 1 that learn and replay share."""
    p.add_argument("--iterations", type=COUNT, default=2000, help="iterations T (default %(default)s)")
    p.add_argument("--batch-size", type=COUNT, default=1024, help="minibatch N_m (default %(default)s)")
    p.add_argument("--n-delta", type=COUNT, default=None,
                   help="basis functions added per iteration (default: the preset's, 64 at cpu and 128 at paper)")
    p.add_argument("--eval-every", type=COUNT, default=100,
                   help="iterations between held-out evaluations (default %(default)s)")
    add_seed(p, "the held-out split, the minibatches and the learners")


def _add_stream(p: argparse.ArgumentParser) -> None:
    """The sizes of the stream (prequential) protocol, gpdyn.gp.prequential.StreamProtocol."""
    g = p.add_argument_group("stream protocol (--protocol stream: each chunk predicted, then learned)")
    g.add_argument("--init-rows", type=COUNT, default=1024,
                   help="rows the learner starts on (and the normalisation statistics come from; default %(default)s)")
    g.add_argument("--chunk", type=COUNT, default=256,
                   help="rows predicted, then learned, at a time (default %(default)s)")
    g.add_argument("--warm-rows", type=NON_NEGATIVE_INT, default=2048,
                   help="rows before this one are learned but not scored (default %(default)s)")
    g.add_argument("--init-steps", type=NON_NEGATIVE_INT, default=0,
                   help="updates on the init rows before the stream (or the learner's pretrain; default %(default)s)")
    g.add_argument("--steps-per-chunk", type=COUNT, default=1,
                   help="updates after each chunk is observed (default %(default)s)")


def _add_prior_mean(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prior-mean", default=None, metavar="SPEC",
                   help="a fixed mean the learners model the residual of: rigid-body (kuka), rigid-body:FILE.xml "
                        "(any arm) or learner:RUN_DIR (a gpdyn learn run's frozen learner); default none")


def _stream_protocol(args: argparse.Namespace) -> Any:
    from gpdyn.gp.prequential import StreamProtocol

    return StreamProtocol(init_rows=args.init_rows, chunk=args.chunk, warm_rows=args.warm_rows,
                          init_steps=args.init_steps, steps_per_chunk=args.steps_per_chunk)


# --- demo --------------------------------------------------------------------------


def add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the main job: the whole pipeline on a small default")
    add_out(p)
    add_seed(p, "every stage")
    p.set_defaults(handler=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    from gpdyn.experiments.demo import demo

    demo(args.out, args.seed)
    return 0


# --- inspect -----------------------------------------------------------------------


def add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="summary of a store or a run folder")
    p.add_argument("path", type=Path, help="an episode store (zarr) or a run folder (config.json)")
    p.add_argument("--json", action="store_true", help="print JSON instead of an indented tree")
    p.set_defaults(handler=run_inspect, reads_only=True)


def run_inspect(args: argparse.Namespace) -> int:
    """Summarise an episode store or a run folder."""
    from gpdyn.runs import RunDir, is_run_dir

    path: Path = args.path
    if not path.exists():
        raise InputError(f"{path}: no such file or folder")
    if is_run_dir(path):
        summary = RunDir(path).summary()
    else:
        from gpdyn.data.store import EpisodeStore, is_store  # zarr: only for what may be a store

        if not is_store(path):
            raise InputError(f"{path}: neither an episode store (zarr.json + data/) nor a run folder (config.json)")
        summary = EpisodeStore.open(path).summary()
    if args.json:  # the command's result: stdout; messages go to the log (stderr)
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


# --- learn, replay -----------------------------------------------------------------


RESUME_NOTE = ("A stopped run continues from its last checkpoint when the same command runs again with the same "
               "--out, on the store it read (another store at that path is refused); `gpdyn inspect` of its folder "
               "says how far it got.")


def _add_data(p: argparse.ArgumentParser) -> None:
    """The store and the regression problem built from it (learn and replay)."""
    p.add_argument("--store", type=Path, required=True, help="episode store (zarr) the problem is built from")
    add_problem(p)


def add_learn(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("learn", help="the online learning protocol of one learner on a problem (SVDGP Algorithm 1)",
                       epilog=RESUME_NOTE)
    _add_data(p)
    add_learner(p)
    add_protocol(p, "iid holds out a seeded 10%% of the rows, block a seeded contiguous block of each episode, split "
                    "a dataset's own test file (iid minibatches of the rest in each case; ordered is gpdyn replay's); "
                    "stream predicts each chunk in store order before learning it (prequential)")
    _add_protocol(p)
    _add_stream(p)
    _add_prior_mean(p)
    add_preset(p)
    p.add_argument("--size", type=size_option, action="append", default=[], metavar="KEY=VALUE",
                   help="learner option, e.g. m_alpha=4096 (repeatable)")
    add_dtype(p)
    add_device(p)
    add_out(p)
    p.set_defaults(handler=run_learn)


def run_learn(args: argparse.Namespace) -> int:
    from gpdyn.experiments.learn import LearnConfig, learn
    from gpdyn.experiments.learned import CHECKPOINT

    cfg = LearnConfig(
        store=str(args.store), problem=args.problem, learner=args.learner, iterations=args.iterations,
        batch_size=args.batch_size, n_delta=args.n_delta, eval_every=args.eval_every, seed=args.seed,
        device=args.device, dtype=args.dtype, preset=args.preset, sizes=dict(args.size), protocol=args.protocol,
        stream=_stream_protocol(args), prior_mean=args.prior_mean,
    )
    run, final = learn(cfg, args.out)
    if cfg.protocol == "stream":  # the command's result: stdout; messages go to the log (stderr)
        from gpdyn.experiments.replay import print_table

        print_table({cfg.learner: final})
        print(f"checkpoint: {run.path / CHECKPOINT}")
        return 0
    print(
        f"{cfg.learner} on {cfg.problem} after {final['iteration']} iterations: "
        f"nMSE {final['nmse_mean']:.4f} ± {final['nmse_std']:.4f}, bound {final['vlb_mean']:.4f} ± {final['vlb_std']:.4f}, "
        f"NLL {final['nll_mean']:.4f} ± {final['nll_std']:.4f}, 95% coverage {final['coverage_mean']:.3f} ± "
        f"{final['coverage_std']:.3f} ({final['step_s'] * 1e3:.1f} ms/iteration)"
    )
    print(f"checkpoint: {run.path / CHECKPOINT}")
    return 0


def add_replay(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="several learners on one dataset, side by side (SVDGP Table 2)",
                       epilog=RESUME_NOTE)
    _add_data(p)
    add_learners(p)
    add_protocol(p, "iid minibatches with a seeded 10%% held out (SVDGP); ordered: init on the offline part, then "
                    "stream the rest in order (ILGR); block: a seeded contiguous block of each episode held out; split: "
                    "train on a dataset's training file(s), score on its test file (SARCOS, GPML Table 8.1); stream: "
                    "one pass in store order, each chunk predicted before it is learned (prequential)")
    _add_protocol(p)
    _add_stream(p)
    _add_prior_mean(p)
    p.add_argument("--init-iterations", type=COUNT, default=200,
                   help="ordered protocol: iterations on the offline part (default %(default)s)")
    p.add_argument("--eval-rows", type=COUNT, default=None,
                   help="score on a seeded subset of this many held-out rows (default: all of them)")
    add_preset(p, "every learner's")
    p.add_argument("--size", type=learner_size_option, action="append", default=[], metavar="LEARNER.KEY=VALUE",
                   help="learner option, e.g. svdgp.m_alpha=4096 (repeatable)")
    p.add_argument("--select-lr", type=POSITIVE_LIST, default=None, metavar="G1,G2,...",
                   help="choose each learner's step size gamma_0 from these by its objective after "
                        "--select-iterations iterations, as SVDGP Section 4 (e.g. 0.1,0.01,0.001)")
    p.add_argument("--select-iterations", type=COUNT, default=100,
                   help="with --select-lr: iterations each candidate step size runs (default %(default)s)")
    add_dtype(p)
    add_device(p)
    add_out(p)
    p.set_defaults(handler=run_replay)


def run_replay(args: argparse.Namespace) -> int:
    from gpdyn.data.problems import load_problem
    from gpdyn.device import dtype_name, resolve_dtype
    from gpdyn.experiments.replay import ReplayConfig, open_run, print_table, replay
    from gpdyn.experiments.report import write_report
    from gpdyn.experiments.prior_mean import load_prior_mean

    sizes: dict[str, dict[str, Any]] = {}
    for learner, key, value in args.size:
        sizes.setdefault(learner, {})[key] = value
    cfg = ReplayConfig(
        store=str(args.store), problem=args.problem, learners=args.learners, protocol=args.protocol,
        iterations=args.iterations, batch_size=args.batch_size, n_delta=args.n_delta, eval_every=args.eval_every,
        init_iterations=args.init_iterations, eval_rows=args.eval_rows, seed=args.seed, device=args.device,
        # the config records the dtype the run used: a resumed run must use it again
        dtype=dtype_name(resolve_dtype(args.dtype, args.device)), preset=args.preset, sizes=sizes,
        select_lr=args.select_lr,
        select_iterations=args.select_iterations,
        stream=_stream_protocol(args), prior_mean=args.prior_mean,
    )
    cfg.validate()
    problem = load_problem(cfg.store, cfg.problem, protocol=cfg.protocol, seed=cfg.seed, progress=True,
                           init_rows=cfg.stream.init_rows)
    prior = load_prior_mean(cfg.prior_mean, cfg.store, problem)  # before the run folder: a bad one leaves none
    run = open_run(cfg, args.out, problem)
    print(f"gpdyn replay: run folder {run.path}")  # the command's result: stdout; messages go to the log (stderr)
    try:
        finals = replay(cfg, run, problem=problem, prior=prior)
        report = write_report(run.path)
    finally:
        run.close()  # the writer lock goes now, not when the object is collected
    print_table(finals)
    print(f"\nreport: {report}")
    return 0


# --- bench -------------------------------------------------------------------------


def add_bench(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print ratios measured in one run").add_subparsers(
        dest="target", metavar="TARGET", required=True, help="what is timed"
    )
    p = bench.add_parser("learners", help="time and memory per step of the learners at the papers' sizes")
    p.add_argument("--repeats", type=COUNT, default=3, help="timed steps per configuration (default 3)")
    p.add_argument("--only", type=comma_list, default=None, metavar="A,B,...",
                   help="configuration names to run (default all)")
    p.add_argument("--peer", choices=("gpytorch",), default=None,
                   help="add GPyTorch's SVGP beside gpdyn's learners (install it with scripts/install_peer.sh)")
    p.add_argument("--store", type=Path, default=None,
                   help="episode store of a real problem: also race the learners at equal time on it (held-out nMSE)")
    p.add_argument("--problem", choices=PROBLEM_NAMES, default=None, metavar="NAME",
                   help="the race's regression problem: %(choices)s")
    p.add_argument("--budget", type=POSITIVE, default=60.0,
                   help="the race's time per learner, seconds (CPU time on the CPU; default 60)")
    p.add_argument("--learners", type=learner_list, default=None, metavar="A,B,...",
                   help="learners that race (default svdgp,svi,orthnat,wiski)")
    p.add_argument("--preset", choices=PRESET_NAMES, default="paper", metavar="NAME",
                   help="the racing learners' sizes: %(choices)s (default paper; the peer takes SVI's M)")
    p.add_argument("--peer-lr", type=POSITIVE, default=0.1,
                   help="constant Adam step size of the peer (default %(default)s, the gamma_0 of gpdyn's presets)")
    add_seed(p, "the race's minibatches and learners")
    add_dtype(p)
    add_device(p)
    add_out(p)
    p.set_defaults(handler=run_bench_learners)

    p = bench.add_parser("wiski", help="WISKI update cost against n beside the exact GP, and predict_mean against plain gathers")
    add_device(p)
    add_out(p)
    p.set_defaults(handler=run_bench_wiski)

    p = bench.add_parser("mpc", help="MPC planning steps per CPU second with every learned model, mean only and with variance")
    p.add_argument("--samples", type=Number(int, 2), default=1000, help="K sampled sequences (default 1000)")
    p.add_argument("--horizon", type=COUNT, default=30, help="H steps (default 30)")
    p.add_argument("--repeats", type=COUNT, default=1,
                   help="timed planning steps per model and mode after a warm-up (default %(default)s)")
    p.add_argument("--models", type=learner_list, default=None, metavar="A,B,...",
                   help="learners to time (default every registered learner)")
    p.add_argument("--preset", choices=PRESET_NAMES, default="small", metavar="NAME",
                   help="the learners' size: one of %(choices)s (default small, the control runs' size)")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="float32", metavar="DTYPE",
                   help="one of %(choices)s (default float32, a controller's hot path)")
    p.add_argument("--peer", choices=("pytorch-mppi",), default=None,
                   help="also time pytorch-mppi's MPPI beside gpdyn's on the same models (install it with "
                        "`bash scripts/install_peer.sh pytorch-mppi`)")
    add_device(p)
    add_out(p)
    p.set_defaults(handler=run_bench_mpc)


def run_bench_learners(args: argparse.Namespace) -> int:
    from gpdyn.experiments.bench_learners import bench_learners

    bench_learners(args.device, args.dtype, args.repeats, args.only, args.out, peer=args.peer, store=args.store,
                   problem=args.problem, budget=args.budget, learners=args.learners, preset=args.preset,
                   peer_lr=args.peer_lr, seed=args.seed)
    return 0


def run_bench_wiski(args: argparse.Namespace) -> int:
    """Exit 1 when WISKI's update cost grows with n past the limit."""
    from gpdyn.experiments.bench_wiski import MAX_RATIO, run_benchmark

    _, worst = run_benchmark(args.device, args.out)
    ok = worst <= MAX_RATIO
    # the command's result: stdout; messages go to the log (stderr)
    print(f"largest/smallest n ratio: {worst:.3f} ({'ok' if ok else 'FAIL'}: must be <= {MAX_RATIO})")
    return 0 if ok else 1


def run_bench_mpc(args: argparse.Namespace) -> int:
    from gpdyn.experiments.bench_mpc import run_benchmark

    import torch

    from gpdyn.device import resolve_dtype

    # the command as parsed, every option spelt out (what reruns this table)
    command = (f"gpdyn --threads {torch.get_num_threads()} bench mpc --samples {args.samples} --horizon {args.horizon} "
               f"--repeats {args.repeats} --preset {args.preset} --dtype {args.dtype} --device {args.device}"
               + (f" --models {','.join(args.models)}" if args.models else "")
               + (f" --peer {args.peer}" if args.peer else "")
               + (f" --out {args.out}" if args.out else ""))
    run_benchmark(args.models, args.samples, args.horizon, args.repeats, args.device, args.out, preset=args.preset,
                  dtype=resolve_dtype(args.dtype, args.device), command=command, peer=args.peer)
    return 0


# --- report, render, doctor --------------------------------------------------------


def add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="rewrite the report (tables and plots) of a learn, replay or control run folder",
                       description="Rewrite report.md and the CSV files of a run folder from its config.json and "
                                   "metrics.jsonl. A plot is drawn again only when it is missing or not newer than "
                                   "those two files (drawing takes about a CPU second); --redraw draws every one.")
    p.add_argument("run_dir", type=Path, help="the run folder (a finished one, or a stopped replay or control run)")
    p.add_argument("--redraw", action="store_true",
                   help="draw every plot again, also those newer than the run's records (e.g. after a gpdyn upgrade)")
    p.set_defaults(handler=run_report, reads_only=True)


def run_report(args: argparse.Namespace) -> int:
    from gpdyn.experiments.report import write_report

    report = write_report(args.run_dir, redraw=args.redraw)
    print(report.read_text())  # the command's result: stdout; messages go to the log (stderr)
    print(f"gpdyn report: wrote {report}")
    return 0


def add_render(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("render", help="video of a stored Walker2d episode, replayed from its states")
    p.add_argument("--store", type=Path, required=True, help="Walker2d episode store (zarr)")
    p.add_argument("--episode", type=int, required=True, help="episode index (negative counts from the end)")
    p.add_argument("--out", type=Path, required=True, help="output .mp4 or .gif (a GIF keeps every 4th frame)")
    p.add_argument("--quality", choices=("auto", "full", "fast"), default="auto",
                   help="full: shadows, reflections, anti-aliasing; fast: none of them; auto: fast where OpenGL is "
                        "drawn in software (no GPU driver), full elsewhere (default %(default)s)")
    p.set_defaults(handler=run_render)


def run_render(args: argparse.Namespace) -> int:
    from gpdyn.data.store import EpisodeStore
    from gpdyn.sim.render import render_episode

    store = EpisodeStore.open(args.store)
    path = render_episode(store, args.episode, args.out, quality=args.quality)
    steps = store.episode_lengths[args.episode % max(store.n_episodes, 1)]
    # the command's result: stdout; messages go to the log (stderr)
    print(f"{path}: episode {args.episode} of {args.store} ({steps} steps)")
    return 0


def add_doctor(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="versions, devices, threads",
                       description="What this install can do: versions, devices, threads, and the C++ compiler, "
                                   "ffmpeg and OpenGL backend gpdyn uses, each 'ok' or 'missing' with what it "
                                   "affects. By default without loading torch or MuJoCo (a fraction of a second): "
                                   "tools are found, not tried. --deep (seconds) loads both and tries everything.")
    p.add_argument("--deep", action="store_true",
                   help="load torch and MuJoCo: the devices and dtypes torch sees, a C++ program compiled, a GL "
                        "context created, Walker2d-v5 made (exit 1 when that fails)")
    # the default report imports neither torch nor MuJoCo; --deep sets torch's threads itself
    p.set_defaults(handler=run_doctor, reads_only=True)


def run_doctor(args: argparse.Namespace) -> int:
    """Exit 1 when the Walker2d smoke check (``--deep``) fails."""
    from gpdyn.doctor import report

    info = report(deep=args.deep, threads=args.threads)
    width = max(len(k) for k in info)
    for key, value in info.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        elif isinstance(value, list):
            value = "; ".join(value)
        print(f"{key:<{width}}  {value}")  # the command's result: stdout; messages go to the log (stderr)
    return 1 if str(info["Walker2d-v5"]).startswith("FAILED") else 0
