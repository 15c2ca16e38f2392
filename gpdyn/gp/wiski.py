"""WISKI: Woodbury inversion with structured kernel interpolation (Stanton et al. 2021).

Exact inference under a SKI kernel, conditioned online from caches whose size does not
depend on the number of points ``n`` (WISKI eqs. (7), (16), (17)). Two kernel
structures share all of the algebra below:

- ``structure="single"`` (the paper's, WISKI Sec. 3.2 and 5.1): ``k(x, x') = w(x)^T
  K_UU w(x')`` on one regular grid over ``d <= 2`` features (the inputs themselves, or a
  learned projection ``tanh(BN(x A))`` per output or shared). ``W`` has ``4^d`` non-zeros
  per row and ``K_UU`` is a Kronecker product of Toeplitz factors.
- ``structure="additive"`` (default for ``input_dim > 2``): a sum of ``C`` SKI kernels,
  each on its own low-dimensional projection ``z_c = tanh(BN(x a_c))`` (randomly
  projected additive GPs, Delbridge, Bindel & Wilson 2020; WISKI Sec. 3.3 names random
  projections as the alternative to a learned one), plus a Bayesian linear term
  ``[x, 1]^T beta`` with ``beta ~ N(0, diag(v))``:
  ``k(x, x') = sum_c w_c(x)^T K_c w_c(x') + [x, 1]^T diag(v) [x', 1]``. This is the SKI
  kernel ``phi(x)^T K phi(x')`` of the concatenated interpolation row
  ``phi(x) = [w_1(x), ..., w_C(x), x, 1]`` (``C 4^d + D + 1`` non-zeros) and the
  block-diagonal prior ``K = blockdiag(K_1, ..., K_C, diag(v))``, each ``K_c`` Kronecker
  / Toeplitz. Every equation below holds with ``W = Phi`` and ``K_UU = K``, so the caches
  ``A = Phi^T Phi`` ``[Q, M, M]`` (``M = C g^d + D + 1``), ``Phi^T y``, ``y^T y`` and ``n``
  stay constant-size. Inverse dynamics ``tau = M(q) qdd + h(q, qd)`` is far from
  additive in the inputs; the linear term carries its large linear part and the
  components fit the rest along many directions (products such as ``q_i qdd_j`` are
  sums of squares of projections: ``4ab = (a + b)^2 - (a - b)^2``).

The equations, with ``B = sigma^2 I + K A``:

- WISKI eqs. (5)-(6): ``M = (sigma^2 K^{-1} + A)^{-1}``. We never form ``K^{-1}`` (the
  SE Gram matrix on a grid is numerically singular, WISKI Sec. 4); instead
  ``M = B^{-1} K``, which is eq. (11) with the full root ``A = L L^T`` (``r = m``) pushed
  through the Woodbury identity. By Sylvester's determinant identity
  ``log|B| = m log sigma^2 + log|Q|`` with ``Q`` of eq. (12).
- Log marginal likelihood, eq. (8) / (13):
  ``-(y^T y - v^T M v) / (2 sigma^2) - (log|B| - m log sigma^2) / 2 - n log(sigma^2) / 2 - n log(2 pi) / 2``.
- Predictive mean eq. (9) / (14): ``w(x)^T M v``; latent variance eq. (10) / (15):
  ``sigma^2 w(x)^T M w(x)``. :meth:`WISKI.predict_mean` reads only the mean cache
  ``a = M v`` (eq. (14)'s cache) with one gather.

The symmetric form (``solver="cholesky"``, the default on the CPU). ``B`` is not symmetric,
and an LU of it costs twice a Cholesky factor. With the symmetric root ``S = K^{1/2}``
(block diagonal like ``K``; each block the Kronecker product of the roots of its small
Toeplitz factors, from their eigendecompositions) and ``C = sigma^2 I + S A S = L L^T``
(SPD, eigenvalues ``>= sigma^2``): ``B^{-1} S = S C^{-1}`` (push-through), so
``M = B^{-1} K = S C^{-1} S``, ``a = S L^{-T} L^{-1} S v``, the latent variance is
``sigma^2 |L^{-1} S w(x)|^2`` (one triangular solve) and ``log|B| = log|C|`` (Sylvester).
The gradients of eq. (13) are written out from these (:class:`_SqrtLogdetFit`), so the
root itself is never differentiated. Equal to the LU's results up to rounding
(``tests/test_wiski_cholesky.py``).

Why the full ``A`` rather than the paper's rank-``r`` root ``L`` with the ``J``
pseudo-inverse update (WISKI Sec. 4.2, App. A.3): that update only rotates within the
range of ``L``, so while ``W^T W`` is singular (any grid cell not yet visited) a new
point's component outside the range is lost. Adding ``w w^T`` into ``A`` is exact and
costs ``O(K^2)`` per point (``K`` non-zeros per row).

Costs (``P`` outputs, ``M`` basis functions, ``K`` non-zeros per row, ``D`` inputs), none
depending on ``n``:

- ``observe`` of ``q`` points: ``O(Q q (D F + K^2))`` by scatter, or ``O(Q q M^2)`` as one
  dense ``Phi^T Phi`` product for large batches (``F`` projected features).
- ``step``: ``K A`` by block / Kronecker mode products, ``O(P M^2 g)``, plus one LU of
  ``B`` and its backward, ``O(P M^3)``; the LU dominates.
- ``predict`` of ``N`` points: ``O(P N K^2)`` (single) or ``O(P N M^2)`` (additive, a
  dense product) after a cache refresh (one LU and solve, ``O(P M^3)``) once per
  hyperparameter change; ``predict_mean``: ``O(P N K)``.

Memory: ``O(Q M^2 + P M^2)``. In the single structure ``M = prod(grid sizes)`` grows as
``g^d``, so inputs with more than two dimensions go through a learned projection to
``proj_dim`` (default 2): linear map, batch normalisation (statistics fixed after the
first data), ``tanh`` into ``[-1, 1]`` (WISKI Sec. 5.1). Projection parameters are
trained with the new-point gradient of WISKI eq. (18): only the rows of the newest batch
depend on them, the rows already in the caches stay as they were.

Online protocol (WISKI Algorithm 1), in the interface of docs/architecture.md: ``observe(x, y)`` adds
the rows to the caches, then ``step(x, y)`` takes one Adam step on ``theta`` (eq. (13))
and ``phi`` (eq. (18), ``x, y`` being the batch just observed). :meth:`WISKI.pretrain`
is the batch phase on the first 5% of the stream; :meth:`WISKI.learn_stream` runs the
whole protocol point by point. Design and measurements: docs/wiski.md.

Precision. The caches are sums over every row seen and the marginal likelihood is a
difference of such sums (``y^T y`` less the fitted part), so a float32 learner keeps them,
and solves with them, in float64 (:data:`SOLVE_DTYPE`): in float32 the cancellation over
~10^5 rows drove the noise to its floor and the fit apart (a KUKA race diverged in float32
and not in float64). The hyperparameters, the features and the prediction caches stay in
the learner's dtype; the ``[P, M, M]`` solves are small beside the predictions.

Calibrated variance (``calibrate_rows``, off by default). Over a stream that drifts from
its first rows the caches' noise estimate (eq. (13) over all the data) is too small for the
rows ahead, and 95% intervals cover too little. With ``calibrate_rows = R`` every
``observe`` first predicts its batch (before the batch enters the caches: the one-step-ahead
predictions of the prequential approach, Dawid 1984), and updates a scale ``c_p`` per output,
the maximum-likelihood scale of those predictive distributions ``N(mu, c_p v)``,
``mean(r^2 / v)``, exponentially weighted over about the last ``R`` rows. The predictive
variance of ``f`` and the noise variance that :meth:`~WISKI.predict` and
:meth:`~WISKI.noise_variance` report are scaled by ``c_p``; the mean, the caches and the
marginal likelihood of the hyperparameters are unchanged. Cost: one prediction per
``observe``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from gpdyn.compiled import SignatureCompiled, compile_errors
from gpdyn.gp.base import LOG_2PI, BatchMemo, Learner, LearnerError, MeanProgram, cholesky
from gpdyn.gp.hyperparams import SEHyperparameters, initial_noise_variance

#: the dtype of the caches of eqs. (7), (16), (17) and of every solve with them (module notes)
SOLVE_DTYPE = torch.float64
from gpdyn.gp.kernels import matmul_few_columns, median_lengthscale
from gpdyn.gp.ski import (
    Grid,
    GridError,
    dense_rows,
    interp_weights,
    kron_dense,
    kron_matmul,
    scatter_gram,
    scatter_rhs,
    toeplitz_factors,
)
from gpdyn.progress import progress_bar

PROJECTIONS = ("auto", "none", "shared", "per-output")
STRUCTURES = ("auto", "single", "additive")
PROJ_INITS = ("axes", "random")
SOLVERS = ("auto", "cholesky", "lu")
#: observe batches of at least this many rows build ``Phi^T Phi`` as one dense product
DENSE_GRAM_ROWS = 32
#: elements of the dense ``[P, N, M]`` block of the additive variance per chunk
VARIANCE_BLOCK = 1 << 22
#: elements of one dense ``[Q, rows, M]`` block of ``W`` in :meth:`WISKI._caches_of`
DENSE_BLOCK = 1 << 24
#: the cubic Lagrange weights of :func:`gpdyn.gp.ski.cubic_weights` as polynomials in t:
#: ``[w_0..w_3] = [t, t^2, t^3] @ CUBIC[1:] + CUBIC[0]``
CUBIC = ((0.0, 1.0, 0.0, 0.0), (-1 / 3, -0.5, 1.0, -1 / 6), (0.5, -1.0, 0.5, 0.0), (-1 / 6, 0.5, -0.5, 1 / 6))


def additive_mean_dense(x: Tensor, proj_t: Tensor, shift: Tensor, offset: Tensor, inv_spacing: Tensor, nodes: Tensor,
                        coef_t: Tensor, linear_t: Tensor) -> Tensor:
    """Eq. (14)'s mean ``phi(x)^T a`` ``[N, P]`` of the additive structure with shared 1-D projections, dense.

    Cubic Lagrange interpolation on a regular 1-D grid is a convolution with the kernel
    ``u(d) = 1 - d/2 - d^2 + d^3/2`` for ``|d| < 1``, ``-(|d| - 1)(|d| - 2)(|d| - 3)/6`` for
    ``1 <= |d| < 2`` and 0 beyond (``d``: distance to a node in grid units; the weights of
    :func:`gpdyn.gp.ski.cubic_weights` at the four nodes around a point), so each
    component's row is ``u(s - j)`` over its ``g`` nodes ``j``: no cell index, no gather.
    Everything is laid out points-last (``[C, g, N]`` rows, ``a^T Phi^T``): the elementwise
    loop runs along the points, and a product with only P (~10) output columns runs 3-4x
    slower on MKL than its transpose. Written for :func:`torch.compile`, which fuses the
    elementwise part into one loop (:meth:`WISKI.predict_mean` with ``compiled_mean=True``);
    eagerly it is slower than the gather of :meth:`WISKI._fused_mean`.

    ``proj_t [C, D]``, ``shift [C]``: the projection with its batch normalisation folded in;
    ``offset``, ``inv_spacing``: the grid map into grid units; ``nodes [g]``: 0..g-1;
    ``coef_t [P, C g]``: the mean cache's grid part; ``linear_t [P, D + 1]``: its linear part.
    """
    # tanh(z) = 1 - 2 / (exp(2 z) + 1), exact at both limits (exp overflows to inf: 1; underflows to 0: -1):
    # compiled, this is faster than the tanh kernel it would otherwise take (docs/results/implementation-timings.md)
    z = torch.addmm(shift.unsqueeze(-1), proj_t, x.T)
    s = offset + (1.0 - 2.0 / (torch.exp(2.0 * z) + 1.0)) * inv_spacing  # [C, N], grid units
    d = (s.unsqueeze(1) - nodes.unsqueeze(-1)).abs()  # [C, g, N]
    near = ((0.5 * d - 1.0) * d - 0.5) * d + 1.0
    far = ((1.0 - d / 6.0) * d - 11.0 / 6.0) * d + 1.0
    rows = torch.where(d < 1.0, near, torch.where(d < 2.0, far, torch.zeros_like(d))).flatten(0, 1)  # [C g, N]
    return torch.addmm(torch.addmm(linear_t[:, -1:], linear_t[:, :-1], x.T), coef_t, rows).T


_compiled_mean: SignatureCompiled | None = None


def _compiled_additive_mean() -> SignatureCompiled:
    """:func:`additive_mean_dense` compiled, built once per process: per batch shape without
    per-call guards for the first few shapes (a planner's one batch size), then one
    dynamic-shape :func:`torch.compile` for every other (:class:`~gpdyn.compiled.SignatureCompiled`)."""
    global _compiled_mean
    if _compiled_mean is None:
        _compiled_mean = SignatureCompiled(additive_mean_dense, fallback=torch.compile(additive_mean_dense, dynamic=True))
    return _compiled_mean


def _bn_stats(a: Tensor) -> tuple[Tensor, Tensor]:
    """Batch-norm statistics ``(mean, std)`` ``[Q, d]`` of projected inputs ``a [Q, N, d]``."""
    return a.mean(dim=1), (a.var(dim=1, unbiased=False) + 1e-5).sqrt()


def _lu_factor(b: Tensor) -> tuple[Tensor, Tensor]:
    """LU factors of the batched ``B`` with no host sync on a GPU (as :func:`gpdyn.gp.base.cholesky`).

    ``torch.linalg.lu_factor`` checks for a singular factor on the host, a sync on every
    step and every cache refresh. ``lu_factor_ex`` reports it per batch member instead: the
    CPU (where the check is free) raises naming the member; on a GPU the failed members'
    factors are NaN, so the loss and the predictions say so."""
    lu, piv, info = torch.linalg.lu_factor_ex(b)
    if b.device.type == "cpu":
        failed = (info != 0).nonzero()
        if len(failed):
            raise torch.linalg.LinAlgError(f"WISKI: B of batch member {tuple(failed[0].tolist())} is singular")
        return lu, piv
    return torch.where((info != 0)[..., None, None], torch.full_like(lu, math.nan), lu), piv


class _LogdetSolve(torch.autograd.Function):
    """``(log|B|, B^{-1} R)`` from one LU, with a hand-written backward.

    torch's generic ``lu_factor`` backward costs several ``m^3`` passes; here the
    gradient is ``d log|B| = B^{-T}`` and ``dX = -B^{-T} g X^T``: one solve against
    ``[I, g]``. ``B = sigma^2 I + K A`` has real eigenvalues ``>= sigma^2``, so
    ``det B > 0`` and ``log|B|`` is the sum of ``log|U_ii|``.
    """

    @staticmethod
    def forward(ctx: Any, b: Tensor, rhs: Tensor) -> tuple[Tensor, Tensor]:
        lu, piv = _lu_factor(b)
        x = torch.linalg.lu_solve(lu, piv, rhs)
        ctx.save_for_backward(lu, piv, x)
        return lu.diagonal(dim1=-2, dim2=-1).abs().log().sum(-1), x

    @staticmethod
    def backward(ctx: Any, g_logdet: Tensor, g_x: Tensor) -> tuple[Tensor, Tensor]:
        lu, piv, x = ctx.saved_tensors
        m = lu.shape[-1]
        eye = torch.eye(m, dtype=lu.dtype, device=lu.device).expand(lu.shape[0], m, m)
        sol = torch.linalg.lu_solve(lu, piv, torch.cat([eye, g_x], dim=-1), adjoint=True)
        binv_t, y = sol[..., :m], sol[..., m:]
        return g_logdet[:, None, None] * binv_t - y @ x.transpose(-1, -2), y


def woodbury_mll(
    kmul: Callable[[Tensor], Tensor], noise: Tensor, gram: Tensor, wty: Tensor, yty: Tensor, n: int
) -> Tensor:
    """Log marginal likelihood of a SKI GP from the caches (WISKI eqs. (8), (13)), ``[P]``.

    ``kmul(X)``: ``K X`` for ``X [Q, m, c]`` (Q = 1 or P), giving ``[P, m, c]``; ``noise
    [P]``; ``gram`` = ``W^T W`` ``[Q, m, m]``; ``wty`` = ``W^T y`` ``[P, m]``; ``yty [P]``.
    Differentiable in the hyperparameters and in the caches (for eq. (18)).
    """
    p, m = wty.shape
    eye = torch.eye(m, dtype=wty.dtype, device=wty.device)
    b = noise[:, None, None] * eye + kmul(gram)
    logdet_b, mv = _LogdetSolve.apply(b, kmul(wty.unsqueeze(-1)))
    quad = yty - (wty * mv.squeeze(-1)).sum(-1)
    log_noise = noise.log()
    return -0.5 * quad / noise - 0.5 * (logdet_b - m * log_noise) - 0.5 * n * log_noise - 0.5 * n * LOG_2PI


def psd_sqrt(f: Tensor) -> Tensor:
    """The symmetric square root ``S`` (``S S = F``) of batched symmetric PSD matrices ``f [..., g, g]``.

    From the eigendecomposition, negative eigenvalues (rounding: the SE Gram matrix of a
    grid is numerically singular) taken as 0. For the small Toeplitz factors of ``K``."""
    vals, vecs = torch.linalg.eigh(f)
    return (vecs * vals.clamp_min(0.0).sqrt().unsqueeze(-2)) @ vecs.transpose(-1, -2)


class SqrtPrior:
    """The prior ``K = blockdiag(K_1, ..., K_C, diag(v))`` ``[P, M, M]`` and its symmetric root ``S = K^{1/2}``.

    ``blocks [P, C, m, m]``: the dense diagonal blocks ``K_c`` (``m = g^d``; one block of
    ``m = M`` for the single grid), differentiable in the hyperparameters; ``linear [P, L]``:
    ``v`` (``L`` may be 0), differentiable. ``mul(X)``: ``S X`` for ``X [Q, M, c]`` (Q = 1 or
    P), ``[P, M, c]``, without gradient: ``S = blockdiag(S_1, ..., S_C, diag(v^{1/2}))``, each
    ``S_c`` the Kronecker product of the Toeplitz factors' roots (:func:`psd_sqrt`) times the
    amplitude's root, so ``S S = K`` up to rounding.
    """

    def __init__(self, blocks: Tensor, linear: Tensor, mul: Callable[[Tensor], Tensor]) -> None:
        self.blocks, self.linear, self.mul = blocks, linear, mul


def sqrt_system(prior: SqrtPrior, noise: Tensor, gram: Tensor) -> tuple[Tensor, Tensor]:
    """``(S A [P, M, M], L)``: the lower Cholesky factor ``L`` of ``C = sigma^2 I + S A S`` (module notes).

    ``A S = (S A)^T`` (both symmetric), so ``C`` takes two products with ``S``, ``O(P M^2 m)``."""
    sa = prior.mul(gram)
    c = prior.mul(sa.transpose(-1, -2))
    c.diagonal(dim1=-2, dim2=-1).add_(noise.detach().unsqueeze(-1))
    return sa, cholesky(c)


def sqrt_mean(prior: SqrtPrior, low: Tensor, wty: Tensor) -> tuple[Tensor, Tensor]:
    """``(a, u)``: the mean cache ``a = B^{-1} K v = S C^{-1} S v`` ``[P, M, 1]`` (eq. (14)) and
    ``u = L^{-1} S v`` (``v^T a = |u|^2``), for ``wty`` = ``v`` ``[P, M]``."""
    u = torch.linalg.solve_triangular(low, prior.mul(wty.unsqueeze(-1)), upper=False)
    return prior.mul(torch.linalg.solve_triangular(low.transpose(-1, -2), u, upper=True)), u


class _SqrtLogdetFit(torch.autograd.Function):
    """``(log|B|, v^T B^{-1} K v)`` ``[P]`` each from the Cholesky factor of ``C = sigma^2 I + S A S``.

    Forward (``K = S S``): ``log|B| = log|C|`` (Sylvester), ``v^T B^{-1} K v = |L^{-1} S v|^2``
    (``B^{-1} S = S C^{-1}``). Backward, written out (no derivative of the root): with
    ``a = B^{-1} K v``, ``r = v - A a``, ``F = L^{-1} S A``,

    - ``d log|B| / dK = B^{-T} A = (A - F^T F) / sigma^2``, ``d log|B| / dA = S C^{-1} S``,
      ``d log|B| / dsigma^2 = tr(B^{-1}) = (M - <d log|B| / dK, K>) / sigma^2`` (or the trace of
      ``C^{-1}``, when ``d / dA`` forms it);
    - ``d fit / dK = r r^T / sigma^2``, ``d fit / dsigma^2 = -r^T a / sigma^2``,
      ``d fit / dA = -a a^T``, ``d fit / dv = 2 a``.

    ``K`` is block diagonal: only the gradient's diagonal blocks (and the linear diagonal)
    are formed, ``O(P M^2 m)``. Inputs: ``blocks``, ``linear`` of the :class:`SqrtPrior`,
    ``noise [P]``, ``gram`` = ``A`` ``[Q, M, M]``, ``wty`` = ``v`` ``[P, M]``, the prior.
    """

    @staticmethod
    def forward(ctx: Any, blocks: Tensor, linear: Tensor, noise: Tensor, gram: Tensor, wty: Tensor,
                prior: SqrtPrior) -> tuple[Tensor, Tensor]:
        sa, low = sqrt_system(prior, noise, gram)
        a, u = sqrt_mean(prior, low, wty)
        ctx.prior = prior
        ctx.save_for_backward(noise, gram, wty, sa, low, a.squeeze(-1))
        return 2.0 * low.diagonal(dim1=-2, dim2=-1).log().sum(-1), u.squeeze(-1).square().sum(-1)

    @staticmethod
    def backward(ctx: Any, g_logdet: Tensor, g_fit: Tensor) -> tuple[Tensor | None, ...]:
        noise, gram, wty, sa, low, a = ctx.saved_tensors
        prior: SqrtPrior = ctx.prior
        need_blocks, need_linear, need_noise, need_gram, need_wty = ctx.needs_input_grad[:5]
        p, big_m = wty.shape
        _, comps, m, _ = prior.blocks.shape
        cm = comps * m
        inv_noise = 1.0 / noise
        r = wty - (gram @ a.unsqueeze(-1)).squeeze(-1)  # v - A a [P, M]
        f = torch.linalg.solve_triangular(low, sa, upper=False)  # L^{-1} S A [P, M, M]
        # d log|B| / dK on K's diagonal blocks and its linear diagonal: (A - F^T F) / sigma^2
        fg = f[:, :, :cm].unflatten(-1, (comps, m))  # [P, M, C, m]
        a_blocks = gram[:, :cm, :cm].unflatten(1, (comps, m)).unflatten(3, (comps, m)).diagonal(dim1=1, dim2=3)
        dl_blocks = (a_blocks.permute(0, 3, 1, 2) - torch.einsum("pick,picl->pckl", fg, fg)) * inv_noise[:, None, None, None]
        dl_linear = (gram.diagonal(dim1=-2, dim2=-1)[:, cm:] - f[:, :, cm:].square().sum(1)) * inv_noise[:, None]
        g_gram = None
        if need_gram:
            cinv = torch.cholesky_inverse(low)
            trace = cinv.diagonal(dim1=-2, dim2=-1).sum(-1)
            g_gram = (g_logdet[:, None, None] * prior.mul(prior.mul(cinv).transpose(-1, -2))
                      - g_fit[:, None, None] * a.unsqueeze(-1) * a.unsqueeze(-2))
            if gram.shape[0] != p:
                g_gram = g_gram.sum(0, keepdim=True)
        else:
            # tr(B^{-1}) without C^{-1}: K A B^{-1} = I - sigma^2 B^{-1}, and tr(K A B^{-1}) = <d log|B| / dK, K>
            inner = (dl_blocks * prior.blocks).sum((1, 2, 3)) + (dl_linear * prior.linear).sum(-1)
            trace = (big_m - inner) * inv_noise
        g_noise = g_logdet * trace - g_fit * (r * a).sum(-1) * inv_noise if need_noise else None
        g_blocks = g_linear = None
        if need_blocks:
            rg = r[:, :cm].unflatten(-1, (comps, m))
            g_blocks = (g_logdet[:, None, None, None] * dl_blocks
                        + (g_fit * inv_noise)[:, None, None, None] * rg.unsqueeze(-1) * rg.unsqueeze(-2))
        if need_linear:
            g_linear = g_logdet[:, None] * dl_linear + (g_fit * inv_noise)[:, None] * r[:, cm:].square()
        g_wty = 2.0 * g_fit[:, None] * a if need_wty else None
        return g_blocks, g_linear, g_noise, g_gram, g_wty, None


def sqrt_mll(prior: SqrtPrior, noise: Tensor, gram: Tensor, wty: Tensor, yty: Tensor, n: int) -> Tensor:
    """:func:`woodbury_mll` by the symmetric form (one Cholesky factor instead of an LU, module notes), ``[P]``."""
    m = wty.shape[-1]
    logdet_b, fit = _SqrtLogdetFit.apply(prior.blocks, prior.linear, noise, gram, wty, prior)
    quad = yty - fit
    log_noise = noise.log()
    return -0.5 * quad / noise - 0.5 * (logdet_b - m * log_noise) - 0.5 * n * log_noise - 0.5 * n * LOG_2PI


def additive_kmul(factors: list[Tensor], amplitude: Tensor, linear: Tensor, x: Tensor) -> Tensor:
    """``K X`` for the block-diagonal additive prior ``K = blockdiag(K_1..K_C, diag(v))``.

    ``factors``: the ``d`` Toeplitz factors of every component, ``[P*C, g, g]`` each
    (unit amplitude); ``amplitude [P, C]``; ``linear`` = ``v`` ``[P, L]`` (L may be 0);
    ``x [Q, M, c]`` with ``M = C g^d + L``. ``O(P M c g d)``.
    """
    p, comps = amplitude.shape
    mc = math.prod(f.shape[-1] for f in factors)
    _, big_m, c = x.shape
    x = x.expand(p, big_m, c)
    grid = x[:, : comps * mc].reshape(p * comps, mc, c)
    out = kron_matmul(factors, amplitude.reshape(-1), grid).reshape(p, comps * mc, c)
    if linear.shape[-1]:
        out = torch.cat([out, linear.unsqueeze(-1) * x[:, comps * mc :]], dim=1)
    return out


def additive_kdense(factors: list[Tensor], amplitude: Tensor, linear: Tensor) -> Tensor:
    """Dense ``K = blockdiag(K_1..K_C, diag(v))`` ``[P, M, M]`` (refresh and reference code)."""
    p, comps = amplitude.shape
    mc = math.prod(f.shape[-1] for f in factors)
    blocks = kron_dense(factors, amplitude.reshape(-1)).reshape(p, comps, mc, mc)
    big_m = comps * mc + linear.shape[-1]
    out = torch.zeros(p, big_m, big_m, dtype=amplitude.dtype, device=amplitude.device)
    for c in range(comps):
        out[:, c * mc : (c + 1) * mc, c * mc : (c + 1) * mc] = blocks[:, c]
    if linear.shape[-1]:
        idx = torch.arange(comps * mc, big_m, device=amplitude.device)
        out[:, idx, idx] = linear
    return out


class AdditiveHyperparameters(SEHyperparameters):
    """Hyperparameters of the additive SKI kernel, batched over P outputs, as ``exp`` of raw tensors.

    ``lengthscale [P, C, d]`` and ``amplitude [P, C]`` (signal variance) of each component's
    SE kernel, ``linear [P, L]`` the prior variances of the linear term's weights (L = D + 1,
    or 0 without it) and ``noise [P]`` (plus ``noise_floor``); the properties of
    :class:`~gpdyn.gp.hyperparams.SEHyperparameters` read the component-shaped tensors.
    """

    state_fields = ("raw_lengthscale", "raw_amplitude", "raw_linear", "raw_noise", "noise_floor")

    def __init__(self, num_outputs: int, components: int, dim: int, linear: int, *, device: torch.device,
                 dtype: torch.dtype, noise_floor: float = 1e-6) -> None:
        super().__init__(num_outputs, dim, device=device, dtype=dtype, noise_floor=noise_floor)
        kw = {"device": device, "dtype": dtype}
        self.raw_lengthscale = torch.zeros(num_outputs, components, dim, **kw, requires_grad=True)
        self.raw_amplitude = torch.zeros(num_outputs, components, **kw, requires_grad=True)
        self.raw_linear = torch.zeros(num_outputs, linear, **kw, requires_grad=True)

    def parameters(self) -> list[Tensor]:
        return [self.raw_lengthscale, self.raw_amplitude, self.raw_linear, self.raw_noise]

    @property
    def linear(self) -> Tensor:
        return self.raw_linear.exp()

    @torch.no_grad()
    def init_from_data(self, z: Tensor, y: Tensor, generator: torch.Generator | None = None) -> None:
        """Median-trick lengthscales per component from ``z [Q, N, C, d]``; noise = var(y); half
        of the unit prior variance spread over the components, half over the linear weights."""
        q, n, comps, d = z.shape
        ls = torch.stack([median_lengthscale(zq.reshape(n, comps * d), max_points=256, generator=generator) for zq in z])
        self.raw_lengthscale.copy_(ls.view(q, comps, d).expand_as(self.raw_lengthscale).log())
        share = 0.5 if self.raw_linear.shape[-1] else 1.0
        self.raw_amplitude.fill_(math.log(share / comps))
        if self.raw_linear.shape[-1]:
            self.raw_linear.fill_(math.log(0.5 / self.raw_linear.shape[-1]))
        var = initial_noise_variance(y)
        self.raw_noise.copy_((var.clamp_min(2 * self.noise_floor + 1e-12) - self.noise_floor).log())

    @torch.no_grad()
    def set(self, *, lengthscale: Any = None, amplitude: Any = None, linear: Any = None, noise: Any = None) -> None:
        """Set values (broadcast to the raw shapes); ``noise`` must exceed the floor."""
        like = self.raw_noise
        kw = {"dtype": like.dtype, "device": like.device}
        for value, raw in ((lengthscale, self.raw_lengthscale), (amplitude, self.raw_amplitude), (linear, self.raw_linear)):
            if value is not None:
                value = torch.as_tensor(value, **kw)
                if bool((value <= 0).any()):
                    raise LearnerError(f"AdditiveHyperparameters.set: values must be > 0, got {value.tolist()}")
                raw.copy_(value.log().expand_as(raw))
        if noise is not None:
            noise_t = torch.as_tensor(noise, **kw)
            if bool((noise_t <= self.noise_floor).any()):
                raise LearnerError(f"noise variance must exceed the floor {self.noise_floor}, got {noise}")
            self.raw_noise.copy_((noise_t - self.noise_floor).log().expand_as(like))

    def as_dict(self) -> dict[str, Tensor]:
        return {**super().as_dict(), "linear": self.linear.detach()}


class WISKI(Learner):
    """Online SKI GP with constant-time updates, batched over P outputs.

    Options (all keyword):
        structure: ``"auto"`` (``"single"`` for ``input_dim <= 2``, else ``"additive"``),
            ``"single"`` (one grid, the paper's) or ``"additive"`` (a sum of ``components``
            SKI kernels on ``proj_dim``-D projections plus a linear term; module docs).
        grid_size: grid points per interpolated dimension, int or one per dimension
            (default 16 for ``"single"``: m = 256 in 2-D; 8 per component for ``"additive"``).
        projection: ``"auto"`` (``"none"`` for ``input_dim <= 2``; ``"per-output"`` with
            the single structure; ``"shared"`` with the additive one), ``"none"``,
            ``"shared"`` (one projection for all outputs) or ``"per-output"``.
        proj_dim: dimension of each projected feature map (default 2 for ``"single"``, 1
            for ``"additive"``).
        components: additive components C (default: ``2 * input_dim``).
        linear: the additive structure's Bayesian linear term ``[x, 1]^T beta`` (default True).
        quadratic: extend the linear term by the products ``x_i x_j`` (``i <= j``), each with its
            own prior variance in ``diag(v)`` (default False). Still a block of the block-diagonal
            prior ``K`` of eqs. (5)-(17), so every cache and equation is unchanged, with
            ``D (D + 1) / 2`` more basis functions (231 at D = 21). Inverse dynamics is far from
            additive (``M(q) qdd``, ``qd_i qd_j`` terms); the products carry its second-order part.

    Stream use (the prequential protocol, ``gpdyn replay --protocol stream``): pass
    ``calibrate_rows=1024`` so that the predictive variance follows the stream (module
    notes). ``quadratic=True, components=D`` (the second-order term in place of the extra
    random-direction components) helps where the function has strong products (the SARCOS
    stream) and costs where it has not (walker-1): docs/results/stream-wiski-study.md.
        proj_init: additive projections start as ``"axes"`` (default: component c < D
            looks along input c, the rest along random directions) or ``"random"``.
        bounds: ``(lo, hi)`` of the inputs without projection (scalars or per dimension);
            default: the range of the first batch (pretraining data). With a projection
            the features lie in ``[-1, 1]``.
        margin: the grid interior extends the bounds by this fraction of their width on
            each side (default 0.1).
        out_of_grid: ``"clamp"`` (default: clamp onto the grid edge and warn in
            ``observe``) or ``"error"`` (raise GridError in ``observe``). ``predict``
            always clamps (no host sync) and counts such points in ``predict_clamped``.
        lr, proj_lr: Adam learning rates of the online steps for the kernel
            hyperparameters and the projection (default 5e-3, and 5e-4 (WISKI Table C.1)
            for ``"single"``, 5e-2 for ``"additive"``).
        pretrain_lr, pretrain_proj_lr, pretrain_iters: the batch phase (5e-2, 5e-3, 200).
        init_iters: when ``observe`` starts the learner (no :meth:`pretrain` call before), run
            the batch phase for this many iterations on that first batch (default 0 for
            ``"single"``, 50 for ``"additive"``).
            A replay or a controller never calls ``pretrain``; this gives them WISKI's
            batch phase (Sec. 5.1) on the first minibatch.
        noise_floor: added to the noise variance (default 1e-6 in float64, 1e-4 otherwise).
        learn_hyperparameters: False keeps the hyperparameters fixed.
        validate: True (default) checks ``observe`` inputs for NaN/inf (the base class's
            value check) and out-of-grid points, a host sync each per call on a GPU; False
            skips both once the first data have set the grid (no sync).
        predict_chunk: test points per gather block in ``predict`` (default 4096).
        compiled_mean: :meth:`predict_mean` through a :func:`torch.compile`'d dense kernel
            (:func:`additive_mean_dense`; CPU, additive structure with shared 1-D
            projections; default False). Faster than the gather on the CPU (docs/wiski.md,
            ``gpdyn bench wiski``), at the price of a C++ compile at the first call of the
            process; a planner calls ``predict_mean`` thousands of times.
        step_every: take the Adam step of :meth:`step` on every ``step_every``-th call only (default
            1: every call); the other calls return at once. The step (one LU of ``B`` and its
            backward, ``O(P M^3)``) is most of an update's cost; on a stream whose hyperparameters
            settle early, fewer steps buy CPU time (docs/results/stream-walker1-tuned).
        incremental_rows: 0 (default) refreshes the prediction caches in full (one LU,
            ``O(P M^3)``) at the first prediction after any ``observe``. ``R > 0``: between
            hyperparameter changes, ``observe`` keeps ``B^{-1}`` and the mean cache current by
            the Woodbury identity, ``O(P q M^2)`` for ``q`` rows, for up to ``R`` rows after a full
            refresh (which then bounds the rounding that the updates accumulate). For a
            controller that predicts after every transition (module notes, "Incremental
            posterior"); ``predict`` with variances still forms ``M = B^{-1} K`` (a product,
            ``O(P M^3)``) when asked after an update.
        solver: how the steps, refreshes and variances factor ``B = sigma^2 I + K A``:
            ``"cholesky"`` (the symmetric form ``C = sigma^2 I + K^{1/2} A K^{1/2}``, module notes:
            half the flops of an LU, triangular solves for the variance), ``"lu"`` (an LU of ``B``)
            or ``"auto"`` (default: ``"cholesky"`` on the CPU, ``"lu"`` elsewhere, since the
            roots of ``K``'s factors come from ``torch.linalg.eigh``, which checks its result on
            the host: a sync per step on a GPU). The same posterior up to rounding.
    """

    name = "wiski"
    capabilities = frozenset({"pretrain", "step_on_observed"})
    # small and cpu: the default grids, the WISKI paper's 16 points per projected dimension
    # (m = 256) for "single", 8 per component for "additive" (C = 2D components: M = 16 D +
    # D + 1, 358 at D = 21; docs/wiski.md); paper: 32 points, the grid of the SVDGP Table 2
    # replays (docs/results), per component when additive. lr 0.1: the gamma_0 chosen by
    # the step-size selection (docs/results/*-select). small: a 10-iteration batch phase on
    # the first batch (the control runs' minutes; 50 at the other scales for "additive").
    presets = {"small": {"init_iters": 10}, "cpu": {"lr": 0.1}, "paper": {"grid_size": 32, "lr": 0.1}}
    # the caches of eqs. (7), (16), (17), the hyperparameters, the grid, the clamp counters,
    # the projection (PROJECTION_FIELDS, with a projection) and the optimiser
    state_fields = ("initialized", "n", "grid_state", "gram", "wty", "yty", "observe_clamped", "predict_clamped", "hp",
                    "optimizer", "generator", "quad_bounds", "variance_scale")
    PROJECTION_FIELDS = ("proj_weight", "bn_gamma", "bn_beta", "bn_mean", "bn_std")

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        structure: str = "auto",
        grid_size: int | Sequence[int] | None = None,
        projection: str = "auto",
        proj_dim: int | None = None,
        components: int | None = None,
        linear: bool = True,
        quadratic: bool = False,
        proj_init: str = "axes",
        bounds: tuple[Any, Any] | None = None,
        margin: float = 0.1,
        out_of_grid: str = "clamp",
        lr: float = 5e-3,
        proj_lr: float | None = None,
        pretrain_lr: float = 5e-2,
        pretrain_proj_lr: float = 5e-3,
        pretrain_iters: int = 200,
        init_iters: int | None = None,
        noise_floor: float | None = None,
        learn_hyperparameters: bool = True,
        validate: bool = True,
        predict_chunk: int = 4096,
        compiled_mean: bool = False,
        calibrate_rows: int = 0,
        incremental_rows: int = 0,
        step_every: int = 1,
        solver: str = "auto",
        **kwargs: Any,
    ) -> None:
        super().__init__(input_dim, output_dim, **kwargs)  # device, dtype, seed
        if structure not in STRUCTURES:
            raise LearnerError(f"WISKI: structure must be one of {', '.join(STRUCTURES)}, got '{structure}'")
        if structure == "auto":
            structure = "single" if input_dim <= 2 else "additive"
        if projection not in PROJECTIONS:
            raise LearnerError(f"WISKI: projection must be one of {', '.join(PROJECTIONS)}, got '{projection}'")
        additive = structure == "additive"
        if projection == "auto":
            projection = "shared" if additive else ("none" if input_dim <= 2 else "per-output")
        if additive and projection == "none":
            raise LearnerError("WISKI: structure='additive' needs a projection ('shared' or 'per-output'), got 'none'")
        if proj_init not in PROJ_INITS:
            raise LearnerError(f"WISKI: proj_init must be one of {', '.join(PROJ_INITS)}, got '{proj_init}'")
        if proj_dim is None:
            proj_dim = 1 if additive else 2
        # the additive structure learns its projections faster and from a batch phase on the
        # first data (the comparison in docs/wiski.md); the single structure keeps WISKI Table C.1's rate
        if proj_lr is None:
            proj_lr = 5e-2 if additive else 5e-4
        if init_iters is None:
            init_iters = 50 if additive else 0
        if components is None:
            components = 2 * input_dim if additive else 1
        if grid_size is None:
            grid_size = 8 if additive else 16
        if not additive and components != 1:
            raise LearnerError(f"WISKI: components={components} needs structure='additive' (the single grid has one)")
        linear = bool(linear) and additive
        quadratic = bool(quadratic)
        if quadratic and not linear:
            raise LearnerError("WISKI: quadratic=True extends the linear term: it needs structure='additive' and linear=True")
        if quadratic and compiled_mean:
            raise LearnerError("WISKI: compiled_mean=True has no quadratic term; pass quadratic=False")
        if incremental_rows < 0:
            raise LearnerError(f"WISKI: incremental_rows must be >= 0 (0: full refreshes only), got {incremental_rows}")
        if isinstance(step_every, bool) or not isinstance(step_every, int) or step_every < 1:
            raise LearnerError(f"WISKI: step_every must be an integer >= 1 (1: a step on every call), got {step_every!r}")
        if solver not in SOLVERS:
            raise LearnerError(f"WISKI: solver must be one of {', '.join(SOLVERS)}, got {solver!r}")
        if calibrate_rows < 0:
            raise LearnerError(f"WISKI: calibrate_rows must be >= 0 (0: no calibration), got {calibrate_rows}")
        if out_of_grid not in ("clamp", "error"):
            raise LearnerError(f"WISKI: out_of_grid must be 'clamp' or 'error', got '{out_of_grid}'")
        if out_of_grid == "error" and not validate:
            raise LearnerError("WISKI: out_of_grid='error' needs validate=True (the check is the host sync)")
        if (proj_dim < 1 or components < 1 or pretrain_iters < 0 or init_iters < 0 or predict_chunk < 1
                or min(lr, proj_lr, pretrain_lr, pretrain_proj_lr) < 0):
            raise LearnerError(
                f"WISKI: need proj_dim >= 1, components >= 1, pretrain_iters >= 0, init_iters >= 0, predict_chunk >= 1 "
                f"and learning rates >= 0; got {proj_dim}, {components}, {pretrain_iters}, {init_iters}, {predict_chunk}, "
                f"{(lr, proj_lr, pretrain_lr, pretrain_proj_lr)}"
            )
        compiled_mean = bool(compiled_mean)
        if compiled_mean and (not additive or projection != "shared" or proj_dim != 1 or self.device.type != "cpu"):
            raise LearnerError(
                "WISKI: compiled_mean=True needs structure='additive', projection='shared', proj_dim=1 and a CPU "
                f"device; got {structure}, {projection}, {proj_dim}, {self.device}"
            )
        if noise_floor is None:
            noise_floor = 1e-6 if self.dtype == torch.float64 else 1e-4
        self.config.update({
            "structure": structure,
            "grid_size": grid_size if isinstance(grid_size, int) else [int(g) for g in grid_size],
            "projection": projection, "proj_dim": int(proj_dim), "components": int(components), "linear": linear,
            "quadratic": quadratic,
            "proj_init": proj_init, "bounds": bounds, "margin": float(margin),
            "out_of_grid": out_of_grid, "lr": float(lr), "proj_lr": float(proj_lr), "pretrain_lr": float(pretrain_lr),
            "pretrain_proj_lr": float(pretrain_proj_lr), "pretrain_iters": int(pretrain_iters),
            "init_iters": int(init_iters), "noise_floor": float(noise_floor), "learn_hyperparameters": bool(learn_hyperparameters),
            "validate": bool(validate), "predict_chunk": int(predict_chunk), "compiled_mean": compiled_mean,
            "calibrate_rows": int(calibrate_rows), "incremental_rows": int(incremental_rows),
            "step_every": int(step_every), "solver": solver,
        })
        # the symmetric (Cholesky) form of every solve with B, or an LU of B (the ``solver`` option)
        self.cholesky = solver == "cholesky" or (solver == "auto" and self.device.type == "cpu")
        self.step_every = int(step_every)
        self.step_calls = 0  # calls of step() since the start: every step_every-th takes the Adam step
        self.calibrate_rows = int(calibrate_rows)
        self.incremental_rows = int(incremental_rows)
        # incremental posterior: B^{-1} [P, M, M] (solve dtype) as of the last refresh plus the rows since, their
        # count, and whether M = B^{-1} K (the variance cache) lags behind the updated B^{-1}
        self._b_inv: Tensor | None = None
        self._mean_solve: Tensor | None = None  # the mean cache in the solve dtype, updated with B^{-1}
        self._kmul_solve: tuple[tuple, Callable[[Tensor], Tensor]] | None = None  # _update_posterior's K, and its key
        self._incremental_since = 0
        self._m_lags = False
        # the factor of the last refresh (the LU of B, or the Cholesky factor L of C and the prior's root), and
        # whether M = B^{-1} K (the variance cache) is still to be formed from it
        self._lu: tuple[Tensor, Tensor] | None = None
        self._chol: tuple[Tensor, SqrtPrior] | None = None
        # the prior's root of the last refresh and what it was made from (_refresh_prior)
        self._root_prior: SqrtPrior | None = None
        self._root_key: tuple[Any, ...] | None = None
        self._m_pending = False
        self.structure = structure
        self.projection = projection
        self.components = int(components)
        self.quadratic = quadratic
        # the Bayesian linear term's features [x, 1] and, with ``quadratic``, the products x_i x_j (i <= j)
        self.linear_dim = (input_dim + 1 + (input_dim * (input_dim + 1) // 2 if quadratic else 0)) if linear else 0
        self._quad_i, self._quad_j = torch.triu_indices(input_dim, input_dim, device=self.device)
        # [lo, hi] [2, D] of the inputs in the quadratic term (set from the first data, with margin, before any use)
        self.quad_bounds = torch.zeros(2, input_dim, device=self.device, dtype=self.dtype)
        # grid_dim: dimensions of one grid; feature_dim: all projected features (C grids)
        self.grid_dim = input_dim if projection == "none" else int(proj_dim)
        self.feature_dim = self.components * self.grid_dim
        sizes = (int(grid_size),) * self.grid_dim if isinstance(grid_size, int) else tuple(int(g) for g in grid_size)
        if len(sizes) != self.grid_dim or min(sizes) < 4:
            raise LearnerError(
                f"WISKI: grid_size {grid_size} must give >= 4 points for each of the {self.grid_dim} interpolated dimensions"
            )
        self.grid_sizes = sizes
        self.grid_points = math.prod(sizes)  # m of one grid
        self.num_inducing = self.components * self.grid_points + self.linear_dim  # M, the basis size
        if self.num_inducing > 16384:
            raise LearnerError(
                f"WISKI: {self.num_inducing} basis functions need {self.num_inducing**2 * 8 / 1e9:.1f} GB per output; "
                "use a smaller grid_size, fewer components or a projection"
            )
        self.margin = float(margin)
        self.out_of_grid = out_of_grid
        self.lr, self.proj_lr = float(lr), float(proj_lr)
        self.pretrain_lr, self.pretrain_proj_lr = float(pretrain_lr), float(pretrain_proj_lr)
        self.pretrain_iters = int(pretrain_iters)
        self.init_iters = int(init_iters)
        self.learn_hyperparameters = bool(learn_hyperparameters)
        self.validate = bool(validate)
        self.predict_chunk = int(predict_chunk)
        self.compiled_mean = compiled_mean
        kw = {"device": self.device, "dtype": self.dtype}
        # Q: how many distinct feature maps (1 when every output sees the same features)
        self.num_maps = output_dim if projection == "per-output" else 1
        if additive:
            self.hp: SEHyperparameters | AdditiveHyperparameters = AdditiveHyperparameters(
                output_dim, self.components, self.grid_dim, self.linear_dim, device=self.device, dtype=self.dtype,
                noise_floor=noise_floor)
        else:
            self.hp = SEHyperparameters(output_dim, self.grid_dim, device=self.device, dtype=self.dtype,
                                        noise_floor=noise_floor)
        self.proj_params: list[Tensor] = []
        if projection != "none":
            weight = torch.randn(self.num_maps, input_dim, self.feature_dim, generator=self.generator, dtype=self.dtype)
            weight = weight / math.sqrt(input_dim)
            if additive and proj_init == "axes":  # component c < D looks along input c (an additive GP over inputs)
                axes = min(input_dim, self.components) * self.grid_dim
                eye = torch.eye(input_dim, dtype=self.dtype).repeat_interleave(self.grid_dim, dim=1)[:, :axes]
                weight[:, :, :axes] = eye + 0.1 * weight[:, :, :axes]
            self.proj_weight = weight.to(self.device).requires_grad_(True)
            self.bn_gamma = torch.ones(self.num_maps, self.feature_dim, **kw, requires_grad=True)
            self.bn_beta = torch.zeros(self.num_maps, self.feature_dim, **kw, requires_grad=True)
            self.proj_params = [self.proj_weight, self.bn_gamma, self.bn_beta]
            self.bn_mean = torch.zeros(self.num_maps, self.feature_dim, **kw)
            self.bn_std = torch.ones(self.num_maps, self.feature_dim, **kw)
            bounds = (-1.0, 1.0)  # the tanh range
        self.grid: Grid | None = None
        if bounds is not None:
            lo = torch.as_tensor(bounds[0], **kw).expand(self.grid_dim)
            hi = torch.as_tensor(bounds[1], **kw).expand(self.grid_dim)
            if not bool((hi > lo).all()):
                raise LearnerError(f"WISKI: bounds need lo < hi in every dimension, got {bounds}")
            self.grid = Grid.from_bounds(lo, hi, sizes, self.margin)
        # the additive row's layout: component c's grid indices are offset by c m; the
        # linear term's columns [x, 1] sit at C m .. C m + D
        self._offsets = (torch.arange(self.components, device=self.device) * self.grid_points).view(-1, 1)
        self._linear_idx = torch.arange(self.components * self.grid_points, self.num_inducing, device=self.device)
        # constants of predict_mean's patch tables, made once here: a tensor built from a list
        # later would be a host-to-device copy in the hot path on a GPU
        cells = math.prod(g - 3 for g in sizes)
        self._cubic = torch.tensor(CUBIC, **kw)
        self._cell_strides = torch.tensor([math.prod(g - 3 for g in sizes[k + 1 :]) for k in range(self.grid_dim)], **kw)
        self._cell_offsets = (torch.arange(self.num_maps * self.components, device=self.device) * cells).view(
            self.num_maps, self.components)
        self._one = torch.ones((), **kw)
        self._zero = torch.zeros((), dtype=torch.int64, device=self.device)
        self.optimizer = self._make_optimizer(self.lr, self.proj_lr)
        self.initialized = False
        self.n = 0
        m = self.num_inducing
        sums = {"device": self.device, "dtype": SOLVE_DTYPE}
        self.gram = torch.zeros(self.num_maps, m, m, **sums)  # W^T W, WISKI eq. (7)
        self.wty = torch.zeros(output_dim, m, **sums)  # W^T y, eq. (16)
        self.yty = torch.zeros(output_dim, **sums)  # y^T y, eq. (17)
        self.observe_clamped = torch.zeros((), dtype=torch.int64, device=self.device)
        self.predict_clamped = torch.zeros((), dtype=torch.int64, device=self.device)
        # c_p of the calibrated variance (module notes; 1 without calibration)
        self.variance_scale = torch.ones(output_dim, **kw)
        self._stale = True
        self._last_predict = BatchMemo(max_rows=int(predict_chunk))  # (caches, mean, unscaled var) for _predict_again
        self._m_cache = torch.zeros(0, **kw)
        self._mean_cache = torch.zeros(0, **kw)
        self._fast: dict[str, Tensor] = {}

    # -- features and interpolation -------------------------------------------------------
    def _make_optimizer(self, lr: float, proj_lr: float) -> torch.optim.Optimizer:
        groups = [{"params": self.hp.parameters(), "lr": lr}]
        if self.proj_params:
            groups.append({"params": self.proj_params, "lr": proj_lr})
        return torch.optim.Adam(groups)

    def features(self, x: Tensor, batch_stats: bool = False) -> Tensor:
        """Interpolated features ``[Q, N, F]``: ``x`` itself, or ``tanh(BN(x A))`` (WISKI Sec. 5.1).

        With the additive structure ``F = C d``: feature ``c d + k`` is dimension ``k`` of component ``c``.
        """
        if self.projection == "none":
            return x.unsqueeze(0)
        a = x @ self.proj_weight  # [Q, N, F]
        mean, std = _bn_stats(a) if batch_stats else (self.bn_mean, self.bn_std)
        scale = self.bn_gamma / std  # [Q, F]: BN folded into one multiply-add
        return torch.tanh(a * scale.unsqueeze(1) + (self.bn_beta - mean * scale).unsqueeze(1))

    def _rows(self, x: Tensor, batch_stats: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """Sparse rows ``(idx, w)`` ``[Q, N, K]`` of ``W`` (or ``Phi``) and the out-of-grid mask ``[Q, N]``."""
        assert self.grid is not None
        z = self.features(x, batch_stats)
        if self.structure == "single":
            return interp_weights(z, self.grid)
        q, n = z.shape[:2]
        idx, w, outside = interp_weights(z.view(q, n, self.components, self.grid_dim), self.grid)  # [Q, N, C, 4^d]
        idx = (idx + self._offsets).flatten(-2)
        w = w.flatten(-2)
        if self.linear_dim:
            idx = torch.cat([idx, self._linear_idx.expand(q, n, self.linear_dim)], dim=-1)
            w = torch.cat([w, self._linear_features(x).expand(q, n, self.linear_dim)], dim=-1)
        return idx, w, outside.any(dim=-1)

    def _linear_features(self, x: Tensor) -> Tensor:
        """The linear term's features ``[N, L]``: ``[x, 1]``, then ``x_i x_j`` (i <= j) with ``quadratic``."""
        parts = [x, x.new_ones(x.shape[0], 1)]
        if self.quadratic:
            # the products of the inputs clamped to the first data's range widened by ``margin``:
            # a quadratic grows without bound, and a stream leaves its first rows' range
            xc = torch.minimum(torch.maximum(x, self.quad_bounds[0]), self.quad_bounds[1])
            parts.append(xc[:, self._quad_i] * xc[:, self._quad_j])
        return torch.cat(parts, dim=-1)

    def _per_output(self, t: Tensor) -> Tensor:
        return t.expand(self.output_dim, *t.shape[1:])

    def _caches_of(self, idx: Tensor, w: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """``(W^T W [Q, M, M], W^T y [P, M])`` of one batch (WISKI eqs. (7), (16)), differentiable in ``w``.

        Small batches and short rows scatter, ``O(N K^2)``; from :data:`DENSE_GRAM_ROWS` rows
        of ``K`` non-zeros with ``M^2 <= 16 K^2`` (the additive rows: K = 4C + D + 1) a dense
        ``W`` and a matrix product, ``O(N M^2)`` flops at BLAS speed, are faster. The dense
        blocks take :data:`DENSE_BLOCK` elements at most.
        """
        m = self.num_inducing
        n, k = idx.shape[-2:]
        if n < DENSE_GRAM_ROWS or m * m > 16 * k * k:
            return scatter_gram(idx, w, m), scatter_rhs(self._per_output(idx), self._per_output(w), y.T, m)
        gram: Tensor | None = None
        wty: Tensor | None = None
        step = max(DENSE_GRAM_ROWS, DENSE_BLOCK // (self.num_maps * m))  # bounds the dense block's memory
        for start in range(0, n, step):
            phi = dense_rows(idx[:, start : start + step], w[:, start : start + step], m)  # [Q, rows, M]
            yt = y[start : start + step].T
            g = phi.transpose(-1, -2) @ phi
            v = yt @ phi[0] if self.num_maps == 1 else (yt.unsqueeze(1) @ phi).squeeze(1)
            gram, wty = (g, v) if gram is None else (gram + g, wty + v)
        assert gram is not None and wty is not None
        return gram, wty

    def _kmul(self, dtype: torch.dtype | None = None) -> Callable[[Tensor], Tensor]:
        """``X -> K X`` for the current hyperparameters (the prior of the basis weights), in ``dtype``
        (default the learner's)."""
        assert self.grid is not None
        dtype = dtype or self.dtype
        ls, amp = self.hp.lengthscale.to(dtype), self.hp.amplitude.to(dtype)
        if self.structure == "single":
            factors = toeplitz_factors(self.grid, ls)
            return lambda x: kron_matmul(factors, amp, x)
        factors = toeplitz_factors(self.grid, ls.reshape(-1, self.grid_dim))
        lin = self.hp.linear.to(dtype)
        return lambda x: additive_kmul(factors, amp, lin, x)

    def _sqrt_prior(self, dtype: torch.dtype | None = None) -> SqrtPrior:
        """The prior ``K`` as :class:`SqrtPrior` (its dense blocks, differentiable, and ``X -> K^{1/2} X``) for the
        current hyperparameters, in ``dtype`` (default the learner's)."""
        assert self.grid is not None
        dtype = dtype or self.dtype
        ls, amp = self.hp.lengthscale.to(dtype), self.hp.amplitude.to(dtype)
        p = self.output_dim
        if self.structure == "single":
            factors = toeplitz_factors(self.grid, ls)
            with torch.no_grad():
                roots, amp_root = [psd_sqrt(f) for f in factors], amp.sqrt()
            return SqrtPrior(kron_dense(factors, amp).unsqueeze(1), amp.new_zeros(p, 0),
                             lambda x: kron_matmul(roots, amp_root, x))
        c, m = self.components, self.grid_points
        factors = toeplitz_factors(self.grid, ls.reshape(-1, self.grid_dim))
        lin = self.hp.linear.to(dtype)
        with torch.no_grad():
            roots = kron_dense([psd_sqrt(f) for f in factors], amp.reshape(-1).sqrt())  # [P C, m, m]
            # the blocks of one component for every output stacked: [C, P m, m]
            roots_by_component = roots.view(p, c, m, m).transpose(0, 1).reshape(c, p * m, m)
            lin_root = lin.sqrt().unsqueeze(-1)

        @torch.no_grad()
        def mul(x: Tensor) -> Tensor:  # blockdiag(S_1..S_C, diag(v^{1/2})) X by torch.bmm over the blocks
            q, _, cols = x.shape
            out = x.new_empty(p, c * m + self.linear_dim, cols)
            grid = out[:, : c * m].unflatten(1, (c, m))  # [P, C, m, cols]
            if q == 1:  # one X for every output (A, the rows Phi): C products of [P m, m] with [m, cols]
                prod = torch.bmm(roots_by_component, x[0, : c * m].reshape(c, m, cols))
                grid.copy_(prod.view(c, p, m, cols).transpose(0, 1))
            else:  # P C products of [m, m] with [m, cols] (a broadcast matmul would take 3x as long)
                grid.copy_(torch.bmm(roots, x[:, : c * m].reshape(p * c, m, cols)).view(p, c, m, cols))
            if self.linear_dim:
                torch.mul(lin_root, x[:, c * m :], out=out[:, c * m :])
            return out

        return SqrtPrior(kron_dense(factors, amp.reshape(-1)).view(p, c, m, m), lin, mul)

    def prior_dense(self, dtype: torch.dtype | None = None) -> Tensor:
        """Dense prior covariance ``K`` ``[P, M, M]`` of the basis weights (``K_UU`` for the single grid),
        in ``dtype`` (default the learner's)."""
        assert self.grid is not None
        dtype = dtype or self.dtype
        ls, amp = self.hp.lengthscale.to(dtype), self.hp.amplitude.to(dtype)
        if self.structure == "single":
            return kron_dense(toeplitz_factors(self.grid, ls), amp)
        factors = toeplitz_factors(self.grid, ls.reshape(-1, self.grid_dim))
        return additive_kdense(factors, amp, self.hp.linear.to(dtype))

    def dense_rows(self, x: Tensor) -> Tensor:
        """Dense interpolation rows ``W(x)`` ``[Q, N, M]`` (reference code and tests)."""
        idx, w, _ = self._rows(x)
        return dense_rows(idx, w, self.num_inducing)

    @torch.no_grad()
    def _initialize(self, x: Tensor, y: Tensor) -> None:
        """Hyperparameters, BN statistics and grid from the first data (the protocol of docs/architecture.md)."""
        if self.projection != "none":
            self.bn_mean, self.bn_std = _bn_stats(x @ self.proj_weight)
        elif self.grid is None:
            self.grid = Grid.from_bounds(x.min(dim=0).values, x.max(dim=0).values, self.grid_sizes, self.margin)
        if self.quadratic:
            lo, hi = x.min(dim=0).values, x.max(dim=0).values
            width = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
            self.quad_bounds = torch.stack([lo - self.margin * width, hi + self.margin * width])
        z = self.features(x)
        if self.structure == "single":
            self.hp.init_from_data(z, y, self.generator)
        else:
            self.hp.init_from_data(z.view(*z.shape[:2], self.components, self.grid_dim), y, self.generator)
        self.gram.zero_()
        self.wty.zero_()
        self.yty.zero_()
        self.n = 0
        self.initialized = True
        self._stale = True

    def _check_observe(self, x: Tensor, outside: Tensor) -> None:
        """One host sync: out-of-grid points, per the ``out_of_grid`` option (the base class checked the values)."""
        n_out = int(outside.any(dim=0).sum())
        if n_out:
            assert self.grid is not None
            lo, hi = self.grid.interior()
            first = int(outside.any(dim=0).nonzero()[0, 0])
            msg = (
                f"WISKI.observe: {n_out} of {x.shape[0]} points (first: row {first}) lie outside the grid interior "
                f"[{lo.tolist()}, {hi.tolist()}]"
            )
            if self.out_of_grid == "error":
                raise GridError(msg + "; pass bounds= covering the data or out_of_grid='clamp'")
            warnings.warn(msg + "; clamped onto the grid edge (pass bounds= covering the data)", stacklevel=3)

    # -- the contract ----------------------------------------------------------------------
    def observe(self, x: Tensor, y: Tensor) -> None:
        """Add ``x [q, D]``, ``y [q, P]`` to the caches (WISKI eqs. (7), (16), (17)): ``O(Q q K^2)``."""
        if not self.initialized:
            if self.init_iters and self.learn_hyperparameters and x.shape[0] > 1:
                self.pretrain(x, y, iterations=self.init_iters, progress=False)  # conditions on x, y at its end
                return
            self._initialize(x, y)
        elif self.calibrate_rows and self.n > 0:
            self._calibrate(x, y)
        with torch.no_grad():
            idx, w, outside = self._rows(x)
            if self.validate:
                self._check_observe(x, outside)
            self.observe_clamped += outside.any(dim=0).sum()
            gram, wty = self._caches_of(idx, w, y)
            self.gram += gram
            self.wty += wty
            self.yty += (y * y).sum(dim=0)
            incremental = (self._b_inv is not None and not self._stale
                           and self._incremental_since + x.shape[0] <= self.incremental_rows)
            if incremental:
                self._update_posterior(idx, w, y)
        self.n += x.shape[0]
        self._stale = not incremental

    @torch.no_grad()
    def _calibrate(self, x: Tensor, y: Tensor) -> None:
        """Update ``variance_scale`` from the predictions of ``x, y`` before they enter the caches."""
        mean, var = self._predict_again(x)  # already scaled by c_p: the ratio below is relative to it
        ratio = ((y - mean).pow(2) / (var + self.noise_variance())).mean(dim=0)
        keep = math.exp(-x.shape[0] / self.calibrate_rows)  # the weight of the rows before this batch
        self.variance_scale.mul_(keep + (1.0 - keep) * ratio)

    @torch.no_grad()
    def _predict_again(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`predict` of ``x``, from the last prediction when it was of the same rows with the
        same caches: the prequential rule predicts a chunk and then observes it, and the
        calibration's prediction of that batch is the same one (half of the variance work of a
        calibrated stream)."""
        memo = self._last_predict.get(x)
        # _fast is remade by every change of the posterior (_refresh, _update_posterior); the
        # hyperparameters and the projection change only with _stale set
        if memo is not None and not self._stale and memo[0] is self._fast:
            return memo[1], memo[2] * self.variance_scale
        return self.predict(x)

    def mll(self) -> Tensor:
        """Log marginal likelihood of everything observed, per output ``[P]`` (WISKI eq. (13))."""
        return self._mll(self.gram, self.wty, self.yty, self.n)

    def _mll(self, gram: Tensor, wty: Tensor, yty: Tensor, n: int) -> Tensor:
        s = SOLVE_DTYPE  # the caches' precision (module notes); the result too
        if self.cholesky:
            return sqrt_mll(self._sqrt_prior(s), self.hp.noise.to(s), gram.to(s), wty.to(s), yty.to(s), n)
        return woodbury_mll(self._kmul(s), self.hp.noise.to(s), gram.to(s), wty.to(s), yty.to(s), n)

    def step(self, x: Tensor, y: Tensor) -> dict[str, float]:
        """One Adam step on theta (eq. (13)) and the projection (eq. (18)); ``x, y`` = the batch just observed."""
        if not self.learn_hyperparameters or self.n == 0:
            return {}
        self.step_calls += 1
        if (self.step_calls - 1) % self.step_every:
            return {}
        self.optimizer.zero_grad()
        gram, wty = self.gram, self.wty
        if self.proj_params and self.proj_lr > 0:
            # WISKI eq. (18): the newest rows carry the gradient of phi; their values are
            # already in the caches, so G - G.detach() adds zero but keeps the graph
            idx, w, _ = self._rows(x)
            new_gram, new_wty = self._caches_of(idx, w, y)
            gram = gram + (new_gram - new_gram.detach())
            wty = wty + (new_wty - new_wty.detach())
        loss = -self._mll(gram, wty, self.yty, self.n).sum() / self.n
        loss.backward()
        self.optimizer.step()
        self._stale = True
        return {"loss": loss.detach()}  # a 0-d tensor: float() would sync a GPU every step

    @torch.no_grad()
    def _refresh(self) -> None:
        """The LU of ``B`` and the mean cache ``a = B^{-1} K W^T y`` (eqs. (9), (14)); the variance
        cache ``M = B^{-1} K`` (eq. (6)) follows when a prediction needs it (:meth:`_variance_cache`)."""
        s = SOLVE_DTYPE  # solved in the caches' precision, kept in the learner's (module notes)
        m = self.num_inducing
        noise = self.hp.noise.to(s)
        if self.cholesky:
            prior = self._refresh_prior()
            low = sqrt_system(prior, noise, self.gram)[1]
            self._chol, self._lu = (low, prior), None
            mean = sqrt_mean(prior, low, self.wty)[0]
        else:
            kmul = self._kmul(s)
            lu, piv = _lu_factor(noise[:, None, None] * torch.eye(m, dtype=s, device=self.device) + kmul(self.gram))
            self._lu, self._chol = (lu, piv), None
            mean = torch.linalg.lu_solve(lu, piv, kmul(self.wty.unsqueeze(-1)))
        self._m_pending = True
        self._mean_cache = mean.squeeze(-1).to(self.dtype)
        self._fast = self._mean_tables()
        self._stale = self._m_lags = False
        if self.incremental_rows:  # B^{-1} for the Woodbury updates of _update_posterior, from an LU of B
            eye = torch.eye(m, dtype=s, device=self.device)
            lu, piv = self._lu if self._lu is not None else _lu_factor(noise[:, None, None] * eye + self._kmul(s)(self.gram))
            self._b_inv, self._incremental_since = torch.linalg.lu_solve(lu, piv, eye.expand_as(lu)), 0
            self._mean_solve = mean.squeeze(-1).to(s)

    def _hyperparameter_key(self) -> tuple:
        """What the prior ``K`` is made from: the grid and each hyperparameter tensor at its version."""
        return (self.grid, *((t, t._version) for t in self.hp.parameters()))

    @staticmethod
    def _same_key(old: tuple | None, key: tuple) -> bool:
        return old is not None and len(old) == len(key) and old[0] is key[0] and all(
            a[0] is b[0] and a[1] == b[1] for a, b in zip(old[1:], key[1:]))

    def _refresh_prior(self) -> SqrtPrior:
        """:meth:`_sqrt_prior` in the solve dtype, kept from the last refresh while the hyperparameters and the
        grid are the same tensors at the same versions (a stream steps on every ``step_every``-th chunk only)."""
        key = self._hyperparameter_key()
        if not self._same_key(self._root_key, key):
            self._root_prior, self._root_key = self._sqrt_prior(SOLVE_DTYPE), key
        assert self._root_prior is not None
        return self._root_prior

    @torch.no_grad()
    def _update_posterior(self, idx: Tensor, w: Tensor, y: Tensor) -> None:
        """``B^{-1}`` and the mean cache after the rows ``(idx, w)``, targets ``y [q, P]``, entered the caches, by
        the Woodbury identity.

        The rows add ``Phi^T Phi`` to ``A = W^T W``, so ``B = sigma^2 I + K A`` gains ``U V`` with
        ``U = K Phi^T`` ``[P, M, q]`` and ``V = Phi`` ``[Q, q, M]``:
        ``B'^{-1} = B^{-1} - B^{-1} U S^{-1} V B^{-1}`` with ``S = I + V B^{-1} U``, ``O(P q M^2)``. The mean
        cache ``a = B^{-1} K W^T y`` (eq. (14)), whose ``K W^T y`` gains ``U y``, follows by the same identity as
        ``a' = a + B^{-1} U S^{-1} (y - Phi a)`` (``O(P q M)``); then the gather tables from it.
        """
        s = SOLVE_DTYPE
        assert self._b_inv is not None and self._mean_solve is not None
        phi = dense_rows(idx, w, self.num_inducing).to(s)  # [Q, q, M]
        key = self._hyperparameter_key()
        if self._kmul_solve is None or not self._same_key(self._kmul_solve[0], key):
            self._kmul_solve = key, self._kmul(s)
        u = self._kmul_solve[1](phi.transpose(-1, -2).expand(self.output_dim, -1, -1).contiguous())  # [P, M, q]
        binv_u = matmul_few_columns(self._b_inv, u)  # [P, M, q]
        v_binv = phi @ self._b_inv  # [P, q, M]
        inner = torch.eye(phi.shape[-2], dtype=s, device=self.device) + matmul_few_columns(phi, binv_u)  # [P, q, q]
        residual = y.T.to(s).unsqueeze(-1) - phi @ self._mean_solve.unsqueeze(-1)  # y - Phi a, [P, q, 1]
        solved = torch.linalg.solve(inner, torch.cat([v_binv, residual], dim=-1))  # S^{-1} [V B^{-1}, y - Phi a]
        # a new tensor, not in place: the mean cache and the gather tables made from it may share its storage
        self._mean_solve = self._mean_solve + (binv_u @ solved[..., -1:]).squeeze(-1)
        # in place: a fresh [P, M, M] product per row costs ~20x the fused rank-q update
        self._b_inv.baddbmm_(binv_u, solved[..., :-1], alpha=-1.0)
        self._mean_cache = self._mean_solve.to(self.dtype)
        self._fast = self._mean_tables()
        self._incremental_since += phi.shape[-2]
        self._m_lags = True
        self._m_pending = False  # the LU is of the B before these rows: M follows from B^{-1} instead

    @torch.no_grad()
    def _variance_cache(self) -> None:
        """``M = B^{-1} K`` (eq. (6)) for the current posterior: from the LU of the last refresh, or
        from ``B^{-1}`` after incremental updates."""
        if self._m_lags:  # incremental updates moved B^{-1}: M = B^{-1} K follows
            assert self._b_inv is not None
            mm = self._b_inv @ self.prior_dense(SOLVE_DTYPE)
        elif self._m_pending and self._chol is not None:  # S C^{-1} S
            low, prior = self._chol
            mm = prior.mul(prior.mul(torch.cholesky_inverse(low)).transpose(-1, -2))
        elif self._m_pending:
            mm = torch.linalg.lu_solve(*self._lu, self.prior_dense(SOLVE_DTYPE))
        else:
            return
        self._m_cache = (0.5 * (mm + mm.transpose(-1, -2))).to(self.dtype)
        self._m_lags = self._m_pending = False

    def _mean_tables(self) -> dict[str, Tensor]:
        """The tables of :meth:`predict_mean`'s fused gather, from the mean cache ``a = M W^T y`` (eq. (14)).

        Cubic interpolation in a cell reads the ``4^d`` grid values of the patch that starts
        one node before the cell. The table holds every cell's patch contiguously, mapped to
        the coefficients of its interpolating polynomial (the cubic weights are polynomials
        in the offset ``t``, :data:`CUBIC`),
        ``[C cells, 4^d, P]`` (one map: each row holds all outputs) or ``[P C cells, 4^d]``
        (per-output maps), so one point of one component costs one gathered row and no
        ``[..., 4^d]`` index tensor is built. The projection with its batch normalisation
        folded in (``x (A gamma / std) + (beta - mu gamma / std)``), the grid scaling and the
        linear term's weights ``a_lin^T [P, D + 1]`` come along.
        """
        assert self.grid is not None
        p, q, c, d, m = self.output_dim, self.num_maps, self.components, self.grid_dim, self.grid_points
        patches = self._mean_cache[:, : c * m].reshape(p, c, *self.grid_sizes)
        for k in range(d):
            patches = patches.unfold(2 + k, 4, 1)  # [P, C, g_0 - 3, .., g_{d-1} - 3, 4, .., 4]
        cells = math.prod(g - 3 for g in self.grid_sizes)
        # the patch in the power basis: w_j(t) = sum_a t^a CUBIC[a, j] along each axis, so the
        # interpolant of a cell is sum_ab t_0^a t_1^b coef_ab, and only powers of t are needed
        cubic = self._cubic
        patches = patches.reshape(p, c, cells, *([4] * d))
        for k in range(d):
            patches = (patches.movedim(3 + k, -1) @ cubic.T).movedim(-1, 3 + k)
        patches = patches.reshape(p, c, cells, 4**d)
        table = patches.permute(1, 2, 3, 0).reshape(c * cells, 4**d, p) if q == 1 else patches.reshape(p * c * cells, 4**d)
        out = {
            "table": table.contiguous(),
            "cell_strides": self._cell_strides,
            "cell_offsets": self._cell_offsets - int(sum(math.prod(g - 3 for g in self.grid_sizes[k + 1 :])
                                                            for k in range(d))),
            "inv_spacing": 1.0 / self.grid.spacing,
            "offset": -self.grid.lower / self.grid.spacing,
            "upper": self.grid.counts - 2.0,
            "last_cell": self.grid.counts - 3.0,
            "one": self._one,
            "linear_t": self._mean_cache[:, c * m :].contiguous(),  # [P, D + 1]
        }
        if self.compiled_mean:  # additive_mean_dense's operands (the projection's come below)
            out["nodes"] = torch.arange(m, dtype=self.dtype, device=self.device)
            out["coef_t"] = self._mean_cache[:, : c * m].contiguous()
        if self.projection != "none":
            scale = (self.bn_gamma / self.bn_std).detach()  # [Q, F]
            out["proj"] = (self.proj_weight.detach() * scale.unsqueeze(1)).permute(1, 0, 2).reshape(self.input_dim, -1)
            out["shift"] = (self.bn_beta.detach() - self.bn_mean * scale).reshape(-1)
            if self.compiled_mean:
                out["proj_t"] = out["proj"].T.contiguous()
        return out

    def _fused_mean(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``w(x)^T a`` ``[N, P]`` (eq. (14)) for ``x [N, D]`` and the count of points clamped onto the grid.

        The rows are never formed: features (one GEMM), grid coordinates, the cell of each
        point and its offset ``t`` in the cell per dimension, then one gather of patches (in
        the power basis) from the table of :meth:`_mean_tables` and the polynomial's value:
        a batched product with the powers of ``t`` (one map, all outputs at once) or
        Horner's rule per axis (per-output maps); the linear term is a GEMM.
        """
        f = self._fast
        n, q, c, d = x.shape[0], self.num_maps, self.components, self.grid_dim
        if self.projection == "none":
            u = x.view(n, 1, 1, d)
        else:
            u = torch.tanh(torch.addmm(f["shift"], x, f["proj"])).view(n, q, c, d)
        s = torch.addcmul(f["offset"], u, f["inv_spacing"])  # grid units
        if self.projection == "none":  # clamp onto the interior [1, g - 2] and count the points clamped
            sc = torch.clamp(s, min=f["one"], max=f["upper"])
            outside = (sc != s).flatten(1).any(-1).sum()
            i0 = torch.minimum(torch.floor(sc), f["last_cell"])
        else:
            # tanh features lie in (-1, 1), inside the grid interior by construction (Grid.from_bounds
            # with bounds (-1, 1)): nothing to clamp or count; the cell is kept in range all the same
            sc, outside = s, self._zero
            i0 = torch.clamp(torch.floor(s), min=f["one"], max=f["last_cell"])
        i0 = torch.nan_to_num(i0, nan=1.0)  # a NaN feature (GPU: no input check) gives NaN, never a bad index
        t = sc - i0
        # the cell's patch starts at node i0 - 1: row of the table = sum_k (i0_k - 1) stride_k + offset
        cell = (i0 @ f["cell_strides"] if d > 1 else i0.squeeze(-1)).long() + f["cell_offsets"]
        vals = f["table"].index_select(0, cell.view(-1))  # one row (patch) per point, map and component
        if q == 1:  # [N, C 4^d, P]: every output at once, weights = products of powers of t
            pw = torch.linalg.vander(t, N=4)  # [N, 1, C, d, 4]: 1, t, t^2, t^3
            w = pw[..., 0, :]
            for k in range(1, d):
                w = (w.unsqueeze(-1) * pw[..., k, None, :]).flatten(-2)  # [N, 1, C, 4^d], first axis major
            mean = torch.bmm(w.reshape(n, 1, -1), vals.view(n, -1, self.output_dim)).view(n, self.output_dim)
        else:  # per-output maps: Horner's rule along each axis, last first (no weight tensor at all)
            v = vals.view(n, q, c, *([4] * d))
            for k in reversed(range(d)):
                tk = t[..., k].reshape(n, q, c, *([1] * k))
                acc = v[..., 3]
                for j in (2, 1, 0):
                    acc = torch.addcmul(v[..., j], acc, tk)
                v = acc
            mean = v.sum(-1) if c > 1 else v.view(n, q)
        if self.linear_dim:
            lin_t = f["linear_t"]  # transposed: see additive_mean_dense
            if self.quadratic:
                mean = mean + self._linear_features(x) @ lin_t.T
            else:
                mean = mean + torch.addmm(lin_t[:, -1:], lin_t[:, :-1], x.T).T
        return mean, outside

    def _mean_chunk(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The mean of one chunk and the count of points clamped onto the grid: the fused
        gather, or with ``compiled_mean`` the compiled dense kernel (its tanh features lie
        inside the grid: nothing is clamped)."""
        if not self.compiled_mean:
            return self._fused_mean(x)
        with compile_errors("WISKI: compiled_mean", "compiled_mean=False", LearnerError):
            mean = _compiled_additive_mean()(x, *self._dense_operands())
        return mean, self._zero

    def _dense_operands(self) -> tuple[Tensor, ...]:
        """:func:`additive_mean_dense`'s operands after ``x`` (from :meth:`_mean_tables`)."""
        f = self._fast
        return f["proj_t"], f["shift"], f["offset"], f["inv_spacing"], f["nodes"], f["coef_t"], f["linear_t"]

    def mean_program(self) -> MeanProgram | None:
        """With ``compiled_mean``, :func:`additive_mean_dense` and the current mean cache's
        operands (refreshed first when an update made them stale); otherwise None."""
        if not self.compiled_mean:
            return None
        if not self.initialized:
            raise LearnerError("WISKI.mean_program: no data yet (call pretrain or observe first)")
        if self._stale:
            self._refresh()
        return MeanProgram(additive_mean_dense, self._dense_operands())

    def _check_predict(self, x: Tensor, where: str) -> None:
        if not self.initialized:
            raise LearnerError(f"WISKI.{where}: no data yet (call pretrain or observe first)")
        if self._stale:
            self._refresh()

    @torch.no_grad()
    def predict_mean(self, x: Tensor) -> Tensor:
        """Latent predictive mean only (eq. (9) / (14)), ``[..., P]``: no variance arithmetic.

        Per chunk of ``predict_chunk`` points one fused gather over the mean cache's patch
        table (:meth:`_fused_mean`), or the compiled dense kernel (``compiled_mean``); equal to
        ``predict(x)[0]`` up to rounding.
        """
        self._check_predict(x, "predict_mean")
        lead = x.shape[:-1]
        xf = x.reshape(-1, self.input_dim)
        means = []
        for start in range(0, xf.shape[0], self.predict_chunk):
            mean, outside = self._mean_chunk(xf[start : start + self.predict_chunk])
            self.predict_clamped += outside
            means.append(mean)
        mean = torch.cat(means) if len(means) != 1 else means[0]
        return mean.reshape(*lead, self.output_dim)

    @torch.no_grad()
    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Latent predictive mean (eq. (9)) and variance (eq. (10)), ``[..., P]`` each."""
        self._check_predict(x, "predict")
        lead = x.shape[:-1]
        xf = x.reshape(-1, self.input_dim)
        m, p = self.num_inducing, self.output_dim
        # fewer points than basis functions, right after a refresh: their variance from the refresh's factor,
        # sigma^2 |L^{-1} S phi|^2 or sigma^2 phi^T B^{-1} (K phi) (LU), O(P N M^2), rather than first
        # M = B^{-1} K, O(P M^3)
        direct = (self._m_pending and self.structure == "additive" and self.dtype == SOLVE_DTYPE
                  and xf.shape[0] < m)
        if not direct:
            self._variance_cache()
        noise = self.hp.noise.unsqueeze(-1)
        chunk = self.predict_chunk
        if self.structure == "additive":  # the variance is a dense [P, N, M] product here
            chunk = max(1, min(chunk, VARIANCE_BLOCK // (p * m)))
        means, variances = [], []
        mflat = self._m_cache.reshape(p, m * m) if not direct else self._m_cache
        kmul = self._kmul(SOLVE_DTYPE) if direct and self._chol is None else None
        for start in range(0, xf.shape[0], chunk):
            mean, outside = self._mean_chunk(xf[start : start + chunk])  # predict_mean's path
            self.predict_clamped += outside
            means.append(mean)
            idx, w, _ = self._rows(xf[start : start + chunk])
            if self.structure == "additive":
                # sigma^2 phi^T M phi with phi = [w_1..w_C, x, 1] dense: (Phi M) . Phi, O(P N M^2) at BLAS speed
                phi = dense_rows(idx, w, m)  # [Q, N, M]
                if direct and self._chol is not None:  # phi^T S C^{-1} S phi = |L^{-1} S phi|^2
                    low, prior = self._chol
                    sol = torch.linalg.solve_triangular(low, prior.mul(phi.transpose(-1, -2)), upper=False)
                    variances.append((noise * sol.square().sum(-2)).T)
                elif kmul is not None:
                    sol = torch.linalg.lu_solve(*self._lu, kmul(phi.transpose(-1, -2).expand(p, -1, -1).contiguous()))
                    variances.append((noise * (phi.transpose(-1, -2) * sol).sum(-2)).T)
                else:
                    variances.append((noise * ((phi @ self._m_cache) * phi).sum(-1)).T)
            else:
                idx, w = self._per_output(idx), self._per_output(w)  # [P, N, K]
                pair = (idx.unsqueeze(-1) * m + idx.unsqueeze(-2)).flatten(1)
                mg = mflat.gather(1, pair).view(*w.shape, w.shape[-1])
                variances.append((noise * torch.einsum("pnk,pnkl,pnl->pn", w, mg, w)).T)
        mean = torch.cat(means) if means else xf.new_zeros(0, p)
        var = torch.cat(variances).clamp_min(0.0) if variances else xf.new_zeros(0, p)
        if self.calibrate_rows:  # for _predict_again
            self._last_predict.put(x, (self._fast, mean.clone(), var))
        var = var * self.variance_scale
        return mean.reshape(*lead, p), var.reshape(*lead, p)

    @torch.no_grad()
    def vlb(self, x: Tensor, y: Tensor) -> Tensor:
        """Held-out log marginal likelihood per point, ``log p(y | x, data) / N``, ``[P]``.

        The difference of eq. (13) with and without the batch in the caches; the learner
        is not changed. ``O(P (N K^2 + M^3))``.
        """
        if not self.initialized:
            raise LearnerError("WISKI.vlb: no data yet (call pretrain or observe first)")
        idx, w, _ = self._rows(x)
        new_gram, new_wty = self._caches_of(idx, w, y)
        gram = self.gram + new_gram
        wty = self.wty + new_wty
        yty = self.yty + (y * y).sum(dim=0)
        after = self._mll(gram, wty, yty, self.n + x.shape[0])
        before = self.mll() if self.n > 0 else torch.zeros_like(after)
        return ((after - before) / x.shape[0]).to(self.dtype)

    def noise_variance(self) -> Tensor:
        return self.hp.noise.detach() * self.variance_scale

    def checks_values_on_device(self, method: str) -> bool:
        # validate=False: observe promises no host sync, once the first data have set the grid
        if method == "observe" and self.initialized and not self.validate:
            return False
        return super().checks_values_on_device(method)

    # -- the paper's protocol ------------------------------------------------------------------
    def pretrain(self, x: Tensor, y: Tensor, iterations: int | None = None, progress: bool = True) -> dict[str, float]:
        """Batch phase of WISKI Sec. 5.1 / App. C: fit on ``x, y`` (the first 5% of the stream).

        Initialises everything from the batch, takes ``iterations`` (default
        ``pretrain_iters``) Adam steps on eq. (13) with ``pretrain_lr`` /
        ``pretrain_proj_lr``, recomputing all rows each iteration (batch BN statistics),
        then freezes the BN statistics, conditions the caches on the batch and resets the
        online optimiser. Replaces any data observed before.
        """
        iterations = self.pretrain_iters if iterations is None else int(iterations)
        self._initialize(x, y)
        loss = torch.zeros((), dtype=self.dtype, device=self.device)
        if self.learn_hyperparameters and iterations > 0:
            opt = self._make_optimizer(self.pretrain_lr, self.pretrain_proj_lr)
            n = x.shape[0]
            yty = (y * y).sum(dim=0)
            for _ in progress_bar(range(iterations), desc="WISKI pretrain", disable=not progress, leave=False):
                opt.zero_grad()
                idx, w, _ = self._rows(x, batch_stats=True)
                gram, wty = self._caches_of(idx, w, y)
                loss = -self._mll(gram, wty, yty, n).sum() / n
                loss.backward()
                opt.step()
        if self.projection != "none":
            with torch.no_grad():
                self.bn_mean, self.bn_std = _bn_stats(x @ self.proj_weight)
        self.optimizer = self._make_optimizer(self.lr, self.proj_lr)
        self.observe(x, y)
        return {"loss": float(loss.detach()), "iterations": float(iterations)}

    def learn_stream(
        self,
        x: Tensor,
        y: Tensor,
        pretrain_fraction: float = 0.05,
        callback: Callable[[int, dict[str, float]], None] | None = None,
        progress: bool = True,
    ) -> None:
        """WISKI Algorithm 1 on a stream: pretrain on the first fraction, then per point observe + step."""
        if not 0.0 <= pretrain_fraction < 1.0:
            raise LearnerError(f"WISKI.learn_stream: pretrain_fraction must be in [0, 1), got {pretrain_fraction}")
        n0 = max(1, int(round(pretrain_fraction * x.shape[0]))) if pretrain_fraction > 0 else 0
        if n0:
            self.pretrain(x[:n0], y[:n0], progress=progress)
        for t in progress_bar(range(n0, x.shape[0]), desc="WISKI stream", disable=not progress):
            self.observe(x[t : t + 1], y[t : t + 1])
            metrics = self.step(x[t : t + 1], y[t : t + 1])
            if callback is not None:
                callback(t, metrics)

    # -- hyperparameters -------------------------------------------------------------------------
    def set_hyperparameters(self, **values: Any) -> None:
        """Set lengthscale / amplitude / noise (and ``linear`` with the additive structure);
        the caches do not depend on them."""
        self.hp.set(**values)
        self._stale = True

    def diagnostics(self) -> dict[str, float]:
        """Points clamped onto the grid edge so far (by observe, by predict)."""
        return {"observe_clamped": float(self.observe_clamped), "predict_clamped": float(self.predict_clamped)}

    # -- checkpoints -----------------------------------------------------------------------------
    def state_names(self) -> tuple[str, ...]:
        # step_calls (where the step_every cycle stands) only when steps are skipped: older checkpoints load as before
        return (self.state_fields + (self.PROJECTION_FIELDS if self.proj_params else ())
                + (("step_calls",) if self.step_every > 1 else ()))

    @property
    def grid_state(self) -> dict[str, Any] | None:
        """The grid as checkpoint data (None until the first data sets it, when no bounds were given)."""
        return None if self.grid is None else self.grid.state_dict()

    @grid_state.setter
    def grid_state(self, state: Mapping[str, Any] | None) -> None:
        self.grid = None if state is None else Grid.from_state(state, self.device, self.dtype)

    def _state_shapes(self, state: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        # the grid is None until the first data: its own layout is checked here
        grid, where = state["grid_state"], "WISKI.load_state_dict: grid_state"
        if grid is None:
            return {}
        if not isinstance(grid, Mapping) or set(grid) != {"lower", "spacing", "sizes"}:
            raise LearnerError(f"{where}: expected a dict of lower, spacing and sizes")
        if tuple(grid["sizes"]) != self.grid_sizes:
            raise LearnerError(f"{where}.sizes: {grid['sizes']}, expected {list(self.grid_sizes)}")
        for key in ("lower", "spacing"):
            if not isinstance(grid[key], Tensor) or tuple(grid[key].shape) != (self.grid_dim,):
                raise LearnerError(f"{where}.{key}: shape {tuple(getattr(grid[key], 'shape', ()))}, "
                                   f"expected ({self.grid_dim},)")
        return {}

    def _after_load(self) -> None:
        self._stale = True


#: rows a WISKI learner that predicts after every transition takes by the Woodbury identity between full
#: refreshes of its posterior (:func:`for_control`)
CONTROL_INCREMENTAL_ROWS = 1000


def for_control(learner: Learner) -> None:
    """Ready ``learner`` for a controller, which predicts after every transition: a WISKI (or a wrapper's
    ``base`` WISKI, :class:`gpdyn.gp.prior_mean.WithPriorMean`) that has no ``incremental_rows`` of its own then
    keeps its posterior current by rank-q Woodbury updates, :data:`CONTROL_INCREMENTAL_ROWS` rows between full
    refreshes, instead of a full ``O(P M^3)`` solve at every prediction. Other learners are left as they are."""
    inner = getattr(learner, "base", learner)
    if isinstance(inner, WISKI) and inner.incremental_rows == 0:
        inner.incremental_rows = inner.config["incremental_rows"] = CONTROL_INCREMENTAL_ROWS
