"""Kernels batched over P outputs.

Shapes: inputs ``[P, N, D]`` (or ``[N, D]``, broadcast to every output), lengthscales
``[P, D]``, amplitudes (signal variances) ``[P]``. Results ``[P, N, M]``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def scaled_sqdist(x1: Tensor, x2: Tensor, lengthscale: Tensor) -> Tensor:
    """Squared distances ``||(x1 - x2) / l||^2``, ``[P, N, M]``, clamped at zero.

    Uses the expanded form (one matmul) rather than materialising ``[P, N, M, D]``.
    """
    ls = lengthscale.unsqueeze(-2)  # [P, 1, D]
    a = x1 / ls
    b = x2 / ls
    a2 = (a * a).sum(-1, keepdim=True)  # [P, N, 1]
    b2 = (b * b).sum(-1).unsqueeze(-2)  # [P, 1, M]
    return (a2 + b2 - 2.0 * a @ b.transpose(-1, -2)).clamp_min_(0.0)


def se_ard(x1: Tensor, x2: Tensor, lengthscale: Tensor, amplitude: Tensor) -> Tensor:
    """SE-ARD kernel ``s^2 exp(-||(x1 - x2)/l||^2 / 2)`` (SVDGP eq. (14)), ``[P, N, M]``."""
    return amplitude[:, None, None] * torch.exp(-0.5 * scaled_sqdist(x1, x2, lengthscale))


def se_ard_diag(x: Tensor, amplitude: Tensor) -> Tensor:
    """Diagonal of the SE-ARD Gram matrix of ``x [.., N, D]``: ``[P, N]``."""
    n = x.shape[-2]
    return amplitude[:, None].expand(amplitude.shape[0], n)


def median_lengthscale(x: Tensor, max_points: int = 1024, generator: torch.Generator | None = None) -> Tensor:
    """Median-trick lengthscales ``[D]`` from data ``x [N, D]`` (SVDGP Appendix B).

    Per dimension, the median absolute pairwise difference over at most ``max_points``
    points; dimensions with zero spread get 1.
    """
    n = x.shape[0]
    if n > max_points:
        idx = torch.randperm(n, generator=generator)[:max_points].to(x.device)
        x = x[idx]
    diff = (x[:, None, :] - x[None, :, :]).abs()
    iu = torch.triu_indices(x.shape[0], x.shape[0], offset=1, device=x.device)
    med = diff[iu[0], iu[1]].median(dim=0).values if x.shape[0] > 1 else torch.ones_like(x[0])
    return torch.where(med > 0, med, torch.ones_like(med))
