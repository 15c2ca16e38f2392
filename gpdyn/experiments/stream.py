"""The stream protocol in a run folder: one learner streamed prequentially, its records logged.

``gpdyn learn --protocol stream`` and ``gpdyn replay --protocol stream`` both run
:func:`stream_learner` per learner on a problem loaded with ``protocol="stream"`` (every
sample in store order, normalised by the statistics of the first ``init_rows``;
:mod:`gpdyn.data.problems`). The rule itself is :func:`gpdyn.gp.prequential.prequential`.

Each record goes to ``metrics.jsonl`` as ``{"kind": "stream", "learner": NAME, ...}``; the
last one of a learner has ``"final": true`` and is followed by its checkpoint
(``checkpoints/NAME.pt``). A resumed replay skips the learners whose stream finished and
streams the others again from their first row (a stream's score is one pass: a partial
pass continued from a checkpoint would need the running sums too, and a learner's pass
takes minutes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tqdm import tqdm

from gpdyn.data.problems import Problem
from gpdyn.experiments.prior_mean import PriorMean, split_tensors
from gpdyn.gp import Learner
from gpdyn.gp.online import save_learner
from gpdyn.gp.prequential import StreamProtocol, prequential
from gpdyn.runs import RunDir

KIND = "stream"


def finished_streams(run: RunDir) -> dict[str, dict[str, Any]]:
    """The final record of every learner whose stream finished in ``run``."""
    return {r["learner"]: r for r in (rec for _, rec in run.numbered_metrics())
            if r.get("kind") == KIND and r.get("final") is True and isinstance(r.get("learner"), str)}


def stream_learner(
    learner: Learner,
    problem: Problem,
    protocol: StreamProtocol,
    run: RunDir,
    checkpoint: Path,
    *,
    prior: PriorMean | None = None,
    progress: bool = True,
    bar: tqdm | None = None,
) -> dict[str, Any]:
    """Stream ``problem`` (loaded under the stream protocol) through ``learner``, modelling the
    residual of ``prior`` where given; log every record to ``run`` and save the learner at
    ``checkpoint`` at the end; return the final record."""
    x, y, prior_y = split_tensors(problem, "train", learner.device, learner.dtype, prior)
    name = learner.name

    def log(record: dict[str, Any]) -> None:
        record.update(kind=KIND, learner=name, final=record["rows"] == len(x))
        if not record["final"]:
            run.log(**record)  # the final record is logged once the checkpoint is saved

    records = prequential(learner, x, y, protocol, prior=prior_y, callback=log, progress=progress, bar=bar)
    final = records[-1]
    save_learner(learner, checkpoint, normalizer=problem.normalizer.to_json(), problem=problem.describe())
    run.log(**final)
    return final


__all__ = ["KIND", "finished_streams", "stream_learner"]
