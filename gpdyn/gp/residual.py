"""Residual learners: a frozen prior learner plus a fast GP on its residuals.

:class:`ResidualGP` keeps a pretrained learner as the prior mean and conditions an exact
GP (a rank-q Cholesky update, no optimiser step) or a linear-kernel GP over chosen input
columns (:class:`LinearKernelGP`) on the residual ``y - prior(x)`` of every new sample,
over a sliding window. One Adam step per control step barely moves a variational model;
exact conditioning changes the prediction at the very next step, and the window lets it
forget the plant before a change.

:class:`ResidualGP` is a registered learner (``make_learner("residual", D, P, prior=...)``):
its config names the prior's learner and config, so a checkpoint rebuilds the prior and
restores its state with the residual's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from gpdyn.gp import make_learner
from gpdyn.gp.base import LOG_2PI, BatchMemo, Learner, LearnerError, Stateful, cholesky
from gpdyn.gp.exact import ExactOnlineGP
from gpdyn.gp.online import load_learner
from gpdyn.gp.kernels import median_lengthscale

RESIDUAL_KERNELS = ("se", "linear")  # ResidualGP's residual model: an exact SE-ARD GP, or a linear-kernel GP


class LinearKernelGP(Stateful):
    """A GP with a linear kernel over some input columns: the residual model of
    ``ResidualGP(kernel="linear")``.

    ``k(x, x') = prior_var (1 + x_S . x_S')`` over the input columns ``S`` (a bias plus a
    dot product), computed in weight space as Bayesian linear regression on the features
    ``phi(x) = [1, x_S]`` with weights ``w ~ N(0, prior_var I)`` per output and noise
    variance ``noise`` (Rasmussen & Williams 2006, Sec. 2.1.1):
    ``A = phi^T phi / noise + I / prior_var``, mean ``phi(x*) A^-1 phi^T y / noise``,
    latent variance ``phi(x*) A^-1 phi(x*)^T``. It conditions on its last ``window``
    samples, a sliding window (the oldest sample leaves as a new one comes), and has no
    hyperparameters to refit: ``step`` does nothing. ``forget < 1`` weighs a sample seen
    ``k`` samples ago by ``forget**k`` (its noise variance divided by that: recursive
    least squares with forgetting), so that the fit follows a plant that changes.

    With ``S`` the action columns it models ``r(s, a) = b + W a``: how the plant's answer to
    the action differs from the prior's, a bias and a gain per action, the form of the
    change a weakened motor makes. Unlike an SE kernel over all inputs it cannot follow
    the prior's own errors as they vary with the state along a trajectory. Those that
    correlate with the action along a gait still enter ``W`` (fitted gains mix the plant
    change with the pretrained model's own errors), which is why it is used behind
    ResidualGP's evidence gate.
    """

    state_fields = ("features", "targets")  # the window; the posterior follows from them

    def __init__(self, output_dim: int, columns: Sequence[int], *, window: int, noise: float,
                 prior_var: float = 1.0, forget: float = 1.0, device: torch.device, dtype: torch.dtype) -> None:
        self.output_dim, self.device, self.dtype = output_dim, device, dtype
        self.columns = torch.as_tensor(list(columns), dtype=torch.long, device=device)
        self.window, self.noise, self.prior_var, self.forget = int(window), float(noise), float(prior_var), float(forget)
        self.features = torch.zeros(0, 1 + len(self.columns), device=device, dtype=dtype)
        self.targets = torch.zeros(0, output_dim, device=device, dtype=dtype)
        self._refresh()

    @property
    def n(self) -> int:
        return self.features.shape[0]

    def _phi(self, x: Tensor) -> Tensor:
        return torch.cat([torch.ones_like(x[..., :1]), x[..., self.columns]], dim=-1)

    def _refresh(self) -> None:
        """The weights' posterior, mean ``[F, P]`` and the Cholesky factor of ``A``."""
        eye = torch.eye(self.features.shape[1], device=self.device, dtype=self.dtype)
        age = torch.arange(self.n - 1, -1, -1, device=self.device, dtype=self.dtype)
        weighted = self.features * (self.forget**age / self.noise)[:, None]
        self._chol = cholesky(weighted.T @ self.features + eye / self.prior_var)
        self._weights = torch.cholesky_solve(weighted.T @ self.targets, self._chol)

    def observe(self, x: Tensor, y: Tensor) -> None:
        self.features = torch.cat([self.features, self._phi(x)])[-self.window:]
        self.targets = torch.cat([self.targets, y])[-self.window:]
        self._refresh()

    def step(self, x: Tensor, y: Tensor) -> dict[str, float]:
        return {"refit": 0.0}

    @torch.no_grad()
    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Latent mean and variance ``[..., P]``."""
        phi = self._phi(x)
        half = torch.linalg.solve_triangular(self._chol, phi.reshape(-1, phi.shape[-1]).T, upper=False)
        var = half.pow(2).sum(0).reshape(phi.shape[:-1] + (1,))
        return phi @ self._weights, var.expand(phi.shape[:-1] + (self.output_dim,))

    @torch.no_grad()
    def predict_mean(self, x: Tensor) -> Tensor:
        """Latent mean ``[..., P]`` alone (no triangular solve)."""
        return self._phi(x) @ self._weights

    def vlb(self, x: Tensor, y: Tensor) -> Tensor:
        """Held-out log predictive density per output, ``[P]``: each point's own, averaged over the points."""
        mean, var = self.predict(x)
        var = var + self.noise
        return (-0.5 * ((y - mean).pow(2) / var + var.log() + LOG_2PI)).reshape(-1, self.output_dim).mean(0)

    def _state_shapes(self, state: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        rows = state["features"].shape[0] if isinstance(state["features"], Tensor) else -1
        if not 0 <= rows <= self.window:
            raise LearnerError(f"LinearKernelGP.load_state_dict: 'features' must hold 0 to {self.window} rows, got {rows}")
        return {"features": (rows, self.features.shape[1]), "targets": (rows, self.output_dim)}

    def _after_load(self) -> None:
        self._refresh()


class ZeroMean(Learner):
    """The zero function as a prior: ``ResidualGP`` without a prior learner. It has nothing
    to learn (the base class checks what ``observe`` and ``step`` get) and no likelihood of its own."""

    name = "zero"
    initialized = True

    def observe(self, x: Tensor, y: Tensor) -> None:
        """Nothing to learn."""

    def step(self, x: Tensor, y: Tensor) -> dict[str, float]:
        return {}

    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        zeros = x.new_zeros(*x.shape[:-1], self.output_dim)
        return zeros, zeros.clone()

    def predict_mean(self, x: Tensor) -> Tensor:
        return x.new_zeros(*x.shape[:-1], self.output_dim)

    def vlb(self, x: Tensor, y: Tensor) -> Tensor:
        raise LearnerError("ZeroMean.vlb: the zero prior has no likelihood of its own (ResidualGP.vlb scores the residual)")

    def noise_variance(self) -> Tensor:
        raise LearnerError("ZeroMean.noise_variance: the zero prior has no noise model (ResidualGP's is the residual's)")


class ResidualGP(Learner):
    """A frozen ``prior`` learner plus a GP on its residuals over the last ``window`` samples.

    ``predict`` = prior mean + residual mean, prior variance + residual variance. The
    residual GP's SE-ARD hyperparameters are set, not fitted to the first sample: median-
    trick lengthscales from ``reference_x`` (the pretraining inputs) times
    ``lengthscale_factor`` (one value or one per input), amplitude ``amplitude`` and noise ``noise`` (normalised output
    units). Every ``refit_every`` observed samples, ``refit_iters`` Adam steps on the
    residual log marginal likelihood refine them (``refit_iters=0``: never). When the
    window is full, the GP is rebuilt from its newest ``window // 2`` samples.

    ``gated``: the residual joins an output's prediction only while it has predicted that
    output better than the prior alone. Every observed sample is first predicted (before
    the GP conditions on it), and an exponential average with decay ``gate_decay`` per
    sample keeps both squared errors per output, prior alone and prior + residual (a
    prequential comparison, Dawid 1984). A residual GP whose kernel outruns the residual's
    structure (the pretrained model's own errors vary faster than its lengthscales) then
    stays out instead of adding confident, wrong corrections; one that captures a real
    plant change, such as a weakened motor, goes in after a few samples. ``gate_z > 0``
    asks for evidence: the average of the per-sample improvement ``d = e_prior^2 - e_with^2``
    must exceed ``gate_z`` standard errors (weighted mean and variance of ``d`` under the
    same exponential weights, effective sample size ``(sum w)^2 / sum w^2``). The first
    few samples then cannot switch the residual in: the pretrained model's own errors are
    correlated from one step to the next, so a residual fitted to a handful of them
    predicts the next one better by chance and the controller would chase it.
    ``gate_z = 0`` is the plain comparison of the two averages.

    ``kernel``: ``"se"`` (above) or ``"linear"``, a :class:`LinearKernelGP` over the input
    columns ``linear_inputs`` with noise variance ``noise``, a sliding window of
    ``window`` samples and forgetting factor ``forget`` (1: none). ``lengthscale_factor``,
    ``amplitude`` and the refits belong to the SE kernel and are not used.

    Without ``reference_x`` the SE lengthscales are ``lengthscale_factor`` itself (in the
    units of x; inputs normalised to unit variance suit 1); a checkpoint restores the
    fitted ones.
    """

    name = "residual"
    # the window is chosen for the control runs (a few seconds of transitions), not by a paper: one size at every scale
    presets = {"small": {"window": 400}, "cpu": {"window": 400}, "paper": {"window": 400}}
    state_fields = ("prior", "hyper", "residual", "observed", "gate_sums")

    @classmethod
    def from_options(
        cls,
        input_dim: int,
        output_dim: int,
        *,
        prior: Learner | str | Mapping[str, Any] | None = None,
        reference_x: Tensor | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64,
        seed: int = 0,
        **options: Any,
    ) -> ResidualGP:
        """The registry's constructor. ``prior``: a learner, the path of a checkpoint
        (:func:`gpdyn.gp.online.save_learner`), ``{"learner": name, "config": {...}}`` as
        this learner's config records it (a fresh prior; a checkpoint then restores its
        state), or None: the zero function (:class:`ZeroMean`), which makes the residual GP
        a sliding-window GP on y itself."""
        if prior is None:
            prior = ZeroMean(input_dim, output_dim, device=device, dtype=dtype, seed=seed)
        elif isinstance(prior, str):
            prior = load_learner(prior, device=device, dtype=dtype)[0]
        elif isinstance(prior, Mapping) and isinstance(prior.get("learner"), str):
            config = {k: v for k, v in dict(prior.get("config", {})).items() if k not in ("input_dim", "output_dim")}
            config.setdefault("seed", seed)
            prior = make_learner(prior["learner"], input_dim, output_dim, device=device, dtype=dtype, **config)
        elif not isinstance(prior, Learner):
            raise LearnerError("ResidualGP: prior must be a learner, a checkpoint path or {'learner': name, 'config': {...}}, "
                               f"got {type(prior).__name__}")
        if (prior.input_dim, prior.output_dim) != (input_dim, output_dim):
            raise LearnerError(f"ResidualGP: the prior maps {prior.input_dim} -> {prior.output_dim} inputs to outputs, "
                               f"not {input_dim} -> {output_dim}")
        return cls(prior, reference_x, **options)

    def __init__(
        self,
        prior: Learner,
        reference_x: Tensor | None = None,
        *,
        window: int = 400,
        lengthscale_factor: float | list[float] | Tensor = 1.0,
        amplitude: float = 0.1,
        noise: float = 1e-4,
        refit_every: int = 100,
        refit_iters: int = 10,
        lr: float = 0.05,
        gated: bool = False,
        gate_decay: float = 0.98,
        gate_z: float = 0.0,
        kernel: str = "se",
        linear_inputs: Sequence[int] = (),
        forget: float = 1.0,
    ) -> None:
        super().__init__(prior.input_dim, prior.output_dim, device=prior.device, dtype=prior.dtype, seed=prior.seed)
        factor = torch.as_tensor(lengthscale_factor, dtype=prior.dtype).reshape(-1)
        if factor.numel() not in (1, prior.input_dim) or not bool(torch.isfinite(factor).all() and (factor > 0).all()):
            raise LearnerError(f"ResidualGP: lengthscale_factor must be one or {prior.input_dim} finite values > 0, "
                               f"got {lengthscale_factor!r}")
        options = {"window": (window, window >= 4),
                   "amplitude": (amplitude, amplitude > 0), "noise": (noise, noise > 0),
                   "refit_every": (refit_every, refit_every >= 1), "refit_iters": (refit_iters, refit_iters >= 0),
                   "lr": (lr, lr > 0), "gate_decay": (gate_decay, 0 < gate_decay < 1),
                   "gate_z": (gate_z, gate_z >= 0), "forget": (forget, 0 < forget <= 1)}
        for name, (value, ok) in options.items():
            if not (ok and math.isfinite(float(value))):
                raise LearnerError(f"ResidualGP: option {name}={value!r} is out of range")
        if kernel not in RESIDUAL_KERNELS:
            raise LearnerError(f"ResidualGP: kernel must be one of {', '.join(RESIDUAL_KERNELS)}, got {kernel!r}")
        linear_inputs = [int(i) for i in linear_inputs]
        if kernel == "linear" and not (linear_inputs and all(0 <= i < prior.input_dim for i in linear_inputs)):
            raise LearnerError(f"ResidualGP: kernel 'linear' needs linear_inputs, columns in [0, {prior.input_dim}), "
                               f"got {linear_inputs}")
        if reference_x is not None and (reference_x.ndim != 2 or reference_x.shape[1] != prior.input_dim
                                        or reference_x.shape[0] < 2):
            raise LearnerError(f"ResidualGP: reference_x must be [N >= 2, {prior.input_dim}], got {tuple(reference_x.shape)}")
        self.prior = prior
        self.window = int(window)
        # the SE kernel's hyperparameters (the linear kernel has none to set or refit)
        self.hyper: dict[str, Tensor] = {}
        if kernel == "se":
            lengthscale = factor.to(prior.device)
            if reference_x is not None:
                lengthscale = lengthscale * median_lengthscale(reference_x.to(prior.device, prior.dtype), generator=self.generator)
            per_output = {"device": prior.device, "dtype": prior.dtype}
            self.hyper = {"lengthscale": lengthscale.expand(prior.output_dim, prior.input_dim).clone(),
                          "amplitude": torch.full((prior.output_dim,), float(amplitude), **per_output),
                          "noise": torch.full((prior.output_dim,), float(noise), **per_output)}
        # the live config of the prior: a checkpoint rebuilds it by name and config
        spec = None if isinstance(prior, ZeroMean) else {"learner": prior.name, "config": prior.config}
        self.config.update(prior=spec, window=self.window, lengthscale_factor=factor.tolist(), amplitude=float(amplitude),
                           noise=float(noise), refit_every=int(refit_every), refit_iters=int(refit_iters), lr=float(lr),
                           gated=bool(gated), gate_decay=float(gate_decay), gate_z=float(gate_z),
                           kernel=kernel, linear_inputs=linear_inputs, forget=float(forget))
        self.residual = self._fresh()
        self.observed = 0
        # gated: exponentially weighted sums per output of d = (error of the prior alone)^2 -
        # (error with the residual)^2, of d^2, of the weights and of their squares
        self.gate_sums = torch.zeros(4, prior.output_dim, device=prior.device, dtype=prior.dtype)
        # the inputs (a transition's few rows) and prior mean of the last predict: observe's residual
        # target on the same rows then needs no second prior prediction (a controller predicts a
        # transition for its log, then learns from it)
        self._last_prior = BatchMemo(max_rows=4)

    @property
    def initialized(self) -> bool:  # type: ignore[override]
        """The frozen prior predicts: the residual starts at zero."""
        return self.prior.initialized

    def diagnostics(self) -> dict[str, float]:
        """The frozen prior's counters, how many residual samples are conditioned on and (gated)
        on how many outputs the residual is used."""
        out = {**self.prior.diagnostics(), "residual_points": float(self.residual.n)}
        if self.config["gated"]:
            out["residual_outputs"] = float(self.gate().sum())
        return out

    def gate(self) -> Tensor:
        """``[output_dim]`` bool: the outputs whose prediction includes the residual."""
        if not self.config["gated"]:
            return torch.ones(self.output_dim, dtype=torch.bool, device=self.device)
        sum_d, sum_dd, sum_w, sum_ww = self.gate_sums
        mean = sum_d / sum_w.clamp_min(1e-300)
        spread = (sum_dd / sum_w.clamp_min(1e-300) - mean.pow(2)).clamp_min(0)
        standard_error = (spread * sum_ww).sqrt() / sum_w.clamp_min(1e-300)  # sqrt(var / n_eff)
        return (sum_w > 0) & (mean > self.config["gate_z"] * standard_error)

    def _fresh(self) -> ExactOnlineGP | LinearKernelGP:
        if self.config["kernel"] == "linear":
            return LinearKernelGP(self.output_dim, self.config["linear_inputs"], window=self.window,
                                  noise=self.config["noise"], forget=self.config["forget"], device=self.device,
                                  dtype=self.dtype)
        gp = ExactOnlineGP(self.input_dim, self.output_dim, device=self.device, dtype=self.dtype, seed=self.seed,
                           lr=self.config["lr"], refit_every=self.config["refit_every"],
                           refit_iters=self.config["refit_iters"], max_points=self.window,
                           learn_hyperparameters=self.config["refit_iters"] > 0)
        gp.set_hyperparameters(**self.hyper)
        return gp

    def _prior_mean(self, x: Tensor) -> Tensor:
        last = self._last_prior.get(x)
        if last is not None:
            return last
        with torch.no_grad():
            return self.prior.predict_mean(x)

    def _after_load(self) -> None:
        self._last_prior.clear()

    def observe(self, x: Tensor, y: Tensor) -> None:
        """Condition the residual GP on ``y - prior(x)`` (the SE kernel's GP is rebuilt from its newest half when full)."""
        r = y - self._prior_mean(x)
        self.check_finite("observe", residual=r)  # a diverged prior: refused before the gate or the GP change
        if self.config["gated"]:
            with torch.no_grad():
                r_pred = self.residual.predict_mean(x) if self.residual.n else torch.zeros_like(r)
            decay = self.config["gate_decay"]
            weights = torch.tensor([decay, decay, decay, decay**2], device=self.device, dtype=self.dtype)[:, None]
            for row in range(x.shape[0]):  # one sample at a time, in the order they were seen
                d = r[row].pow(2) - (r[row] - r_pred[row]).pow(2)
                self.gate_sums = weights * self.gate_sums + torch.stack([d, d * d, torch.ones_like(d), torch.ones_like(d)])
        gp = self.residual
        if isinstance(gp, ExactOnlineGP) and gp.n + x.shape[0] > self.window:
            keep = max(0, self.window // 2 - x.shape[0])
            old_x, old_r = gp.inputs[gp.n - keep :].clone(), gp.targets[gp.n - keep :].clone()
            self.hyper = {k: v.detach().clone() for k, v in gp.hp.as_dict().items()}
            gp = self.residual = self._fresh()
            if keep:
                gp.observe(old_x, old_r)
        gp.observe(x, r)
        self.observed += x.shape[0]

    def step(self, x: Tensor, y: Tensor) -> dict[str, float]:
        """Count a step; the residual GP refits its hyperparameters every ``refit_every`` steps.

        Neither residual model's step reads the batch (the SE kernel's GP refits on the samples
        it holds, the linear kernel has nothing to refit), so its residuals are not computed:
        a prediction of the prior over the whole batch at every control step, unused. The
        batch's own checks (shapes, finite values) still apply."""
        if self.residual.n == 0:
            return {"refit": 0.0}
        return self.residual.step(x, y)

    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        mean, var = self.prior.predict(x)
        self._last_prior.put(x, mean.detach().clone())
        if self.residual.n == 0:
            return mean, var
        r_mean, r_var = self.residual.predict(x)
        if not self.config["gated"]:  # every output takes the residual
            return mean + r_mean, var + r_var
        use = self.gate().to(mean.dtype)
        return mean + use * r_mean, var + use * r_var

    def predict_mean(self, x: Tensor) -> Tensor:
        """Prior mean plus (where the gate lets it in) residual mean, each through its own
        ``predict_mean``: no variance arithmetic in either."""
        mean = self.prior.predict_mean(x)
        if self.residual.n == 0:
            return mean
        if not self.config["gated"]:
            return mean + self.residual.predict_mean(x)
        return mean + self.gate().to(mean.dtype) * self.residual.predict_mean(x)

    def vlb(self, x: Tensor, y: Tensor) -> Tensor:
        """Held-out log likelihood per point of the residual GP on ``y - prior(x)``."""
        return self.residual.vlb(x, y - self._prior_mean(x))

    def noise_variance(self) -> Tensor:
        """The residual model's noise: an observation is prior mean + residual + noise."""
        if isinstance(self.residual, LinearKernelGP):
            return torch.full((self.output_dim,), self.residual.noise, device=self.device, dtype=self.dtype)
        return self.residual.noise_variance()


__all__ = ["RESIDUAL_KERNELS", "LinearKernelGP", "ResidualGP", "ZeroMean"]
