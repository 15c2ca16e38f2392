"""The learner contract shared by every GP learner (DESIGN.md "Learners").

Every learner models P outputs at once: each output has its own GP, and the outputs
are a leading batch dimension on every tensor (lengthscales ``[P, D]``, bases
``[P, M, D]``). No Python loop runs over outputs or points.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from gpdyn.errors import InputError


LOG_2PI = math.log(2.0 * math.pi)  # the constant of every Gaussian log density here


def cholesky(a: Tensor) -> Tensor:
    """Lower Cholesky factor of the (batched) positive-definite ``a``, with no host sync on a GPU.

    ``torch.linalg.cholesky`` synchronises a CUDA device with the host on every call to
    check for failure. Here ``cholesky_ex`` reports failure per batch member instead: on
    the CPU (where the check is free) a failure raises ``torch.linalg.LinAlgError`` naming
    the batch member; on a GPU the failed members' factors are set to NaN, so the failure
    reaches the loss and the predictions, and the checks that guard those, never a number
    that looks right.
    """
    factor, info = torch.linalg.cholesky_ex(a)
    if a.device.type == "cpu":
        failed = (info != 0).nonzero()
        if len(failed):
            where = tuple(failed[0].tolist())
            raise torch.linalg.LinAlgError(
                f"cholesky: batch member {where} of shape {tuple(a.shape)} is not positive definite "
                f"(leading minor of order {int(info[where])})"
            )
        return factor
    return torch.where((info != 0)[..., None, None], torch.full_like(factor, math.nan), factor)


class LearnerError(InputError):
    """Bad input to a learner (wrong shape, NaN, wrong device); the message says where."""


class Learner(abc.ABC):
    """Online GP regression for ``output_dim`` independent outputs.

    Device and dtype are fixed at construction. Hyperparameters are initialised from
    the first data passed to :meth:`observe` (SVDGP Appendix B: median trick for
    lengthscales, output variance for the noise, unit amplitude).
    """

    #: registry name, e.g. "svdgp"
    name: str = ""

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64,
        seed: int = 0,
    ) -> None:
        if input_dim < 1 or output_dim < 1:
            raise LearnerError(f"{type(self).__name__}: input_dim and output_dim must be >= 1, got {input_dim}, {output_dim}")
        self.input_dim = int(input_dim)
        self.output_dim = int(output_dim)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None and torch.cuda.is_available():
            # "cuda" means the current device; pin it so input checks compare exact devices
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = dtype
        self.seed = int(seed)
        self.generator = torch.Generator(device="cpu").manual_seed(self.seed)
        # Constructor arguments (device and dtype aside): subclasses add their options so
        # that a checkpoint can rebuild the learner (gpdyn.gp.online.save_learner).
        self.config: dict[str, Any] = {"input_dim": self.input_dim, "output_dim": self.output_dim, "seed": self.seed}

    # -- the contract ------------------------------------------------------------
    @abc.abstractmethod
    def observe(self, x: Tensor, y: Tensor) -> None:
        """New data ``x [N, D]``, ``y [N, P]``: add basis functions / update caches."""

    @abc.abstractmethod
    def step(self, x: Tensor, y: Tensor) -> dict[str, Tensor | float]:
        """One optimiser update on a minibatch; returns scalar metrics, at least ``loss``.

        Values may be 0-d tensors on the learner's device: converting them to floats
        would sync with the device on every step, so callers do that when they log.
        """

    @abc.abstractmethod
    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Predictive mean and variance of the latent function, ``[..., P]`` each, for ``x [..., D]``."""

    @abc.abstractmethod
    def vlb(self, x: Tensor, y: Tensor) -> Tensor:
        """Variational lower bound (or log marginal likelihood) per output, ``[P]``, per data point."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume, caches included."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore exactly what :meth:`state_dict` returned."""

    def diagnostics(self) -> dict[str, float]:
        """Counters worth logging beside the metrics (e.g. WISKI's points clamped onto its
        grid); empty by default. Reading device counters syncs a GPU, so callers ask at
        evaluation or episode time, not every step."""
        return {}

    # -- helpers shared by the learners -------------------------------------------
    def check_xy(self, x: Tensor, y: Tensor | None = None, where: str = "") -> None:
        """Raise LearnerError for a wrong shape, device, dtype or a non-finite value."""
        label = f"{type(self).__name__}.{where}" if where else type(self).__name__
        if x.shape[-1] != self.input_dim:
            raise LearnerError(f"{label}: x has {x.shape[-1]} columns, expected {self.input_dim} (shape {tuple(x.shape)})")
        if x.device != self.device or x.dtype != self.dtype:
            raise LearnerError(f"{label}: x is {x.dtype} on {x.device}, the learner is {self.dtype} on {self.device}")
        if y is not None:
            if y.ndim != 2 or y.shape[1] != self.output_dim or y.shape[0] != x.shape[0]:
                raise LearnerError(
                    f"{label}: y has shape {tuple(y.shape)}, expected ({x.shape[0]}, {self.output_dim}) to match x"
                )
            if y.device != self.device or y.dtype != self.dtype:
                raise LearnerError(f"{label}: y is {y.dtype} on {y.device}, the learner is {self.dtype} on {self.device}")

    def check_finite(self, where: str, **tensors: Tensor) -> None:
        """Raise on NaN/inf. This syncs with the device: call it on inputs, not in predict."""
        for name, t in tensors.items():
            if not bool(torch.isfinite(t).all()):
                raise LearnerError(f"{type(self).__name__}.{where}: {name} contains NaN or inf")
