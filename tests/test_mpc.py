"""MPPI and CEM on a double integrator with a known linear model (float64, CPU, small)."""

from __future__ import annotations

import math

import pytest
import torch
from double_integrator import A, DT, GOAL, linear

from gpdyn.control.mpc import CEM, MPPI, MPCConfig, MPCConfigError, make_planner
from gpdyn.errors import InputError


def cost(x: torch.Tensor, u: torch.Tensor, nxt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    err = nxt - GOAL
    c = err[:, 0] ** 2 + 0.1 * err[:, 1] ** 2 + 0.01 * (u**2).sum(-1)
    return c, torch.zeros_like(c, dtype=torch.bool)


def run(planner, steps: int = 50) -> torch.Tensor:
    torch.set_num_threads(1)
    x = torch.zeros(2, dtype=torch.float64)
    for _ in range(steps):
        u, info = planner.plan(x)
        assert info.fallback == ""
        assert u.shape == (1,) and -1.0 <= float(u) <= 1.0
        x = linear(x[None], u[None])[0]
    return x


@pytest.mark.parametrize("name", ["mppi", "cem"])
def test_planner_drives_double_integrator_to_goal(name: str) -> None:
    cfg = MPCConfig(horizon=15, samples=200, noise_std=0.5, temperature=0.05, iterations=3)
    planner = make_planner(name, linear, cost, [-1.0], [1.0], cfg, seed=1)
    x = run(planner)
    assert abs(float(x[0]) - 1.0) < 0.05, x
    assert abs(float(x[1])) < 0.1, x


def test_proposal_guided_sampling_reaches_goal() -> None:
    def pd(x: torch.Tensor) -> torch.Tensor:  # a decent but not optimal proposal
        return (-2.0 * (x[:, :1] - 1.0) - 2.0 * x[:, 1:]).clamp(-1, 1)

    cfg = MPCConfig(horizon=15, samples=100, noise_std=0.3, temperature=0.05, proposal_fraction=0.5)
    x = run(MPPI(linear, cost, [-1.0], [1.0], cfg, proposal=pd, seed=2))
    assert abs(float(x[0]) - 1.0) < 0.05 and abs(float(x[1])) < 0.1, x


def test_same_seed_same_plan() -> None:
    cfg = MPCConfig(horizon=10, samples=64)
    a = [MPPI(linear, cost, [-1.0], [1.0], cfg, seed=5).plan(torch.zeros(2, dtype=torch.float64))[0] for _ in range(2)]
    assert torch.equal(a[0], a[1])


@pytest.mark.parametrize("planner_cls", [MPPI, CEM])
def test_nan_model_never_reaches_actuators(planner_cls) -> None:
    def broken(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return torch.full_like(x, math.nan)

    def proposal(x: torch.Tensor) -> torch.Tensor:
        return torch.full((x.shape[0], 1), 0.25, dtype=x.dtype)

    cfg = MPCConfig(horizon=5, samples=32)
    u, info = planner_cls(broken, cost, [-1.0], [1.0], cfg, proposal=proposal).plan(torch.zeros(2, dtype=torch.float64))
    assert info.fallback and info.finite_fraction == 0.0
    assert torch.equal(u, torch.tensor([0.25], dtype=torch.float64))
    # without a proposal the safe action is used
    u, info = planner_cls(broken, cost, [-1.0], [1.0], cfg, safe_action=[-0.5]).plan(torch.zeros(2, dtype=torch.float64))
    assert info.fallback and float(u) == -0.5


@pytest.mark.parametrize("planner_cls", [MPPI, CEM])
def test_partly_nan_model_discards_bad_samples(planner_cls) -> None:
    def flaky(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        nxt = linear(x, u)
        return torch.where(u > 0.8, torch.full_like(nxt, math.nan), nxt)  # half-broken model

    cfg = MPCConfig(horizon=10, samples=128, noise_std=0.5, temperature=0.05)
    planner = planner_cls(flaky, cost, [-1.0], [1.0], cfg, seed=3)
    u, info = planner.plan(torch.zeros(2, dtype=torch.float64))
    assert info.fallback == "" and 0.0 < info.finite_fraction < 1.0
    assert bool(torch.isfinite(u).all()) and float(u) <= 0.8  # never a sample that went NaN
    assert math.isfinite(info.expected_cost) and math.isfinite(info.variance)


def test_variance_penalty_steers_away_from_uncertain_actions() -> None:
    def uncertain(x: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # the model is unsure about pushing forward: variance grows with positive u
        var = (5.0 * u.clamp_min(0.0)).expand(-1, 2)
        return linear(x, u), var

    x0 = torch.zeros(2, dtype=torch.float64)
    firsts = {}
    for mode, weight in (("mean", 0.0), ("penalty", 10.0)):
        cfg = MPCConfig(horizon=10, samples=256, noise_std=0.5, temperature=0.05, uncertainty=mode, var_weight=weight)
        u, info = MPPI(uncertain, cost, [-1.0], [1.0], cfg, seed=4).plan(x0)
        firsts[mode] = (float(u), info.variance)
    assert firsts["penalty"][0] < firsts["mean"][0] - 0.2
    assert firsts["penalty"][1] < firsts["mean"][1]


def test_sampling_from_predictive_distribution_still_reaches_goal() -> None:
    def noisy(x: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return linear(x, u), torch.full_like(x, 1e-6)

    cfg = MPCConfig(horizon=15, samples=200, noise_std=0.5, temperature=0.05, uncertainty="sample")
    x = run(MPPI(noisy, cost, [-1.0], [1.0], cfg, seed=6))
    assert abs(float(x[0]) - 1.0) < 0.05


def test_termination_stops_cost_and_adds_terminal_cost() -> None:
    def walls(x: torch.Tensor, u: torch.Tensor, nxt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ones(x.shape[0], dtype=x.dtype), nxt[:, 0] > 0.015  # alive cost 1 per step

    cfg = MPCConfig(horizon=10, samples=8, noise_std=0.1, terminal_cost=100.0)
    planner = MPPI(linear, walls, [-1.0], [1.0], cfg, safe_action=[1.0])
    roll = planner.rollout(torch.zeros(2, dtype=torch.float64), torch.ones(10, 1, dtype=torch.float64), torch.full((10, 1), 1e-9, dtype=torch.float64))
    # full push: p = 0.005 t^2 passes 0.015 at step 2 -> two alive steps, then the terminal cost
    assert torch.allclose(roll.costs, torch.full((8,), 102.0, dtype=torch.float64))


def test_bad_options_raise_input_errors() -> None:
    with pytest.raises(MPCConfigError, match="horizon"):
        MPPI(linear, cost, [-1.0], [1.0], MPCConfig(horizon=0))
    with pytest.raises(MPCConfigError, match="uncertainty"):
        MPCConfig(uncertainty="optimistic").validate()
    with pytest.raises(MPCConfigError, match="bounds"):
        MPPI(linear, cost, [1.0], [-1.0])
    with pytest.raises(MPCConfigError, match="unknown planner"):
        make_planner("ilqr", linear, cost, [-1.0], [1.0])
    with pytest.raises(InputError, match="NaN"):
        MPPI(linear, cost, [-1.0], [1.0]).plan(torch.tensor([math.nan, 0.0], dtype=torch.float64))


@pytest.mark.parametrize("name", ["mppi", "cem"])
def test_terminal_value_is_what_a_short_horizon_plans_with(name: str) -> None:
    """With no step cost, only the terminal value says where the goal is."""

    def no_cost(x, u, nxt):
        return torch.zeros(x.shape[0], dtype=x.dtype), torch.zeros(x.shape[0], dtype=torch.bool)

    def value(x: torch.Tensor) -> torch.Tensor:
        return -((x[:, 0] - 1.0) ** 2 + 0.1 * x[:, 1] ** 2)

    cfg = MPCConfig(horizon=5, samples=200, noise_std=0.5, temperature=0.01, iterations=3)
    x = run(make_planner(name, linear, no_cost, [-1.0], [1.0], cfg, terminal_value=value, seed=3), steps=60)
    assert abs(float(x[0]) - 1.0) < 0.1 and abs(float(x[1])) < 0.2, x
    blind = run(make_planner(name, linear, no_cost, [-1.0], [1.0], cfg, seed=3), steps=60)
    assert abs(float(blind[0]) - 1.0) > 0.1 or abs(float(blind[1])) > 0.2, blind


def short_pd(x: torch.Tensor) -> torch.Tensor:
    """A proposal tuned for the wrong goal (0.5): what a policy for the unchanged plant would do."""
    return (-2.0 * (x[:, :1] - 0.5) - 2.0 * x[:, 1:]).clamp(-1, 1)


@pytest.mark.parametrize("name", ["mppi", "cem"])
def test_planning_offsets_to_the_proposal_corrects_it(name: str) -> None:
    cfg = MPCConfig(horizon=15, samples=200, noise_std=0.5, temperature=0.05, iterations=3, relative_to_proposal=True)
    x = run(make_planner(name, linear, cost, [-1.0], [1.0], cfg, proposal=short_pd, seed=4))
    assert abs(float(x[0]) - 1.0) < 0.05 and abs(float(x[1])) < 0.1, x
    alone = torch.zeros(2, dtype=torch.float64)
    for _ in range(50):
        alone = linear(alone[None], short_pd(alone[None]))[0]
    assert abs(float(alone[0]) - 0.5) < 0.05, alone  # the proposal alone stops short


def test_zero_offset_sample_is_the_proposal_itself() -> None:
    """A cost that only the proposal's own actions minimise: the plan returns them exactly."""

    def follow(x: torch.Tensor, u: torch.Tensor, nxt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = ((u - short_pd(x)) ** 2).sum(-1)
        return c, torch.zeros_like(c, dtype=torch.bool)

    cfg = MPCConfig(horizon=5, samples=32, noise_std=0.3, temperature=1e-9, relative_to_proposal=True)
    planner = MPPI(linear, follow, [-1.0], [1.0], cfg, proposal=short_pd, seed=5)
    x = torch.tensor([0.2, -0.1], dtype=torch.float64)
    for _ in range(5):
        u, _ = planner.plan(x)
        assert torch.allclose(u, short_pd(x[None])[0], atol=1e-12)
        x = linear(x[None], u[None])[0]


def test_planning_offsets_needs_a_proposal() -> None:
    with pytest.raises(MPCConfigError, match="relative_to_proposal"):
        MPPI(linear, cost, [-1.0], [1.0], MPCConfig(relative_to_proposal=True))


def test_effective_samples_follow_the_temperature() -> None:
    """MPPI's weights: a cold temperature rests the plan on one sample, a hot one on nearly all K;
    CEM reports its elites."""
    x = torch.tensor([0.0, 0.0], dtype=torch.float64)
    sizes = {}
    for temperature in (1e-6, 1e6):
        cfg = MPCConfig(horizon=5, samples=50, noise_std=0.5, temperature=temperature)
        sizes[temperature] = MPPI(linear, cost, [-1.0], [1.0], cfg, seed=6).plan(x)[1].effective_samples
    assert sizes[1e-6] == pytest.approx(1.0, abs=1e-6)
    assert sizes[1e6] == pytest.approx(50.0, rel=1e-3)
    cem = CEM(linear, cost, [-1.0], [1.0], MPCConfig(horizon=5, samples=50, elite_fraction=0.2, iterations=2), seed=6)
    assert cem.plan(x)[1].effective_samples == 10


def test_control_cost_pulls_the_plan_back_to_the_base() -> None:
    """With a flat task cost the KL-regularised optimum is the base distribution itself: MPPI's
    control cost brings a plan that drifted to 0.8 back to zero in one update; without it the
    plan stays where it drifted."""
    torch.set_num_threads(1)

    def flat(x: torch.Tensor, u: torch.Tensor, nxt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(x.shape[0], dtype=x.dtype), torch.zeros(x.shape[0], dtype=torch.bool)

    x = torch.zeros(2, dtype=torch.float64)
    first_actions = {}
    for weight in (0.0, 1.0):
        cfg = MPCConfig(horizon=5, samples=2000, noise_std=0.5, temperature=1.0, control_cost=weight)
        planner = MPPI(linear, flat, [-2.0], [2.0], cfg, seed=3)
        planner.nominal = torch.full((5, 1), 0.8, dtype=torch.float64)
        first_actions[weight] = float(planner.plan(x)[0])
    assert first_actions[1.0] == pytest.approx(0.0, abs=0.1)
    assert first_actions[0.0] == pytest.approx(0.8, abs=0.1)
    with pytest.raises(MPCConfigError, match="control_cost"):
        MPCConfig(control_cost=1.5).validate()


def test_proposal_tail_scores_the_policy_beyond_the_horizon() -> None:
    """Each sample's cost is its planned steps, then ``proposal_tail`` steps of the proposal
    alone through the model, then the terminal value: recomputed here step by step."""

    def value(x: torch.Tensor) -> torch.Tensor:
        return -(x[:, 0] - 1.0) ** 2

    h, tail = 2, 3
    cfg = MPCConfig(horizon=h, samples=8, noise_std=0.4, relative_to_proposal=True, proposal_tail=tail, gamma=0.9)
    planner = MPPI(linear, cost, [-1.0], [1.0], cfg, proposal=short_pd, terminal_value=value, seed=7)
    state = torch.tensor([0.1, 0.2], dtype=torch.float64)
    mean = torch.full((h, 1), 0.1, dtype=torch.float64)
    roll = planner.rollout(state, mean, torch.full((h, 1), 0.4, dtype=torch.float64))
    for k in range(cfg.samples):
        x, total = state[None], 0.0
        for t in range(h + tail):
            base = short_pd(x)
            a = (base + mean[t] + roll.noise[k, t]).clamp(-1, 1) if t < h else base
            nxt = linear(x, a)
            total += 0.9**t * float(cost(x, a, nxt)[0])
            x = nxt
        total -= 0.9 ** (h + tail) * float(value(x))
        assert float(roll.costs[k]) == pytest.approx(total, rel=1e-12)
    with pytest.raises(MPCConfigError, match="proposal_tail"):
        MPPI(linear, cost, [-1.0], [1.0], MPCConfig(proposal_tail=5))
    with pytest.raises(MPCConfigError, match="proposal_tail"):
        MPCConfig(proposal_tail=-1).validate()


def test_cold_start_plans_from_the_proposal_every_step() -> None:
    def pd(x: torch.Tensor) -> torch.Tensor:
        return (-2.0 * (x[:, :1] - 1.0) - 2.0 * x[:, 1:]).clamp(-1, 1)

    x = torch.tensor([0.3, 0.1], dtype=torch.float64)
    actions = {}
    for warm in (True, False):
        cfg = MPCConfig(horizon=8, samples=64, noise_std=0.3, temperature=0.05, relative_to_proposal=True,
                        warm_start=warm)
        planner = MPPI(linear, cost, [-1.0], [1.0], cfg, proposal=pd, seed=4)
        first = planner.plan(x)[0]
        planner.generator.manual_seed(4)  # the same noise again: only the carried plan can differ
        actions[warm] = (first, planner.plan(x)[0])
        assert planner.nominal is not None
    assert torch.equal(*actions[False])  # nothing is carried from one plan to the next
    assert not torch.equal(*actions[True])  # the second plan starts from the first, shifted
    cold = MPCConfig(horizon=15, samples=100, noise_std=0.3, temperature=0.05, relative_to_proposal=True,
                     warm_start=False)
    end = run(MPPI(linear, cost, [-1.0], [1.0], cold, proposal=pd, seed=2))
    assert abs(float(end[0]) - 1.0) < 0.05 and abs(float(end[1])) < 0.1, end


def test_log_weight_spreads_say_what_decides_the_mppi_plan() -> None:
    def pd(x: torch.Tensor) -> torch.Tensor:
        return (-2.0 * (x[:, :1] - 1.0) - 2.0 * x[:, 1:]).clamp(-1, 1)

    x = torch.tensor([0.3, 0.1], dtype=torch.float64)
    first = {}
    for temperature in (0.05, 0.1):
        cfg = MPCConfig(horizon=8, samples=64, noise_std=0.3, temperature=temperature, relative_to_proposal=True,
                        control_cost=1.0)
        info = MPPI(linear, cost, [-1.0], [1.0], cfg, proposal=pd, seed=4).plan(x)[1]
        first[temperature] = info
        assert info.control_spread == 0.0  # the first plan's offsets are zero: no control term yet
    # the same samples: their costs over lambda spread half as much at twice the temperature
    assert first[0.1].cost_spread == pytest.approx(first[0.05].cost_spread / 2, rel=1e-12)
    warm = MPPI(linear, cost, [-1.0], [1.0], MPCConfig(horizon=8, samples=64, noise_std=0.3, temperature=0.05,
                                                       relative_to_proposal=True, control_cost=1.0), proposal=pd, seed=4)
    infos = [warm.plan(x)[1] for _ in range(3)]
    assert infos[-1].control_spread > 0  # a carried plan makes the control term differ between samples
    cold = MPPI(linear, cost, [-1.0], [1.0], MPCConfig(horizon=8, samples=64, noise_std=0.3, temperature=0.05,
                                                       relative_to_proposal=True, control_cost=1.0, warm_start=False),
                proposal=pd, seed=4)
    assert all(cold.plan(x)[1].control_spread == 0.0 for _ in range(3))  # restarted at zero offsets every step


class _MeanAndVariance:
    """A probabilistic model of the double integrator that counts which path the planner takes."""

    def __init__(self) -> None:
        self.full = self.mean_only = 0

    def __call__(self, x: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.full += 1
        nxt = linear(x, u)
        return nxt, 0.01 * (1.0 + u.pow(2)).expand_as(nxt)

    def predict_mean(self, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        self.mean_only += 1
        return linear(x, u)


@pytest.mark.parametrize("name", ["mppi", "cem"])
def test_the_mean_only_path_is_used_when_the_cost_ignores_the_variance(name: str) -> None:
    x = torch.zeros(2, dtype=torch.float64)
    plans = {}
    for mode, weight, uses in (("mean", 0.0, False), ("penalty", 0.0, False), ("penalty", 1.0, True), ("sample", 0.0, True)):
        cfg = MPCConfig(horizon=6, samples=32, iterations=2, uncertainty=mode, var_weight=weight)
        assert cfg.uses_variance() is uses
        model = _MeanAndVariance()
        u, info = make_planner(name, model, cost, [-1.0], [1.0], cfg, seed=3).plan(x)
        assert (model.full > 0) is uses and (model.mean_only > 0) is not uses
        assert (info.variance > 0) is uses
        plans[(mode, weight)] = u
    # the same mean either way: ignoring the variance plans what the full model plans without its penalty
    torch.testing.assert_close(plans[("mean", 0.0)], plans[("penalty", 0.0)])
    # a model without predict_mean is called in full, as before, and plans the same
    full_only = _MeanAndVariance()
    plain = make_planner(name, lambda a, b: full_only(a, b), cost, [-1.0], [1.0],
                         MPCConfig(horizon=6, samples=32, iterations=2), seed=3)
    torch.testing.assert_close(plain.plan(x)[0], plans[("mean", 0.0)])
    assert full_only.full > 0


def test_the_proposal_is_evaluated_only_on_the_samples_that_follow_it() -> None:
    rows: list[int] = []

    def pd(x: torch.Tensor) -> torch.Tensor:
        rows.append(x.shape[0])
        return torch.clamp(-2.0 * (x[:, :1] - GOAL[0]) - 1.5 * x[:, 1:], -1.0, 1.0)

    cfg = MPCConfig(horizon=5, samples=40, proposal_fraction=0.25)
    MPPI(linear, cost, [-1.0], [1.0], cfg, proposal=pd, seed=1).plan(torch.zeros(2, dtype=torch.float64))
    # the initial nominal (one row per step), then at t = 0 one row (every sample is at the
    # measured state), then 10 of 40 samples per step
    assert rows == [1] * 5 + [1] + [10] * 4


def _reference_rollout(planner, state: torch.Tensor, mean: torch.Tensor, noise: torch.Tensor,
                       n_prop: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The rollout written as the plain per-step loop (one sample-batch op at a time, float
    alive weights): what ``Planner.rollout``'s fused bookkeeping must equal; also how many
    samples terminated."""
    cfg = planner.config
    k, h = noise.shape[:2]
    x = state.expand(k, -1).clone()
    alive = torch.ones(k, dtype=state.dtype)
    total = torch.zeros(k, dtype=state.dtype)
    applied = torch.empty(k, h, planner.nu, dtype=state.dtype)
    discount = 1.0
    for t in range(h):
        a = mean[t] + noise[:, t]
        if n_prop:
            a[k - n_prop:] = planner.proposal(x[k - n_prop:]) + noise[k - n_prop:, t]
        a = torch.clamp(a, planner.low, planner.high)
        applied[:, t] = a
        nxt = planner.dynamics(x, a)
        c, done = planner.cost(x, a, nxt)
        done = torch.zeros(k, dtype=torch.bool) if done is None else done
        total = total + discount * alive * c + discount * alive * done.to(state.dtype) * cfg.terminal_cost
        x = torch.where(alive.bool().unsqueeze(-1) & ~done.unsqueeze(-1), nxt, x)
        alive = alive * (1.0 - done.to(state.dtype))
        discount *= cfg.gamma
    if planner.terminal_value is not None:
        total = total - discount * alive * planner.terminal_value(x)
    total = torch.where(torch.isfinite(total), total, torch.full_like(total, math.inf))
    return applied, total, int((alive == 0).sum())


@pytest.mark.parametrize("termination", ["mask", "none", "mask, nobody terminates"])
def test_rollout_equals_the_plain_per_step_loop(termination: str) -> None:
    """Proposal-guided samples, per-action bounds (the tensor clamp), termination with a
    terminal cost, discounting and a terminal value; or a cost that returns None for
    'never terminates' (the bookkeeping is skipped); or a mask that stays False (the CPU's
    shortcut while no sample has terminated). The model sees the same states in both, a
    terminated sample's frozen."""
    def pd(x: torch.Tensor) -> torch.Tensor:
        u = -2.0 * (x[:, :1] - 1.0) - 2.0 * x[:, 1:] + x[:, :1] * x[:, 1:]  # unclamped: the planner clamps
        return torch.cat([u, 0.5 - u], dim=-1)

    two_d = torch.tensor([[0.5 * DT**2, 0.0], [DT, 0.3 * DT]], dtype=torch.float64)
    seen: list[torch.Tensor] = []  # the states the model is given, step by step
    step = [0]

    def model(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        seen.append(x.clone())
        return x @ A.T + u @ two_d.T

    def walls(x: torch.Tensor, u: torch.Tensor, nxt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        c = (nxt[:, 0] - 1.0) ** 2 + 0.01 * (u**2).sum(-1)
        step[0] += 1
        rows = torch.arange(len(c))
        # samples 3-8 terminate at the second step and no other ever (then no step has a new termination)
        done = (rows >= 3) & (rows < 9) & (step[0] == 2) if termination == "mask" else torch.zeros(len(c), dtype=torch.bool)
        return c, None if termination == "none" else done

    cfg = MPCConfig(horizon=12, samples=40, noise_std=[0.6, 0.2], proposal_fraction=0.25, terminal_cost=5.0, gamma=0.95)
    planner = MPPI(model, walls, [-1.0, -0.5], [1.0, 0.7], cfg, proposal=pd,
                   terminal_value=lambda x: -(x[:, 0] - 1.0) ** 2, seed=11)
    state = torch.tensor([0.0, 0.1], dtype=torch.float64)
    mean = 0.3 * torch.randn(12, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    std = planner.noise_std.expand(12, 2)
    roll = planner.rollout(state, mean, std)
    states = torch.stack(seen)
    assert roll.actions.shape == roll.noise.shape == (40, 12, 2)
    assert torch.equal(roll.noise[0], torch.zeros(12, 2, dtype=torch.float64))  # the nominal sample
    # the same noise, drawn again from the same seed
    eps = torch.randn(40, 12, 2, generator=torch.Generator().manual_seed(11), dtype=torch.float64) * std
    eps[0] = 0.0
    torch.testing.assert_close(roll.noise, eps, rtol=0, atol=0)
    seen.clear()
    step[0] = 0
    applied, costs, terminated = _reference_rollout(planner, state, mean, eps, n_prop=10)
    torch.testing.assert_close(states, torch.stack(seen), rtol=0, atol=0)
    torch.testing.assert_close(roll.actions, applied, rtol=0, atol=0)
    torch.testing.assert_close(roll.costs, costs, rtol=1e-13, atol=1e-13)
    assert bool((roll.actions[..., 1] <= 0.7).all()) and bool((roll.actions[..., 1] >= -0.5).all())
    assert terminated == (6 if termination == "mask" else 0)
    if termination == "mask":  # the terminated samples' states stay where they were
        assert torch.equal(states[-1, 3:9], states[2, 3:9])


def test_mppi_update_is_the_weighted_average_of_the_finite_samples() -> None:
    """The new nominal plan (shifted) is sum_k w_k actions_k with w = softmax(-J / lambda) over
    the samples with a finite cost; a sample whose model or proposal went NaN contributes nothing."""
    def flaky(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        nxt = linear(x, u)
        return torch.where(u > 0.7, torch.full_like(nxt, math.nan), nxt)

    def nan_policy(x: torch.Tensor) -> torch.Tensor:  # NaN actions for some of the samples that follow it
        return torch.where(x[:, 1:] > 0.02, math.nan, 0.5)

    for model, proposal in ((linear, None), (flaky, None), (linear, nan_policy)):
        cfg = MPCConfig(horizon=6, samples=50, noise_std=0.5, temperature=0.3)
        planner = MPPI(model, cost, [-1.0], [1.0], cfg, seed=5, proposal=proposal)
        x = torch.zeros(2, dtype=torch.float64)
        planner.nominal = torch.zeros(6, 1, dtype=torch.float64)
        planner.generator.manual_seed(5)
        roll = planner.rollout(x, planner.nominal, planner.noise_std.expand(6, 1))
        planner.generator.manual_seed(5)
        u, info = planner.plan(x)
        finite = torch.isfinite(roll.costs)
        assert (model is linear and proposal is None) is bool(finite.all())
        assert (proposal is not None) is bool(torch.isnan(roll.actions).any())
        w = torch.softmax(-(roll.costs - roll.costs.min()) / 0.3, dim=0)
        expected = (w[:, None, None] * torch.where(finite[:, None, None], roll.actions, 0.0)).sum(0)
        torch.testing.assert_close(u, expected[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(planner.nominal, torch.cat([expected[1:], expected[-1:]]), rtol=1e-12, atol=1e-12)
        assert info.finite_fraction == pytest.approx(float(finite.double().mean()))


def test_a_proposal_that_broadcasts_plans_in_relative_mode():
    """A proposal may return one row for all samples (a state-independent nominal action): the
    relative rollout adds the offsets and the noise out of place, as the plain loop does."""

    def constant(x: torch.Tensor) -> torch.Tensor:
        return torch.full((1, 1), 0.2, dtype=torch.float64)

    cfg = MPCConfig(horizon=3, samples=16, noise_std=0.3, relative_to_proposal=True, proposal_tail=2)
    planner = MPPI(linear, cost, [-1.0], [1.0], cfg, proposal=constant, seed=3)
    state = torch.tensor([0.0, 0.0], dtype=torch.float64)
    mean = torch.full((3, 1), 0.1, dtype=torch.float64)
    roll = planner.rollout(state, mean, torch.full((3, 1), 0.3, dtype=torch.float64))
    for k in range(cfg.samples):
        x, total = state[None], 0.0
        for t in range(5):
            a = (0.2 + mean[t] + roll.noise[k, t]).clamp(-1, 1)[None] if t < 3 else constant(x)
            nxt = linear(x, a)
            total += float(cost(x, a, nxt)[0])
            x = nxt
        assert float(roll.costs[k]) == pytest.approx(total, rel=1e-12)
