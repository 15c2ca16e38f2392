"""The online learning protocol (docs/architecture.md; SVDGP Algorithm 1 and Appendix B), and checkpoints.

Each iteration draws a minibatch from the stream, lets the learner add basis functions
from it (``observe``: the first call also starts the hyperparameters by the median
trick) and takes one update (``step``). Every ``eval_every`` iterations, and after the
last, the learner is scored on the held-out split (:func:`evaluate`): nMSE and the
variational lower bound (SVDGP Table 2), and the calibration of its predictive
distribution of y, per output, then mean and std over outputs.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from gpdyn.device import dtype_name, resolve_dtype, sync
from gpdyn.errors import InputError
from gpdyn.gp import make_learner
from gpdyn.gp.base import LOG_2PI, Learner, check_plain
from gpdyn.progress import progress_bar
from gpdyn.torch_check import require_safe_torch_load

#: the layout of a checkpoint: learner name, config, dtype, the learner's declared state
#: (gpdyn.gp.base.Stateful) and the caller's extras, all plain data
CHECKPOINT_FORMAT = 2
#: the two-sided 95% point of the standard normal: the central 95% interval is mean ± Z95 sd
Z95 = 1.959963984540054
#: the scores of :func:`evaluate`, each per output with ``_mean`` and ``_std`` over outputs
SCORES = ("nmse", "vlb", "nll", "msll", "coverage")


def nmse(mean: Tensor, y: Tensor) -> Tensor:
    """Normalised mean squared error per output, ``[P]``: MSE / variance of ``y`` (Rasmussen & Williams)."""
    var = y.var(dim=0, unbiased=False).clamp_min(torch.finfo(y.dtype).tiny)
    return ((mean - y) ** 2).mean(0) / var


def predictive_scores(mean: Tensor, var: Tensor, y: Tensor) -> dict[str, Tensor]:
    """Calibration of Gaussian predictions ``N(mean, var)`` of the targets ``y``, each ``[N, P]``;
    per output ``[P]``:

    - ``nll``: the mean negative log predictive density, ``½ (r²/v + log v + log 2π)``;
    - ``msll``: ``nll`` minus that of ``N(0, 1)``, the mean standardised log loss of
      Rasmussen & Williams (2006, Sec. 2.5): with ``y`` normalised by the training mean and
      standard deviation, ``N(0, 1)`` is their trivial model (negative: better than it);
    - ``coverage``: the fraction of targets inside the central 95% interval ``mean ± Z95 sqrt(v)``
      (0.95 when the variance is right; below it, overconfident).
    """
    r2 = (y - mean).pow(2)
    nll = 0.5 * (r2 / var + var.log() + LOG_2PI)
    trivial = 0.5 * (y.pow(2) + LOG_2PI)
    return {
        "nll": nll.mean(0),
        "msll": (nll - trivial).mean(0),
        "coverage": (r2 <= Z95**2 * var).to(mean.dtype).mean(0),
    }


@torch.no_grad()
def evaluate(learner: Learner, x: Tensor, y: Tensor, chunk: int = 4096,
             prior: Tensor | None = None) -> dict[str, list[float] | float]:
    """The held-out :data:`SCORES` of ``learner`` on ``(x, y)`` (normalised with the training
    statistics) per output, with their mean and std over outputs: nMSE of the predictive
    mean, the bound per point (:meth:`~gpdyn.gp.base.Learner.vlb`), and the calibration
    of the predictive distribution of y, noise included (:func:`predictive_scores` of
    :meth:`~gpdyn.gp.base.Learner.predict_y`). ``prior`` ``[N, P]``: a fixed prior mean at
    ``x`` whose residual the learner models; its prediction of ``y`` is the prior plus its
    own, and its bound is on the residual."""
    means, variances = zip(*(learner.predict_y(x[i : i + chunk]) for i in range(0, x.shape[0], chunk)))
    mean, var = torch.cat(means), torch.cat(variances)
    if prior is not None:
        mean = mean + prior
    residual = y if prior is None else y - prior
    scores = {"nmse": nmse(mean, y), "vlb": learner.vlb(x, residual), **predictive_scores(mean, var, y)}
    out: dict[str, list[float] | float] = {}
    for key in SCORES:
        v = scores[key].double().cpu()
        out[key] = v.tolist()
        out[f"{key}_mean"] = float(v.mean())
        out[f"{key}_std"] = float(v.std(unbiased=False))
    return out


def observe_what_fits(learner: Learner, x: Tensor, y: Tensor) -> int:
    """Observe the rows that fit a learner with a ``"point_limit"`` (all of them otherwise); return
    how many it could not take."""
    room = learner.room()
    if room is not None and room < x.shape[0]:
        if room > 0:
            learner.observe(x[:room], y[:room])
        return x.shape[0] - room
    learner.observe(x, y)
    return 0


def run_online(
    learner: Learner,
    stream: Iterable[tuple[Tensor, Tensor]],
    x_test: Tensor,
    y_test: Tensor,
    iterations: int,
    n_delta: int | None = None,
    eval_every: int = 100,
    callback: Callable[[dict[str, Any]], None] | None = None,
    n_data: int | None = None,
    progress: bool = True,
    bar: tqdm | None = None,
    prior_test: Tensor | None = None,
) -> list[dict[str, Any]]:
    """Run SVDGP Algorithm 1 for ``iterations`` minibatches; return the evaluation records.

    Args:
        learner: any :class:`~gpdyn.gp.base.Learner` (untrained, or resumed from a checkpoint).
        stream: yields ``(x [N_m, D], y [N_m, P])`` on the learner's device and dtype. A one-pass
            learner (ssgp, rls, svdgp-stream) observes the rows of a stream that has ``first_pass_rows``
            (:meth:`gpdyn.data.streams.IIDStream.first_pass_rows`: its first epoch) once.
        x_test, y_test: the held-out split, normalised like the stream.
        n_delta: basis functions added per iteration (SVDGP N_Delta), for learners with the
            ``"n_delta"`` capability.
        eval_every: iterations between evaluations (one more after the last iteration).
        callback: called with each record, e.g. ``run.log(**record)``.
        n_data: the training-set size N of the bound, for learners with the ``"n_data"`` capability.
        progress: show a tqdm bar (ticks every iteration, with the time left).
        bar: an open tqdm bar to tick every iteration instead of a bar of its own (a replay
            keeps one bar over all its learners).
        prior_test: a fixed prior mean at ``x_test`` (:func:`evaluate`); the stream then
            yields the residual targets.

    Each record has ``iteration``, ``loss`` (of the last step), ``step_s`` (mean wall time
    per iteration since the last record, synchronised with the device only here),
    ``elapsed_s`` and the :func:`evaluate` metrics. A learner with a ``"point_limit"``
    observes the rows that fit and keeps taking steps; its records count the rows it
    could not observe in this call (``unobserved``).
    """
    if iterations < 1:
        raise InputError(f"run_online: iterations must be >= 1, got {iterations}")
    if eval_every < 1:
        raise InputError(f"run_online: eval_every must be >= 1, got {eval_every}")
    if n_delta is not None:
        if n_delta < 1:
            raise InputError(f"run_online: n_delta must be >= 1, got {n_delta}")
        if learner.can("n_delta"):
            learner.set_n_delta(n_delta)
    if n_data is not None and learner.can("n_data"):
        learner.set_n_data(n_data)
    records: list[dict[str, Any]] = []
    # a one-pass learner takes each row once: of an iid stream (gpdyn.data.streams.IIDStream), its first epoch
    first_pass_rows = getattr(stream, "first_pass_rows", None) if learner.can("one_pass") else None
    batches = iter(stream)
    start = time.perf_counter()
    last_time, last_it = start, 0
    loss: Tensor | float = float("nan")
    unobserved = 0
    own_bar = bar is None
    if bar is None:
        bar = progress_bar(total=iterations, desc=f"learn {learner.name}", disable=not progress, unit="it")
    try:
        for it in range(1, iterations + 1):
            try:
                xb, yb = next(batches)
            except StopIteration:
                raise InputError(f"run_online: the stream ended after {it - 1} of {iterations} iterations") from None
            if first_pass_rows is not None:  # a row observed twice would count twice
                rows = first_pass_rows()
                if rows is not None:
                    learner.observe(*rows)
            else:
                unobserved += observe_what_fits(learner, xb, yb)
            metrics = learner.step(xb, yb)
            loss = metrics.get("loss", loss)
            bar.update()
            if it % eval_every == 0 or it == iterations:
                sync(learner.device)
                now = time.perf_counter()
                record: dict[str, Any] = {
                    "iteration": it,
                    "loss": float(loss),
                    "step_s": (now - last_time) / (it - last_it),
                    "elapsed_s": now - start,
                }
                bar.set_postfix_str("evaluating")
                record.update(evaluate(learner, x_test, y_test, prior=prior_test))
                record.update(learner.diagnostics())
                if learner.can("point_limit"):
                    record["unobserved"] = unobserved
                records.append(record)
                bar.set_postfix(nmse=f"{record['nmse_mean']:.4f}", nll=f"{record['nll_mean']:.3f}",
                                cover=f"{record['coverage_mean']:.3f}")
                if callback is not None:
                    callback(record)
                last_time, last_it = time.perf_counter(), it
    finally:
        if own_bar:
            bar.close()
    return records


def save_learner(learner: Learner, path: str | Path, **extra: Any) -> Path:
    """Write a checkpoint that :func:`load_learner` restores exactly (``extra`` is kept alongside).

    Everything in it is plain data (tensors, numbers, strings, dicts, lists), so that
    loading runs no pickled code; anything else (a custom kernel object in the config,
    say) is a LearnerError naming where it is.
    """
    checkpoint = {
        "format": CHECKPOINT_FORMAT,
        "learner": learner.name,
        "config": dict(learner.config),
        "dtype": dtype_name(learner.dtype),
        "state": learner.state_dict(),
        "extra": extra,
    }
    check_plain(checkpoint, f"save_learner({learner.name})")
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    torch.save(checkpoint, partial)
    os.replace(partial, path)  # atomic: a crash mid-save never leaves a truncated checkpoint
    return path


#: checkpoints being loaded now (resolved paths): a config that names a checkpoint (a
#: ResidualGP's prior) must not lead back to one of them
_LOADING: set[Path] = set()


def _first_nonfinite(value: Any, where: str) -> str | None:
    """The key path of the first NaN or inf in ``value`` (tensors, floats, dicts, lists), or None."""
    if isinstance(value, Tensor):
        return where if value.is_floating_point() and not bool(torch.isfinite(value).all()) else None
    if isinstance(value, float):
        return None if math.isfinite(value) else where
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        found = _first_nonfinite(item, f"{where}.{key}" if isinstance(value, Mapping) else f"{where}[{key}]")
        if found is not None:
            return found
    return None


def load_learner(
    path: str | Path,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    *,
    extra_keys: Mapping[str, type | tuple[type, ...]] | None = None,
) -> tuple[Learner, dict[str, Any]]:
    """Rebuild the learner saved by :func:`save_learner` (on ``device``, default CPU) and its extras.

    The file is read with ``torch.load(weights_only=True)``: no pickled code runs. Anything
    damaged is an InputError naming the file and the key: a truncated or foreign file, a
    missing or malformed ``learner``/``config``/``dtype``/``state`` entry, a NaN or inf
    anywhere in the config or the state (a learner never saves one), a state that does not
    fit the learner its config builds, and an extra of ``extra_keys`` (``{key: type}``, the
    ones the caller reads) that is missing or of another type.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such checkpoint")
    require_safe_torch_load()
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file: say which
        raise InputError(f"{path}: not a gpdyn checkpoint ({type(err).__name__}: {err})") from err
    if not isinstance(ckpt, Mapping) or not {"learner", "config", "state", "dtype"} <= set(ckpt):
        raise InputError(f"{path}: not a gpdyn learner checkpoint (missing learner/config/state/dtype)")
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise InputError(f"{path}: checkpoint format {ckpt.get('format', 1)!r}, this gpdyn reads format {CHECKPOINT_FORMAT} "
                         "(written by another version: run the job again to write a new one)")
    name, config, extra = ckpt["learner"], ckpt["config"], ckpt.get("extra", {})
    for key in ("learner", "dtype"):
        if not isinstance(ckpt[key], str):
            raise InputError(f"{path}: '{key}' must be a name, got {type(ckpt[key]).__name__}")
    for key, value in (("config", config), ("state", ckpt["state"]), ("extra", extra)):
        if not isinstance(value, Mapping):
            raise InputError(f"{path}: '{key}' must be a dict, got {type(value).__name__}")
    config = dict(config)
    for key in ("input_dim", "output_dim"):
        if type(config.get(key)) is not int:
            raise InputError(f"{path}: config.{key} must be an integer, got {config.get(key)!r}")
    for key, kind in (extra_keys or {}).items():
        if key not in extra:
            raise InputError(f"{path}: extra '{key}' missing (a damaged or foreign checkpoint)")
        if not isinstance(extra[key], kind) or isinstance(extra[key], bool) and kind is not bool:
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise InputError(f"{path}: extra '{key}' is a {type(extra[key]).__name__}, expected {names}")
    bad = _first_nonfinite(config, "config") or _first_nonfinite(ckpt["state"], "state")
    if bad is not None:
        raise InputError(f"{path}: {bad} holds NaN or inf (a learner never saves one: the checkpoint is damaged)")
    input_dim, output_dim = config.pop("input_dim"), config.pop("output_dim")
    resolved = path.resolve()
    if resolved in _LOADING:
        raise InputError(f"{path}: the checkpoint's config leads back to itself")
    _LOADING.add(resolved)
    try:
        learner = make_learner(
            name,
            input_dim,
            output_dim,
            device=device or "cpu",
            dtype=dtype or resolve_dtype(ckpt["dtype"], option="dtype"),
            **config,
        )
        learner.load_state_dict(ckpt["state"])
    except InputError as err:  # LearnerError included
        raise InputError(f"{path}: {err}") from err
    except (TypeError, ValueError, RuntimeError) as err:  # a config value of the wrong kind for its constructor
        raise InputError(f"{path}: the config does not build a '{name}' learner ({type(err).__name__}: {err})") from err
    finally:
        _LOADING.discard(resolved)
    return learner, dict(extra)


__all__ = ["CHECKPOINT_FORMAT", "SCORES", "Z95", "evaluate", "load_learner", "nmse", "observe_what_fits",
           "predictive_scores", "run_online",
           "save_learner"]
