"""SE-ARD hyperparameters batched over P outputs, in an unconstrained parametrisation.

Used by the exact-inference learners (WISKI, exact GP); :func:`initial_noise_variance`
is shared with the variational learners. Lengthscales ``[P, D]``,
amplitude (signal variance) ``[P]`` and noise variance ``[P]`` are ``exp`` of raw
tensors; the noise has a floor added so that ``K + sigma^2 I`` stays positive definite.
Initialisation follows docs/architecture.md "Online learning protocol": median trick for the
lengthscales (from the first batch, or widened as the first rows of a stream arrive:
:class:`InitWindow`), output variance for the noise, unit amplitude.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from gpdyn.gp.base import LearnerError, Stateful
from gpdyn.gp.kernels import median_lengthscale


def initial_noise_variance(y: Tensor) -> Tensor:
    """SVDGP Appendix B: the noise variance starts at the variance of the sampled outputs,
    ``[P]`` from ``y [N, P]``; 1 where that is undefined (one row, constant, not finite).

    The one home of this rule for every learner (the variational ones and WISKI / exact).
    """
    var = y.var(dim=0, unbiased=False) if y.shape[0] > 1 else torch.ones_like(y[0])
    return torch.where(torch.isfinite(var) & (var > 0), var, torch.ones_like(var))


class InitWindow(Stateful):
    """The inputs of the first ``size`` rows of a stream, the sample the starting length scales come from.

    SVDGP Appendix B starts the length scales by the median trick on "the sampled
    observations", an iid minibatch. On a time-ordered stream the first batch is a few
    consecutive rows instead (16 rows of a 100 Hz log span 0.16 s) and the median
    distance between them is orders of magnitude below the spread of the data: with
    length scales 100x too small the kernel between any two training inputs of a
    20-dimensional problem is ~0, and so are the gradients that would widen them.

    :meth:`start` takes the first batch (the whole of it gives the first estimate, exactly as
    Appendix B) and keeps its rows up to ``size``; :meth:`add` keeps the rows of later batches
    while there is room and, each time the rows kept have doubled since the last estimate and
    when the window fills, estimates again from all of them (O(size^2 D) in all; the median
    trick looks at 1024 rows at most). The learner widens its length scales to each new
    estimate where they are below it: the median trick gives the data's spread, the widest
    plausible start, so a length scale above it is the optimiser's and is kept. With a first
    batch of ``size`` rows or more nothing changes after :meth:`start`.

    The noise variance is not widened: its first-batch estimate (the outputs' variance) is
    too small on such a stream too, but that is no trap, since a noise below the residuals
    gets a strong gradient upwards, while widening it to the whole window's output variance
    slows the fit of the mean.
    """

    state_fields = ("x", "count", "estimated_at")

    def __init__(self, size: int, input_dim: int, *, device: torch.device, dtype: torch.dtype) -> None:
        if size < 1:
            raise LearnerError(f"InitWindow: size must be >= 1, got {size}")
        self.size = int(size)
        self.x = torch.zeros(self.size, input_dim, device=device, dtype=dtype)
        self.count = 0  # rows kept
        self.estimated_at = 0  # rows kept at the last estimate

    @property
    def full(self) -> bool:
        return self.count >= self.size

    def _keep(self, x: Tensor) -> None:
        n = min(x.shape[0], self.size - self.count)
        self.x[self.count : self.count + n] = x[:n]
        self.count += n

    @torch.no_grad()
    def start(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The starting length scales ``[D]`` from the first batch ``x [N, D]``."""
        if self.count:
            raise LearnerError("InitWindow.start: the window has already started")
        self._keep(x)
        self.estimated_at = self.count
        return median_lengthscale(x, generator=generator)

    @torch.no_grad()
    def add(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor | None:
        """Keep what fits of a later batch; the length scales ``[D]`` from every row kept when an
        estimate is due, else None."""
        if not self.count:
            raise LearnerError("InitWindow.add: call start() with the first batch first")
        if self.full or x.shape[0] == 0:
            return None
        self._keep(x)
        if not self.full and self.count < 2 * self.estimated_at:
            return None
        self.estimated_at = self.count
        return median_lengthscale(self.x[: self.count], generator=generator)


class SEHyperparameters(Stateful):
    """``lengthscale [P, D]``, ``amplitude [P]``, ``noise [P]`` as leaf tensors with gradients."""

    state_fields = ("raw_lengthscale", "raw_amplitude", "raw_noise", "noise_floor")

    def __init__(
        self, num_outputs: int, dim: int, *, device: torch.device, dtype: torch.dtype, noise_floor: float = 1e-6
    ) -> None:
        if noise_floor < 0:
            raise LearnerError(f"noise_floor must be >= 0, got {noise_floor}")
        self.noise_floor = float(noise_floor)
        kw = {"device": device, "dtype": dtype}
        self.raw_lengthscale = torch.zeros(num_outputs, dim, **kw, requires_grad=True)
        self.raw_amplitude = torch.zeros(num_outputs, **kw, requires_grad=True)
        self.raw_noise = torch.zeros(num_outputs, **kw, requires_grad=True)

    def parameters(self) -> list[Tensor]:
        return [self.raw_lengthscale, self.raw_amplitude, self.raw_noise]

    @property
    def lengthscale(self) -> Tensor:
        return self.raw_lengthscale.exp()

    @property
    def amplitude(self) -> Tensor:
        return self.raw_amplitude.exp()

    @property
    def noise(self) -> Tensor:
        return self.raw_noise.exp() + self.noise_floor

    @torch.no_grad()
    def init_from_data(self, z: Tensor, y: Tensor, generator: torch.Generator | None = None) -> None:
        """Median-trick lengthscales from inputs ``z [Q, N, D]`` (Q = 1 or P), noise = var(y), unit amplitude."""
        ls = torch.stack([median_lengthscale(zq, generator=generator) for zq in z])  # [Q, D]
        self.raw_lengthscale.copy_(ls.expand_as(self.raw_lengthscale).log())
        self.raw_amplitude.zero_()
        var = initial_noise_variance(y)
        self.raw_noise.copy_((var.clamp_min(2 * self.noise_floor + 1e-12) - self.noise_floor).log())

    @torch.no_grad()
    def set(self, *, lengthscale: Any = None, amplitude: Any = None, noise: Any = None) -> None:
        """Set values (broadcast to ``[P, D]`` / ``[P]``); ``noise`` must exceed the floor."""
        like = self.raw_noise
        if lengthscale is not None:
            self.raw_lengthscale.copy_(torch.as_tensor(lengthscale, dtype=like.dtype, device=like.device).log().expand_as(self.raw_lengthscale))
        if amplitude is not None:
            self.raw_amplitude.copy_(torch.as_tensor(amplitude, dtype=like.dtype, device=like.device).log().expand_as(like))
        if noise is not None:
            noise_t = torch.as_tensor(noise, dtype=like.dtype, device=like.device)
            if bool((noise_t <= self.noise_floor).any()):
                raise LearnerError(f"noise variance must exceed the floor {self.noise_floor}, got {noise}")
            self.raw_noise.copy_((noise_t - self.noise_floor).log().expand_as(like))

    def as_dict(self) -> dict[str, Tensor]:
        """Detached current values."""
        return {"lengthscale": self.lengthscale.detach(), "amplitude": self.amplitude.detach(), "noise": self.noise.detach()}
