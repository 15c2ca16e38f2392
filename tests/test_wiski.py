"""WISKI against the exact GP with the dense SKI kernel (float64), plus its protocol."""

from __future__ import annotations

import io
import math

import pytest
import torch

from gpdyn.gp import make_learner
from gpdyn.gp.base import LearnerError
from gpdyn.gp.exact import ExactOnlineGP
from gpdyn.gp.ski import GridError, SKIKernel
from gpdyn.gp.wiski import WISKI

D64 = torch.float64
HYPER = {
    "lengthscale": torch.tensor([[0.4, 0.7], [0.5, 0.3]], dtype=D64),
    "amplitude": torch.tensor([1.3, 0.7], dtype=D64),
    "noise": torch.tensor([0.05, 0.02], dtype=D64),
}


def _data(n: int, d: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=D64) * 2 - 1
    f = torch.stack([torch.sin(3 * x[:, 0]) + x[:, 1], x[:, 0] * x[:, -1]], dim=-1)
    return x, f + 0.1 * torch.randn(n, 2, generator=g, dtype=D64)


def _pair(n: int = 40) -> tuple[WISKI, ExactOnlineGP, torch.Tensor, torch.Tensor]:
    """WISKI and the oracle, both fed the same points one by one with fixed hyperparameters."""
    x, y = _data(n)
    wiski = WISKI(2, 2, grid_size=(8, 9), bounds=(-1, 1), learn_hyperparameters=False)
    for i in range(n):
        wiski.observe(x[i : i + 1], y[i : i + 1])
        wiski.step(x[i : i + 1], y[i : i + 1])
    wiski.set_hyperparameters(**HYPER)
    oracle = ExactOnlineGP(2, 2, kernel=SKIKernel(wiski.grid), learn_hyperparameters=False)
    for i in range(n):
        oracle.observe(x[i : i + 1], y[i : i + 1])
    oracle.set_hyperparameters(**HYPER)
    return wiski, oracle, x, y


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float(((a - b).abs() / b.abs().clamp_min(1e-12)).max())


def test_streamed_predictions_equal_exact_gp_with_dense_ski_kernel():
    wiski, oracle, _, _ = _pair()
    xt = torch.rand(3, 10, 2, generator=torch.Generator().manual_seed(9), dtype=D64) * 2 - 1  # leading batch shape
    m1, v1 = wiski.predict(xt)
    m2, v2 = oracle.predict(xt)
    assert m1.shape == v1.shape == (3, 10, 2)
    assert _rel(m1, m2) < 1e-8
    assert _rel(v1, v2) < 1e-8


def test_mll_and_gradient_equal_the_dense_ones():
    wiski, oracle, _, _ = _pair()
    a, b = wiski.mll(), oracle.mll()
    assert _rel(a, b) < 1e-8
    ga = torch.autograd.grad(a.sum(), wiski.hp.parameters())
    gb = torch.autograd.grad(b.sum(), oracle.hp.parameters())
    for x, y in zip(ga, gb):
        assert _rel(x, y) < 1e-6


def test_heldout_vlb_equals_exact_joint_predictive_density():
    wiski, oracle, _, _ = _pair()
    xt, yt = _data(7, seed=5)
    assert _rel(wiski.vlb(xt, yt), oracle.vlb(xt, yt)) < 1e-8


def test_out_of_grid_points_warn_or_raise():
    x, y = _data(10)
    clamp = WISKI(2, 2, grid_size=8, bounds=(-1, 1))
    clamp.observe(x, y)
    with pytest.warns(UserWarning, match="1 of 2 points .* outside the grid"):
        clamp.observe(torch.tensor([[3.0, 0.0], [0.0, 0.0]], dtype=D64), y[:2])
    assert int(clamp.observe_clamped) == 1
    strict = WISKI(2, 2, grid_size=8, bounds=(-1, 1), out_of_grid="error")
    strict.observe(x, y)
    with pytest.raises(GridError, match="row 1"):
        strict.observe(torch.tensor([[0.0, 0.0], [0.0, -9.0]], dtype=D64), y[:2])
    assert strict.n == 10  # nothing was added
    strict.predict(torch.tensor([[5.0, 5.0]], dtype=D64))
    assert int(strict.predict_clamped) == 1


def test_bad_input_and_config_raise():
    x, y = _data(10)
    learner = WISKI(2, 2, bounds=(-1, 1))
    with pytest.raises(LearnerError, match="predict: no data"):
        learner.predict(x)
    bad = y.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(LearnerError, match="NaN"):
        learner.observe(x, bad)
    learner.observe(x, y)
    with pytest.raises(LearnerError, match="y contains NaN"):
        learner.observe(x, bad)
    with pytest.raises(LearnerError, match="columns"):
        learner.observe(x[:, :1], y)
    with pytest.raises(LearnerError, match="projection"):
        WISKI(2, 1, projection="pca")
    with pytest.raises(LearnerError, match="grid_size"):
        WISKI(2, 1, grid_size=3)
    with pytest.raises(LearnerError, match="validate"):
        WISKI(2, 1, out_of_grid="error", validate=False)


def test_registry_builds_wiski_with_projection_for_wide_inputs():
    learner = make_learner("wiski", 5, 3, dtype=D64, grid_size=6)
    assert isinstance(learner, WISKI)
    assert learner.projection == "per-output" and learner.num_inducing == 36


def _projected(seed: int = 0) -> WISKI:
    return WISKI(4, 2, grid_size=8, projection="per-output", seed=seed, pretrain_iters=5, lr=0.05, proj_lr=0.05)


def test_projection_step_moves_phi_but_keeps_old_caches():
    x, y = _data(60, d=4)
    learner = _projected()
    learner.pretrain(x[:20], y[:20], progress=False)
    learner.observe(x[20:30], y[20:30])
    gram, wty, weight = learner.gram.clone(), learner.wty.clone(), learner.proj_weight.detach().clone()
    metrics = learner.step(x[20:30], y[20:30])
    assert math.isfinite(metrics["loss"])
    assert not torch.equal(learner.proj_weight.detach(), weight)  # eq. (18) gradient is non-zero
    assert torch.equal(learner.gram, gram) and torch.equal(learner.wty, wty)  # old rows not recomputed


def test_checkpoint_round_trip_predicts_and_continues_identically():
    x, y = _data(60, d=4)
    a = _projected()
    a.pretrain(x[:20], y[:20], progress=False)
    for i in range(20, 30):
        a.observe(x[i : i + 1], y[i : i + 1])
        a.step(x[i : i + 1], y[i : i + 1])
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    b = _projected(seed=7)  # a different seed: everything must come from the state
    b.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=False))
    xt = x[40:]
    for got, want in zip(b.predict(xt), a.predict(xt)):
        assert torch.equal(got, want)
    for i in range(30, 40):
        for learner in (a, b):
            learner.observe(x[i : i + 1], y[i : i + 1])
            learner.step(x[i : i + 1], y[i : i + 1])
    for got, want in zip(b.predict(xt), a.predict(xt)):
        assert torch.equal(got, want)


def test_online_learning_improves_the_fit():
    x, y = _data(300, seed=3)
    learner = WISKI(2, 2, grid_size=12, bounds=(-1, 1), lr=0.05, pretrain_iters=30)
    xt, yt = _data(100, seed=4)
    learner.learn_stream(x[:150], y[:150], pretrain_fraction=0.05, progress=False)
    mse_mid = float(((learner.predict(xt)[0] - yt) ** 2).mean())
    mll_mid = float(learner.mll().detach().sum() / learner.n)
    for i in range(150, 300):
        learner.observe(x[i : i + 1], y[i : i + 1])
        learner.step(x[i : i + 1], y[i : i + 1])
    mse_end = float(((learner.predict(xt)[0] - yt) ** 2).mean())
    assert mse_end < 0.02 and mse_end <= mse_mid  # noise variance is 0.01
    assert float(learner.mll().detach().sum() / learner.n) > mll_mid - 0.05


@pytest.mark.gpu
def test_cuda_float32_matches_cpu_float64():
    x, y = _data(200, d=4)
    results = []
    for device, dtype in (("cpu", D64), ("cuda", torch.float32)):
        learner = WISKI(4, 2, grid_size=12, device=device, dtype=dtype, pretrain_iters=0)
        xd, yd = x.to(device, dtype), y.to(device, dtype)
        learner.pretrain(xd[:100], yd[:100], progress=False)
        learner.observe(xd[100:150], yd[100:150])  # no Adam step: its sign can flip at a zero gradient
        results.append([t.double().cpu() for t in learner.predict(xd[150:])])
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-2, atol=1e-4)


def test_checkpoint_through_the_online_loop_helpers(tmp_path):
    from gpdyn.gp.online import load_learner, save_learner

    x, y = _data(60, d=4)
    a = _projected()
    a.pretrain(x[:20], y[:20], progress=False)
    a.observe(x[20:40], y[20:40])
    a.step(x[20:40], y[20:40])
    b, _ = load_learner(save_learner(a, tmp_path / "wiski.pt"))
    for got, want in zip(b.predict(x[40:]), a.predict(x[40:])):
        assert torch.equal(got, want)


def test_clamp_counters_reach_the_replay_records():
    from gpdyn.gp.online import run_online

    gen = torch.Generator().manual_seed(0)
    x = torch.rand(64, 2, generator=gen, dtype=D64)
    y = torch.sin(3 * x).sum(-1, keepdim=True)
    learner = WISKI(2, 1, grid_size=8, proj_dim=2, bounds=(0.0, 1.0), pretrain_iters=0, dtype=D64, seed=0)
    far = torch.full((5, 2), 40.0, dtype=D64)  # outside any grid learned on [0, 1]
    records = run_online(learner, iter([(x, y)]), far, torch.zeros(5, 1, dtype=D64), iterations=1, progress=False)
    assert records[-1]["predict_clamped"] >= 5 and records[-1]["observe_clamped"] == 0


def test_non_finite_inputs_are_errors_or_nan_never_bad_indices():
    x, y = _data(40)
    learner = WISKI(2, 2, grid_size=8, pretrain_iters=2)
    learner.observe(x[:0], y[:0])  # an empty first batch: nothing to start from yet
    assert not learner.initialized
    learner.pretrain(x, y, progress=False)
    bad = x[:3].clone()
    bad[1, 0] = float("nan")
    with pytest.raises(LearnerError, match="step: x contains NaN"):
        learner.step(bad, y[:3])
    with pytest.raises(LearnerError, match="predict: x contains NaN"):
        learner.predict(bad)
    # without the CPU check (a GPU has none): the NaN row gives NaN, the others their values
    from gpdyn.gp.ski import interp_weights

    idx, w, _ = interp_weights(bad, learner.grid)
    assert bool(((idx >= 0) & (idx < learner.num_inducing)).all())
    assert torch.isnan(w[1]).all() and torch.isfinite(w[[0, 2]]).all()
    inf = x[:2].clone()
    inf[0, 1] = float("inf")
    with pytest.raises(LearnerError, match="predict: x contains NaN or inf"):
        learner.predict(inf)


def test_an_empty_first_batch_is_no_data_for_the_exact_gp_either():
    gp = ExactOnlineGP(2, 2)
    x, y = _data(5)
    gp.observe(x[:0], y[:0])
    assert not gp.initialized and gp.n == 0
    gp.observe(x, y)
    assert gp.n == 5
