"""Structured kernel interpolation (SKI, Wilson & Nickisch 2015) on a regular grid.

The SKI kernel is ``k(x, x') ~= w(x)^T K_UU w(x')`` (WISKI Sec. 3.2): ``K_UU`` is the
SE-ARD kernel on a regular grid ``U`` of ``m = prod(sizes)`` points and ``w(x)`` holds
local cubic interpolation weights, ``4^d`` non-zeros per row.

Storage of ``W``: each row is kept as its ``4^d`` flat grid indices and weights
(``idx [..., 4^d]`` int64, ``w [..., 4^d]``), an ELL-style sparse layout that needs no
sparse tensor support on any device. :func:`dense_rows` expands it for reference code.

Grid and margin: along each dimension the grid has ``g >= 4`` points ``u_j = lower +
j * spacing``. Cubic interpolation at ``x`` uses ``u_{i-1}..u_{i+2}`` with ``u_i <= x <
u_{i+1}``, so it is defined on the *interior* ``[u_1, u_{g-2}]``. :meth:`Grid.from_bounds`
places the data bounds, widened by ``margin`` times their width on each side, onto
that interior.

Points outside the interior are clamped onto its edge and flagged in the ``outside``
mask returned by :func:`interp_weights`; the caller decides whether that is an error or
a warning (WISKI: ``out_of_grid`` option). The mask is a tensor, so no host sync happens
here.

Structure of ``K_UU``: the SE-ARD kernel factorises over dimensions and the grid is
regular, so ``K_UU = s^2 (T_1 kron ... kron T_d)`` with ``T_k`` symmetric Toeplitz (one
kernel column per dimension, ``O(sum g_k)`` evaluations). :func:`kron_matmul` multiplies
``K_UU`` into an ``[m, c]`` matrix in ``O(m c sum g_k)`` instead of ``O(m^2 c)``; that is
what pays in WISKI's step (``K_UU A`` with ``A = W^T W``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from gpdyn.errors import InputError


class GridError(InputError):
    """Impossible grid configuration or a point outside the grid in ``error`` mode."""


def cubic_weights(t: Tensor) -> Tensor:
    """Cubic Lagrange weights on the nodes ``-1, 0, 1, 2`` at offset ``t in [0, 1]``: ``[..., 4]``.

    Lagrange weights reproduce every polynomial of degree <= 3 exactly (the issue's
    test), and at ``t = 0`` / ``t = 1`` they are ``e_1`` / ``e_2``, so the interpolant is
    continuous across cells.
    """
    tp1, tm1, tm2 = t + 1.0, t - 1.0, t - 2.0
    return torch.stack(
        (
            -t * tm1 * tm2 / 6.0,
            tp1 * tm1 * tm2 / 2.0,
            -tp1 * t * tm2 / 2.0,
            tp1 * t * tm1 / 6.0,
        ),
        dim=-1,
    )


@dataclass
class Grid:
    """A regular grid: point ``j`` of dimension ``k`` is ``lower[k] + j * spacing[k]``.

    Flat indices are row-major (the last dimension varies fastest), which matches
    ``K_UU = T_1 kron ... kron T_d``.
    """

    lower: Tensor  # [d]
    spacing: Tensor  # [d]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        # on the grid's device once: a tensor built from a list in every call would be a
        # host-to-device copy (and a sync on CUDA) in predict's hot path
        self.counts = torch.tensor(self.sizes, dtype=self.lower.dtype, device=self.lower.device)

    @classmethod
    def from_bounds(
        cls, lo: Tensor, hi: Tensor, sizes: int | Sequence[int], margin: float = 0.1
    ) -> Grid:
        """Grid whose interpolation interior covers ``[lo - margin*w, hi + margin*w]``, ``w = hi - lo``.

        A dimension with zero width gets width 1, so a single point still has room.
        """
        d = lo.shape[-1]
        sizes = (int(sizes),) * d if isinstance(sizes, int) else tuple(int(s) for s in sizes)
        if len(sizes) != d:
            raise GridError(f"Grid: {len(sizes)} grid sizes for {d} dimensions")
        if min(sizes) < 4:
            raise GridError(f"Grid: cubic interpolation needs >= 4 points per dimension, got sizes {sizes}")
        if margin < 0 or not math.isfinite(margin):
            raise GridError(f"Grid: margin must be a finite number >= 0, got {margin}")
        width = hi - lo
        width = torch.where(width > 0, width, torch.ones_like(width))
        inner_lo = lo - margin * width
        inner_hi = hi + margin * width
        g = torch.tensor(sizes, dtype=lo.dtype, device=lo.device)
        spacing = (inner_hi - inner_lo) / (g - 3.0)
        return cls(lower=inner_lo - spacing, spacing=spacing, sizes=sizes)

    @property
    def dim(self) -> int:
        return len(self.sizes)

    @property
    def num_points(self) -> int:
        return math.prod(self.sizes)

    def interior(self) -> tuple[Tensor, Tensor]:
        """Bounds ``(lo, hi)`` ``[d]`` of the region where interpolation is defined."""
        return self.lower + self.spacing, self.lower + self.spacing * (self.counts - 2.0)

    def points(self) -> Tensor:
        """All grid points ``[m, d]`` in flat-index order."""
        axes = [self.lower[k] + self.spacing[k] * torch.arange(g, dtype=self.lower.dtype, device=self.lower.device)
                for k, g in enumerate(self.sizes)]
        mesh = torch.meshgrid(*axes, indexing="ij")
        return torch.stack([a.reshape(-1) for a in mesh], dim=-1)

    def state_dict(self) -> dict:
        return {"lower": self.lower, "spacing": self.spacing, "sizes": list(self.sizes)}

    @classmethod
    def from_state(cls, state: dict, device: torch.device, dtype: torch.dtype) -> Grid:
        return cls(
            lower=torch.as_tensor(state["lower"]).to(device=device, dtype=dtype),
            spacing=torch.as_tensor(state["spacing"]).to(device=device, dtype=dtype),
            sizes=tuple(int(s) for s in state["sizes"]),
        )


def axis_weights(x: Tensor, grid: Grid) -> tuple[Tensor, Tensor, Tensor]:
    """Each dimension's cubic interpolation on its own axis of the grid, for ``x [..., d]``: ``(ik, wk, outside)``,
    ``ik [..., d, 4]`` the indices along each axis, ``wk [..., d, 4]`` their weights, ``outside [...]`` as in
    :func:`interp_weights` (which takes their tensor product; an additive kernel uses them as they are)."""
    if x.shape[-1] != grid.dim:
        raise GridError(f"SKI interpolation: x has {x.shape[-1]} columns, the grid has {grid.dim} dimensions")
    g = grid.counts
    s = (x - grid.lower) / grid.spacing  # position in grid units
    outside = ((s < 1.0) | (s > g - 2.0)).any(dim=-1)
    s = torch.minimum(torch.maximum(s, torch.ones_like(s)), g - 2.0)
    # u_i <= x < u_{i+1}; at the upper edge use the last cell with t = 1
    i0 = torch.nan_to_num(torch.minimum(torch.floor(s.detach()), g - 3.0), nan=1.0)
    wk = cubic_weights(s - i0)  # [..., d, 4]
    ik = i0.long().unsqueeze(-1) + torch.arange(-1, 3, device=x.device)  # [..., d, 4]
    return ik, wk, outside


def interp_weights(x: Tensor, grid: Grid) -> tuple[Tensor, Tensor, Tensor]:
    """Sparse interpolation rows for ``x [..., d]``: ``(idx, w, outside)``.

    ``idx [..., 4^d]`` flat grid indices, ``w [..., 4^d]`` weights (differentiable in
    ``x``), ``outside [...]`` true where ``x`` left the interior and was clamped onto it.
    A NaN coordinate gives valid indices and NaN weights: NaN results downstream, never
    an index out of bounds (checking would sync a GPU).
    """
    ik, wk, outside = axis_weights(x, grid)
    idx = ik[..., 0, :]
    w = wk[..., 0, :]
    for k in range(1, grid.dim):
        idx = (idx.unsqueeze(-1) * grid.sizes[k] + ik[..., k, None, :]).flatten(-2)
        w = (w.unsqueeze(-1) * wk[..., k, None, :]).flatten(-2)
    return idx, w, outside


def dense_rows(idx: Tensor, w: Tensor, m: int) -> Tensor:
    """Dense ``W [..., N, m]`` from sparse rows (reference code and tests; O(N m) memory)."""
    out = torch.zeros(*idx.shape[:-1], m, dtype=w.dtype, device=w.device)
    return out.scatter_add(-1, idx, w)


def scatter_gram(idx: Tensor, w: Tensor, m: int) -> Tensor:
    """``W^T W`` ``[B, m, m]`` from sparse rows ``idx, w [B, N, K]``: ``O(N K^2)`` work.

    Differentiable in ``w``; used for the cache update of WISKI eq. (7).
    """
    b, _, k = idx.shape
    flat = (idx.unsqueeze(-1) * m + idx.unsqueeze(-2)).reshape(b, -1)
    vals = (w.unsqueeze(-1) * w.unsqueeze(-2)).reshape(b, -1)
    out = torch.zeros(b, m * m, dtype=w.dtype, device=w.device)
    return out.scatter_add(1, flat, vals).view(b, m, m)


def scatter_rhs(idx: Tensor, w: Tensor, y: Tensor, m: int) -> Tensor:
    """``W^T y`` ``[B, m]`` from sparse rows ``idx, w [B, N, K]`` and ``y [B, N]`` (WISKI eq. (16))."""
    out = torch.zeros(idx.shape[0], m, dtype=w.dtype, device=w.device)
    return out.scatter_add(1, idx.flatten(1), (w * y.unsqueeze(-1)).flatten(1))


def toeplitz_factors(grid: Grid, lengthscale: Tensor) -> list[Tensor]:
    """Per-dimension SE Toeplitz factors ``T_k [P, g_k, g_k]`` of ``K_UU`` (unit amplitude).

    Each factor comes from one kernel column ``exp(-(j h_k / l_k)^2 / 2)``.
    """
    factors = []
    for k, g in enumerate(grid.sizes):
        j = torch.arange(g, device=lengthscale.device)
        lag = (j[:, None] - j[None, :]).abs()  # Toeplitz index pattern
        col = torch.exp(-0.5 * (j.to(lengthscale.dtype) * grid.spacing[k] / lengthscale[:, k : k + 1]) ** 2)  # [P, g]
        factors.append(col[:, lag])
    return factors


def kron_dense(factors: list[Tensor], amplitude: Tensor) -> Tensor:
    """Dense ``K_UU = s^2 (T_1 kron ... kron T_d)``, ``[P, m, m]``."""
    out = factors[0]
    for f in factors[1:]:
        p, a, _ = out.shape
        g = f.shape[-1]
        out = (out[:, :, None, :, None] * f[:, None, :, None, :]).reshape(p, a * g, a * g)
    return amplitude[:, None, None] * out


def kron_matmul(factors: list[Tensor], amplitude: Tensor, x: Tensor) -> Tensor:
    """``K_UU @ x`` for ``x [P, m, c]`` via mode products: ``O(P m c sum g_k)``."""
    p = factors[0].shape[0]
    _, m, c = x.shape
    x = x.expand(p, m, c)
    sizes = [f.shape[-1] for f in factors]
    d = len(sizes)
    y = x.reshape(p, *sizes, c)
    for k, f in enumerate(factors):
        y = y.movedim(k + 1, -1)  # [P, ..., c, g_k]
        y = y @ f.reshape(f.shape[0], *([1] * (d - 1)), f.shape[-2], f.shape[-1])  # T_k symmetric
        y = y.movedim(-1, k + 1)
    return amplitude[:, None, None] * y.reshape(p, m, c)


class SKIKernel:
    """The dense SKI kernel ``W(x1) K_UU W(x2)^T`` (WISKI Sec. 3.2) as an exact-GP kernel.

    Used with :class:`gpdyn.gp.exact.ExactOnlineGP` as the test oracle for WISKI; it
    forms dense ``W`` rows, so it is for small ``N`` only.
    """

    def __init__(self, grid: Grid) -> None:
        self.grid = grid

    def _w(self, x: Tensor) -> Tensor:
        idx, w, _ = interp_weights(x, self.grid)
        return dense_rows(idx, w, self.grid.num_points)

    def __call__(self, x1: Tensor, x2: Tensor, lengthscale: Tensor, amplitude: Tensor) -> Tensor:
        kuu = kron_dense(toeplitz_factors(self.grid, lengthscale), amplitude)
        return self._w(x1) @ kuu @ self._w(x2).transpose(-1, -2)

    def diag(self, x: Tensor, lengthscale: Tensor, amplitude: Tensor) -> Tensor:
        w = self._w(x)  # [N, m]
        kuu = kron_dense(toeplitz_factors(self.grid, lengthscale), amplitude)
        return ((w @ kuu) * w).sum(-1)


class AdditiveSKIKernel:
    """The dense additive SKI kernel of WISKI's ``structure="additive"``, as an exact-GP kernel:

    ``k(x, x') = sum_c W(z_c(x)) K_c W(z_c(x'))^T + [x, 1] diag(v) [x', 1]^T``, a sum of the
    SKI kernels of WISKI Sec. 3.2 on the features ``z_c`` of each component (randomly
    projected additive GPs, Delbridge et al. 2020), plus a Bayesian linear term.

    ``features(x)`` gives ``z [Q, N, C, d]`` (Q = 1 or P); ``hyper()`` gives ``(lengthscale
    [P, C, d], amplitude [P, C], linear [P, L])`` (L = 0: no linear term) and is called on
    every evaluation, so the kernel follows (and differentiates into) the hyperparameters
    of the learner it mirrors. The ``lengthscale`` / ``amplitude`` arguments that
    :class:`gpdyn.gp.exact.ExactOnlineGP` passes are ignored. Built independently of
    WISKI's concatenated rows: one :class:`SKIKernel` per component, summed; dense, for
    small ``N`` only (the test oracle).
    """

    def __init__(self, grid: Grid, features, hyper) -> None:
        self.grid = grid
        self.ski = SKIKernel(grid)
        self.features = features
        self.hyper = hyper

    def _parts(self, x1: Tensor, x2: Tensor) -> Tensor:
        lengthscale, amplitude, linear = self.hyper()
        z1, z2 = self.features(x1), self.features(x2)
        out = 0.0
        for c in range(amplitude.shape[1]):
            kuu = kron_dense(toeplitz_factors(self.grid, lengthscale[:, c]), amplitude[:, c])
            out = out + self.ski._w(z1[:, :, c]) @ kuu @ self.ski._w(z2[:, :, c]).transpose(-1, -2)
        if linear.shape[-1]:
            a1 = torch.cat([x1, x1.new_ones(x1.shape[0], 1)], dim=-1)
            a2 = torch.cat([x2, x2.new_ones(x2.shape[0], 1)], dim=-1)
            out = out + (a1 * linear[:, None, :]) @ a2.T
        return out

    def __call__(self, x1: Tensor, x2: Tensor, lengthscale: Tensor | None = None, amplitude: Tensor | None = None) -> Tensor:
        return self._parts(x1, x2)

    def diag(self, x: Tensor, lengthscale: Tensor | None = None, amplitude: Tensor | None = None) -> Tensor:
        return self._parts(x, x).diagonal(dim1=-2, dim2=-1)
