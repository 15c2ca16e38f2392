"""A learner on the residual of a fixed mean function: ``y = m(x) + f(x) + eps``.

:class:`WithPriorMean` wraps a learner ``f`` trained on ``y - m(x)`` (``gpdyn learn
--prior-mean``) and a fixed function ``m`` (both in the problem's normalised units) into one
learner whose ``predict`` is ``m(x)`` plus ``f``'s mean, with ``f``'s variance, and whose
``observe``/``step`` hand ``f`` the residual ``y - m(x)``. The controllers take a learn run made
with a prior mean through it like any other learner: the rigid-body GP's basis function, the
residual GP's prior, the feed-forward of computed torque. ``m`` comes from
:mod:`gpdyn.experiments.prior_mean` (an arm's rigid-body inverse dynamics, a frozen learner,
any callable).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from torch import Tensor

from gpdyn.gp.base import BatchMemo, Learner


class WithPriorMean(Learner):
    """``base`` on the residual of the fixed mean ``prior`` (normalised ``x [..., D] -> y [..., P]``)."""

    name = "prior-mean"

    def __init__(self, base: Learner, prior: Callable[[Tensor], Tensor], prior_name: str = "prior") -> None:
        super().__init__(base.input_dim, base.output_dim, device=base.device, dtype=base.dtype, seed=base.seed)
        self.base, self.prior, self.prior_name = base, prior, prior_name
        self.initialized = base.initialized
        self._last = BatchMemo()  # the last batch's prior: observe then step on it

    def can(self, capability: str) -> bool:  # type: ignore[override]
        """The base learner's ``step_on_observed`` (an online updater must then step on the batch just observed,
        WISKI eq. (18)) and ``one_pass`` (observing is all its learning) pass through; the wrapper has no other
        capability of its own."""
        return super().can(capability) or (capability in ("step_on_observed", "one_pass") and self.base.can(capability))

    def __deepcopy__(self, memo: dict[int, Any]) -> WithPriorMean:
        # the prior is a fixed function (it may hold MuJoCo's model and scratch data): shared, not copied
        return WithPriorMean(copy.deepcopy(self.base, memo), self.prior, self.prior_name)

    def _prior(self, x: Tensor) -> Tensor:
        # an online updater observes a batch and then steps on the same rows: the prior (MuJoCo's inverse dynamics
        # for an arm, on the CPU) is computed once for them
        prior = self._last.get(x)
        if prior is None:
            prior = self.prior(x).to(device=x.device, dtype=x.dtype)
            self._last.put(x, prior)
        return prior

    def observe(self, x: Tensor, y: Tensor) -> None:
        self.base.observe(x, y - self._prior(x))
        self.initialized = self.base.initialized

    def step(self, x: Tensor, y: Tensor) -> dict[str, Tensor | float]:
        return self.base.step(x, y - self._prior(x))

    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        mean, var = self.base.predict(x)
        return mean + self._prior(x), var

    def predict_mean(self, x: Tensor) -> Tensor:
        return self.base.predict_mean(x) + self._prior(x)

    def vlb(self, x: Tensor, y: Tensor) -> Tensor:
        return self.base.vlb(x, y - self._prior(x))

    def noise_variance(self) -> Tensor:
        return self.base.noise_variance()

    def diagnostics(self) -> dict[str, float]:
        return self.base.diagnostics()


__all__ = ["WithPriorMean"]
