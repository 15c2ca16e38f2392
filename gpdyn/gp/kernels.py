"""Kernels batched over P outputs.

Shapes: inputs ``[P, N, D]`` (or ``[N, D]``, broadcast to every output), lengthscales
``[P, D]``, amplitudes (signal variances) ``[P]``. Results ``[P, N, M]``.

Speed and memory. Between an input (c = 1) and a basis, the log of the generalized
SE-ARD kernel of SVDGP eq. (15) is an inner product of short feature vectors
(:func:`point_features`), so a kernel matrix costs one matmul and one ``exp``. The big
kernel-times-vector products of the learners (``K_{X,alpha} a`` of SVDGP eq. (8), the
column-sampled ``a^T K_alpha a`` of eq. (9), ``K_{beta,gamma} a_gamma`` of ORTHDGP)
go through :func:`kernel_matvec`: a hand-written backward that works in column
chunks, so no ``[P, N, M]`` tensor is ever stored and memory stays linear in M.

Prediction (no gradient) goes through :func:`exp2_matvec` on base-2 features: the basis
side is scaled by ``log2(e)`` once, when a learner caches its features
(``basis_features(..., base2=True)``), so each kernel entry costs one ``exp2``, which is
cheaper than ``exp`` on the CPU (docs/results/implementation-timings.md), and the kernel
is built in blocks of test points and basis functions that stay in the cache through the
matmul, the ``exp2`` and the matvec (:data:`PREDICT_BLOCK_ELEMENTS`). Where the kernel
is the same for every output (equal length scales, amplitudes and bases:
:func:`same_across_outputs`), one block serves all P outputs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from gpdyn.gp import native

#: elements of one ``[P, N, chunk]`` kernel block in :func:`kernel_matvec` (8 MiB of float64):
#: each block goes through about ten passes, so blocks sized to stay in the L2/L3 caches
#: (docs/results/implementation-timings.md has the comparison with larger blocks)
CHUNK_ELEMENTS = 2**20
#: elements of one ``[P, rows, cols]`` block in :func:`exp2_matvec` (prediction): 2 MiB of
#: float32 (227 test points x 256 basis functions x 9 outputs), larger than one L2 so that
#: the per-block dispatch of the three torch calls is amortised while the block stays in
#: L3 (the block sizes compared: docs/results/implementation-timings.md)
PREDICT_BLOCK_ELEMENTS = 2**19
#: basis functions per block of :func:`exp2_matvec` (the matmul's output width)
PREDICT_BLOCK_COLUMNS = 256
#: ``exp(s) = exp2(s log2(e))``
LOG2E = 1.0 / math.log(2.0)


def se_ard(x1: Tensor, x2: Tensor, lengthscale: Tensor, amplitude: Tensor) -> Tensor:
    """SE-ARD kernel ``s^2 exp(-||(x1 - x2)/l||^2 / 2)`` (SVDGP eq. (14)), ``[P, N, M]``."""
    u, v = point_features(x1, x2, None, lengthscale, amplitude)
    return torch.exp(u @ v.transpose(-1, -2))


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


def input_features(x: Tensor, lengthscale: Tensor, per_dim: bool = False) -> Tensor:
    """The input side ``U [P, N, R]`` of :func:`point_features` (``per_dim``: the basis has
    one factor per dimension). It depends on the data and the length scales only."""
    u = x / lengthscale.unsqueeze(-2)
    u = u.expand(lengthscale.shape[0], *u.shape[-2:])
    ones = torch.ones_like(u[..., :1])
    if per_dim:
        return torch.cat([u * u, u, ones], -1)
    return torch.cat([u, (u * u).sum(-1, keepdim=True), ones], -1)


def basis_features(z: Tensor, c: Tensor | None, lengthscale: Tensor, amplitude: Tensor, base2: bool = False) -> Tensor:
    """The basis side ``V [P, M, R]`` of :func:`point_features` (``c`` None: c = 1).

    ``base2``: scaled by ``log2(e)``, so that ``exp2(U V^T)`` is the kernel
    (:func:`exp2_matvec`, the prediction path)."""
    v = _basis_features(z, c, lengthscale, amplitude)
    return v * LOG2E if base2 else v


def _basis_features(z: Tensor, c: Tensor | None, lengthscale: Tensor, amplitude: Tensor) -> Tensor:
    v = z / lengthscale.unsqueeze(-2)
    v = v.expand(lengthscale.shape[0], *v.shape[-2:])
    log_amp = torch.log(amplitude)[:, None]  # [P, 1]
    if c is None:  # w = 1/2 and no prefactor: plain SE-ARD
        const = log_amp - 0.5 * (v * v).sum(-1)
        return torch.cat([v, torch.full_like(v[..., :1], -0.5), const.unsqueeze(-1)], -1)
    w, logpre = _basis_weights(c)
    if c.shape[-1] == 1:
        const = log_amp + z.shape[-1] * logpre[..., 0] - w[..., 0] * (v * v).sum(-1)
        return torch.cat([2.0 * w * v, -w, const.unsqueeze(-1)], -1)
    const = log_amp + logpre.sum(-1) - (w * v * v).sum(-1)
    return torch.cat([-w, 2.0 * w * v, const.unsqueeze(-1)], -1)


def point_features(x: Tensor, z: Tensor, c: Tensor | None, lengthscale: Tensor, amplitude: Tensor) -> tuple[Tensor, Tensor]:
    """Features ``U [P, N, R]`` of inputs ``x`` (c = 1) and ``V [P, M, R]`` of a basis ``z``
    with factors ``c`` (``None``: c = 1) such that ``k(x_n, z_m) = exp(U_n . V_m)`` for the
    kernel of SVDGP eq. (15) scaled by ``amplitude`` (eq. (14) when c = 1).

    With ``u = x / s``, ``v = z / s`` and ``w = 1/(1 + c^2)`` (per basis function, or per
    basis function and dimension), eq. (15) between a point and a basis function is
    ``log rho^2 + sum_d logpre_d - sum_d w_d (u_d - v_d)^2``; expanding the square
    separates it into ``[u, |u|^2, 1] . [2 w v, -w, log rho^2 + logpre - w |v|^2]``
    (one factor per basis function or none; per dimension ``[u^2, u, 1]`` against
    ``[-w, 2 w v, ...]``). The expanded square is not clamped at zero: at coincident
    points the kernel may exceed its maximum by a rounding error, which nothing
    downstream relies on (the Cholesky factorisations add relative jitter).
    """
    per_dim = c is not None and c.shape[-1] > 1
    return input_features(x, lengthscale, per_dim), basis_features(z, c, lengthscale, amplitude)


def exp_matvec(u: Tensor, v: Tensor, vec: Tensor, chunk_elements: int = CHUNK_ELEMENTS) -> Tensor:
    """``exp(U V^T) vec`` for features of :func:`point_features`, chunked (see :class:`_ExpMatvec`)."""
    p = v.shape[0]
    chunk = _columns_per_chunk(p, u.shape[-2], v.shape[-2], chunk_elements)
    return _ExpMatvec.apply(u.expand(p, *u.shape[-2:]), v, vec.expand(p, v.shape[-2]), chunk)


def same_across_outputs(*tensors: Tensor | None) -> bool:
    """Whether each tensor is the same for every output (equal along its leading axis; None
    passes): then one kernel serves all outputs. It reads values back (a host sync on a
    GPU), so learners ask once per cache rebuild and on the CPU only, never per prediction."""
    return all(t is None or t.shape[0] <= 1 or bool((t == t[:1]).all()) for t in tensors)


def _block_shape(p: int, n: int, m: int, block_elements: int, block_columns: int) -> tuple[int, int]:
    """Rows (test points) and columns (basis functions) of one ``[p, rows, cols]`` block: at
    most ``block_columns`` columns, spread evenly over the column blocks (no narrow last block)."""
    cols = max(1, min(m, block_columns))
    if m > 0:
        cols = -(-m // -(-m // cols))  # e.g. 320 -> two blocks of 160, not 256 + 64
    rows = max(1, min(n, block_elements // max(1, p * cols)))
    return rows, cols


@torch.no_grad()
def exp2_matvec(
    u: Tensor,
    v: Tensor,
    vec: Tensor,
    block_elements: int = PREDICT_BLOCK_ELEMENTS,
    block_columns: int = PREDICT_BLOCK_COLUMNS,
) -> Tensor:
    """``exp2(U V^T) vec`` per output, ``[P, N]``: the kernel-times-vector of prediction.

    ``u [P, N, R]`` input features (:func:`input_features`), ``v [P, M, R]`` base-2 basis
    features (``basis_features(..., base2=True)``), ``vec [P, M]``. Either feature side may
    come without the output axis (``[N, R]``, ``[M, R]``): the same for every output. When
    both do, the kernel is built once and multiplies all P vectors together (one matmul
    against ``vec^T [M, P]`` instead of P matvecs).

    Forward only (no autograd: the learners' gradients go through :func:`kernel_matvec`).
    Blocks of ``[P, rows, cols]`` entries, about ``block_elements`` of them, are formed in
    one reused buffer by a matmul, raised to ``exp2`` in place and multiplied into the
    result while they are in the cache; nothing of size ``N x M`` is stored.

    On the CPU (float32 and float64, no autograd) it goes to the fused native kernel
    (:mod:`gpdyn.gp.native`) instead: the same values to rounding, 1.3-1.6x as fast.
    """
    p, m = vec.shape
    if m == 0 or u.shape[-2] == 0:  # an empty sum, or no points
        return vec.new_zeros(p, u.shape[-2])
    if native.usable(u, v, vec):
        return native.exp2_matvec(u, v, vec)
    if u.dim() == 2 and v.dim() == 2:  # one kernel for every output
        n = u.shape[0]
        rows, cols = _block_shape(1, n, m, block_elements, block_columns)
        out = vec.new_zeros(p, n)
        buf = u.new_empty(rows * cols)
        for lo in range(0, n, rows):
            uc = u[lo : lo + rows]
            oc = out[:, lo : lo + rows]
            for mo in range(0, m, cols):
                vc = v[mo : mo + cols]
                k = buf[: uc.shape[0] * vc.shape[0]].view(uc.shape[0], vc.shape[0])
                torch.mm(uc, vc.transpose(0, 1), out=k).exp2_()
                oc.addmm_(vec[:, mo : mo + cols], k.transpose(0, 1))  # out^T += vec K^T: all outputs at once
        return out
    n = u.shape[-2]
    u = u.expand(p, n, u.shape[-1])
    v = v.expand(p, m, v.shape[-1])
    rows, cols = _block_shape(p, n, m, block_elements, block_columns)
    out = vec.new_empty(p, n)
    buf = u.new_empty(p * rows * cols)
    acc_buf = vec.new_empty(p * rows)
    vec = vec.unsqueeze(-2)  # [P, 1, M]
    for lo in range(0, n, rows):
        uc = u[:, lo : lo + rows]
        acc = acc_buf[: p * uc.shape[1]].view(p, 1, uc.shape[1]).zero_()  # contiguous: one batched gemm, not P
        for mo in range(0, m, cols):
            vc = v[:, mo : mo + cols]
            k = buf[: p * uc.shape[1] * vc.shape[1]].view(p, uc.shape[1], vc.shape[1])
            torch.bmm(uc, vc.transpose(1, 2), out=k).exp2_()
            # as a row vector times K^T: MKL's batched gemv on K itself is several times slower
            acc.baddbmm_(vec[..., mo : mo + cols], k.transpose(1, 2))
        out[:, lo : lo + rows] = acc[:, 0]
    return out


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

    A point against a basis (one side ``None``) costs one matmul and one ``exp``
    (:func:`point_features`). Two bases with one factor each also reduce to a scaled
    distance; two bases with per-dimension factors need a loop over the D dimensions
    (memory ``[P, N, M]`` per dimension), so that form is meant for small bases.
    """
    if c1 is None or c2 is None:
        if c1 is None:
            u, v = point_features(x1, x2, c2, lengthscale, amplitude)
            return torch.exp(u @ v.transpose(-1, -2))
        u, v = point_features(x2, x1, c1, lengthscale, amplitude)
        return torch.exp(v @ u.transpose(-1, -2))
    if c1.shape[-1] == 1 and c2.shape[-1] == 1:
        # log k = e1 + e2 - (D/2) log t - q / t with t = c1^2 + c2^2 and q the scaled squared
        # distance from one feature matmul (see _PairMatvec): 8 passes over [P, N, M]
        # and 4 tensors kept for autograd, where the direct form took about twice as many
        a, b, t1, t2, e1, e2, h = _pair_inputs(x1, x2, lengthscale, amplitude, c1, c2)
        t = t1.unsqueeze(-1) + t2.unsqueeze(-2)
        q = a @ b.transpose(-1, -2)
        return torch.exp(e1.unsqueeze(-1) + e2.unsqueeze(-2) - h * torch.log(t) - q / t)
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


# -- kernel times vector, chunked, with hand-written backward -----------------------------
def _columns_per_chunk(p: int, n: int, m: int, chunk_elements: int) -> int:
    return max(1, min(m, chunk_elements // max(1, p * n)))


#: right-hand columns up to which :func:`matmul_few_columns` takes the transposed product
FEW_COLUMNS = 16


def matmul_few_columns(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for ``a [..., N, C]`` and ``b [..., C, q]`` with few columns, as ``(b^T a^T)^T``.

    On the CPU, BLAS takes a row-major product with 2-16 right-hand columns, and a batched one with
    a single column, 2-8x slower than the same product transposed (a row block times the
    transposed matrix; docs/results/implementation-timings.md). The result is the transposed view.
    """
    if b.shape[-1] > FEW_COLUMNS:
        return a @ b
    return torch.matmul(b.transpose(-1, -2), a.transpose(-1, -2)).transpose(-1, -2)


def _mv(k: Tensor, v: Tensor) -> Tensor:
    """``k @ v`` for ``k [P, N, C]``, ``v [P, C]`` (:func:`matmul_few_columns`)."""
    return matmul_few_columns(k, v.unsqueeze(-1)).squeeze(-1)


def _tmv(k: Tensor, g: Tensor) -> Tensor:
    """``k^T g`` for ``k [P, N, C]``, ``g [P, N]``: ``[P, C]``."""
    return torch.matmul(g.unsqueeze(-2), k).squeeze(-2)


def _tmm(k: Tensor, g: Tensor) -> Tensor:
    """``k^T g`` for ``g [P, N, R]``: ``[P, C, R]``, as ``(g^T k)^T`` (no transposed big operand)."""
    return torch.matmul(g.transpose(-1, -2), k).transpose(-1, -2)


class _ExpMatvec(torch.autograd.Function):
    """``y = exp(A B^T) v`` for ``A [P, N, R]``, ``B [P, M, R]``, ``v [P, M]``: ``[P, N]``.

    With ``K = exp(A B^T)`` and the incoming gradient ``g``, the gradient of the
    exponent is ``G = diag(g) K diag(v)`` (rank one per kernel entry), so

        dA = diag(g) K (diag(v) B),   dB = diag(v) K^T (diag(g) A),   dv = K^T g

    i.e. two matmuls against K per chunk and no elementwise pass over ``[P, N, M]``
    besides the ``exp``. K is recomputed chunk by chunk rather than stored.
    """

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, v: Tensor, chunk: int) -> Tensor:  # type: ignore[override]
        y = a.new_zeros(a.shape[:-1])
        for lo in range(0, b.shape[-2], chunk):
            k = torch.matmul(a, b[:, lo : lo + chunk].transpose(-1, -2)).exp_()
            y.add_(_mv(k, v[:, lo : lo + chunk]))
        ctx.save_for_backward(a, b, v)
        ctx.chunk = chunk
        return y

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        a, b, v = ctx.saved_tensors
        chunk = ctx.chunk
        r = a.shape[-1]
        need_a, need_b, need_v = ctx.needs_input_grad[:3]
        acc_a = torch.zeros_like(a) if need_a else None
        grad_b = torch.empty_like(b) if need_b else None
        grad_v = torch.empty_like(v) if (need_v or need_b) else None
        ga = torch.cat([a * g.unsqueeze(-1), g.unsqueeze(-1)], -1) if need_b else g.unsqueeze(-1)  # [P, N, R+1]
        for lo in range(0, b.shape[-2], chunk):
            hi = min(b.shape[-2], lo + chunk)
            bc, vc = b[:, lo:hi], v[:, lo:hi]
            k = torch.matmul(a, bc.transpose(-1, -2)).exp_()
            if need_a:
                acc_a.baddbmm_(k, vc.unsqueeze(-1) * bc)
            if need_b or need_v:
                t = _tmm(k, ga)  # [P, C, R+1]: K^T (g A), K^T g
                grad_v[:, lo:hi] = t[..., -1]
                if need_b:
                    grad_b[:, lo:hi] = vc.unsqueeze(-1) * t[..., :r]
        grad_a = g.unsqueeze(-1) * acc_a if need_a else None
        return grad_a, grad_b, grad_v if need_v else None, None


def _pair_block(a, b, t1, t2, e1, e2, h):
    """Kernel block ``k``, ``t`` and ``q / t`` of :class:`_PairMatvec` for one column chunk."""
    q = torch.matmul(a, b.transpose(-1, -2))
    t = t1.unsqueeze(-1) + t2.unsqueeze(-2)
    logk = e1.unsqueeze(-1) + e2.unsqueeze(-2)
    logk.sub_(torch.log(t), alpha=h)
    q.div_(t)
    logk.sub_(q)
    return logk.exp_(), t, q


def _pair_sweep(a, b, t1, t2, e1, e2, v, g, h, chunk):
    """One sweep over the column chunks giving ``y = K v`` and the gradients of ``g . y``
    with respect to ``(a, b, t1, t2, e1, e2, v)`` (formulas in :class:`_PairMatvec`)."""
    r = a.shape[-1]
    y = torch.zeros_like(t1)
    acc_a = torch.zeros_like(a)  # -Q (v B), summed over chunks
    acc_t1 = torch.zeros_like(t1)  # R v - h Q v
    grad_b, grad_t2, grad_e2, grad_v = (torch.empty_like(b), torch.empty_like(t2), torch.empty_like(e2), torch.empty_like(v))
    ga = torch.cat([a * g.unsqueeze(-1), g.unsqueeze(-1)], -1)  # [P, N, R+1]
    for lo in range(0, b.shape[-2], chunk):
        hi = min(b.shape[-2], lo + chunk)
        bc, vc = b[:, lo:hi], v[:, lo:hi]
        k, t, qt = _pair_block(a, bc, t1, t2[:, lo:hi], e1, e2[:, lo:hi], h)
        y.add_(_mv(k, vc))
        ktg = _tmv(k, g)  # K^T g
        grad_v[:, lo:hi] = ktg
        grad_e2[:, lo:hi] = vc * ktg
        qm = k.div_(t)  # Q
        vb = torch.cat([vc.unsqueeze(-1) * bc, vc.unsqueeze(-1)], -1)
        qv = torch.matmul(qm, vb)  # [P, N, R+1]: Q (v B), Q v
        acc_a.sub_(qv[..., :r])
        qtg = _tmm(qm, ga)  # [P, C, R+1]: Q^T (g A), Q^T g
        grad_b[:, lo:hi] = -vc.unsqueeze(-1) * qtg[..., :r]
        rm = qm.mul_(qt)  # R = Q q / t
        acc_t1.add_(_mv(rm, vc) - h * qv[..., r])
        grad_t2[:, lo:hi] = vc * (_tmv(rm, g) - h * qtg[..., r])
    grads = (g.unsqueeze(-1) * acc_a, grad_b, g * acc_t1, grad_t2, g * y, grad_e2, grad_v)
    return y, grads


class _PairMatvec(torch.autograd.Function):
    """``y_n = sum_j k_nj v_j`` for SVDGP eq. (15) between two bases with one factor each.

    ``log k_nj = e1_n + e2_j - h log t_nj - q_nj / t_nj``, ``t_nj = t1_n + t2_j`` (the
    squared factors ``c^2``), ``q = A B^T`` (the scaled squared distance, from features
    ``[u, |u|^2, 1]`` and ``[-2v, 1, |v|^2]``), ``h = D/2``, ``e1 = log rho^2 + h log(2 c1)``,
    ``e2 = h log c2``. With ``G_nj = g_n k_nj v_j``, ``Q = K / t`` and ``R = Q q / t``:

        dA = -diag(g) Q (diag(v) B),      dB = -diag(v) Q^T (diag(g) A)
        dt1 = g (R v - h Q v),            dt2 = v (R^T g - h Q^T g)
        de1 = g y,   de2 = v (K^T g),     dv = K^T g

    computed in column chunks with the block recomputed (memory linear in M). The
    distance is not clamped at zero: its gradient at coincident points vanishes anyway.
    """

    @staticmethod
    def forward(ctx, a, b, t1, t2, e1, e2, v, h, chunk):  # type: ignore[override]
        y = torch.zeros_like(t1)
        for lo in range(0, b.shape[-2], chunk):
            sl = slice(lo, lo + chunk)
            k, _, _ = _pair_block(a, b[:, sl], t1, t2[:, sl], e1, e2[:, sl], h)
            y.add_(_mv(k, v[:, sl]))
        ctx.save_for_backward(a, b, t1, t2, e1, e2, v)
        ctx.h, ctx.chunk = h, chunk
        return y

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        a, b, t1, t2, e1, e2, v = ctx.saved_tensors
        _, grads = _pair_sweep(a, b, t1, t2, e1, e2, v, g, ctx.h, ctx.chunk)
        return (*grads, None, None)


class _PairQuadratic(torch.autograd.Function):
    """``s = w . (K v)`` per output (``[P]``) for the kernel of :class:`_PairMatvec`.

    The incoming gradient is one scalar per output, so the gradients are those of
    :class:`_PairMatvec` with ``g = w`` times that scalar: they are computed in the same
    sweep as the value, and the kernel is evaluated once instead of twice.
    """

    @staticmethod
    def forward(ctx, a, b, t1, t2, e1, e2, v, w, h, chunk):  # type: ignore[override]
        if not any(ctx.needs_input_grad):  # no gradient wanted (e.g. vlb): the value alone
            y = _PairMatvec.forward(ctx, a, b, t1, t2, e1, e2, v, h, chunk)
            return (w * y).sum(-1)
        with torch.no_grad():
            y, grads = _pair_sweep(a, b, t1, t2, e1, e2, v, w, h, chunk)
        ctx.save_for_backward(*grads, y)
        return (w * y).sum(-1)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        *grads, y = ctx.saved_tensors
        scaled = [gr * g.view(-1, *([1] * (gr.dim() - 1))) for gr in grads]
        return (*scaled, g.unsqueeze(-1) * y, None, None)


def _pair_inputs(x1, x2, lengthscale, amplitude, c1, c2):
    """Arguments of :class:`_PairMatvec` for bases ``x1``, ``x2`` with one factor each."""
    p = lengthscale.shape[0]
    ls = lengthscale.unsqueeze(-2)
    u1 = (x1 / ls).expand(p, x1.shape[-2], -1)
    u2 = (x2 / ls).expand(p, x2.shape[-2], -1)
    a = torch.cat([u1, (u1 * u1).sum(-1, keepdim=True), torch.ones_like(u1[..., :1])], -1)
    b = torch.cat([-2.0 * u2, torch.ones_like(u2[..., :1]), (u2 * u2).sum(-1, keepdim=True)], -1)
    h = 0.5 * x1.shape[-1]
    lc1, lc2 = torch.log(c1[..., 0]), torch.log(c2[..., 0])
    e1 = torch.log(amplitude)[:, None] + h * (math.log(2.0) + lc1)
    return a, b, torch.exp(2.0 * lc1), torch.exp(2.0 * lc2), e1, h * lc2, h


def kernel_quadratic(
    x1: Tensor,
    x2: Tensor,
    lengthscale: Tensor,
    amplitude: Tensor,
    w: Tensor,
    v: Tensor,
    c1: Tensor | None = None,
    c2: Tensor | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> Tensor:
    """``w^T K(x1, x2) v`` per output, ``[P]``, for ``w [P, N]``, ``v [P, M]``: the
    column-sampled ``a^T K_alpha a`` of SVDGP eq. (9) and Section 3.4.

    Two bases with one factor each go through :class:`_PairQuadratic` (value and
    gradients in one sweep); anything else is ``w . kernel_matvec(...)``.
    """
    if x1.shape[-2] > x2.shape[-2]:
        # K(x1, x2) = K(x2, x1)^T: chunk over the larger set so that blocks keep many
        # columns (the sampled a^T K_{:,J} a_J has M_alpha rows and only N_c columns)
        x1, x2, w, v, c1, c2 = x2, x1, v, w, c2, c1
    if c1 is not None and c2 is not None and c1.shape[-1] == 1 and c2.shape[-1] == 1:
        p = lengthscale.shape[0]
        chunk = _columns_per_chunk(p, x1.shape[-2], x2.shape[-2], chunk_elements)
        a, b, t1, t2, e1, e2, h = _pair_inputs(x1, x2, lengthscale, amplitude, c1, c2)
        return _PairQuadratic.apply(a, b, t1, t2, e1, e2, v.expand(p, -1), w.expand(p, -1), h, chunk)
    return (w * kernel_matvec(x1, x2, lengthscale, amplitude, v, c1, c2, chunk_elements)).sum(-1)


def shared_kernel_matmul(
    x1: Tensor,
    x2: Tensor,
    lengthscale: Tensor,
    v: Tensor,
    c1: Tensor | None = None,
    c2: Tensor | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> Tensor:
    """``K_1(x1, x2) v_p`` for every row of ``v [P, M]``: ``[P, N]``, where ``K_1`` is the
    unit-amplitude kernel of SVDGP eq. (15) (eq. (14) for c = 1) with ``lengthscale [1, D]``,
    one kernel for every output; ``x1 [N, D]``, ``x2 [M, D]``, factors ``c1 [N, K]``, ``c2 [M, K]``.

    The training path of a shared-kernel learner: each kernel entry is computed once for all
    P outputs (a ``[N, C] x [C, P]`` matmul per block) instead of once per output as
    :func:`kernel_matvec` on ``[P, ...]`` views would. Differentiable in everything through
    autograd on blocks of :func:`gen_se_ard`; with more than one block of ``chunk_elements``
    entries each block is recomputed in the backward pass (``torch.utils.checkpoint``), so that
    memory stays one block, not ``N x M``.
    """
    n, m = x1.shape[-2], x2.shape[-2]
    if m == 0 or n == 0:
        return v.new_zeros(v.shape[0], n) + 0.0 * v.sum()  # keeps v in the graph
    one = torch.ones(1, dtype=lengthscale.dtype, device=lengthscale.device)
    e1 = None if c1 is None else c1.unsqueeze(0)

    def block(x2c: Tensor, c2c: Tensor | None, vc: Tensor) -> Tensor:
        k = gen_se_ard(x1.unsqueeze(0), x2c.unsqueeze(0), lengthscale, one, e1, None if c2c is None else c2c.unsqueeze(0))
        return vc @ k[0].transpose(0, 1)

    chunk = max(1, min(m, chunk_elements // max(1, n)))
    if chunk >= m:
        return block(x2, c2, v)
    out = None
    for lo in range(0, m, chunk):
        sl = slice(lo, lo + chunk)
        part = checkpoint(block, x2[sl], None if c2 is None else c2[sl], v[:, sl], use_reentrant=False)
        out = part if out is None else out + part
    return out


def kernel_matvec(
    x1: Tensor,
    x2: Tensor,
    lengthscale: Tensor,
    amplitude: Tensor,
    v: Tensor,
    c1: Tensor | None = None,
    c2: Tensor | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> Tensor:
    """``gen_se_ard(x1, x2, ...) @ v`` for ``v [P, M]``: ``[P, N]``, differentiable in everything.

    Works in blocks of ``chunk_elements`` kernel entries and never stores ``[P, N, M]``:
    one side an ordinary input (or c = 1) goes through :class:`_ExpMatvec`, two bases
    with one factor each through :class:`_PairMatvec`; two bases with per-dimension
    factors fall back to blocks of :func:`gen_se_ard` under autograd.
    """
    p = lengthscale.shape[0]
    n, m = x1.shape[-2], x2.shape[-2]
    chunk = _columns_per_chunk(p, n, m, chunk_elements)
    v = v.expand(p, m)
    if c1 is None or c2 is None:
        if c1 is None:
            a, b = point_features(x1, x2, c2, lengthscale, amplitude)
        else:
            b, a = point_features(x2, x1, c1, lengthscale, amplitude)
        return _ExpMatvec.apply(a, b.expand(p, *b.shape[-2:]), v, chunk)
    if c1.shape[-1] == 1 and c2.shape[-1] == 1:
        a, b, t1, t2, e1, e2, h = _pair_inputs(x1, x2, lengthscale, amplitude, c1, c2)
        return _PairMatvec.apply(a, b, t1, t2, e1, e2, v, h, chunk)
    out = []
    for lo in range(0, m, chunk):
        sl = slice(lo, lo + chunk)
        out.append(gen_se_ard(x1, x2[..., sl, :], lengthscale, amplitude, c1, c2[:, sl]) @ v[:, sl].unsqueeze(-1))
    return torch.stack(out, 0).sum(0).squeeze(-1)
