"""No host sync on CUDA in the hot paths: every learner's predict, predict_mean and step, and
the planner's rollout.

``torch.cuda.set_sync_debug_mode("error")`` makes every operation that waits for the device
raise ``RuntimeError("called a synchronizing CUDA operation")``: reading a value back
(``.item()``, ``float()``, ``bool()``, ``.tolist()``, ``.cpu()``), a blocking host-device
copy (``torch.tensor(..., device="cuda")``, ``.to("cuda")`` of pageable memory), a stream
synchronisation, and the operations that do one inside (``nonzero``, boolean-mask
indexing, ``torch.linalg.cholesky``/``lu_factor``/``inv``/``solve``, which check their
result on the host). ``torch.cuda.synchronize()`` itself is not flagged, so the setup
ends with one, and its work never counts against the calls under test. Syncs inside a
library that bypass torch's stream calls (MAGMA's host-side routines) are not flagged
either; a profiler (Nsight Systems) sees those.

What each call promises (docs/architecture.md "Learners"; gpdyn.gp.base): ``predict``,
``predict_mean`` and ``step`` never wait for the device, including the cache rebuild of
the first ``predict`` after a ``step``; ``observe`` validates its input (a host sync) except
where a learner promises otherwise, WISKI with ``validate=False``. The planner's
:meth:`~gpdyn.control.mpc.Planner.plan` returns its :class:`~gpdyn.control.mpc.PlanInfo`
as Python floats and checks the plan on the host before it is applied (the fallback), a
fixed number of syncs per control step by design; its hot loop, the K x H rollout through
the learned model (:meth:`~gpdyn.control.mpc.Planner.rollout`), must have none, and the
syncs of a whole ``plan`` must not grow with the horizon.

The GPU tests are marked ``gpu`` (skipped without CUDA). Their bodies also run on the CPU
without the sync check (``*_cpu``), so that every registered learner is built, fed and
exercised the same way on every machine.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from gpdyn.control.dynamics import LearnedDynamics
from gpdyn.control.mpc import MPCConfig, make_planner
from gpdyn.data.problems import Normalizer
from gpdyn.gp import LEARNERS, make_learner
from gpdyn.robots.walker import LAYOUT, NU, NX, WALKER
from gpdyn.robots.legged import ACTION_HIGH, ACTION_LOW, TorchPolicy

D, P = LAYOUT.input_dim, LAYOUT.nv  # the walker-1 model the planner uses: 23 -> 9
N = 64  # rows per batch
SYNC = "synchronizing CUDA operation"
#: options over the small preset so that each call does all of its work: the exact GP (and
#: the residual's) refits at every step, WISKI's observe skips its validation (no sync)
OPTIONS = {
    "exact": {"refit_every": 1, "refit_iters": 1},
    "residual": {"refit_every": 1, "refit_iters": 1},
    "wiski": {"validate": False},
}
#: learners whose observe promises no host sync (with OPTIONS)
SYNC_FREE_OBSERVE = {"wiski"}
#: one-pass learners (exact recursive Bayesian linear regression): observe conditions on each row
#: once and step learns nothing, so only observe changes their predictions
ONE_PASS = {"ssgp", "rls", "svdgp-stream"}

CUDA = [pytest.param("cuda", marks=pytest.mark.gpu)]


@contextlib.contextmanager
def no_host_sync(device: torch.device) -> Iterator[None]:
    """Raise on any host sync inside (CUDA); nothing on the CPU."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.synchronize(device)  # the setup's queued work finishes here, outside the check
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


def count_syncs(fn, device: torch.device) -> int:
    """How many host syncs ``fn()`` makes (CUDA, ``set_sync_debug_mode("warn")``)."""
    torch.cuda.synchronize(device)
    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(before)
    return sum(SYNC in str(w.message) for w in caught)


def _data(gen: torch.Generator, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(N, D, generator=gen, dtype=torch.float64)
    y = torch.sin(x[:, :P]) + 0.1 * torch.randn(N, P, generator=gen, dtype=torch.float64)
    return x.to(device, dtype), y.to(device, dtype)


def build(name: str, device: torch.device, dtype: torch.dtype):
    """Learner ``name`` at the small preset on ``device``, fed and warmed up (observe, step,
    predict: optimiser state, caches and allocator exist), and two fresh batches."""
    gen = torch.Generator().manual_seed(0)
    x, y = _data(gen, device, dtype)
    options = dict(OPTIONS.get(name, {}))
    if name == "residual":  # a frozen prior learner under the residual GP
        prior = make_learner("svdgp", D, P, preset="small", device=device, dtype=dtype, seed=0)
        prior.observe(x, y)
        prior.step(x, y)
        options["prior"] = prior
    learner = make_learner(name, D, P, preset="small", device=device, dtype=dtype, seed=0, **options)
    learner.observe(x, y)
    learner.step(x, y)
    learner.predict(x)
    learner.predict_mean(x)
    return learner, _data(gen, device, dtype), _data(gen, device, dtype)


def exercise(name: str, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The calls under test, inside :func:`no_host_sync`; their results for the checks after it."""
    learner, (x, y), (x2, y2) = build(name, device, dtype)
    out: dict[str, torch.Tensor] = {}
    with no_host_sync(device):
        out["mean"], out["var"] = learner.predict(x)
        out["mean_only"] = learner.predict_mean(x)
        out["loss"] = learner.step(x, y).get("loss", torch.zeros(()))
        out["mean_after"], out["var_after"] = learner.predict(x)  # the caches rebuilt after the step
        out["mean_only_after"] = learner.predict_mean(x)
    if name in SYNC_FREE_OBSERVE:
        with no_host_sync(device):
            learner.observe(x2, y2)
            out["mean_observed"] = learner.predict_mean(x)
            learner.step(x2, y2)
            out["mean_observed_step"] = learner.predict_mean(x)
    return out


def check_results(name: str, out: dict[str, torch.Tensor]) -> None:
    for key, value in out.items():
        value = torch.as_tensor(value)
        assert bool(torch.isfinite(value).all()), f"{name}: {key} is not finite"
    for key in ("mean", "var", "mean_only", "mean_after", "var_after", "mean_only_after"):
        assert out[key].shape == (N, P), f"{name}: {key} has shape {tuple(out[key].shape)}"
    assert bool((out["var"] >= 0).all())
    tol = 1e-4 if out["mean"].dtype == torch.float32 else 1e-8
    assert torch.allclose(out["mean_only"], out["mean"], atol=tol, rtol=tol), f"{name}: predict_mean != predict's mean"
    assert torch.allclose(out["mean_only_after"], out["mean_after"], atol=tol, rtol=tol)
    # the step under test did its work: the model changed
    assert name in ONE_PASS or not torch.equal(out["mean_after"], out["mean"]) or not torch.equal(
        out["var_after"], out["var"]), f"{name}: step changed nothing"
    if "mean_observed" in out:
        assert not torch.equal(out["mean_observed"], out["mean_only_after"]), f"{name}: observe changed nothing"


@pytest.mark.parametrize("name", list(LEARNERS))
@pytest.mark.parametrize("device", CUDA)
def test_learner_hot_paths_never_sync(name, device):
    out = exercise(name, torch.device(device), torch.float32)
    check_results(name, out)


@pytest.mark.parametrize("name", list(LEARNERS))
@pytest.mark.slow
def test_learner_hot_paths_cpu(name):
    out = exercise(name, torch.device("cpu"), torch.float64)
    check_results(name, out)


# -- the planner ------------------------------------------------------------------------------
K = 32  # sampled sequences


def legged_planner(name: str, device: torch.device, dtype: torch.dtype, horizon: int, uncertainty: str = "penalty"):
    """MPPI through a learned walker-1 model of learner ``name`` (as bench mpc builds one, at
    the small preset) with the Walker2d cost and the TRPO proposal, and a standing state.
    ``uncertainty="penalty"`` rolls out through ``predict`` (the cost uses the variance),
    ``"mean"`` through ``predict_mean``."""
    from gpdyn.robots.policy import load_policy

    learner, _, _ = build(name, device, dtype)
    normalizer = Normalizer(np.zeros(D), np.ones(D), np.zeros(P), np.ones(P))
    dynamics = LearnedDynamics.from_learner(learner, normalizer, LAYOUT)
    cfg = MPCConfig(horizon=horizon, samples=K, uncertainty=uncertainty, var_weight=1.0)
    planner = make_planner("mppi", dynamics, WALKER.cost(), [ACTION_LOW] * NU, [ACTION_HIGH] * NU, cfg,
                           proposal=TorchPolicy(load_policy(), device, dtype), device=device, dtype=dtype, seed=0)
    state = torch.zeros(NX, device=device, dtype=dtype)
    state[1] = 1.25  # standing height
    return planner, state


def plan_and_roll(name: str, device: torch.device, dtype: torch.dtype, uncertainty: str, horizon: int = 4):
    planner, state = legged_planner(name, device, dtype, horizon, uncertainty)
    action, info = planner.plan(state)  # the warm start and the caches exist after it
    mean = planner.nominal
    std = planner.noise_std.expand(horizon, NU)
    with no_host_sync(device):
        roll = planner.rollout(state, mean, std)
    return action, info, roll


def check_plan(action, info, roll, horizon: int = 4, uncertainty: str = "penalty") -> None:
    assert action.shape == (NU,) and bool(torch.isfinite(action).all())
    assert bool((action >= ACTION_LOW).all() and (action <= ACTION_HIGH).all())
    assert info.finite_fraction > 0
    assert roll.costs.shape == (K,) and roll.actions.shape == (K, horizon, NU)
    assert bool(torch.isfinite(roll.costs).any()) and bool((roll.variance >= 0).all())
    if uncertainty == "penalty":  # the variance went through the rollout: predict, not predict_mean
        assert bool((roll.variance > 0).any())
    else:
        assert bool((roll.variance == 0).all())


@pytest.mark.parametrize("uncertainty", ["penalty", "mean"])
@pytest.mark.parametrize("name", list(LEARNERS))
@pytest.mark.parametrize("device", CUDA)
def test_planner_rollout_never_syncs(name, device, uncertainty):
    check_plan(*plan_and_roll(name, torch.device(device), torch.float32, uncertainty), uncertainty=uncertainty)


@pytest.mark.parametrize("uncertainty", ["penalty", "mean"])
@pytest.mark.parametrize("name", ["svdgp", "wiski", "residual"])
@pytest.mark.slow
def test_planner_rollout_cpu(name, uncertainty):
    check_plan(*plan_and_roll(name, torch.device("cpu"), torch.float64, uncertainty), uncertainty=uncertainty)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["svdgp", "wiski"])
def test_plan_syncs_do_not_grow_with_the_horizon(name):
    device = torch.device("cuda")
    counts = {}
    for horizon in (2, 8):
        planner, state = legged_planner(name, device, torch.float32, horizon)
        planner.plan(state)  # first plan: the initial nominal
        counts[horizon] = count_syncs(lambda: planner.plan(state), device)  # a control step
    assert counts[2] == counts[8], f"{name}: plan's host syncs grow with H: {counts}"


@pytest.mark.gpu
def test_the_check_catches_a_sync():
    """The harness itself: a value read back raises under the check and is counted once."""
    device = torch.device("cuda")
    x = torch.ones(4, device=device)
    with pytest.raises(RuntimeError, match=SYNC):
        with no_host_sync(device):
            float(x.sum())
    assert torch.cuda.get_sync_debug_mode() == 0  # restored
    with no_host_sync(device):
        y = (x * 2).sum()  # queued, never read: no sync
    assert float(y) == 8.0
    assert count_syncs(lambda: float(x.sum()), device) >= 1
    assert count_syncs(lambda: x * 2, device) == 0
