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
regression on ``phi`` with ``lam = s / rho^2`` (``phi^T phi = k_1(x, alpha) K_1^{-1} k_1(alpha, x)``),
the model of :mod:`gpdyn.gp.rls`: the learner keeps its sums ``G = Phi^T Phi``, ``Phi^T Y``,
``y^T y`` and ``n`` exactly, factorises ``A = G + lam I`` once per chunk (``O(M^3)``, cheaper than
keeping ``A^{-1}`` by Woodbury steps for a chunk of 256 rows; a control loop's one row per step goes in by
Woodbury's identity on the last factor, ``O(M^2)``, up to :data:`WOODBURY_ROWS` rows), and holds the mean
in SVDGP's own form, eq. (8)'s
``m(x) = k_{x,alpha} a`` with ``a = L^{-T} E[w]``: ``O(M_alpha D)`` per predicted point. When beta
is the first ``M_beta`` points of alpha, the first ``M_beta`` Nystrom features of alpha are beta's
own (a Cholesky factor's leading block is the leading block's factor), so beta's sums are a
block of ``G`` and the variance costs ``O(M_beta^2)`` per point: the decoupling of SVDGP, a large
basis for the mean and a small one for the variance.

The kernel is SE-ARD plus an optional linear term, ``rho_p^2 (k_1(x, x') + c^2 [x, 1]^T [x', 1])``
(``linear = c``): the linear features ``c [x, 1]`` join the Nystrom ones in the regression,
exactly (they are finite), in the mean and in the variance.

Hyperparameters. Chosen once on the first batch by the evidence, by :class:`~gpdyn.gp.ssgp.SSGP`'s
selection: the length scales shared by the outputs, one ratio ``lam = s_p / rho_p^2`` and a noise per
output (the evidence is that of random Fourier features of the same SE-ARD kernel; the exact
evidence of the first 1,024 rows of a walker stream picks shorter length scales that predict
the rest worse: docs/results/stream-svdgp-closed-form). Then ``lam`` and the noises are
re-maximised exactly from the sums (the evidence of this model, from ``G``:
:meth:`~gpdyn.gp.ssgp.SSGP.best_lambda`) after ``reselect_every`` rows, and then whenever the rows
since the last selection reach ``reselect_growth`` of all the rows seen: ``k`` more rows move the
evidence of ``n`` by about ``k / n``, so a fixed fraction keeps the selection as fresh at every
length of the stream, while the eigendecomposition it costs (``O(M^3)``) grows rarer.

The bases. alpha starts as ``M_alpha`` rows of the first batch (drawn by the learner's seeded
generator): a stream's first rows are where the robot is, and a walker returns to them at every
stride. A stream that leaves them (an arm moving on to new trajectories) needs alpha to follow:
with ``grow_to > M_alpha``, a row whose kernel lies farther than ``novelty`` from alpha's span
(``k_1(x, x) - q_alpha(x)``) joins alpha before its chunk enters the sums, until alpha has
``grow_to`` points. The rows already summed keep no record of their own, so their value of a
new point's feature is taken as its projection on the old alpha (zero): the projection of the
past onto the basis of Csato & Opper's sparse online GP (2002). It is exact where the new point
is far from every summed row, and an approximation where it is not. beta stays alpha's first
``M_beta`` points.

An arm keeps moving on after alpha is full. With ``replace_after``, a full alpha makes room
for a chunk's novel rows by dropping the points of alpha (beyond beta) that no row has come
near (``k_1 >= exp(-1/2)``: within one length scale) for ``replace_after`` rows, at most once
per ``replace_every`` rows. Dropping is exact: ``k_1(alpha, x) = L phi(x)``, so the kept points'
Nystrom features are ``T phi(x)`` with ``T = L_keep^{-1} L[keep]`` (``L_keep`` the kept basis's
factor), and their sums, ``T G T^T`` and ``T B``, are those of every row seen on the smaller
alpha (``O(M^3)`` per drop).

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

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from gpdyn.gp.base import Learner, LearnerError, cholesky
from gpdyn.gp.kernels import se_ard
from gpdyn.gp.rls import check_sums_state, held_out_evidence, sums_log_evidence
from gpdyn.gp.ssgp import SSGP
from gpdyn.gp.variational import tri_solve


VISIT_KERNEL = math.exp(-0.5)  # a row this close to a point of alpha (one length scale) visits it
#: the most rows taken into the posterior by Woodbury's identity on the last factor of ``A`` before it is
#: factorised afresh: a control loop observes one row per step, and ``O(M^2)`` per row there beats a new
#: ``O(M^3)`` factor per step; a stream's chunk of 256 rows is factorised afresh
WOODBURY_ROWS = 32


def unit_kernel(x1: Tensor, x2: Tensor, lengthscale: Tensor) -> Tensor:
    """The unit-amplitude SE-ARD kernel ``k_1(x1, x2)``, ``[N1, N2]``."""
    return se_ard(x1, x2, lengthscale[None], lengthscale.new_ones(1))[0]


class StreamSVDGP(Learner):
    """SVDGP with ``a`` and ``B`` at the closed-form maximiser of its bound, updated per chunk (module docs).

    Options:
        m_alpha: the mean basis alpha, drawn from the first observed batch (all its rows when
            it has fewer).
        m_beta: the variance basis beta, the first ``m_beta`` points of alpha (``<= m_alpha``).
        grow_to: alpha's largest size: after the first batch, a row whose kernel is farther
            than ``novelty`` from alpha's span joins alpha, until it has this many points
            (module docs; ``m_alpha``, the default: alpha stays as drawn).
        novelty: the least residual variance ``k_1(x, x) - q_alpha(x)`` (unit amplitude, so in
            ``[0, 1]``) of a row that joins alpha.
        replace_after: once alpha is full, its points beyond beta that no row has come near for
            this many rows make room for novel rows (module docs; 0: alpha stays as it filled).
        replace_every: the fewest rows between two such replacements (each costs ``O(M^3)``).
        linear: ``c``, the scale of the linear features ``c [x, 1]`` (0: the SE-ARD kernel alone).
        calibrate_rows: the rows over which the variance scale follows the stream's errors
            (module docs; 0: no scale).
        jitter: added to the diagonal of the unit-amplitude ``K_alpha`` before its factorisation.
        reselect_growth: after the first ``reselect_every`` rows, reselect when the rows since the
            last selection reach this fraction of all rows seen (0: every ``reselect_every`` rows).
        features, select_iters, select_lr, reselect_every, noise_floor: :class:`~gpdyn.gp.ssgp.SSGP`'s
            selection and reselection (``features`` random frequencies score the evidence of the
            first batch; they are not the model's features).

    One-pass: :meth:`observe` conditions on its rows once, :meth:`step` learns nothing (it
    returns minus the log evidence per row, as :class:`~gpdyn.gp.rls.RecursiveBLR`).
    """

    name = "svdgp-stream"
    presets = {
        "small": {"m_alpha": 256, "m_beta": 64, "grow_to": 512, "features": 100, "reselect_every": 1024},
        "cpu": {"m_alpha": 850, "m_beta": 256, "grow_to": 1300},
        "paper": {"m_alpha": 2000, "m_beta": 500, "grow_to": 3000},
    }
    basis_options = ("m_alpha", "m_beta")
    capabilities = frozenset({"one_pass"})
    state_fields = ("initialized", "rows", "n", "lam", "noise", "lengthscale", "basis", "gram", "cross", "yy",
                    "since_select", "selection", "variance_scale", "generator", "visited", "replaced_at")

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        m_alpha: int = 850,
        m_beta: int = 256,
        grow_to: int | None = None,
        novelty: float = 0.5,
        replace_after: int = 4096,
        replace_every: int = 1024,
        linear: float = 1.0,
        calibrate_rows: int = 1024,
        jitter: float = 1e-6,
        features: int = 500,
        select_iters: int = 30,
        select_lr: float = 0.1,
        reselect_every: int | None = 4096,
        reselect_growth: float = 0.125,
        noise_floor: float = 1e-6,
        **kwargs: Any,
    ) -> None:
        for key, value in (("m_alpha", m_alpha), ("m_beta", m_beta)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LearnerError(f"StreamSVDGP: {key} must be an integer >= 1, got {value!r}")
        if m_beta > m_alpha:
            raise LearnerError(f"StreamSVDGP: m_beta ({m_beta}) must be <= m_alpha ({m_alpha}): beta is the first "
                               "m_beta points of alpha")
        grow_to = m_alpha if grow_to is None else grow_to
        if isinstance(grow_to, bool) or not isinstance(grow_to, int) or grow_to < m_alpha:
            raise LearnerError(f"StreamSVDGP: grow_to must be an integer >= m_alpha ({m_alpha}), got {grow_to!r}")
        if isinstance(novelty, bool) or not isinstance(novelty, (int, float)) or not 0 < novelty <= 1:
            raise LearnerError(f"StreamSVDGP: novelty must be in (0, 1], got {novelty!r}")
        for key, value in (("replace_after", replace_after), ("replace_every", replace_every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise LearnerError(f"StreamSVDGP: {key} must be an integer >= 0, got {value!r}")
        if isinstance(linear, bool) or not isinstance(linear, (int, float)) or not 0 <= linear < math.inf:
            raise LearnerError(f"StreamSVDGP: linear must be a finite number >= 0, got {linear!r}")
        if isinstance(calibrate_rows, bool) or not isinstance(calibrate_rows, int) or calibrate_rows < 0:
            raise LearnerError(f"StreamSVDGP: calibrate_rows must be an integer >= 0 (0: no scale), got {calibrate_rows!r}")
        if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 < jitter < math.inf:
            raise LearnerError(f"StreamSVDGP: jitter must be a finite number > 0, got {jitter!r}")
        if isinstance(reselect_growth, bool) or not isinstance(reselect_growth, (int, float)) or not 0 <= reselect_growth < math.inf:
            raise LearnerError(f"StreamSVDGP: reselect_growth must be a finite number >= 0, got {reselect_growth!r}")
        super().__init__(input_dim, output_dim, **kwargs)  # device, dtype, seed
        # the hyperparameter selection and reselection (its own options checked there)
        self.selector = SSGP(input_dim, output_dim, features=features, select_iters=select_iters, select_lr=select_lr,
                             reselect_every=reselect_every, noise_floor=noise_floor, device=self.device,
                             dtype=self.dtype, seed=self.seed)
        self.m_alpha, self.m_beta, self.grow_to, self.novelty = int(m_alpha), int(m_beta), int(grow_to), float(novelty)
        self.replace_after, self.replace_every = int(replace_after), int(replace_every)
        self.linear, self.jitter, self.calibrate_rows = float(linear), float(jitter), int(calibrate_rows)
        self.reselect_every, self.reselect_growth = self.selector.reselect_every, float(reselect_growth)
        self.config.update(m_alpha=self.m_alpha, m_beta=self.m_beta, grow_to=self.grow_to, novelty=self.novelty,
                           replace_after=self.replace_after, replace_every=self.replace_every,
                           linear=self.linear, calibrate_rows=self.calibrate_rows, jitter=self.jitter,
                           reselect_growth=self.reselect_growth,
                           **{k: self.selector.config[k] for k in ("features", "select_iters", "select_lr",
                                                                     "reselect_every", "noise_floor")})
        kw = {"device": self.device, "dtype": self.dtype}
        m = self.m_alpha + self.linear_dim
        self.initialized = False
        self.rows, self.n, self.lam, self.since_select = 0, 0.0, 1.0, 0
        self.noise = torch.ones(output_dim, **kw)
        self.lengthscale = torch.ones(input_dim, **kw)
        self.basis = torch.zeros(self.m_alpha, input_dim, **kw)
        # the rows seen when a row last came near each point of alpha; the rows at the last replacement
        self.visited = torch.zeros(self.m_alpha, dtype=torch.long, device=self.device)
        self.replaced_at = 0
        self.gram = torch.zeros(m, m, **kw)
        self.cross = torch.zeros(m, output_dim, **kw)
        self.yy = torch.zeros(output_dim, **kw)
        self.selection: dict[str, Any] = dict(self.selector.selection)
        self.variance_scale = torch.ones(output_dim, **kw)  # c_p
        self._after_load()

    # -- the features -----------------------------------------------------------------------
    @property
    def linear_dim(self) -> int:
        return self.input_dim + 1 if self.linear else 0

    @property
    def basis_size(self) -> int:
        """Points in alpha: ``m_alpha`` (or all the rows of a smaller first batch) and those it grew by."""
        return self.basis.shape[0]

    @property
    def beta_size(self) -> int:
        return min(self.m_beta, self.basis_size)

    def _kernel_factor(self, basis: Tensor, lengthscale: Tensor) -> Tensor:
        k = unit_kernel(basis, basis, lengthscale)
        return cholesky(k + self.jitter * torch.eye(k.shape[0], device=k.device, dtype=k.dtype))

    def _linear_features(self, x: Tensor) -> Tensor:
        return torch.cat([self.linear * x, x.new_full((x.shape[0], 1), self.linear)], dim=-1)

    def _with_linear(self, nystrom: Tensor, x: Tensor) -> Tensor:
        """The features ``[N, M]``: the Nystrom ones ``[N, M_alpha]`` and the linear ones of ``x``."""
        return torch.cat([nystrom, self._linear_features(x)], dim=-1) if self.linear else nystrom

    def _features(self, x: Tensor, basis: Tensor, lengthscale: Tensor, factor: Tensor) -> Tensor:
        """``[L^{-1} k_1(alpha, x); c x; c]^T``, ``[N, M]``."""
        return self._with_linear(tri_solve(factor, unit_kernel(basis, x, lengthscale)).T, x)

    def _basis_factor(self) -> Tensor:
        """The Cholesky factor of the unit-amplitude ``K_alpha`` (fixed once alpha is drawn)."""
        if self._kfactor is None:
            self._kfactor = self._kernel_factor(self.basis, self.lengthscale)
        return self._kfactor

    def _posterior(self) -> dict[str, Tensor]:
        """The factorisations and coefficients of the current sums, made once per observe.

        ``A = G + lam I`` is factorised afresh, or, while at most :data:`WOODBURY_ROWS` rows came in since
        its last factor ``L_0`` (and nothing else changed), ``A = L_0 (I + C C^T) L_0^T`` with
        ``C = L_0^{-1} Phi_new^T`` (kept by :meth:`observe`): ``E[w] = L_0^{-T} (v - C S^{-1} C^T v)`` with
        ``v = L_0^{-1} B`` and ``S = I + C^T C``, and ``log|A| = log|A_0| + log|S|`` (Woodbury's identity and
        the determinant lemma; exact, ``O(M^2 P)`` instead of ``O(M^3)``)."""
        if self._cache is None:
            kw = {"device": self.device, "dtype": self.dtype}
            base = self._base
            if base is None:
                factor = cholesky(self.gram + self.lam * torch.eye(self.gram.shape[0], **kw))  # A = G + lam I
                base = self._base = {"factor": factor, "logdet": 2.0 * factor.diagonal().log().sum(),
                                     "new": factor.new_zeros(factor.shape[0], 0)}
            factor, c = base["factor"], base["new"]
            if c.shape[1] == 0:  # A's own factor
                weights = torch.cholesky_solve(self.cross, factor)  # E[w] = A^{-1} B, [M, P]
                logdet = base["logdet"]
            else:
                v = tri_solve(factor, self.cross)
                s_factor = cholesky(torch.eye(c.shape[1], **kw) + c.T @ c)
                weights = tri_solve(factor, v - c @ torch.cholesky_solve(c.T @ v, s_factor), transpose=True)
                logdet = base["logdet"] + 2.0 * s_factor.diagonal().log().sum()
                factor = None  # A's own factor is not at hand
            kfactor = self._basis_factor()
            m, mb = self.basis_size, self.beta_size
            if mb == m and factor is not None:
                beta_factor = factor
            else:  # A_beta: beta's Nystrom and the linear features' block of G, plus lam I
                beta = torch.cat([torch.arange(mb, device=self.device),
                                  torch.arange(m, self.gram.shape[0], device=self.device)])
                beta_factor = cholesky(self.gram[beta][:, beta] + self.lam * torch.eye(beta.numel(), **kw))
            self._cache = {
                "weights": weights,
                # eq. (8)'s a = L^{-T} E[w] on alpha, and the linear weights
                "a": tri_solve(kfactor, weights[:m], transpose=True), "linear": weights[m:],
                "beta_factor": beta_factor, "beta_kfactor": kfactor[:mb, :mb],
                "logdet": logdet,
            }
        return self._cache

    # -- the contract ------------------------------------------------------------------------
    @torch.no_grad()
    def observe(self, x: Tensor, y: Tensor) -> None:
        """Add ``x [k, D]``, ``y [k, P]`` to the sums exactly: ``O(k M^2 + M^3)``. The first call
        selects the hyperparameters and draws alpha from its rows. Bad input raises before any change."""
        first = not self.initialized
        if first:
            start = self.selector.select(x, y)
            pick = torch.randperm(x.shape[0], generator=self.generator)[: self.m_alpha].to(x.device)
            basis = x[pick].to(self.dtype).clone()
            lengthscale = start["lengthscale"].to(self.dtype)
            kfactor = self._kernel_factor(basis, lengthscale)
            phi = self._features(x, basis, lengthscale, kfactor)
            f = phi.shape[1]  # alpha may be smaller than m_alpha: the sums start at its size
            self.gram, self.cross = phi.new_zeros(f, f), phi.new_zeros(f, self.output_dim)
            self.basis, self.lengthscale, self._kfactor = basis, lengthscale, kfactor
            self.visited = torch.zeros(basis.shape[0], dtype=torch.long, device=self.device)
            self.lam, self.noise, self.selection = start["lam"], start["noise"], start["selection"]
            self.initialized = True
        else:
            if self.calibrate_rows:
                self._calibrate(x, y)
            k = self._basis_kernel(x)
            if self.replace_after:
                self.visited = torch.where((k >= VISIT_KERNEL).any(0), self.rows + x.shape[0], self.visited)
            if self.basis_size < self.grow_to or self._may_replace():
                phi = self._grow(x, k)
            else:
                phi = self._with_linear(tri_solve(self._basis_factor(), k.T).T, x)
            if phi is None:  # alpha grew: the features on the alpha of now
                phi = self._features(x, self.basis, self.lengthscale, self._basis_factor())
        self.gram = torch.addmm(self.gram, phi.T, phi)
        self.cross = torch.addmm(self.cross, phi.T, y)
        self.yy = self.yy + (y * y).sum(0)
        base = self._base  # None until a prediction has factorised A (the first batch has none)
        if base is not None and base["new"].shape[1] + x.shape[0] <= WOODBURY_ROWS:
            base["new"] = torch.cat([base["new"], tri_solve(base["factor"], phi.T)], dim=1)  # C = L_0^{-1} Phi^T
        else:
            self._base = None
        self.n += x.shape[0]
        self.rows += x.shape[0]
        self.since_select = 0 if first else self.since_select + x.shape[0]  # the first batch was just selected on
        self._cache = None
        if self.reselect_every and self.since_select >= max(self.reselect_every, self.reselect_growth * self.rows):
            self.reselect()

    def _grow(self, x: Tensor, k: Tensor) -> Tensor | None:
        """Add the rows of ``x`` farther than ``novelty`` from alpha's span to alpha, the farthest
        first (each one added lowers the others' distance), until alpha has ``grow_to`` points;
        return the features of ``x`` when none was added (they were computed to find the novel rows).
        ``k = k_1(x, alpha)``, ``[N, M_alpha]``.

        A point added to alpha adds one Nystrom feature, ``(k_1(z, x) - l^T phi(x)) / d`` with
        ``l = L^{-1} k_1(alpha, z)`` and ``d^2 = k_1(z, z) - |l|^2`` (the new last row of the
        Cholesky factor; the old features are unchanged): the novelty of the other rows falls by
        its square. The rows already in the sums are
        kept only through them: their value of the new feature is taken as zero, i.e. their
        ``k_1(z, x_i)`` as its projection on the old alpha, ``l^T phi(x_i)`` (the projection of
        the past onto the basis that Csato & Opper's sparse online GP makes). A row that is far
        from alpha is far from the rows alpha covers, where that projection is close to exact.
        The new feature's rows and columns of the sums therefore start at zero."""
        phi = tri_solve(self._basis_factor(), k.T)  # [m, k]
        residual = (1.0 + self.jitter - phi.square().sum(0)).clamp_min(0.0)  # k_1(x, x) - q_alpha(x)
        if self.basis_size == self.grow_to:  # full: room for the novel rows, from the points the stream has left
            transform = self._drop_stale(int((residual >= self.novelty).sum()))  # a host decision
            if transform is None:
                return self._with_linear(phi.T, x)
            phi = transform @ phi  # the features on the kept alpha
            residual = (1.0 + self.jitter - phi.square().sum(0)).clamp_min(0.0)
        m = self.basis_size
        rows: list[Tensor] = []
        new_phi: list[Tensor] = []  # the new features at the rows of x
        while m + len(rows) < self.grow_to:
            j = int(residual.argmax())  # the basis grows on the host's decision (a sync on a GPU)
            d2 = float(residual[j])
            if d2 < self.novelty:
                break
            d = math.sqrt(d2)
            k_zx = unit_kernel(x[j: j + 1], x, self.lengthscale)[0]  # [k]
            feature = k_zx - phi[:, j] @ phi  # minus l^T phi(x), over the old features and the new ones
            if new_phi:
                added = torch.stack(new_phi)
                feature = feature - added[:, j] @ added
            feature = feature / d
            rows.append(x[j])
            new_phi.append(feature)
            residual = (residual - feature.square()).clamp_min(0.0)
            residual[j] = 0.0
        if not rows:
            return self._with_linear(phi.T, x)
        r = len(rows)
        f_old = self.gram.shape[0]
        f_new = f_old + r
        keep = torch.cat([torch.arange(m, device=self.device), torch.arange(m + r, f_new, device=self.device)])
        gram = self.gram.new_zeros(f_new, f_new)
        gram[keep[:, None], keep[None, :]] = self.gram
        cross = self.cross.new_zeros(f_new, self.output_dim)
        cross[keep] = self.cross
        self.basis = torch.cat([self.basis, torch.stack(rows)])
        self.visited = torch.cat([self.visited, self.visited.new_full((r,), self.rows + x.shape[0])])
        # the factor of the grown K_alpha afresh (its leading block is the old factor, to rounding),
        # as a checkpoint's load makes it
        self.gram, self.cross, self._kfactor, self._cache, self._base = gram, cross, None, None, None
        return None

    def _may_replace(self) -> bool:
        return bool(self.replace_after) and self.rows - self.replaced_at >= self.replace_every

    def _drop_stale(self, wanted: int) -> Tensor | None:
        """Drop up to ``wanted`` points of alpha beyond beta that no row has come near for
        ``replace_after`` rows, the longest unvisited first (module docs: exact); return ``T``, the
        kept features from the old ones ``[M_keep, M]``, or None when none was dropped."""
        age = self.rows - self.visited
        age[: self.beta_size] = -1  # beta is never dropped
        stale = (age >= self.replace_after).nonzero().squeeze(1)
        if wanted == 0 or stale.numel() == 0:
            return None
        stale = stale[age[stale].argsort(descending=True)[:wanted]].sort().values
        m = self.basis_size
        dropped = torch.zeros(m, dtype=torch.bool, device=self.device)
        dropped[stale] = True
        keep = (~dropped).nonzero().squeeze(1)
        new = self._kernel_factor(self.basis[keep], self.lengthscale)
        t = tri_solve(new, self._basis_factor()[keep])  # T = L_keep^{-1} L[keep]
        g, c = self.gram, self.cross
        nystrom = t @ g[:m, :m] @ t.T
        mixed = t @ g[:m, m:]
        self.gram = torch.cat([torch.cat([0.5 * (nystrom + nystrom.T), mixed], 1),
                               torch.cat([mixed.T, g[m:, m:]], 1)])
        self.cross = torch.cat([t @ c[:m], c[m:]])
        self.basis, self.visited = self.basis[keep], self.visited[keep]
        self._kfactor, self._cache, self._base = new, None, None
        self.replaced_at = self.rows
        return t

    def reselect(self) -> None:
        """Re-maximise ``lam`` and the noises exactly from the sums now (as ``reselect_every`` does)."""
        self._need_data("reselect")
        self.lam, self.noise, ev = self.selector.best_lambda(self.gram, self.cross, self.yy, self.n, current=self.lam)
        self.selection = {**self.selection, "evidence": ev, "reselections": self.selection["reselections"] + 1}
        self.since_select = 0
        self._cache = self._base = None

    def _need_data(self, where: str) -> None:
        if not self.initialized:
            raise LearnerError(f"StreamSVDGP.{where}: no data observed yet (call observe first)")

    def step(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        """Nothing to optimise between observations: returns ``loss``, minus the log evidence of
        everything observed per row (mean over outputs, a 0-d tensor, no host sync)."""
        if not self.initialized:
            return {"loss": self.noise.new_full((), math.nan)}
        return {"loss": -(self.log_evidence() / max(self.n, 1e-300)).mean()}

    @torch.no_grad()
    def log_evidence(self) -> Tensor:
        """``log p(y_p)`` of everything observed under the model's features, per output ``[P]``
        (the evidence of :mod:`gpdyn.gp.rls`)."""
        self._need_data("log_evidence")
        post = self._posterior()
        return sums_log_evidence(self.yy, self.cross, post["weights"], self.n, self.noise, post["logdet"], self.lam)

    @torch.no_grad()
    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Latent mean (eq. (8) on alpha) and variance ``rho_p^2 (1 - |phi_beta|^2) + s_p psi^T A_beta^{-1} psi``
        with ``psi`` beta's Nystrom and the linear features, ``A_beta`` their block of ``G`` plus ``lam I``."""
        self._need_data("predict")
        lead = x.shape[:-1]
        xf = x.reshape(-1, self.input_dim)
        post = self._posterior()
        k = unit_kernel(xf, self.basis, self.lengthscale)  # [N, M_alpha]
        mean = self._mean(xf, k, post)
        nystrom = tri_solve(post["beta_kfactor"], k[:, : self.beta_size].T).T  # beta's Nystrom features
        psi = self._with_linear(nystrom, xf)
        quad = tri_solve(post["beta_factor"], psi.T).square().sum(0)  # psi^T A_beta^{-1} psi
        residual = (1.0 - nystrom.square().sum(-1)).clamp_min(0.0)  # k_1(x, x) - q_beta(x)
        var = quad[:, None] * self.noise + residual[:, None] * (self.noise / self.lam)
        self._last_predict = (x, self._memo_key(x), mean.clone(), var, k)
        var = var * self.variance_scale
        return mean.reshape(*lead, self.output_dim), var.reshape(*lead, self.output_dim)

    @torch.no_grad()
    def predict_mean(self, x: Tensor) -> Tensor:
        """Latent mean only, eq. (8): ``O(N M_alpha D)``."""
        self._need_data("predict_mean")
        lead = x.shape[:-1]
        xf = x.reshape(-1, self.input_dim)
        mean = self._mean(xf, unit_kernel(xf, self.basis, self.lengthscale), self._posterior())
        return mean.reshape(*lead, self.output_dim)

    def _mean(self, x: Tensor, k: Tensor, post: Mapping[str, Tensor]) -> Tensor:
        """Eq. (8)'s ``k_{x,alpha} a`` from ``k = k_1(x, alpha)``, plus the linear term."""
        mean = k @ post["a"]
        return mean + self._linear_features(x) @ post["linear"] if self.linear else mean

    def noise_variance(self) -> Tensor:
        return self.noise * self.variance_scale

    @torch.no_grad()
    def vlb(self, x: Tensor, y: Tensor) -> Tensor:
        """Held-out log evidence per point, ``log p(y | x, data) / N``, ``[P]``
        (:func:`~gpdyn.gp.rls.held_out_evidence` on the model's features, its uncalibrated noise)."""
        self._need_data("vlb")
        post = self._posterior()
        phi = self._features(x, self.basis, self.lengthscale, self._basis_factor())
        return held_out_evidence(self.gram, self.lam, post["logdet"], post["weights"], self.noise, phi, y)

    def diagnostics(self) -> dict[str, float]:
        return {"lambda": self.lam, "reselections": float(self.selection["reselections"]),
                "alpha_points": float(self.basis_size)}

    # -- the calibrated variance ---------------------------------------------------------------
    def _memo_key(self, x: Tensor) -> tuple[Any, ...]:
        """The same tensor, unchanged since (its version counter), and the same sums: the
        prequential rule observes the very rows it just predicted. Compared without reading the
        values, so without a host sync on a GPU."""
        return (x._version, self.rows, self.lam)

    def _memo_of(self, x: Tensor) -> tuple[Tensor, tuple[Any, ...], Tensor, Tensor, Tensor] | None:
        """The last prediction when it was of ``x`` itself (unchanged) on the sums of now, else None."""
        memo = self._last_predict
        return memo if memo is not None and memo[0] is x and memo[1] == self._memo_key(x) else None

    def _basis_kernel(self, x: Tensor) -> Tensor:
        """``k_1(x, alpha)``, ``[N, M_alpha]``: the last prediction's when it was of these very rows
        (the prequential rule observes the rows it just predicted), else computed."""
        memo = self._memo_of(x)
        return memo[4] if memo is not None else unit_kernel(x, self.basis, self.lengthscale)

    @torch.no_grad()
    def _calibrate(self, x: Tensor, y: Tensor) -> None:
        """Update ``variance_scale`` from the prediction of ``x, y`` made before they enter the sums."""
        memo = self._memo_of(x)
        if memo is not None:
            mean, var = memo[2], memo[3] * self.variance_scale
        else:
            mean, var = self.predict(x)
        ratio = ((y - mean).pow(2) / (var + self.noise_variance())).mean(dim=0)
        keep = math.exp(-x.shape[0] / self.calibrate_rows)  # the weight of the rows before this batch
        self.variance_scale = self.variance_scale * (keep + (1.0 - keep) * ratio)

    # -- checkpoints -------------------------------------------------------------------------
    def _state_shapes(self, state: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        where = "StreamSVDGP.load_state_dict"
        check_sums_state(state, where, counters=("rows", "since_select"))
        basis = state["basis"]
        k = basis.shape[0] if isinstance(basis, Tensor) and basis.dim() == 2 else -1
        if not 1 <= k <= self.grow_to:
            raise LearnerError(f"{where}: basis must be [k, {self.input_dim}] with 1 <= k <= grow_to = {self.grow_to}, "
                               f"got {tuple(basis.shape) if isinstance(basis, Tensor) else basis!r}")
        f = k + self.linear_dim
        return {"basis": (k, self.input_dim), "gram": (f, f), "cross": (f, self.output_dim), "visited": (k,)}

    def _after_load(self) -> None:
        self.n, self.lam = float(self.n), float(self.lam)
        self._cache: dict[str, Tensor] | None = None
        # the last factor of A made afresh, its log-determinant and C = L_0^{-1} Phi^T of the rows since (_posterior)
        self._base: dict[str, Tensor] | None = None
        self._kfactor: Tensor | None = None
        # the rows last predicted (the tensor itself, kept), what identifies them, the mean, the
        # unscaled variance and k_1(x, alpha)
        self._last_predict: tuple[Tensor, tuple[Any, ...], Tensor, Tensor, Tensor] | None = None


__all__ = ["StreamSVDGP", "unit_kernel"]
