"""Small float64 problems for the learner tests."""

from __future__ import annotations

import torch

F64 = torch.float64


def sinc_data(n: int = 500, seed: int = 0, noise: float = 0.1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SVDGP Fig. 1: ``n`` noisy points of sin(x)/x on [-10, 10], plus a noise-free test grid."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g, dtype=F64) * 20 - 10
    y = torch.sinc(x / torch.pi) + noise * torch.randn(n, 1, generator=g, dtype=F64)
    xt = torch.linspace(-10, 10, 400, dtype=F64)[:, None]
    return x, y, xt, torch.sinc(xt / torch.pi)


def random_data(n: int, d: int, p: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Smooth random regression data ``x [n, d]``, ``y [n, p]``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=F64)
    w = torch.randn(d, p, generator=g, dtype=F64)
    y = torch.sin(x @ w) + 0.1 * torch.randn(n, p, generator=g, dtype=F64)
    return x, y
