"""Sampling-based model-predictive control in torch: MPPI and CEM (docs/architecture.md "Controllers and the episode loop").

Both implement :class:`gpdyn.control.planner.Planner` on torch tensors. They roll ``K``
action sequences of horizon ``H`` through a dynamics model in one batch per time step and
score them with a task cost:

- dynamics: ``(state [K, nx], action [K, nu]) -> next_state [K, nx]``, or
  ``-> (next_state, variance [K, nx])`` for a probabilistic model (a GP's predictive
  variance). With a variance the planner can use the model's uncertainty
  (``MPCConfig.uncertainty``): ``"mean"`` ignores it, ``"penalty"`` adds
  ``var_weight * sum(variance)`` to the step cost, ``"sample"`` propagates a sample
  ``mean + sqrt(variance) * eps`` of the predictive distribution (trajectory sampling, as
  in PETS, Chua et al. 2018). When the cost does not use the variance (``"mean"``, or
  ``"penalty"`` with ``var_weight = 0``: :meth:`MPCConfig.uses_variance`) and the model is
  a :class:`gpdyn.control.planner.PlanningModel`, with ``predict_mean(state, action) ->
  next_state`` (:class:`gpdyn.control.dynamics.LearnedDynamics`,
  :class:`~gpdyn.control.dynamics.SimDynamics`), the planner calls that instead: for the GP
  learners the mean-only path, which skips the variance arithmetic (most of a prediction's).
  ``PlanInfo.variance`` is then 0.
- cost: ``(state, action, next_state) -> (cost [K], terminated [K] bool)``. A sample that
  terminates pays ``terminal_cost`` once and nothing after (its state is frozen), so that
  losing the per-step reward of a live robot is what termination costs. A cost that never
  terminates may return ``None`` for ``terminated``: the rollout then skips the bookkeeping.
- terminal value (optional): ``state [K, nx] -> value [K]`` in reward units, e.g. the
  TRPO critic; a sample alive at the horizon's end has it subtracted from its cost, so a
  short horizon still sees what lies beyond it (MPC with a value terminal, as in POLO,
  Lowrey et al. 2019).
- proposal (optional): ``state [K, nx] -> action [K, nu]``, e.g. the TRPO policy. A
  fraction ``proposal_fraction`` of the samples follows it closed-loop through the model
  with exploration noise (policy-guided sampling; the proposal is evaluated on those
  samples only, so it must act on each row alone, as a policy does); it also seeds the
  nominal plan and is the fallback when planning fails.
- planning relative to the proposal (``MPCConfig.relative_to_proposal``): the plan is an
  offset sequence added to the proposal's closed-loop actions, ``a_t = pi(x_t) + u_t``,
  and every sample follows the proposal. Zero offsets are the proposal itself and the
  nominal plan starts there, so the planner moves away from the policy only as far as
  the model tells it to; samples stay near the proposal's state distribution (where a
  model trained on its rollouts is accurate); and a terminal value of the proposal's
  critic means what it says, the return of following the proposal after the horizon.
  This is MPC as a policy-improvement step (cf. Lowrey et al. 2019; Sikchi et al. 2021,
  "Learning off-policy with online planning").
- proposal tail (optional, ``MPCConfig.proposal_tail``): after the ``H`` planned steps every
  sample follows the proposal alone through the model for this many more steps, paying
  their costs, before the terminal value is read. The plan is then judged by where the
  policy takes it under the model, and the value (learnt on another plant, for the TRPO
  critic after a plant change) only from further away; the searched space stays ``H``
  steps long.

MPPI: information-theoretic path integral control (Williams et al. 2017, "Information
theoretic MPC for model-based reinforcement learning", eq. (13)): the new nominal plan is
the softmax(-cost / lambda)-weighted average of the sampled sequences. Its control cost
``lambda * u' Sigma^-1 eps`` (Alg. 2) is weighted by ``MPCConfig.control_cost``: at 1 the
update estimates the KL-regularised optimum around the base distribution (the proposal when
planning offsets to it), so the warm-started plan does not drift from the base without a
cost that pays for it; at 0 (the default) it is dropped. CEM: the cross-entropy method
(Rubinstein 1999; Chua et al. 2018): refit a diagonal Gaussian over sequences to the elite
samples for a few iterations. Both warm-start from the previous plan shifted by one step,
unless ``MPCConfig.warm_start`` is off: then every plan starts again from the initial
nominal (the proposal's rollout, or zero offsets to it).

Why a cold start: planning offsets ``u`` to the proposal with the control cost, the term
``u' Sigma^-1 eps`` of a warm-started ``u`` spreads across samples about as much as the noise
does (``sqrt(H nu)``), far more than the sampled costs over lambda on Walker2d MPC around the
TRPO policy (docs/results/implementation-timings.md): the importance weights then fall on one
sample, chosen by its noise, not by the model (``PlanInfo.cost_spread``
and ``control_spread`` report both). With the offsets restarted at
zero the control term vanishes (the proposal is the base distribution itself) and the
weights are ``softmax(-cost / lambda)`` of what the model predicts.

A non-finite model prediction never reaches the actuators: a sample whose cost is not
finite is discarded, and if none is left (or the plan itself is not finite) the planner
returns the proposal's action at the current state, or the safe action, and reports the
fallback in ``PlanInfo``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import Tensor

from gpdyn.compiled import traced
from gpdyn.control.mpc_config import UNCERTAINTY, MPCConfig, MPCConfigError
from gpdyn.control.planner import Planner as PlannerInterface
from gpdyn.errors import InputError

DynamicsOut = Tensor | tuple[Tensor, Tensor]
Dynamics = Callable[[Tensor, Tensor], DynamicsOut]
Cost = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor | None]]
Proposal = Callable[[Tensor], Tensor]
Value = Callable[[Tensor], Tensor]


@dataclass
class PlanInfo(Mapping[str, Any]):
    """What one :meth:`Planner.plan` call did (logged per control step): its fields as attributes, and as a
    mapping of their names to their values, the ``info`` of :class:`gpdyn.control.planner.Planner`."""

    cost: float  # the best sampled cost
    expected_cost: float  # the weighted (MPPI) or elite (CEM) mean cost
    variance: float  # mean summed predictive variance along the chosen samples (0 without one, or when the cost does not use it)
    finite_fraction: float  # samples with a finite cost
    seconds: float
    fallback: str = ""  # why the plan was not used ("" when it was)
    # how many samples the update rests on: MPPI 1 / sum(w^2) of its weights (Kish's
    # effective sample size; near 1 means the plan is one sample, noise included), CEM its
    # finite elites
    effective_samples: float = 0.0
    # MPPI: what spreads its log-weights across the finite samples, in units of lambda: the
    # sampled costs (std of cost / lambda) and the control-cost term (std of its share);
    # when the second dwarfs the first, the model's costs do not decide the plan
    cost_spread: float = 0.0
    control_spread: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __getitem__(self, name: str) -> Any:
        if name not in _PLAN_INFO_FIELDS:
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(_PLAN_INFO_FIELDS)

    def __len__(self) -> int:
        return len(_PLAN_INFO_FIELDS)


_PLAN_INFO_FIELDS = tuple(f.name for f in fields(PlanInfo))


@dataclass
class Rollout:
    """The sampled sequences of one planning iteration."""

    actions: Tensor  # [K, H, nu] (a view of a time-major buffer), the planned variable: actions as applied (clipped, proposal included), or
    # with ``relative_to_proposal`` the applied actions' offsets to the proposal's
    costs: Tensor  # [K], non-finite replaced by +inf
    variance: Tensor  # [K], summed predictive variance over the horizon and the proposal tail
    noise: Tensor  # [K, H, nu], the exploration noise added to the mean sequence (zero for the nominal sample)


class Planner(PlannerInterface):
    """Shared machinery of :class:`MPPI` and :class:`CEM`: sampling, rollouts, fallback. A
    :class:`gpdyn.control.planner.Planner` on torch tensors, its ``info`` a :class:`PlanInfo`."""

    def __init__(
        self,
        dynamics: Dynamics,
        cost: Cost,
        action_low: Tensor | list[float],
        action_high: Tensor | list[float],
        config: MPCConfig | None = None,
        *,
        proposal: Proposal | None = None,
        terminal_value: Value | None = None,
        safe_action: Tensor | list[float] | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64,
        seed: int = 0,
    ) -> None:
        self.config = config or MPCConfig()
        self.config.validate()
        if self.config.compiled:
            cost, proposal = traced(cost, "MPC compiled=False"), traced(proposal, "MPC compiled=False")
        self.dynamics, self.cost, self.proposal = dynamics, cost, proposal
        self.terminal_value = terminal_value
        self.device, self.dtype = torch.device(device), dtype
        kw = {"device": self.device, "dtype": dtype}
        self.low = torch.as_tensor(action_low, **kw).reshape(-1)
        self.high = torch.as_tensor(action_high, **kw).reshape(-1)
        if self.low.shape != self.high.shape or not bool((self.high > self.low).all()):
            raise MPCConfigError(f"MPC action bounds need low < high of one shape, got {action_low} and {action_high}")
        self.nu = int(self.low.shape[0])
        std = torch.as_tensor(self.config.noise_std, **kw).reshape(-1)
        if std.numel() not in (1, self.nu):
            raise MPCConfigError(f"MPC option noise_std has {std.numel()} values for {self.nu} actions")
        self.noise_std = std.expand(self.nu).clone()
        safe = torch.zeros(self.nu, **kw) if safe_action is None else torch.as_tensor(safe_action, **kw).reshape(-1)
        if safe.shape != (self.nu,):
            raise MPCConfigError(f"MPC safe_action has shape {tuple(safe.shape)}, expected ({self.nu},)")
        self.safe_action = torch.clamp(safe, self.low, self.high)
        # the rollouts' clamp: two numbers when every action shares its bounds (a tensor-bound
        # clamp runs about 10x slower on the CPU), else the bound vectors
        same = bool((self.low == self.low[0]).all() and (self.high == self.high[0]).all())
        self._bounds: tuple[Any, Any] = (float(self.low[0]), float(self.high[0])) if same else (self.low, self.high)
        for option in ("relative_to_proposal", "proposal_tail"):
            if getattr(self.config, option) and proposal is None:
                raise MPCConfigError(f"MPC option {option} needs a proposal policy")
        # the model's mean-only path, used when the cost does not need the variance (module docs)
        mean_only = getattr(dynamics, "predict_mean", None)
        self._mean_dynamics = mean_only if callable(mean_only) and not self.config.uses_variance() else None
        self.seed = int(seed)
        self.generator = torch.Generator(device=self.device).manual_seed(self.seed)
        self.nominal: Tensor | None = None  # [H, nu]

    # -- the public loop ------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the warm start (call at the start of an episode)."""
        self.nominal = None

    def plan(self, state: Tensor) -> tuple[Tensor, PlanInfo]:
        """The action ``[nu]`` to apply at ``state [nx]`` and what planning did."""
        t0 = time.perf_counter()
        state = self._check_state(state)
        if self.nominal is None or not self.config.warm_start:
            self.nominal = self._initial_nominal(state)
        try:
            action, info = self._optimise(state)
            if action is not None and self.config.relative_to_proposal:
                assert self.proposal is not None
                action = torch.clamp(self.proposal(state.unsqueeze(0))[0] + action, self.low, self.high)
        except FloatingPointError as err:  # a model may raise on non-finite input
            action, info = None, PlanInfo(math.inf, math.inf, 0.0, 0.0, 0.0, fallback=f"model error: {err}")
        if action is None or not bool(torch.isfinite(action).all()):
            reason = info.fallback or "plan not finite"
            action = self.fallback_action(state)
            info.fallback = reason
            self.nominal = None  # the warm start is what failed; start over next step
        info.seconds = time.perf_counter() - t0
        return action, info

    def fallback_action(self, state: Tensor) -> Tensor:
        """The proposal's action at ``state`` when it is finite, else the safe action."""
        if self.proposal is not None:
            a = self.proposal(state.unsqueeze(0))[0]
            if bool(torch.isfinite(a).all()):
                return torch.clamp(a, self.low, self.high)
        return self.safe_action.clone()

    # -- pieces the subclasses share --------------------------------------------------------
    def _check_state(self, state: Tensor) -> Tensor:
        state = torch.as_tensor(state, device=self.device, dtype=self.dtype)
        if state.ndim != 1:
            raise InputError(f"{type(self).__name__}.plan: state must be one vector [nx], got shape {tuple(state.shape)}")
        if not bool(torch.isfinite(state).all()):
            raise InputError(f"{type(self).__name__}.plan: the measured state contains NaN or inf")
        return state

    def _initial_nominal(self, state: Tensor) -> Tensor:
        """Zero-noise proposal rollout through the model (zero offsets when planning relative to
        it), or the safe action repeated."""
        h = self.config.horizon
        if self.config.relative_to_proposal:
            return torch.zeros(h, self.nu, device=self.device, dtype=self.dtype)
        if self.proposal is None:
            return self.safe_action.expand(h, self.nu).clone()
        acts = []
        x = state.unsqueeze(0)
        with torch.no_grad():
            for _ in range(h):
                a = torch.clamp(self.proposal(x), self.low, self.high)
                acts.append(a[0])
                x, _ = self._model(x, a)
        nominal = torch.stack(acts)
        if not bool(torch.isfinite(nominal).all()):
            return self.safe_action.expand(h, self.nu).clone()
        return nominal

    def _shift(self, plan: Tensor) -> Tensor:
        """Warm start: the plan one step later, its last action repeated."""
        return torch.cat([plan[1:], plan[-1:]], dim=0)

    def _model(self, x: Tensor, a: Tensor) -> tuple[Tensor, Tensor | None]:
        """Next states and the predictive variance ``[K, nx]`` (None for a deterministic model,
        or when the cost does not use it and the model predicts the mean alone)."""
        if self._mean_dynamics is not None:
            return self._mean_dynamics(x, a), None
        out = self.dynamics(x, a)
        if isinstance(out, tuple):
            nxt, var = out
            return nxt, var.reshape(nxt.shape)
        return out, None

    def rollout(self, state: Tensor, mean: Tensor, std: Tensor) -> Rollout:
        """Sample ``K`` sequences around ``mean [H, nu]`` with ``std [H, nu]`` and score them.

        The per-step work is the model, the cost and five small ops: the free samples'
        actions are formed for all ``H`` steps at once (only the proposal's samples need the
        state), time-major so that each step's ``[K, nu]`` block is contiguous, and the
        termination bookkeeping keeps ``alive`` as a mask (``Rollout.actions`` is a
        ``[K, H, nu]`` view of that buffer)."""
        cfg = self.config
        k, h, nu = cfg.samples, cfg.horizon, self.nu
        kw = {"dtype": self.dtype, "device": self.device}
        # std made contiguous: a broadcast over an expanded (zero-stride) operand runs several times slower
        noise = torch.randn(k, h, nu, generator=self.generator, **kw).mul_(std.contiguous())
        if cfg.keep_nominal:
            noise[0] = 0.0
        noise_t = noise.transpose(0, 1)  # [H, K, nu] view
        relative = cfg.relative_to_proposal
        n_prop = int(round(cfg.proposal_fraction * k)) if self.proposal is not None and not relative else 0
        # the last n_prop samples follow the proposal closed-loop, with the same noise scale;
        # the proposal is evaluated on them alone, and at t = 0, where every sample is at the
        # measured state, on one row
        guided = slice(k - n_prop, k)
        applied = torch.empty(h, k, nu, **kw)  # time-major: applied[t] is one contiguous [K, nu] block
        bounds = self._bounds
        if not relative:  # every free sample's actions at once (the proposal's rows are written step by step)
            # only the free rows: the add transposes [K, H] rows of nu numbers to [H, K], ~1.7 ns a number
            free = slice(0, k - n_prop)
            torch.add(mean.unsqueeze(1), noise_t[:, free], out=applied[:, free]).clamp_(*bounds)
        x = state.expand(k, -1).clone()
        alive = torch.ones(k, dtype=torch.bool, device=self.device)
        alive_f = torch.ones(k, **kw)  # alive as a number, for the cost sum
        # on the CPU, while no sample has terminated, a step with no termination needs no masking
        # (reading done.any() costs a few us there; on a GPU it would be a host sync per step)
        none_dead = self.device.type == "cpu"
        total = torch.zeros(k, **kw)
        var_sum = torch.zeros(k, **kw)
        discount = 1.0
        with torch.no_grad():
            for t in range(h + cfg.proposal_tail):
                if t >= h:  # the tail: the proposal alone
                    a = torch.clamp(self.proposal(x), *bounds)
                elif relative:
                    base = self.proposal(x[:1] if t == 0 else x)
                    a = torch.add(base + mean[t], noise_t[t]).clamp_(*bounds)  # not in place: a proposal may broadcast
                    torch.sub(a, base, out=applied[t])  # the offset as applied, so the update averages what was used
                else:
                    a = applied[t]
                    if n_prop:  # written into a's rows (a proposal may broadcast, so not added in place)
                        prop = self.proposal(x[:1] if t == 0 else x[guided])
                        torch.add(prop, noise_t[t, guided], out=a[guided]).clamp_(*bounds)
                nxt, var_full = self._model(x, a)
                if var_full is not None:
                    var = var_full.sum(-1)
                    var_sum.addcmul_(alive_f, var)
                    if cfg.uncertainty == "sample":
                        draw = torch.randn(nxt.shape, generator=self.generator, **kw)
                        nxt = nxt + torch.sqrt(torch.clamp(var_full, min=0.0)) * draw
                c, done = self.cost(x, a, nxt)
                if cfg.uncertainty == "penalty" and var_full is not None:
                    c = c + cfg.var_weight * var
                total.addcmul_(alive_f, c, value=discount)
                if done is None or (none_dead and not bool(done.any())):  # None: a cost that never terminates
                    x = nxt
                else:
                    none_dead = False
                    if cfg.terminal_cost:  # paid once, by the samples that terminate at this step
                        total.addcmul_(alive_f, done.to(self.dtype), value=discount * cfg.terminal_cost)
                    # a terminated sample keeps its state: no cost, no model calls on garbage
                    alive = torch.gt(alive, done)  # alive and not done (True > False only)
                    x = torch.where(alive.unsqueeze(-1), nxt, x)
                    alive_f = alive.to(self.dtype)
                discount *= cfg.gamma
            if self.terminal_value is not None:
                total = total - discount * alive_f * self.terminal_value(x)
        total = torch.where(torch.isfinite(total), total, torch.full_like(total, math.inf))
        return Rollout(applied.transpose(0, 1), total, var_sum, noise)

    def _optimise(self, state: Tensor) -> tuple[Tensor | None, PlanInfo]:
        raise MPCConfigError(f"{type(self).__name__} is not a planner; use MPPI or CEM")


def _finite_summary(roll: Rollout) -> tuple[Tensor, float]:
    """The samples with a finite cost and their fraction (exactly 1.0 when all are: a count over K)."""
    finite = torch.isfinite(roll.costs)
    return finite, int(finite.sum()) / finite.numel()


def _finite_std(values: Tensor, finite: Tensor, frac: float) -> float:
    """Std of ``values`` over the finite samples (``frac`` of them: all when 1, no mask needed)."""
    if frac == 1.0:
        return float(values.std()) if values.numel() > 1 else 0.0
    return float(values[finite].std()) if int(finite.sum()) > 1 else 0.0


class MPPI(Planner):
    """Model-predictive path integral control (Williams et al. 2017); see the module docs."""

    def _optimise(self, state: Tensor) -> tuple[Tensor | None, PlanInfo]:
        assert self.nominal is not None
        mean = self.nominal
        std = self.noise_std.expand(self.config.horizon, self.nu)
        roll = self.rollout(state, mean, std)
        finite, frac = _finite_summary(roll)
        if frac == 0.0:
            return None, PlanInfo(math.inf, math.inf, 0.0, 0.0, 0.0, fallback="no sample with a finite cost")
        costs = roll.costs
        lam = self.config.temperature
        control = torch.zeros_like(costs)
        if self.config.control_cost:
            # lambda * u' Sigma^-1 eps: with the base distribution at zero, the part of
            # lambda/2 * |u + eps|^2_Sigma that differs between samples (Williams et al. 2017)
            k = roll.noise.shape[0]
            control = self.config.control_cost * (roll.noise.reshape(k, -1) @ (mean / std.pow(2)).reshape(-1))
            costs = costs + lam * control
        best = costs.min()
        # softmax(-(J - min J) / lambda); -inf logits (non-finite costs) get zero weight
        w = torch.softmax(-(costs - best) / lam, dim=0)
        # sum_k w_k actions_k over the finite samples: one vector-matrix product per step of the
        # time-major actions; a non-finite sample's actions may be NaN (0 * NaN is NaN),
        # so they are zeroed first, when there are any
        actions = roll.actions if frac == 1.0 else torch.where(finite[:, None, None], roll.actions, 0.0)
        new_plan = torch.matmul(w, actions.transpose(0, 1))  # [K] @ [H, K, nu]: the time-major buffer itself
        self.nominal = self._shift(new_plan)
        expected = (w * torch.where(finite, costs, 0.0)).sum()
        info = PlanInfo(float(best), float(expected), float((w * torch.where(finite, roll.variance, 0.0)).sum()), frac, 0.0,
                        effective_samples=float(1.0 / w.pow(2).sum()), cost_spread=_finite_std(roll.costs / lam, finite, frac),
                        control_spread=_finite_std(control, finite, frac))
        return new_plan[0], info


class CEM(Planner):
    """Cross-entropy method over action sequences (diagonal Gaussian, elite refits).

    The refits stay on the device: elites with a non-finite cost get zero weight rather
    than being counted on the host, so a GPU is synchronised once per plan, not once per
    iteration.
    """

    def _optimise(self, state: Tensor) -> tuple[Tensor | None, PlanInfo]:
        assert self.nominal is not None
        cfg = self.config
        mean = self.nominal
        std = self.noise_std.expand(cfg.horizon, self.nu).clone()
        n_elite = max(1, int(round(cfg.elite_fraction * cfg.samples)))
        inf = torch.full((), math.inf, dtype=self.dtype, device=self.device)
        best_cost, best_plan = inf, mean
        frac, elite_cost, elite_var = torch.zeros_like(inf), inf, torch.zeros_like(inf)
        for _ in range(cfg.iterations):
            roll = self.rollout(state, mean, std)
            frac = torch.isfinite(roll.costs).to(self.dtype).mean()
            order = torch.argsort(roll.costs)[:n_elite]  # +inf (non-finite) sorts last
            costs, elites = roll.costs[order], roll.actions[order]
            ok = torch.isfinite(costs)
            count = ok.sum()
            w = ok.to(self.dtype) / count.clamp_min(1)
            e_mean = (w[:, None, None] * elites).sum(0)
            e_std = torch.where(count > 1, ((w[:, None, None] * (elites - e_mean) ** 2).sum(0)).sqrt(), std)
            improved = costs[0] < best_cost  # False when no cost is finite
            best_cost = torch.where(improved, costs[0], best_cost)
            best_plan = torch.where(improved, elites[0], best_plan)
            any_ok = count > 0  # with none finite, the next iteration samples the same Gaussian again
            elite_cost = torch.where(any_ok, (w * torch.where(ok, costs, 0.0)).sum(), elite_cost)
            elite_var = torch.where(any_ok, (w * torch.where(ok, roll.variance[order], 0.0)).sum(), elite_var)
            mean = torch.where(any_ok, cfg.cem_alpha * mean + (1 - cfg.cem_alpha) * e_mean, mean)
            std = torch.where(any_ok, cfg.cem_alpha * std + (1 - cfg.cem_alpha) * e_std, std)
        if not math.isfinite(float(best_cost)):  # the one host sync of the plan
            return None, PlanInfo(math.inf, math.inf, 0.0, float(frac), 0.0, fallback="no sample with a finite cost")
        self.nominal = self._shift(mean)
        # the refitted mean may average incompatible elites; the best sequence never does
        return best_plan[0], PlanInfo(float(best_cost), float(elite_cost), float(elite_var), float(frac), 0.0,
                                      effective_samples=float(count))


PLANNERS: dict[str, type[Planner]] = {"mppi": MPPI, "cem": CEM}


def make_planner(name: str, *args: Any, **kwargs: Any) -> Planner:
    """The planner registered under ``name`` ("mppi" or "cem")."""
    if name not in PLANNERS:
        raise MPCConfigError(f"unknown planner '{name}'; choose one of {', '.join(PLANNERS)}")
    return PLANNERS[name](*args, **kwargs)


__all__ = ["CEM", "MPCConfig", "MPCConfigError", "MPPI", "PLANNERS", "PlanInfo", "Planner", "Rollout", "UNCERTAINTY", "make_planner"]
