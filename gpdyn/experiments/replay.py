"""`gpdyn replay`: several learners on one stored dataset under one protocol (SVDGP Table 2).

Every learner sees the same minibatches in the same order (one stream per learner,
built from the same seed) and is scored on the same held-out split every
``eval_every`` iterations through :func:`gpdyn.gp.online.run_online`.

Protocols (see :mod:`gpdyn.data.problems`):

- ``iid``, ``block``, ``split``: SVDGP Algorithm 1 on seeded iid minibatches of the
  training split; they differ in the held-out split (a seeded 10% of the rows, a seeded
  contiguous block of each episode, a dataset's own test file).
- ``ordered`` (the ILGR protocol for KUKA): ``init_iterations`` iid minibatches of the
  offline part initialise the learner, then the online part is streamed in time order,
  ``batch_size`` consecutive samples per iteration, until ``iterations`` or the end of
  the stream.
- ``stream`` (prequential, :mod:`gpdyn.gp.prequential`): one pass over every sample in
  store order, each chunk predicted before it is learned; ``stream`` holds its sizes
  (init, chunk, warm rows, steps). ``iterations``, ``batch_size``, ``eval_every``,
  ``eval_rows`` and ``select_lr`` do not apply (:mod:`gpdyn.experiments.stream`).

Step size (``select_lr``): SVDGP Section 4 picks each learner's gamma_0 from
{1e-1, 1e-2, 1e-3} "to maximize the improvement in objective function after the first
100 iterations". :func:`select_step_size` does that before a learner's main run: each
candidate runs ``select_iterations`` iterations of the first phase's stream from the
same start, and the one whose minibatch objective (the negative bound, taken before
each update, so on data the step has not seen) is lowest over the last tenth wins. The
choice and every candidate's objective are logged and kept in ``step_size.json``.

Sizes: every learner runs at ``preset`` (default :func:`~gpdyn.experiments.learn.default_preset`,
"cpu" on the CPU and "paper" on CUDA), with its bases capped at the training-set size and
``sizes`` over them; ``config.json`` records each learner's resolved options
(``learner_config``) before any training.

Resumable (:mod:`gpdyn.experiments.resume`): after each evaluation the learner and its
stream position are saved under ``checkpoints/``; running the same command with ``--out``
on the stopped run folder continues from there, with no repeated work and the same final
numbers, provided the store at ``--store`` is the one the run read. A finished run writes
``finished.json``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpdyn.data.problems import PROTOCOLS, Problem, load_problem
import gpdyn.robots.tasks  # noqa: F401  (registers every built-in task and its problems: walker-1, hopper-1, ...)
from gpdyn.data.streams import IIDStream, OrderedStream
from gpdyn.device import resolve_device, resolve_dtype
from gpdyn.errors import InputError
from gpdyn.experiments.learn import default_preset, protocol_options
from gpdyn.experiments.report import STEP_SIZE_FILE
from gpdyn.gp import LEARNERS, Learner, LearnerError, learner_class, learner_options, make_learner, preset_options
from gpdyn.experiments.prior_mean import PriorMean, load_prior_mean, split_tensors
from gpdyn.experiments import resume
from gpdyn.experiments.resume import Phase, segments, train
from gpdyn.experiments.stream import finished_streams, stream_learner
from gpdyn.gp.prequential import StreamProtocol
from gpdyn.progress import progress_bar
from gpdyn.runs import RunDir

CHECKPOINTS = "checkpoints"


@dataclass
class ReplayConfig:
    """Everything that decides a replay's numbers (a resumed run must match it)."""

    store: str
    problem: str
    learners: list[str]
    protocol: str = "iid"
    iterations: int = 2000
    batch_size: int = 1024
    n_delta: int | None = None  # None: each learner's preset's
    eval_every: int = 100
    init_iterations: int = 200
    eval_rows: int | None = None  # score on a seeded subset of this many test rows (None: all)
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float64"  # a key of gpdyn.device.DTYPES
    preset: str | None = None  # every learner's sizes at this named scale (gpdyn.gp.PRESETS); None: the device's default
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)  # learner -> constructor options, over the preset's
    select_lr: list[float] | None = None  # gamma_0 candidates, chosen per learner (SVDGP Section 4)
    select_iterations: int = 100
    stream: StreamProtocol = field(default_factory=StreamProtocol)  # the stream protocol's sizes
    prior_mean: str | None = None  # a fixed mean every learner models the residual of (gpdyn.experiments.prior_mean)

    def __post_init__(self) -> None:
        # recorded resolved, so that the run folder says which sizes ran
        if self.preset is None:
            self.preset = default_preset(self.device)
        if isinstance(self.stream, dict):  # read back from a run folder's config.json
            self.stream = StreamProtocol(**self.stream)

    def validate(self) -> None:
        resolve_device(self.device)
        resolve_dtype(self.dtype, self.device)
        if self.protocol not in PROTOCOLS:
            raise InputError(f"--protocol {self.protocol}: choose one of {', '.join(PROTOCOLS)}")
        unknown = [name for name in self.learners if name not in LEARNERS]
        if unknown or not self.learners:
            raise InputError(f"--learners: unknown {unknown or 'none given'}; choose from {', '.join(LEARNERS)}")
        if len(set(self.learners)) != len(self.learners):
            raise InputError(f"--learners: {self.learners} names a learner twice")
        for name in ("iterations", "batch_size", "n_delta", "eval_every"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.eval_rows is not None and self.eval_rows < 1:
            raise InputError(f"--eval-rows must be >= 1, got {self.eval_rows}")
        if self.init_iterations < 0:
            raise InputError(f"--init-iterations must be >= 0, got {self.init_iterations}")
        for name in self.learners:  # a learner without the preset: say so before any work
            preset_options(learner_class(name), self.preset)
        stray = set(self.sizes) - set(self.learners)
        if stray:
            raise InputError(f"--size names learners not in --learners: {sorted(stray)}")
        if self.select_lr is not None:
            if not self.select_lr or any(not (lr > 0 and math.isfinite(lr)) for lr in self.select_lr):
                raise InputError(f"--select-lr: every candidate must be a finite number > 0, got {self.select_lr}")
            if self.select_iterations < 1:
                raise InputError(f"--select-iterations must be >= 1, got {self.select_iterations}")
            fixed = sorted(name for name, opts in self.sizes.items() if "lr" in opts)
            if fixed:
                raise InputError(f"--select-lr and --size {fixed[0]}.lr=...: choose the step size one way")
            if self.protocol == "stream":
                raise InputError("--select-lr: the stream protocol has no probe phase (every row is scored before "
                                 "it is learned); set a step size with --size LEARNER.lr=...")
        self.stream.validate()


def _phases(cfg: ReplayConfig, problem: Problem, dtype: torch.dtype, prior: PriorMean | None) -> list[Phase]:
    """The streams of the run, of the targets a learner learns (their residual, with a prior mean)."""

    def learned(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        x, y, at_x = split_tensors(problem, split, cfg.device, dtype, prior)
        return x, y if at_x is None else y - at_x

    x_train, y_train = learned("train")
    lengths = dict(phase_lengths(cfg, problem))
    if cfg.protocol != "ordered":
        return [Phase("train", lengths["train"], lambda: IIDStream(x_train, y_train, cfg.batch_size, cfg.seed, cfg.device, dtype))]
    phases = []
    if "init" in lengths:
        x_init, y_init = learned("init")
        phases.append(
            Phase("init", lengths["init"], lambda: IIDStream(x_init, y_init, cfg.batch_size, cfg.seed, cfg.device, dtype))
        )
    phases.append(
        Phase("stream", lengths["stream"], lambda: OrderedStream(x_train, y_train, cfg.batch_size, cfg.device, dtype))
    )
    return phases


def phase_lengths(cfg: ReplayConfig, problem: Problem) -> list[tuple[str, int]]:
    """(name, iterations) of every phase of the run (for a learner; the stream protocol has none)."""
    if cfg.protocol != "ordered":
        return [("train", cfg.iterations)]
    init = [("init", cfg.init_iterations)] if len(problem.x_init) and cfg.init_iterations else []
    return init + [("stream", min(cfg.iterations, -(-len(problem.x_train) // cfg.batch_size)))]


def replay(
    cfg: ReplayConfig,
    run: RunDir,
    *,
    problem: Problem | None = None,
    prior: PriorMean | None = None,
    progress: bool = True,
    on_checkpoint: Callable[[str, int], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run (or continue) every learner of ``cfg`` in ``run``; return the last record per learner.

    ``problem`` is loaded from ``cfg`` unless given, and so is ``prior`` (``cfg.prior_mean``'s);
    ``on_checkpoint(learner, iteration)`` is called after each saved checkpoint.
    """
    cfg.validate()
    dtype = resolve_dtype(cfg.dtype, cfg.device)
    if problem is None:
        problem = load_problem(cfg.store, cfg.problem, protocol=cfg.protocol, seed=cfg.seed, progress=progress,
                               init_rows=cfg.stream.init_rows)
    if prior is None:
        prior = load_prior_mean(cfg.prior_mean, cfg.store, problem)
    if cfg.protocol == "stream":
        return _replay_stream(cfg, run, problem, dtype, prior, progress)
    x_test, y_test, prior_test = split_tensors(problem, "test", cfg.device, dtype, prior)
    if cfg.eval_rows is not None and cfg.eval_rows < len(x_test):
        # the same seeded subset for every learner; time order kept
        keep = torch.randperm(len(x_test), generator=torch.Generator().manual_seed(cfg.seed))[: cfg.eval_rows]
        keep = keep.sort().values.to(x_test.device)
        x_test, y_test = x_test[keep], y_test[keep]
        prior_test = None if prior_test is None else prior_test[keep]
    plan = segments(_phases(cfg, problem, dtype, prior), cfg.eval_every)
    total = sum(n for _, _, n in plan)
    (run.path / CHECKPOINTS).mkdir(exist_ok=True)
    finals: dict[str, dict[str, Any]] = {}
    bar = progress_bar(total=total * len(cfg.learners), desc="replay", unit="it", disable=not progress)
    _record_learner_configs(cfg, run, problem, dtype)

    def make(name: str) -> Learner:
        options = dict(cfg.sizes.get(name, {}))
        if cfg.select_lr is not None and "lr" in learner_options(learner_class(name)):
            bar.set_description(f"replay {name} (step size)")
            options["lr"] = select_step_size(name, cfg, problem, dtype, plan[0][1], run, progress=progress)
        learner = _make(name, cfg, problem, dtype, options)
        if "lr" in options:  # the step size chosen above
            _record_learner_config(run, name, learner)
        return learner

    for name in cfg.learners:
        _, final = train(name, lambda: make(name), plan, run.path / CHECKPOINTS / f"{name}.pt", run, x_test, y_test,
                         device=cfg.device, dtype=dtype, bar=bar, prior_test=prior_test, on_checkpoint=on_checkpoint)
        assert final is not None  # every protocol has at least one segment
        finals[name] = final
    bar.close()
    run.finish(iterations=total, learners={name: r["iteration"] for name, r in finals.items()})
    return finals


def _replay_stream(cfg: ReplayConfig, run: RunDir, problem: Problem, dtype: torch.dtype, prior: PriorMean | None,
                   progress: bool) -> dict[str, dict[str, Any]]:
    """Every learner of ``cfg`` through the stream protocol, one after the other; a learner whose
    stream finished in ``run`` (a resumed run) is not streamed again."""
    (run.path / CHECKPOINTS).mkdir(exist_ok=True)
    _record_learner_configs(cfg, run, problem, dtype)
    finals = finished_streams(run)
    for name in cfg.learners:
        if name in finals:
            continue
        learner = _make(name, cfg, problem, dtype, dict(cfg.sizes.get(name, {})))
        finals[name] = stream_learner(learner, problem, cfg.stream, run, run.path / CHECKPOINTS / f"{name}.pt",
                                      prior=prior, progress=progress)
    run.finish(rows={name: finals[name]["rows"] for name in cfg.learners})
    return {name: finals[name] for name in cfg.learners}


def _record_learner_config(run: RunDir, name: str, learner: Learner) -> None:
    """Keep ``learner``'s resolved options in ``config.json`` under ``learner_config``."""
    config = run.config()
    config.setdefault("learner_config", {})[name] = learner.config
    run.write_json("config.json", config)


def _record_learner_configs(cfg: ReplayConfig, run: RunDir, problem: Problem, dtype: torch.dtype) -> None:
    """Every learner's resolved options in ``config.json`` before any training (built and
    dropped; a step size chosen by ``--select-lr`` is recorded once chosen)."""
    recorded = run.config().get("learner_config", {})
    for name in cfg.learners:
        if name not in recorded:
            _record_learner_config(run, name, _make(name, cfg, problem, dtype, dict(cfg.sizes.get(name, {}))))


def _make(name: str, cfg: ReplayConfig, problem: Problem, dtype: torch.dtype, options: dict[str, Any]) -> Learner:
    # the protocol's N_Delta and N, so that a step-size probe runs the model of the main run;
    # bases capped at the training rows (a basis larger than the data only repeats points)
    rows = len(problem.x_train) + len(problem.x_init)
    options = {**protocol_options(name, cfg.n_delta, rows), **options}
    try:
        return make_learner(
            name, problem.input_dim, problem.output_dim, device=cfg.device, dtype=dtype, seed=cfg.seed,
            preset=cfg.preset, rows=rows, **options,
        )
    except TypeError as err:  # an option the learner does not take
        raise InputError(f"--size for learner '{name}': {err}") from err


def select_step_size(
    name: str, cfg: ReplayConfig, problem: Problem, dtype: torch.dtype, phase: Phase, run: RunDir,
    progress: bool = True,
) -> float:
    """gamma_0 for ``name``: the candidate of ``cfg.select_lr`` with the best objective after
    ``cfg.select_iterations`` iterations (SVDGP Section 4); kept in ``step_size.json`` so a
    resumed run does not probe again.

    The objective is the learner's minibatch loss (negative bound per point) before each
    update, averaged over the last tenth of the probe. A candidate that diverges (a
    non-finite loss, or a failed factorisation) is out; if all do, it is an error.
    """
    assert cfg.select_lr is not None
    path = run.path / STEP_SIZE_FILE
    chosen = json.loads(path.read_text()) if path.exists() else {}
    if name in chosen:
        return float(chosen[name]["lr"])
    window = max(1, cfg.select_iterations // 10)
    objectives: dict[str, float] = {}
    for lr in cfg.select_lr:
        learner = _make(name, cfg, problem, dtype, {**cfg.sizes.get(name, {}), "lr": lr})
        batches = iter(phase.make_stream())  # every candidate starts from the same data
        losses: list[float] = []
        try:
            for _ in progress_bar(range(cfg.select_iterations), desc=f"{name} gamma_0={lr:g}", unit="it", leave=False,
                          disable=not progress):
                xb, yb = next(batches)
                learner.observe(xb, yb)
                losses.append(float(learner.step(xb, yb)["loss"]))
        except (LearnerError, torch.linalg.LinAlgError):
            losses.append(math.inf)
        except StopIteration:
            raise InputError(f"--select-iterations {cfg.select_iterations}: the stream has fewer minibatches") from None
        tail = losses[-window:]
        objectives[repr(lr)] = sum(tail) / len(tail) if all(map(math.isfinite, tail)) else math.inf
        run.log(kind="step_size", learner=name, lr=lr, objective=objectives[repr(lr)], iterations=len(losses))
    finite = {k: v for k, v in objectives.items() if math.isfinite(v)}
    if not finite:
        raise InputError(f"--select-lr: learner '{name}' diverged with every candidate {cfg.select_lr}")
    best = float(min(finite, key=finite.get))
    chosen[name] = {"lr": best, "objective": {k: (v if math.isfinite(v) else None) for k, v in objectives.items()},
                    "iterations": cfg.select_iterations}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(chosen, indent=2))
    tmp.replace(path)
    return best


def open_run(cfg: ReplayConfig, out: Path | None, problem: Problem | None = None) -> RunDir:
    """A new run folder, or the stopped one at ``out`` when its settings and store match
    (:func:`gpdyn.experiments.resume.open_run`).

    ``problem`` (loaded from ``cfg`` if not given) names the outputs in the config.
    """
    mine = asdict(cfg)
    defaults = asdict(ReplayConfig(store="", problem="", learners=[]))

    def new_config() -> dict[str, Any]:
        loaded = problem or load_problem(cfg.store, cfg.problem, protocol=cfg.protocol, seed=cfg.seed,
                                         init_rows=cfg.stream.init_rows)
        planned = {} if cfg.protocol == "stream" else {
            "planned_iterations": sum(n for _, n in phase_lengths(cfg, loaded))}
        return {**mine, "outputs": list(loaded.output_names), "problem_summary": loaded.describe(), **planned}

    # a setting added after a run was made reads as its default
    return resume.open_run("replay", out, mine, new_config, store=cfg.store, unordered=("learners",),
                           saved_settings=lambda config: {k: config.get(k, defaults[k]) for k in mine})


def print_table(finals: dict[str, dict[str, Any]]) -> None:
    """Print the last evaluation of every learner, each score's mean ± std over outputs, to
    stdout (a result, not a log message)."""
    from gpdyn.experiments.report import COLUMNS

    if all("rows" in r for r in finals.values()):  # the stream protocol's final records
        print(f"\n{'learner':<10} {'rows':>8} {'nMSE':>17} {'NLL':>17} {'95% coverage':>17} {'update ms/row':>14} "
              f"{'predict ms/row':>15}")
        for name, r in finals.items():
            cells = " ".join(f"{r[m + '_mean']:>17.4f}" for m in ("nmse", "nll", "coverage"))
            print(f"{name:<10} {r['rows']:>8} {cells} {r['update_ms_per_row']:>14.3f} {r['predict_ms_per_row']:>15.3f}")
        return

    def cell(r: dict[str, Any], metric: str) -> str:
        return f"{r[metric + '_mean']:.4f} ± {r[metric + '_std']:.4f}" if metric + "_mean" in r else "–"

    print(f"\n{'learner':<10} {'iter':>6} " + " ".join(f"{title:>19}" for title in COLUMNS.values()) + f" {'s/it':>8}")
    for name, r in finals.items():
        cells = " ".join(f"{cell(r, metric):>19}" for metric in COLUMNS)
        print(f"{name:<10} {r['iteration']:>6} {cells} {r['seconds'] / max(r['iteration'], 1):>8.4f}")
