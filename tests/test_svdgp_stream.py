"""SVDGP's stream regime (``stream=True``): the bound's N follows the rows seen, every new row joins
the mean basis alpha with the GPR posterior mean of the residual as its coefficient, the
least-norm functions make room when alpha is full, beta takes the newest rows."""

from __future__ import annotations

import pytest
import torch
from learner_data import F64, random_data

from gpdyn.gp.base import LearnerError
from gpdyn.gp.prequential import StreamProtocol, prequential
from gpdyn.gp.svdgp import SVDGP


def _learner(**kw) -> SVDGP:
    opts = {"m_alpha": 32, "m_beta": 8, "n_columns": 16, "n_delta": 4, "dtype": F64, "seed": 0, "stream": True}
    return SVDGP(2, 2, **{**opts, **kw})


def test_first_batch_mean_is_the_gpr_posterior_mean():
    x, y = random_data(20, 2, 2)
    m = _learner()
    m.observe(x, y)
    assert m.basis_counts == {"alpha": 20, "beta": 4}
    k = m.kern(x.expand(2, -1, -1), x.expand(2, -1, -1))
    eye = torch.eye(20, dtype=F64)
    want = k @ torch.linalg.solve(k + m.noise[:, None, None] * eye, y.T.unsqueeze(-1))
    mean, _ = m.predict(x)
    torch.testing.assert_close(mean.T, want.squeeze(-1))


def test_second_batch_fits_the_residual_and_keeps_the_old_functions():
    x, y = random_data(30, 2, 2)
    m = _learner()
    m.observe(x[:20], y[:20])
    a_old = m.coefficients()[0].clone()
    m.observe(x[20:], y[20:])
    a_new, _ = m.coefficients()
    assert m.basis_counts["alpha"] == 30
    torch.testing.assert_close(a_new[:, :20], a_old)
    # the new coefficients: (K_nn + sigma^2 I)^{-1} (y_n - m_old(x_n))
    xn = x[20:].expand(2, -1, -1)
    k = m.kern(xn, xn)
    resid = y[20:].T - (m.kern(xn, x[:20].expand(2, -1, -1)) @ a_old.unsqueeze(-1)).squeeze(-1)
    want = torch.linalg.solve(k + m.noise[:, None, None] * torch.eye(10, dtype=F64), resid.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(a_new[:, 20:], want)


def test_full_alpha_replaces_the_least_norm_functions_and_their_adam_moments():
    x, y = random_data(40, 2, 2)
    m = _learner()
    m.observe(x[:32], y[:32])
    m.step(x[:32], y[:32])
    a, _ = m.coefficients()
    weight = (a * m.amplitude.sqrt()[:, None]).pow(2).sum(0)
    expect = set(torch.topk(weight, 8, largest=False).indices.tolist())
    keep = sorted(set(range(32)) - expect)
    a_keep = a[:, keep].clone()
    m.observe(x[32:], y[32:])
    assert m.basis_counts["alpha"] == 32
    z = m.params["alpha_z"][0]
    replaced = {j for j in range(32) if any(torch.equal(z[j], r) for r in x[32:])}
    assert replaced == expect
    torch.testing.assert_close(m.coefficients()[0][:, keep], a_keep)
    state = m.optimizer.state[m.params["a"]]
    assert state["exp_avg"][:, sorted(expect)].abs().sum() == 0


def test_bigger_batch_than_alpha_keeps_the_newest_rows():
    x, y = random_data(50, 2, 2)
    m = _learner()
    m.observe(x, y)
    torch.testing.assert_close(m.params["alpha_z"][0], x[-32:])
    torch.testing.assert_close(m.params["beta_z"][0, :4], x[-4:])


def test_bound_n_is_the_rows_seen_not_n_data():
    x, y = random_data(30, 2, 2)
    m = _learner(n_data=10_000)
    m.observe(x[:20], y[:20])
    assert m.data_size(8) == 20
    m.observe(x[20:], y[20:])
    assert m.data_size(8) == 30
    iid = _learner(n_data=10_000, stream=False)
    iid.observe(x, y)
    assert iid.data_size(8) == 10_000
    assert iid.basis_counts == {"alpha": 4, "beta": 4}  # the iid regime is Algorithm 1's N_Delta


def test_stream_must_be_a_bool():
    with pytest.raises(LearnerError, match="stream"):
        _learner(stream="false")


def test_checkpoint_config_keeps_stream():
    assert _learner().config["stream"] is True


@pytest.mark.slow
def test_prequential_on_a_stationary_stream_learns():
    x, y = random_data(1200, 2, 2)
    protocol = StreamProtocol(init_rows=200, chunk=100, warm_rows=300, steps_per_chunk=2)
    scores = {}
    for stream in (False, True):
        m = _learner(m_alpha=256, m_beta=16, n_columns=64, n_delta=16, stream=stream, n_data=1200, lr=0.01)
        scores[stream] = prequential(m, x, y, protocol, progress=False)[-1]["nmse_mean"]
    assert scores[True] < 0.5 * scores[False]
