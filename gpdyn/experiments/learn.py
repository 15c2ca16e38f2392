"""``gpdyn learn``: the online protocol of one learner on one problem, with a run folder.

Writes ``config.json``, ``metrics.jsonl`` (one record per evaluation: nMSE and the
held-out bound per output), ``checkpoint.pt`` (restored by :func:`load`) and
``report.md`` (the final table).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from gpdyn.data.problems import Normalizer, load_problem
from gpdyn.data.streams import IIDStream
from gpdyn.errors import InputError
from gpdyn.gp import Learner, make_learner
from gpdyn.gp.online import DTYPES, load_learner, run_online, save_learner
from gpdyn.runs import RunDir

CHECKPOINT = "checkpoint.pt"


def parse_sizes(items: list[str]) -> dict[str, Any]:
    """``["m_alpha=4096", "n_columns=none", "scales=dim"]`` -> keyword arguments."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--size '{item}': expected KEY=VALUE, e.g. m_alpha=4096")
        value: Any = raw.strip()
        if value.lower() == "none":
            value = None
        else:
            for cast in (int, float):
                try:
                    value = cast(value)
                    break
                except ValueError:
                    pass
        out[key.strip().replace("-", "_")] = value
    return out


def resolve_dtype(name: str | None, device: str) -> torch.dtype:
    """float32 on CUDA and float64 on CPU unless named (DESIGN.md)."""
    if name is None:
        return torch.float32 if torch.device(device).type == "cuda" else torch.float64
    return DTYPES[name]


def check_device(device: str) -> None:
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise InputError(f"--device '{device}': {err}") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {device}: CUDA is not available on this machine")


def cli_learn(args: argparse.Namespace) -> int:
    """Run SVDGP Algorithm 1 for one learner and write the run folder."""
    check_device(args.device)
    for option in ("iterations", "batch_size", "n_delta", "eval_every"):
        if getattr(args, option) < 1:  # before the run folder exists, so bad input leaves none
            raise InputError(f"--{option.replace('_', '-')} must be >= 1, got {getattr(args, option)}")
    dtype = resolve_dtype(args.dtype, args.device)
    sizes = parse_sizes(args.size)
    problem = load_problem(args.store, args.problem, protocol="iid", seed=args.seed)
    x_train, y_train = problem.tensors("train", args.device, dtype)
    x_test, y_test = problem.tensors("test", args.device, dtype)
    try:
        learner = make_learner(
            args.learner, problem.input_dim, problem.output_dim, device=args.device, dtype=dtype, seed=args.seed, **sizes
        )
    except TypeError as err:  # an option the learner does not take
        raise InputError(f"--size for learner '{args.learner}': {err}") from err
    config = {
        "learner": args.learner,
        "problem": problem.describe(),
        "iterations": args.iterations,
        "batch_size": args.batch_size,
        "n_delta": args.n_delta,
        "eval_every": args.eval_every,
        "seed": args.seed,
        "device": args.device,
        "dtype": str(dtype).removeprefix("torch."),
        "learner_config": getattr(learner, "config", sizes),
    }
    run = RunDir.create("learn", config, args.out)
    print(f"run folder: {run.path}")
    stream = IIDStream(x_train, y_train, args.batch_size, seed=args.seed, device=args.device, dtype=dtype)
    records = run_online(
        learner,
        stream,
        x_test,
        y_test,
        iterations=args.iterations,
        n_delta=args.n_delta,
        eval_every=args.eval_every,
        callback=lambda r: run.log(**r),
        n_data=len(x_train),
    )
    save_learner(learner, run.path / CHECKPOINT, normalizer=problem.normalizer.to_json(), problem=problem.describe())
    final = records[-1]
    (run.path / "report.md").write_text(_report(args.learner, problem.name, problem.output_names, final))
    print(
        f"{args.learner} on {problem.name} after {final['iteration']} iterations: "
        f"nMSE {final['nmse_mean']:.4f} ± {final['nmse_std']:.4f}, bound {final['vlb_mean']:.4f} ± {final['vlb_std']:.4f} "
        f"({final['step_s'] * 1e3:.1f} ms/iteration)"
    )
    print(f"checkpoint: {run.path / CHECKPOINT}")
    return 0


def load(run_dir: str | Path, device: str | torch.device | None = None) -> tuple[Learner, Normalizer]:
    """The learner of a ``gpdyn learn`` run folder, exactly as saved, and its normaliser."""
    learner, extra = load_learner(Path(run_dir) / CHECKPOINT, device=device)
    return learner, Normalizer.from_json(extra["normalizer"])


def _report(learner: str, problem: str, outputs: tuple[str, ...], final: dict[str, Any]) -> str:
    lines = [
        f"# {learner} on {problem}, iteration {final['iteration']}",
        "",
        "| output | nMSE | bound per point |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {e:.4f} | {b:.4f} |" for name, e, b in zip(outputs, final["nmse"], final["vlb"])]
    lines += [
        f"| mean ± std | {final['nmse_mean']:.4f} ± {final['nmse_std']:.4f} | {final['vlb_mean']:.4f} ± {final['vlb_std']:.4f} |",
        "",
    ]
    return "\n".join(lines)
