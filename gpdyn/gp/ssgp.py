"""I-SSGP: incremental sparse spectrum GP regression (Gijsberts & Metta 2013).

References:

- M. Lázaro-Gredilla, J. Quiñonero-Candela, C. E. Rasmussen, A. R. Figueiras-Vidal,
  "Sparse spectrum Gaussian process regression", JMLR 11 (2010): a stationary kernel is
  the Fourier transform of its spectral density, so ``F`` frequencies drawn from that
  density give ``2F`` trigonometric features whose inner product approximates the kernel
  (Bochner's theorem); the GP becomes Bayesian linear regression on the features.
- A. Gijsberts, G. Metta, "Real-time model learning using incremental sparse spectrum
  Gaussian process regression", Neural Networks 41 (2013): the same regression updated
  recursively, one row at a time (a rank-one update of a Cholesky factor), at a cost that
  does not grow with the data, with hyperparameters chosen by the marginal likelihood on
  an initial batch and then kept.

The model here. One feature map serves all ``P`` outputs: ``Omega [F, D] = Z / ell`` with
``Z ~ N(0, I)`` drawn once from the learner's seeded generator (the spectral density of the
SE-ARD kernel with length scales ``ell [D]``, shared by the outputs) and::

    phi(x) = sqrt(1 / F) [cos(Omega x), sin(Omega x)]       (2F features)

so that ``phi(x)^T phi(x') = (1/F) sum_f cos(omega_f^T (x - x')) -> exp(-|(x - x') / ell|^2 / 2)``.
Per output, G&M's Bayesian linear regression on these features, with the amplitude folded
into the prior::

    y_p = Phi w_p + eps,   eps ~ N(0, s_p I),   w_p ~ N(0, (s_p / lam) I),
    A = Phi^T Phi + lam I,   E[w_p] = A^{-1} Phi^T y_p,
    latent mean phi(x)^T E[w_p],   latent variance s_p phi(x)^T A^{-1} phi(x)

The kernel of output ``p`` is thus ``sf_p^2 k_ell`` with signal variance ``sf_p^2 = s_p / lam``:
G&M's ``sigma_f^2`` times the prior variance, with one ratio ``lam = s_p / sf_p^2`` (one
signal-to-noise ratio) shared by the outputs, so that they share ``A`` and one inverse
serves them all, while each has its own noise ``s_p``. The regression, its recursive
update and its evidence are :class:`~gpdyn.gp.rls.RecursiveBLR`'s: a chunk of ``k`` rows
costs ``O(k D F + k M^2)`` with ``M = 2F``: the features, ``Phi_k^T Phi_k`` and a rank-``k``
Woodbury step on ``A^{-1}`` (or, for ``k >= M / 2``, the cheaper exact refresh), plus an
``O(M^3)`` refresh per ``M`` rows and an ``O(M^3)`` eigendecomposition per reselection: per
row ``O(D F + M^2)`` amortised, the order of G&M's rank-one updates. A prediction of ``N``
points costs ``O(N M^2)`` with the variance, ``O(N (D F + M P))`` for the mean alone.

Hyperparameters. On the first batch passed to :meth:`observe` (the init rows, ~1024 in
the stream protocol): the length scales start by the median trick, then a search over a
common factor of them (a dozen factors from 0.5 to ``2 sqrt(D)``, each scored by the exact
evidence, at its best ``lam``, of the batch's first 256 rows: the median trick's per-dimension
spread is far too short a length scale for a function of many inputs), then ``select_iters``
Adam steps on ``(log ell, log lam)`` maximise the exact log evidence of the whole batch (the
noises at their closed-form optimum ``s_p = Q_p / n`` inside it, ``Q_p`` the penalised
residual sum of squares); the best iterate is kept, and ``lam`` and the noises are set at
their exact optimum for its length scales. The start the learner records (``selection``)
is the median trick with its best ``lam``; the selected evidence is never below it.
The objective in closed form, per output (``N(y_p; 0, s_p (I + Phi Phi^T / lam))``)::

    log p(y_p) = -n/2 log(2 pi s_p) - 1/2 log|I + Phi Phi^T / lam| - Q_p / (2 s_p)

Reselection (``reselect_every`` rows; None or 0: never). The evidence depends on the data
only through ``G = Phi^T Phi``, ``B = Phi^T Y``, ``y^T y`` and ``n``. With ``G = U diag(e) U^T``
(one eigendecomposition, ``O(M^3)``)::

    log|A| - M log lam = sum_i log(1 + e_i / lam),   Q_p = y_p^T y_p - sum_i (U^T b_p)_i^2 / (e_i + lam)

so ``lam`` and the noises are re-maximised exactly from the statistics (a search over
``log lam``, each candidate ``O(M P)``). The length scales stay as the first batch set
them: ``Phi`` depends on them, so changing them changes every feature of every row seen,
and a one-pass learner keeps no rows to recompute ``G`` and ``B`` from (G&M keep all the
hyperparameters fixed after the initial batch). A reselection runs in :meth:`observe`, the only call that changes
the statistics, and the one whose contract allows a host sync (``torch.linalg.eigh``
synchronises a GPU with the host to check its result).

It is a one-pass learner: a row observed twice counts twice; :meth:`step` learns nothing
(it returns the loss, minus the log evidence of everything observed per row). :meth:`vlb`
is the held-out log evidence per point, ``log p(y | x, data) / N``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from gpdyn.gp.base import LOG_2PI, LearnerError, cholesky
from gpdyn.gp.kernels import median_lengthscale
from gpdyn.gp.rls import RecursiveBLR

#: the widest ``lam`` a selection considers (a signal variance of 1e-4 noise variances)
LAM_MAX = 1e4
#: points of each pass of the search over ``log lam``, and the passes (each narrows to two
#: spacings of the last around its best: 12 decades resolved to ~1e-5 in ``log lam``)
GRID_POINTS, GRID_PASSES = 65, 4
#: the common factors of the median-trick length scales that the selection tries first: from
#: ``SCALES[0]`` to ``SCALES[1] * sqrt(D)``, ``SCALES[2]`` of them, on the first ``SCALE_ROWS`` rows
SCALES, SCALE_ROWS = (0.5, 2.0, 12), 256


def fourier_features(x: Tensor, frequencies: Tensor, lengthscale: Tensor) -> Tensor:
    """``sqrt(1/F) [cos(x Omega^T), sin(x Omega^T)]``, ``[N, 2F]``, with ``Omega = frequencies / lengthscale``."""
    proj = x @ (frequencies / lengthscale).T
    return torch.cat([proj.cos(), proj.sin()], dim=-1) * (1.0 / math.sqrt(frequencies.shape[0]))


class SSGP(RecursiveBLR):
    """Incremental sparse spectrum GP regression (module docs) with ``2 * features`` random
    Fourier features of an SE-ARD kernel shared by the outputs.

    Options:
        features: ``F``, the number of random frequencies; the regression has ``2F`` features
            (a cosine and a sine per frequency). Default 500, i.e. 1,000 features (issue 34's
            "1,000 random features", counted as basis functions).
        select_iters: Adam steps of the selection on the first batch (default 30; 0: the
            better of the median trick and the scale search, ``lam`` and the noises at their
            optimum).
        select_lr: their learning rate on the log hyperparameters (default 0.1).
        reselect_every: rows between exact reselections of ``lam`` and the noises from the
            statistics (default 4096; None or 0: never, as G&M).
        noise_floor: the least noise variance (default 1e-6).

    ``lam`` is kept at least ``sqrt(eps)`` of the dtype (1.5e-8 in float64, 3.5e-4 in float32),
    where ``A^{-1}`` stays accurate.
    """

    name = "ssgp"
    # F frequencies, 2F features: small, the control runs (200 features, reselections every
    # 1024 rows); cpu, issue 34's 1,000 features; paper, 2,000 (issue 34's "1,000 random
    # features" if they count frequencies)
    presets = {
        "small": {"features": 100, "reselect_every": 1024},
        "cpu": {"features": 500},
        "paper": {"features": 1000},
    }
    state_fields = RecursiveBLR.state_fields + ("frequencies", "lengthscale", "since_select", "selection")

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        features: int = 500,
        select_iters: int = 30,
        select_lr: float = 0.1,
        reselect_every: int | None = 4096,
        **kwargs: Any,
    ) -> None:
        if isinstance(features, bool) or not isinstance(features, int) or features < 1:
            raise LearnerError(f"SSGP: features must be an integer >= 1, got {features!r}")
        if isinstance(select_iters, bool) or not isinstance(select_iters, int) or select_iters < 0:
            raise LearnerError(f"SSGP: select_iters must be an integer >= 0, got {select_iters!r}")
        if not (math.isfinite(select_lr) and select_lr > 0):
            raise LearnerError(f"SSGP: select_lr must be > 0, got {select_lr!r}")
        if reselect_every is not None and (isinstance(reselect_every, bool) or not isinstance(reselect_every, int)
                                           or reselect_every < 0):
            raise LearnerError(f"SSGP: reselect_every must be None or an integer >= 0, got {reselect_every!r}")
        self._frequency_count = int(features)
        super().__init__(input_dim, output_dim, **kwargs)
        self.config.update(features=int(features), select_iters=int(select_iters), select_lr=float(select_lr),
                           reselect_every=reselect_every)
        self.select_iters = int(select_iters)
        self.select_lr = float(select_lr)
        self.reselect_every = int(reselect_every or 0)
        self.lam_min = math.sqrt(torch.finfo(self.dtype).eps)
        # the unit-length-scale frequencies Z [F, D], drawn once (Omega = Z / ell)
        z = torch.randn(self._frequency_count, self.input_dim, generator=self.generator, dtype=torch.float64)
        self.frequencies = z.to(device=self.device, dtype=self.dtype)
        self.lengthscale = torch.ones(self.input_dim, device=self.device, dtype=self.dtype)
        self.since_select = 0  # rows observed since the last (re)selection
        # the selection's record (fixed keys: a checkpoint's are checked against them); the
        # evidences are per row, summed over outputs
        self.selection: dict[str, Any] = {
            "start_lengthscale": [1.0] * self.input_dim, "start_lambda": 1.0, "start_evidence": 0.0,
            "selected_evidence": 0.0, "evidence": 0.0, "reselections": 0,
        }

    # -- the feature map -----------------------------------------------------------------
    @property
    def feature_dim(self) -> int:
        return 2 * self._frequency_count

    def features(self, x: Tensor) -> Tensor:
        return fourier_features(x, self.frequencies, self.lengthscale)

    def _features_with(self, x: Tensor, start: dict[str, Any]) -> Tensor:
        return fourier_features(x, self.frequencies, start.get("lengthscale", self.lengthscale))

    # -- hyperparameters -------------------------------------------------------------------
    def _profile(self, e: Tensor, q: Tensor, yy: Tensor, n: float, log_lam: Tensor) -> tuple[Tensor, Tensor]:
        """Log evidence ``[G, P]`` and the optimal noises ``[G, P]`` at each ``log lam [G]``, from the
        eigenvalues ``e [M]`` of ``G`` and ``q = (U^T B)^2 [M, P]`` (module docs)."""
        lam = log_lam.exp()
        denom = e[None, :, None] + lam[:, None, None]  # [G, M, 1]
        resid = (yy - (q[None] / denom).sum(1)).clamp_min(0.0)  # Q_p [G, P]
        noise = (resid / n).clamp_min(self.noise_floor)
        logdet = torch.log1p(e[None, :] / lam[:, None]).sum(-1, keepdim=True)  # [G, 1]
        return -0.5 * n * (LOG_2PI + noise.log()) - 0.5 * logdet - 0.5 * resid / noise, noise

    def best_lambda(self, gram: Tensor, cross: Tensor, yy: Tensor, n: float,
                    current: float | None = None) -> tuple[float, Tensor, float]:
        """``(lam, noise [P], evidence)``: the exact maximiser of the summed log evidence over ``lam``
        (the noises at their optimum) from the statistics ``G``, ``B``, ``y^T y``, ``n``; the
        evidence per row. One eigendecomposition of ``G`` (a host sync on a GPU), then
        :meth:`_search_lambda`; ``current`` is a candidate too, so the result is never worse."""
        gram, cross, yy = gram.double(), cross.double(), yy.double()
        e, u = torch.linalg.eigh(gram)
        return self._search_lambda(e.clamp_min(0.0), (u.T @ cross) ** 2, yy, n, current)

    def _search_lambda(self, e: Tensor, q: Tensor, yy: Tensor, n: float,
                       current: float | None = None) -> tuple[float, Tensor, float]:
        """:meth:`best_lambda` from the spectrum ``e [K]``, ``q [K, P]`` (:meth:`_profile`):
        :data:`GRID_PASSES` passes of :data:`GRID_POINTS` candidates in ``log lam``, each pass
        around the best of the last, then the best of that and ``current``."""
        lo, hi = math.log(self.lam_min), math.log(LAM_MAX)
        candidates = torch.linspace(lo, hi, GRID_POINTS, dtype=torch.float64, device=e.device)
        width = (hi - lo) / (GRID_POINTS - 1)
        offsets = torch.arange(-(GRID_POINTS // 2), GRID_POINTS // 2 + 1, dtype=torch.float64, device=e.device)
        for _ in range(GRID_PASSES):
            centre = candidates[self._profile(e, q, yy, n, candidates)[0].sum(-1).argmax()]
            width = 2 * width / (GRID_POINTS - 1)
            candidates = (centre + width * offsets).clamp(lo, hi)
        best = centre[None]
        if current is not None:
            best = torch.cat([best, torch.full((1,), math.log(current), dtype=torch.float64, device=e.device)])
        ev, noise = self._profile(e, q, yy, n, best)
        i = int(ev.sum(-1).argmax())
        return float(best[i].exp()), noise[i].to(self.dtype), float(ev[i].sum()) / n

    def _spectrum(self, phi: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """``(e, q)`` of :meth:`_profile` from the rows ``phi [n, M]``, ``y [n, P]`` themselves, by the
        smaller eigendecomposition: of ``Phi^T Phi`` (``e``, ``q = (U^T Phi^T y)^2``) or, with fewer
        rows than features, of ``Phi Phi^T = V diag(s) V^T`` (``e = s``, ``q = s (V^T y)^2``: the
        same evidence, as the nonzero eigenvalues of the two agree)."""
        if phi.shape[0] < phi.shape[1]:
            s, v = torch.linalg.eigh(phi @ phi.T)
            s = s.clamp_min(0.0)
            return s, s[:, None] * (v.T @ y) ** 2
        e, u = torch.linalg.eigh(phi.T @ phi)
        return e.clamp_min(0.0), (u.T @ (phi.T @ y)) ** 2

    def _scale_search(self, x: Tensor, y: Tensor, z: Tensor, ls0: Tensor) -> Tensor:
        """The best of :data:`SCALES` common factors of the length scales ``ls0``, by the evidence
        (at its best ``lam``) of the first :data:`SCALE_ROWS` rows. The median trick gives each
        dimension the spread of the data along it, far too short a length scale for a smooth
        function of many inputs (in 20 dimensions two points are then ~6 length scales apart,
        the kernel ~0): a gradient started there barely moves."""
        x, y = x[:SCALE_ROWS], y[:SCALE_ROWS]
        yy = (y * y).sum(0)
        scales = torch.exp(torch.linspace(math.log(SCALES[0]), math.log(SCALES[1] * math.sqrt(self.input_dim)),
                                          SCALES[2], dtype=torch.float64))
        best, best_ev = ls0, -math.inf
        for scale in scales.tolist():  # a dozen factors
            ev = self._search_lambda(*self._spectrum(fourier_features(x, z, ls0 * scale), y), yy, float(x.shape[0]))[2]
            if ev > best_ev:
                best, best_ev = ls0 * scale, ev
        return best

    def _neg_evidence(self, x: Tensor, y: Tensor, z: Tensor, log_ls: Tensor, log_lam: Tensor) -> Tensor:
        """Minus the summed log evidence per row of ``x, y`` (float64, differentiable): in feature
        space (``A = Phi^T Phi + lam I``) when there are more rows than features, else in data
        space (``I + Phi Phi^T / lam``), whichever factorisation is smaller."""
        n = x.shape[0]
        lam = log_lam.clamp(math.log(self.lam_min), math.log(LAM_MAX)).exp()
        phi = fourier_features(x, z, log_ls.exp())
        m = phi.shape[1]
        if n > m:
            factor = cholesky(phi.T @ phi + lam * torch.eye(m, dtype=x.dtype, device=x.device))
            c = torch.linalg.solve_triangular(factor, phi.T @ y, upper=False)
            resid = (y * y).sum(0) - (c * c).sum(0)
            logdet = 2.0 * factor.diagonal().log().sum() - m * lam.log()
        else:
            factor = cholesky(torch.eye(n, dtype=x.dtype, device=x.device) + phi @ phi.T / lam)
            c = torch.linalg.solve_triangular(factor, y, upper=False)
            resid = (c * c).sum(0)
            logdet = 2.0 * factor.diagonal().log().sum()
        resid = resid.clamp_min(0.0)
        noise = (resid / n).clamp_min(self.noise_floor)
        ev = -0.5 * n * (LOG_2PI + noise.log()) - 0.5 * logdet - 0.5 * resid / noise
        return -ev.sum() / n

    def select(self, x: Tensor, y: Tensor) -> dict[str, Any]:
        """The hyperparameters the first batch ``x, y`` selects (module docs), nothing set:
        ``lengthscale``, ``lam``, ``noise`` and the ``selection`` record. Another learner of the
        same SE-ARD kernel may use it (:class:`~gpdyn.gp.svdgp_stream.StreamSVDGP`)."""
        return self._start(x, y)

    def _start(self, x: Tensor, y: Tensor) -> dict[str, Any]:
        """Select ``ell``, ``lam`` and the noises on the first batch (module docs), in float64."""
        x64, y64, z = x.double(), y.double(), self.frequencies.double()
        n = x.shape[0]

        yy = (y64 * y64).sum(0)

        def best(ls: Tensor, current: float | None = None) -> tuple[float, Tensor, float]:
            e, q = self._spectrum(fourier_features(x64, z, ls), y64)
            return self._search_lambda(e, q, yy, float(n), current)

        ls0 = median_lengthscale(x64, generator=self.generator)
        lam0, _, ev0 = best(ls0)
        ls1 = self._scale_search(x64, y64, z, ls0)
        lam1 = best(ls1)[0]
        # the best iterate, from the median trick on: the selection never ends below its start
        best_ls, best_lam = ls0.log(), torch.tensor(math.log(lam0), dtype=torch.float64, device=x.device)
        best_loss = float(self._neg_evidence(x64, y64, z, best_ls, best_lam))
        log_ls = ls1.log().clone().requires_grad_(True)
        log_lam = torch.tensor(math.log(lam1), dtype=torch.float64, device=x.device).requires_grad_(True)
        optimizer = torch.optim.Adam([log_ls, log_lam], lr=self.select_lr)
        with torch.enable_grad():
            for i in range(self.select_iters + 1):
                optimizer.zero_grad()
                loss = self._neg_evidence(x64, y64, z, log_ls, log_lam)
                value = float(loss.detach())  # observe may sync: one read per step of the selection
                if value < best_loss:
                    best_ls, best_lam, best_loss = log_ls.detach().clone(), log_lam.detach().clone(), value
                if i == self.select_iters:
                    break
                loss.backward()
                optimizer.step()
        ls = best_ls.exp()
        hint = min(max(float(best_lam.exp()), self.lam_min), LAM_MAX)
        lam, noise, ev = best(ls, hint)
        return {
            "lengthscale": ls.to(self.dtype), "lam": lam, "noise": noise,
            "selection": {**self.selection, "start_lengthscale": ls0.tolist(), "start_lambda": lam0,
                          "start_evidence": ev0, "selected_evidence": ev, "evidence": ev},
        }

    def _after_absorb(self, new: dict[str, Any], k: int) -> None:
        if "lengthscale" in new:  # the first batch: just selected
            new["since_select"] = 0
            return
        since = self.since_select + k
        if not self.reselect_every or since < self.reselect_every:
            new["since_select"] = since
            return
        lam, noise, ev = self.best_lambda(new["gram"], new["cross"], new["yy"], new["n"], current=self.lam)
        new["lam"], new["noise"], new["since_select"] = lam, noise, 0
        new["inverse"], new["logdet"] = self._refresh(new["gram"], lam)
        new["fresh"] = 0
        new["selection"] = {**self.selection, "evidence": ev, "reselections": self.selection["reselections"] + 1}

    def reselect(self) -> None:
        """Re-maximise ``lam`` and the noises exactly from the statistics now (as ``reselect_every`` does)."""
        self._need_data("reselect")
        lam, noise, ev = self.best_lambda(self.gram, self.cross, self.yy, self.n, current=self.lam)
        self.inverse, self.logdet = self._refresh(self.gram, lam)
        self.lam, self.noise, self.since_select, self.fresh = lam, noise, 0, 0
        self.selection = {**self.selection, "evidence": ev, "reselections": self.selection["reselections"] + 1}
        self._weights = None

    def diagnostics(self) -> dict[str, float]:
        return {"lambda": self.lam, "reselections": float(self.selection["reselections"])}

    # -- checkpoints -------------------------------------------------------------------------
    def _state_shapes(self, state: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        shapes = super()._state_shapes(state)
        since = state["since_select"]
        if type(since) is not int or since < 0:
            raise LearnerError(f"SSGP.load_state_dict: since_select must be an integer >= 0, got {since!r}")
        return shapes


__all__ = ["SSGP", "fourier_features"]
