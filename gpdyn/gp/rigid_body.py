"""An arm's inverse dynamics as a GP with rigid-body features, learned online by a Kalman filter.

:class:`RigidBodyGP` models the joint torques of an arm as::

    tau(x) = Y(x) pi + beta * f(x)            x = [q, qd, qdd]

with ``Y`` the arm's rigid-body regressor (:class:`gpdyn.robots.regressor.InertialRegressor`:
ten inertial parameters per body, armature, damping and friction per joint), ``f`` a
frozen pretrained learner (the prior: svdgp, wiski, exact, ...) and ``beta`` one gain per
joint. A Gaussian prior on ``theta = (pi, beta)``, ``pi ~ N(0, s^2)`` in units of each
column's RMS and ``beta ~ N(1, s_beta^2)``, makes ``tau`` a GP with kernel
``Y Sigma Y^T`` plus the prior learner as a basis function: the semiparametric GP of
Nguyen-Tuong & Peters (2010, "Using model knowledge for learning inverse dynamics"), with
the learned model in place of an analytic one. It starts as the prior learner (``pi = 0``,
``beta = 1``) and the data move it toward the rigid-body fit; an arm run first conditions it on the
samples the prior was pretrained on (:meth:`RigidBodyGP.start_from`). The model is structurally
linear in the accelerations, ``tau = M(q) qdd + h(q, qd)``: what it learns where the arm
accelerated one way holds where it accelerates another, which is what a computed-torque
controller queried at its reference needs (an SE kernel over the accelerations returns to
its prior a few length scales from its data).

Online, each observed batch updates the Gaussian posterior of ``theta`` exactly (Bayesian
linear regression as Kalman measurement updates, a chunk of rows at a time): ``O(p^2)`` per
torque observed for the ``p`` parameters, whatever the number of samples seen before. A
sudden plant change (a payload) shows as an innovation far outside the predictive
distribution: when the normalised innovation squared ``nu^T S^-1 nu`` of a sample exceeds
``change_threshold`` (a chi-square test with ``P`` degrees of freedom; the default 20 is in
its tail: 2e-4 for 3 joints, 6e-3 for 7, and the assumed ``noise_std`` is well above the torque
noise of a simulated arm, so a plant as modelled rarely comes near it), the covariance is reset to ``P + reset_std^2 I + change_std^2 I_B`` before the
update, so the new data move the parameters at once instead of being outweighed by the old
ones (covariance resetting, Goodwin & Sin, *Adaptive Filtering, Prediction and Control*,
1984, Sec. 3.4). A change the arm's response hides can pass that test sample after sample: a light
load makes the arm sag, the sag explains most of each torque, and the rest, a few times ``noise_std``, is
learnt slowly into every parameter. With ``change_window = k`` the test also sums the innovations of the
last ``k`` samples: under the model they are independent with covariances ``S_i``, so
``(sum nu)^T (sum S_i)^-1 (sum nu)`` is chi-square with ``P`` degrees of freedom too, and a persistent error
fails it within ``k`` samples. It looks only :data:`WINDOW_HOLD` samples after the latest reset: the
innovations of an estimate settling after a change are persistent as well, and re-opening the covariance on
them made the arm track worse. ``I_B`` selects the parameters of ``change_bodies``, the bodies where a
change is expected (an arm's payload mount: a grasped load changes that body's ten
parameters and nothing else), and of those the terms ``change_terms``: by default the mass
and first moment alone, as for a compact load (a point mass at an unknown offset; its
rotational inertia about the mount is second order in the offset and is learnt as any other
parameter). Re-opening them widely lets a sample or two identify a load: consecutive samples
of a tracking arm are nearly the same equations, so the fewer unknowns a reset opens, the
sooner they are pinned down, and the less the arm drifts meanwhile (docs/control.md, the
arm tables). Re-opening all parameters as widely would leave 7 equations per
sample against ~100 unknowns, and the estimate would follow the data of the last few
samples instead. The one other change a reset re-opens, moderately (``change_friction_std``),
is each joint's dry friction: a friction change shows as a torque offset on every joint at
once that flips sign with the joint's velocity, which the mount's few terms cannot hold (they
absorb part of it and leave the rest to creep in at ``reset_std``); its column is one number
per joint, a few more unknowns that the next samples pin down. It re-opens only the joints
whose torque rose along their motion, as more friction asks: a change that is not friction
would otherwise be taken up in part as friction on the other joints, to flip at their next
reversal.

With ``learn_prior`` the prior learner keeps learning too: after each Kalman update it
observes the part of the torque the rigid-body term leaves, ``(tau - Y pi) / beta`` (WISKI:
its exact cache update; SVDGP: its bases), and takes ``prior_steps`` of its own optimiser steps
(on the rows just observed if it learns from those, else on its last ``prior_batch`` rows) at
every :meth:`step`. The Kalman filter carries what the rigid-body
class can say (a payload: a few samples identify it), the GP (WISKI's exact cache update,
SVDGP's steps) what it cannot. Both see the same torques one after the other, as in
backfitting: the filter explains the torque given the GP's current mean, the GP the rest
given the filter's. :attr:`online_name` is then the prior's name: the GP is the online learner.
``beta`` is estimated with the rest, so where the rigid-body columns explain the torques better
than the prior does (an unchanged arm: they describe it exactly) ``beta`` goes toward 0 and what
the prior learns then weighs little in the prediction.

With ``angle_gp_points`` the model has a third term, a GP of the joint angles per joint
(:class:`gpdyn.gp.angle_gp.AngleGPBasis`: an additive SKI GP with WISKI's structure),

    tau_j(x) = Y_j(x) pi + beta_j f_j(x) + phi(q)^T u_j,     u_j ~ N(0, angle_gp_std^2 K / n),

whose weights ``u_j`` are part of ``theta``: one Kalman update per control step gives the joint posterior of
the rigid-body parameters and this GP. Their priors decide what each carries: a torque of the configuration
that no rigid-body parameter explains (a spring at a joint) goes into the GP, a payload into the mount's
terms, whose reset opens them far wider. A detected change re-opens the GP's weights along their prior, at
``angle_gp_reset_std``, narrower than the dry friction's re-opening: re-opened by its whole prior, the GP took
up part of a friction change as a function of the angles, which the next reversal of the motion flipped
(docs/results/arm-angle-gp). What it buys and costs on the arms: docs/control.md.

Units: like every learner it speaks normalised inputs and outputs (the problem's
:class:`~gpdyn.data.problems.Normalizer`); the regressor needs physical ones, so it is
given the normaliser's statistics. The regressor runs MuJoCo on the CPU: on a GPU every
prediction and update makes a host round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from gpdyn.gp.angle_gp import AngleGPBasis
from gpdyn.gp.base import LOG_2PI, Learner, LearnerError

if TYPE_CHECKING:  # the caller builds it from the arm (robots sit above the learners)
    from gpdyn.robots.regressor import InertialRegressor

# rows of a batch taken into one Kalman update: its innovation covariance is (rows x joints)^2
UPDATE_ROWS = 16
# samples after a covariance reset before the windowed change test looks again (the module notes say why)
WINDOW_HOLD = 200
# the terms of a change body that a detected change re-opens widely by default: the mass and first moment (the
# regressor's names, gpdyn.robots.regressor.BODY_TERMS)
CHANGE_TERMS = ("m", "mcx", "mcy", "mcz")


class RigidBodyGP(Learner):
    """``tau = Y(x) pi + beta * prior(x)`` with a Gaussian posterior on ``(pi, beta)`` (see the module notes).

    ``prior``: the frozen learner (normalised units); ``regressor``: the arm's
    :class:`InertialRegressor`; ``x_mean, x_std, y_mean, y_std``: the normaliser's
    statistics; ``reference_x``: normalised inputs (e.g. the pretraining ones) whose
    regressor columns set each column's scale. ``noise_std``: the torque noise (N m) the
    updates assume; ``param_std``: prior std of ``pi`` per scaled column (N m);
    ``prior_gain_std``: prior std of ``beta`` around 1; ``change_threshold``, ``change_window``, ``reset_std``,
    ``change_bodies``, ``change_terms``, ``change_std``, ``change_friction_std``: the change test and the
    covariance reset. ``angle_gp_points``: grid points per joint angle of the GP of the angles (0: none);
    ``angle_gp_std``: its prior std per joint (N m; the std of its value at a configuration, each angle's
    component at ``angle_gp_std / sqrt(n)``), ``angle_gp_reset_std``: the same at a detected change's re-opening,
    ``angle_gp_lengthscale``: its length scale (normalised).
    """

    name = "rigid-body"
    initialized = True  # it predicts from the start: as the prior
    # step() has nothing to optimise: the updater need not gather recent samples for it
    capabilities = frozenset({"step_on_observed"})
    # the prior and the column scales give theta its meaning: they are state too
    state_fields = ("prior", "column_scale", "theta", "covariance", "window_innovation", "window_spread", "window_rows",
                    "observed", "resets", "recent_x", "recent_y",
                    "recent_rows", "last_rows", "prior_updates", "prior_refused")

    def __init__(
        self,
        prior: Learner,
        regressor: InertialRegressor,
        normalizer: tuple[Sequence[float], Sequence[float], Sequence[float], Sequence[float]],
        reference_x: Tensor,
        *,
        noise_std: float = 0.1,
        param_std: float = 10.0,
        prior_gain_std: float = 0.3,
        # a change's first innovations are damped by the arm's own response (a load makes it sag, and the
        # sagging acceleration explains part of the torque): a test far in the tail let it pass for 20 steps
        change_threshold: float = 20.0,
        change_window: int = 0,
        reset_std: float = 0.3,
        change_bodies: Sequence[str] = (),
        change_terms: Sequence[str] = CHANGE_TERMS,
        change_std: float = 100.0,
        change_friction_std: float = 0.0,
        reference_rows: int = 256,
        learn_prior: bool = False,
        prior_steps: int = 0,
        prior_batch: int = 64,
        angle_gp_points: int = 0,
        angle_gp_std: float = 3.0,
        angle_gp_reset_std: float = 1.5,
        angle_gp_lengthscale: float = 1.0,
    ) -> None:
        super().__init__(prior.input_dim, prior.output_dim, device=prior.device, dtype=prior.dtype, seed=prior.seed)
        n = regressor.n
        if (prior.input_dim, prior.output_dim) != (3 * n, n):
            raise LearnerError(f"RigidBodyGP: a {n}-joint arm maps [q, qd, qdd] ({3 * n}) -> tau ({n}), "
                               f"the prior maps {prior.input_dim} -> {prior.output_dim}")
        if change_window < 0:
            raise LearnerError(f"RigidBodyGP: change_window must be >= 0, got {change_window}")
        if prior_steps < 0 or prior_batch < 1:
            raise LearnerError(f"RigidBodyGP: need prior_steps >= 0 and prior_batch >= 1, got {prior_steps}, {prior_batch}")
        for name, value in (("noise_std", noise_std), ("param_std", param_std), ("prior_gain_std", prior_gain_std),
                            ("change_threshold", change_threshold), ("reset_std", reset_std), ("change_std", change_std)):
            if not (np.isfinite(value) and value > 0):
                raise LearnerError(f"RigidBodyGP: {name} must be finite and > 0, got {value!r}")
        if angle_gp_points < 0 or not all(np.isfinite(v) and v > 0 for v in (angle_gp_std, angle_gp_reset_std)):
            raise LearnerError(f"RigidBodyGP: need angle_gp_points >= 0 and finite angle_gp_std, angle_gp_reset_std "
                               f"> 0, got {angle_gp_points}, {angle_gp_std!r}, {angle_gp_reset_std!r}")
        if not (np.isfinite(change_friction_std) and change_friction_std >= 0):
            raise LearnerError(f"RigidBodyGP: change_friction_std must be finite and >= 0, got {change_friction_std!r}")
        kw = {"device": prior.device, "dtype": prior.dtype}
        x_mean, x_std, y_mean, y_std = (torch.as_tensor(np.asarray(a, dtype=np.float64), **kw) for a in normalizer)
        if x_mean.shape != (3 * n,) or x_std.shape != (3 * n,) or y_mean.shape != (n,) or y_std.shape != (n,):
            raise LearnerError(f"RigidBodyGP: normaliser statistics must be [{3 * n}], [{3 * n}], [{n}], [{n}]")
        if reference_x.ndim != 2 or reference_x.shape[1] != 3 * n or reference_x.shape[0] < 1:
            raise LearnerError(f"RigidBodyGP: reference_x must be [N >= 1, {3 * n}], got {tuple(reference_x.shape)}")
        self.prior, self.regressor = prior, regressor
        self.x_mean, self.x_std, self.y_mean, self.y_std = x_mean, x_std, y_mean, y_std
        self.noise_var = float(noise_std) ** 2
        self.change_threshold = float(change_threshold)
        # the last change_window samples' innovations and their predictive covariances: a ring, window_rows counts the
        # rows written since the start, from -WINDOW_HOLD after a reset (the test runs once it reaches change_window)
        self.change_window = int(change_window)
        self.window_innovation = torch.zeros(self.change_window, n, **kw)
        self.window_spread = torch.zeros(self.change_window, n, n, **kw)
        self.window_rows = 0
        known = {name.split(".")[0] for name in regressor.names}
        unknown = [b for b in change_bodies if b not in known]
        if unknown:
            raise LearnerError(f"RigidBodyGP: change_bodies {unknown} are not moving bodies of the arm ({', '.join(sorted(known))})")
        terms = list(dict.fromkeys(name.split(".")[-1] for name in regressor.names if name.split(".")[0] in known))
        odd = [t for t in change_terms if t not in terms]
        if odd or not change_terms:
            raise LearnerError(f"RigidBodyGP: change_terms must name some of {', '.join(terms)}, got {list(change_terms)}")
        # the covariance a detected change adds: reset_std^2 on every parameter, change_std^2 on the change_terms of
        # change_bodies (names "body.term"); and, joint by joint where the change looks like more friction,
        # friction_extra_var more on the dry friction (_friction_reset)
        reset = [change_std**2 if name.split(".")[0] in change_bodies and name.split(".")[-1] in change_terms
                 else reset_std**2 for name in regressor.names]
        self.reset_covariance = torch.diag(torch.as_tensor(reset + [reset_std**2] * n, **kw))
        self.friction_columns = torch.tensor([k for k, name in enumerate(regressor.names) if name.endswith(".frictionloss")],
                                             device=prior.device)
        self.friction_extra_var = max(float(change_friction_std) ** 2 - float(reset_std) ** 2, 0.0)
        rows = reference_x[torch.randperm(reference_x.shape[0], generator=self.generator)[:reference_rows]]
        columns = self._regressor(rows.to(**kw))
        self.column_scale = columns.pow(2).mean((0, 1)).sqrt().clamp_min(1e-9)  # [p]: the RMS of each column
        p = regressor.p
        self.theta = torch.cat([torch.zeros(p, **kw), torch.ones(n, **kw)])
        self.covariance = torch.diag(torch.cat([torch.full((p,), float(param_std) ** 2, **kw),
                                                torch.full((n,), float(prior_gain_std) ** 2, **kw)]))
        # the GP of the joint angles: one weight vector per joint after (pi, beta), prior angle_gp_std^2 K / n each; a
        # detected change re-opens it by the same prior at angle_gp_reset_std. Narrower than the dry friction's and
        # the mount's re-opening: a friction change or a load is theirs; the GP takes what stays unexplained
        self.angle_gp = AngleGPBasis(reference_x[:, :n].to(**kw), angle_gp_points, angle_gp_lengthscale) \
            if angle_gp_points else None
        if self.angle_gp is not None:
            # each of the n additive components at angle_gp_std / sqrt(n): the sum's std is angle_gp_std
            weights = float(angle_gp_std) ** 2 / n * torch.block_diag(*[self.angle_gp.prior()] * n)
            self.theta = torch.cat([self.theta, torch.zeros(weights.shape[0], **kw)])
            self.covariance = torch.block_diag(self.covariance, weights)
            self.reset_covariance = torch.block_diag(self.reset_covariance,
                                                     (float(angle_gp_reset_std) / float(angle_gp_std)) ** 2 * weights)
        self.observed, self.resets = 0, 0
        # theta just before the latest batch's first covariance reset (None before any): what the arm was before the
        # change, for a gain schedule (gpdyn.control.gain_schedule); not saved with the state
        self.theta_before_reset: Tensor | None = None
        self._body_columns: dict[str, list[int]] = {}
        # the prior's last prior_batch rows and residual targets (a ring; the first recent_rows are filled)
        self.learn_prior, self.prior_steps = bool(learn_prior), int(prior_steps) if learn_prior else 0
        self.recent_x = torch.zeros(prior_batch, 3 * n, **kw)
        self.recent_y = torch.zeros(prior_batch, n, **kw)
        self.recent_rows, self.last_rows, self.prior_updates = 0, 0, 0
        self.prior_refused = 0  # rows a full prior (an exact GP at max_points) could not take: it stopped learning
        self.config.update(prior={"learner": prior.name, "config": prior.config}, noise_std=float(noise_std),
                           param_std=float(param_std), prior_gain_std=float(prior_gain_std),
                           change_threshold=float(change_threshold), change_window=int(change_window),
                           reset_std=float(reset_std),
                           change_bodies=list(change_bodies), change_terms=list(change_terms),
                           change_std=float(change_std), change_friction_std=float(change_friction_std),
                           learn_prior=bool(learn_prior), prior_steps=int(prior_steps), prior_batch=int(prior_batch),
                           angle_gp_points=int(angle_gp_points), angle_gp_std=float(angle_gp_std),
                           angle_gp_reset_std=float(angle_gp_reset_std),
                           angle_gp_lengthscale=float(angle_gp_lengthscale))

    def state_names(self) -> tuple[str, ...]:
        """The state fields, and the grid of the GP of the angles where there is one."""
        return self.state_fields + (("angle_gp",) if self.angle_gp is not None else ())

    def can(self, capability: str) -> bool:  # type: ignore[override]
        """``one_pass`` when no step learns anything: the filter is exact per observation, and a prior that
        learns does so in its steps unless it is one-pass itself (an online updater then counts observes only)."""
        if capability == "one_pass":
            return not self.prior_steps or self.prior.can("one_pass")
        return super().can(capability)

    @property
    def online_name(self) -> str:
        """The learner updated online: the prior GP when it learns (``learn_prior``), else the rigid-body filter."""
        return self.prior.name if self.learn_prior else self.name

    def _regressor(self, x_normalised: Tensor) -> Tensor:
        """``Y [N, n, p]`` at normalised inputs (the regressor works in physical units, on the CPU)."""
        x = (x_normalised * self.x_std + self.x_mean).detach().cpu().numpy()
        n = self.regressor.n
        y = self.regressor(x[:, :n], x[:, n : 2 * n], x[:, 2 * n :])
        return torch.as_tensor(y, device=self.device, dtype=self.dtype)

    def _design(self, x: Tensor) -> Tensor:
        """The rows of the measurement, ``[N, n, p + n (+ n m)]``, in N m: scaled regressor columns, the prior's
        torque, then (with the GP of the angles) its ``m`` basis functions in each joint's own block."""
        with torch.no_grad():
            prior_torque = self.prior.predict_mean(x) * self.y_std + self.y_mean  # [N, n]
        parts = [self._regressor(x) / self.column_scale, torch.diag_embed(prior_torque)]
        if self.angle_gp is not None:  # joint j's row holds phi(q) in joint j's block of weights
            n = self.output_dim
            phi = self.angle_gp.rows(x[:, :n])  # [N, m]
            eye = torch.eye(n, device=self.device, dtype=self.dtype)
            parts.append((eye[:, :, None] * phi[:, None, None, :]).reshape(x.shape[0], n, n * phi.shape[1]))
        return torch.cat(parts, dim=-1)

    @torch.no_grad()
    def start_from(self, x: Tensor, y: Tensor) -> None:
        """Condition ``theta`` on stored samples of the arm as it was (``x [N, 3n]``, ``y [N, n]``, normalised),
        before control. From its prior the filter meets a controller's first samples with ~100 open parameters
        and 7 torques per sample: the first few samples move the parameters along directions they do not
        determine, and the next feed-forward errs by tens of N m (the start transient, docs/control.md).

        The posterior of the Gaussian prior given every stored torque at once, ``Sigma^-1 = Sigma_0^-1 +
        H^T H / s^2``: the Kalman updates of :meth:`observe` in any order, without their change test (the
        stored samples are one plant) and without the prior learning them (it was pretrained on them). Then
        what a detected change does away from the change bodies: ``reset_std^2`` on every parameter's
        variance (the GP of the angles' as a reset re-opens it), and the windowed change test waits
        :data:`WINDOW_HOLD` samples. The posterior of thousands of stored samples is tighter than what it
        knows of the controller's own path (the prior predicts its training samples better than new ones),
        and the estimate settling onto the path gives persistent innovations: without that room a 0.5 N m
        innovation failed the change test just before a payload, which then took 10 steps to identify
        instead of 2."""
        check = self.check_finite
        design = self._design(x)
        check("start_from", design=design)
        torque = y * self.y_std + self.y_mean
        h = design.reshape(-1, design.shape[-1])  # [N n, p + n]
        precision = torch.linalg.inv(self.covariance)
        information = precision + h.T @ h / self.noise_var
        factor = torch.linalg.cholesky(0.5 * (information + information.T))
        rhs = precision @ self.theta + h.T @ torque.reshape(-1) / self.noise_var
        theta = torch.cholesky_solve(rhs[:, None], factor)[:, 0]
        covariance = torch.cholesky_inverse(factor)
        check("start_from", theta=theta, covariance=covariance)
        opened = self.reset_covariance.clone()  # a reset's, but the change bodies' terms as every other parameter
        k = self.regressor.p + self.output_dim
        opened[:k, :k] = self.config["reset_std"] ** 2 * torch.eye(k, device=self.device, dtype=self.dtype)
        self.theta, self.covariance = theta, 0.5 * (covariance + covariance.T) + opened
        self.window_rows = -WINDOW_HOLD  # an estimate settling onto the controller's path, as after a reset

    def observe(self, x: Tensor, y: Tensor) -> None:
        """The posterior of ``theta`` given the batch: a Kalman measurement update per chunk of at most
        :data:`UPDATE_ROWS` rows (the chunk's torques as one measurement), each after a covariance reset
        if one of its rows fails the change test. Nothing changes unless every chunk succeeds."""
        design = self._design(x)  # [q, n, p + n]
        self.check_finite("observe", design=design)
        torque = y * self.y_std + self.y_mean
        theta, covariance, resets, before_reset = self.theta, self.covariance, 0, None
        window_innovation, window_spread = self.window_innovation.clone(), self.window_spread.clone()
        window_rows = self.window_rows
        for start in range(0, x.shape[0], UPDATE_ROWS):
            rows, target = design[start : start + UPDATE_ROWS], torque[start : start + UPDATE_ROWS]
            innovation = target - rows @ theta  # [r, n]
            h = rows.reshape(-1, rows.shape[-1])  # the chunk's r n torques as one measurement
            ph, joint = self._predictive(covariance, h)
            r, n = rows.shape[:2]  # each row's predictive covariance: the diagonal blocks of the chunk's
            spread = joint.view(r, n, r, n).diagonal(dim1=0, dim2=2).permute(2, 0, 1)
            nis = (innovation * torch.linalg.solve(spread, innovation.unsqueeze(-1)).squeeze(-1)).sum(-1)
            changed = nis > self.change_threshold
            if self.change_window:  # the summed innovations of the window: the same test on a persistent error
                for row in range(rows.shape[0]):
                    slot = window_rows % self.change_window
                    window_innovation[slot], window_spread[slot] = innovation[row], spread[row]
                    window_rows += 1
                if window_rows >= self.change_window:
                    total = window_innovation.sum(0)
                    changed = changed | (total @ torch.linalg.solve(window_spread.sum(0), total) > self.change_threshold)
            if bool(changed.any()):  # one host read per chunk: a CPU learner
                covariance, resets = covariance + self.reset_covariance, resets + 1
                if self.friction_extra_var:
                    covariance = covariance + self._friction_reset(x[start : start + UPDATE_ROWS][-1], innovation[-1])
                before_reset = theta if before_reset is None else before_reset
                window_rows = -WINDOW_HOLD
                ph, joint = self._predictive(covariance, h)
            gain = torch.linalg.solve(joint, ph.T).T
            theta = theta + gain @ innovation.reshape(-1)
            covariance = covariance - gain @ ph.T
            covariance = 0.5 * (covariance + covariance.T)
        self.theta, self.covariance = theta, covariance
        self.window_innovation, self.window_spread, self.window_rows = window_innovation, window_spread, window_rows
        if before_reset is not None:
            self.theta_before_reset = before_reset
        self.resets += resets
        self.observed += x.shape[0]
        if self.learn_prior:
            self._observe_prior(x, design, torque)

    def _predictive(self, covariance: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """``(Sigma h^T, h Sigma h^T + s^2 I)`` for a measurement's rows ``h [k, p]``: the Kalman update's two
        products, the second the measurement's predictive covariance (the change test reads it too)."""
        ph = covariance @ h.T
        return ph, h @ ph + self.noise_var * torch.eye(h.shape[0], device=self.device, dtype=self.dtype)

    def _friction_reset(self, x: Tensor, innovation: Tensor) -> Tensor:
        """The covariance (the filter's shape) a detected change adds on the dry friction of each joint whose torque, at
        the sample ``x`` (normalised) that found it, rose along the joint's motion: ``innovation * sign(qd) > 0``,
        as more friction would ask. A change that is not friction (a weaker motor on a gravity-loaded joint) moves
        some joints' torques against their motion; their friction is not re-opened, so the change is not taken up
        there as friction, which would flip at the joint's next reversal."""
        n = self.output_dim
        velocity = x[n : 2 * n] * self.x_std[n : 2 * n] + self.x_mean[n : 2 * n]
        along = (innovation * torch.sign(velocity) > 0).to(self.dtype)
        extra = torch.zeros(self.covariance.shape[0], device=self.device, dtype=self.dtype)
        extra[self.friction_columns] = self.friction_extra_var * along
        return torch.diag(extra)

    def _observe_prior(self, x: Tensor, design: Tensor, torque: Tensor) -> None:
        """The prior observes what the updated rigid-body term leaves of ``torque``, in its own units."""
        p = self.regressor.p
        # beta near 0 would blow the target up; the prior N(1, 0.3^2) keeps it near 1 in practice
        room = self.prior.room()
        if room is not None and x.shape[0] > room:  # a full prior keeps what it has; the filter goes on learning
            self.prior_refused += x.shape[0]
            return
        n = self.output_dim
        beta = self.theta[p : p + n].clamp_min(0.1)
        # what the rigid-body term and the GP of the angles (the columns after beta) leave
        rest = (torque - design[..., :p] @ self.theta[:p] - design[..., p + n :] @ self.theta[p + n :]) / beta
        target = (rest - self.y_mean) / self.y_std
        self.prior.observe(x, target)
        self.prior_updates += 1
        size = self.recent_x.shape[0]
        for row in range(x.shape[0]):  # a chunk of rows at a time; usually one per control step
            slot = (self.recent_rows + row) % size
            self.recent_x[slot], self.recent_y[slot] = x[row], target[row]
        self.recent_rows += x.shape[0]
        self.last_rows = x.shape[0]

    def step(self, x: Tensor, y: Tensor) -> dict[str, float]:
        """The prior's ``prior_steps`` steps when it learns (see the module notes); the rigid-body posterior
        has nothing to optimise: every observation already updated it exactly."""
        if self.can("one_pass") or self.recent_rows == 0:
            return {}
        size = self.recent_x.shape[0]
        # the rows just observed (WISKI's eq. (18) step), else the whole ring
        count = min(self.last_rows if self.prior.can("step_on_observed") else self.recent_rows, size)
        slots = [(self.recent_rows - 1 - k) % size for k in range(count)]
        rows = (self.recent_x[slots], self.recent_y[slots])
        metrics: dict[str, float] = {}
        for _ in range(self.prior_steps):
            metrics = dict(self.prior.step(*rows))
            self.prior_updates += 1
        return metrics

    def _moments(self, x: Tensor, variance: bool) -> tuple[Tensor, Tensor | None]:
        lead = x.shape[:-1]
        design = self._design(x.reshape(-1, self.input_dim))
        mean = ((design @ self.theta - self.y_mean) / self.y_std).reshape(*lead, self.output_dim)
        if not variance:
            return mean, None
        var = torch.einsum("nij,jk,nik->ni", design, self.covariance, design) / self.y_std**2
        return mean, var.reshape(*lead, self.output_dim)

    @torch.no_grad()
    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Latent mean and variance ``[..., P]`` (normalised): ``h theta`` and ``h Sigma h^T``."""
        mean, var = self._moments(x, variance=True)
        assert var is not None
        return mean, var

    @torch.no_grad()
    def predict_mean(self, x: Tensor) -> Tensor:
        return self._moments(x, variance=False)[0]

    @torch.no_grad()
    def vlb(self, x: Tensor, y: Tensor) -> Tensor:
        """Held-out log predictive density per point and output, ``[P]`` (normalised units)."""
        mean, var = self._moments(x, variance=True)
        assert var is not None
        var = var + self.noise_var / self.y_std**2
        return (-0.5 * ((y - mean).pow(2) / var + var.log() + LOG_2PI)).reshape(-1, self.output_dim).mean(0)

    def noise_variance(self) -> Tensor:
        return self.noise_var / self.y_std**2

    def body_estimate(self, body: str, theta: Tensor | None = None) -> np.ndarray:
        """The estimate (``theta``, default the current one) of ``body``'s ten regressor terms (``(m, m c, I_O)``,
        :data:`gpdyn.robots.regressor.BODY_TERMS`) in physical units: what the rigid-body term adds for that body on
        top of ``beta`` times the prior, not the body's own parameters (the prior carries part of the arm)."""
        index = self._body_columns.get(body)
        if index is None:
            index = [i for i, name in enumerate(self.regressor.names) if name.rsplit(".", 1)[0] == body]
            if len(index) != 10:
                raise LearnerError(f"RigidBodyGP: {body!r} is not a moving body of the arm's regressor")
            self._body_columns[body] = index
        theta = self.theta if theta is None else theta
        return (theta[index] / self.column_scale[index]).detach().cpu().numpy()

    def diagnostics(self) -> dict[str, float]:
        """The prior's counters, the samples learnt from and the covariance resets (detected changes)."""
        return {**self.prior.diagnostics(), "observed": float(self.observed), "covariance_resets": float(self.resets),
                "prior_updates": float(self.prior_updates), "prior_rows_refused": float(self.prior_refused)}

    def _state_header(self) -> dict[str, Any]:
        return {"regressor_columns": self.regressor.names}


__all__ = ["UPDATE_ROWS", "RigidBodyGP"]
