"""Streams of minibatches on a chosen torch device and dtype.

- :class:`IIDStream`: seeded minibatches drawn without replacement within an epoch
  (a fresh permutation per epoch), forever. The same seed replays the same batches;
  ``state_dict`` lets an interrupted run continue with the batch it would have drawn.
- :class:`OrderedStream`: the data in time order, in chunks (1 for sample by sample),
  once.

The data move to the device once, at construction; batches are index views there.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gpdyn.errors import InputError


def _as_tensor(a: np.ndarray | Tensor, device: str | torch.device, dtype: torch.dtype, name: str) -> Tensor:
    t = torch.as_tensor(a, dtype=dtype, device=device)
    if t.ndim != 2:
        raise InputError(f"stream: {name} must be 2-D [N, width], got shape {tuple(t.shape)}")
    return t


class _Stream:
    def __init__(self, x: np.ndarray | Tensor, y: np.ndarray | Tensor, device: str | torch.device, dtype: torch.dtype):
        self.x = _as_tensor(x, device, dtype, "x")
        self.y = _as_tensor(y, device, dtype, "y")
        if self.x.shape[0] != self.y.shape[0]:
            raise InputError(f"stream: x has {self.x.shape[0]} rows but y has {self.y.shape[0]}")
        if self.x.shape[0] == 0:
            raise InputError("stream: no data")
        self.device = self.x.device
        self.dtype = dtype

    @property
    def n(self) -> int:
        return int(self.x.shape[0])


class IIDStream(_Stream):
    """Seeded iid minibatches of ``batch_size`` rows, without replacement within an epoch.

    An epoch is ``n // batch_size`` batches of one permutation; the ``n % batch_size``
    rows left at its end wait for a later epoch's permutation. A ``batch_size`` above
    ``n`` is reduced to ``n`` with a warning.
    """

    def __init__(
        self,
        x: np.ndarray | Tensor,
        y: np.ndarray | Tensor,
        batch_size: int,
        seed: int = 0,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__(x, y, device, dtype)
        if batch_size < 1:
            raise InputError(f"IIDStream: batch_size must be >= 1, got {batch_size}")
        if batch_size > self.n:
            warnings.warn(f"IIDStream: batch_size {batch_size} > {self.n} rows; using {self.n}", stacklevel=2)
        self.batch_size = min(int(batch_size), self.n)
        self.seed = int(seed)
        self._generator = torch.Generator().manual_seed(self.seed)
        self._perm = self._new_permutation()
        self._pos = 0
        self.batches_drawn = 0

    def _new_permutation(self) -> Tensor:
        # drawn on the CPU so that the same seed gives the same batches on any device
        return torch.randperm(self.n, generator=self._generator).to(self.device)

    def next_indices(self) -> Tensor:
        if self._pos + self.batch_size > self.n:
            self._perm = self._new_permutation()
            self._pos = 0
        idx = self._perm[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        self.batches_drawn += 1
        return idx

    def next_batch(self) -> tuple[Tensor, Tensor]:
        idx = self.next_indices()
        return self.x[idx], self.y[idx]

    def first_pass_rows(self) -> tuple[Tensor, Tensor] | None:
        """What a one-pass learner (each row observed once, :data:`gpdyn.gp.base.CAPABILITIES`) takes of
        the batch last drawn: in the first epoch the batch, and with that epoch's last batch also the
        ``n % batch_size`` rows the epoch leaves over; None from the second epoch on (every row is in)."""
        per_epoch = self.n // self.batch_size
        if self.batches_drawn == 0 or self.batches_drawn > per_epoch:
            return None
        end = self.n if self.batches_drawn == per_epoch else self._pos
        idx = self._perm[self._pos - self.batch_size : end]
        return self.x[idx], self.y[idx]

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "generator": self._generator.get_state(),
            "perm": self._perm.cpu(),
            "pos": self._pos,
            "batches_drawn": self.batches_drawn,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["perm"]) != self.n:
            raise InputError(f"IIDStream: saved state is for {len(state['perm'])} rows, this stream has {self.n}")
        perm = state["perm"]
        if perm.dtype != torch.int64 or not torch.equal(perm.sort().values, torch.arange(self.n)):
            raise InputError(f"IIDStream: saved 'perm' is not a permutation of the {self.n} rows")
        if not 0 <= int(state["pos"]) <= self.n:
            raise InputError(f"IIDStream: saved 'pos' {state['pos']} is outside 0..{self.n}")
        self.seed = int(state["seed"])
        self._generator.set_state(state["generator"])
        self._perm = state["perm"].to(self.device)
        self._pos = int(state["pos"])
        self.batches_drawn = int(state["batches_drawn"])


class OrderedStream(_Stream):
    """The rows in time order, ``chunk_size`` at a time, from ``start``."""

    def __init__(
        self,
        x: np.ndarray | Tensor,
        y: np.ndarray | Tensor,
        chunk_size: int = 1,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64,
        start: int = 0,
    ) -> None:
        super().__init__(x, y, device, dtype)
        if chunk_size < 1:
            raise InputError(f"OrderedStream: chunk_size must be >= 1, got {chunk_size}")
        if not 0 <= start <= self.n:
            raise InputError(f"OrderedStream: start {start} outside 0..{self.n}")
        self.chunk_size = int(chunk_size)
        self.position = int(start)

    def __len__(self) -> int:
        """Chunks left."""
        return -(-(self.n - self.position) // self.chunk_size)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        while self.position < self.n:
            a = self.position
            b = min(a + self.chunk_size, self.n)
            self.position = b
            yield self.x[a:b], self.y[a:b]


__all__ = ["IIDStream", "OrderedStream"]
