"""SE-ARD hyperparameters batched over P outputs, in an unconstrained parametrisation.

Used by the exact-inference learners (WISKI, exact GP); :func:`initial_noise_variance`
is shared with the variational learners. Lengthscales ``[P, D]``,
amplitude (signal variance) ``[P]`` and noise variance ``[P]`` are ``exp`` of raw
tensors; the noise has a floor added so that ``K + sigma^2 I`` stays positive definite.
Initialisation follows docs/architecture.md "Online learning protocol": median trick for the
lengthscales, output variance for the noise, unit amplitude.
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
