"""WISKI's stream options (float64): the quadratic term of the additive structure against a
batch recompute of Bayesian linear regression on the same basis, and option errors."""

from __future__ import annotations

import math

import pytest
import torch

from gpdyn.gp import make_learner
from gpdyn.gp.base import LearnerError
from gpdyn.gp.wiski import WISKI

D64 = torch.float64


def _data(n: int, d: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=D64)
    f = torch.stack([x[:, 0] * x[:, 1] + torch.sin(x[:, 2]), x[:, 0] ** 2 - x[:, 2]], dim=-1)
    return x, f + 0.05 * torch.randn(n, 2, generator=g, dtype=D64)


def _quadratic(d: int = 3, **kw) -> WISKI:
    return WISKI(d, 2, structure="additive", components=2, grid_size=6, quadratic=True, init_iters=0,
                 learn_hyperparameters=False, dtype=D64, **kw)


def test_quadratic_basis_holds_products_after_the_linear_term():
    model = _quadratic()
    x, y = _data(5)
    model.observe(x, y)
    phi = model.dense_rows(x)[0]  # [N, M]
    lin = phi[:, model.components * model.grid_points :]
    i, j = torch.triu_indices(3, 3)
    torch.testing.assert_close(lin, torch.cat([x, torch.ones(5, 1, dtype=D64), x[:, i] * x[:, j]], dim=-1))
    assert model.num_inducing == 2 * 6 + 4 + 6


def test_row_by_row_caches_equal_one_batch_and_predictions_equal_the_dense_posterior():
    x, y = _data(60)
    one, rows = _quadratic(), _quadratic()
    one.observe(x[:20], y[:20])
    rows.observe(x[:20], y[:20])
    one.observe(x[20:], y[20:])
    for k in range(20, 60):  # the O(1) cache update of WISKI eqs. (7), (16), (17), one row at a time
        rows.observe(x[k : k + 1], y[k : k + 1])
    torch.testing.assert_close(rows.gram, one.gram)
    torch.testing.assert_close(rows.wty, one.wty)
    torch.testing.assert_close(rows.yty, one.yty)
    # the batch recompute: GP with kernel phi(x)^T K phi(x'), noise s, by dense algebra
    xs, _ = _data(7, seed=1)
    phi, phis = one.dense_rows(x)[0], one.dense_rows(xs)[0]
    k = one.prior_dense()  # [P, M, M]
    s = one.hp.noise
    kxx = phi @ k @ phi.T  # [P, N, N]
    kxs = phi @ k @ phis.T
    kss = (phis @ k @ phis.T).diagonal(dim1=-2, dim2=-1)
    c = kxx + s[:, None, None] * torch.eye(60, dtype=D64)
    mean_ref = (kxs.transpose(-1, -2) @ torch.linalg.solve(c, y.T.unsqueeze(-1))).squeeze(-1).T
    var_ref = (kss - (kxs * torch.linalg.solve(c, kxs)).sum(-2)).T
    mean, var = rows.predict(xs)
    torch.testing.assert_close(mean, mean_ref)
    torch.testing.assert_close(var, var_ref)
    torch.testing.assert_close(rows.predict_mean(xs), mean_ref)  # the fused gather with the quadratic part


def test_steps_with_the_quadratic_term_keep_predictions_finite_and_fit():
    x, y = _data(300)
    model = WISKI(3, 2, structure="additive", components=3, grid_size=8, quadratic=True, init_iters=5, lr=0.05,
                  dtype=D64)
    model.observe(x[:200], y[:200])
    for k in range(200, 300, 20):
        model.observe(x[k : k + 20], y[k : k + 20])
        model.step(x[k : k + 20], y[k : k + 20])
    mean, var = model.predict(x[:50])
    assert bool(torch.isfinite(mean).all()) and bool((var >= 0).all())
    assert float(((mean - y[:50]) ** 2).mean()) < 0.1 * float(y[:50].var(0).mean())


def test_quadratic_option_errors_and_registry():
    with pytest.raises(LearnerError, match="quadratic=True extends the linear term"):
        WISKI(3, 1, structure="additive", linear=False, quadratic=True)
    with pytest.raises(LearnerError, match="quadratic=True extends the linear term"):
        WISKI(2, 1, structure="single", quadratic=True)
    with pytest.raises(LearnerError, match="compiled_mean"):
        WISKI(3, 1, structure="additive", quadratic=True, compiled_mean=True)
    learner = make_learner("wiski", 4, 2, preset="cpu", quadratic=True, components=4)
    assert learner.config["quadratic"] is True and learner.linear_dim == 5 + 10


def test_calibrated_variance_is_the_ml_scale_of_the_one_step_predictions():
    """calibrate_rows: before a batch enters the caches, its predictions N(mu, c v) move c toward
    mean(r^2 / v); the mean and the caches are those of the uncalibrated learner."""
    x, y = _data(120)
    plain = WISKI(3, 2, structure="additive", components=2, grid_size=6, init_iters=0, learn_hyperparameters=False,
                  dtype=D64)
    calibrated = WISKI(3, 2, structure="additive", components=2, grid_size=6, init_iters=0,
                       learn_hyperparameters=False, dtype=D64, calibrate_rows=50)
    for model in (plain, calibrated):
        model.observe(x[:40], y[:40])
    mean, var = plain.predict(x[40:80])
    ratio = ((y[40:80] - mean) ** 2 / (var + plain.noise_variance())).mean(0)
    for model in (plain, calibrated):
        model.observe(x[40:80], y[40:80])
    keep = math.exp(-40 / 50)
    torch.testing.assert_close(calibrated.variance_scale, keep + (1 - keep) * ratio)
    torch.testing.assert_close(calibrated.predict_mean(x[80:]), plain.predict_mean(x[80:]))
    torch.testing.assert_close(calibrated.gram, plain.gram)
    m_c, v_c = calibrated.predict_y(x[80:])
    m_p, v_p = plain.predict_y(x[80:])
    torch.testing.assert_close(v_c, v_p * calibrated.variance_scale)
    # the scale survives a checkpoint
    again = WISKI(3, 2, structure="additive", components=2, grid_size=6, init_iters=0, learn_hyperparameters=False,
                  dtype=D64, calibrate_rows=50)
    again.load_state_dict(calibrated.state_dict())
    torch.testing.assert_close(again.predict_y(x[80:])[1], v_c)
    with pytest.raises(LearnerError, match="calibrate_rows must be >= 0"):
        WISKI(3, 2, calibrate_rows=-1)


def test_a_float32_learner_keeps_its_caches_and_solves_in_float64():
    """The marginal likelihood is y^T y less the fitted part, two sums over every row: in float32
    they cancel to noise over ~10^5 rows (a float32 KUKA race diverged). A float32 learner's
    likelihood and predictions match the float64 learner's on a long stream with a large mean."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(60_000, 2, generator=g, dtype=D64) * 2 - 1
    y = (5.0 + torch.sin(3 * x[:, :1]) * x[:, 1:] + 0.01 * torch.randn(60_000, 1, generator=g, dtype=D64))
    models = {dtype: WISKI(2, 1, grid_size=16, bounds=(-1, 1), learn_hyperparameters=False, dtype=dtype)
              for dtype in (torch.float32, D64)}
    for dtype, model in models.items():
        for start in range(0, 60_000, 4096):
            model.observe(x[start : start + 4096].to(dtype), y[start : start + 4096].to(dtype))
        model.set_hyperparameters(noise=1e-3)
    assert models[torch.float32].gram.dtype == D64
    mll32, mll64 = models[torch.float32].mll(), models[D64].mll()
    torch.testing.assert_close(mll32, mll64, rtol=1e-3, atol=0.0)  # float32 caches: 2 % off, means off by 2.4
    xs = x[:100]
    torch.testing.assert_close(models[torch.float32].predict_mean(xs.float()).double(), models[D64].predict_mean(xs),
                               rtol=0, atol=1e-3)
