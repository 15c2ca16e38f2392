"""A GP of an arm's joint angles as a finite basis, for the state of the rigid-body Kalman filter.

What the rigid-body class cannot say about an arm's torques is often a function of its
configuration: a spring or a cable pulling at a joint, a counterbalance, a gravity model
that is off. :class:`AngleGPBasis` models such a torque on one joint as an additive GP of
the joint angles,

    r(q) = sum_k g_k(q_k),    g_k ~ GP(0, SE(l)),

each ``g_k`` through structured kernel interpolation (SKI, Wilson & Nickisch 2015) on a
regular grid of ``points`` values of ``q_k``: ``g_k(q_k) = w_k(q_k)^T u_k`` with cubic
interpolation weights ``w_k`` (4 non-zeros) and grid values ``u_k ~ N(0, T_k)``, ``T_k`` the
SE kernel on the grid (Toeplitz). This is WISKI's additive structure (Stanton et al. 2021,
Sec. 3.3; :mod:`gpdyn.gp.wiski`, ``structure="additive"``) with the projections fixed to the
joint-angle axes: as a linear model ``r(q) = phi(q)^T u`` with ``phi = [w_1, ..., w_n]`` and
``u ~ N(0, K)``, ``K = blockdiag(T_1, ..., T_n)``. WISKI's caches give the posterior of ``u``
for fixed hyperparameters; :class:`gpdyn.gp.rigid_body.RigidBodyGP` keeps ``u`` (one per
joint) in its Kalman state instead, so that one update per control step gives the joint
posterior of the rigid-body parameters and the residual: the parameters carry what the
rigid-body class can say, the GP what it cannot, and neither is fitted to what the other
leaves (a residual learner beside the filter was weighed out by it: docs/control.md).

Why the angles alone: a torque of the configuration is what the regressor's columns miss
most plainly (no column is a function of ``q`` alone other than gravity's), and an SE
kernel over the accelerations returns to its prior where a controller queries it, far from
the accelerations its PD term produced (docs/control.md, the residual GP). Angles outside
the grid's interior are clamped onto it: the residual stays at its edge value there.
Inputs are the learner's normalised ones, so ``lengthscale`` is in units of each angle's
standard deviation over the reference rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpdyn.gp.base import LearnerError, Stateful
from gpdyn.gp.ski import Grid, axis_weights, toeplitz_factors


class AngleGPBasis(Stateful):
    """The basis ``phi(q) [N, n points]`` and prior covariance ``K`` of an additive SKI GP of ``n`` joint angles (see
    the module notes). ``reference_q [N, n]``: angles (normalised) whose range, widened by ``margin`` of its width on
    each side, the grid covers. Its state is the grid: the basis means nothing without it."""

    state_fields = ("grid_lower", "grid_spacing")

    def __init__(self, reference_q: Tensor, points: int = 6, lengthscale: float = 1.0, margin: float = 0.5) -> None:
        if reference_q.ndim != 2 or reference_q.shape[0] < 1:
            raise LearnerError(f"AngleGPBasis: reference_q must be [N >= 1, joints], got {tuple(reference_q.shape)}")
        if not torch.isfinite(reference_q).all():
            raise LearnerError("AngleGPBasis: reference_q has NaN or infinite angles")
        if points < 4:
            raise LearnerError(f"AngleGPBasis: cubic interpolation needs >= 4 points per angle, got {points}")
        if not lengthscale > 0:
            raise LearnerError(f"AngleGPBasis: lengthscale must be > 0, got {lengthscale!r}")
        self.joints, self.points = reference_q.shape[1], int(points)
        self.grid = Grid.from_bounds(reference_q.min(0).values, reference_q.max(0).values, self.points, margin)
        self.lengthscale = float(lengthscale)
        # where each angle's grid values start in u
        self._offsets = torch.arange(self.joints, device=reference_q.device)[:, None] * self.points

    @property
    def grid_lower(self) -> Tensor:
        return self.grid.lower

    @property
    def grid_spacing(self) -> Tensor:
        return self.grid.spacing

    @property
    def size(self) -> int:
        """Basis functions per output: ``n * points``."""
        return self.joints * self.points

    def rows(self, q: Tensor) -> Tensor:
        """``phi(q) [N, size]``: each angle's four cubic interpolation weights on its own grid."""
        index, weight, _ = axis_weights(q, self.grid)  # [N, n, 4]; outside the interior: clamped onto it
        out = torch.zeros(q.shape[0], self.size, device=q.device, dtype=q.dtype)
        return out.scatter_add_(1, (index + self._offsets).reshape(q.shape[0], -1), weight.reshape(q.shape[0], -1))

    def prior(self) -> Tensor:
        """``K [size, size]``: the unit-amplitude SE kernel of each angle on its grid, block diagonal."""
        lengthscale = torch.full((1, self.joints), self.lengthscale, device=self.grid.lower.device,
                                 dtype=self.grid.lower.dtype)
        factors = toeplitz_factors(self.grid, lengthscale)  # one [1, g, g] per angle
        return torch.block_diag(*(f[0] for f in factors))


__all__ = ["AngleGPBasis"]
