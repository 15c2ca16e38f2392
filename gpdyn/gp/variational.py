"""Machinery shared by the variational learners (SVDGP, ORTH/ORTHNAT, SVI, iVSGPR, VSGPR, GPR).

One :class:`VariationalLearner` holds, batched over the P outputs:

- the hyperparameters: log length scales ``[P, D]``, log amplitude rho^2 ``[P]`` and log
  noise variance sigma^2 ``[P]``, started by SVDGP Appendix B (median trick, output
  variance, rho = 1) from the first data passed to :meth:`observe`; with an
  ``init_window`` the length scales are widened to the median trick on the first
  ``init_window`` rows as they arrive (:class:`~gpdyn.gp.hyperparams.InitWindow`: a
  time-ordered stream's first batch is too narrow a sample);
- named bases of inducing functions, preallocated to their full size ``[P, M, D]`` and
  filled ``n_delta`` points per :meth:`observe` call (SVDGP Algorithm 1, ``addBasis``),
  each with log length-scale factors ``c`` of the generalized SE-ARD kernel (SVDGP
  eq. (15)): one per basis function (``scales="basis"``), one per basis function and
  dimension (``"dim"``) or none (``"none"``, plain SE-ARD);
- with ``shared_kernel`` (a subclass option, SVDGP's): one set of length scales ``[1, D]``
  and one of each basis ``[1, M, D]`` for every output, seen by the kernels as ``[P, ...]``
  views (:meth:`VariationalLearner.lengthscale`, :meth:`VariationalLearner.basis`), so
  that the loss summed over the outputs gives the shared tensors the gradient of the sum of
  the outputs' bounds (SVDGP eq. (5)); amplitudes, noises and the variational parameters stay
  per output ("shared independent" inducing variables of multi-output SVGP);
- one Adam optimiser over everything the subclass does not update by natural or mirror
  steps, with the step size schedule ``gamma_t = gamma_0 / (1 + 0.1 sqrt(t))`` (SVDGP
  Section 4).

Preallocation keeps every parameter's shape fixed, so Adam's state and checkpoints never
change layout; unused basis slots get zero gradients and stay untouched by Adam.

Subclasses implement the expected log-likelihood and the KL term of the bound
(SVDGP eq. (5)); the loss of :meth:`step` is the negative bound per data point,
``-(1/N_m) sum_batch E_q[log p(y|f)] + KL / N``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from gpdyn.gp.base import LOG_2PI, Learner, LearnerError, cholesky
from gpdyn.gp.hyperparams import InitWindow, initial_noise_variance
from gpdyn.gp.kernels import (
    basis_features,
    gen_se_ard,
    input_features,
    kernel_matvec,
    kernel_quadratic,
    median_lengthscale,
    same_across_outputs,
    shared_kernel_matmul,
)

SCALES = ("basis", "dim", "none")


def gaussian_ell(y: Tensor, mean: Tensor, var: Tensor, noise: Tensor) -> Tensor:
    """Closed-form ``E_{N(f|mean,var)}[log N(y|f, noise)]`` per output and point, ``[P, N]``.

    ``y [N, P]``, ``mean`` and ``var`` ``[P, N]``, ``noise [P]`` (SVDGP eq. (10) for a
    Gaussian likelihood).
    """
    r = y.transpose(0, 1) - mean
    nz = noise[:, None]
    return -0.5 * (LOG_2PI + torch.log(nz)) - 0.5 * (r * r + var) / nz


def chol(a: Tensor, jitter: float) -> Tensor:
    """Cholesky factor of ``a + jitter * mean(diag(a)) * I`` (batched); below float64 the
    relative jitter is at least ``sqrt(eps)`` (3.5e-4 in float32).

    The floor is what makes the factor exist in float32: the kernels' expanded squares
    (:func:`gpdyn.gp.kernels.point_features`) lose about ``eps |u|^2`` per entry to
    cancellation, so nearly repeated bases (consecutive rows of a 1 kHz stream) give a matrix
    that is singular within rounding. Float64 keeps the jitter asked for (the closed-form
    identities are checked at 1e-12).
    """
    n = a.shape[-1]
    eye = torch.eye(n, dtype=a.dtype, device=a.device)
    scale = a.diagonal(dim1=-2, dim2=-1).mean(-1).clamp_min(1e-12)[..., None, None]
    if torch.finfo(a.dtype).bits < 64:
        jitter = max(jitter, math.sqrt(torch.finfo(a.dtype).eps))
    return cholesky(a + jitter * scale * eye)


def tri_solve(lower: Tensor, b: Tensor, transpose: bool = False) -> Tensor:
    """``lower^{-1} b`` (or ``lower^{-T} b``) for a lower-triangular batch."""
    if transpose:
        return torch.linalg.solve_triangular(lower.transpose(-1, -2), b, upper=True)
    return torch.linalg.solve_triangular(lower, b, upper=False)


class VariationalLearner(Learner):
    """Common state and optimisation loop of the variational learners (see module docs).

    Args:
        n_delta: basis functions added per :meth:`observe` call and basis (SVDGP N_Delta).
        lr: Adam's gamma_0.
        n_data: the N of the bound; ``None`` counts the points observed so far.
        scales: basis length-scale factors of SVDGP eq. (15): "basis", "dim" or "none".
        jitter: relative diagonal jitter of the Cholesky factorisations.
        eval_chunk: rows per chunk in :meth:`vlb` and large kernel products.
        init_window: rows of the stream that the starting length scales are estimated from
            (:class:`~gpdyn.gp.hyperparams.InitWindow`); 0: the first batch only.
    """

    default_lr: float = 1e-2
    #: one kernel (length scales) and one set of bases for every output (see the module
    #: docs); a subclass that offers the option sets it before calling this ``__init__``
    shared_kernel: bool = False
    capabilities = frozenset({"basis", "n_delta", "n_data"})
    # parameters, non-optimised buffers, basis counts, Adam state, counters and the generator
    state_fields = ("params", "buffers", "counts", "initialized", "t", "n_seen", "n_data", "optimizer", "generator")

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        n_delta: int = 128,
        lr: float | None = None,
        n_data: int | None = None,
        scales: str = "basis",
        jitter: float = 1e-6,
        eval_chunk: int = 1024,
        init_window: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(input_dim, output_dim, **kwargs)  # device, dtype, seed
        if scales not in SCALES:
            raise LearnerError(f"{type(self).__name__}: scales must be one of {SCALES}, got '{scales}'")
        if n_delta < 1:
            raise LearnerError(f"{type(self).__name__}: n_delta must be >= 1, got {n_delta}")
        if n_data is not None and n_data < 1:
            raise LearnerError(f"{type(self).__name__}: n_data must be >= 1, got {n_data}")
        self.n_delta = int(n_delta)
        self.lr = float(lr if lr is not None else self.default_lr)
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise LearnerError(f"{type(self).__name__}: lr must be finite and > 0, got {lr}")
        self.n_data = n_data
        self.scales = scales
        self.jitter = float(jitter)
        if not (self.jitter >= 0 and math.isfinite(self.jitter)):  # a negative jitter unmakes positive definiteness
            raise LearnerError(f"{type(self).__name__}: jitter must be finite and >= 0, got {jitter}")
        self.eval_chunk = int(eval_chunk)
        if self.eval_chunk < 1:
            raise LearnerError(f"{type(self).__name__}: eval_chunk must be >= 1, got {eval_chunk}")
        if init_window < 0:
            raise LearnerError(f"{type(self).__name__}: init_window must be >= 0, got {init_window}")
        if not isinstance(self.shared_kernel, bool):  # bool("false") is True: text must not pass
            raise LearnerError(f"{type(self).__name__}: shared_kernel must be True or False, got {self.shared_kernel!r}")
        self.config: dict[str, Any] = {
            "input_dim": self.input_dim,
            "output_dim": self.output_dim,
            "seed": self.seed,
            "n_delta": self.n_delta,
            "lr": self.lr,
            "n_data": n_data,
            "scales": scales,
            "jitter": self.jitter,
            "eval_chunk": self.eval_chunk,
            "init_window": int(init_window),
        }
        p, d = self.output_dim, self.input_dim
        self.params: dict[str, Tensor] = {
            "log_ls": self._zeros(self.kernel_outputs, d),
            "log_amp": self._zeros(p),
            "log_noise": self._zeros(p),
        }
        self.capacity: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.buffers: dict[str, Tensor] = {}  # non-optimised state (natural-gradient parameters, data subsets)
        self.adam_exclude: set[str] = set()
        self.initialized = False
        self.t = 0
        self.n_seen = 0
        self._cache: dict[str, Tensor] | None = None
        self.optimizer: torch.optim.Adam | None = None
        self.init_window = (
            InitWindow(init_window, d, device=self.device, dtype=self.dtype) if init_window else None
        )

    def state_names(self) -> tuple[str, ...]:
        return self.state_fields + (("init_window",) if self.init_window is not None else ())

    # -- construction helpers -----------------------------------------------------
    @property
    def kernel_outputs(self) -> int:
        """Outputs that own a kernel and bases: 1 with ``shared_kernel``, else P (the leading
        size of the length scales and basis tensors in ``params``)."""
        return 1 if self.shared_kernel else self.output_dim

    def _zeros(self, *shape: int, grad: bool = True) -> Tensor:
        return torch.zeros(shape, dtype=self.dtype, device=self.device, requires_grad=grad)

    def add_basis_set(self, name: str, size: int, learn_points: bool = True) -> None:
        """Preallocate basis ``name`` of ``size`` inducing functions per output (one set for all
        outputs with ``shared_kernel``)."""
        if size < 0:
            raise LearnerError(f"{type(self).__name__}: basis '{name}' size must be >= 0, got {size}")
        p, d = self.kernel_outputs, self.input_dim
        k = {"basis": 1, "dim": d, "none": 0}[self.scales]
        self.params[f"{name}_z"] = self._zeros(p, size, d, grad=learn_points)
        if k:
            self.params[f"{name}_logc"] = self._zeros(p, size, k, grad=learn_points)
        if not learn_points:
            self.adam_exclude.update({f"{name}_z", f"{name}_logc"})
        self.capacity[name] = int(size)
        self.counts[name] = 0

    def _finish_init(self) -> None:
        """Create the optimiser once every parameter exists (called by subclasses)."""
        opt_params = [v for k, v in self.params.items() if k not in self.adam_exclude and v.requires_grad]
        self.optimizer = torch.optim.Adam(opt_params, lr=self.lr, betas=(0.9, 0.999))

    # -- hyperparameters and kernels ------------------------------------------------
    @property
    def lengthscale(self) -> Tensor:
        """``[P, D]``; with ``shared_kernel`` a view of the one ``[1, D]`` set (its gradient is
        the sum over the outputs)."""
        return torch.exp(self.params["log_ls"]).expand(self.output_dim, -1)

    @property
    def amplitude(self) -> Tensor:
        return torch.exp(self.params["log_amp"])

    @property
    def noise(self) -> Tensor:
        return torch.exp(self.params["log_noise"]) + 1e-6

    def noise_variance(self) -> Tensor:
        return self.noise.detach()

    def basis(self, name: str) -> tuple[Tensor, Tensor | None]:
        """Active inducing points ``[P, m, D]`` and factors ``[P, m, K]`` (None for c = 1); with
        ``shared_kernel`` views of the one set of every output."""
        m, p = self.counts[name], self.output_dim
        z = self.params[f"{name}_z"][:, :m]
        logc = self.params.get(f"{name}_logc")
        c = torch.exp(logc[:, :m]) if logc is not None else None
        if self.shared_kernel:
            z = z.expand(p, -1, -1)
            c = None if c is None else c.expand(p, -1, -1)
        return z, c

    def shared_basis(self, name: str) -> tuple[Tensor, Tensor | None]:
        """With ``shared_kernel``: the one set of active points ``[m, D]`` and factors ``[m, K]``
        (None for c = 1), without the output axis."""
        if not self.shared_kernel:
            raise LearnerError(f"{type(self).__name__}.shared_basis: the outputs have their own bases (shared_kernel=False)")
        m = self.counts[name]
        logc = self.params.get(f"{name}_logc")
        return self.params[f"{name}_z"][0, :m], (torch.exp(logc[0, :m]) if logc is not None else None)

    def kern(self, x1: Tensor, x2: Tensor, c1: Tensor | None = None, c2: Tensor | None = None) -> Tensor:
        """Prior covariance (SE-ARD) or inducing-function covariance (eq. (15)), ``[P, N, M]``."""
        return gen_se_ard(x1, x2, self.lengthscale, self.amplitude, c1, c2)

    def kern_basis(self, a: str, b: str | None = None) -> Tensor:
        """``K`` between bases ``a`` and ``b`` (``b`` defaults to ``a``)."""
        za, ca = self.basis(a)
        zb, cb = self.basis(b or a)
        return self.kern(za, zb, ca, cb)

    def kern_data(self, x: Tensor, name: str) -> Tensor:
        """``K_{X, basis}`` for inputs ``x [N, D]``: ``[P, N, m]``."""
        z, c = self.basis(name)
        return self.kern(x, z, None, c)

    def quadratic(self, name: str, a: Tensor, n_columns: int | None) -> Tensor:
        """``a^T K a`` per output for basis ``name`` and ``a [P, m]``.

        With ``n_columns`` smaller than the basis, an unbiased estimate from that many
        uniformly sampled columns of K (SVDGP Section 3.4: O(N_c M) instead of O(M^2));
        otherwise exact, in row chunks. With ``shared_kernel`` the kernel is built once for all
        outputs (:func:`~gpdyn.gp.kernels.shared_kernel_matmul`; ``a_p^T K_p a_p = rho_p^2
        a_p^T K_1 a_p``), from the same sampled columns.
        """
        if self.shared_kernel:
            return self._shared_quadratic(name, a, n_columns)
        z, c = self.basis(name)
        m = z.shape[1]
        if n_columns is not None and n_columns < m:
            idx = torch.randperm(m, generator=self.generator)[:n_columns]
            if self.device.type == "cuda":  # a pageable host-to-device copy would wait for the GPU queue
                idx = idx.pin_memory()
            idx = idx.to(self.device, non_blocking=True)
            cj = None if c is None else c[:, idx]
            return (m / n_columns) * kernel_quadratic(z, z[:, idx], self.lengthscale, self.amplitude, a, a[:, idx], c, cj)
        return kernel_quadratic(z, z, self.lengthscale, self.amplitude, a, a, c, c)

    def _shared_quadratic(self, name: str, a: Tensor, n_columns: int | None) -> Tensor:
        z, c = self.shared_basis(name)
        m = z.shape[0]
        ls = self.lengthscale[:1]
        if n_columns is not None and n_columns < m:
            idx = torch.randperm(m, generator=self.generator)[:n_columns]  # the draw of the per-output path
            if self.device.type == "cuda":
                idx = idx.pin_memory()
            idx = idx.to(self.device, non_blocking=True)
            cj = None if c is None else c[idx]
            # K_1(z_J, z) a^T: the sampled columns as rows, chunked over the whole basis
            kv = shared_kernel_matmul(z[idx], z, ls, a, cj, c)
            return (m / n_columns) * self.amplitude * (a[:, idx] * kv).sum(-1)
        return self.amplitude * (a * shared_kernel_matmul(z, z, ls, a, c, c)).sum(-1)

    def kern_matvec(self, x: Tensor, name: str, v: Tensor, c: Tensor | None = None) -> Tensor:
        """``K_{x, basis} v`` for inputs ``x`` (factors ``c``, None for data) and ``v [P, m]``:
        ``[P, N]``, chunked with a hand-written backward (:func:`~gpdyn.gp.kernels.kernel_matvec`),
        so that memory stays linear in the basis size."""
        z, cz = self.basis(name)
        return kernel_matvec(x, z, self.lengthscale, self.amplitude, v, c, cz)

    # -- prediction features -------------------------------------------------------------
    def prediction_features(self, *names: str, fold_amplitude: bool = False) -> dict[str, Tensor]:
        """Detached base-2 features of the bases ``names`` for :func:`~gpdyn.gp.kernels.exp2_matvec`
        (keys: the names) and the length scales of the input features (key ``"ls"``).

        Features that are the same for every output are kept once, without the output axis:
        length scales ``[1, D]`` (one set of input features, :meth:`prediction_inputs`), and a
        basis whose points, factors, length scales and amplitudes agree across outputs as
        ``[M, R]`` (one kernel serves all outputs), as in a freshly filled model whose outputs
        share their starting hyperparameters and points. Telling that reads values back, so
        it is done on the CPU only (where it is free), once per cache rebuild. With
        ``shared_kernel`` the length scales and bases are one tensor by construction: shared
        on any device, with no read-back.

        ``fold_amplitude``: a basis whose points, factors and length scales agree is kept once
        even where the amplitudes differ, as the features of the unit-amplitude kernel, and
        the amplitudes ``rho_p^2 [P]`` come under the key ``"<name>_scale"``: since
        ``k_p = rho_p^2 k_1`` (SVDGP eqs. (14)-(15)), the caller multiplies them into its
        coefficients (``k_{x,alpha} a = k_1 (rho^2 a)`` for the mean of SVDGP eq. (8)). A
        trained shared-kernel model, whose amplitudes differ, needs this to keep one kernel.
        """
        with torch.no_grad():
            ls, amp = self.lengthscale, self.amplitude
            shared_ls = self.output_dim > 1 and (
                self.shared_kernel or (self.device.type == "cpu" and same_across_outputs(ls)))
            out = {"ls": ls[:1] if shared_ls else ls}
            for name in names:
                z, c = self.basis(name)
                same_basis = shared_ls and (self.shared_kernel or same_across_outputs(z, c))
                if same_basis and fold_amplitude:
                    c1 = None if c is None else c[:1]
                    out[name] = basis_features(z[:1], c1, ls[:1], torch.ones_like(amp[:1]), base2=True)[0]
                    out[f"{name}_scale"] = amp
                elif same_basis and self.device.type == "cpu" and same_across_outputs(amp):  # never read back on a GPU
                    out[name] = basis_features(z[:1], None if c is None else c[:1], ls[:1], amp[:1], base2=True)[0]
                else:
                    out[name] = basis_features(z, c, ls, amp, base2=True)
        return {k: v.detach() for k, v in out.items()}

    def prediction_inputs(self, cache: Mapping[str, Tensor], x: Tensor) -> Tensor:
        """Input features of ``x [N, D]`` for :meth:`prediction_features`' bases: ``[P, N, R]``,
        or ``[N, R]`` when the length scales are shared."""
        u = input_features(x, cache["ls"], self.scales == "dim")
        return u[0] if cache["ls"].shape[0] == 1 else u

    # -- the contract ---------------------------------------------------------------
    def _begin_observe(self, x: Tensor, y: Tensor) -> bool:
        """Start the hyperparameters on the first data; False when empty (input checked by the base class)."""
        if x.shape[0] == 0:
            return False
        if not self.initialized:
            self.initialize_hyperparameters(x, y)
        elif self.init_window is not None:
            wider = self.init_window.add(x, self.generator)
            if wider is not None:  # the estimate from more rows: widen to it, keep what is wider already
                with torch.no_grad():
                    self.params["log_ls"].clamp_(min=torch.log(wider))
        self.n_seen += int(x.shape[0])
        return True

    def observe(self, x: Tensor, y: Tensor) -> None:
        """Start the hyperparameters on the first call; add ``n_delta`` basis functions per basis.

        This validates the values (a host sync), so it is not meant for the hot path.
        """
        if not self._begin_observe(x, y):
            return
        offset = 0
        with torch.no_grad():
            for name, cap in self.capacity.items():
                m = self.counts[name]
                n = min(self.n_delta, cap - m, x.shape[0])
                if n <= 0:
                    continue
                idx = (torch.arange(n, device=self.device) + offset) % x.shape[0]
                offset += n  # different bases take different points where the batch allows
                self.params[f"{name}_z"][:, m : m + n] = x[idx].unsqueeze(0)
                if f"{name}_logc" in self.params:
                    self.params[f"{name}_logc"][:, m : m + n] = 0.0
                self.counts[name] = m + n
                self._on_basis_added(name, m, n, x[idx], y[idx])
        self._cache = None

    def initialize_hyperparameters(self, x: Tensor, y: Tensor) -> None:
        """SVDGP Appendix B: median-trick length scales, output variance as noise, rho = 1."""
        with torch.no_grad():
            if self.init_window is not None:
                ls = self.init_window.start(x, self.generator)
            else:
                ls = median_lengthscale(x, generator=self.generator)
            self.params["log_ls"].copy_(torch.log(ls).expand_as(self.params["log_ls"]))
            self.params["log_amp"].zero_()
            self.params["log_noise"].copy_(torch.log(initial_noise_variance(y)))
        self.initialized = True

    def _on_basis_added(self, name: str, start: int, n: int, x: Tensor, y: Tensor) -> None:
        """Hook: initialise the coefficients of new basis functions (default: zero, as allocated)."""

    def data_size(self, batch: int) -> float:
        """The N of the bound."""
        return float(self.n_data if self.n_data is not None else max(self.n_seen, batch))

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        """Negative bound per data point, per output ``[P]``, from a minibatch (differentiable)."""
        terms = self.shared_terms()
        ell = self.expected_loglik(x, y, terms)
        return -ell.mean(-1) + self.kl(True, terms) / self.data_size(x.shape[0])

    def step(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        """One update on a minibatch; returns the loss as a 0-d tensor (``float()`` it when needed)."""
        if not self.initialized:
            raise LearnerError(f"{type(self).__name__}.step: call observe() first (it starts the hyperparameters)")
        assert self.optimizer is not None
        self.t += 1
        lr = self.lr / (1.0 + 0.1 * math.sqrt(self.t))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        for name in self.adam_exclude:
            if name in self.params:
                self.params[name].grad = None
        loss = self.loss(x, y)
        loss.sum().backward()  # the outputs are independent: one backward serves all
        self._before_adam(x, y, lr)
        self.optimizer.step()
        self._after_step()
        self._cache = None
        return {"loss": loss.detach().mean()}

    def _before_adam(self, x: Tensor, y: Tensor, lr: float) -> None:
        """Hook with gradients available: natural or mirror steps of the subclass."""

    def _after_step(self) -> None:
        """Hook after the Adam step (closed-form posteriors of the batch baselines)."""

    def _prediction_cache(self, x: Tensor, where: str) -> dict[str, Tensor]:
        """:meth:`prepare`'s tensors (rebuilt after each update)."""
        if not self.initialized:
            raise LearnerError(f"{type(self).__name__}.{where}: the learner has seen no data")
        if self._cache is None:
            with torch.no_grad():
                self._cache = self.prepare()
        return self._cache

    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and variance of f, ``[..., P]`` each, for ``x [..., D]`` (no host sync)."""
        cache = self._prediction_cache(x, "predict")
        lead = x.shape[:-1]
        mean, var = self.predict_cached(cache, x.reshape(-1, self.input_dim))
        return mean.transpose(0, 1).reshape(*lead, self.output_dim), var.transpose(0, 1).reshape(*lead, self.output_dim)

    def predict_mean(self, x: Tensor) -> Tensor:
        """Mean of f, ``[..., P]``, for ``x [..., D]``: :meth:`predict_mean_cached`, no variance
        arithmetic and no host sync."""
        cache = self._prediction_cache(x, "predict_mean")
        mean = self.predict_mean_cached(cache, x.reshape(-1, self.input_dim))
        return mean.transpose(0, 1).reshape(*x.shape[:-1], self.output_dim)

    @torch.no_grad()
    def vlb(self, x: Tensor, y: Tensor) -> Tensor:
        """The bound on ``(x, y)`` per output and data point: ``(sum E_q[log p] - KL) / N``, exact KL."""
        if not self.initialized:
            raise LearnerError(f"{type(self).__name__}.vlb: the learner has seen no data")
        terms = self.shared_terms()
        total = torch.zeros(self.output_dim, dtype=self.dtype, device=self.device)
        for lo in range(0, x.shape[0], self.eval_chunk):
            hi = lo + self.eval_chunk
            total = total + self.expected_loglik(x[lo:hi], y[lo:hi], terms).sum(-1)
        return (total - self.kl(False, terms)) / max(1, x.shape[0])

    # -- what each learner defines --------------------------------------------------
    def shared_terms(self) -> dict[str, Tensor]:
        """Factorisations that :meth:`marginals` and :meth:`kl` share within one evaluation."""
        return {}

    def expected_loglik(self, x: Tensor, y: Tensor, terms: Mapping[str, Tensor] | None = None) -> Tensor:
        """``E_q[log p(y_n | f(x_n))]``, ``[P, N]`` (differentiable)."""
        mean, var = self.marginals(x, self.shared_terms() if terms is None else terms)
        return gaussian_ell(y, mean, var, self.noise)

    def marginals(self, x: Tensor, terms: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Mean and variance of q(f(x)), ``[P, N]`` each, from the live parameters."""
        raise LearnerError(f"{type(self).__name__} does not define marginals()")

    def kl(self, sampled: bool, terms: Mapping[str, Tensor] | None = None) -> Tensor:
        """``KL[q || p]`` per output ``[P]``; ``sampled`` allows the column-sampled estimate."""
        raise LearnerError(f"{type(self).__name__} does not define kl()")

    def prepare(self) -> dict[str, Tensor]:
        """Detached tensors that :meth:`predict_cached` needs (recomputed after each update)."""
        raise LearnerError(f"{type(self).__name__} does not define prepare()")

    def predict_cached(self, cache: Mapping[str, Tensor], x: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and variance ``[P, N]`` for ``x [N, D]`` from :meth:`prepare`'s tensors."""
        raise LearnerError(f"{type(self).__name__} does not define predict_cached()")

    def predict_mean_cached(self, cache: Mapping[str, Tensor], x: Tensor) -> Tensor:
        """Mean ``[P, N]`` for ``x [N, D]`` from :meth:`prepare`'s tensors; learners override it
        with a path that skips the variance (the default computes both)."""
        return self.predict_cached(cache, x)[0]

    # -- capabilities -----------------------------------------------------------------
    @property
    def basis_capacity(self) -> dict[str, int]:
        return dict(self.capacity)

    @property
    def basis_counts(self) -> dict[str, int]:
        return {name: self.counts[name] for name in self.capacity}  # counts also holds data subsets

    def set_n_delta(self, n_delta: int) -> None:
        if not self.can("n_delta"):
            raise self.lacks("n_delta", "set_n_delta")
        if n_delta < 1:
            raise LearnerError(f"{type(self).__name__}.set_n_delta: n_delta must be >= 1, got {n_delta}")
        self.n_delta = int(n_delta)
        self.config["n_delta"] = self.n_delta  # a checkpoint rebuilds it with this rate

    def set_n_data(self, n_data: int) -> None:
        if n_data < 1:
            raise LearnerError(f"{type(self).__name__}.set_n_data: n_data must be >= 1, got {n_data}")
        self.n_data = int(n_data)
        self.config["n_data"] = self.n_data

    def _after_load(self) -> None:
        self._cache = None
