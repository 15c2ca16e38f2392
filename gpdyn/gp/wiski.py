"""WISKI: Woodbury inversion with structured kernel interpolation (Stanton et al. 2021).

Exact inference under the SKI kernel ``W K_UU W^T`` (WISKI Sec. 3.2), conditioned online
from caches whose size does not depend on the number of points ``n``: ``A = W^T W``
``[m, m]``, ``v = W^T y`` ``[P, m]``, ``y^T y`` ``[P]`` and ``n`` (WISKI eqs. (7), (16),
(17)). Every quantity of the model comes from those caches and the hyperparameters:

- WISKI eqs. (5)-(6): ``M = (sigma^2 K_UU^{-1} + A)^{-1}``. We never form ``K_UU^{-1}``
  (the SE Gram matrix on a grid is numerically singular, WISKI Sec. 4); instead
  ``M = B^{-1} K_UU`` with ``B = sigma^2 I + K_UU A``, which is eq. (11) with the full
  root ``A = L L^T`` (``r = m``) pushed through the Woodbury identity. By Sylvester's
  determinant identity ``log|B| = m log sigma^2 + log|Q|`` with ``Q`` of eq. (12).
- Log marginal likelihood, eq. (8) / (13):
  ``-(y^T y - v^T M v) / (2 sigma^2) - (log|B| - m log sigma^2) / 2 - n log(sigma^2) / 2 - n log(2 pi) / 2``.
- Predictive mean eq. (9) / (14): ``w(x)^T M v``; latent variance eq. (10) / (15):
  ``sigma^2 w(x)^T M w(x)``, read from ``M`` at the ``4^d x 4^d`` entries that the
  sparse row touches.

Why the full ``A`` rather than the paper's rank-``r`` root ``L`` with the ``J``
pseudo-inverse update (WISKI Sec. 4.2, App. A.3): that update only rotates within the
range of ``L``, so while ``W^T W`` is singular (any grid cell not yet visited) a new
point's component outside the range is lost. Adding ``w w^T`` into ``A`` is exact and
costs ``O(16^d)`` per point.

Costs (``P`` outputs, ``m`` grid points, ``d`` interpolated dimensions, ``D`` inputs),
none depending on ``n``:

- ``observe`` of ``q`` points: ``O(P q (D d + 16^d))`` (interpolation rows and scatter
  into the caches).
- ``step``: ``O(P m^2 sum_k g_k)`` for ``K_UU A`` by Kronecker mode products, plus one LU
  of ``B``, ``O(P m^3)``; the LU dominates (m = 256: ~1e7 flops per output).
- ``predict`` of ``N`` points: ``O(P N 16^d)`` after a cache refresh (``M``, ``M v``:
  one LU and solve, ``O(P m^3)``) once per hyperparameter change.

Memory: ``O(P m^2)``; ``m = prod(grid sizes)`` grows as ``g^d``, so inputs with more than
two dimensions go through a learned projection to ``proj_dim`` (default 2): linear map,
batch normalisation (statistics fixed after pretraining), ``tanh`` into ``[-1, 1]``
(WISKI Sec. 5.1). Its parameters are trained with the new-point gradient of WISKI eq.
(18): only the rows of the newest batch depend on them, the rows already in the caches
stay as they were.

Online protocol (WISKI Algorithm 1), in the interface of docs/architecture.md: ``observe(x, y)`` adds
the rows to the caches, then ``step(x, y)`` takes one Adam step on ``theta`` (eq. (13))
and ``phi`` (eq. (18), ``x, y`` being the batch just observed). :meth:`WISKI.pretrain`
is the batch phase on the first 5% of the stream; :meth:`WISKI.learn_stream` runs the
whole protocol point by point.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from gpdyn.gp.base import LOG_2PI, Learner, LearnerError
from gpdyn.gp.hyperparams import SEHyperparameters
from gpdyn.gp.ski import (
    Grid,
    GridError,
    interp_weights,
    kron_dense,
    kron_matmul,
    scatter_gram,
    scatter_rhs,
    toeplitz_factors,
)

PROJECTIONS = ("auto", "none", "shared", "per-output")


def _bn_stats(a: Tensor) -> tuple[Tensor, Tensor]:
    """Batch-norm statistics ``(mean, std)`` ``[Q, d]`` of projected inputs ``a [Q, N, d]``."""
    return a.mean(dim=1), (a.var(dim=1, unbiased=False) + 1e-5).sqrt()


class _LogdetSolve(torch.autograd.Function):
    """``(log|B|, B^{-1} R)`` from one LU, with a hand-written backward.

    torch's generic ``lu_factor`` backward costs several ``m^3`` passes; here the
    gradient is ``d log|B| = B^{-T}`` and ``dX = -B^{-T} g X^T``: one solve against
    ``[I, g]``. ``B = sigma^2 I + K A`` has real eigenvalues ``>= sigma^2``, so
    ``det B > 0`` and ``log|B|`` is the sum of ``log|U_ii|``.
    """

    @staticmethod
    def forward(ctx: Any, b: Tensor, rhs: Tensor) -> tuple[Tensor, Tensor]:
        lu, piv = torch.linalg.lu_factor(b)
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
    factors: list[Tensor], amplitude: Tensor, noise: Tensor, gram: Tensor, wty: Tensor, yty: Tensor, n: int
) -> Tensor:
    """Log marginal likelihood of the SKI GP from the caches (WISKI eqs. (8), (13)), ``[P]``.

    ``factors``/``amplitude``: ``K_UU`` in Kronecker form; ``noise [P]``; ``gram`` =
    ``W^T W`` ``[Q, m, m]`` (Q = 1 or P); ``wty`` = ``W^T y`` ``[P, m]``; ``yty [P]``.
    Differentiable in the hyperparameters and in the caches (for eq. (18)).
    """
    p, m = wty.shape
    eye = torch.eye(m, dtype=wty.dtype, device=wty.device)
    b = noise[:, None, None] * eye + kron_matmul(factors, amplitude, gram)
    logdet_b, mv = _LogdetSolve.apply(b, kron_matmul(factors, amplitude, wty.unsqueeze(-1)))
    quad = yty - (wty * mv.squeeze(-1)).sum(-1)
    log_noise = noise.log()
    return -0.5 * quad / noise - 0.5 * (logdet_b - m * log_noise) - 0.5 * n * log_noise - 0.5 * n * LOG_2PI


class WISKI(Learner):
    """Online SKI GP with constant-time updates, batched over P outputs.

    Options (all keyword):
        grid_size: grid points per interpolated dimension, int or one per dimension
            (default 16: m = 256 in 2-D).
        projection: ``"auto"`` (``"none"`` for ``input_dim <= 2``, else ``"per-output"``),
            ``"none"``, ``"shared"`` (one projection for all outputs) or ``"per-output"``.
        proj_dim: dimension of the projected features (default 2).
        bounds: ``(lo, hi)`` of the inputs without projection (scalars or per dimension);
            default: the range of the first batch (pretraining data). With a projection
            the features lie in ``[-1, 1]``.
        margin: the grid interior extends the bounds by this fraction of their width on
            each side (default 0.1).
        out_of_grid: ``"clamp"`` (default: clamp onto the grid edge and warn in
            ``observe``) or ``"error"`` (raise GridError in ``observe``). ``predict``
            always clamps (no host sync) and counts such points in ``predict_clamped``.
        lr, proj_lr: Adam learning rates of the online steps for the kernel
            hyperparameters and the projection (default 5e-3, 5e-4; WISKI Table C.1).
        pretrain_lr, pretrain_proj_lr, pretrain_iters: the batch phase (5e-2, 5e-3, 200).
        noise_floor: added to the noise variance (default 1e-6 in float64, 1e-4 otherwise).
        learn_hyperparameters: False keeps the hyperparameters fixed.
        validate: True (default) checks ``observe`` inputs for NaN/inf and out-of-grid
            points with one host sync per call; False skips the checks (no sync).
        predict_chunk: test points per gather block in ``predict`` (default 4096).
    """

    name = "wiski"
    capabilities = frozenset({"pretrain", "step_on_observed"})
    # small: the WISKI paper's 16 points per projected dimension (m = 256); cpu the same;
    # paper: the grid of the SVDGP Table 2 replays (docs/results). lr 0.1: the gamma_0
    # chosen by the step-size selection (docs/results/*-select).
    presets = {"small": {"grid_size": 16}, "cpu": {"grid_size": 16, "lr": 0.1}, "paper": {"grid_size": 32, "lr": 0.1}}
    # the caches of eqs. (7), (16), (17), the hyperparameters, the grid, the clamp counters,
    # the projection (PROJECTION_FIELDS, with a projection) and the optimiser
    state_fields = ("initialized", "n", "grid_state", "gram", "wty", "yty", "observe_clamped", "predict_clamped", "hp",
                    "optimizer", "generator")
    PROJECTION_FIELDS = ("proj_weight", "bn_gamma", "bn_beta", "bn_mean", "bn_std")

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        grid_size: int | Sequence[int] = 16,
        projection: str = "auto",
        proj_dim: int = 2,
        bounds: tuple[Any, Any] | None = None,
        margin: float = 0.1,
        out_of_grid: str = "clamp",
        lr: float = 5e-3,
        proj_lr: float = 5e-4,
        pretrain_lr: float = 5e-2,
        pretrain_proj_lr: float = 5e-3,
        pretrain_iters: int = 200,
        noise_floor: float | None = None,
        learn_hyperparameters: bool = True,
        validate: bool = True,
        predict_chunk: int = 4096,
        **kwargs: Any,
    ) -> None:
        super().__init__(input_dim, output_dim, **kwargs)  # device, dtype, seed
        if projection not in PROJECTIONS:
            raise LearnerError(f"WISKI: projection must be one of {', '.join(PROJECTIONS)}, got '{projection}'")
        if projection == "auto":
            projection = "none" if input_dim <= 2 else "per-output"
        if out_of_grid not in ("clamp", "error"):
            raise LearnerError(f"WISKI: out_of_grid must be 'clamp' or 'error', got '{out_of_grid}'")
        if out_of_grid == "error" and not validate:
            raise LearnerError("WISKI: out_of_grid='error' needs validate=True (the check is the host sync)")
        if proj_dim < 1 or pretrain_iters < 0 or predict_chunk < 1 or min(lr, proj_lr, pretrain_lr, pretrain_proj_lr) < 0:
            raise LearnerError(
                f"WISKI: need proj_dim >= 1, pretrain_iters >= 0, predict_chunk >= 1 and learning rates >= 0; got "
                f"{proj_dim}, {pretrain_iters}, {predict_chunk}, {(lr, proj_lr, pretrain_lr, pretrain_proj_lr)}"
            )
        if noise_floor is None:
            noise_floor = 1e-6 if self.dtype == torch.float64 else 1e-4
        self.config.update({
            "grid_size": grid_size if isinstance(grid_size, int) else [int(g) for g in grid_size],
            "projection": projection, "proj_dim": int(proj_dim), "bounds": bounds, "margin": float(margin),
            "out_of_grid": out_of_grid, "lr": float(lr), "proj_lr": float(proj_lr), "pretrain_lr": float(pretrain_lr),
            "pretrain_proj_lr": float(pretrain_proj_lr), "pretrain_iters": int(pretrain_iters),
            "noise_floor": float(noise_floor), "learn_hyperparameters": bool(learn_hyperparameters),
            "validate": bool(validate), "predict_chunk": int(predict_chunk),
        })
        self.projection = projection
        self.feature_dim = input_dim if projection == "none" else int(proj_dim)
        sizes = (int(grid_size),) * self.feature_dim if isinstance(grid_size, int) else tuple(int(g) for g in grid_size)
        if len(sizes) != self.feature_dim or min(sizes) < 4:
            raise LearnerError(
                f"WISKI: grid_size {grid_size} must give >= 4 points for each of the {self.feature_dim} interpolated dimensions"
            )
        self.grid_sizes = sizes
        self.num_inducing = math.prod(sizes)
        if self.num_inducing > 16384:
            raise LearnerError(
                f"WISKI: {self.num_inducing} grid points need {self.num_inducing**2 * 8 / 1e9:.1f} GB per output; "
                "use a smaller grid_size or a projection"
            )
        self.margin = float(margin)
        self.out_of_grid = out_of_grid
        self.lr, self.proj_lr = float(lr), float(proj_lr)
        self.pretrain_lr, self.pretrain_proj_lr = float(pretrain_lr), float(pretrain_proj_lr)
        self.pretrain_iters = int(pretrain_iters)
        self.learn_hyperparameters = bool(learn_hyperparameters)
        self.validate = bool(validate)
        self.predict_chunk = int(predict_chunk)
        kw = {"device": self.device, "dtype": self.dtype}
        # Q: how many distinct feature maps (1 when every output sees the same features)
        self.num_maps = output_dim if projection == "per-output" else 1
        self.hp = SEHyperparameters(output_dim, self.feature_dim, device=self.device, dtype=self.dtype, noise_floor=noise_floor)
        self.proj_params: list[Tensor] = []
        if projection != "none":
            weight = torch.randn(self.num_maps, input_dim, self.feature_dim, generator=self.generator, dtype=self.dtype)
            self.proj_weight = (weight / math.sqrt(input_dim)).to(self.device).requires_grad_(True)
            self.bn_gamma = torch.ones(self.num_maps, self.feature_dim, **kw, requires_grad=True)
            self.bn_beta = torch.zeros(self.num_maps, self.feature_dim, **kw, requires_grad=True)
            self.proj_params = [self.proj_weight, self.bn_gamma, self.bn_beta]
            self.bn_mean = torch.zeros(self.num_maps, self.feature_dim, **kw)
            self.bn_std = torch.ones(self.num_maps, self.feature_dim, **kw)
            bounds = (-1.0, 1.0)  # the tanh range
        self.grid: Grid | None = None
        if bounds is not None:
            lo = torch.as_tensor(bounds[0], **kw).expand(self.feature_dim)
            hi = torch.as_tensor(bounds[1], **kw).expand(self.feature_dim)
            if not bool((hi > lo).all()):
                raise LearnerError(f"WISKI: bounds need lo < hi in every dimension, got {bounds}")
            self.grid = Grid.from_bounds(lo, hi, sizes, self.margin)
        self.optimizer = self._make_optimizer(self.lr, self.proj_lr)
        self.initialized = False
        self.n = 0
        m = self.num_inducing
        self.gram = torch.zeros(self.num_maps, m, m, **kw)  # W^T W, WISKI eq. (7)
        self.wty = torch.zeros(output_dim, m, **kw)  # W^T y, eq. (16)
        self.yty = torch.zeros(output_dim, **kw)  # y^T y, eq. (17)
        self.observe_clamped = torch.zeros((), dtype=torch.int64, device=self.device)
        self.predict_clamped = torch.zeros((), dtype=torch.int64, device=self.device)
        self._stale = True
        self._m_cache = torch.zeros(0, **kw)
        self._mean_cache = torch.zeros(0, **kw)

    # -- features and interpolation -------------------------------------------------------
    def _make_optimizer(self, lr: float, proj_lr: float) -> torch.optim.Optimizer:
        groups = [{"params": self.hp.parameters(), "lr": lr}]
        if self.proj_params:
            groups.append({"params": self.proj_params, "lr": proj_lr})
        return torch.optim.Adam(groups)

    def features(self, x: Tensor, batch_stats: bool = False) -> Tensor:
        """Interpolated features ``[Q, N, d]``: ``x`` itself, or ``tanh(BN(x A))`` (WISKI Sec. 5.1)."""
        if self.projection == "none":
            return x.unsqueeze(0)
        a = x @ self.proj_weight  # [Q, N, d]
        mean, std = _bn_stats(a) if batch_stats else (self.bn_mean, self.bn_std)
        return torch.tanh((a - mean.unsqueeze(1)) / std.unsqueeze(1) * self.bn_gamma.unsqueeze(1) + self.bn_beta.unsqueeze(1))

    def _rows(self, x: Tensor, batch_stats: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        assert self.grid is not None
        return interp_weights(self.features(x, batch_stats), self.grid)

    def _per_output(self, t: Tensor) -> Tensor:
        return t.expand(self.output_dim, *t.shape[1:])

    @torch.no_grad()
    def _initialize(self, x: Tensor, y: Tensor) -> None:
        """Hyperparameters, BN statistics and grid from the first data (the protocol of docs/architecture.md)."""
        if self.projection != "none":
            self.bn_mean, self.bn_std = _bn_stats(x @ self.proj_weight)
        elif self.grid is None:
            self.grid = Grid.from_bounds(x.min(dim=0).values, x.max(dim=0).values, self.grid_sizes, self.margin)
        self.hp.init_from_data(self.features(x), y, self.generator)
        self.gram.zero_()
        self.wty.zero_()
        self.yty.zero_()
        self.n = 0
        self.initialized = True
        self._stale = True

    def _check_observe(self, x: Tensor, y: Tensor, outside: Tensor) -> None:
        """One host sync: NaN/inf and out-of-grid points, per the ``out_of_grid`` option."""
        nan_x, nan_y, n_out = torch.stack(
            [(~torch.isfinite(x)).any().long(), (~torch.isfinite(y)).any().long(), outside.any(dim=0).sum()]
        ).tolist()
        if nan_x or nan_y:
            raise LearnerError(f"WISKI.observe: {'x' if nan_x else 'y'} contains NaN or inf")
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
        """Add ``x [q, D]``, ``y [q, P]`` to the caches (WISKI eqs. (7), (16), (17)): ``O(P q 16^d)``."""
        self.check_xy(x, y, "observe")
        if x.shape[0] == 0:
            return
        if not self.initialized:
            self.check_finite("observe", x=x, y=y)
            self._initialize(x, y)
        with torch.no_grad():
            idx, w, outside = self._rows(x)
            if self.validate:
                self._check_observe(x, y, outside)
            self.observe_clamped += outside.any(dim=0).sum()
            m = self.num_inducing
            self.gram += scatter_gram(idx, w, m)
            self.wty += scatter_rhs(self._per_output(idx), self._per_output(w), y.T, m)
            self.yty += (y * y).sum(dim=0)
        self.n += x.shape[0]
        self._stale = True

    def mll(self) -> Tensor:
        """Log marginal likelihood of everything observed, per output ``[P]`` (WISKI eq. (13))."""
        return self._mll(self.gram, self.wty, self.yty, self.n)

    def _mll(self, gram: Tensor, wty: Tensor, yty: Tensor, n: int) -> Tensor:
        assert self.grid is not None
        factors = toeplitz_factors(self.grid, self.hp.lengthscale)
        return woodbury_mll(factors, self.hp.amplitude, self.hp.noise, gram, wty, yty, n)

    def step(self, x: Tensor, y: Tensor) -> dict[str, float]:
        """One Adam step on theta (eq. (13)) and the projection (eq. (18)); ``x, y`` = the batch just observed."""
        self.check_xy(x, y, "step")
        if self.device.type == "cpu":  # free on the CPU; on a GPU it would be a host sync
            self.check_finite("step", x=x, y=y)
        if not self.learn_hyperparameters or self.n == 0:
            return {}
        self.optimizer.zero_grad()
        gram, wty = self.gram, self.wty
        if self.proj_params:
            # WISKI eq. (18): the newest rows carry the gradient of phi; their values are
            # already in the caches, so G - G.detach() adds zero but keeps the graph
            idx, w, _ = self._rows(x)
            new_gram = scatter_gram(idx, w, self.num_inducing)
            new_wty = scatter_rhs(self._per_output(idx), self._per_output(w), y.T, self.num_inducing)
            gram = gram + (new_gram - new_gram.detach())
            wty = wty + (new_wty - new_wty.detach())
        loss = -self._mll(gram, wty, self.yty, self.n).sum() / self.n
        loss.backward()
        self.optimizer.step()
        self._stale = True
        return {"loss": float(loss.detach())}

    @torch.no_grad()
    def _refresh(self) -> None:
        """Prediction caches ``M`` (eq. (6)) and ``M W^T y`` (eq. (9)) for the current hyperparameters."""
        assert self.grid is not None
        factors = toeplitz_factors(self.grid, self.hp.lengthscale)
        amp, noise = self.hp.amplitude, self.hp.noise
        kuu = kron_dense(factors, amp)
        m = self.num_inducing
        b = noise[:, None, None] * torch.eye(m, dtype=self.dtype, device=self.device) + kron_matmul(factors, amp, self.gram)
        lu, piv = torch.linalg.lu_factor(b)
        mm = torch.linalg.lu_solve(lu, piv, kuu)
        mm = 0.5 * (mm + mm.transpose(-1, -2))
        self._m_cache = mm
        self._mean_cache = (mm @ self.wty.unsqueeze(-1)).squeeze(-1)
        self._stale = False

    @torch.no_grad()
    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Latent predictive mean (eq. (9)) and variance (eq. (10)), ``[..., P]`` each."""
        if not self.initialized:
            raise LearnerError("WISKI.predict: no data yet (call pretrain or observe first)")
        self.check_xy(x, None, "predict")
        if self.device.type == "cpu":  # on a GPU a NaN input gives NaN outputs (interp_weights), with no sync
            self.check_finite("predict", x=x)
        if self._stale:
            self._refresh()
        lead = x.shape[:-1]
        xf = x.reshape(-1, self.input_dim)
        m, p = self.num_inducing, self.output_dim
        mflat = self._m_cache.reshape(p, m * m)
        noise = self.hp.noise.unsqueeze(-1)
        means, variances = [], []
        for start in range(0, xf.shape[0], self.predict_chunk):
            idx, w, outside = self._rows(xf[start : start + self.predict_chunk])
            self.predict_clamped += outside.any(dim=0).sum()
            idx, w = self._per_output(idx), self._per_output(w)  # [P, N, K]
            means.append((self._mean_cache.gather(1, idx.flatten(1)).view_as(w) * w).sum(-1))
            pair = (idx.unsqueeze(-1) * m + idx.unsqueeze(-2)).flatten(1)
            mg = mflat.gather(1, pair).view(*w.shape, w.shape[-1])
            variances.append(noise * torch.einsum("pnk,pnkl,pnl->pn", w, mg, w))
        mean = torch.cat(means, dim=1) if means else xf.new_zeros(p, 0)
        var = torch.cat(variances, dim=1).clamp_min(0.0) if variances else xf.new_zeros(p, 0)
        return mean.T.reshape(*lead, p), var.T.reshape(*lead, p)

    @torch.no_grad()
    def vlb(self, x: Tensor, y: Tensor) -> Tensor:
        """Held-out log marginal likelihood per point, ``log p(y | x, data) / N``, ``[P]``.

        The difference of eq. (13) with and without the batch in the caches; the learner
        is not changed. ``O(P (N 16^d + m^3))``.
        """
        if not self.initialized:
            raise LearnerError("WISKI.vlb: no data yet (call pretrain or observe first)")
        self.check_xy(x, y, "vlb")
        idx, w, _ = self._rows(x)
        m = self.num_inducing
        gram = self.gram + scatter_gram(idx, w, m)
        wty = self.wty + scatter_rhs(self._per_output(idx), self._per_output(w), y.T, m)
        yty = self.yty + (y * y).sum(dim=0)
        after = self._mll(gram, wty, yty, self.n + x.shape[0])
        before = self.mll() if self.n > 0 else torch.zeros_like(after)
        return (after - before) / x.shape[0]

    def noise_variance(self) -> Tensor:
        return self.hp.noise.detach()

    # -- the paper's protocol ------------------------------------------------------------------
    def pretrain(self, x: Tensor, y: Tensor, iterations: int | None = None, progress: bool = True) -> dict[str, float]:
        """Batch phase of WISKI Sec. 5.1 / App. C: fit on ``x, y`` (the first 5% of the stream).

        Initialises everything from the batch, takes ``iterations`` (default
        ``pretrain_iters``) Adam steps on eq. (13) with ``pretrain_lr`` /
        ``pretrain_proj_lr``, recomputing all rows each iteration (batch BN statistics),
        then freezes the BN statistics, conditions the caches on the batch and resets the
        online optimiser. Replaces any data observed before.
        """
        self.check_xy(x, y, "pretrain")
        self.check_finite("pretrain", x=x, y=y)
        iterations = self.pretrain_iters if iterations is None else int(iterations)
        self._initialize(x, y)
        loss = torch.zeros((), dtype=self.dtype, device=self.device)
        if self.learn_hyperparameters and iterations > 0:
            opt = self._make_optimizer(self.pretrain_lr, self.pretrain_proj_lr)
            m, n = self.num_inducing, x.shape[0]
            yty = (y * y).sum(dim=0)
            for _ in tqdm(range(iterations), desc="WISKI pretrain", disable=not progress, leave=False):
                opt.zero_grad()
                idx, w, _ = self._rows(x, batch_stats=True)
                gram = scatter_gram(idx, w, m)
                wty = scatter_rhs(self._per_output(idx), self._per_output(w), y.T, m)
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
        for t in tqdm(range(n0, x.shape[0]), desc="WISKI stream", disable=not progress):
            self.observe(x[t : t + 1], y[t : t + 1])
            metrics = self.step(x[t : t + 1], y[t : t + 1])
            if callback is not None:
                callback(t, metrics)

    # -- hyperparameters -------------------------------------------------------------------------
    def set_hyperparameters(self, **values: Any) -> None:
        """Set lengthscale / amplitude / noise (the caches do not depend on them)."""
        self.hp.set(**values)
        self._stale = True

    def diagnostics(self) -> dict[str, float]:
        """Points clamped onto the grid edge so far (by observe, by predict)."""
        return {"observe_clamped": float(self.observe_clamped), "predict_clamped": float(self.predict_clamped)}

    # -- checkpoints -----------------------------------------------------------------------------
    def state_names(self) -> tuple[str, ...]:
        return self.state_fields + (self.PROJECTION_FIELDS if self.proj_params else ())

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
            if not isinstance(grid[key], Tensor) or tuple(grid[key].shape) != (self.feature_dim,):
                raise LearnerError(f"{where}.{key}: shape {tuple(getattr(grid[key], 'shape', ()))}, "
                                   f"expected ({self.feature_dim},)")
        return {}

    def _after_load(self) -> None:
        self._stale = True
