"""The exact online GP: incremental Cholesky, predictions, refits, checkpoints."""

from __future__ import annotations

import math

import pytest
import torch

from gpdyn.gp.base import LearnerError
from gpdyn.gp.exact import ExactOnlineGP
from gpdyn.gp.kernels import se_ard

D64 = torch.float64


def _data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, generator=g, dtype=D64) * 2 - 1
    y = torch.stack([torch.sin(2 * x[:, 0]) * x[:, 2], x[:, 1] ** 2], dim=-1)
    return x, y + 0.05 * torch.randn(n, 2, generator=g, dtype=D64)


HYPER = {"lengthscale": torch.tensor([[0.5, 0.8, 1.2], [0.9, 0.4, 2.0]], dtype=D64), "amplitude": 1.2, "noise": 0.01}


def _dense(x: torch.Tensor, y: torch.Tensor, xt: torch.Tensor):
    ls, amp = HYPER["lengthscale"], torch.full((2,), 1.2, dtype=D64)
    k = se_ard(x, x, ls, amp) + 0.01 * torch.eye(x.shape[0], dtype=D64)
    ks = se_ard(xt, x, ls, amp)
    mean = (ks @ torch.linalg.solve(k, y.T.unsqueeze(-1))).squeeze(-1).T
    var = (1.2 - (ks * torch.linalg.solve(k, ks.transpose(-1, -2)).transpose(-1, -2)).sum(-1)).T
    return k, mean, var


def test_incremental_cholesky_equals_batch_gp():
    x, y = _data(50)
    gp = ExactOnlineGP(3, 2, learn_hyperparameters=False)
    gp.observe(x[:1], y[:1])
    gp.set_hyperparameters(**HYPER)
    for lo, hi in ((1, 7), (7, 8), (8, 50)):  # uneven chunks
        gp.observe(x[lo:hi], y[lo:hi])
    xt, _ = _data(20, seed=1)
    k, mean, var = _dense(x, y, xt)
    torch.testing.assert_close(gp._L[:, :50, :50], torch.linalg.cholesky(k))
    m, v = gp.predict(xt)
    torch.testing.assert_close(m, mean)
    torch.testing.assert_close(v, var)
    dist = torch.distributions.MultivariateNormal(torch.zeros(50, dtype=D64), k)
    torch.testing.assert_close(gp.mll(), dist.log_prob(y.T))


def test_vlb_is_the_joint_heldout_density():
    x, y = _data(40)
    gp = ExactOnlineGP(3, 2, learn_hyperparameters=False)
    gp.observe(x[:30], y[:30])
    gp.set_hyperparameters(**HYPER)
    full = ExactOnlineGP(3, 2, learn_hyperparameters=False)
    full.observe(x, y)
    full.set_hyperparameters(**HYPER)
    expected = (full.mll() - gp.mll()) / 10
    torch.testing.assert_close(gp.vlb(x[30:], y[30:]), expected.detach())
    assert gp.n == 30


def test_periodic_refit_raises_the_likelihood():
    x, y = _data(60)
    gp = ExactOnlineGP(3, 2, refit_every=3, refit_iters=15, lr=0.05)
    gp.observe(x, y)
    before = gp.mll().sum().item()
    assert gp.step(x, y) == {"refit": 0.0} and gp.step(x, y) == {"refit": 0.0}
    metrics = gp.step(x, y)
    assert metrics["refit"] == 1.0 and math.isfinite(metrics["loss"])
    assert gp.mll().sum().item() > before
    # the factor was refreshed for the new hyperparameters
    torch.testing.assert_close(gp.predict(x)[0], _refit_predict(gp, x))


def _refit_predict(gp: ExactOnlineGP, xt: torch.Tensor) -> torch.Tensor:
    hp = gp.hp.as_dict()
    k = se_ard(gp._X[: gp.n], gp._X[: gp.n], hp["lengthscale"], hp["amplitude"]) + hp["noise"][:, None, None] * torch.eye(gp.n, dtype=D64)
    ks = se_ard(xt, gp._X[: gp.n], hp["lengthscale"], hp["amplitude"])
    return (ks @ torch.linalg.solve(k, gp._Y[: gp.n].T.unsqueeze(-1))).squeeze(-1).T


def test_limits_and_bad_input():
    x, y = _data(12)
    gp = ExactOnlineGP(3, 2, max_points=10)
    with pytest.raises(LearnerError, match="no data"):
        gp.predict(x)
    with pytest.raises(LearnerError, match="max_points"):
        gp.observe(x, y)
    bad = x.clone()
    bad[0, 0] = float("inf")
    with pytest.raises(LearnerError, match="NaN or inf"):
        gp.observe(bad[:5], y[:5])
    with pytest.raises(LearnerError, match="refit_every"):
        ExactOnlineGP(3, 2, refit_every=0)


def test_checkpoint_round_trip():
    x, y = _data(40)
    a = ExactOnlineGP(3, 2, refit_every=2, refit_iters=3)
    a.observe(x[:20], y[:20])
    a.step(x[:20], y[:20])
    a.step(x[:20], y[:20])
    b = ExactOnlineGP(3, 2, refit_every=2, refit_iters=3, seed=5)
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(b.predict(x[20:]), a.predict(x[20:]), rtol=0, atol=0)
    for gp in (a, b):
        gp.observe(x[20:], y[20:])
        gp.step(x, y)
        gp.step(x, y)
    torch.testing.assert_close(b.predict(x[:5]), a.predict(x[:5]), rtol=0, atol=0)


def test_cholesky_names_the_failed_batch_member_on_cpu():
    from gpdyn.gp.base import cholesky

    a = torch.eye(3, dtype=torch.float64).repeat(2, 1, 1)
    a[1, 2, 2] = -1.0
    with pytest.raises(torch.linalg.LinAlgError, match=r"batch member \(1,\).*order 3"):
        cholesky(a)
    torch.testing.assert_close(cholesky(a[:1]), torch.linalg.cholesky(a[:1]))


@pytest.mark.gpu
def test_cholesky_marks_failure_with_nan_on_cuda_without_raising():
    from gpdyn.gp.base import cholesky

    a = torch.eye(3, dtype=torch.float64, device="cuda").repeat(2, 1, 1)
    a[1, 2, 2] = -1.0
    factor = cholesky(a)
    assert torch.isnan(factor[1]).all() and torch.equal(factor[0], torch.eye(3, dtype=torch.float64, device="cuda"))


def test_predict_mean_shares_one_kernel_across_outputs_while_their_hyperparameters_agree(monkeypatch):
    """The data are every output's basis: with equal length scales and amplitudes one kernel
    serves all outputs (features without the output axis); the numbers are those of the
    per-output path and of predict's mean."""
    import gpdyn.gp.exact as exact_module

    g = torch.Generator().manual_seed(4)
    x = torch.randn(40, 3, generator=g, dtype=torch.float64)
    y = torch.randn(40, 2, generator=g, dtype=torch.float64)
    xt = torch.randn(2, 7, 3, generator=g, dtype=torch.float64)
    gp = ExactOnlineGP(3, 2, learn_hyperparameters=False)
    gp.set_hyperparameters(lengthscale=1.3, amplitude=0.7, noise=0.1)
    gp.observe(x, y)
    shared = gp.predict_mean(xt)
    assert gp._features[0].shape[0] == 1 and gp._features[1].dim() == 2
    torch.testing.assert_close(shared, gp.predict(xt)[0], rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(exact_module, "same_across_outputs", lambda *t: False)
    gp._features = None
    torch.testing.assert_close(gp.predict_mean(xt), shared, rtol=1e-12, atol=1e-12)
    assert gp._features[0].shape[0] == 2
    monkeypatch.undo()
    gp.set_hyperparameters(lengthscale=torch.tensor([[1.3, 1.0, 0.9], [0.8, 1.1, 1.2]], dtype=torch.float64))
    assert gp._features is None  # new hyperparameters drop the features
    torch.testing.assert_close(gp.predict_mean(xt), gp.predict(xt)[0], rtol=1e-12, atol=1e-12)
    assert gp._features[0].shape[0] == 2


def test_predict_takes_one_factor_for_every_output_while_their_hyperparameters_agree(monkeypatch):
    """With the same length scales, amplitude and noise for every output, predict solves with one
    Cholesky factor and one kernel for all outputs: the mean and variance of the dense GP, and of
    the batched per-output path, to rounding (float64). A noise that differs between outputs
    (the factors differ) takes the per-output path, and so does a refit."""
    import gpdyn.gp.exact as exact_module

    g = torch.Generator().manual_seed(7)
    x = torch.randn(30, 3, generator=g, dtype=D64)
    y = torch.randn(30, 2, generator=g, dtype=D64)
    xt = torch.randn(4, 5, 3, generator=g, dtype=D64)
    gp = ExactOnlineGP(3, 2, learn_hyperparameters=False)
    gp.set_hyperparameters(lengthscale=torch.tensor([0.9, 1.4, 0.7], dtype=D64).expand(2, 3), amplitude=0.8, noise=0.05)
    gp.observe(x[:11], y[:11])
    gp.observe(x[11:], y[11:])
    mean, var = gp.predict(xt)
    assert gp._shared is True and gp._features[1].dim() == 2
    ls = torch.tensor([0.9, 1.4, 0.7], dtype=D64).expand(2, 3)
    amp = torch.full((2,), 0.8, dtype=D64)
    k = se_ard(x, x, ls, amp) + 0.05 * torch.eye(30, dtype=D64)
    ks = se_ard(xt.reshape(-1, 3), x, ls, amp)
    dense_mean = (ks @ torch.linalg.solve(k, y.T.unsqueeze(-1))).squeeze(-1).T.reshape(4, 5, 2)
    dense_var = (0.8 - (ks * torch.linalg.solve(k, ks.transpose(-1, -2)).transpose(-1, -2)).sum(-1)).T.reshape(4, 5, 2)
    torch.testing.assert_close(mean, dense_mean, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(var, dense_var, rtol=1e-10, atol=1e-12)
    monkeypatch.setattr(exact_module, "same_across_outputs", lambda *t: False)  # the per-output path
    gp._features = gp._shared = None
    per_output = gp.predict(xt)
    assert gp._features[1].dim() == 3
    torch.testing.assert_close(per_output[0], mean, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(per_output[1], var, rtol=1e-12, atol=1e-13)
    monkeypatch.undo()
    gp.set_hyperparameters(noise=torch.tensor([0.05, 0.2], dtype=D64))  # the factors differ
    m2, v2 = gp.predict(xt)
    assert gp._shared is False
    k2 = se_ard(x, x, ls, amp) + torch.tensor([0.05, 0.2], dtype=D64)[:, None, None] * torch.eye(30, dtype=D64)
    var2 = (0.8 - (ks * torch.linalg.solve(k2, ks.transpose(-1, -2)).transpose(-1, -2)).sum(-1)).T.reshape(4, 5, 2)
    torch.testing.assert_close(v2, var2, rtol=1e-10, atol=1e-12)


def test_observe_extends_the_cached_data_features_as_a_rebuild_would():
    """After predict has cached the data features, observe appends the new rows' features (the
    hyperparameters did not change) and conditions through them, and with one factor for every
    output grows its inverse: the features, the factor and the predictions equal those of a GP
    that rebuilds everything, to rounding (float64)."""
    x, y = _data(40, seed=3)
    xt, _ = _data(9, seed=4)
    for lengthscale in (1.1, torch.tensor([[0.7, 1.2, 0.9], [1.3, 0.8, 1.0]], dtype=D64)):
        kept, rebuilt = (ExactOnlineGP(3, 2, learn_hyperparameters=False) for _ in range(2))
        for gp in (kept, rebuilt):
            gp.set_hyperparameters(lengthscale=lengthscale, amplitude=0.9, noise=0.02)
            gp.observe(x[:10], y[:10])
        for lo in range(10, 40, 3):
            kept.predict(xt)  # caches the features
            kept.observe(x[lo : lo + 3], y[lo : lo + 3])
            assert kept._features is not None
            rebuilt.observe(x[lo : lo + 3], y[lo : lo + 3])
            rebuilt._features = rebuilt._shared = None
        cached = kept._features[1]
        if kept._shared:  # the factor's inverse, grown block by block with the factor
            assert kept._linv is not None and kept._linv.shape == (40, 40)
            eye = torch.eye(40, dtype=D64)
            torch.testing.assert_close(kept._linv @ kept.chol[0], eye, rtol=0, atol=1e-10)
        rebuilt._mean_features()
        torch.testing.assert_close(cached, rebuilt._features[1], rtol=0, atol=1e-14)
        torch.testing.assert_close(kept.chol, rebuilt.chol, rtol=1e-12, atol=1e-13)
        for got, want in zip(kept.predict(xt), rebuilt.predict(xt)):
            torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-12)
