"""``gpdyn learn``: the online protocol of one learner on one problem, with a run folder.

Writes ``config.json`` (with the learner's resolved options, ``learner_config``, and the
command's ``settings``), ``metrics.jsonl`` (one record per evaluation: the held-out scores
of :func:`gpdyn.gp.online.evaluate` per output), ``checkpoint.pt`` (saved after every
evaluation; restored by :func:`load` once the run is finished), ``report.md`` (the final
table) and, last, ``finished.json``. A stopped run continues where its checkpoint left
it when the same command runs again with the same ``--out``
(:mod:`gpdyn.experiments.resume`, the mechanism of ``gpdyn replay``).

Defaults that finish on the machine at hand: without a preset the learner runs at
:func:`default_preset` of the device ("cpu" sizes on the CPU, "paper" on CUDA), and its
bases are capped at the training-set size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpdyn.data.problems import PROTOCOLS, load_problem
import gpdyn.robots.tasks  # noqa: F401  (registers every built-in task and its problems: walker-1, hopper-1, ...)
from gpdyn.data.streams import IIDStream
from gpdyn.device import dtype_name, resolve_device, resolve_dtype
from gpdyn.errors import InputError
from gpdyn.gp import Learner, learner_class, learner_options, make_learner
from gpdyn.experiments.learned import CHECKPOINT
from gpdyn.experiments.prior_mean import load_prior_mean, split_tensors
from gpdyn.experiments.report import write_report
from gpdyn.experiments.resume import Phase, open_run, segments, train
from gpdyn.experiments.stream import finished_streams, stream_learner
from gpdyn.gp.prequential import StreamProtocol
from gpdyn.progress import progress_bar
from gpdyn.runs import RunDir



@dataclass
class LearnConfig:
    """One learner on one problem under SVDGP Algorithm 1 (iid minibatches of the training split;
    ``protocol`` decides the held-out split, see :mod:`gpdyn.data.problems`)."""

    store: str
    problem: str
    learner: str
    iterations: int = 2000
    batch_size: int = 1024  # N_m
    n_delta: int | None = None  # basis functions added per iteration; None: the preset's
    eval_every: int = 100
    seed: int = 0
    device: str = "cpu"
    dtype: str | None = None  # None: the device's default (gpdyn.device.resolve_dtype)
    preset: str | None = None  # the learner's sizes at this named scale (gpdyn.gp.PRESETS); None: the device's default
    sizes: dict[str, Any] = field(default_factory=dict)  # learner constructor options, over the preset's
    protocol: str = "iid"  # iid, block, split or stream (ordered streams in order: gpdyn replay)
    stream: StreamProtocol = field(default_factory=StreamProtocol)  # the stream protocol's sizes
    prior_mean: str | None = None  # a fixed mean the learner models the residual of (gpdyn.experiments.prior_mean)

    def __post_init__(self) -> None:
        if self.preset is None:
            self.preset = default_preset(self.device)

    def validate(self) -> None:
        for name in ("iterations", "batch_size", "n_delta", "eval_every"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.protocol not in PROTOCOLS or self.protocol == "ordered":
            raise InputError(f"--protocol {self.protocol}: learn takes {', '.join(p for p in PROTOCOLS if p != 'ordered')} "
                             "(the ordered protocol streams in time order: gpdyn replay --protocol ordered)")
        self.stream.validate()


def default_preset(device: str | torch.device) -> str:
    """The learners' sizes when no preset is named: "paper" on a CUDA device, "cpu" on the CPU
    (the papers' sizes take hours of one core; the cpu ones run the 2000-iteration protocol in
    minutes, gpdyn.gp.base.PRESETS)."""
    return "paper" if torch.device(device).type == "cuda" else "cpu"


def protocol_options(learner: str, n_delta: int | None, n_data: int) -> dict[str, int]:
    """The protocol's N_Delta (basis functions added per iteration; None: the preset's) and N
    (training rows, the bound's data size) as constructor options of ``learner``, where it
    takes them: its config, and so its run folder and checkpoints, then record the values
    the run used."""
    takes = learner_options(learner_class(learner))
    return {k: v for k, v in {"n_delta": n_delta, "n_data": n_data}.items() if k in takes and v is not None}


def learn(
    cfg: LearnConfig,
    out: str | Path | None = None,
    *,
    progress: bool = True,
    on_checkpoint: Callable[[str, int], None] | None = None,
) -> tuple[RunDir, dict[str, Any]]:
    """Run SVDGP Algorithm 1 for one learner, write the run folder; return it and the last evaluation.

    With ``out`` naming the folder of a stopped run of the same settings and store, the run
    continues from its last checkpoint (:mod:`gpdyn.experiments.resume`, as ``gpdyn replay``);
    ``on_checkpoint(learner, iteration)`` is called after each saved checkpoint.
    """
    cfg.validate()  # before the run folder exists, so bad input leaves none
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    problem = load_problem(cfg.store, cfg.problem, protocol=cfg.protocol, seed=cfg.seed, progress=progress,
                           init_rows=cfg.stream.init_rows)
    prior = load_prior_mean(cfg.prior_mean, cfg.store, problem)  # before the run folder: a bad one leaves none
    x_train, y_train, prior_train = split_tensors(problem, "train", device, dtype, prior)
    x_test, y_test, prior_test = split_tensors(problem, "test", device, dtype, prior)
    options = {**protocol_options(cfg.learner, cfg.n_delta, len(x_train)), **cfg.sizes}

    def make() -> Learner:
        try:
            return make_learner(
                cfg.learner, problem.input_dim, problem.output_dim, device=device, dtype=dtype, seed=cfg.seed,
                preset=cfg.preset, rows=len(x_train), **options,
            )
        except TypeError as err:  # an option the learner does not take
            raise InputError(f"--size for learner '{cfg.learner}': {err}") from err

    learner = make()  # before the run folder: bad sizes leave none
    # the settings that decide the numbers, the dtype resolved: a resumed run must use the same
    settings = {**asdict(cfg), "dtype": dtype_name(dtype)}
    config = {
        "learner": cfg.learner,
        "problem": problem.describe(),
        "iterations": cfg.iterations,
        "batch_size": cfg.batch_size,
        "n_delta": cfg.n_delta,
        "eval_every": cfg.eval_every,
        "protocol": cfg.protocol,
        "preset": cfg.preset,
        "seed": cfg.seed,
        "device": str(device),
        "dtype": dtype_name(dtype),
        "learner_config": learner.config,
        "prior_mean": cfg.prior_mean,
        "settings": settings,
    }
    if cfg.protocol == "stream":
        config["stream"] = cfg.stream.as_dict()
    run = open_run("learn", out, settings, lambda: config, store=cfg.store,
                   saved_settings=lambda saved: saved.get("settings"))
    print(f"run folder: {run.path}")  # where the result is, for a script to read: stdout, not the log
    checkpoint = run.path / CHECKPOINT
    done = run.finished()
    if done is not None and isinstance(done.get("record"), dict):  # the same command again: nothing left to do
        if cfg.protocol == "stream" and not (run.path / "report.md").exists():  # stopped right after finishing
            write_report(run.path)
        return run, done["record"]
    if cfg.protocol == "stream":  # one pass, each chunk predicted before it is learned
        # a stream stopped part way starts again (as a replay's, gpdyn.experiments.stream)
        final = finished_streams(run).get(cfg.learner) or stream_learner(
            learner, problem, cfg.stream, run, checkpoint, prior=prior, progress=progress)
        run.finish(rows=final["rows"], record=final)  # first: the report of a finished run has no notice
        write_report(run.path)
        return run, final
    if prior_train is not None:  # the learner learns the residual of the prior mean
        y_train = y_train - prior_train
    phase = Phase("train", cfg.iterations,
                  lambda: IIDStream(x_train, y_train, cfg.batch_size, seed=cfg.seed, device=device, dtype=dtype))
    bar = progress_bar(total=cfg.iterations, desc=f"learn {cfg.learner}", unit="it", disable=not progress)
    try:
        # the checkpoint the run continues from is the one load() reads once the run is finished
        learner, final = train(cfg.learner, lambda: learner, segments([phase], cfg.eval_every), checkpoint, run,
                               x_test, y_test, device=device, dtype=dtype, bar=bar, prior_test=prior_test,
                               extra={"normalizer": problem.normalizer.to_json(), "problem": problem.describe(),
                                      "prior_mean": cfg.prior_mean},
                               on_checkpoint=on_checkpoint)
    finally:
        bar.close()
    assert final is not None  # iterations >= 1
    run.finish(iterations=final["iteration"], record=final)  # first: the report of a finished run has no notice
    write_report(run.path)
    return run, final
