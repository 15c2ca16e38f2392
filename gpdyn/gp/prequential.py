"""The prequential (stream) protocol: predict each row before it is learned, then learn it.

An online dynamics learner meets its data as the robot moves: rows arrive in time order,
and what matters is how well it predicts the rows it has not seen yet. The prequential
rule (Dawid 1984, "Statistical theory: the prequential approach") scores exactly that,
with every row used once for testing and then once for learning:

1. the first ``init_rows`` rows start the learner: it observes them as one batch (its
   hyperparameters start from them, :meth:`~gpdyn.gp.base.Learner.observe`), then takes
   ``init_steps`` updates on them (a learner with a ``pretrain`` phase runs that instead);
2. the rest comes in chunks of ``chunk`` consecutive rows; each chunk is first predicted
   (:meth:`~gpdyn.gp.base.Learner.predict_y`, noise included), then observed, then the
   learner takes ``steps_per_chunk`` updates on it;
3. only the predictions of rows at or after ``warm_rows`` are scored, so that the
   learner's first minutes do not dominate the table.

The scores accumulate over the scored rows, per output: nMSE (squared error over the
variance of the scored targets, so predicting their mean scores 1), the mean negative log
predictive density and the fraction inside the central 95% interval. Time is measured
separately for predicting and for learning (process CPU time on the CPU, wall time
between device syncs on a GPU, :func:`gpdyn.device.seconds`), per streamed row.
"""

from __future__ import annotations

import math

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from gpdyn.device import seconds
from gpdyn.errors import InputError
from gpdyn.gp.base import Learner
from gpdyn.gp.online import observe_what_fits, predictive_scores
from gpdyn.progress import progress_bar


@dataclass(frozen=True)
class StreamProtocol:
    """The sizes of the prequential rule (see the module docs)."""

    init_rows: int = 1024
    chunk: int = 256
    warm_rows: int = 2048
    init_steps: int = 0
    steps_per_chunk: int = 1

    def validate(self, rows: int | None = None) -> None:
        """InputError naming the option for an impossible setting (``rows``: the stream's length)."""
        for name in ("init_rows", "chunk", "steps_per_chunk"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("warm_rows", "init_steps"):
            if getattr(self, name) < 0:
                raise InputError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.warm_rows < self.init_rows:
            raise InputError(f"--warm-rows {self.warm_rows} is below --init-rows {self.init_rows}: the init rows are "
                             "learned before anything is predicted, so they cannot be scored")
        if rows is not None and rows <= self.warm_rows:
            raise InputError(f"the stream has {rows} rows, none of them after --warm-rows {self.warm_rows}: "
                             "lower --warm-rows (and --init-rows) or use a longer stream")

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class StreamScores:
    """Running sums of the prequential scores per output (``[P]`` tensors on the learner's device)."""

    def __init__(self, outputs: int, device: torch.device) -> None:
        # float64 sums whatever the learner's dtype: a float32 sum over 10^5 rows loses digits
        zeros = lambda: torch.zeros(outputs, device=device, dtype=torch.float64)  # noqa: E731
        self.rows = 0
        self.sse, self.sum_y, self.sum_y2, self.nll, self.covered = (zeros() for _ in range(5))

    def add(self, mean: Tensor, var: Tensor, y: Tensor) -> None:
        """Score the predictions ``N(mean, var)`` of targets ``y``, each ``[N, P]``."""
        mean, var, y = mean.double(), var.double(), y.double()
        n = y.shape[0]
        scores = predictive_scores(mean, var, y)  # means over the rows: the held-out scores' one home
        self.rows += n
        self.sse += (y - mean).pow(2).sum(0)
        self.sum_y += y.sum(0)
        self.sum_y2 += y.pow(2).sum(0)
        self.nll += n * scores["nll"]
        self.covered += n * scores["coverage"]

    def summary(self) -> dict[str, list[float]]:
        """``nmse``, ``nll`` and ``coverage`` per output (empty lists before any row is scored)."""
        if self.rows == 0:
            return {"nmse": [], "nll": [], "coverage": []}
        n = self.rows
        var_y = (self.sum_y2 / n - (self.sum_y / n).pow(2)).clamp_min(torch.finfo(torch.float64).tiny)
        return {
            "nmse": (self.sse / n / var_y).cpu().tolist(),
            "nll": (self.nll / n).cpu().tolist(),
            "coverage": (self.covered / n).cpu().tolist(),
        }


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    out: list[Any] = []
    t = seconds(lambda: out.append(fn()), device)
    return out[0], t


def prequential(
    learner: Learner,
    x: Tensor,
    y: Tensor,
    protocol: StreamProtocol = StreamProtocol(),
    *,
    prior: Tensor | None = None,
    record_every: int | None = None,
    callback: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
    bar: tqdm | None = None,
) -> list[dict[str, Any]]:
    """Stream ``x [N, D]``, ``y [N, P]`` (time order, normalised, on the learner's device and dtype)
    through ``learner`` under ``protocol``; return the records (the last one is the final score).

    ``prior`` ``[N, P]``: a fixed prior mean at every row (:mod:`gpdyn.experiments.prior_mean`):
    the learner learns ``y - prior`` and the scored prediction of ``y`` is ``prior`` plus its own.

    A record is written every ``record_every`` chunks (default: about 100 records over the
    stream) and after the last: ``rows`` (rows learned so far), ``scored`` (rows scored so
    far), the cumulative ``nmse``/``nll``/``coverage`` per output with their ``_mean``
    over outputs, ``window_nmse`` (over the rows scored since the previous record), the
    seconds spent in ``init_s``, ``update_s`` and ``predict_s``,
    ``update_ms_per_row``/``predict_ms_per_row`` over the streamed rows and
    ``window_update_ms_per_row`` over the rows since the previous record (flat in ``rows``
    for a learner whose update does not grow with the data). ``callback`` gets
    each record as it is made.
    """
    n = x.shape[0]
    protocol.validate(n)
    if y.shape[0] != n:
        raise InputError(f"prequential: x has {n} rows but y has {y.shape[0]}")
    if prior is not None and prior.shape != y.shape:
        raise InputError(f"prequential: the prior mean has shape {tuple(prior.shape)}, y {tuple(y.shape)}")
    target = y if prior is None else y - prior  # what the learner learns
    device = learner.device
    chunks = -(-(n - protocol.init_rows) // protocol.chunk)
    record_every = record_every or max(1, chunks // 100)
    if record_every < 1:
        raise InputError(f"prequential: record_every must be >= 1, got {record_every}")

    def start() -> None:
        xi, yi = x[: protocol.init_rows], target[: protocol.init_rows]
        observe_what_fits(learner, xi, yi)
        if protocol.init_steps and learner.can("pretrain"):
            learner.pretrain(xi, yi, iterations=protocol.init_steps, progress=False)
        else:
            for _ in range(protocol.init_steps):
                learner.step(xi, yi)

    _, init_s = _timed(start, device)
    total = StreamScores(learner.output_dim, device)
    window = StreamScores(learner.output_dim, device)
    update_s = predict_s = 0.0
    window_update_s, window_rows = 0.0, 0  # since the previous record: does an update's cost grow with n?
    unobserved = 0
    records: list[dict[str, Any]] = []
    own_bar = bar is None
    if bar is None:
        bar = progress_bar(total=chunks, desc=f"stream {learner.name}", unit="chunk", disable=not progress)
    try:
        for k, a in enumerate(range(protocol.init_rows, n, protocol.chunk), start=1):
            b = min(a + protocol.chunk, n)
            xc, yc = x[a:b], target[a:b]
            (mean, var), t = _timed(lambda: _predict(learner, xc), device)
            predict_s += t
            first_scored = max(a, protocol.warm_rows) - a  # rows of this chunk at or after warm_rows
            if first_scored < b - a:
                s = slice(a + first_scored, b)
                mean_y = mean[first_scored:] if prior is None else mean[first_scored:] + prior[s]
                for scores in (total, window):
                    scores.add(mean_y, var[first_scored:], y[s])

            def learn() -> int:
                missed = observe_what_fits(learner, xc, yc)
                for _ in range(protocol.steps_per_chunk):
                    learner.step(xc, yc)
                return missed

            missed, t = _timed(learn, device)
            unobserved += missed
            update_s += t
            window_update_s += t
            window_rows += b - a
            bar.update()
            if k % record_every == 0 or b == n:
                streamed = b - protocol.init_rows
                record: dict[str, Any] = {"rows": b, "scored": total.rows, **total.summary(),
                                          "window_nmse": window.summary()["nmse"], "init_s": init_s,
                                          "update_s": update_s, "predict_s": predict_s,
                                          "update_ms_per_row": 1e3 * update_s / streamed,
                                          "predict_ms_per_row": 1e3 * predict_s / streamed,
                                          "window_update_ms_per_row": 1e3 * window_update_s / window_rows,
                                          "cpu_s": init_s + update_s + predict_s}
                if learner.can("point_limit"):
                    record["unobserved"] = unobserved
                _check_finite(learner, record, previous=records[-1]["rows"] if records else protocol.init_rows)
                record.update(learner.diagnostics())
                for key in ("nmse", "nll", "coverage"):
                    if record[key]:
                        record[f"{key}_mean"] = sum(record[key]) / len(record[key])
                window = StreamScores(learner.output_dim, device)
                window_update_s, window_rows = 0.0, 0
                records.append(record)
                if "nmse_mean" in record:
                    bar.set_postfix(nmse=f"{record['nmse_mean']:.4f}", cover=f"{record['coverage_mean']:.3f}")
                if callback is not None:
                    callback(record)
    finally:
        if own_bar:
            bar.close()
    return records


def _check_finite(learner: Learner, record: dict[str, Any], previous: int) -> None:
    """Stop the stream once a score is NaN or infinite: it would stay so for the rest of the
    stream and make every later figure meaningless. On a GPU this is where a failed factorisation
    shows (:func:`gpdyn.gp.base.cholesky` returns NaN factors there instead of syncing to raise)."""
    bad = [p for p, v in enumerate(record["nmse"]) if not math.isfinite(v)]
    if bad:
        raise FloatingPointError(
            f"prequential: {learner.name} ({learner.dtype}, {learner.device}) predicted non-finite values for "
            f"output(s) {bad} between rows {previous} and {record['rows']}; a factorisation failed or the learner "
            f"diverged. On the CPU the same run raises at the failing step; float64 (--dtype float64) is the "
            f"numerically safer choice"
        )


@torch.no_grad()
def _predict(learner: Learner, x: Tensor) -> tuple[Tensor, Tensor]:
    return learner.predict_y(x)


__all__ = ["StreamProtocol", "StreamScores", "prequential"]
