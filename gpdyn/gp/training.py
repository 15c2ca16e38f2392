"""Training the controllers' models: pretraining on stored data, then online updates.

Any :class:`~gpdyn.gp.base.Learner` works through the contract only
(``observe``/``step``/``predict``) and the capabilities it declares:

- ``"pretrain"``: its batch phase (WISKI Sec. 5.1) is used instead of the minibatch loop;
- ``"point_limit"`` (the exact GP): what is observed stays within the limit;
- ``"basis"``: pretraining adds basis functions only up to ``fill`` of the capacity;
- ``"step_on_observed"`` (WISKI eq. (18)): online steps take the transition just observed;
- ``"one_pass"`` (ssgp, rls, svdgp-stream): observing is all the learning, so pretraining
  observes every row once (the first ``ONE_PASS_FIRST_ROWS`` together: the batch its
  hyperparameters are chosen on, as the stream protocol's init rows are) and the online
  updates take no steps (they would learn nothing and count as updates).

Pretraining (SVDGP Algorithm 1): every iteration draws a minibatch, adds it as basis
functions while the bases are below ``fill`` of their capacity, and takes one ``step``.
Leaving ``1 - fill`` of the basis free is what lets the online phase add basis functions
where the robot goes after a plant change (``observe`` only adds while there is room).

Online (:class:`OnlineUpdater`): each new transition is observed, then ``updates`` steps
are taken on the most recent ``batch`` transitions (WISKI: on the newest batch itself,
as its eq. (18) requires).

Fast adaptation (a frozen model plus a GP on its residuals) is :mod:`gpdyn.gp.residual`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from gpdyn.errors import InputError
from gpdyn.gp import Learner
from gpdyn.gp.base import NonFiniteError
from gpdyn.gp.prequential import StreamProtocol
from gpdyn.progress import progress_bar

#: the rows a one-pass learner's pretraining observes first, as one batch: the stream protocol's init rows
ONE_PASS_FIRST_ROWS = StreamProtocol.init_rows


def _basis_below(learner: Learner, fill: float) -> bool:
    if not learner.can("basis"):
        return not learner.initialized
    counts = learner.basis_counts
    return any(counts[k] < fill * cap for k, cap in learner.basis_capacity.items() if cap > 0)


def pretrain_learner(
    learner: Learner,
    x: Tensor,
    y: Tensor,
    *,
    iterations: int = 200,
    batch: int = 256,
    fill: float = 0.75,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, float]:
    """Fit ``learner`` on normalised ``x [N, D]``, ``y [N, P]`` (see the module docs): ``iterations``
    minibatches of ``batch`` rows; a one-pass learner observes every row once instead, in a random
    order, ``batch`` rows at a time after the first ``ONE_PASS_FIRST_ROWS``."""
    if x.shape[0] < 2:
        raise InputError(f"pretraining needs at least 2 samples, got {x.shape[0]}")
    if not 0 < fill <= 1:
        raise InputError(f"pretraining basis fill must be in (0, 1], got {fill}")
    gen = torch.Generator().manual_seed(seed)
    n = x.shape[0]
    if learner.can("pretrain"):
        # the SKI batch phase; WISKI pretrains on the first 5% of a stream, here on a subset
        idx = torch.randperm(n, generator=gen)[: min(n, iterations * batch // 4 or n)].to(x.device)
        out = learner.pretrain(x[idx], y[idx], iterations=iterations, progress=progress)
        return {k: float(v) for k, v in out.items()}
    if learner.can("one_pass"):
        order = torch.randperm(n, generator=gen).to(x.device)
        first = min(n, ONE_PASS_FIRST_ROWS)
        chunks = [order[:first], *order[first:].split(batch)] if n > first else [order]
        for idx in progress_bar(chunks, desc=f"pretrain {learner.name}", disable=not progress, leave=False):
            learner.observe(x[idx], y[idx])
        return {"loss": float(learner.step(x[idx], y[idx])["loss"])}  # minus the log evidence per row (nothing learnt)
    limit = learner.point_limit
    if limit is not None:
        idx = torch.randperm(n, generator=gen)[: int(min(n, fill * limit))].to(x.device)
        learner.observe(x[idx], y[idx])
    loss = float("nan")
    for _ in progress_bar(range(iterations), desc=f"pretrain {learner.name}", disable=not progress, leave=False):
        idx = torch.randint(n, (min(batch, n),), generator=gen).to(x.device)
        xb, yb = x[idx], y[idx]
        if limit is None and _basis_below(learner, fill):
            learner.observe(xb, yb)
        loss = float(learner.step(xb, yb).get("loss", float("nan")))
    return {"loss": loss}


class OnlineUpdater:
    """Observe each new transition and take ``updates`` steps on the recent ones.

    :meth:`summary` names the learner it updates (``online_learner``: the learner's
    ``online_name``, e.g. the GP inside a composite model) and counts the updates applied
    to it so far (``gp_updates``: observe calls that took, plus optimiser steps; over every
    episode the updater served, since the learner keeps learning across them).
    """

    def __init__(self, learner: Learner, *, batch: int = 64, updates: int = 1) -> None:
        if batch < 1 or updates < 0:
            raise InputError(f"online updates need batch >= 1 and updates >= 0, got {batch}, {updates}")
        self.learner, self.batch, self.updates = learner, int(batch), int(updates)
        # the most recent `batch` rows, oldest first, kept stacked: one concatenation per transition,
        # not a stack of `batch` rows at every step
        self.recent_x: Tensor | None = None
        self.recent_y: Tensor | None = None
        self.skipped = 0  # transitions not observed because the learner is full
        self.nonfinite = 0  # transitions not learnt from: NaN or inf in them or in what the learner derives from them
        self.applied = 0  # observes and steps that changed the learner

    def __call__(self, x: Tensor, y: Tensor) -> dict[str, float]:
        """One transition (or a few) ``x [n, D]``, ``y [n, P]``, normalised.

        A transition the learner cannot learn from is skipped and the model stays as it
        was: NaN or inf in it, or in what the learner derives from it before changing any
        state (a residual learner's target ``y - prior(x)`` under a diverged prior raises
        :class:`~gpdyn.gp.base.NonFiniteError`; a failed Cholesky factor raises on the CPU).
        The metrics then say ``skipped: 1`` (counted in ``nonfinite``): the control run goes on.
        """
        if not (bool(torch.isfinite(x).all()) and bool(torch.isfinite(y).all())):
            return self._skip(x)
        room = self.learner.room()
        if room is not None and x.shape[0] > room:
            self.skipped += x.shape[0]
        else:
            try:
                self.learner.observe(x, y)
            except (NonFiniteError, torch.linalg.LinAlgError):
                return self._skip(x)
            self.applied += 1
        self.recent_x = (x if self.recent_x is None else torch.cat([self.recent_x, x]))[-self.batch :]
        self.recent_y = (y if self.recent_y is None else torch.cat([self.recent_y, y]))[-self.batch :]
        metrics: dict[str, float] = {}
        for _ in range(0 if self.learner.can("one_pass") else self.updates):  # observing was all its learning
            if self.learner.can("step_on_observed"):
                out = self.learner.step(x, y)  # WISKI eq. (18): the batch just observed
            else:
                out = self.learner.step(self.recent_x, self.recent_y)
            metrics = {k: float(v) for k, v in out.items()}
            self.applied += 1
        return {**metrics, "skipped": 0.0}

    def summary(self) -> dict[str, Any]:
        """What an online controller's episode record says of its learning (see the class notes)."""
        name = getattr(self.learner, "online_name", self.learner.name)
        return {"online_learner": name, "gp_updates": self.applied}

    def _skip(self, x: Tensor) -> dict[str, float]:
        self.nonfinite += x.shape[0]
        return {"skipped": 1.0}


__all__ = ["OnlineUpdater", "pretrain_learner"]
