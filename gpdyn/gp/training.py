"""Training the controllers' models: pretraining on stored data, then online updates.

Any :class:`~gpdyn.gp.base.Learner` works through the contract only
(``observe``/``step``/``predict``); two learner traits are read when present:

- a batch phase ``pretrain(x, y)`` (WISKI Sec. 5.1) is used instead of the minibatch loop;
- a point limit ``max_points`` (the exact GP) caps what is observed.

Pretraining (SVDGP Algorithm 1): every iteration draws a minibatch, adds it as basis
functions while the bases are below ``fill`` of their capacity, and takes one ``step``.
Leaving ``1 - fill`` of the basis free is what lets the online phase add basis functions
where the robot goes after a plant change (``observe`` only adds while there is room).

Online (:class:`OnlineUpdater`): each new transition is observed, then ``updates`` steps
are taken on the most recent ``batch`` transitions (WISKI: on the newest batch itself,
as its eq. (18) requires).

Fast adaptation (:class:`ResidualGP`): the pretrained learner stays frozen as a prior
mean and an exact GP conditions on the residual ``y - prior(x)`` of every new sample
(a rank-q Cholesky update, no optimiser step), over a sliding window of the most
recent samples, or a linear-kernel GP over the action (:class:`LinearKernelGP`). One
Adam step per control step barely moves a variational model (measured in
docs/control.md); exact conditioning changes the prediction at the very next step, and
the window lets it forget the plant before a change.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from gpdyn.errors import InputError
from gpdyn.gp import Learner, make_learner

# Learner sizes for the small default control runs (a few minutes on 2 cores); the
# paper-scale sizes are each learner's own defaults (``scale="paper"``).
SMALL_SIZES: dict[str, dict[str, Any]] = {
    "svdgp": {"m_alpha": 512, "m_beta": 64, "n_delta": 32, "n_columns": 256},
    "orth": {"m_gamma": 256, "m_beta": 64, "n_delta": 32, "n_columns": 64},
    "orthnat": {"m_gamma": 256, "m_beta": 64, "n_delta": 32, "n_columns": 64},
    "svi": {"m": 128, "n_delta": 32},
    "ivsgpr": {"m": 128, "n_delta": 32},
    "vsgpr": {"m": 128, "n_subset": 512, "n_delta": 32},
    "gpr": {"n_subset": 256, "n_delta": 32},
    "wiski": {},
    "exact": {"max_points": 1500},
}
SCALES = ("small", "paper")


def build_learner(
    name: str, input_dim: int, output_dim: int, *, scale: str = "small", device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float64, seed: int = 0, **overrides: Any,
) -> Learner:
    """A learner for control: the small sizes of :data:`SMALL_SIZES` or the paper's."""
    if scale not in SCALES:
        raise InputError(f"unknown learner scale '{scale}'; choose one of {', '.join(SCALES)}")
    kwargs = dict(SMALL_SIZES.get(name, {})) if scale == "small" else {}
    kwargs.update(overrides)
    return make_learner(name, input_dim, output_dim, device=device, dtype=dtype, seed=seed, **kwargs)


def _basis_below(learner: Learner, fill: float) -> bool:
    capacity: dict[str, int] = getattr(learner, "capacity", {})
    counts: dict[str, int] = getattr(learner, "counts", {})
    if not capacity:
        return not getattr(learner, "initialized", False)
    return any(counts[k] < fill * cap for k, cap in capacity.items() if cap > 0)


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
    """Fit ``learner`` on normalised ``x [N, D]``, ``y [N, P]`` (see the module docs)."""
    if x.shape[0] < 2:
        raise InputError(f"pretraining needs at least 2 samples, got {x.shape[0]}")
    if not 0 < fill <= 1:
        raise InputError(f"pretraining basis fill must be in (0, 1], got {fill}")
    gen = torch.Generator().manual_seed(seed)
    n = x.shape[0]
    if hasattr(learner, "pretrain"):
        # the SKI batch phase; WISKI pretrains on the first 5% of a stream, here on a subset
        idx = torch.randperm(n, generator=gen)[: min(n, iterations * batch // 4 or n)].to(x.device)
        out = learner.pretrain(x[idx], y[idx], iterations=iterations, progress=progress)
        return {k: float(v) for k, v in out.items()}
    limit = getattr(learner, "max_points", None)
    if limit is not None:
        idx = torch.randperm(n, generator=gen)[: int(min(n, fill * limit))].to(x.device)
        learner.observe(x[idx], y[idx])
    loss = float("nan")
    for _ in tqdm(range(iterations), desc=f"pretrain {learner.name}", disable=not progress, leave=False):
        idx = torch.randint(n, (min(batch, n),), generator=gen).to(x.device)
        xb, yb = x[idx], y[idx]
        if limit is None and _basis_below(learner, fill):
            learner.observe(xb, yb)
        loss = float(learner.step(xb, yb).get("loss", float("nan")))
    return {"loss": loss}


class OnlineUpdater:
    """Observe each new transition and take ``updates`` steps on the recent ones."""

    def __init__(self, learner: Learner, *, batch: int = 64, updates: int = 1) -> None:
        if batch < 1 or updates < 0:
            raise InputError(f"online updates need batch >= 1 and updates >= 0, got {batch}, {updates}")
        self.learner, self.batch, self.updates = learner, int(batch), int(updates)
        self.recent_x: deque[Tensor] = deque(maxlen=self.batch)
        self.recent_y: deque[Tensor] = deque(maxlen=self.batch)
        self.skipped = 0  # transitions not observed because the learner is full

    def __call__(self, x: Tensor, y: Tensor) -> dict[str, float]:
        """One transition (or a few) ``x [n, D]``, ``y [n, P]``, normalised."""
        limit = getattr(self.learner, "max_points", None)
        if limit is not None and getattr(self.learner, "n", 0) + x.shape[0] > limit:
            self.skipped += x.shape[0]
        else:
            self.learner.observe(x, y)
        self.recent_x.extend(x)
        self.recent_y.extend(y)
        metrics: dict[str, float] = {}
        for _ in range(self.updates):
            if hasattr(self.learner, "pretrain"):
                out = self.learner.step(x, y)  # WISKI eq. (18): the batch just observed
            else:
                out = self.learner.step(torch.stack(tuple(self.recent_x)), torch.stack(tuple(self.recent_y)))
            metrics = {k: float(v) for k, v in out.items()}
        return metrics


__all__ = ["SCALES", "SMALL_SIZES", "OnlineUpdater", "build_learner", "pretrain_learner"]
