"""The learner a ``gpdyn learn`` run folder holds: where it is saved and how it is read back
(by the controllers, a prior mean, a replay), apart from the learn job that writes it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from gpdyn.data.problems import Normalizer
from gpdyn.errors import InputError
from gpdyn.gp import Learner
from gpdyn.gp.online import load_learner
from gpdyn.runs import RunDir, is_run_dir

#: the learner's checkpoint file in a learn run folder
CHECKPOINT = "checkpoint.pt"


def load_learned(run_dir: str | Path, device: str | torch.device | None = None) -> tuple[Learner, Normalizer]:
    """The learner of a ``gpdyn learn`` run folder, exactly as saved, and its normaliser
    (InputError naming the file and the statistic when it is damaged). A learner trained on the
    residual of a prior mean is refused: its mean alone does not predict the targets (the
    controllers take it with its prior, :func:`load_learned_model`)."""
    learner, normalizer, prior = load_with_prior_spec(run_dir, device)
    if prior is not None:
        raise InputError(f"{Path(run_dir) / CHECKPOINT}: the learner models the residual of the prior mean {prior!r}; "
                         "its mean alone does not predict the targets")
    return learner, normalizer


def load_with_prior_spec(run_dir: str | Path, device: str | torch.device | None) -> tuple[Learner, Normalizer, str | None]:
    """The learner, its normaliser and the ``--prior-mean`` spec of its residual (None: none)."""
    path = Path(run_dir) / CHECKPOINT
    if is_run_dir(run_dir):  # the checkpoint of a stopped run holds a learner part way through
        status = RunDir(run_dir).status()
        if status is not None and not status.finished:
            raise InputError(f"{run_dir}: an unfinished learn run ({status.describe()}); its learner is not final")
    learner, extra = load_learner(path, device=device, extra_keys={"normalizer": dict})
    spec = extra.get("prior_mean")
    if spec is not None and not isinstance(spec, str):
        raise InputError(f"{path}: extra prior_mean must be a --prior-mean spec, is {spec!r:.80}")
    widths = {"x_mean": learner.input_dim, "x_std": learner.input_dim, "y_mean": learner.output_dim,
              "y_std": learner.output_dim}
    stats = extra["normalizer"]
    for key, n in widths.items():
        value = np.asarray(stats.get(key), dtype=object)
        ok = value.shape == (n,) and all(isinstance(v, (int, float)) and math.isfinite(v) for v in value)
        if not ok or key.endswith("std") and not (value.astype(float) > 0).all():
            raise InputError(f"{path}: extra normalizer.{key} must be {n} finite numbers{' > 0' * key.endswith('std')}")
    return learner, Normalizer.from_json({key: stats[key] for key in widths}), spec or None


__all__ = ["CHECKPOINT", "load_learned", "load_with_prior_spec"]
