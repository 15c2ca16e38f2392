"""The learned dynamics' compiled model step (WISKI with ``compiled_mean``) against the eager path."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from gpdyn.compiled import SignatureCompiled
from gpdyn.control.dynamics import LearnedDynamics
from gpdyn.data.problems import Normalizer
from gpdyn.gp import make_learner
from gpdyn.gp.base import LearnerError, NonFiniteError
from gpdyn.gp.wiski import WISKI
from gpdyn.robots.walker import LAYOUT

D64 = torch.float64
needs_compiler = pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
                                    reason="needs a C++ compiler (g++, c++ or clang++) for torch.compile")


def _wiski(compiled_mean: bool) -> WISKI:
    """A small additive WISKI on the walker's 23 inputs and 9 outputs, data from a fixed seed."""
    learner = WISKI(LAYOUT.input_dim, LAYOUT.nv, structure="additive", components=4, grid_size=6,
                    projection="shared", proj_dim=1, proj_init="random", init_iters=0, learn_hyperparameters=False,
                    compiled_mean=compiled_mean, dtype=D64, seed=3)
    g = torch.Generator().manual_seed(0)
    learner.observe(torch.randn(64, LAYOUT.input_dim, generator=g, dtype=D64),
                    torch.randn(64, LAYOUT.nv, generator=g, dtype=D64))
    return learner


def _dynamics(learner: WISKI) -> LearnedDynamics:
    g = np.random.default_rng(1)
    d, p = LAYOUT.input_dim, LAYOUT.nv
    normalizer = Normalizer(g.normal(size=d), 0.5 + g.random(d), g.normal(size=p), 0.5 + g.random(p))
    return LearnedDynamics.from_learner(learner, normalizer, LAYOUT)


def _batch(k: int, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(k, LAYOUT.nx, generator=g, dtype=D64), torch.rand(k, LAYOUT.nu, generator=g, dtype=D64) * 2 - 1


def test_only_a_compiled_mean_offers_a_mean_program():
    assert _wiski(compiled_mean=False).mean_program() is None
    assert make_learner("svi", 3, 2).mean_program() is None
    program = _wiski(compiled_mean=True).mean_program()
    x = torch.randn(5, LAYOUT.input_dim, dtype=D64)
    torch.testing.assert_close(program.function(x, *program.operands), _wiski(compiled_mean=False).predict_mean(x),
                               rtol=1e-10, atol=1e-10)
    fresh = WISKI(LAYOUT.input_dim, LAYOUT.nv, structure="additive", components=4, grid_size=6, compiled_mean=True)
    with pytest.raises(LearnerError, match="no data yet"):
        fresh.mean_program()


@needs_compiler
@pytest.mark.slow
def test_compiled_step_equals_the_eager_step_and_follows_online_updates():
    """The whole step (features, normalisation, mean, delta, trapezoid rule) compiled equals the
    eager gather path, at a planner's batch and after an update that refreshes the caches."""
    plain, compiled = _wiski(False), _wiski(True)
    eager, fast = _dynamics(plain), _dynamics(compiled)
    state, action = _batch(200)
    for _ in range(2):  # the second call reuses the compiled program
        torch.testing.assert_close(fast.predict_mean(state, action), eager.predict_mean(state, action),
                                   rtol=1e-10, atol=1e-10)
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(16, LAYOUT.input_dim, generator=g, dtype=D64), torch.randn(16, LAYOUT.nv, generator=g, dtype=D64)
    before = fast.predict_mean(state, action)
    for learner in (plain, compiled):
        learner.observe(x, y)
    after = fast.predict_mean(state, action)
    assert not torch.allclose(after, before)  # the program read the new caches
    torch.testing.assert_close(after, eager.predict_mean(state, action), rtol=1e-10, atol=1e-10)


@needs_compiler
@pytest.mark.slow
def test_compiled_step_rejects_non_finite_inputs_as_the_learner_does():
    fast = _dynamics(_wiski(True))
    state, action = _batch(50)
    fast.predict_mean(state, action)
    state[7, 3] = float("nan")
    with pytest.raises(NonFiniteError, match="predict_mean: x contains NaN"):
        fast.predict_mean(state, action)
    state[7, 3] = 0.0
    action[2, 1] = float("inf")
    with pytest.raises(NonFiniteError):
        fast.predict_mean(state, action)
    with pytest.raises(ValueError, match="50 states but 49 actions"):
        fast.predict_mean(state, action[:49])


@needs_compiler
@pytest.mark.slow
def test_signature_compiled_compiles_once_per_signature_then_falls_back():
    calls = []

    def fallback(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        calls.append(a.shape[0])
        return a * b + 1.0

    compiled = SignatureCompiled(lambda a, b: a * b + 1.0, fallback, max_signatures=2)
    for n in (3, 3, 4, 5, 3):
        a, b = torch.randn(n, 2, dtype=D64), torch.randn(n, 2, dtype=D64)
        torch.testing.assert_close(compiled(a, b), a * b + 1.0)
    assert len(compiled._compiled) == 2 and calls == [5]  # 3 and 4 compiled; 5 past the limit
    a = torch.randn(2, 3, dtype=D64)
    torch.testing.assert_close(compiled(a.T, a.T), a.T * a.T + 1.0)  # another stride: the fallback again
    assert calls == [5, 3]


@pytest.mark.slow
def test_traced_compiles_only_what_declares_itself_traceable(monkeypatch):
    from gpdyn.compiled import traced
    from gpdyn.errors import InputError

    plain = lambda x: x + 1  # noqa: E731  declares nothing: left as it is
    assert traced(plain, "opt") is plain and traced(None, "opt") is None

    class Straight:
        traceable = True

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(x) * 2.0

    straight = Straight()
    wrapped = traced(straight, "opt")
    assert wrapped is not straight
    x = torch.linspace(-2.0, 2.0, 5, dtype=D64)
    torch.testing.assert_close(wrapped(x), straight(x), rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(SignatureCompiled, "_compile", lambda self, tensors: (_ for _ in ()).throw(RuntimeError("no cc")))
    with pytest.raises(InputError, match="Straight: compiling it failed .*no cc.*opt runs it eagerly"):
        wrapped(torch.zeros(3))


@needs_compiler
@pytest.mark.slow
def test_compiled_planner_plans_as_the_eager_one_with_the_walker_cost_and_proposal():
    """MPC compiled=True: the walker cost and the TRPO proposal as compiled programs; the same plans (float64,
    same seed) as the eager planner, step after step with warm starts, through a learned WISKI model."""
    from gpdyn.control.mpc import MPCConfig, make_planner
    from gpdyn.robots.walker import NU, WALKER
    from gpdyn.robots.legged import ACTION_HIGH, ACTION_LOW, LeggedCost, TorchPolicy
    from gpdyn.robots.policy import load_policy

    proposal = TorchPolicy(load_policy(), "cpu", D64)
    dynamics = _dynamics(_wiski(True))
    state = torch.zeros(LAYOUT.nx, dtype=D64)
    state[1] = 1.25
    plans = []
    for compiled in (False, True):
        cfg = MPCConfig(horizon=6, samples=64, uncertainty="mean", compiled=compiled)
        planner = make_planner("mppi", dynamics, WALKER.cost(), [ACTION_LOW] * NU, [ACTION_HIGH] * NU, cfg,
                               proposal=proposal, dtype=D64, seed=4)
        assert (planner.cost is not None) and (type(planner.cost) is LeggedCost) != compiled
        plans.append(torch.stack([planner.plan(state)[0] for _ in range(3)]))
    torch.testing.assert_close(plans[1], plans[0], rtol=1e-9, atol=1e-9)
