"""SVDGP over a stream: the decoupled bound maximised in closed form as the rows arrive.

SVDGP (Cheng & Boots 2017) has a mean ``m(x) = k_{x,alpha} a`` on a basis alpha and a
covariance on a basis beta (eq. (7), (8)). Its Algorithm 1 moves ``a``, ``B`` and the
hyperparameters by stochastic gradient steps on i.i.d. minibatches. Over a stream that fails
(docs/results/stream-svdgp-study.md): one step per chunk is far too few, and ``a`` learns a
region long after the robot has left it. With a Gaussian likelihood, fixed hyperparameters and
fixed bases, the bound of eq. (5) needs no steps at all:

- its mean terms, ``-1/(2 s) sum_n (y_n - k_{n,alpha} a)^2 - 1/2 a^T K_alpha a``, are a concave
  quadratic in ``a`` alone, maximised at
  ``a* = (s K_alpha + K_{alpha,X} K_{X,alpha})^{-1} K_{alpha,X} y``;
- its covariance terms depend on ``B`` alone, and their maximiser is the sparse GP posterior
  covariance with inducing points beta (Titsias 2009, the covariance SVDGP's eq. (7) is built to
  agree with, Section 3.3)::

      s(x) = k(x, x) - k_{x,beta} K_beta^{-1} k_{beta,x} + k_{x,beta} (K_beta + K_{beta,X} K_{X,beta} / s)^{-1} k_{beta,x}

Both depend on the rows only through sums over them (``K_{alpha,X} K_{X,alpha}``,
``K_{alpha,X} y``), so each chunk adds its rows to the sums and the bound of everything seen
so far is maximised exactly after every chunk: a single pass, each row used once, at a cost
per row that does not grow with the stream.

The computation. With ``K_alpha = rho^2 L L^T`` (Cholesky of the unit-amplitude kernel on alpha),
the Nystrom features ``phi(x) = L^{-1} k_1(alpha, x)`` turn the mean into Bayesian linear
regression on ``phi`` with ``lam = s / rho^2`` (``phi^T phi = k_1(x, alpha) K_1^{-1} k_1(alpha, x)``):
:class:`~gpdyn.gp.rls.RecursiveBLR` keeps ``G = Phi^T Phi``, ``Phi^T Y`` and ``A^{-1}`` and
updates them per chunk, and ``a* = rho^{-2} L^{-T} E[w]``. When beta is the first ``M_beta``
points of alpha, the first ``M_beta`` Nystrom features of alpha are beta's own (a Cholesky
factor's leading block is the leading block's factor), so beta's statistics are a block of
``G`` and the variance costs ``O(M_beta^2)`` per point where the mean costs ``O(M_alpha D)``:
the decoupling of SVDGP, a large basis for the mean and a small one for the variance.

The kernel is SE-ARD plus an optional linear term, ``rho_p^2 (k_1(x, x') + c^2 [x, 1]^T [x', 1])``
(``linear = c``): the linear features ``c [x, 1]`` join the Nystrom ones in the regression,
exactly (they are finite), in the mean and in the variance.

Hyperparameters. Chosen once on the first batch by the evidence, as :class:`~gpdyn.gp.ssgp.SSGP`
does: the length scales shared by the outputs, one ratio ``lam = s_p / rho_p^2`` and a noise per
output (the evidence is that of random Fourier features of the same SE-ARD kernel; the exact
evidence of the first 1,024 rows of a walker stream picks shorter length scales that predict
the rest worse: docs/results/stream-svdgp-closed-form). Then ``lam`` and the noises are
re-maximised exactly from the statistics every ``reselect_every`` rows (the evidence of this
model, from ``G``). The bases are the first batch's rows (``M_alpha`` of them drawn by the
learner's seeded generator): a stream's first rows are where the robot is, and a basis fixed at
the start keeps the sums exact.

Calibrated variance (``calibrate_rows``), as :class:`~gpdyn.gp.wiski.WISKI`'s: every ``observe``
first scores its batch with the prediction made before the batch enters the sums (the
prequential rule's own prediction, kept, so it costs nothing more there), and updates a scale
``c_p`` per output, ``mean(r^2 / v)`` exponentially weighted over about the last
``calibrate_rows`` rows; the latent and the noise variance reported are scaled by it, the mean
and the evidence are not. The sparse GP variance above is the posterior's under the SE-ARD
prior, wide wherever the data leave the basis; how much of that width the stream's errors
fill differs between robots (95% coverage 0.99 on a walker stream, 0.96 on SARCOS without the
scale), and the scale follows it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import math

import torch
from torch import Tensor

from gpdyn.gp.base import LearnerError, cholesky
from gpdyn.gp.kernels import se_ard
from gpdyn.gp.ssgp import SSGP
from gpdyn.gp.variational import tri_solve


class StreamSVDGP(SSGP):
    """SVDGP with ``a`` and ``B`` at the closed-form maximiser of its bound, updated per chunk (module docs).

    Options:
        m_alpha: the mean basis alpha, drawn from the first observed batch (which must hold at
            least this many rows).
        m_beta: the variance basis beta, the first ``m_beta`` points of alpha (``<= m_alpha``).
        linear: ``c``, the scale of the linear features ``c [x, 1]`` (0: the SE-ARD kernel alone).
        calibrate_rows: the rows over which the variance scale follows the stream's errors
            (module docs; 0: no scale).
        jitter: added to the diagonal of the unit-amplitude ``K_alpha`` before its factorisation.
        features, select_iters, select_lr, reselect_every, noise_floor: the hyperparameter
            selection of :class:`~gpdyn.gp.ssgp.SSGP` (``features`` random frequencies score the
            evidence of the first batch; they are not the model's features).
    """

    name = "svdgp-stream"
    presets = {
        "small": {"m_alpha": 256, "m_beta": 64, "features": 100, "reselect_every": 1024},
        "cpu": {"m_alpha": 1000, "m_beta": 1000},
        "paper": {"m_alpha": 2000, "m_beta": 1000},
    }
    basis_options = ("m_alpha", "m_beta")
    state_fields = SSGP.state_fields + ("basis", "variance_scale")

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        m_alpha: int = 1000,
        m_beta: int = 1000,
        linear: float = 1.0,
        calibrate_rows: int = 1024,
        jitter: float = 1e-6,
        **kwargs: Any,
    ) -> None:
        for key, value in (("m_alpha", m_alpha), ("m_beta", m_beta)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LearnerError(f"StreamSVDGP: {key} must be an integer >= 1, got {value!r}")
        if m_beta > m_alpha:
            raise LearnerError(f"StreamSVDGP: m_beta ({m_beta}) must be <= m_alpha ({m_alpha}): beta is the first "
                               "m_beta points of alpha")
        if isinstance(linear, bool) or not isinstance(linear, (int, float)) or not 0 <= linear < float("inf"):
            raise LearnerError(f"StreamSVDGP: linear must be a finite number >= 0, got {linear!r}")
        if isinstance(calibrate_rows, bool) or not isinstance(calibrate_rows, int) or calibrate_rows < 0:
            raise LearnerError(f"StreamSVDGP: calibrate_rows must be an integer >= 0 (0: no scale), got {calibrate_rows!r}")
        if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 < jitter < float("inf"):
            raise LearnerError(f"StreamSVDGP: jitter must be a finite number > 0, got {jitter!r}")
        self.m_alpha, self.m_beta = int(m_alpha), int(m_beta)
        self.linear, self.jitter, self.calibrate_rows = float(linear), float(jitter), int(calibrate_rows)
        super().__init__(input_dim, output_dim, **kwargs)
        self.config.update(m_alpha=self.m_alpha, m_beta=self.m_beta, linear=self.linear,
                           calibrate_rows=self.calibrate_rows, jitter=self.jitter)
        self.basis = torch.zeros(self.m_alpha, input_dim, device=self.device, dtype=self.dtype)
        self.variance_scale = torch.ones(output_dim, device=self.device, dtype=self.dtype)  # c_p
        self._factor: Tensor | None = None  # the Cholesky factor of the unit-amplitude K_alpha
        self._beta_cache: Tensor | None = None  # A_beta^{-1}, until the next observe
        # the rows last predicted (the tensor itself, kept), what identifies them, the mean and
        # the unscaled variance
        self._last_predict: tuple[Tensor, tuple[Any, ...], Tensor, Tensor] | None = None

    # -- the feature map ---------------------------------------------------------------------
    @property
    def feature_dim(self) -> int:
        return self.basis_size + (self.input_dim + 1 if self.linear else 0)

    @property
    def basis_size(self) -> int:
        """Points in alpha: ``m_alpha``, or all the rows of a smaller first batch."""
        basis = getattr(self, "basis", None)
        return self.m_alpha if basis is None else basis.shape[0]

    @property
    def beta_size(self) -> int:
        return min(self.m_beta, self.basis_size)

    @staticmethod
    def _unit_kernel(x1: Tensor, x2: Tensor, lengthscale: Tensor) -> Tensor:
        """The unit-amplitude SE-ARD kernel ``k_1(x1, x2)``, ``[N1, N2]``."""
        return se_ard(x1, x2, lengthscale[None], lengthscale.new_ones(1))[0]

    def _kernel_factor(self, basis: Tensor, lengthscale: Tensor) -> Tensor:
        k = self._unit_kernel(basis, basis, lengthscale)
        return cholesky(k + self.jitter * torch.eye(k.shape[0], device=k.device, dtype=k.dtype))

    def _features_from(self, x: Tensor, basis: Tensor, lengthscale: Tensor, factor: Tensor) -> Tensor:
        """``[L^{-1} k_1(alpha, x); c x; c]^T``, ``[N, M]``."""
        nystrom = tri_solve(factor, self._unit_kernel(basis, x, lengthscale)).T
        if not self.linear:
            return nystrom
        return torch.cat([nystrom, self.linear * x, x.new_full((x.shape[0], 1), self.linear)], dim=-1)

    def factor(self) -> Tensor:
        if self._factor is None:
            self._factor = self._kernel_factor(self.basis, self.lengthscale)
        return self._factor

    def features(self, x: Tensor) -> Tensor:
        return self._features_from(x, self.basis, self.lengthscale, self.factor())

    def _start(self, x: Tensor, y: Tensor) -> dict[str, Any]:
        start = super()._start(x, y)
        pick = torch.randperm(x.shape[0], generator=self.generator)[: self.m_alpha].to(x.device)
        start["basis"] = x[pick].to(self.dtype).clone()
        start["_factor"] = self._kernel_factor(start["basis"], start["lengthscale"])
        return start

    def _absorb(self, phi: Tensor, y: Tensor, start: dict[str, Any]) -> dict[str, Any]:
        if phi.shape[1] == self.gram.shape[0]:
            return super()._absorb(phi, y, start)
        # a first batch of fewer than m_alpha rows: all of them are alpha, and the (zero)
        # statistics take that size
        m, kw = phi.shape[1], {"device": self.device, "dtype": self.dtype}
        kept = self.gram, self.cross, self.inverse
        self.gram, self.cross = torch.zeros(m, m, **kw), torch.zeros(m, self.output_dim, **kw)
        self.inverse = torch.eye(m, **kw)
        try:
            return super()._absorb(phi, y, start)
        finally:
            self.gram, self.cross, self.inverse = kept

    def _features_with(self, x: Tensor, start: dict[str, Any]) -> Tensor:
        if "basis" not in start:
            return self.features(x)
        return self._features_from(x, start["basis"], start["lengthscale"], start["_factor"])

    # -- prediction: the mean on alpha, the variance on beta --------------------------------
    def _variance_block(self) -> Tensor:
        """Indices of beta's features among all: the first ``m_beta`` Nystrom ones and the linear ones."""
        idx = torch.arange(self.beta_size, device=self.device)
        if self.linear:
            idx = torch.cat([idx, torch.arange(self.m_alpha, self.feature_dim, device=self.device)])
        return idx

    @torch.no_grad()
    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Latent mean (eq. (8) on alpha) and variance: ``rho_p^2 (1 - |phi_beta|^2) + s_p psi^T A_beta^{-1} psi``
        with ``psi`` beta's and the linear features, ``A_beta`` their block of ``G`` plus ``lam I``."""
        self._need_data("predict")
        lead = x.shape[:-1]
        phi = self.features(x.reshape(-1, self.input_dim))
        mean = phi @ self._posterior_weights()
        if self.beta_size == self.basis_size:
            psi, inverse = phi, self.inverse
        else:
            idx = self._variance_block()
            psi = phi[:, idx]
            inverse = self._beta_inverse(idx)
        quad = ((psi @ inverse) * psi).sum(-1).clamp_min(0.0)
        nystrom = psi[:, : self.beta_size]
        residual = (1.0 - (nystrom * nystrom).sum(-1)).clamp_min(0.0)  # k(x,x) - q_beta(x), unit amplitude
        var = quad[:, None] * self.noise + residual[:, None] * (self.noise / self.lam)
        if self.calibrate_rows:
            self._last_predict = (x, self._memo_key(x), mean.clone(), var)
        var = var * self.variance_scale
        return mean.reshape(*lead, self.output_dim), var.reshape(*lead, self.output_dim)

    def noise_variance(self) -> Tensor:
        return self.noise * self.variance_scale

    def _beta_inverse(self, idx: Tensor) -> Tensor:
        if self._beta_cache is None:
            block = self.gram[idx][:, idx]
            self._beta_cache = self._refresh(block, self.lam)[0]
        return self._beta_cache

    def observe(self, x: Tensor, y: Tensor) -> None:
        if self.calibrate_rows and self.initialized:
            self._calibrate(x, y)
        super().observe(x, y)
        self._beta_cache = None

    def _memo_key(self, x: Tensor) -> tuple[Any, ...]:
        """The same tensor, unchanged since (its version counter), and the same statistics: the
        prequential rule observes the very rows it just predicted. Compared without reading the
        values, so without a host sync on a GPU."""
        return (x._version, self.rows, self.lam)

    @torch.no_grad()
    def _calibrate(self, x: Tensor, y: Tensor) -> None:
        """Update ``variance_scale`` from the prediction of ``x, y`` made before they enter the sums."""
        memo = self._last_predict
        if memo is not None and memo[0] is x and memo[1] == self._memo_key(x):
            mean, var = memo[2], memo[3] * self.variance_scale
        else:
            mean, var = self.predict(x)
        ratio = ((y - mean).pow(2) / (var + self.noise_variance())).mean(dim=0)
        keep = math.exp(-x.shape[0] / self.calibrate_rows)  # the weight of the rows before this batch
        self.variance_scale = self.variance_scale * (keep + (1.0 - keep) * ratio)

    def reselect(self) -> None:
        super().reselect()
        self._beta_cache = None

    # -- checkpoints -------------------------------------------------------------------------
    def _state_shapes(self, state: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        shapes = super()._state_shapes(state)
        basis = state["basis"]
        k = basis.shape[0] if isinstance(basis, Tensor) and basis.dim() == 2 else -1
        if not 1 <= k <= self.m_alpha:
            raise LearnerError(f"StreamSVDGP.load_state_dict: basis must be [k, {self.input_dim}] with 1 <= k <= m_alpha "
                               f"= {self.m_alpha}, got {tuple(basis.shape) if isinstance(basis, Tensor) else basis!r}")
        f = k + (self.input_dim + 1 if self.linear else 0)
        shapes.update(basis=(k, self.input_dim), gram=(f, f), cross=(f, self.output_dim), inverse=(f, f))
        return shapes

    def _after_load(self) -> None:
        super()._after_load()
        self._factor = None
        self._beta_cache = None
        self._last_predict = None


__all__ = ["StreamSVDGP"]
