"""Orthogonally decoupled variational GPs (Salimbeni, Cheng, Boots & Deisenroth 2018).

The posterior uses the orthogonally decoupled basis of ORTHDGP eq. (11): with a
covariance basis beta and a mean-only basis gamma,

    mu    = (I - Psi_b K_b^{-1} Psi_b^T) Psi_g a_g + Psi_b a_b
    Sigma = (I - Psi_b K_b^{-1} Psi_b^T) + Psi_b K_b^{-1} S K_b^{-1} Psi_b^T,   S = L L^T

so that (Appendix A.2)

    m(x) = (k_{x,g} - k_{x,b} K_b^{-1} K_{b,g}) a_g + k_{x,b} a_b
    s(x) = k_x - k_{x,b} K_b^{-1} k_{b,x} + k_{x,b} K_b^{-1} S K_b^{-1} k_{b,x}

and (Proposition A.1)

    KL = 1/2 (a_g^T (K_g - K_{g,b} K_b^{-1} K_{b,g}) a_g + a_b^T K_b a_b
              + tr(S K_b^{-1}) - log|S| + log|K_b| - |beta|),

with ``a_g^T K_g a_g`` estimated from sampled columns in a step (Appendix A.3).
With an empty gamma this is the coupled basis of Titsias / Hensman (eq. (7) with
``m = K_b a_b``), which the coupled baselines reuse.

This is the paper's model. GPyTorch's ``OrthogonallyDecoupledVariationalStrategy``
uses the posterior, not the prior, residual covariance for the gamma part and is a
different model (docs/architecture.md).

- :class:`ORTH`: Adam on everything (the paper's ORTH).
- :class:`ORTHNAT`: natural-gradient steps on the beta part, eqs. (15b)-(15c), and for
  gamma Adam (the paper's choice) or the diagonal update of eq. (16).
- ``basis="hybrid"`` gives the HYBRID basis of eq. (10) (no projection) for comparison;
  the DECOUPLED basis of eq. (8) is :class:`~gpdyn.gp.svdgp.SVDGP`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from gpdyn.gp.base import LearnerError
from gpdyn.gp.kernels import basis_features, exp2_matvec, exp_matvec, input_features
from gpdyn.gp.variational import VariationalLearner, chol, tri_solve

BASES = ("orth", "hybrid")
GAMMA_UPDATES = ("adam", "diag")


def _mv_rows(w: Tensor, k_bx: Tensor) -> Tensor:
    """``K_{x,b} w`` from ``k_bx [P, M, N]`` and ``w [P, M]`` as a row vector times a
    matrix (MKL's batched gemv on the transposed layout is several times slower)."""
    return (w.unsqueeze(-2) @ k_bx).squeeze(-2)


def _sym(a: Tensor) -> Tensor:
    return 0.5 * (a + a.transpose(-1, -2))


def coupled_optimum(k_zz: Tensor, k_zx: Tensor, y: Tensor, noise: Tensor, scale: float = 1.0, jitter: float = 1e-6) -> tuple[Tensor, Tensor]:
    """Optimal coupled q(u) for a Gaussian likelihood, in ORTH coordinates ``(a_b, S)``.

    ORTHDGP Appendix D (= Titsias 2009) with the data term weighted by ``scale``
    (N / N_m for a minibatch)::

        M = K_zz + (scale / sigma^2) K_zx K_xz,   S = K_zz M^{-1} K_zz,
        a = (scale / sigma^2) M^{-1} K_zx y       (m = K_zz a)

    (Appendix D prints ``a`` without the 1/sigma^2 on K_zx y; setting the gradient of
    the bound to zero gives it.) Shapes: ``k_zz [P, M, M]``, ``k_zx [P, M, N]``,
    ``y [P, N]``, ``noise [P]``.
    """
    w = (scale / noise)[:, None, None]
    lm = chol(k_zz + w * (k_zx @ k_zx.transpose(-1, -2)), jitter)
    a = torch.cholesky_solve((w[..., 0] * (k_zx @ y.unsqueeze(-1)).squeeze(-1)).unsqueeze(-1), lm).squeeze(-1)
    half = tri_solve(lm, k_zz)  # L_M^{-1} K
    return a, _sym(half.transpose(-1, -2) @ half)


class ORTH(VariationalLearner):
    """Orthogonally decoupled GP trained by Adam (the paper's ORTH).

    Args:
        m_gamma: mean-only basis size |gamma| (ORTHDGP Fig. 2c: 3500); 0 gives the coupled basis.
        m_beta: covariance basis size |beta| (Fig. 2c: 1500).
        n_columns: sampled columns of K_gamma per step (Appendix E: 64); ``None`` exact.
        basis: "orth" (eq. (11)) or "hybrid" (eq. (10)).
        **kwargs: see :class:`~gpdyn.gp.variational.VariationalLearner`.
    """

    name = "orth"
    natural_beta = False
    # the scales of gpdyn.gp.base.PRESETS; paper: ORTHDGP Fig. 2c. lr 0.1: the gamma_0
    # chosen by the step-size selection (docs/results/*-select)
    presets = {
        "small": {"m_gamma": 256, "m_beta": 64, "n_columns": 64, "n_delta": 32},
        "cpu": {"m_gamma": 512, "m_beta": 128, "n_columns": 64, "n_delta": 64, "lr": 0.1},
        "paper": {"m_gamma": 3500, "m_beta": 1500, "n_columns": 64, "n_delta": 128, "lr": 0.1},
    }
    basis_options = ("m_gamma", "m_beta")

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        m_gamma: int = 3500,
        m_beta: int = 1500,
        n_columns: int | None = 64,
        basis: str = "orth",
        **kwargs,
    ) -> None:
        super().__init__(input_dim, output_dim, **kwargs)
        if m_beta < 1 or m_gamma < 0:
            raise LearnerError(f"{type(self).__name__}: needs m_beta >= 1 and m_gamma >= 0, got {m_beta}, {m_gamma}")
        if basis not in BASES:
            raise LearnerError(f"{type(self).__name__}: basis must be one of {BASES}, got '{basis}'")
        if n_columns is not None and n_columns < 1:
            raise LearnerError(f"{type(self).__name__}: n_columns must be >= 1 or None, got {n_columns}")
        self.n_columns = n_columns
        self.basis_kind = basis
        self._record: dict[str, Tensor] | None = None  # set by ORTHNAT.loss for its closed-form step
        self.config.update(m_gamma=int(m_gamma), m_beta=int(m_beta), n_columns=n_columns, basis=basis)
        # beta first: with the partition alpha = {beta, gamma} the two take different points
        self.add_basis_set("beta", m_beta, learn_points=self._learn_beta_points())
        if m_gamma > 0:
            self.add_basis_set("gamma", m_gamma)
            self.params["a_gamma"] = self._zeros(self.output_dim, m_gamma)
        if self.natural_beta:
            # natural steps act on the expectation-side parameters m_b = K_b a_b and S itself
            # (Fig. 1); keeping m_b rather than a_b avoids K_b^{-1} outside the bound, which
            # an ill-conditioned K_b would amplify at every step
            # no autograd on them in step(): closed_form_step has their gradients in closed form
            self.params["m_beta"] = self._zeros(self.output_dim, m_beta, grad=False)
            self.params["S"] = self._zeros(self.output_dim, m_beta, m_beta, grad=False)
            self.adam_exclude.update({"S", "m_beta"})
        else:
            self.params["a_beta"] = self._zeros(self.output_dim, m_beta)
            self.params["L"] = self._zeros(self.output_dim, m_beta, m_beta)
        self._finish_init()  # subclasses that change adam_exclude call it again

    def _learn_beta_points(self) -> bool:
        return True

    # -- posterior factors ----------------------------------------------------------
    def _on_basis_added(self, name: str, start: int, n: int, x: Tensor, y: Tensor) -> None:
        if name != "beta":
            return
        # ORTHDGP Appendix E: new covariance directions start at the prior, S = K_beta
        z, c = self.basis("beta")
        sl = slice(start, start + n)
        k_new = self.kern(z[:, sl], z[:, sl], None if c is None else c[:, sl], None if c is None else c[:, sl])
        if self.natural_beta:
            self.params["S"][:, sl, sl] = k_new
        else:
            self.params["L"][:, sl, sl] = chol(k_new, self.jitter)

    def s_factor(self) -> tuple[Tensor, Tensor]:
        """``S [P, m, m]`` and a factor ``F`` with ``S = F F^T`` (active beta block)."""
        m = self.counts["beta"]
        if self.natural_beta:
            s = _sym(self.params["S"][:, :m, :m])
            return s, chol(s, self.jitter)
        lo = torch.tril(self.params["L"][:, :m, :m])
        return lo @ lo.transpose(-1, -2), lo

    def shared_terms(self) -> dict[str, Tensor]:
        mb = self.counts["beta"]
        k_b = self.kern_basis("beta")
        lk = chol(k_b, self.jitter)
        terms = {"Lk": lk, "K": k_b}
        if self.natural_beta:
            terms["a_beta"] = torch.cholesky_solve(self.params["m_beta"][:, :mb].unsqueeze(-1), lk).squeeze(-1)
        else:
            terms["a_beta"] = self.params["a_beta"][:, :mb]
        terms["S"], terms["F"] = self.s_factor()
        # L_k^{-1} F, shared: the KL's tr(S K_b^{-1}) = ||W||^2 and the variance's
        # F^T K_b^{-1} k_{b,x} = W^T (L_k^{-1} k_{b,x}) (one triangular solve fewer per step)
        terms["W"] = tri_solve(lk, terms["F"])
        if self.counts.get("gamma", 0) > 0:
            a_g = self.params["a_gamma"][:, : self.counts["gamma"]]
            terms["a_gamma"] = a_g
            zb, cb = self.basis("beta")
            u = self.kern_matvec(zb, "gamma", a_g, cb)  # K_{b,g} a_g
            terms["u"] = u
            terms["Lk_u"] = tri_solve(terms["Lk"], u.unsqueeze(-1)).squeeze(-1)
        return terms

    def _beta_weights(self, terms: Mapping[str, Tensor]) -> Tensor:
        """Coefficients on k_{x,beta} in the mean: a_b, minus K_b^{-1} K_{b,g} a_g when orthogonal."""
        w = terms["a_beta"]
        if "u" in terms and self.basis_kind == "orth":
            w = w - tri_solve(terms["Lk"], terms["Lk_u"].unsqueeze(-1), transpose=True).squeeze(-1)
        return w

    def marginals(self, x: Tensor, terms: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        """ORTHDGP Appendix A.2 (eq. (10) for the hybrid basis); both kernels from one set of input features."""
        u = input_features(x, self.lengthscale, self.scales == "dim")
        zb, cb = self.basis("beta")
        k_bx = torch.exp(basis_features(zb, cb, self.lengthscale, self.amplitude) @ u.transpose(-1, -2))
        mean = _mv_rows(self._beta_weights(terms), k_bx)
        mean_g = None
        if "a_gamma" in terms:
            zg, cg = self.basis("gamma")
            mean_g = exp_matvec(u, basis_features(zg, cg, self.lengthscale, self.amplitude), terms["a_gamma"])
            mean = mean + mean_g
        a = tri_solve(terms["Lk"], k_bx)  # L_k^{-1} K_{b,x}
        b = terms["W"].transpose(-1, -2) @ a  # F^T K_b^{-1} k_{b,x}
        var = self.amplitude[:, None] - (a * a).sum(-2) + (b * b).sum(-2)
        if self._record is not None:  # ORTHNAT's closed-form step reuses them (same minibatch)
            self._record.update(a=a.detach(), b=b.detach(), **({} if mean_g is None else {"k_g_a": mean_g.detach()}))
        return mean, var.clamp_min(1e-10)

    def kl(self, sampled: bool, terms: Mapping[str, Tensor] | None = None) -> Tensor:
        """ORTHDGP Proposition A.1 (column-sampled a_g^T K_g a_g when ``sampled``)."""
        terms = self.shared_terms() if terms is None else terms
        lk, f, a_b = terms["Lk"], terms["F"], terms["a_beta"]
        m = lk.shape[-1]
        quad = (a_b * (terms["K"] @ a_b.unsqueeze(-1)).squeeze(-1)).sum(-1)
        if "a_gamma" in terms:
            quad = quad + self.quadratic("gamma", terms["a_gamma"], self.n_columns if sampled else None)
            if self.basis_kind == "orth":
                quad = quad - (terms["Lk_u"] ** 2).sum(-1)
            else:  # hybrid: a^T K_alpha a with alpha = {gamma, beta}
                quad = quad + 2.0 * (terms["u"] * a_b).sum(-1)
        trace = (terms["W"] * terms["W"]).sum((-2, -1))  # tr(S K_b^{-1}) = ||L_k^{-1} F||^2
        logdet_s = 2.0 * torch.log(f.diagonal(dim1=-2, dim2=-1).abs()).sum(-1)
        logdet_k = 2.0 * torch.log(lk.diagonal(dim1=-2, dim2=-1)).sum(-1)
        return 0.5 * (quad + trace - logdet_s + logdet_k - m)

    # -- prediction -------------------------------------------------------------
    def prepare(self) -> dict[str, Tensor]:
        """Base-2 basis features (shared across outputs where they agree,
        :meth:`~gpdyn.gp.variational.VariationalLearner.prediction_features`) and the variance
        factors: a prediction costs one feature matmul and one ``exp2`` per kernel entry.

        The mean alone is one kernel-times-vector over beta and gamma together: their
        features (``fm``) and coefficients (``am``) are concatenated here once."""
        terms = self.shared_terms()
        lk = terms["Lk"]
        has_gamma = "a_gamma" in terms
        feats = self.prediction_features("beta", *(("gamma",) if has_gamma else ()))
        # k_{x,b} K_b^{-1} S K_b^{-1} k_{b,x} - k_{x,b} K_b^{-1} k_{b,x} = ||k W1||^2 - ||k W2||^2
        w1 = tri_solve(lk, terms["W"], transpose=True)  # K^{-1} F = L_k^{-T} W
        w2 = tri_solve(lk, torch.eye(lk.shape[-1], dtype=self.dtype, device=self.device)).transpose(-1, -2)  # L_k^{-T}
        wb = self._beta_weights(terms)
        cache = {"ls": feats["ls"], "amp": self.amplitude, "fb": feats["beta"], "wb": wb, "W1": w1, "W2": w2,
                 "fm": feats["beta"], "am": wb}
        if has_gamma:
            fb, fg = feats["beta"], feats["gamma"]
            if fb.dim() != fg.dim():  # one shared, one not: both per output
                fb, fg = fb.expand(self.output_dim, *fb.shape[-2:]), fg.expand(self.output_dim, *fg.shape[-2:])
            cache.update(fg=feats["gamma"], a_gamma=terms["a_gamma"], fm=torch.cat([fb, fg], -2),
                         am=torch.cat([wb, terms["a_gamma"]], -1))
        return {k: v.detach() for k, v in cache.items()}

    def predict_cached(self, cache: Mapping[str, Tensor], x: Tensor) -> tuple[Tensor, Tensor]:
        u = self.prediction_inputs(cache, x)
        k_xb = torch.exp2(u @ cache["fb"].transpose(-1, -2))  # [P, N, M_b] (or [N, M_b] shared)
        mean = _mv_rows(cache["wb"], k_xb.transpose(-1, -2))
        if "fg" in cache:
            mean = mean + exp2_matvec(u, cache["fg"], cache["a_gamma"])
        v1 = k_xb @ cache["W1"]
        v2 = k_xb @ cache["W2"]
        var = cache["amp"][:, None] - (v2 * v2).sum(-1) + (v1 * v1).sum(-1)
        return mean, var.clamp_min(1e-10)

    def predict_mean_cached(self, cache: Mapping[str, Tensor], x: Tensor) -> Tensor:
        """The mean of Appendix A.2 alone, ``k_{x,b} w_b + k_{x,g} a_g``: one pass over the
        kernel of both bases, none of the variance's ``[N, M_b] x [M_b, M_b]`` products."""
        return exp2_matvec(self.prediction_inputs(cache, x), cache["fm"], cache["am"])


class ORTHNAT(ORTH):
    """ORTH with natural-gradient steps on the beta part (ORTHDGP eqs. (15b)-(15c)).

    In natural parameters ``j_b = S^{-1} K_b a_b`` and ``Theta = S^{-1} / 2`` (eq. (12)),
    with L the negative bound (over all N points)::

        j_b   <- j_b - tau (K_b^{-1} dL/da_b - 2 dL/dS m_b),   m_b = K_b a_b   (15b)
        Theta <- Theta + tau dL/dS                                            (15c)

    The gamma part takes Adam steps (``gamma_update="adam"``, the paper's choice) or the
    diagonal approximate natural step of eq. (16) (``"diag"``, scaled to the per-point
    bound so that it stays stable). Hyperparameters and
    inducing points take Adam steps. ``nat_lr`` is tau_0 of the same decay schedule.
    """

    name = "orthnat"
    natural_beta = True

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        nat_lr: float = 0.1,
        gamma_update: str = "adam",
        gamma_eps: float = 1e-3,
        **kwargs,
    ) -> None:
        super().__init__(input_dim, output_dim, **kwargs)
        if gamma_update not in GAMMA_UPDATES:
            raise LearnerError(f"{type(self).__name__}: gamma_update must be one of {GAMMA_UPDATES}, got '{gamma_update}'")
        if not 0 < nat_lr <= 1:
            raise LearnerError(f"{type(self).__name__}: nat_lr must be in (0, 1], got {nat_lr}")
        self.nat_lr = float(nat_lr)
        self.gamma_update = gamma_update
        self.gamma_eps = float(gamma_eps)
        self.config.update(nat_lr=self.nat_lr, gamma_update=gamma_update, gamma_eps=self.gamma_eps)
        if gamma_update == "diag" and "a_gamma" in self.params:
            self.adam_exclude.add("a_gamma")
        self._finish_init()

    def nat_step_size(self) -> float:
        return self.nat_lr / (1.0 + 0.1 * (self.t**0.5))

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        """The bound of :class:`ORTH`; keeps its factorisations and projections of the
        minibatch (detached) for :meth:`closed_form_step` in the same :meth:`step`."""
        self._record = {}
        terms = self.shared_terms()
        self._record.update({k: v.detach() for k, v in terms.items()})
        ell = self.expected_loglik(x, y, terms)
        return -ell.mean(-1) + self.kl(True, terms) / self.data_size(x.shape[0])

    def _before_adam(self, x: Tensor, y: Tensor, lr: float) -> None:
        tau = self.nat_step_size()
        record, self._record = self._record, None
        self.closed_form_step(x, y, tau, record)
        self._gamma_diag_update(tau)

    def natural_step(self, x: Tensor, y: Tensor, tau: float) -> None:
        """One natural step of size ``tau`` on the minibatch alone (no Adam, no schedule),
        from autograd's ``dL/dS`` and ``dL/dm_b`` (eqs. (15b)-(15c) as printed).

        :meth:`step` takes the same step through :meth:`closed_form_step`, which needs
        no gradient with respect to S (whose Cholesky backward dominates a step at
        |beta| = 1024); this form is kept as its reference."""
        self.check_xy(x, y, "natural_step")
        for v in self.params.values():
            v.grad = None
        for key in ("S", "m_beta"):
            self.params[key].requires_grad_(True)
        try:
            self.loss(x, y).sum().backward()
        finally:
            self._record = None  # the closed-form step's record: not used here
            for key in ("S", "m_beta"):
                self.params[key].requires_grad_(False)
        self.natural_update(tau, x.shape[0])
        self._cache = None

    @torch.no_grad()
    def closed_form_step(self, x: Tensor, y: Tensor, tau: float, record: Mapping[str, Tensor] | None = None) -> None:
        """Eqs. (15b)-(15c) on the minibatch ``(x, y)`` with the gradients in closed form.

        For a Gaussian likelihood, with ``A = K_b^{-1} K_{b,X}``, ``w = N / (N_m sigma^2)`` and
        ``r_g = y - m_gamma(X)`` (the data minus the gamma part of the mean, ``K_{X,g} a_g
        - A^T K_{b,g} a_g`` for the orthogonal basis, ``K_{X,g} a_g`` for the hybrid one),
        the gradients of the negative bound over N points are
        ``dL/dS = (K_b^{-1} - S^{-1} + w A A^T) / 2`` and ``dL/dm_b = a_b - w A (y - mean)``
        (plus ``K_b^{-1} K_{b,g} a_g`` for the hybrid basis), so the step is

            S'^{-1} = (1 - tau) S^{-1} + tau (K_b^{-1} + w A A^T)
            j'      = (1 - tau) j + tau (w A r_g - [hybrid] K_b^{-1} K_{b,g} a_g)

        (the mirror step of :class:`~gpdyn.gp.baselines.IVSGPR` when gamma is empty). It is
        made by :meth:`_apply_move` with ``B = (1 - tau) I + tau (C^T C + w T T^T)``,
        ``C = L_K^{-1} L``, ``T = L^T A``, ``S = L L^T``: nothing is inverted. ``record``
        holds the bound's factorisations and projections of the same minibatch (from
        :meth:`loss`); without it they are computed here.
        """
        m = self.counts["beta"]
        if m == 0:
            return
        if record is None:  # not within step(): factor and project afresh
            self._record = {}
            try:
                terms = self.shared_terms()
                self._record.update(terms)
                self.marginals(x, terms)
            finally:
                record, self._record = self._record, None
        lk, lo, wf, a, t = record["Lk"], record["F"], record["W"], record["a"], record["b"]
        resid = y.transpose(0, 1)
        proj = lambda v: tri_solve(lk, (a @ v.unsqueeze(-1)), transpose=True).squeeze(-1)  # noqa: E731  A v, A = K_b^{-1} K_{b,X}
        delta_j = torch.zeros_like(record["a_beta"])
        if "k_g_a" in record:
            mean_g = record["k_g_a"]
            if self.basis_kind == "orth":
                mean_g = mean_g - (record["Lk_u"].unsqueeze(-2) @ a).squeeze(-2)  # - A^T K_{b,g} a_g
            else:
                delta_j = -tau * torch.cholesky_solve(record["u"].unsqueeze(-1), lk).squeeze(-1)
            resid = resid - mean_g
        w = (self.data_size(x.shape[0]) / x.shape[0]) / self.noise  # [P]
        # C = L_k^{-1} L = W and T = L^T A = W^T L_k^{-1} K_{b,X} = b: both from the bound
        b = (1.0 - tau) * torch.eye(m, dtype=self.dtype, device=self.device) + tau * (
            wf.transpose(-1, -2) @ wf + w[:, None, None] * (t @ t.transpose(-1, -2))
        )
        delta_j = delta_j + tau * w[:, None] * proj(resid)
        self._apply_move(lo, b, 1.0 - tau, self.params["m_beta"][:, :m], delta_j)

    # -- natural-parameter algebra (shared with the coupled baselines) ------------------
    @torch.no_grad()
    def _apply_move(self, lo: Tensor, b: Tensor, alpha: float, m_b: Tensor, delta_j: Tensor) -> None:
        """Set the natural parameters (eq. (12)) to ``S'^{-1} = L^{-T} B L^{-1}`` and
        ``j' = alpha j + delta_j`` (``S = L L^T``) without inverting S, K_b or S'^{-1}::

            S' = L B^{-1} L^T,      m' = S' j' = L B^{-1} (alpha L^{-1} m + L^T delta_j)

        A step ``S'^{-1} = alpha S^{-1} + Delta`` has ``B = alpha I + L^T Delta L``: close to
        the identity for a natural-gradient step and ``alpha I`` plus a positive
        semidefinite term for the mirror step, so B stays well conditioned where S and
        K_b are not (an explicit ``S^{-1}`` loses every digit when ``cond(K_b) ~ 1e16``, as
        on the sinc problem of SVDGP Fig. 1). S' is formed as ``F F^T``, ``F = L R_B^{-T}``.
        """
        m = lo.shape[-1]
        rb = chol(_sym(b), self.jitter)
        f = tri_solve(rb, lo.transpose(-1, -2)).transpose(-1, -2)  # L R_B^{-T}: S' = f f^T
        rhs = alpha * tri_solve(lo, m_b.unsqueeze(-1)) + lo.transpose(-1, -2) @ delta_j.unsqueeze(-1)
        self.params["S"][:, :m, :m] = _sym(f @ f.transpose(-1, -2))
        self.params["m_beta"][:, :m] = (lo @ torch.cholesky_solve(rhs, rb)).squeeze(-1)

    @torch.no_grad()
    def set_coupled(self, a: Tensor, s: Tensor) -> None:
        """Set q to ``(a_b, S)`` (e.g. :func:`coupled_optimum`'s result)."""
        m = self.counts["beta"]
        self.params["S"][:, :m, :m] = s
        self.params["m_beta"][:, :m] = (self.kern_basis("beta") @ a.unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def natural_update(self, tau: float, batch: int) -> None:
        """Apply eqs. (15b)-(15c) (and (16) for gamma) from the gradients of the loss."""
        m = self.counts["beta"]
        n = self.data_size(batch)  # the loss is per point; the paper's L is the total
        g_s = self.params["S"].grad
        g_m = self.params["m_beta"].grad
        if g_s is not None and g_m is not None and m > 0:
            g_s = n * _sym(g_s[:, :m, :m])
            g_m = n * g_m[:, :m]  # dL/dm_b = K_b^{-1} dL/da_b, the first term of (15b)
            # (15c): S'^{-1} = S^{-1} + 2 tau g_S; (15b): j' = j - tau (g_m - 2 g_S m_b)
            lo = chol(_sym(self.params["S"][:, :m, :m]), self.jitter)
            m_b = self.params["m_beta"][:, :m]
            eye = torch.eye(m, dtype=self.dtype, device=self.device)
            b = eye + 2.0 * tau * (lo.transpose(-1, -2) @ g_s @ lo)
            delta_j = -tau * (g_m - 2.0 * (g_s @ m_b.unsqueeze(-1)).squeeze(-1))
            self._apply_move(lo, b, 1.0, m_b, delta_j)
        self._gamma_diag_update(tau)

    @torch.no_grad()
    def _gamma_diag_update(self, tau: float) -> None:
        """The approximate natural step of eq. (16) on gamma (``gamma_update="diag"``)."""
        if self.gamma_update == "diag" and "a_gamma" in self.params and self.params["a_gamma"].grad is not None:
            mg = self.counts["gamma"]
            k_bg = self.kern_basis("beta", "gamma")
            v = tri_solve(chol(self.kern_basis("beta"), self.jitter), k_bg)
            d = (self.amplitude[:, None] - (v * v).sum(-2)).clamp_min(0.0)  # diag(K_g - K_g|b), eq. (16)
            # Per data point, not times N: the metric of (16) is the KL's alone, and the data
            # term's curvature (N / sigma^2 larger) makes the full-N step diverge.
            g = self.params["a_gamma"].grad[:, :mg]
            self.params["a_gamma"][:, :mg] -= tau * g / (d + self.gamma_eps)
