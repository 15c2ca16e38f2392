"""WISKI's stream economies: step_every, the calibration's reuse of the chunk's prediction, and the
variance from the LU of B (float64)."""

from __future__ import annotations

import pytest
import torch

from gpdyn.gp.base import LearnerError
from gpdyn.gp.wiski import WISKI

D64 = torch.float64


def _data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g, dtype=D64)
    f = torch.stack([x[:, 0] * x[:, 1] + torch.sin(x[:, 2]), x[:, 0] ** 2 - x[:, 2]], dim=-1)
    return x, f + 0.05 * torch.randn(n, 2, generator=g, dtype=D64)


def _model(**kw) -> WISKI:
    return WISKI(3, 2, structure="additive", components=3, grid_size=6, init_iters=0, lr=0.05, dtype=D64, **kw)


def test_step_every_k_steps_on_the_first_of_every_k_calls():
    x, y = _data(200)
    every, third = _model(), _model(step_every=3)
    for m in (every, third):
        m.observe(x[:100], y[:100])
    third.step(x[:20], y[:20])  # call 1: a step
    every.step(x[:20], y[:20])
    for k in (1, 2):  # calls 2, 3: none
        assert third.step(x[20 * k : 20 * k + 20], y[20 * k : 20 * k + 20]) == {}
    for a, b in zip(every.hp.parameters(), third.hp.parameters()):
        torch.testing.assert_close(a, b)
    third.step(x[60:80], y[60:80])  # call 4: a step again
    assert not torch.equal(third.hp.raw_noise, every.hp.raw_noise)
    again = _model(step_every=3)
    again.load_state_dict(third.state_dict())
    assert again.step_calls == 4
    with pytest.raises(LearnerError, match="step_every"):
        _model(step_every=0)


def test_the_calibration_reuses_the_prediction_of_the_chunk_it_observes():
    """Predicting a chunk before observing it (the stream protocol) leaves the calibration as
    it is without that prediction; a step in between (new caches) makes it predict again."""
    x, y = _data(300)
    plain, reused = _model(calibrate_rows=64), _model(calibrate_rows=64)
    for m in (plain, reused):
        m.observe(x[:100], y[:100])
    for a in range(100, 300, 50):
        reused.predict(x[a : a + 50])
        for m in (plain, reused):
            m.observe(x[a : a + 50], y[a : a + 50])
            m.step(x[a : a + 50], y[a : a + 50])
    torch.testing.assert_close(reused.variance_scale, plain.variance_scale, rtol=0, atol=0)
    # a different batch of the same shape is predicted afresh
    reused.predict(x[:50])
    mean, var = reused._predict_again(x[50:100])
    torch.testing.assert_close(mean, reused.predict(x[50:100])[0])


def test_the_variance_from_the_lu_equals_the_variance_cache():
    x, y = _data(400)
    m = _model()
    m.observe(x[:300], y[:300])
    m.step(x[:50], y[:50])
    few = m.predict(x[300:310])  # 10 points < M: from the LU of B
    assert m._m_pending
    many = m.predict(torch.cat([x[300:310], x[:200]]))  # more points than M: forms M = B^{-1} K
    assert not m._m_pending
    torch.testing.assert_close(few[0], many[0][:10])
    torch.testing.assert_close(few[1], many[1][:10])
