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


def _basis_weights(c: Tensor) -> tuple[Tensor, Tensor]:
    """For factors ``c [P, M, K]`` against a point with factor 1: ``1/(1+c^2)`` and the
    log prefactor ``sum_d 0.5 log(2c/(1+c^2))`` of SVDGP eq. (15), ``[P, M]``."""
    c2 = c * c
    w = 1.0 / (1.0 + c2)
    logpre = 0.5 * torch.log(2.0 * c * w)
    return w, logpre


def gen_se_ard(
    x1: Tensor,
    x2: Tensor,
    lengthscale: Tensor,
    amplitude: Tensor,
    c1: Tensor | None = None,
    c2: Tensor | None = None,
) -> Tensor:
    """Generalized SE-ARD covariance of SVDGP eq. (15), scaled by ``amplitude`` (rho^2).

    ``rho^2 prod_d (2 l1 l2 / (l1^2 + l2^2))^(1/2) exp(-(x1_d - x2_d)^2 / (l1^2 + l2^2))``
    with per-point length scales ``l = s_d * c``: ``c1 [P, N, K]`` and ``c2 [P, M, K]``
    are the factors of each basis function (``K`` = 1 for one factor per basis function,
    or ``K`` = D for one per dimension); ``None`` means an ordinary input (c = 1), where
    eq. (15) reduces to the SE-ARD kernel of eq. (14). Result ``[P, N, M]``.

    A point against a basis (one side ``None``) costs one matmul like SE-ARD. Two bases
    with one factor each also reduce to a scaled distance; two bases with per-dimension
    factors need a loop over the D dimensions (memory ``[P, N, M]`` per dimension), so
    that form is meant for small bases.
    """
    if c1 is None and c2 is None:
        return se_ard(x1, x2, lengthscale, amplitude)
    if c1 is None or c2 is None:
        swap = c1 is not None
        xp, xb, c = (x2, x1, c1) if swap else (x1, x2, c2)
        k = _point_basis(xp, xb, c, lengthscale)
        k = k.transpose(-1, -2) if swap else k
        return amplitude[:, None, None] * k
    if c1.shape[-1] == 1 and c2.shape[-1] == 1:
        sq = scaled_sqdist(x1, x2, lengthscale)  # sum_d (dx_d / s_d)^2
        a = c1[..., 0].unsqueeze(-1)  # [P, N, 1]
        b = c2[..., 0].unsqueeze(-2)  # [P, 1, M]
        denom = a * a + b * b
        d = x1.shape[-1]
        logpre = 0.5 * d * torch.log(2.0 * a * b / denom)
        return amplitude[:, None, None] * torch.exp(logpre - sq / denom)
    d = x1.shape[-1]
    c1 = c1.expand(*c1.shape[:-1], d)
    c2 = c2.expand(*c2.shape[:-1], d)
    logk = torch.zeros((), dtype=x1.dtype, device=x1.device)
    for j in range(d):  # over dimensions only: [P, N, M, D] would not fit for large bases
        l1 = (lengthscale[:, j, None] * c1[..., j]).unsqueeze(-1)  # [P, N, 1]
        l2 = (lengthscale[:, j, None] * c2[..., j]).unsqueeze(-2)  # [P, 1, M]
        s = l1 * l1 + l2 * l2
        diff = x1[..., :, j].unsqueeze(-1) - x2[..., :, j].unsqueeze(-2)
        logk = logk + 0.5 * torch.log(2.0 * l1 * l2 / s) - diff * diff / s
    return amplitude[:, None, None] * torch.exp(logk)


def _point_basis(x: Tensor, z: Tensor, c: Tensor, lengthscale: Tensor) -> Tensor:
    """eq. (15) between inputs ``x`` (c = 1) and basis points ``z`` with factors ``c``, unscaled."""
    w, logpre = _basis_weights(c)  # [P, M, K]
    ls = lengthscale.unsqueeze(-2)  # [P, 1, D]
    u = x / ls
    v = z / ls
    if c.shape[-1] == 1:
        # (l_x^2 + l_m^2) = s_d^2 (1 + c_m^2): a scaled distance divided per basis function
        sq = scaled_sqdist(x, z, lengthscale) * (2.0 * w[..., 0]).unsqueeze(-2)
        pre = (x.shape[-1] * logpre[..., 0]).unsqueeze(-2)
    else:
        # sum_d w_md (u_nd - v_md)^2 expanded into three matmuls: O(N M D), no [N, M, D]
        w2 = 2.0 * w  # exp(-dx^2/(l1^2+l2^2)) = exp(-0.5 (dx/s)^2 * 2w), w = 1/(1+c^2)
        sq = (u * u) @ w2.transpose(-1, -2) - 2.0 * u @ (v * w2).transpose(-1, -2) + (v * v * w2).sum(-1).unsqueeze(-2)
        sq = sq.clamp_min(0.0)
        pre = logpre.sum(-1).unsqueeze(-2)
    return torch.exp(pre - 0.5 * sq)
