"""WISKI's symmetric (Cholesky) solver against the LU of B (float64): the same marginal likelihood, the same
gradients in every hyperparameter and the projection, the same posterior, for both structures."""

from __future__ import annotations

import pytest
import torch

from gpdyn.gp.base import LearnerError
from gpdyn.gp.wiski import WISKI, psd_sqrt

D64 = torch.float64


def _data(n: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=D64)
    f = torch.stack([x[:, 0] * x[:, 1] + torch.sin(x[:, -1]), x[:, 0] ** 2 - x[:, -1]], dim=-1)
    return x, f + 0.05 * torch.randn(n, 2, generator=g, dtype=D64)


CASES = {
    "additive": dict(structure="additive", components=4, grid_size=6),
    "additive-2d-per-output": dict(structure="additive", components=3, grid_size=5, proj_dim=2, projection="per-output"),
    "additive-no-linear": dict(structure="additive", components=3, grid_size=7, linear=False),
    "single": dict(structure="single", grid_size=10),
    "single-projected": dict(structure="single", grid_size=8, projection="per-output"),
}


def _pair(case: str, **kw) -> tuple[WISKI, WISKI, torch.Tensor, torch.Tensor]:
    opts = dict(dict(init_iters=0, lr=0.05), **CASES[case], **kw)
    d = 2 if case == "single" else 3
    x, y = _data(300, d)
    lu = WISKI(d, 2, dtype=D64, seed=0, solver="lu", **opts)
    ch = WISKI(d, 2, dtype=D64, seed=0, solver="cholesky", **opts)
    assert not lu.cholesky and ch.cholesky
    return lu, ch, x, y


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    if not b.numel():
        return 0.0
    return float((a - b).detach().abs().max() / b.abs().max().clamp_min(1e-300))


def _grads(m: WISKI) -> list[torch.Tensor]:
    params = m.hp.parameters() + m.proj_params
    for p in params:
        p.grad = None
    m.mll().sum().backward()
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]


@pytest.mark.parametrize("case", list(CASES))
def test_cholesky_mll_gradients_and_posterior_equal_the_lu(case):
    lu, ch, x, y = _pair(case)
    for m in (lu, ch):
        m.observe(x[:200], y[:200])
        m.set_hyperparameters(noise=0.01)  # a small noise: B far from sigma^2 I
    torch.testing.assert_close(ch.mll(), lu.mll(), rtol=1e-11, atol=0)
    for a, b in zip(_grads(ch), _grads(lu)):
        assert _rel(a, b) < 1e-9
    # the posterior: few points (variance from the factor) and many (from M = B^{-1} K)
    for rows in (slice(200, 210), slice(0, 300)):
        (mc, vc), (ml, vl) = ch.predict(x[rows]), lu.predict(x[rows])
        assert _rel(mc, ml) < 1e-10 and _rel(vc, vl) < 1e-10
    # eq. (18)'s gradient: the newest rows carry the projection's gradient through A and W^T y
    if ch.proj_params:
        for m in (lu, ch):
            m.optimizer.zero_grad()
        for m in (lu, ch):
            m.step(x[200:250], y[200:250])
        for a, b in zip(ch.proj_params + ch.hp.parameters(), lu.proj_params + lu.hp.parameters()):
            if b.numel():
                assert _rel(a.grad, b.grad) < 1e-8


@pytest.mark.parametrize("case", ["additive", "single-projected"])
def test_a_stream_with_the_cholesky_solver_follows_the_lu(case):
    """Batch phase, observe, step and predict in turn: the two solvers' predictions stay together."""
    lu, ch, x, y = _pair(case, init_iters=5, calibrate_rows=64, step_every=2)
    for m in (lu, ch):
        m.observe(x[:64], y[:64])  # the batch phase (5 iterations with the projection) on the first rows
    for a in range(64, 300, 32):
        (mc, vc), (ml, vl) = ch.predict(x[a : a + 32]), lu.predict(x[a : a + 32])
        assert _rel(mc, ml) < 1e-8 and _rel(vc, vl) < 1e-8
        for m in (lu, ch):
            m.observe(x[a : a + 32], y[a : a + 32])
            m.step(x[a : a + 32], y[a : a + 32])
    for a, b in zip(ch.hp.parameters(), lu.hp.parameters()):
        assert _rel(a, b) < 1e-9
    # the root of K kept between refreshes follows every change of the hyperparameters
    for m in (lu, ch):
        m.set_hyperparameters(lengthscale=0.7, amplitude=0.3)
    assert _rel(ch.predict(x[:20])[1], lu.predict(x[:20])[1]) < 1e-10
    again = WISKI(ch.input_dim, 2, dtype=D64, seed=1, **{k: v for k, v in ch.config.items()
                                                         if k not in ("input_dim", "output_dim", "seed")})
    again.load_state_dict(lu.state_dict())
    assert again.cholesky
    assert _rel(again.predict(x[:20])[1], lu.predict(x[:20])[1]) < 1e-10


def test_a_wrong_root_of_k_is_caught():
    """The equalities above hold because S S = K: with K itself in place of its root they fail."""
    lu, ch, x, y = _pair("additive")
    for m in (lu, ch):
        m.observe(x[:200], y[:200])
    import gpdyn.gp.wiski as wiski

    real = wiski.psd_sqrt
    try:
        wiski.psd_sqrt = lambda f: f
        ch._stale = True
        assert _rel(ch.mll(), lu.mll()) > 1e-6
        assert _rel(ch.predict(x[200:210])[1], lu.predict(x[200:210])[1]) > 1e-6
    finally:
        wiski.psd_sqrt = real


def test_psd_sqrt_of_a_singular_se_gram_squares_back():
    j = torch.arange(8, dtype=D64)
    k = torch.exp(-0.5 * ((j[:, None] - j[None, :]) / 4.0) ** 2)  # eigenvalues down to rounding
    s = psd_sqrt(k.expand(3, 8, 8))
    torch.testing.assert_close(s @ s, k.expand(3, 8, 8), rtol=0, atol=1e-12)
    torch.testing.assert_close(s, s.transpose(-1, -2))


def test_solver_option_is_checked_and_auto_picks_cholesky_on_the_cpu():
    assert WISKI(3, 2, dtype=D64).cholesky
    with pytest.raises(LearnerError, match="solver"):
        WISKI(3, 2, solver="qr")
