"""SVDGP: decoupled variational GP of Cheng & Boots (2017), one GP per output, batched.

The variational posterior is the decoupled Gaussian measure of SVDGP eq. (7): mean
``Psi_alpha a`` on a large basis alpha (M_alpha functions) and covariance
``(I + Psi_beta B Psi_beta^T)^{-1}`` on a small basis beta (M_beta), ``B = L L^T``.
Its GP form is eq. (8)::

    m(x) = k_{x,alpha} a,     s(x, x') = k_{x,x'} - k_{x,beta} L H^{-1} L^T k_{beta,x'},
    H = I + L^T K_beta L

and the bound is eq. (5) with the KL of eq. (9), evaluated stably through H (footnote 8,
Appendix A.1 "Notes to practitioners")::

    KL = 1/2 a^T K_alpha a + 1/2 log|H| - 1/2 tr(K_beta L H^{-1} L^T)
       = 1/2 a^T K_alpha a + 1/2 log|H| - 1/2 (M_beta - tr H^{-1})

In a step, ``a^T K_alpha a`` is estimated from ``n_columns`` sampled columns of K_alpha
(Section 3.4), so a step costs O(N_m M_alpha D + N_m M_beta^2 + M_beta^3) and never
O(M_alpha^2). The optional Jacobi preconditioner (Appendix A.1, note 2) parametrises
``a = diag(K_alpha)^{-1} a_0`` and ``L = diag(K_beta)^{-1} L_0``.

Initialisation. ``a`` starts at zero (the prior mean). ``L`` must not: with ``B = L L^T``
(footnote 8) the gradient is ``grad_L = 2 grad_B L`` (Appendix A.1.2), zero at ``L = 0``
whatever ``grad_B`` is, so a zero ``L`` is a saddle and q's covariance stays at the prior
for good: the same variance at every input, and a bound whose variance term can only be
lowered by shrinking the amplitude. Each basis function added to beta (Algorithm 1,
``addBasis``) starts its own direction at ``B_mm = 1 / sigma^2`` (the current noise), so
q's covariance starts as the GPR posterior covariance after one noisy observation at each
beta point (the posterior that eq. (7) is built to agree with, Section 3.3); the steps
move ``B`` from there.

Shared kernel (``shared_kernel=True``, off by default). The paper fits one GP per output,
each with its own SE-ARD length scales (eq. (14)) and bases alpha, beta. With the option all
outputs share one ``[1, D]`` set of length scales and one set of each basis (points and the
factors c of eq. (15)), learned jointly from the sum of the outputs' bounds (eq. (5)); each
output keeps its own a, L (eq. (7)), amplitude rho_p^2 and noise: the "shared independent"
layout of multi-output sparse GPs (GPflow's ``SharedIndependent`` inducing variables). Since
``k_p = rho_p^2 k_1`` with ``k_1`` the unit-amplitude kernel, eq. (8) becomes::

    m_p(x) = k_1(x, alpha) (rho_p^2 a_p),
    s_p(x, x) = rho_p^2 - || k_1(x, beta) (rho_p^2 L_p R_p^{-T}) ||^2,   R_p R_p^T = H_p

so a prediction builds ``K_1(x, alpha)`` and ``K_1(x, beta)`` once for all P outputs (one
matmul against ``[M, P]`` coefficients instead of P feature products), whatever training
does to the hyperparameters: the one-kernel path that a fresh per-output model takes only
until its outputs' length scales part.

Stream regime (``stream=True``, off by default). Algorithm 1 samples i.i.d. minibatches and adds
``N_Delta`` basis functions per iteration; under the prequential protocol
(:mod:`gpdyn.gp.prequential`) each row comes once, in time order, and is predicted before it is
learned. There the i.i.d. regime fails (docs/results/stream-svdgp-study.md) because the mean
basis lags the data (N_Delta of each 256-row chunk join alpha, and a
new function starts at ``a = 0``, from where Adam moves each coefficient by at most about gamma_t
per step) and because the bound's N is the whole stream while a few rows were seen. The regime:

- the bound's N (eq. (5), (10)) is the number of rows seen so far, whatever ``n_data`` says;
- every observed row joins alpha (the newest ``M_alpha`` of a larger batch); its coefficient is
  the GPR posterior mean of the current residual on the new rows,
  ``a_new = (K_nn + sigma^2 I)^{-1} (y_n - m(x_n))`` with ``m`` eq. (8)'s mean: the GPR posterior
  mean given the new rows with the current mean as prior mean, written in the basis of eq. (7)
  (``Psi_alpha a``), at O(n^3) per batch of n rows;
- when alpha is full, the functions whose removal changes the mean least in the RKHS norm go,
  ``||a_j psi_j||_H = rho |a_j|`` (eq. (7)), summed over outputs; their Adam moments are reset;
- beta takes the newest rows until full (``N_Delta`` per observe), each started as above.

Adam's first steps on a freshly fitted coefficient have size about gamma_t whatever the gradient,
so the regime wants a smaller gamma_0 than the i.i.d. presets (the values tried are in the study).
The regime is experimental: it helps on some streams and not on others (the study). For a
stream, :class:`~gpdyn.gp.svdgp_stream.StreamSVDGP` (``svdgp-stream``) maximises the same bound
in closed form after every chunk instead of stepping towards it.
"""


from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from gpdyn.gp import native
from gpdyn.gp.base import LearnerError, cholesky
from gpdyn.gp.kernels import basis_features, exp2_matvec, exp_matvec, gen_se_ard, input_features, shared_kernel_matmul
from gpdyn.gp.variational import VariationalLearner, tri_solve


class SVDGP(VariationalLearner):
    """Stochastic variational decoupled GP (SVDGP), Adam on every parameter (Table 1).

    Args:
        m_alpha: mean basis size M_alpha (paper: 128^2 = 16384).
        m_beta: covariance basis size M_beta (paper: 128); 0 gives the prior covariance
            and, with a Gaussian likelihood, kernel ridge regression for the mean.
        n_columns: sampled columns of K_alpha per step (paper: N_m = 1024); ``None`` exact.
        jacobi: use the Jacobi preconditioner of Appendix A.1.
        init_window: the starting length scales (Appendix B, median trick) are widened to
            the median trick on the first this many rows as they arrive
            (:class:`~gpdyn.gp.hyperparams.InitWindow`), so that a time-ordered stream, whose
            first batch spans a fraction of a second, still starts from length scales of the
            data's spread; 0: from the first batch only.
        shared_kernel: one set of length scales and one set of bases alpha, beta for all
            outputs, each output with its own a, L, amplitude and noise (see the module docs);
            False (default): one GP per output, as the paper.
        stream: the stream regime of the module docs (the bound's N = rows seen, every observed
            row joins alpha with its residual-GPR coefficient, least-norm replacement).
            Experimental: it does not beat the default on every stream
            (docs/results/stream-svdgp-study.md), so it is off by default. False (default): Algorithm 1 (i.i.d.).
        **kwargs: see :class:`~gpdyn.gp.variational.VariationalLearner`.
    """

    name = "svdgp"
    # the scales of gpdyn.gp.base.PRESETS; paper: SVDGP Section 4 / Appendix B. lr 0.1: the
    # gamma_0 that the step-size selection of SVDGP Section 4 chose on every dataset
    # (docs/results/*-select/step_size.json)
    presets = {
        "small": {"m_alpha": 512, "m_beta": 64, "n_columns": 256, "n_delta": 32},
        "cpu": {"m_alpha": 1024, "m_beta": 64, "n_columns": 256, "n_delta": 64, "lr": 0.1},
        "paper": {"m_alpha": 128**2, "m_beta": 128, "n_columns": 1024, "n_delta": 128, "lr": 0.1},
    }
    basis_options = ("m_alpha", "m_beta")

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        m_alpha: int = 16384,
        m_beta: int = 128,
        n_columns: int | None = 1024,
        jacobi: bool = True,
        init_window: int = 1024,
        shared_kernel: bool = False,
        stream: bool = False,
        **kwargs,
    ) -> None:
        if not isinstance(stream, bool):  # bool("false") is True: text from a command line must not pass
            raise LearnerError(f"SVDGP: stream must be True or False, got {stream!r}")
        self.stream = stream
        self.shared_kernel = shared_kernel  # read by VariationalLearner.__init__ (shapes of the kernel tensors)
        super().__init__(input_dim, output_dim, init_window=init_window, **kwargs)
        if n_columns is not None and n_columns < 1:
            raise LearnerError(f"SVDGP: n_columns must be >= 1 or None, got {n_columns}")
        if m_alpha < 1:
            raise LearnerError(f"SVDGP: m_alpha must be >= 1, got {m_alpha}")
        if not isinstance(jacobi, bool):  # bool("false") is True: text from a command line must not pass
            raise LearnerError(f"SVDGP: jacobi must be True or False, got {jacobi!r}")
        self.n_columns = n_columns
        self.jacobi = bool(jacobi)
        self.config.update(m_alpha=int(m_alpha), m_beta=int(m_beta), n_columns=n_columns, jacobi=self.jacobi,
                           shared_kernel=self.shared_kernel, stream=self.stream)
        self.add_basis_set("alpha", m_alpha)
        self.add_basis_set("beta", m_beta)
        p = self.output_dim
        self.params["a"] = self._zeros(p, m_alpha)
        self.params["L"] = self._zeros(p, m_beta, m_beta)  # unused slots; observe() starts each new one
        self._finish_init()

    # -- the stream regime (``stream=True``, see the module docs) ------------------------
    def data_size(self, batch: int) -> float:
        """The N of the bound: the rows seen so far in the stream regime (the bound of eq. (5) over
        the data seen), else the configured N."""
        if self.stream:
            return float(max(self.n_seen, batch))
        return super().data_size(batch)

    def observe(self, x: Tensor, y: Tensor) -> None:
        if not self.stream:
            return super().observe(x, y)
        if not self._begin_observe(x, y):
            return
        with torch.no_grad():
            self._stream_alpha(x, y)
            self._stream_beta(x, y)
        self._cache = None

    def _alpha_slots(self, n: int) -> Tensor:
        """Slots of alpha for ``n`` new functions: the free ones first, then the ones whose removal
        changes the mean least in the RKHS norm (``||a_j psi_j||_H = rho |a_j|`` per output, eq. (7)),
        summed over outputs."""
        m, cap = self.counts["alpha"], self.capacity["alpha"]
        free = torch.arange(m, min(cap, m + n), device=self.device)
        rest = n - free.numel()
        if rest <= 0:
            return free
        a, _ = self.coefficients()
        weight = (a * self.amplitude.sqrt()[:, None]).pow(2).sum(0)  # [m]
        old = torch.topk(weight, rest, largest=False).indices
        return torch.cat([free, old])

    def _stream_alpha(self, x: Tensor, y: Tensor) -> None:
        """Every new row becomes a mean basis function (the newest ``capacity`` when more come), its
        coefficient the GPR posterior mean of the current residual on the new rows (see module docs)."""
        cap = self.capacity["alpha"]
        if x.shape[0] > cap:
            x, y = x[-cap:], y[-cap:]
        n = x.shape[0]
        slots = self._alpha_slots(n)
        pa = self.params["a"]
        pa[:, slots] = 0.0  # the replaced functions leave the mean
        self._reset_adam(slots)
        self.counts["alpha"] = max(self.counts["alpha"], int(slots.max()) + 1)
        a, _ = self.coefficients()
        resid = y.transpose(0, 1) - self.kern_matvec(x, "alpha", a)  # [P, n]
        self.params["alpha_z"][:, slots] = x.unsqueeze(0)
        if "alpha_logc" in self.params:
            self.params["alpha_logc"][:, slots] = 0.0
        k = self.kern(x.unsqueeze(0).expand(self.kernel_outputs, -1, -1), x.unsqueeze(0).expand(self.kernel_outputs, -1, -1))
        k = k.expand(self.output_dim, -1, -1) if k.shape[0] != self.output_dim else k
        eye = torch.eye(n, dtype=self.dtype, device=self.device)
        r = cholesky(k + self.noise[:, None, None] * eye)
        coef = torch.cholesky_solve(resid.unsqueeze(-1), r).squeeze(-1)  # (K_nn + sigma^2 I)^{-1} r
        if self.jacobi:
            coef = coef * self.amplitude[:, None]
        pa[:, slots] = coef

    def _stream_beta(self, x: Tensor, y: Tensor) -> None:
        m, cap = self.counts["beta"], self.capacity["beta"]
        n = min(self.n_delta, cap - m, x.shape[0])
        if n <= 0:
            return
        idx = torch.arange(x.shape[0] - n, x.shape[0], device=self.device)  # the newest rows
        self.params["beta_z"][:, m : m + n] = x[idx].unsqueeze(0)
        if "beta_logc" in self.params:
            self.params["beta_logc"][:, m : m + n] = 0.0
        self.counts["beta"] = m + n
        self._on_basis_added("beta", m, n, x[idx], y[idx])

    def _reset_adam(self, slots: Tensor) -> None:
        """Forget Adam's moments of replaced alpha slots (they belonged to the old functions)."""
        if self.optimizer is None:
            return
        for key in ("a", "alpha_z", "alpha_logc"):
            param = self.params.get(key)
            state = self.optimizer.state.get(param) if param is not None else None
            if state:
                for moment in ("exp_avg", "exp_avg_sq"):
                    if moment in state:
                        state[moment][:, slots] = 0.0

    def _on_basis_added(self, name: str, start: int, n: int, x: Tensor, y: Tensor) -> None:
        """Start new covariance directions at ``B = I / sigma^2`` (see the module docs): never at
        ``L = 0``, where the gradient of the bound in ``L`` vanishes."""
        if name != "beta":
            return
        diag = torch.rsqrt(self.noise)  # B = L L^T = I / sigma^2
        if self.jacobi:
            diag = diag * self.amplitude  # L = diag(K_beta)^{-1} L_0 with diag(K_beta) = rho^2
        sl = slice(start, start + n)
        self.params["L"][:, sl, sl] = torch.diag_embed(diag[:, None].expand(-1, n))

    # -- parameters in the paper's terms ------------------------------------------
    def coefficients(self) -> tuple[Tensor, Tensor]:
        """``a [P, m_alpha]`` and lower-triangular ``L [P, m_beta, m_beta]`` (preconditioner applied)."""
        ma, mb = self.counts["alpha"], self.counts["beta"]
        a = self.params["a"][:, :ma]
        lo = torch.tril(self.params["L"][:, :mb, :mb])
        if self.jacobi:
            # the generalized SE-ARD kernel has diag(K) = rho^2 for every basis function
            a = a / self.amplitude[:, None]
            lo = lo / self.amplitude[:, None, None]
        return a, lo

    def shared_terms(self) -> dict[str, Tensor]:
        a, lo = self.coefficients()
        terms = {"a": a, "L": lo}
        if self.counts["beta"] > 0:
            k_beta = self.kern_basis("beta")
            eye = torch.eye(lo.shape[-1], dtype=self.dtype, device=self.device)
            h = eye + lo.transpose(-1, -2) @ k_beta @ lo
            terms["R"] = cholesky(h)  # H >= I: no jitter needed
        return terms

    def marginals(self, x: Tensor, terms: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        """SVDGP eq. (8) at the inputs (Appendix A.2.1); both kernels from one set of input features
        (with ``shared_kernel``: one kernel for all outputs, the module docs' form)."""
        if self.shared_kernel:
            return self._shared_marginals(x, terms)
        u = input_features(x, self.lengthscale, self.scales == "dim")
        za, ca = self.basis("alpha")
        mean = exp_matvec(u, basis_features(za, ca, self.lengthscale, self.amplitude), terms["a"])
        var = self.amplitude[:, None].expand_as(mean)
        if "R" in terms:
            zb, cb = self.basis("beta")
            k_bx = torch.exp(basis_features(zb, cb, self.lengthscale, self.amplitude) @ u.transpose(-1, -2))
            v = tri_solve(terms["R"], terms["L"].transpose(-1, -2) @ k_bx)
            var = var - (v * v).sum(-2)
        return mean, var.clamp_min(1e-10)

    def _shared_marginals(self, x: Tensor, terms: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Eq. (8) with ``k_p = rho_p^2 k_1``: ``K_1(x, alpha)`` and ``K_1(beta, x)`` once for all outputs."""
        ls, amp = self.lengthscale[:1], self.amplitude
        za, ca = self.shared_basis("alpha")
        mean = shared_kernel_matmul(x, za, ls, terms["a"] * amp[:, None], None, ca)
        var = amp[:, None].expand_as(mean)
        if "R" in terms:
            zb, cb = self.shared_basis("beta")
            one = torch.ones(1, dtype=self.dtype, device=self.device)
            k_bx = gen_se_ard(zb.unsqueeze(0), x.unsqueeze(0), ls, one, None if cb is None else cb.unsqueeze(0))[0]
            v = tri_solve(terms["R"], amp[:, None, None] * (terms["L"].transpose(-1, -2) @ k_bx))
            var = var - (v * v).sum(-2)
        return mean, var.clamp_min(1e-10)

    def kl(self, sampled: bool, terms: Mapping[str, Tensor] | None = None) -> Tensor:
        """SVDGP eq. (9) via H; ``sampled`` uses the column-sampled ``a^T K_alpha a``."""
        terms = self.shared_terms() if terms is None else terms
        quad = self.quadratic("alpha", terms["a"], self.n_columns if sampled else None)
        kl = 0.5 * quad
        if "R" in terms:
            r = terms["R"]
            eye = torch.eye(r.shape[-1], dtype=self.dtype, device=self.device)
            r_inv = tri_solve(r, eye)
            logdet_h = 2.0 * torch.log(r.diagonal(dim1=-2, dim2=-1)).sum(-1)
            kl = kl + 0.5 * logdet_h - 0.5 * (r.shape[-1] - (r_inv * r_inv).sum((-2, -1)))
        return kl

    # -- prediction -------------------------------------------------------------
    def prepare(self) -> dict[str, Tensor]:
        """Base-2 basis features of both bases (shared across outputs where they agree,
        :meth:`~gpdyn.gp.variational.VariationalLearner.prediction_features`) and
        ``W = L R^{-T}``: a prediction then costs one feature matmul and one ``exp2`` per
        kernel entry, and no per-call work over the basis parameters. A basis shared by all
        outputs (always with ``shared_kernel``) comes as unit-amplitude features, and the
        amplitudes are folded into ``a`` and ``W`` (the module docs' form of eq. (8))."""
        terms = self.shared_terms()
        has_beta = "R" in terms
        feats = self.prediction_features("alpha", *(("beta",) if has_beta else ()), fold_amplitude=True)
        a = terms["a"]
        if "alpha_scale" in feats:
            a = a * feats["alpha_scale"][:, None]
        cache = {"ls": feats["ls"], "amp": self.amplitude, "a": a, "fa": feats["alpha"]}
        if has_beta:
            # k_{x,beta} L R^{-T}: the variance needs only W = L R^{-T}
            w = tri_solve(terms["R"], terms["L"].transpose(-1, -2)).transpose(-1, -2)
            if "beta_scale" in feats:
                w = w * feats["beta_scale"][:, None, None]
            cache.update(fb=feats["beta"], W=w)
        return {k: v.detach() for k, v in cache.items()}

    def predict_cached(self, cache: Mapping[str, Tensor], x: Tensor) -> tuple[Tensor, Tensor]:
        if self._laid_out(cache, x):
            ut = self._inputs_laid_out(cache, x)
            mean = native.exp2_matvec_laid_out(ut, cache["fa"], cache["a"])[:, : x.shape[0]]
            u = ut[..., : x.shape[0]].transpose(-1, -2)  # [(P,) N, R], a view
        else:
            u = self.prediction_inputs(cache, x)
            mean = exp2_matvec(u, cache["fa"], cache["a"])
        if "W" not in cache:
            return mean, cache["amp"][:, None].expand_as(mean).clamp_min(1e-10)
        fb, w = cache["fb"], cache["W"]
        if u.dim() == 3 and fb.dim() == 3:  # one feature set per output: batched products, no broadcasting
            v = torch.bmm(torch.bmm(u, fb.transpose(1, 2)).exp2_(), w)
        else:
            v = torch.exp2(u @ fb.transpose(-1, -2)) @ w
        # v is this call's own: squared in place (the same numbers as v * v, without a second [P, N, M_beta] tensor)
        return mean, torch.sub(cache["amp"][:, None], v.square_().sum(-1)).clamp_min_(1e-10)

    def predict_mean_cached(self, cache: Mapping[str, Tensor], x: Tensor) -> Tensor:
        """SVDGP eq. (8)'s mean ``k_{x,alpha} a`` alone: one pass over ``K_{x,alpha}``, nothing of beta."""
        if self._laid_out(cache, x):
            return native.exp2_matvec_laid_out(self._inputs_laid_out(cache, x), cache["fa"], cache["a"])[:, : x.shape[0]]
        return exp2_matvec(self.prediction_inputs(cache, x), cache["fa"], cache["a"])

    def _laid_out(self, cache: Mapping[str, Tensor], x: Tensor) -> bool:
        """Whether a prediction at ``x [N, D]`` takes the native kernel with inputs built in its layout
        (:meth:`_inputs_laid_out`): on the CPU with the kernel built, the features ``[u, |u|^2, 1]``
        (not the per-dimension factors' ``[u^2, u, 1]``), eagerly."""
        return (self.scales != "dim" and x.dim() == 2 and not torch.compiler.is_compiling()
                and native.usable(x, cache["fa"], cache["a"]))

    def _inputs_laid_out(self, cache: Mapping[str, Tensor], x: Tensor) -> Tensor:
        """The input features ``[u, |u|^2, 1]`` of :meth:`prediction_inputs` (``u = x / l``), written
        straight into the native kernel's layout ``[(P,) R, Np]`` (points along the last axis,
        padded with zeros to a multiple of its lanes): the kernel's copy into that layout, and
        the concatenation, are not made. ``[R, Np]`` when the length scales are shared."""
        ls = cache["ls"]
        n, d = x.shape
        padded = -(-n // native.LANES) * native.LANES
        ut = (x.new_zeros if padded != n else x.new_empty)(ls.shape[0], d + 2, padded)
        u = torch.div(x.transpose(0, 1), ls.unsqueeze(-1), out=ut[:, :d, :n])
        torch.sum(u * u, dim=1, out=ut[:, d, :n])
        ut[:, d + 1, :n] = 1.0
        return ut[0] if ls.shape[0] == 1 else ut
