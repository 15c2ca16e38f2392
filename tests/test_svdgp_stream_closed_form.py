"""svdgp-stream (gpdyn/gp/svdgp_stream.py) against the closed forms it computes recursively:
the maximiser of SVDGP's bound in ``a`` (the sparse GP mean on alpha) and in ``B`` (Titsias's
covariance on beta), after several chunks as after one batch; the decoupled variance; the
calibrated scale; a first batch smaller than the basis."""

from __future__ import annotations

import math

import pytest
import torch

from gpdyn.gp import LearnerError, make_learner

D, P = 3, 2


def data(n: int, seed: int = 0, noise: float = 0.05) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g, dtype=torch.float64)
    f = torch.stack([torch.sin(x @ torch.tensor([1.0, 0.5, -0.3], dtype=torch.float64)),
                     torch.cos(x[:, 0]) * x[:, 1]], dim=-1)
    return x, f + noise * torch.randn(n, P, generator=g, dtype=torch.float64)


def unit_kernel(a: torch.Tensor, b: torch.Tensor, ls: torch.Tensor) -> torch.Tensor:
    d = ((a[:, None, :] - b[None, :, :]) / ls).pow(2).sum(-1)
    return torch.exp(-0.5 * d)


def learner(**options):
    options = {"m_alpha": 60, "m_beta": 60, "features": 50, "select_iters": 3, "linear": 0.0, "calibrate_rows": 0,
               "reselect_every": 0, **options}
    return make_learner("svdgp-stream", D, P, dtype=torch.float64, seed=0, **options)


def sparse_gp(model, z: torch.Tensor, x: torch.Tensor, y: torch.Tensor, xs: torch.Tensor):
    """The sparse GP (SGPR, Titsias 2009) posterior mean and latent variance at ``xs`` with inducing
    points ``z``, the model's length scales, ``lam = s / rho^2`` and noises, from all rows at once."""
    ls, lam, jitter = model.lengthscale, model.lam, model.jitter
    kzz = unit_kernel(z, z, ls) + jitter * torch.eye(z.shape[0], dtype=torch.float64)
    kzx, ksz = unit_kernel(z, x, ls), unit_kernel(xs, z, ls)
    a = lam * kzz + kzx @ kzx.T
    mean = ksz @ torch.linalg.solve(a, kzx @ y)
    q = (ksz * torch.linalg.solve(kzz, ksz.T).T).sum(-1)
    quad = (ksz * torch.linalg.solve(a, ksz.T).T).sum(-1)
    var = quad[:, None] * model.noise + (1.0 - q).clamp_min(0.0)[:, None] * (model.noise / lam)
    return mean, var


def test_chunks_give_the_maximiser_of_the_bound_over_all_rows():
    x, y = data(400)
    model, unpredicted = learner(), learner()
    for a in range(0, 400, 100):  # the first batch selects and draws alpha; then three chunks
        chunk = x[a:a + 100]
        if a:  # the prequential rule: each chunk predicted first (observe reuses its k_1(x, alpha))
            model.predict(chunk)
        model.observe(chunk, y[a:a + 100])
        unpredicted.observe(chunk.clone(), y[a:a + 100])
    assert torch.allclose(model.gram, unpredicted.gram, rtol=0, atol=1e-12)
    xs, _ = data(50, seed=1)
    mean, var = model.predict(xs)
    ref_mean, ref_var = sparse_gp(model, model.basis, x, y, xs)
    assert torch.allclose(mean, ref_mean, atol=1e-5)  # K_alpha of 60 points is ill-conditioned: rounding
    assert torch.allclose(var, ref_var, atol=1e-7)
    # the bound's maximiser is a fit: far better than the prior mean
    assert float(((mean - data(50, seed=1, noise=0.0)[1]) ** 2).mean()) < 0.05


def test_decoupled_variance_is_the_sparse_gp_on_beta_and_the_mean_stays_on_alpha():
    x, y = data(300)
    full, decoupled = learner(), learner(m_beta=15)
    for model in (full, decoupled):
        model.observe(x[:100], y[:100])
        model.observe(x[100:], y[100:])
    xs, _ = data(40, seed=2)
    mean, var = decoupled.predict(xs)
    assert torch.equal(decoupled.basis, full.basis)
    assert torch.allclose(mean, full.predict(xs)[0], atol=1e-10)
    _, ref_var = sparse_gp(decoupled, decoupled.basis[:15], x, y, xs)
    assert torch.allclose(var, ref_var, atol=1e-7)
    assert bool((var >= full.predict(xs)[1] - 1e-9).all())  # fewer inducing points: never more certain


def test_linear_features_fit_a_linear_function_far_outside_the_basis():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(300, D, generator=g, dtype=torch.float64)
    w = torch.tensor([[1.0, -2.0], [0.5, 0.3], [-1.0, 1.5]], dtype=torch.float64)
    y = x @ w + 0.3
    far = 6.0 + torch.randn(20, D, generator=g, dtype=torch.float64)  # no basis point near
    with_linear, without = learner(linear=1.0), learner(linear=0.0)
    for model in (with_linear, without):
        model.observe(x[:150], y[:150])
        model.observe(x[150:], y[150:])
    err = lambda model: float(((model.predict_mean(far) - (far @ w + 0.3)) ** 2).mean())  # noqa: E731
    assert err(with_linear) < 1e-2 * err(without)


def test_calibrated_scale_follows_the_errors_of_the_predictions_before_each_chunk():
    x, y = data(600, noise=0.05)
    model = learner(calibrate_rows=200)
    model.observe(x[:200], y[:200])
    xc = x[200:300]
    yc = y[200:300] + 0.5 * torch.randn(100, P, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    mean, var = model.predict(xc)
    noise = model.noise_variance()
    ratio = ((yc - mean) ** 2 / (var + noise)).mean(0)
    keep = math.exp(-100 / 200)
    model.observe(xc, yc)
    assert torch.allclose(model.variance_scale, keep + (1 - keep) * ratio)
    assert bool((model.variance_scale > 5).all())  # the chunk's errors are ten times the noise
    assert torch.allclose(model.noise_variance(), model.noise * model.variance_scale)
    # the same update when the rows were not the ones just predicted (a copy: predicted again)
    twin = learner(calibrate_rows=200)
    twin.observe(x[:200], y[:200])
    twin.observe(xc.clone(), yc)
    assert torch.allclose(twin.variance_scale, model.variance_scale)


def test_a_first_batch_smaller_than_the_basis_becomes_the_basis():
    x, y = data(200)
    model = learner(m_alpha=60, m_beta=40)
    model.observe(x[:25], y[:25])
    assert model.basis.shape == (25, D) and model.gram.shape == (25, 25) and model.beta_size == 25
    model.observe(x[25:], y[25:])
    mean, var = model.predict(x[:10])
    assert mean.shape == (10, P) and bool(torch.isfinite(var).all())
    twin = learner(m_alpha=60, m_beta=40)
    twin.load_state_dict(model.state_dict())
    assert torch.equal(twin.predict(x[:10])[0], mean)


@pytest.mark.parametrize("reselect_growth, rows", [(0.0, [200, 300, 400, 500, 600, 700, 800]), (0.5, [200, 400, 800])])
def test_reselection_follows_the_rows_since_the_last_one_against_all_rows(reselect_growth, rows):
    """After ``reselect_every`` rows, then whenever the rows since the last selection reach
    ``reselect_growth`` of all rows seen: at rows that double for 0.5, every 100 rows for 0."""
    x, y = data(800)
    model = learner(reselect_every=100, reselect_growth=reselect_growth)
    model.observe(x[:100], y[:100])
    seen = []
    for a in range(100, 800, 50):
        before = model.selection["reselections"]
        model.observe(x[a:a + 50], y[a:a + 50])
        if model.selection["reselections"] > before:
            seen.append(model.rows)
    assert seen == rows


@pytest.mark.parametrize("options, match", [
    ({"m_beta": 80}, "m_beta"), ({"m_alpha": 0}, "m_alpha"), ({"linear": -1.0}, "linear"),
    ({"calibrate_rows": -1}, "calibrate_rows"), ({"jitter": 0.0}, "jitter"), ({"reselect_growth": -0.1}, "reselect_growth"),
    ({"replace_after": -1}, "replace_after"), ({"replace_every": 1.5}, "replace_every")])
def test_bad_options_are_refused_by_name(options, match):
    with pytest.raises(LearnerError, match=match):
        learner(**options)


def test_alpha_grows_by_the_rows_far_from_it_and_stays_the_sparse_gp_of_all_rows():
    """A stream that moves to a region far from its first rows: the novel rows of the chunk join
    alpha before the chunk enters the sums, and with the old rows 40 length scales away (their
    kernel with the new points is exp(-800) = 0) the learner is exactly the sparse GP with the
    grown alpha over every row. (A point that joins alpha near rows already summed is where the
    projection of the past is an approximation: not tested here.)"""
    x_a, y_a = data(150, seed=5)
    x_b, y_b = data(150, seed=6)
    x_b = x_b + 40.0
    model = learner(m_alpha=60, m_beta=60, grow_to=150, novelty=0.5)
    model.observe(x_a[:100], y_a[:100])
    model.observe(x_a[100:], y_a[100:])
    assert model.basis_size == 60  # rows near alpha add nothing
    model.observe(x_b, y_b)
    assert 60 < model.basis_size <= 150 and bool(((model.basis[60:] - 40.0).abs() < 10).all())
    x, y = torch.cat([x_a, x_b]), torch.cat([y_a, y_b])
    xs = torch.cat([data(20, seed=7)[0], data(20, seed=8)[0] + 40.0])
    mean, var = model.predict(xs)
    assert torch.allclose(mean, sparse_gp(model, model.basis, x, y, xs)[0], atol=1e-5)
    # beta stays alpha's first points: in the far region the variance is near the prior's
    assert torch.allclose(var, sparse_gp(model, model.basis[:60], x, y, xs)[1], atol=1e-7)
    # the far region is learnt, not left at the prior mean
    truth = torch.cat([data(20, seed=7, noise=0.0)[1], data(20, seed=8, noise=0.0)[1]])
    assert float(((mean[20:] - truth[20:]) ** 2).mean()) < 0.05
    twin = learner(m_alpha=60, m_beta=60, grow_to=150, novelty=0.5)
    twin.load_state_dict(model.state_dict())
    assert torch.equal(twin.predict(xs)[0], mean)


def test_growth_options_are_checked():
    with pytest.raises(LearnerError, match="grow_to"):
        learner(m_alpha=60, grow_to=50)
    with pytest.raises(LearnerError, match="novelty"):
        learner(novelty=0.0)


def test_a_full_alpha_drops_the_points_the_stream_has_left_exactly():
    """Three regions 40 length scales apart, one after the other: A fills alpha's first points,
    B (one chunk) grows it to its cap, and C finds it full. A's points beyond beta have not been visited for
    longer than ``replace_after`` rows, so C's novel rows replace them; dropping a point is exact
    and every new point is far from the summed rows, so the learner is the sparse GP of its
    alpha of now over every row seen (A's rows included)."""
    x_a, y_a = data(100, seed=9)
    x_b, y_b = data(150, seed=10)
    x_c, y_c = data(100, seed=11)
    x_b, x_c = x_b + 40.0, x_c - 40.0
    model = learner(m_alpha=60, m_beta=20, grow_to=65, novelty=0.5, replace_after=100, replace_every=50)
    model.observe(x_a, y_a)
    model.observe(x_b, y_b)  # one chunk: B's points join before any of B's rows is summed
    assert model.basis_size == 65  # full: 60 of A, 5 of B
    beta = model.basis[:20].clone()
    model.observe(x_c[:5], y_c[:5])  # five novel rows: room for five, so most of A's points stay (after dropped ones)
    near = lambda points, shift: ((points - shift).abs() < 10).all(-1)  # noqa: E731
    assert model.basis_size <= 65 and int(near(model.basis, -40.0).sum()) > 0  # C's points joined
    assert torch.equal(model.basis[:20], beta)  # beta is never dropped
    assert 55 <= int(near(model.basis, 0.0).sum()) < 60 and int(near(model.basis, 40.0).sum()) == 5  # A's points went
    x, y = torch.cat([x_a, x_b, x_c[:5]]), torch.cat([y_a, y_b, y_c[:5]])
    xs = torch.cat([data(20, seed=12)[0], data(20, seed=13)[0] + 40.0, data(20, seed=14)[0] - 40.0])
    mean, var = model.predict(xs)
    assert torch.allclose(mean, sparse_gp(model, model.basis, x, y, xs)[0], atol=1e-5)
    assert torch.allclose(var, sparse_gp(model, model.basis[:20], x, y, xs)[1], atol=1e-7)
    twin = learner(m_alpha=60, m_beta=20, grow_to=65, novelty=0.5, replace_after=100, replace_every=50)
    twin.load_state_dict(model.state_dict())
    assert torch.equal(twin.predict(xs)[0], mean) and torch.equal(twin.visited, model.visited)


def test_rows_observed_one_at_a_time_give_the_posterior_of_a_fresh_factor():
    """A control loop's one row per observe goes into the posterior by Woodbury's identity on the last
    factor of A (up to WOODBURY_ROWS rows, then a fresh factor): the same mean, variance and evidence as
    a factor made afresh after every row; a stream's chunk is factorised afresh."""
    import copy

    from gpdyn.gp.svdgp_stream import WOODBURY_ROWS, StreamSVDGP

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1200, 4, generator=gen, dtype=torch.float64)
    y = torch.stack([torch.sin(x[:, 0]) + x[:, 1] * x[:, 2], x[:, 3] ** 2], -1)
    y = y + 0.05 * torch.randn(1200, 2, generator=gen, dtype=torch.float64)
    held = torch.randn(40, 4, generator=gen, dtype=torch.float64)
    woodbury = StreamSVDGP(4, 2, m_alpha=128, m_beta=32, features=100, dtype=torch.float64, seed=0)
    woodbury.observe(x[:1024], y[:1024])
    fresh = copy.deepcopy(woodbury)
    used = 0
    for row in range(1024, 1024 + 2 * WOODBURY_ROWS + 5):
        woodbury.observe(x[row : row + 1], y[row : row + 1])
        mean, var = woodbury.predict(held)
        used = max(used, woodbury._base["new"].shape[1])
        fresh.observe(x[row : row + 1], y[row : row + 1])
        fresh._base = fresh._cache = None  # factorise A afresh
        torch.testing.assert_close(mean, fresh.predict(held)[0], rtol=1e-7, atol=1e-8)
        torch.testing.assert_close(var, fresh.predict(held)[1], rtol=1e-7, atol=1e-10)
        torch.testing.assert_close(woodbury.log_evidence(), fresh.log_evidence(), rtol=1e-8, atol=1e-6)
    assert used == WOODBURY_ROWS  # the rows did go in by Woodbury, up to the bound
    woodbury.observe(x[1100:1100 + 256], y[1100:1100 + 256])
    assert woodbury._base is None  # a chunk: a fresh factor at the next prediction
