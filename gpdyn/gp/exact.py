"""Exact GP regression updated online: incremental Cholesky and periodic refits.

The baseline the WISKI paper compares against (its Fig. 2, "Exact-Cholesky"), and the
test oracle for WISKI: constructed with ``kernel=SKIKernel(grid)`` it is an exact GP
whose kernel is the dense SKI kernel ``W K_UU W^T``.

Cost, for ``n`` points seen and ``P`` outputs:

- ``observe`` of ``q`` points: block Cholesky update of ``K + sigma^2 I``,
  ``O(P (n^2 q + n q^2 + q^3))`` time, ``O(P n^2)`` memory.
- ``step``: every ``refit_every`` calls, ``refit_iters`` Adam steps on the full log
  marginal likelihood (WISKI eq. (1)), ``O(P n^3)`` each, then a fresh factorisation;
  the other calls do nothing. This is what makes the exact GP infeasible for large n.
- ``predict`` of ``N`` points: ``O(P n^2 N)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from gpdyn.gp.base import LOG_2PI, Learner, LearnerError, cholesky
from gpdyn.gp.hyperparams import SEHyperparameters
from gpdyn.gp.kernels import basis_features, exp2_matvec, input_features, same_across_outputs, se_ard, se_ard_diag



class SEARDKernel:
    """SE-ARD (gpdyn.gp.kernels) in the ``kernel(x1, x2, lengthscale, amplitude)`` + ``diag`` form."""

    def __call__(self, x1: Tensor, x2: Tensor, lengthscale: Tensor, amplitude: Tensor) -> Tensor:
        return se_ard(x1, x2, lengthscale, amplitude)

    def diag(self, x: Tensor, lengthscale: Tensor, amplitude: Tensor) -> Tensor:
        return se_ard_diag(x, amplitude)


class ExactOnlineGP(Learner):
    """Exact GP per output with an incrementally updated Cholesky factor.

    Options:
        kernel: object with ``__call__(x1, x2, lengthscale, amplitude) -> [P, N, M]`` and
            ``diag(x, lengthscale, amplitude) -> [P, N]``; default SE-ARD.
        lr: Adam learning rate of the refits (default 0.01).
        refit_every: refit the hyperparameters every this many ``step`` calls (default 100).
        refit_iters: Adam steps per refit (default 20).
        max_points: most points it accepts; more raises LearnerError (default 2000).
        noise_floor: added to the noise variance (default 1e-6).
        learn_hyperparameters: False keeps them fixed (the oracle in the tests).
    """

    name = "exact"
    capabilities = frozenset({"point_limit"})
    # small: the control runs; cpu: a refit (20 Adam steps of O(P n^3)) in seconds of one core
    # (docs/results/implementation-timings.md); paper: the constructor's default
    presets = {"small": {"max_points": 1500}, "cpu": {"max_points": 512}, "paper": {"max_points": 2000}}
    # the data buffers are preallocated (buffer_size rows) and only their first n rows
    # are state; a checkpoint keeps buffer_size so that a restored learner computes on
    # buffers of the same strides, bit for bit as the original
    state_fields = ("initialized", "steps", "n", "buffer_size", "inputs", "targets", "chol", "whitened", "hp",
                    "optimizer", "generator")

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        kernel: Callable[..., Tensor] | None = None,
        lr: float = 1e-2,
        refit_every: int = 100,
        refit_iters: int = 20,
        max_points: int = 2000,
        noise_floor: float = 1e-6,
        learn_hyperparameters: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(input_dim, output_dim, **kwargs)  # device, dtype, seed
        if refit_every < 1 or refit_iters < 0 or max_points < 1 or not lr > 0:
            raise LearnerError(
                f"ExactOnlineGP: need refit_every >= 1, refit_iters >= 0, max_points >= 1, lr > 0; "
                f"got {refit_every}, {refit_iters}, {max_points}, {lr}"
            )
        self.config.update({
            "lr": float(lr), "refit_every": int(refit_every), "refit_iters": int(refit_iters), "max_points": int(max_points),
            "noise_floor": float(noise_floor), "learn_hyperparameters": bool(learn_hyperparameters),
        })
        if kernel is not None:
            self.config["kernel"] = kernel
        self.kernel = kernel if kernel is not None else SEARDKernel()
        self.refit_every = int(refit_every)
        self.refit_iters = int(refit_iters)
        self.max_points = int(max_points)
        self.learn_hyperparameters = bool(learn_hyperparameters)
        self.hp = SEHyperparameters(output_dim, input_dim, device=self.device, dtype=self.dtype, noise_floor=noise_floor)
        self.optimizer = torch.optim.Adam(self.hp.parameters(), lr=lr)
        self.initialized = False
        self.n = 0
        self.steps = 0
        # X [cap, D], Y [cap, P], the lower Cholesky factor L of K + sigma^2 I [P, cap, cap]
        # and z = L^{-1} y [P, cap]; grown by doubling
        self.buffer_size = 0
        self._alpha: Tensor | None = None  # (K + sigma^2 I)^{-1} y, refreshed lazily
        self._linv: Tensor | None = None  # L^{-1} [n, n] of the one factor (predict's variance), lazily or by observe
        self._features: tuple[Tensor, Tensor] | None = None  # predict_mean's length scales and base-2 data features
        self._shared: bool | None = None  # every output's hyperparameters the same (predict's one factor), lazily

    # -- helpers ---------------------------------------------------------------------
    def _k(self, x1: Tensor, x2: Tensor) -> Tensor:
        return self.kernel(x1, x2, self.hp.lengthscale, self.hp.amplitude)

    def _ensure_capacity(self, n: int) -> None:
        cap = self._X.shape[0]
        if n <= cap:
            return
        old = (self._X, self._Y, self._L, self._z)
        self.buffer_size = min(max(n, 2 * cap, 64), self.max_points)
        self._X[:cap], self._Y[:cap], self._L[:, :cap, :cap], self._z[:, :cap] = old

    # -- the state: the first n rows of the buffers ----------------------------------------
    @property
    def buffer_size(self) -> int:
        """Rows allocated for data; setting it allocates empty buffers of that size."""
        return self._X.shape[0]

    @buffer_size.setter
    def buffer_size(self, size: int) -> None:
        kw = {"device": self.device, "dtype": self.dtype}
        self._X = torch.zeros(size, self.input_dim, **kw)
        self._Y = torch.zeros(size, self.output_dim, **kw)
        self._L = torch.zeros(self.output_dim, size, size, **kw)
        self._z = torch.zeros(self.output_dim, size, **kw)

    @property
    def inputs(self) -> Tensor:
        """The observed inputs ``[n, D]`` (a view)."""
        return self._X[: self.n]

    @property
    def targets(self) -> Tensor:
        """The observed targets ``[n, P]`` (a view)."""
        return self._Y[: self.n]

    @property
    def chol(self) -> Tensor:
        """Lower Cholesky factor of ``K + sigma^2 I`` over the observed inputs, ``[P, n, n]`` (a view)."""
        return self._L[:, : self.n, : self.n]

    @property
    def whitened(self) -> Tensor:
        """``L^{-1} y``, ``[P, n]`` (a view)."""
        return self._z[:, : self.n]

    def _state_shapes(self, state: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        n, size = state["n"], state["buffer_size"]
        if not (isinstance(n, int) and isinstance(size, int) and 0 <= n <= size <= self.max_points):
            raise LearnerError(f"ExactOnlineGP.load_state_dict: need 0 <= n <= buffer_size <= max_points={self.max_points}, "
                               f"got n={n!r}, buffer_size={size!r}")
        d, p = self.input_dim, self.output_dim
        return {"inputs": (n, d), "targets": (n, p), "chol": (p, n, n), "whitened": (p, n)}

    def _after_load(self) -> None:
        self._alpha = self._linv = self._features = self._shared = None

    # -- the point limit -----------------------------------------------------------------
    @property
    def point_limit(self) -> int:
        return self.max_points

    def room(self) -> int:
        return self.max_points - self.n

    def _block(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Block Cholesky update for new rows: ``S = L^{-1} K_{X x}``, ``L22``, whitened ``z2``, and for
        the SE-ARD kernel with data the new rows' base-2 features in the layout of the cached ones
        (:meth:`_mean_features`; ``observe`` appends them), else None. With that kernel both
        kernel blocks come from those features, as :meth:`predict` forms its kernel."""
        n, q = self.n, x.shape[0]
        noise_eye = self.hp.noise[:, None, None] * torch.eye(q, device=self.device, dtype=self.dtype)
        new = None
        if n > 0 and isinstance(self.kernel, SEARDKernel):
            ls, feats = self._mean_features()
            u = input_features(x, ls).transpose(-1, -2)
            amp = self.hp.amplitude.detach()
            new = basis_features(x, None, ls, amp[:1] if feats.dim() == 2 else amp, base2=True)
            kxx = torch.exp2(new @ u)
            k_data = torch.exp2(feats @ u)
            new = new[0] if feats.dim() == 2 else new
            if feats.dim() == 2 and self._one_factor():  # one factor for every output: one solve, one L22
                return (*self._one_factor_block(k_data[0], kxx[0] + noise_eye[0], y), new)
            kxx = kxx.expand(self.output_dim, q, q) + noise_eye
            k_data = k_data.expand(self.output_dim, n, q)
        else:
            kxx = self._k(x, x) + noise_eye
            k_data = self._k(self.inputs, x) if n > 0 else None
        if k_data is None:
            s = torch.zeros(self.output_dim, 0, q, device=self.device, dtype=self.dtype)
            resid = y.T
        else:
            s = torch.linalg.solve_triangular(self.chol, k_data, upper=False)
            kxx = kxx - s.transpose(-1, -2) @ s
            resid = y.T - (s * self.whitened.unsqueeze(-1)).sum(-2)
        l22 = cholesky(kxx)
        z2 = torch.linalg.solve_triangular(l22, resid.unsqueeze(-1), upper=False).squeeze(-1)
        return s, l22, z2, new

    def _one_factor_block(self, k_data: Tensor, kxx: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`_block` when every output's factor is the first's (:meth:`_one_factor`): ``S`` and
        ``L22`` solved and factored once (``k_data [n, q]``, ``kxx [q, q]`` with the noise) and
        shared by the outputs as expanded views; each output whitens its own targets."""
        p = self.output_dim
        s = torch.linalg.solve_triangular(self.chol[0], k_data, upper=False)  # [n, q]
        l22 = cholesky(kxx - s.transpose(0, 1) @ s)
        resid = y.T - self.whitened @ s  # [P, q]
        z2 = torch.linalg.solve_triangular(l22, resid.T, upper=False).T
        return s.expand(p, *s.shape), l22.expand(p, *l22.shape), z2

    def _init(self, x: Tensor, y: Tensor) -> None:
        self.hp.init_from_data(x.unsqueeze(0), y, self.generator)
        self.initialized = True

    # -- the contract ----------------------------------------------------------------
    @torch.no_grad()
    def observe(self, x: Tensor, y: Tensor) -> None:
        """Condition on ``x [q, D]``, ``y [q, P]`` by a block Cholesky update (``O(P n^2 q)``)."""
        if self.n + x.shape[0] > self.max_points:
            raise LearnerError(
                f"ExactOnlineGP.observe: {self.n + x.shape[0]} points exceed max_points={self.max_points}; "
                "the exact GP is for small n (use wiski, or raise max_points)"
            )
        fresh = not self.initialized
        if fresh:
            self._init(x, y)
        s, l22, z2, new = self._block(x, y)
        n, q = self.n, x.shape[0]
        self._ensure_capacity(n + q)
        self._X[n : n + q] = x
        self._Y[n : n + q] = y
        self._L[:, n : n + q, :n] = s.transpose(-1, -2)
        self._L[:, n : n + q, n : n + q] = l22
        self._z[:, n : n + q] = z2
        self.n = n + q
        self._alpha = None
        linv, self._linv = self._linv, None
        if linv is not None and not fresh and n > 0 and linv.shape[0] == n and self._shared:
            # the inverse of the grown factor [[L11, 0], [S^T, L22]] from L11's (O(n^2 q), not O(n^3)):
            # [[L11^-1, 0], [-L22^-1 S^T L11^-1, L22^-1]]
            l22_inv = torch.linalg.solve_triangular(l22[0], torch.eye(q, device=self.device, dtype=self.dtype), upper=False)
            grown = linv.new_zeros(n + q, n + q)
            grown[:n, :n] = linv
            grown[n:, :n] = -(l22_inv @ (s[0].transpose(0, 1) @ linv))
            grown[n:, n:] = l22_inv
            self._linv = grown
        if fresh or new is None or self._features is None:
            self._features = self._shared = None
        else:  # the hyperparameters are those of the cached features: the new rows' features join them
            ls, feats = self._features
            self._features = (ls, torch.cat([feats, new], dim=-2))

    def mll(self) -> Tensor:
        """Log marginal likelihood of all observed data per output, ``[P]`` (WISKI eq. (1)); differentiable."""
        x, y = self.inputs, self.targets
        k = self._k(x, x) + self.hp.noise[:, None, None] * torch.eye(self.n, device=self.device, dtype=self.dtype)
        chol = cholesky(k)
        z = torch.linalg.solve_triangular(chol, y.T.unsqueeze(-1), upper=False).squeeze(-1)
        logdet = chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        return -0.5 * (z * z).sum(-1) - logdet - 0.5 * self.n * LOG_2PI

    @torch.no_grad()
    def refactor(self) -> None:
        """Fresh Cholesky factor after the hyperparameters changed (``O(P n^3)``)."""
        n = self.n
        x, y = self.inputs, self.targets
        k = self._k(x, x) + self.hp.noise[:, None, None] * torch.eye(n, device=self.device, dtype=self.dtype)
        self._L[:, :n, :n] = cholesky(k)
        self._z[:, :n] = torch.linalg.solve_triangular(self.chol, y.T.unsqueeze(-1), upper=False).squeeze(-1)
        self._alpha = self._linv = self._features = self._shared = None

    def step(self, x: Tensor, y: Tensor) -> dict[str, float]:
        """Count a step; every ``refit_every`` steps refit the hyperparameters on all data."""
        self.steps += 1
        if not self.learn_hyperparameters or self.n == 0 or self.steps % self.refit_every != 0:
            return {"refit": 0.0}
        loss = torch.zeros((), device=self.device, dtype=self.dtype)
        for _ in range(self.refit_iters):
            self.optimizer.zero_grad()
            loss = -self.mll().sum() / self.n
            loss.backward()
            self.optimizer.step()
        self.refactor()
        return {"refit": 1.0, "loss": loss.detach()}  # a 0-d tensor: float() would sync a GPU every refit

    def _alpha_cache(self) -> Tensor:
        if self._alpha is None:
            if self._shared:  # one factor for every output (known once predict asked): one solve, P right-hand sides
                lt = self.chol[0].transpose(0, 1)
                self._alpha = torch.linalg.solve_triangular(lt, self.whitened.transpose(0, 1), upper=True).transpose(0, 1)
            else:
                lt = self.chol.transpose(-1, -2)
                self._alpha = torch.linalg.solve_triangular(lt, self.whitened.unsqueeze(-1), upper=True).squeeze(-1)
        return self._alpha

    @torch.no_grad()
    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Latent predictive mean and variance ``[..., P]`` (WISKI eqs. (2)-(3))."""
        if not self.initialized:
            raise LearnerError("ExactOnlineGP.predict: no data observed yet (call observe first)")
        lead = x.shape[:-1]
        xf = x.reshape(-1, self.input_dim)
        if self.n > 0 and isinstance(self.kernel, SEARDKernel):
            mean, var = self._predict_se(xf)
        else:
            prior = self.kernel.diag(xf, self.hp.lengthscale, self.hp.amplitude).expand(self.output_dim, xf.shape[0])
            if self.n == 0:
                mean, var = torch.zeros_like(prior), prior
            else:
                ksx = self._k(self.inputs, xf)  # [P, n, N]
                mean = (ksx * self._alpha_cache().unsqueeze(-1)).sum(-2)
                v = torch.linalg.solve_triangular(self.chol, ksx, upper=False)
                var = (prior - (v * v).sum(-2)).clamp_min(0.0)
        return mean.T.reshape(*lead, self.output_dim), var.T.reshape(*lead, self.output_dim)

    def _predict_se(self, xf: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`predict` of the SE-ARD kernel, ``[P, N]`` each: the kernel from the cached base-2
        data features (:meth:`_mean_features`), none of the data side recomputed per call. When
        every output has the same length scales, amplitude and noise (as the residual learner's GP
        has them until a refit), their kernels and Cholesky factors are one: one kernel
        ``[n, N]``, one triangular solve and one variance serve all P outputs (P times less
        work than the batched solve, the bulk of a prediction)."""
        ls, feats = self._mean_features()
        u = input_features(xf, ls)
        alpha = self._alpha_cache()
        amp = self.hp.amplitude.detach()
        if feats.dim() == 2 and self._one_factor():
            k = torch.exp2(feats @ u[0].transpose(0, 1))  # [n, N], for every output
            if self._linv is None:  # L^{-1} k by a product: the factor's inverse, kept until the data change
                eye = torch.eye(self.n, device=self.device, dtype=self.dtype)
                self._linv = torch.linalg.solve_triangular(self.chol[0], eye, upper=False)
            mean = alpha @ k
            v = self._linv @ k
            var = (amp[:1, None] - v.square_().sum(0)).clamp_min(0.0).expand(self.output_dim, -1)
        else:
            k = torch.exp2(feats.expand(self.output_dim, *feats.shape[-2:]) @ u.transpose(-1, -2))  # [P, n, N]
            mean = (alpha.unsqueeze(-2) @ k).squeeze(-2)
            v = torch.linalg.solve_triangular(self.chol, k, upper=False)
            var = (amp[:, None] - (v * v).sum(-2)).clamp_min(0.0)
        return mean, var

    def _one_factor(self) -> bool:
        """Whether every output's ``K + sigma^2 I`` is the same matrix (length scales, amplitude
        and noise agree across outputs), so that the first output's Cholesky factor is every
        output's; read back once per cache rebuild, on the CPU only."""
        if self._shared is None:
            hp = (self.hp.lengthscale.detach(), self.hp.amplitude.detach(), self.hp.noise.detach())
            self._shared = self.device.type == "cpu" and same_across_outputs(*hp)
        return self._shared

    def _mean_features(self) -> tuple[Tensor, Tensor]:
        """Length scales of the input features and base-2 features of the data, kept until the
        data or the hyperparameters change. The data are the basis of every output, so when
        the outputs also share length scale and amplitude (as they start, and as the residual
        learner's GP keeps them until a refit) the kernel is one for all outputs: ``ls [1, D]``
        and features ``[n, R]``. Telling that reads values back: on the CPU only."""
        if self._features is None:
            ls, amp = self.hp.lengthscale.detach(), self.hp.amplitude.detach()
            if self.device.type == "cpu" and self.output_dim > 1 and same_across_outputs(ls, amp):
                self._features = (ls[:1], basis_features(self.inputs, None, ls[:1], amp[:1], base2=True)[0])
            else:
                self._features = (ls, basis_features(self.inputs, None, ls, amp, base2=True))
        return self._features

    @torch.no_grad()
    def predict_mean(self, x: Tensor) -> Tensor:
        """Latent predictive mean ``k_{x,X} alpha``, ``[..., P]`` (WISKI eq. (2)), ``O(P n N)``:
        none of the variance's triangular solve (``O(P n^2 N)``). The SE-ARD kernel goes
        through :func:`~gpdyn.gp.kernels.exp2_matvec` (the kernel is never stored); another
        kernel object is evaluated and multiplied."""
        if not self.initialized:
            raise LearnerError("ExactOnlineGP.predict_mean: no data observed yet (call observe first)")
        lead = x.shape[:-1]
        xf = x.reshape(-1, self.input_dim)
        if self.n == 0:
            mean = xf.new_zeros(self.output_dim, xf.shape[0])
        elif isinstance(self.kernel, SEARDKernel):
            ls, feats = self._mean_features()
            u = input_features(xf, ls)
            mean = exp2_matvec(u[0] if ls.shape[0] == 1 else u, feats, self._alpha_cache())
        else:
            mean = (self._k(self.inputs, xf) * self._alpha_cache().unsqueeze(-1)).sum(-2)
        return mean.T.reshape(*lead, self.output_dim)

    @torch.no_grad()
    def vlb(self, x: Tensor, y: Tensor) -> Tensor:
        """Held-out log marginal likelihood per point, ``log p(y | x, data) / N``, ``[P]``.

        The joint predictive density of the batch (with noise), from the same block
        Cholesky step that ``observe`` uses; the learner is not changed.
        """
        if not self.initialized:
            raise LearnerError("ExactOnlineGP.vlb: no data observed yet (call observe first)")
        _, l22, z2, _ = self._block(x, y)
        logp = -0.5 * (z2 * z2).sum(-1) - l22.diagonal(dim1=-2, dim2=-1).log().sum(-1) - 0.5 * x.shape[0] * LOG_2PI
        return logp / x.shape[0]

    def noise_variance(self) -> Tensor:
        return self.hp.noise.detach()

    def set_hyperparameters(self, **values: Any) -> None:
        """Set lengthscale / amplitude / noise and refactor the observed data."""
        self.hp.set(**values)
        self.initialized = True
        self.refactor()
