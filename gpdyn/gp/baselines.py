"""The baselines of SVDGP Table 1, on the coupled basis (one basis for mean and covariance).

All four use the coupled posterior q(u) = N(K_z a, S) on inducing functions z, i.e.
ORTHDGP eq. (11) with an empty gamma (Titsias 2009; SVDGP eq. (6)), so prediction and
the held-out bound are those of :class:`~gpdyn.gp.orthdgp.ORTH`. They differ in how
they update it (SVDGP Table 1 and Section 4):

- :class:`SVI` (Hensman et al. 2013): natural-gradient steps on q (= ORTHDGP eqs.
  (15b)-(15c) with no gamma), Adam on hyperparameters and inducing points; M = 1024.
- :class:`IVSGPR` (Cheng & Boots 2016): stochastic mirror ascent on q: the natural
  parameters move toward those of the minibatch's optimal posterior,
  ``theta <- (1 - tau) theta + tau theta_hat``, in closed form; M = 256.
- :class:`VSGPR` (Titsias 2009): the collapsed bound on a fixed subset (4096 points),
  M = 1024, q at its closed-form optimum.
- :class:`GPR`: the exact GP on a fixed subset (1024 points); q is the exact posterior.

The paper optimises VSGPR and GPR by batch conjugate gradients; here they take the same
Adam steps and schedule as the others (one batch gradient per :meth:`step`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpdyn.gp.base import LOG_2PI, LearnerError, cholesky
from gpdyn.gp.orthdgp import ORTHNAT, coupled_optimum
from gpdyn.gp.variational import chol, tri_solve


class _Coupled(ORTHNAT):
    """One coupled basis of ``m`` points: the orthogonally decoupled model with no gamma basis."""

    basis_options = ("m",)

    def __init__(self, input_dim: int, output_dim: int, *, m: int, **kwargs) -> None:
        kwargs.pop("m_gamma", None)  # fixed by the method; present in a saved config
        kwargs.pop("m_beta", None)
        super().__init__(input_dim, output_dim, m_gamma=0, m_beta=m, **kwargs)
        self.config.update(m=int(m))


class SVI(_Coupled):
    """Stochastic variational inference with natural gradients on a coupled basis of ``m`` points."""

    name = "svi"
    # the scales of gpdyn.gp.base.PRESETS; paper: SVDGP Section 4 (M = 1024). lr 0.1: the
    # gamma_0 chosen by the step-size selection (docs/results/*-select)
    presets = {
        "small": {"m": 128, "n_delta": 32},
        "cpu": {"m": 128, "n_delta": 64, "lr": 0.1},
        "paper": {"m": 1024, "n_delta": 128, "lr": 0.1},
    }

    def __init__(self, input_dim: int, output_dim: int, *, m: int = 1024, **kwargs) -> None:
        super().__init__(input_dim, output_dim, m=m, **kwargs)


class IVSGPR(_Coupled):
    """Incremental variational sparse GPR: stochastic mirror ascent on q, ``m`` = 256 points.

    With the KL divergence as the Bregman divergence, a mirror-ascent step on a Gaussian
    posterior is a convex combination of natural parameters (Cheng & Boots 2016); for a
    Gaussian likelihood it is the same move as the natural-gradient step of :class:`SVI`,
    computed here in closed form from the minibatch instead of from gradients.
    """

    name = "ivsgpr"
    # paper: SVDGP Section 4 (M = 256); lr 0.1: the gamma_0 chosen by the step-size selection
    presets = {
        "small": {"m": 128, "n_delta": 32},
        "cpu": {"m": 128, "n_delta": 64, "lr": 0.1},
        "paper": {"m": 256, "n_delta": 128, "lr": 0.1},
    }

    def __init__(self, input_dim: int, output_dim: int, *, m: int = 256, **kwargs) -> None:
        super().__init__(input_dim, output_dim, m=m, **kwargs)

    def _before_adam(self, x: Tensor, y: Tensor, lr: float) -> None:
        self.mirror_update(x, y, self.nat_step_size())

    @torch.no_grad()
    def mirror_update(self, x: Tensor, y: Tensor, tau: float) -> None:
        """``theta <- (1 - tau) theta + tau theta_hat(minibatch)`` in natural parameters (eq. (12)).

        The minibatch optimum (Titsias 2009, weighted by ``w = N / (N_m sigma^2)``) has
        ``S_hat^{-1} = K^{-1} + w A A^T`` and ``j_hat = w A y``, ``A = K^{-1} K_zx``: the
        convex combination is :meth:`~gpdyn.gp.orthdgp.ORTHNAT.closed_form_step` with an
        empty gamma, made without inverting S, S_hat or K.
        """
        self.closed_form_step(x, y, tau)


class _SubsetLearner(ORTHNAT):
    """A batch method on the first ``n_subset`` points observed; q is set in closed form."""

    def __init__(self, input_dim: int, output_dim: int, *, n_subset: int, **kwargs) -> None:
        if n_subset < 1:
            raise LearnerError(f"{type(self).__name__}: n_subset must be >= 1, got {n_subset}")
        super().__init__(input_dim, output_dim, **kwargs)
        self.config.update(n_subset=int(n_subset))
        self.buffers["data_x"] = torch.zeros(n_subset, self.input_dim, dtype=self.dtype, device=self.device)
        self.buffers["data_y"] = torch.zeros(n_subset, self.output_dim, dtype=self.dtype, device=self.device)
        self.counts["data"] = 0

    def _store(self, x: Tensor, y: Tensor) -> None:
        m = self.counts["data"]
        n = min(x.shape[0], self.buffers["data_x"].shape[0] - m)
        if n > 0:
            self.buffers["data_x"][m : m + n] = x[:n]
            self.buffers["data_y"][m : m + n] = y[:n]
            self.counts["data"] = m + n

    def subset(self) -> tuple[Tensor, Tensor]:
        m = self.counts["data"]
        return self.buffers["data_x"][:m], self.buffers["data_y"][:m]

    def _before_adam(self, x: Tensor, y: Tensor, lr: float) -> None:
        """No steps on q: it is set to its optimum after each hyperparameter step."""

    @torch.no_grad()
    def _after_step(self) -> None:
        xs, ys = self.subset()
        k = self.kern_basis("beta")
        a, s = coupled_optimum(k, self.kern_data(xs, "beta").transpose(-1, -2), ys.transpose(0, 1), self.noise, 1.0, self.jitter)
        self.set_coupled(a, s)


class VSGPR(_SubsetLearner):
    """Titsias' collapsed bound on ``n_subset`` = 4096 points with ``m`` = 1024 inducing points."""

    name = "vsgpr"
    # paper: SVDGP Section 4 (M = 1024 on 4096 points)
    presets = {
        "small": {"m": 128, "n_subset": 512, "n_delta": 32},
        "cpu": {"m": 128, "n_subset": 1024, "n_delta": 64},
        "paper": {"m": 1024, "n_subset": 4096, "n_delta": 128},
    }
    basis_options = ("m", "n_subset")

    def __init__(self, input_dim: int, output_dim: int, *, m: int = 1024, n_subset: int = 4096, **kwargs) -> None:
        kwargs.pop("m_gamma", None)  # fixed by the method; present in a saved config
        kwargs.pop("m_beta", None)
        super().__init__(input_dim, output_dim, m_gamma=0, m_beta=m, n_subset=n_subset, **kwargs)
        self.config.update(m=int(m))

    def observe(self, x: Tensor, y: Tensor) -> None:
        super().observe(x, y)
        self._store(x, y)

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        """Minus the collapsed bound (Titsias 2009) per subset point; the minibatch is not used.

        ``F = log N(y | 0, Q + s^2 I) - tr(K - Q) / (2 s^2)``, ``Q = K_xz K_z^{-1} K_zx``.
        """
        xs, ys = self.subset()
        n = xs.shape[0]
        noise = self.noise[:, None]
        lk = chol(self.kern_basis("beta"), self.jitter)
        a = tri_solve(lk, self.kern_data(xs, "beta").transpose(-1, -2)) / noise[..., None].sqrt()  # [P, M, n]
        eye = torch.eye(a.shape[-2], dtype=self.dtype, device=self.device)
        lb = cholesky(eye + a @ a.transpose(-1, -2))
        yt = ys.transpose(0, 1)
        c = tri_solve(lb, (a @ yt.unsqueeze(-1))).squeeze(-1) / noise.sqrt()
        bound = (
            -0.5 * n * (LOG_2PI + torch.log(noise[:, 0]))
            - torch.log(lb.diagonal(dim1=-2, dim2=-1)).sum(-1)
            - 0.5 * (yt * yt).sum(-1) / noise[:, 0]
            + 0.5 * (c * c).sum(-1)
            - 0.5 * n * self.amplitude / noise[:, 0]
            + 0.5 * (a * a).sum((-2, -1))
        )
        return -bound / n


class GPR(_SubsetLearner):
    """The exact GP on the first ``n_subset`` = 1024 points; hyperparameters by the marginal likelihood."""

    name = "gpr"
    # the basis is the data subset, filled at once: no N_Delta (observe takes what fits)
    capabilities = ORTHNAT.capabilities - {"n_delta"}
    # paper: SVDGP Section 4 (the exact GP on 1024 points)
    presets = {"small": {"n_subset": 256}, "cpu": {"n_subset": 256}, "paper": {"n_subset": 1024}}
    basis_options = ("n_subset",)

    def __init__(self, input_dim: int, output_dim: int, *, n_subset: int = 1024, **kwargs) -> None:
        kwargs.pop("m_gamma", None)  # fixed by the method; present in a saved config
        kwargs.pop("m_beta", None)
        kwargs["scales"] = "none"  # the basis is the data itself
        super().__init__(input_dim, output_dim, m_gamma=0, m_beta=n_subset, n_subset=n_subset, **kwargs)

    def _learn_beta_points(self) -> bool:
        return False

    def observe(self, x: Tensor, y: Tensor) -> None:
        """Keep the first ``n_subset`` points: they are the data and the basis."""
        if not self._begin_observe(x, y):
            return
        m = self.counts["beta"]
        n = min(x.shape[0], self.capacity["beta"] - m)
        if n > 0:
            with torch.no_grad():
                self.params["beta_z"][:, m : m + n] = x[:n].unsqueeze(0)
                self.counts["beta"] = m + n
                self._on_basis_added("beta", m, n, x[:n], y[:n])
            self._store(x, y)
        self._cache = None

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        """Minus the log marginal likelihood per subset point (the minibatch is not used)."""
        xs, ys = self.subset()
        n = xs.shape[0]
        k = self.kern(xs, xs)
        eye = torch.eye(n, dtype=self.dtype, device=self.device)
        lk = cholesky(k + self.noise[:, None, None] * eye)
        alpha = tri_solve(lk, ys.transpose(0, 1).unsqueeze(-1)).squeeze(-1)
        logml = -0.5 * (alpha * alpha).sum(-1) - torch.log(lk.diagonal(dim1=-2, dim2=-1)).sum(-1) - 0.5 * n * LOG_2PI
        return -logml / n


__all__ = ["GPR", "IVSGPR", "SVI", "VSGPR"]
