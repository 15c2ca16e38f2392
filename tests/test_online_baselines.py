"""The one-pass baselines ``ssgp`` (I-SSGP) and ``rls``: float64 identities with their batch
closed forms, the hyperparameter selection and reselection against the evidence computed from
the raw rows, exact checkpoint continuation, and bad input refused before any change."""

from __future__ import annotations

import math

import pytest
import torch
from learner_data import random_data

from gpdyn.gp import make_learner
from gpdyn.gp.base import LearnerError, NonFiniteError
from gpdyn.gp.kernels import median_lengthscale
from gpdyn.gp.online import load_learner, save_learner
from gpdyn.gp.rls import RLS
from gpdyn.gp.ssgp import SSGP, fourier_features

F64 = torch.float64
#: chunk sizes that take both update paths: Woodbury steps (small chunks) and refreshes
#: from the statistics (chunks of M / 2 rows or more, and every M rows taken in by Woodbury)
CHUNKS = (1, 2, 3, 1, 5, 2, 4, 1, 30, 2, 3, 120, 1, 6)


def _stream(learner, x: torch.Tensor, y: torch.Tensor, first: int, chunks=CHUNKS) -> int:
    """Observe ``x[:first]`` then ``chunks``; the rows observed."""
    learner.observe(x[:first], y[:first])
    at = first
    for k in chunks:
        learner.observe(x[at : at + k], y[at : at + k])
        at += k
    return at


def _blr(phi: torch.Tensor, y: torch.Tensor, lam: float, phi_t: torch.Tensor, noise: torch.Tensor):
    """Batch BLR posterior at ``phi_t``: latent mean and variance, ``[N, P]`` each."""
    a = phi.T @ phi + lam * torch.eye(phi.shape[1], dtype=F64)
    w = torch.linalg.solve(a, phi.T @ y)
    quad = (phi_t * torch.linalg.solve(a, phi_t.T).T).sum(-1)
    return phi_t @ w, quad[:, None] * noise


def _raw_evidence(phi: torch.Tensor, y: torch.Tensor, lam: float, noise: torch.Tensor) -> torch.Tensor:
    """``log N(y_p; 0, s_p (I + Phi Phi^T / lam))`` per output, from the rows themselves."""
    n = phi.shape[0]
    cov = noise[:, None, None] * (torch.eye(n, dtype=F64) + phi @ phi.T / lam)
    return torch.distributions.MultivariateNormal(torch.zeros(y.shape[1], n, dtype=F64), cov).log_prob(y.T)


def _optimal_noise(phi: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    k = torch.eye(phi.shape[0], dtype=F64) + phi @ phi.T / lam
    return (y * torch.linalg.solve(k, y)).sum(0) / phi.shape[0]


def _ssgp(**options) -> SSGP:
    base = {"features": 50, "select_iters": 5, "reselect_every": 0}
    return make_learner("ssgp", 3, 2, **{**base, **options})


# -- rls ----------------------------------------------------------------------------------
@pytest.mark.parametrize("forgetting", [1.0, 0.97])
def test_rls_is_the_batch_ridge_solution(forgetting: float) -> None:
    x, y = random_data(400, 5, 3, seed=1)
    learner = make_learner("rls", 5, 3, delta=0.3, forgetting=forgetting)
    n = _stream(learner, x, y, 20)
    x, y = x[:n], y[:n]
    xa = torch.cat([x, torch.ones(n, 1, dtype=F64)], 1)
    weight = forgetting ** torch.arange(n - 1, -1, -1, dtype=F64)  # the newest row weighs 1
    a = xa.T @ (weight[:, None] * xa) + 0.3 * torch.eye(6, dtype=F64)
    w = torch.linalg.solve(a, xa.T @ (weight[:, None] * y))
    torch.testing.assert_close(learner.inverse, torch.linalg.inv(a), rtol=0, atol=1e-12)
    torch.testing.assert_close(learner.inverse @ learner.cross, w, rtol=0, atol=1e-10)
    # the noise: the penalised residual sum of squares per (weighted) row
    n_eff = float(weight.sum())
    resid = y - xa @ w
    noise = ((weight[:, None] * resid**2).sum(0) + 0.3 * (w * w).sum(0)) / n_eff
    torch.testing.assert_close(learner.noise_variance(), noise, rtol=1e-10, atol=0)
    xt, yt = random_data(9, 5, 3, seed=2)
    xta = torch.cat([xt, torch.ones(9, 1, dtype=F64)], 1)
    mean, var = learner.predict(xt)
    torch.testing.assert_close(mean, xta @ w, rtol=0, atol=1e-10)
    torch.testing.assert_close(var, (xta * torch.linalg.solve(a, xta.T).T).sum(-1)[:, None] * noise, rtol=1e-10, atol=0)
    torch.testing.assert_close(learner.predict_mean(xt), mean, rtol=0, atol=1e-12)
    # vlb: the held-out joint predictive density of the batch, per point
    cov = noise[:, None, None] * (torch.eye(9, dtype=F64) + xta @ torch.linalg.solve(a, xta.T))
    held_out = torch.distributions.MultivariateNormal((xta @ w).T, cov).log_prob(yt.T) / 9
    torch.testing.assert_close(learner.vlb(xt, yt), held_out, rtol=1e-10, atol=0)


def test_rls_woodbury_steps_and_refreshes_agree() -> None:
    x, y = random_data(300, 12, 2, seed=4)
    rowwise = make_learner("rls", 12, 2)
    for i in range(300):  # rank-one Woodbury steps, refreshed every M = 13 rows
        rowwise.observe(x[i : i + 1], y[i : i + 1])
    batch = make_learner("rls", 12, 2)
    batch.observe(x, y)  # one refresh
    assert rowwise.rows == batch.rows == 300 and batch.fresh == 0
    torch.testing.assert_close(rowwise.inverse, batch.inverse, rtol=0, atol=1e-12)
    torch.testing.assert_close(rowwise.predict(x[:7])[0], batch.predict(x[:7])[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(rowwise.log_evidence(), batch.log_evidence(), rtol=1e-10, atol=0)


def test_rls_evidence_is_that_of_the_blr() -> None:
    x, y = random_data(150, 4, 2, seed=5)
    learner = make_learner("rls", 4, 2, delta=0.5)
    _stream(learner, x, y, 10, chunks=(3, 1, 40, 2, 94))
    xa = torch.cat([x, torch.ones(150, 1, dtype=F64)], 1)
    raw = _raw_evidence(xa, y, 0.5, learner.noise_variance())
    torch.testing.assert_close(learner.log_evidence(), raw, rtol=1e-10, atol=0)
    loss = learner.step(x[:5], y[:5])["loss"]
    assert loss.shape == () and torch.allclose(loss, -(raw / 150).mean(), rtol=1e-10)


# -- ssgp ---------------------------------------------------------------------------------
def test_ssgp_is_the_batch_blr_posterior_on_its_features() -> None:
    x, y = random_data(400, 3, 2, seed=6)
    learner = _ssgp()
    n = _stream(learner, x, y, 60)
    assert learner.feature_dim == 100 and learner.rows == n
    phi = learner.features(x[:n])
    xt, _ = random_data(11, 3, 2, seed=7)
    mean, var = learner.predict(xt)
    want_mean, want_var = _blr(phi, y[:n], learner.lam, learner.features(xt), learner.noise_variance())
    torch.testing.assert_close(mean, want_mean, rtol=0, atol=1e-9)
    torch.testing.assert_close(var, want_var, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(learner.predict_mean(xt), mean, rtol=0, atol=1e-12)
    # the evidence from the sufficient statistics is that of the rows
    raw = _raw_evidence(phi, y[:n], learner.lam, learner.noise_variance())
    torch.testing.assert_close(learner.log_evidence(), raw, rtol=1e-9, atol=0)


def test_ssgp_features_share_one_map_and_approximate_the_kernel() -> None:
    learner = make_learner("ssgp", 2, 3, features=300)
    assert learner.frequencies.shape == (300, 2)  # one map [F, D] for all outputs
    learner.lengthscale = torch.tensor([0.7, 1.6], dtype=F64)
    x, _ = random_data(40, 2, 3, seed=8)
    phi = learner.features(x)
    assert phi.shape == (40, 600)
    torch.testing.assert_close(phi, fourier_features(x, learner.frequencies, learner.lengthscale))
    assert torch.allclose((phi * phi).sum(-1), torch.ones(40, dtype=F64))
    # many frequencies: the SE kernel at these length scales (Monte Carlo error ~ 1/sqrt(F))
    z = torch.randn(40000, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    phi = fourier_features(x, z, learner.lengthscale)
    d = (x[:, None] - x[None]) / learner.lengthscale
    assert float((phi @ phi.T - torch.exp(-0.5 * (d * d).sum(-1))).abs().max()) < 0.03


def test_ssgp_selection_does_not_lose_evidence() -> None:
    x, y = random_data(120, 3, 2, seed=9)
    learner = _ssgp(select_iters=20)
    learner.observe(x, y)
    record = learner.selection
    assert record["selected_evidence"] >= record["start_evidence"] - 1e-9 * abs(record["start_evidence"])
    # both from the rows: the start (median trick, its best lam) and the selected hyperparameters
    start_ls = median_lengthscale(x, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(torch.tensor(record["start_lengthscale"], dtype=F64), start_ls)
    phi_start = fourier_features(x, learner.frequencies, start_ls)
    lam0 = record["start_lambda"]
    start = _raw_evidence(phi_start, y, lam0, _optimal_noise(phi_start, y, lam0)).sum() / 120
    phi = learner.features(x)
    selected = _raw_evidence(phi, y, learner.lam, learner.noise_variance()).sum() / 120
    torch.testing.assert_close(start, torch.tensor(record["start_evidence"], dtype=F64), rtol=1e-9, atol=0)
    torch.testing.assert_close(selected, torch.tensor(record["selected_evidence"], dtype=F64), rtol=1e-9, atol=0)
    assert float(selected) >= float(start) - 1e-9
    # the noises are the optimum at lam, and lam the optimum (the noises re-optimised)
    torch.testing.assert_close(learner.noise_variance(), _optimal_noise(phi, y, learner.lam), rtol=1e-9, atol=0)
    for factor in (0.9, 1.1):
        lam = learner.lam * factor
        assert float(_raw_evidence(phi, y, lam, _optimal_noise(phi, y, lam)).sum()) < float(selected) * 120


def test_ssgp_reselection_from_statistics_is_the_evidence_of_the_rows() -> None:
    x, y = random_data(600, 3, 2, seed=10)
    learner = _ssgp(reselect_every=100)
    learner.observe(x[:60], y[:60])
    lam_first = learner.lam
    at = 60
    for k in (40, 3, 57, 200, 1, 99):  # reselections after 100, 300 and 400 rows more
        learner.observe(x[at : at + k], y[at : at + k])
        at += k
    assert learner.selection["reselections"] == 3 and learner.since_select == 0 and learner.rows == at == 460
    assert learner.lam != lam_first
    phi, yy = learner.features(x[:at]), y[:at]
    raw = _raw_evidence(phi, yy, learner.lam, learner.noise_variance())
    torch.testing.assert_close(learner.log_evidence(), raw, rtol=1e-9, atol=0)
    assert math.isclose(learner.selection["evidence"], float(raw.sum()) / at, rel_tol=1e-9)
    torch.testing.assert_close(learner.noise_variance(), _optimal_noise(phi, yy, learner.lam), rtol=1e-9, atol=0)
    best = float(raw.sum())
    for factor in (0.95, 1.05):
        lam = learner.lam * factor
        assert float(_raw_evidence(phi, yy, lam, _optimal_noise(phi, yy, lam)).sum()) < best
    # and the posterior after the reselection is the batch one at the new hyperparameters
    xt, _ = random_data(5, 3, 2, seed=11)
    want_mean, want_var = _blr(phi, yy, learner.lam, learner.features(xt), learner.noise_variance())
    mean, var = learner.predict(xt)
    torch.testing.assert_close(mean, want_mean, rtol=0, atol=1e-9)
    torch.testing.assert_close(var, want_var, rtol=1e-9, atol=1e-12)


def test_ssgp_presets_count_features() -> None:
    sizes = {preset: make_learner("ssgp", 3, 2, preset=preset).feature_dim for preset in ("small", "cpu", "paper")}
    assert sizes == {"small": 200, "cpu": 1000, "paper": 2000}
    assert make_learner("ssgp", 3, 2).feature_dim == 1000  # the default: 500 frequencies


def test_a_row_observed_twice_counts_twice() -> None:
    x, y = random_data(30, 3, 2, seed=12)
    once, twice = make_learner("rls", 3, 2), make_learner("rls", 3, 2)
    once.observe(torch.cat([x, x]), torch.cat([y, y]))
    twice.observe(x, y)
    twice.observe(x, y)
    assert twice.rows == 60
    torch.testing.assert_close(twice.gram, once.gram)
    torch.testing.assert_close(twice.predict(x)[0], once.predict(x)[0], rtol=0, atol=1e-10)


# -- both ---------------------------------------------------------------------------------
def _make(name: str, seed: int = 0):
    return _ssgp(seed=seed, reselect_every=50) if name == "ssgp" else make_learner("rls", 3, 2, seed=seed)


@pytest.mark.parametrize("name", ["ssgp", "rls"])
def test_state_round_trip_mid_stream_continues_bit_exactly(name: str, tmp_path) -> None:
    x, y = random_data(300, 3, 2, seed=13)
    learner = _make(name)
    at = _stream(learner, x, y, 40, chunks=(3, 1, 20))
    twin = _make(name, seed=5)
    twin.load_state_dict(learner.state_dict())
    restored, _ = load_learner(save_learner(learner, tmp_path / f"{name}.pt"))
    for model in (learner, twin, restored):
        lo = at
        for k in (2, 60, 1, 7):
            model.observe(x[lo : lo + k], y[lo : lo + k])
            model.step(x[lo : lo + k], y[lo : lo + k])
            lo += k
    if name == "ssgp":
        assert learner.selection["reselections"] >= 1  # the continuation reselected, the same in all three
    xt, yt = random_data(13, 3, 2, seed=14)
    for other in (twin, restored):
        for got, want in zip(other.predict(xt), learner.predict(xt)):
            assert torch.equal(got, want)
        assert torch.equal(other.vlb(xt, yt), learner.vlb(xt, yt))
        assert torch.equal(other.step(xt, yt)["loss"], learner.step(xt, yt)["loss"])


def _poisoned(t: torch.Tensor, value: float) -> torch.Tensor:
    t = t.clone()
    t[1, 0] = value
    return t


BAD = {
    "nan-x": lambda x, y: (_poisoned(x, math.nan), y),
    "inf-y": lambda x, y: (x, _poisoned(y, math.inf)),
    "wide-x": lambda x, y: (torch.cat([x, x[:, :1]], 1), y),
    "short-y": lambda x, y: (x, y[:, :1]),
    "rows-y": lambda x, y: (x, y[:-1]),
    "float32-x": lambda x, y: (x.float(), y),
}


def _equal_states(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for key, value in a.items():
        other = b[key]
        if isinstance(value, torch.Tensor):
            if not torch.equal(value, other):
                return False
        elif isinstance(value, dict):
            if not _equal_states(value, other):
                return False
        elif value != other:
            return False
    return True


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("name", ["ssgp", "rls"])
@pytest.mark.slow
def test_bad_input_raises_before_any_change(name: str, bad: str) -> None:
    x, y = random_data(80, 3, 2, seed=15)
    error = NonFiniteError if bad in ("nan-x", "inf-y") else LearnerError
    fresh = _make(name)
    before = fresh.state_dict()
    with pytest.raises(error):
        fresh.observe(*BAD[bad](x[:30], y[:30]))
    assert not fresh.initialized and _equal_states(before, fresh.state_dict())
    learner = _make(name)
    learner.observe(x[:40], y[:40])
    before = learner.state_dict()
    with pytest.raises(error):
        learner.observe(*BAD[bad](x[40:50], y[40:50]))
    assert _equal_states(before, learner.state_dict())
    if bad in ("wide-x", "float32-x"):
        with pytest.raises(LearnerError):
            learner.predict(BAD[bad](x[:5], y[:5])[0])
    with pytest.raises(LearnerError, match="no data observed yet"):
        _make(name).predict(x[:3])


@pytest.mark.parametrize("name", ["ssgp", "rls"])
def test_step_learns_nothing_and_its_loss_is_the_evidence(name: str) -> None:
    x, y = random_data(100, 3, 2, seed=16)
    learner = _make(name)
    assert torch.isnan(learner.step(x[:4], y[:4])["loss"])  # nothing observed yet
    learner.observe(x[:70], y[:70])
    before = learner.state_dict()
    loss = learner.step(x[70:], y[70:])["loss"]
    assert isinstance(loss, torch.Tensor) and loss.shape == ()
    torch.testing.assert_close(loss, -(learner.log_evidence() / 70).mean())
    assert _equal_states(before, learner.state_dict())


@pytest.mark.parametrize("options", [{"features": 0}, {"select_iters": -1}, {"select_lr": 0.0}, {"reselect_every": -5},
                                     {"noise_floor": 0.0}])
def test_ssgp_bad_options(options) -> None:
    with pytest.raises(LearnerError):
        make_learner("ssgp", 3, 2, **options)


@pytest.mark.parametrize("options", [{"delta": 0.0}, {"forgetting": 0.0}, {"forgetting": 1.5}, {"delta": math.nan}])
def test_rls_bad_options(options) -> None:
    with pytest.raises(LearnerError):
        RLS(3, 2, **options)


def test_float32_learners_run() -> None:
    x, y = random_data(300, 3, 2, seed=17)
    for name in ("ssgp", "rls"):
        learner = make_learner(name, 3, 2, preset="small", dtype=torch.float32)
        learner.observe(x[:100].float(), y[:100].float())
        for lo in range(100, 300, 50):
            learner.observe(x[lo : lo + 50].float(), y[lo : lo + 50].float())
        mean, var = learner.predict(x[:10].float())
        assert mean.dtype == torch.float32 and bool(torch.isfinite(mean).all()) and bool((var >= 0).all())
        assert math.isfinite(float(learner.step(x[:5].float(), y[:5].float())["loss"]))
