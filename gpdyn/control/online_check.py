"""The online check of a learned planning model: use what was learned only while it predicts better than the nominal plant.

Each executed transition is predicted by the learned model *before* it is learned from
(prequential evaluation, Dawid 1984), and by the nominal plant. Over the last ``window``
transitions the learned model is trusted while its summed squared error is below ``margin``
times the nominal's: a correction that explains less than ``1 - margin`` of the nominal
plant's error is noise the planner pays for. Used by :class:`gpdyn.control.hybrid_model.HybridForward`
and :class:`gpdyn.control.identified_model.IdentifiedForward`.
"""

from __future__ import annotations

import collections
import copy

import numpy as np

#: checked transitions before the check may switch the learned model off
GATE_MIN = 20


class OnlineCheck:
    """The verdict :attr:`trusted` over a sliding window of one-step squared errors (module docs)."""

    def __init__(self, window: int, margin: float) -> None:
        self.window, self.margin = int(window), float(margin)
        self._errors: collections.deque[tuple[float, float]] = collections.deque(maxlen=max(1, self.window))
        self.trusted = True  # the verdict: the planner uses the learned model
        self.distrusted_steps = 0  # checked transitions after which the learned model was off

    def __len__(self) -> int:
        return len(self._errors)

    def add(self, learned: np.ndarray, nominal: np.ndarray, observed: np.ndarray) -> bool:
        """One transition's predictions by the learned model and the nominal plant against what was observed;
        returns the new verdict."""
        self._errors.append((float(((learned - observed) ** 2).sum()), float(((nominal - observed) ** 2).sum())))
        with_learned, without = (sum(e) for e in zip(*self._errors, strict=True))
        self.trusted = len(self._errors) < GATE_MIN or with_learned < self.margin * without
        self.distrusted_steps += not self.trusted
        return self.trusted

    def copy(self) -> OnlineCheck:
        """An independent copy (for a model's snapshot)."""
        return copy.deepcopy(self)


__all__ = ["GATE_MIN", "OnlineCheck"]
