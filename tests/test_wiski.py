"""WISKI against the exact GP with the dense SKI kernel (float64), plus its protocol."""

from __future__ import annotations

import io
import math
import shutil

import pytest
import torch

from gpdyn.gp import make_learner
from gpdyn.gp.base import LearnerError
from gpdyn.gp.exact import ExactOnlineGP
from gpdyn.gp.ski import AdditiveSKIKernel, GridError, SKIKernel
from gpdyn.gp.wiski import WISKI, additive_mean_dense

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
    with pytest.raises(LearnerError, match="structure must be"):
        WISKI(5, 1, structure="sum")
    with pytest.raises(LearnerError, match="needs a projection"):
        WISKI(5, 1, structure="additive", projection="none")
    with pytest.raises(LearnerError, match="components=3 needs structure='additive'"):
        WISKI(5, 1, structure="single", components=3)
    with pytest.raises(LearnerError, match="proj_init"):
        WISKI(5, 1, proj_init="pca")
    with pytest.raises(LearnerError, match="components >= 1"):
        WISKI(5, 1, components=0)
    with pytest.raises(LearnerError, match="basis functions"):
        WISKI(5, 1, components=200, grid_size=100)
    for options in ({"structure": "single"}, {"projection": "per-output"}, {"proj_dim": 2}):
        with pytest.raises(LearnerError, match="compiled_mean=True needs"):
            WISKI(5, 1, compiled_mean=True, **options)


def test_registry_builds_wiski_with_projection_for_wide_inputs():
    learner = make_learner("wiski", 5, 3, dtype=D64, grid_size=6)
    assert isinstance(learner, WISKI)
    # additive by default for D > 2: C = 2D one-dimensional grids of 6 plus the linear term [x, 1]
    assert learner.structure == "additive" and learner.projection == "shared" and learner.components == 10
    assert learner.num_inducing == 10 * 6 + 6 and learner.gram.shape == (1, 66, 66)
    default = make_learner("wiski", 21, 7, preset="cpu")
    assert default.grid_sizes == (8,) and default.num_inducing == 42 * 8 + 22 and default.config["grid_size"] == 8
    paper = make_learner("wiski", 5, 3, dtype=D64, grid_size=6, structure="single")
    assert paper.projection == "per-output" and paper.num_inducing == 36 and paper.gram.shape == (3, 36, 36)
    small = make_learner("wiski", 2, 1, dtype=D64, preset="cpu")
    assert small.structure == "single" and small.projection == "none" and small.num_inducing == 256


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


@pytest.mark.slow
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


# -- the additive structure: a sum of SKI kernels on projections plus a linear term --------
ADD_C, ADD_D = 4, 3


def _additive(projection: str = "shared", proj_dim: int = 1, linear: bool = True, **kw) -> WISKI:
    kw.setdefault("init_iters", 0)  # the algebra tests start from the first batch's initial values
    return WISKI(ADD_D, 2, structure="additive", components=ADD_C, grid_size=6, projection=projection,
                 proj_dim=proj_dim, linear=linear, proj_init="random", **kw)


def _additive_pair(projection: str = "shared", proj_dim: int = 1, linear: bool = True, n: int = 40):
    """Additive WISKI (points one by one, then a batch: both cache paths) and the exact GP with the
    dense additive SKI kernel, built per component from SKIKernel (not from WISKI's concatenated rows)."""
    x, y = _data(n, d=ADD_D)
    wiski = _additive(projection, proj_dim, linear, learn_hyperparameters=False)
    for i in range(8):
        wiski.observe(x[i : i + 1], y[i : i + 1])
        wiski.step(x[i : i + 1], y[i : i + 1])
    wiski.observe(x[8:], y[8:])  # >= DENSE_GRAM_ROWS rows: the dense W^T W product
    g = torch.Generator().manual_seed(3)
    wiski.set_hyperparameters(
        lengthscale=0.3 + torch.rand(2, ADD_C, proj_dim, generator=g, dtype=D64),
        amplitude=0.2 + torch.rand(2, ADD_C, generator=g, dtype=D64),
        linear=0.1 + torch.rand(2, ADD_D + 1, generator=g, dtype=D64) if linear else None,
        noise=torch.tensor([0.05, 0.02], dtype=D64),
    )
    q = wiski.num_maps
    kernel = AdditiveSKIKernel(
        wiski.grid,
        lambda z: wiski.features(z).view(q, z.shape[0], ADD_C, proj_dim),
        lambda: (wiski.hp.lengthscale, wiski.hp.amplitude, wiski.hp.linear),
    )
    oracle = ExactOnlineGP(ADD_D, 2, kernel=kernel, learn_hyperparameters=False)
    oracle.observe(x, y)
    oracle.set_hyperparameters(noise=wiski.hp.noise.detach())
    return wiski, oracle


@pytest.mark.parametrize("projection,proj_dim,linear", [("shared", 1, True), ("per-output", 1, True),
                                                        ("shared", 2, False)])
def test_additive_equals_exact_gp_with_dense_additive_ski_kernel(projection, proj_dim, linear):
    wiski, oracle = _additive_pair(projection, proj_dim, linear)
    assert wiski.num_inducing == ADD_C * 6**proj_dim + (ADD_D + 1 if linear else 0)
    xt = torch.rand(3, 10, ADD_D, generator=torch.Generator().manual_seed(9), dtype=D64) * 2 - 1
    m1, v1 = wiski.predict(xt)
    m2, v2 = oracle.predict(xt)
    assert m1.shape == v1.shape == (3, 10, 2)
    assert _rel(m1, m2) < 1e-8
    assert _rel(v1, v2) < 1e-7
    assert _rel(wiski.predict_mean(xt), m2) < 1e-8
    a, b = wiski.mll(), oracle.mll()
    assert _rel(a, b) < 1e-8
    # the gradient in every hyperparameter (the oracle's kernel reads the same leaf tensors)
    ga = torch.autograd.grad(a.sum(), wiski.hp.parameters(), allow_unused=True)
    gb = torch.autograd.grad(b.sum(), wiski.hp.parameters()[:-1], allow_unused=True)
    for x, y in zip(ga[:-1], gb):
        if x is not None and y is not None and x.numel():
            assert _rel(x, y) < 1e-6
    xh, yh = _data(7, d=ADD_D, seed=5)
    assert _rel(wiski.vlb(xh, yh), oracle.vlb(xh, yh)) < 1e-8


def test_additive_prior_products_match_the_dense_prior():
    wiski = _additive("per-output", proj_dim=2)
    x, y = _data(50, d=ADD_D)
    wiski.observe(x, y)
    dense = wiski.prior_dense()
    probe = torch.randn(2, wiski.num_inducing, 5, generator=torch.Generator().manual_seed(1), dtype=D64)
    torch.testing.assert_close(wiski._kmul()(probe), dense @ probe, rtol=1e-12, atol=1e-12)
    assert torch.equal(dense, dense.transpose(-1, -2))


@pytest.mark.parametrize("make", [
    lambda: _additive("shared"),
    lambda: _additive("per-output", proj_dim=2, linear=False),
    lambda: WISKI(4, 2, grid_size=8, structure="single", projection="per-output"),
    lambda: WISKI(2, 2, grid_size=8, bounds=(-1, 1)),
])
def test_predict_mean_equals_predict_mean_and_counts_clamps(make):
    learner = make()
    d = learner.input_dim
    x, y = _data(80, d=d)
    learner.observe(x, y)
    learner.step(x, y)
    xt = torch.rand(2, 33, d, generator=torch.Generator().manual_seed(4), dtype=D64) * 3 - 1.5
    learner.predict_chunk = 16  # several chunks
    before = int(learner.predict_clamped)
    mean = learner.predict_mean(xt)
    assert mean.shape == (2, 33, 2)
    clamped = int(learner.predict_clamped) - before
    torch.testing.assert_close(mean, learner.predict(xt)[0], rtol=1e-12, atol=1e-12)
    assert int(learner.predict_clamped) - before == 2 * clamped  # predict counts the same points
    with pytest.raises(LearnerError, match="predict_mean: x has"):
        learner.predict_mean(xt[..., :1])


def test_dense_additive_mean_equals_the_gather_at_nodes_cell_edges_and_far_out():
    """additive_mean_dense (the compiled_mean kernel, run eagerly here) against the fused gather:
    points on grid nodes and cell edges (where the dense kernel switches pieces) and
    inputs far out (tanh saturates: features at the grid's interior edge)."""
    learner = _additive("shared")
    x, y = _data(80, d=ADD_D)
    learner.observe(x, y)
    learner.step(x, y)
    learner.predict_mean(x)  # the caches
    g = torch.Generator().manual_seed(5)
    xt = torch.cat([torch.randn(50, ADD_D, generator=g, dtype=D64), 40 * torch.randn(10, ADD_D, generator=g, dtype=D64)])
    # inputs whose first component's feature lands exactly on grid nodes: invert the feature map
    f = learner._fast
    nodes = torch.arange(2, learner.grid_points - 2, dtype=D64)
    feature = (nodes - f["offset"]) / f["inv_spacing"]  # tanh(x proj[:, 0] + shift[0]) = feature
    w = f["proj"][:, 0]
    on_nodes = torch.zeros(len(nodes), ADD_D, dtype=D64)
    on_nodes[:, :] = ((torch.atanh(feature) - f["shift"][0]) / (w @ w)).unsqueeze(-1) * w
    xt = torch.cat([xt, on_nodes])
    grid_part = learner.components * learner.grid_points
    dense = additive_mean_dense(xt, f["proj"].T, f["shift"], f["offset"], f["inv_spacing"],
                                torch.arange(learner.grid_points, dtype=D64),
                                learner._mean_cache[:, :grid_part], f["linear_t"])
    torch.testing.assert_close(dense, learner._fused_mean(xt)[0], rtol=1e-10, atol=1e-10)


@pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")), reason="needs a C++ compiler (g++, c++ or clang++) for torch.compile")
@pytest.mark.slow
def test_compiled_mean_equals_the_gather_path_across_batch_sizes():
    """compiled_mean=True: the same means as the gather path (float64), for several chunk sizes
    (dynamic shapes), and predict's mean takes it too."""
    x, y = _data(80, d=ADD_D)
    plain, compiled = (_additive(compiled_mean=c) for c in (False, True))
    for learner in (plain, compiled):
        learner.observe(x, y)
        learner.step(x, y)
    xt = torch.randn(2, 37, ADD_D, generator=torch.Generator().manual_seed(6), dtype=D64)
    for chunk in (4096, 16, 5):
        compiled.predict_chunk = chunk
        torch.testing.assert_close(compiled.predict_mean(xt), plain.predict_mean(xt), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(compiled.predict(xt)[0], plain.predict(xt)[0], rtol=1e-12, atol=1e-12)
    assert int(compiled.predict_clamped) == 0


def test_predict_mean_before_data_and_with_nan_raise():
    learner = _additive()
    x, y = _data(10, d=ADD_D)
    with pytest.raises(LearnerError, match="predict_mean: no data"):
        learner.predict_mean(x)
    learner.observe(x, y)
    bad = x.clone()
    bad[2, 1] = float("nan")
    with pytest.raises(LearnerError, match="predict_mean: x contains NaN"):
        learner.predict_mean(bad)


def test_additive_caches_keep_their_size_and_match_one_batch():
    x, y = _data(400, d=ADD_D, seed=2)
    a, b = _additive(lr=0.05), _additive(lr=0.05)
    shapes = None
    for i in range(0, 400, 10):
        a.observe(x[i : i + 10], y[i : i + 10])
        a.step(x[i : i + 10], y[i : i + 10])
        now = [tuple(t.shape) for t in (a.gram, a.wty, a.yty, a._m_cache)]
        assert shapes is None or now == shapes
        a.predict(x[:2])
        shapes = [tuple(t.shape) for t in (a.gram, a.wty, a.yty, a._m_cache)]
    assert shapes[0] == (1, a.num_inducing, a.num_inducing) and a.n == 400
    # the caches are sums over points: the scattered (10-row) and dense (390-row) paths agree
    # (no steps here: a step moves the projection; the first batch sets the BN statistics)
    c = _additive()
    for i in range(0, 400, 10):
        c.observe(x[i : i + 10], y[i : i + 10])
    b.observe(x[:10], y[:10])
    b.observe(x[10:], y[10:])
    torch.testing.assert_close(c.gram, b.gram, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(c.wty, b.wty, rtol=1e-10, atol=1e-10)


def test_additive_checkpoint_round_trip_and_options_through_the_registry(tmp_path):
    from gpdyn.gp.online import load_learner, save_learner

    x, y = _data(120, d=ADD_D)
    a = make_learner("wiski", ADD_D, 2, dtype=D64, preset="cpu", components=5, projection="per-output",
                     proj_init="random", linear=True, proj_lr=0.01)
    assert a.config["structure"] == "additive" and a.config["components"] == 5
    a.pretrain(x[:40], y[:40], iterations=3, progress=False)
    for i in range(40, 80, 8):
        a.observe(x[i : i + 8], y[i : i + 8])
        a.step(x[i : i + 8], y[i : i + 8])
    b, _ = load_learner(save_learner(a, tmp_path / "additive.pt"))  # weights_only=True inside
    assert isinstance(b, WISKI) and b.structure == "additive" and b.components == 5 and b.projection == "per-output"
    for got, want in zip(b.predict(x[80:]), a.predict(x[80:])):
        assert torch.equal(got, want)
    for i in range(80, 112, 8):
        for learner in (a, b):
            learner.observe(x[i : i + 8], y[i : i + 8])
            learner.step(x[i : i + 8], y[i : i + 8])
    assert torch.equal(b.predict_mean(x[112:]), a.predict_mean(x[112:]))
    # a state of another structure does not load
    other = WISKI(ADD_D, 2, structure="single", projection="per-output")
    with pytest.raises(LearnerError, match="WISKI.load_state_dict: grid_state.sizes"):
        other.load_state_dict(a.state_dict())


@pytest.mark.slow
def test_additive_learns_a_non_additive_function_better_than_the_paper_2d():
    """f = x0 x1 + sin(2 x2) on 6-D inputs: the additive kernel over axes and random directions
    (products are sums of squares of projections) beats one learned 2-D projection."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1200, 6, generator=g, dtype=D64) * 2 - 1
    f = x[:, :1] * x[:, 1:2] + torch.sin(2 * x[:, 2:3]) + 0.5 * x[:, 3:4]
    y = f + 0.05 * torch.randn(1200, 1, generator=g, dtype=D64)
    xt, ft = x[1000:], f[1000:]
    errs = {}
    for structure, extra in (("additive", {"components": 12}), ("single", {})):
        learner = WISKI(6, 1, structure=structure, lr=0.05, proj_lr=0.005, seed=0, **extra)
        for i in range(0, 1000, 100):
            learner.observe(x[i : i + 100], y[i : i + 100])
            for _ in range(3):
                learner.step(x[i : i + 100], y[i : i + 100])
        errs[structure] = float(((learner.predict_mean(xt) - ft) ** 2).mean() / ft.var())
    assert errs["additive"] < 0.05 and errs["additive"] < 0.5 * errs["single"], errs


def test_init_iters_runs_the_batch_phase_on_the_first_observed_batch():
    x, y = _data(64, d=ADD_D)
    a, b, c = _additive(init_iters=5), _additive(init_iters=0), _additive(init_iters=0)
    a.observe(x, y)
    b.observe(x, y)
    c.pretrain(x, y, iterations=5, progress=False)
    assert a.n == b.n == c.n == 64
    assert not torch.equal(a.hp.raw_lengthscale, b.hp.raw_lengthscale)  # the batch phase moved them
    assert torch.equal(a.gram, c.gram) and torch.equal(a.predict_mean(x), c.predict_mean(x))
    assert WISKI(4, 1).init_iters == 50 and WISKI(4, 1, structure="single").init_iters == 0
    with pytest.raises(LearnerError, match="init_iters >= 0"):
        _additive(init_iters=-1)


def test_dense_cache_blocks_equal_the_scatter(monkeypatch):
    import gpdyn.gp.wiski as wiski_module

    x, y = _data(300, d=ADD_D, seed=6)
    for projection in ("shared", "per-output"):
        a, b = _additive(projection), _additive(projection)
        a.observe(x[:10], y[:10])
        b.observe(x[:10], y[:10])
        monkeypatch.setattr(wiski_module, "DENSE_BLOCK", 1000)  # 32-row blocks: 9 of them
        a.observe(x[10:], y[10:])
        monkeypatch.setattr(wiski_module, "DENSE_GRAM_ROWS", 10_000)  # the scatter path
        b.observe(x[10:], y[10:])
        monkeypatch.undo()
        torch.testing.assert_close(a.gram, b.gram, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(a.wty, b.wty, rtol=1e-10, atol=1e-10)
