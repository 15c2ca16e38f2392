"""Recursive Bayesian linear regression on a fixed feature map, and its plainest learner, RLS.

:class:`RecursiveBLR` is exact Bayesian linear regression (BLR) on ``M`` features
``phi(x)``, one weight vector per output, updated as rows arrive. For ``P`` outputs with
targets ``Y [n, P]`` and features ``Phi [n, M]``::

    y_p = Phi w_p + eps_p,    eps_p ~ N(0, s_p I),    w_p ~ N(0, (s_p / lam) I)

so every output has its own noise variance ``s_p`` and the outputs share the ratio
``lam`` (the ridge): their posteriors share one precision matrix::

    A = Phi^T Phi + lam I,    E[w_p] = A^{-1} Phi^T y_p,    Cov[w_p] = s_p A^{-1}

and a prediction at ``x`` has latent mean ``phi(x)^T A^{-1} Phi^T y_p`` and variance
``s_p phi(x)^T A^{-1} phi(x)``. The evidence of output ``p`` depends on the data only through
the sufficient statistics ``G = Phi^T Phi``, ``B = Phi^T Y``, ``y^T y`` and ``n``::

    log p(y_p) = -n/2 log(2 pi s_p) - 1/2 (log|A| - M log lam) - Q_p / (2 s_p),
    Q_p = y_p^T y_p - b_p^T A^{-1} b_p

(``log|I + Phi Phi^T / lam| = log|A| - M log lam``; ``Q_p`` is the penalised residual sum of
squares, ``||y_p - Phi E[w_p]||^2 + lam ||E[w_p]||^2``). For a fixed ``lam`` the noise that
maximises it is ``s_p = Q_p / n`` (Bishop 2006, PRML Sec. 3.5).

The learner keeps ``G``, ``B``, ``y^T y``, ``n`` exactly (sums, in the learner's dtype) and
the inverse ``A^{-1}`` with ``log|A|``. A chunk of ``k`` rows updates the inverse by the
Woodbury identity, a rank-``k`` step of ``O(k M^2)``::

    A'^{-1} = A^{-1} - A^{-1} Phi_k^T (I_k + Phi_k A^{-1} Phi_k^T)^{-1} Phi_k A^{-1},
    log|A'| = log|A| + log|I_k + Phi_k A^{-1} Phi_k^T|

and refreshes it from the exact statistics (a Cholesky factorisation of ``G + lam I``,
``O(M^3)``) where that is cheaper (``2 k >= M``) or once the rows taken in by Woodbury
steps since the last refresh would reach ``M``: rounding in the recursive inverse never
builds up, and the refreshes cost ``O(M^2)`` per row amortised, the order of the Woodbury
step itself. Nothing is ever refactorised per row.

It is a one-pass learner: :meth:`observe` conditions on its rows once and for good, a row
observed twice counts twice, and :meth:`step` learns nothing from its minibatch (the
protocols observe a batch before they step on it).

:class:`RLS` is recursive least squares (Haykin, "Adaptive Filter Theory") in
this form: the features are the raw inputs and a bias column, ``P = A^{-1} = (X^T X +
delta I)^{-1}``, with an optional exponential forgetting factor.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from gpdyn.gp.base import LOG_2PI, Learner, LearnerError, cholesky


def check_sums_state(state: Mapping[str, Any], where: str, counters: tuple[str, ...]) -> None:
    """LearnerError naming the field unless a checkpoint of a learner kept by sums (this module's
    model) has its ``counters`` integers >= 0, ``n`` and ``lam`` finite (``lam > 0``) and
    ``initialized`` a bool."""
    for key in counters:
        if type(state[key]) is not int or state[key] < 0:
            raise LearnerError(f"{where}: {key} must be an integer >= 0, got {state[key]!r}")
    for key in ("n", "lam"):
        value = state[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise LearnerError(f"{where}: {key} must be a finite number >= 0, got {value!r}")
    if not state["lam"] > 0:
        raise LearnerError(f"{where}: lam must be > 0, got {state['lam']!r}")
    if not isinstance(state["initialized"], bool):
        raise LearnerError(f"{where}: initialized must be True or False, got {state['initialized']!r}")


def sums_log_evidence(yy: Tensor, cross: Tensor, weights: Tensor, n: float, noise: Tensor, logdet: Tensor,
                      lam: float) -> Tensor:
    """``log p(y_p)`` per output ``[P]`` of the model of the module docs from its sums: ``y^T y``,
    ``B``, the posterior means ``A^{-1} B`` and ``log|A|`` (``A`` of ``M = B.shape[0]`` features)."""
    q = (yy - (cross * weights).sum(0)).clamp_min(0.0)
    return (-0.5 * n * (LOG_2PI + noise.log()) - 0.5 * (logdet - cross.shape[0] * math.log(lam))
            - 0.5 * q / noise)


def held_out_evidence(gram: Tensor, lam: float, logdet: Tensor, weights: Tensor, noise: Tensor, phi: Tensor,
                      y: Tensor) -> Tensor:
    """``log p(y | data) / N`` per output ``[P]`` of the rows ``phi [N, M]``, ``y [N, P]`` given the
    sums (``G``, ``log|A|``, ``A^{-1} B``): ``log N(r_p; 0, s_p (I + Phi_* A^{-1} Phi_*^T))`` with
    ``r = y - Phi_* A^{-1} B``, through the determinant lemma and Woodbury in feature space:
    ``A_* = A + Phi_*^T Phi_*``, ``log|I + Phi_* A^{-1} Phi_*^T| = log|A_*| - log|A|``,
    ``r^T (...)^{-1} r = r^T r - (Phi_*^T r)^T A_*^{-1} (Phi_*^T r)``; ``O(N M^2 + M^3)``."""
    n = phi.shape[0]
    r = y - phi @ weights
    eye = torch.eye(gram.shape[0], device=gram.device, dtype=gram.dtype)
    f_new = cholesky(gram + lam * eye + phi.T @ phi)
    s = torch.linalg.solve_triangular(f_new, phi.T @ r, upper=False)  # [M, P]
    quad = (r * r).sum(0) - (s * s).sum(0)
    logp = -0.5 * n * (LOG_2PI + noise.log()) - 0.5 * (2.0 * f_new.diagonal().log().sum() - logdet) - 0.5 * quad / noise
    return logp / n


class RecursiveBLR(Learner):
    """Exact BLR on a fixed feature map, updated recursively (see the module docs).

    A subclass defines :attr:`feature_dim` and :meth:`features`, and may start its
    hyperparameters on the first batch (:meth:`_start`) or revise them as rows arrive
    (:meth:`_after_absorb`). Its options: ``noise_floor`` (the least noise variance,
    default 1e-6).

    State: the sufficient statistics ``gram`` (``G [M, M]``), ``cross`` (``B [M, P]``),
    ``yy`` (``[P]``), ``n`` (rows, weighted by the forgetting factor where there is one)
    and ``rows`` (rows observed); the ridge ``lam``, the noise variances ``noise [P]``, the
    inverse ``inverse`` (``A^{-1}``) with ``logdet`` (``log|A|``) and ``fresh`` (rows taken in
    by Woodbury steps since the inverse was last refreshed).
    """

    capabilities = frozenset({"one_pass"})
    state_fields = ("initialized", "rows", "n", "lam", "noise", "gram", "cross", "yy", "inverse", "logdet", "fresh",
                    "generator")
    #: the exponential forgetting factor (1: none); RLS makes it an option
    forgetting: float = 1.0

    def __init__(self, input_dim: int, output_dim: int, *, noise_floor: float = 1e-6, **kwargs: Any) -> None:
        super().__init__(input_dim, output_dim, **kwargs)  # device, dtype, seed
        if not (math.isfinite(noise_floor) and noise_floor > 0):
            raise LearnerError(f"{type(self).__name__}: noise_floor must be > 0, got {noise_floor}")
        self.noise_floor = float(noise_floor)
        self.config["noise_floor"] = self.noise_floor
        m, p = self.feature_dim, self.output_dim
        kw = {"device": self.device, "dtype": self.dtype}
        self.initialized = False
        self.rows = 0
        self.n = 0.0
        self.lam = 1.0
        self.noise = torch.ones(p, **kw)
        self.gram = torch.zeros(m, m, **kw)
        self.cross = torch.zeros(m, p, **kw)
        self.yy = torch.zeros(p, **kw)
        self.inverse = torch.eye(m, **kw)  # A^{-1} at lam = 1 with no data
        self.logdet = torch.zeros((), **kw)
        self.fresh = 0
        self._weights: Tensor | None = None  # A^{-1} B, the posterior means [M, P]

    # -- what a subclass defines -------------------------------------------------------
    @property
    @abc.abstractmethod
    def feature_dim(self) -> int:
        """``M``, the number of features."""

    @abc.abstractmethod
    def features(self, x: Tensor) -> Tensor:
        """``phi(x)``, ``[N, M]`` for ``x [N, D]``."""

    def _start(self, x: Tensor, y: Tensor) -> dict[str, Any]:
        """Hyperparameters from the first batch, as ``{attribute: value}`` (set by the caller
        together with the statistics, so that a failure changes nothing); none by default."""
        return {}

    def _features_with(self, x: Tensor, start: dict[str, Any]) -> Tensor:
        """``phi(x)`` at the hyperparameters ``start`` just selected (the first batch's features)."""
        return self.features(x)

    def _after_absorb(self, new: dict[str, Any], k: int) -> None:
        """Revise the hyperparameters in ``new`` (the state after ``k`` more rows) in place."""

    # -- the statistics ----------------------------------------------------------------
    def _refresh(self, gram: Tensor, lam: float) -> tuple[Tensor, Tensor]:
        """``A^{-1}`` and ``log|A|`` of ``A = gram + lam I`` from a Cholesky factorisation, ``O(M^3)``."""
        a = gram + lam * torch.eye(gram.shape[0], device=gram.device, dtype=gram.dtype)
        factor = cholesky(a)
        inverse = torch.cholesky_inverse(factor)
        # row-major like a restored checkpoint's: a matmul's rounding follows its operands' layout
        return (0.5 * (inverse + inverse.T)).contiguous(), 2.0 * factor.diagonal().log().sum()

    def _absorb(self, phi: Tensor, y: Tensor, start: dict[str, Any]) -> dict[str, Any]:
        """The state after rows ``phi [k, M]``, ``y [k, P]`` (computed aside, nothing set)."""
        k, m = phi.shape
        beta = self.forgetting
        new: dict[str, Any] = {"lam": self.lam, "noise": self.noise, **start}
        if beta == 1.0:
            new["gram"] = torch.addmm(self.gram, phi.T, phi)
            new["cross"] = torch.addmm(self.cross, phi.T, y)
            new["yy"] = self.yy + (y * y).sum(0)
            new["n"] = self.n + k
        else:  # the newest row weighs 1, a row j rows older beta^j, the old sums beta^k
            ages = torch.arange(k - 1, -1, -1, device=phi.device, dtype=phi.dtype)
            root = torch.pow(torch.full_like(ages, beta), 0.5 * ages)[:, None]  # sqrt of the weights
            pw, yw = phi * root, y * root
            decay = beta**k
            new["gram"] = decay * self.gram + pw.T @ pw
            new["cross"] = decay * self.cross + pw.T @ yw
            new["yy"] = decay * self.yy + (yw * yw).sum(0)
            new["n"] = decay * self.n + (1.0 - decay) / (1.0 - beta)
        new["rows"] = self.rows + k
        # Woodbury while it is cheaper than a refresh and the rows it took in stay below M;
        # a new lam, or forgetting (which changes A by more than rank k), needs the refresh
        woodbury = ("lam" not in start and beta == 1.0 and 2 * k < m and self.fresh + k < m)
        if woodbury:
            u = phi @ self.inverse  # [k, M]
            c = torch.eye(k, device=phi.device, dtype=phi.dtype) + u @ phi.T
            factor = cholesky(c)
            v = torch.linalg.solve_triangular(factor, u, upper=False)  # L_c^{-1} Phi_k A^{-1}
            new["inverse"] = torch.addmm(self.inverse, v.T, v, alpha=-1.0)  # symmetric again at the refresh
            new["logdet"] = self.logdet + 2.0 * factor.diagonal().log().sum()
            new["fresh"] = self.fresh + k
        else:
            new["inverse"], new["logdet"] = self._refresh(new["gram"], new["lam"])
            new["fresh"] = 0
        self._after_absorb(new, k)
        return new

    @staticmethod
    def profile_noise(yy: Tensor, cross: Tensor, weights: Tensor, n: float, floor: float) -> Tensor:
        """The noise variances ``s_p = Q_p / n`` that maximise the evidence at the current
        ``lam`` (floored), ``Q_p = y_p^T y_p - b_p^T A^{-1} b_p``; ``weights = A^{-1} B``."""
        q = (yy - (cross * weights).sum(0)).clamp_min(0.0)
        return (q / max(n, 1e-300)).clamp_min(floor)

    # -- the contract ------------------------------------------------------------------
    @torch.no_grad()
    def observe(self, x: Tensor, y: Tensor) -> None:
        """Condition on ``x [k, D]``, ``y [k, P]`` exactly: ``O(k M^2)`` (module docs). The first
        call starts the hyperparameters from its rows. Bad input raises before any change."""
        start = self._start(x, y) if not self.initialized else {}
        new = self._absorb(self._features_with(x, start), y, start)
        for key, value in new.items():
            setattr(self, key, value)
        self.initialized = True
        self._weights = None

    def _posterior_weights(self) -> Tensor:
        """``A^{-1} B`` ``[M, P]``, kept until the next observe (no host sync)."""
        if self._weights is None:
            self._weights = self.inverse @ self.cross
        return self._weights

    def _need_data(self, where: str) -> None:
        if not self.initialized:
            raise LearnerError(f"{type(self).__name__}.{where}: no data observed yet (call observe first)")

    @torch.no_grad()
    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Latent mean ``phi^T A^{-1} B`` and variance ``s_p phi^T A^{-1} phi``, ``[..., P]`` each
        (``O(N M^2)``)."""
        self._need_data("predict")
        lead = x.shape[:-1]
        phi = self.features(x.reshape(-1, self.input_dim))
        mean = phi @ self._posterior_weights()
        quad = ((phi @ self.inverse) * phi).sum(-1).clamp_min(0.0)
        var = quad[:, None] * self.noise
        return mean.reshape(*lead, self.output_dim), var.reshape(*lead, self.output_dim)

    @torch.no_grad()
    def predict_mean(self, x: Tensor) -> Tensor:
        """Latent mean only, ``O(N M P)``: none of the variance's ``O(N M^2)``."""
        self._need_data("predict_mean")
        lead = x.shape[:-1]
        mean = self.features(x.reshape(-1, self.input_dim)) @ self._posterior_weights()
        return mean.reshape(*lead, self.output_dim)

    def noise_variance(self) -> Tensor:
        return self.noise.clone()

    @torch.no_grad()
    def log_evidence(self) -> Tensor:
        """``log p(y_p)`` of everything observed, per output ``[P]``, from the sufficient statistics
        (module docs; with forgetting, of the discounted likelihood). No host sync."""
        self._need_data("log_evidence")
        return sums_log_evidence(self.yy, self.cross, self._posterior_weights(), self.n, self.noise, self.logdet,
                                 self.lam)

    def step(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        """Nothing to optimise between observations (a one-pass learner): returns ``loss``, minus the
        log evidence of everything observed per row, the mean over outputs (a 0-d tensor, no host
        sync). The minibatch is not learned from."""
        if not self.initialized:
            return {"loss": self.noise.new_full((), math.nan)}
        return {"loss": -(self.log_evidence() / max(self.n, 1e-300)).mean()}

    @torch.no_grad()
    def vlb(self, x: Tensor, y: Tensor) -> Tensor:
        """Held-out log evidence per point, ``log p(y | x, data) / N``, ``[P]``: the joint predictive
        density of the batch (noise included), i.e. how much the log evidence would grow if the
        batch were observed (``log p(data, batch) - log p(data)``; :func:`held_out_evidence`, with
        ``log|A|`` factorised afresh). The learner is not changed."""
        self._need_data("vlb")
        eye = torch.eye(self.feature_dim, device=self.device, dtype=self.dtype)
        logdet = 2.0 * cholesky(self.gram + self.lam * eye).diagonal().log().sum()
        return held_out_evidence(self.gram, self.lam, logdet, self._posterior_weights(), self.noise,
                                 self.features(x), y)

    # -- checkpoints -------------------------------------------------------------------
    def _state_shapes(self, state: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        check_sums_state(state, f"{type(self).__name__}.load_state_dict", counters=("rows", "fresh"))
        return {}

    def _after_load(self) -> None:
        self.n = float(self.n)
        self.lam = float(self.lam)
        self._weights = None


class RLS(RecursiveBLR):
    """Recursive least squares on the raw inputs and a bias column, one weight vector per output.

    The features are ``[x, 1]`` (``M = D + 1``); ``P = (X^T X + delta I)^{-1}`` is shared by the
    outputs and updated per chunk by the Woodbury identity (a rank-``k`` step, or a refresh
    from ``X^T X`` where that is cheaper: for ``k >= M / 2``, so a chunk of 256 rows of a
    23-dimensional problem costs ``O(M^3 + k M^2)`` with ``M = 24``); the weights are
    ``P X^T y_p``, and the prediction at ``x`` has latent variance ``s_p x^T P x``.

    The model is the BLR of the module docs with ``lam = delta``: ``w_p ~ N(0, (s_p / delta) I)``.
    ``s_p``, the running residual variance, is the noise that maximises that model's evidence
    given ``delta``, ``(y_p^T y_p - b_p^T P b_p) / n`` (the penalised residual sum of squares per
    row), recomputed from the sufficient statistics after every :meth:`observe` (``O(M^2 P)``);
    it is biased low by about ``gamma / n``, ``gamma = tr(X^T X P) <= M``, nothing once
    ``n >> M``. :meth:`vlb` is the evidence of a held-out batch given the data
    (:meth:`RecursiveBLR.vlb`), :meth:`step`'s loss minus the evidence of the data per row.

    Options:
        delta: the ridge (default 1e-2): ``P`` starts at ``I / delta``; in the BLR, the prior
            variance of a weight is ``s_p / delta``.
        forgetting: the exponential forgetting factor ``beta`` in ``(0, 1]`` (default 1: none).
            Below 1 a row ``j`` rows older than the newest weighs ``beta^j`` in ``X^T X``,
            ``X^T y``, ``y^T y`` and ``n``, and the ridge stays ``delta`` (regularised
            exponentially weighted RLS: S. Gunnarsson, "Combining tracking and
            regularization in recursive least squares identification", IEEE CDC 1996): with the
            classic form, whose ``P^{-1}`` decays as a whole, ``P`` grows without bound in
            the directions the inputs stop exciting. ``A`` then changes by more than rank k
            per chunk, so each chunk refreshes ``P`` from the statistics, ``O(M^3)``, cheap
            at ``M = D + 1``.
        noise_floor: the least noise variance (default 1e-6).
    """

    name = "rls"
    # no sizes: the features are the inputs (the presets are all the constructor's defaults)
    presets = {"small": {}, "cpu": {}, "paper": {}}

    def __init__(self, input_dim: int, output_dim: int, *, delta: float = 1e-2, forgetting: float = 1.0,
                 **kwargs: Any) -> None:
        if not (math.isfinite(delta) and delta > 0):
            raise LearnerError(f"RLS: delta must be > 0, got {delta}")
        if not (math.isfinite(forgetting) and 0 < forgetting <= 1):
            raise LearnerError(f"RLS: forgetting must be in (0, 1], got {forgetting}")
        self._m = int(input_dim) + 1
        super().__init__(input_dim, output_dim, **kwargs)
        self.forgetting = float(forgetting)
        self.config.update(delta=float(delta), forgetting=self.forgetting)
        self.lam = float(delta)
        self.inverse = self.inverse / self.lam

    @property
    def feature_dim(self) -> int:
        return self._m

    def features(self, x: Tensor) -> Tensor:
        return torch.cat([x, torch.ones_like(x[..., :1])], dim=-1)

    def _after_absorb(self, new: dict[str, Any], k: int) -> None:
        weights = new["inverse"] @ new["cross"]
        new["noise"] = self.profile_noise(new["yy"], new["cross"], weights, new["n"], self.noise_floor)


__all__ = ["RLS", "RecursiveBLR", "check_sums_state", "held_out_evidence", "sums_log_evidence"]
