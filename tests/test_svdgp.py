"""SVDGP (Cheng & Boots 2017): bound identities, KRR limit, gradients, a covariance that learns,
starting length scales on an ordered stream, kernels, bad input."""

from __future__ import annotations

import pytest
import torch
from learner_data import F64, random_data, sinc_data

from gpdyn.errors import InputError
from gpdyn.gp.hyperparams import InitWindow
from gpdyn.gp.kernels import gen_se_ard, matmul_few_columns, median_lengthscale, se_ard
from gpdyn.gp.orthdgp import ORTH
from gpdyn.gp.svdgp import SVDGP


def brute_gen_se_ard(x1, x2, s, amp, c1, c2):
    l1 = s[:, None, None, :] * c1[:, :, None, :]
    l2 = s[:, None, None, :] * c2[:, None, :, :]
    tot = l1**2 + l2**2
    return amp[:, None, None] * ((2 * l1 * l2 / tot).sqrt() * torch.exp(-((x1[:, :, None] - x2[:, None]) ** 2) / tot)).prod(-1)


@pytest.mark.parametrize("k", [1, 3])
def test_generalized_se_ard_is_eq_15(k):
    g = torch.Generator().manual_seed(1)
    p, n, m, d = 2, 5, 4, 3
    x1, x2 = torch.randn(p, n, d, generator=g, dtype=F64), torch.randn(p, m, d, generator=g, dtype=F64)
    s, amp = torch.rand(p, d, generator=g, dtype=F64) + 0.5, torch.rand(p, generator=g, dtype=F64) + 0.5
    c1, c2 = torch.rand(p, n, k, generator=g, dtype=F64) + 0.3, torch.rand(p, m, k, generator=g, dtype=F64) + 0.3
    e1, e2, o1, o2 = c1.expand(p, n, d), c2.expand(p, m, d), torch.ones(p, n, d, dtype=F64), torch.ones(p, m, d, dtype=F64)
    torch.testing.assert_close(gen_se_ard(x1, x2, s, amp, c1, c2), brute_gen_se_ard(x1, x2, s, amp, e1, e2))
    torch.testing.assert_close(gen_se_ard(x1, x2, s, amp, None, c2), brute_gen_se_ard(x1, x2, s, amp, o1, e2))
    torch.testing.assert_close(gen_se_ard(x1, x2, s, amp, c1, None), brute_gen_se_ard(x1, x2, s, amp, e1, o2))
    # c = 1 is the SE-ARD prior (SVDGP Appendix B.1)
    torch.testing.assert_close(gen_se_ard(x1, x2, s, amp, torch.ones_like(c1), torch.ones_like(c2)), se_ard(x1, x2, s, amp))


def _fitted_svdgp(m_alpha: int, m_beta: int, **kw) -> tuple[SVDGP, torch.Tensor, torch.Tensor]:
    x, y = random_data(40, 2, 2)
    model = SVDGP(2, 2, m_alpha=m_alpha, m_beta=m_beta, n_delta=max(m_alpha, m_beta, 1), n_data=40, **kw)
    model.observe(x, y)
    return model, x, y


def svgp_bound(k_zz, k_zx, kxx_diag, m, s, y, noise):
    """Hensman et al. (2013) coupled bound, written independently: sum E log p - KL(N(m,S) || N(0,K))."""
    k_inv = torch.linalg.inv(k_zz)
    mean = (k_zx.transpose(-1, -2) @ k_inv @ m.unsqueeze(-1)).squeeze(-1)
    proj = k_inv @ (k_zz - s) @ k_inv
    var = kxx_diag - (k_zx * (proj @ k_zx)).sum(-2)
    r = y.T - mean
    ell = (-0.5 * torch.log(2 * torch.pi * noise)[:, None] - 0.5 * (r**2 + var) / noise[:, None]).sum(-1)
    mm = k_zz.shape[-1]
    kl = 0.5 * (
        torch.diagonal(k_inv @ s, dim1=-2, dim2=-1).sum(-1)
        + (m.unsqueeze(-2) @ k_inv @ m.unsqueeze(-1)).squeeze((-1, -2))
        - mm
        + torch.logdet(k_zz)
        - torch.logdet(s)
    )
    return ell - kl


def test_bound_equals_coupled_svgp_when_alpha_equals_beta():
    torch.manual_seed(0)
    model, x, y = _fitted_svdgp(6, 6, scales="none", jacobi=False, n_columns=None)
    with torch.no_grad():
        model.params["alpha_z"].copy_(model.params["beta_z"])  # alpha = beta = Z
        model.params["a"].normal_()
        model.params["L"].copy_(torch.tril(0.5 * torch.randn(2, 6, 6, dtype=F64)))
        k = model.kern_basis("beta")
        a, lo = model.coefficients()
        b = lo @ lo.transpose(-1, -2)
        m = (k @ a.unsqueeze(-1)).squeeze(-1)  # SVDGP eq. (6): m~ = K a
        s = torch.linalg.inv(torch.linalg.inv(k) + b)  # S~ = K - K (B^-1 + K)^-1 K
        expected = svgp_bound(k, model.kern_data(x, "beta").transpose(-1, -2), model.amplitude[:, None].expand(2, 40), m, s, y, model.noise)
        torch.testing.assert_close(model.vlb(x, y) * x.shape[0], expected)
        # the same posterior in ORTH's coupled coordinates (gamma empty) gives the same bound
        orth = ORTH(2, 2, m_gamma=0, m_beta=6, n_delta=6, scales="none", jitter=0.0, n_data=40)
        orth.observe(x, y)
        for key in ("log_ls", "log_amp", "log_noise", "beta_z"):
            orth.params[key].copy_(model.params[key])
        orth.params["a_beta"][:, :6] = a
        orth.params["L"][:, :6, :6] = torch.linalg.cholesky(s)
        torch.testing.assert_close(orth.vlb(x, y), model.vlb(x, y))


def test_no_beta_gives_kernel_ridge_regression():
    x, y = random_data(30, 2, 3, seed=2)
    model = SVDGP(2, 3, m_alpha=30, m_beta=0, n_delta=30, n_columns=None, n_data=30, scales="none")
    model.observe(x, y)  # alpha = X
    a0 = model.params["a"]
    loss = lambda a: (-(model.expected_loglik(x, y, {"a": a / model.amplitude[:, None]})).mean(-1) + model.kl(False, {"a": a / model.amplitude[:, None]}) / 30).sum()  # noqa: E731
    # the bound is quadratic in a: one Newton step from zero lands on its maximiser
    grad = torch.autograd.functional.jacobian(loss, a0.detach())
    hess = torch.autograd.functional.hessian(loss, a0.detach()).reshape(90, 90)
    a_opt = (-torch.linalg.solve(hess, grad.reshape(-1))).reshape(3, 30) / model.amplitude.detach()[:, None]
    with torch.no_grad():
        k = model.kern(x, x)
        krr = torch.linalg.solve(k + model.noise[:, None, None] * torch.eye(30, dtype=F64), y.T.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(a_opt, krr)
    # and the prior covariance: M_beta = 0 leaves s(x) = k(x, x)
    _, var = model.predict(x)
    torch.testing.assert_close(var, model.amplitude.detach().expand(30, 3))


def test_kl_gradients_match_proposition_2():
    model, _, _ = _fitted_svdgp(7, 5, scales="basis", jacobi=False, n_columns=None)
    with torch.no_grad():
        model.params["a"].normal_(generator=torch.Generator().manual_seed(3))
        model.params["L"].copy_(torch.tril(0.3 * torch.randn(2, 5, 5, generator=torch.Generator().manual_seed(4), dtype=F64)))
        model.params["alpha_logc"].uniform_(-0.3, 0.3)
    model.kl(False).sum().backward()
    with torch.no_grad():
        a, lo = model.coefficients()
        k_a, k_b = model.kern_basis("alpha"), model.kern_basis("beta")
        b = lo @ lo.transpose(-1, -2)
        eye = torch.eye(5, dtype=F64)
        grad_b = 0.5 * torch.linalg.inv(eye + k_b @ b) @ k_b @ b @ k_b @ torch.linalg.inv(eye + b @ k_b)
        torch.testing.assert_close(model.params["a"].grad, (k_a @ a.unsqueeze(-1)).squeeze(-1))  # grad_a KL = K_alpha a
        torch.testing.assert_close(model.params["L"].grad, torch.tril(2 * grad_b @ lo))  # grad_L = 2 grad_B L


@pytest.mark.slow
def test_column_sampled_kl_is_unbiased():
    model, _, _ = _fitted_svdgp(40, 4, n_columns=8)
    with torch.no_grad():
        model.params["a"].normal_(generator=torch.Generator().manual_seed(5))
        a, _ = model.coefficients()
        exact = model.quadratic("alpha", a, None)
        draws = torch.stack([model.quadratic("alpha", a, 8) for _ in range(3000)])
    err = (draws.mean(0) - exact).abs()
    assert (err < 4 * draws.std(0) / 3000**0.5).all(), (draws.mean(0), exact)
    assert (draws.std(0) > 0).all()  # it really samples


def test_covariance_starts_off_the_saddle_at_l_zero():
    model, x, y = _fitted_svdgp(16, 6, n_columns=None)
    _, lo = model.coefficients()
    # each new beta direction starts at B = L L^T = I / sigma^2 (with or without Jacobi)
    eye = torch.eye(6, dtype=F64)
    torch.testing.assert_close(lo @ lo.transpose(-1, -2), eye / model.noise.detach()[:, None, None])
    model.loss(x, y).sum().backward()
    assert (model.params["L"].grad[:, :6, :6].diagonal(dim1=-2, dim2=-1).abs() > 1e-8).all()
    # L = 0 is a saddle: grad_L = 2 grad_B L (Appendix A.1.2) vanishes there, so it never moves
    with torch.no_grad():
        model.params["L"].zero_()
    model.params["L"].grad = None
    model.loss(x, y).sum().backward()
    assert torch.count_nonzero(model.params["L"].grad) == 0


@pytest.mark.slow
def test_variance_learns_small_at_the_data_and_stays_the_prior_far_away():
    x, y, _, _ = sinc_data(200, noise=0.1)
    model = SVDGP(1, 1, m_alpha=64, m_beta=16, n_delta=8, n_columns=None, lr=0.1)
    g = torch.Generator().manual_seed(0)
    for _ in range(150):
        idx = torch.randint(200, (64,), generator=g)
        model.observe(x[idx], y[idx])
        model.step(x[idx], y[idx])
    assert model.params["L"].abs().max() > 0
    with torch.no_grad():
        _, var_data = model.predict(x)
        _, var_far = model.predict(torch.tensor([[-40.0], [40.0]], dtype=F64))  # ~30 length scales out
    torch.testing.assert_close(var_far, model.amplitude.detach().expand(2, 1))
    assert var_data.max() < 0.25 * var_far.min(), (var_data.max(), var_far)
    # the variance no longer drags the amplitude down to the noise level (sin(x)/x has variance ~0.05)
    assert model.amplitude.item() > model.noise.item()


def _smooth_stream(n: int, d: int, rate: float = 1000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` consecutive rows of a smooth ``d``-dimensional trajectory sampled at ``rate`` Hz."""
    t = torch.arange(n, dtype=F64)[:, None] / rate
    x = torch.sin(2 * torch.pi * (0.2 + 0.1 * torch.arange(d, dtype=F64)) * t + torch.arange(d, dtype=F64))
    y = torch.stack([torch.sin(x @ torch.linspace(-1, 1, d, dtype=F64)), torch.cos(x[:, :2].sum(-1))], -1)
    return x, y


@pytest.mark.slow
def test_ordered_stream_from_scratch_learns_with_the_init_window():
    x, y = _smooth_stream(2048, 8)
    # 16 consecutive rows span 16 ms: their median trick is ~100x below the data's
    assert (median_lengthscale(x[:16]) < 0.05 * median_lengthscale(x)).all()
    test = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))[:300]
    errors = {}
    for window in (0, 1024):
        model = SVDGP(8, 2, m_alpha=128, m_beta=16, n_delta=1, n_columns=None, lr=0.1, init_window=window, n_data=len(x))
        g = torch.Generator().manual_seed(2)
        for i in range(0, len(x), 16):  # observe in time order; steps on rows seen so far
            model.observe(x[i : i + 16], y[i : i + 16])
            idx = torch.randint(i + 16, (64,), generator=g)
            model.step(x[idx], y[idx])
        with torch.no_grad():
            mean, _ = model.predict(x[test])
        errors[window] = ((mean - y[test]) ** 2).mean(0) / y[test].var(0)
        if window:  # never below the median trick on the first 1024 rows
            assert (model.lengthscale >= median_lengthscale(x[:1024]) * (1 - 1e-12)).all()
    assert (errors[1024] < 0.1).all(), errors
    assert (errors[0] > 1).all(), errors  # from the first batch alone it is stuck


def test_init_window_estimates_at_each_doubling_and_when_full():
    x, _ = _smooth_stream(300, 3)
    window = InitWindow(100, 3, device=torch.device("cpu"), dtype=F64)
    torch.testing.assert_close(window.start(x[:10]), median_lengthscale(x[:10]))
    assert window.add(x[10:19]) is None  # 19 rows < 2 x 10
    torch.testing.assert_close(window.add(x[19:25]), median_lengthscale(x[:25]))
    assert window.add(x[25:49]) is None
    torch.testing.assert_close(window.add(x[49:150]), median_lengthscale(x[:100]))  # full: the first 100 rows
    assert window.full and window.add(x[150:]) is None
    big = InitWindow(100, 3, device=torch.device("cpu"), dtype=F64)
    torch.testing.assert_close(big.start(x[:200]), median_lengthscale(x[:200]))  # a first batch wider than it
    assert big.full and big.add(x[200:]) is None
    with pytest.raises(InputError, match="start"):
        InitWindow(10, 3, device=torch.device("cpu"), dtype=F64).add(x[:5])
    # a learner widens, never narrows: a length scale its optimiser made wider is kept
    model = SVDGP(3, 1, m_alpha=8, m_beta=2, n_delta=1, init_window=100)
    model.observe(x[:10], torch.zeros(10, 1, dtype=F64))
    with torch.no_grad():
        model.params["log_ls"][0, 0] = 5.0
    model.observe(x[10:25], torch.zeros(15, 1, dtype=F64))
    ls = model.lengthscale.detach()[0]
    assert ls[0] == torch.exp(torch.tensor(5.0, dtype=F64))
    torch.testing.assert_close(ls[1:], median_lengthscale(x[:25])[1:])


def test_predict_batch_shapes_dtype_and_no_grad():
    model, x, y = _fitted_svdgp(16, 4)
    model.step(x, y)
    with torch.no_grad():
        mean, var = model.predict(x.reshape(4, 10, 2))
    assert mean.shape == var.shape == (4, 10, 2)
    flat_mean, _ = model.predict(x)
    torch.testing.assert_close(mean.reshape(40, 2), flat_mean)
    assert (var > 0).all()
    m32 = SVDGP(2, 2, m_alpha=16, m_beta=4, dtype=torch.float32, n_delta=16)
    m32.observe(x.float(), y.float())
    m32.step(x.float(), y.float())
    assert m32.predict(x.float())[0].dtype == torch.float32


def test_bad_input_is_reported():
    model, x, y = _fitted_svdgp(8, 2)
    bad = x.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(InputError, match="NaN"):
        model.observe(bad, y)
    with pytest.raises(InputError, match="NaN"):
        model.step(bad, y)
    with pytest.raises(InputError, match="columns"):
        model.predict(torch.zeros(5, 3, dtype=F64))
    with pytest.raises(InputError, match="shape"):
        model.step(x, y[:, :1])
    with pytest.raises(InputError, match="float32"):
        model.predict(x.float())
    with pytest.raises(InputError, match="m_alpha"):
        SVDGP(2, 2, m_alpha=0)
    with pytest.raises(InputError, match="scales"):
        SVDGP(2, 2, scales="per-point")
    with pytest.raises(InputError, match="init_window"):
        SVDGP(2, 2, init_window=-1)
    with pytest.raises(InputError, match="jacobi"):
        SVDGP(2, 2, jacobi="false")
    with pytest.raises(InputError, match="observe"):
        SVDGP(2, 2, m_alpha=4).step(x, y)


# -- chunked kernel products with hand-written backward (gpdyn.gp.kernels) ------------------
def _kernel_inputs(case, n, m, seed=0):
    g = torch.Generator().manual_seed(seed)
    p, d = 2, 3
    k = d if "dim" in case else 1
    x1 = torch.randn(p, n, d, generator=g, dtype=F64).requires_grad_()
    x2 = torch.randn(p, m, d, generator=g, dtype=F64).requires_grad_()
    ls = (torch.rand(p, d, generator=g, dtype=F64) + 0.5).requires_grad_()
    amp = (torch.rand(p, generator=g, dtype=F64) + 0.5).requires_grad_()
    c1 = (torch.rand(p, n, k, generator=g, dtype=F64) + 0.3).requires_grad_() if case.startswith("both") else None
    c2 = (torch.rand(p, m, k, generator=g, dtype=F64) + 0.3).requires_grad_() if case != "none" else None
    return x1, x2, ls, amp, c1, c2


@pytest.mark.parametrize("case", ["none", "point-basis", "point-dim", "both-basis", "both-dim"])
def test_kernel_matvec_and_quadratic_match_autograd_of_the_dense_kernel(case):
    from gpdyn.gp.kernels import kernel_matvec, kernel_quadratic

    for n, m in ((5, 7), (9, 4)):  # both orders: the quadratic swaps to chunk over the larger set
        x1, x2, ls, amp, c1, c2 = _kernel_inputs(case, n, m)
        g = torch.Generator().manual_seed(1)
        v = torch.randn(2, m, generator=g, dtype=F64).requires_grad_()
        w = torch.randn(2, n, generator=g, dtype=F64).requires_grad_()
        out_g = torch.randn(2, n, generator=g, dtype=F64)
        inputs = [t for t in (x1, x2, ls, amp, v, w, c1, c2) if t is not None]
        for chunk in (2 * n * 2, 10**9):  # several column blocks, and one
            mv = kernel_matvec(x1, x2, ls, amp, v, c1, c2, chunk_elements=chunk)
            ref = (gen_se_ard(x1, x2, ls, amp, c1, c2) @ v.unsqueeze(-1)).squeeze(-1)
            torch.testing.assert_close(mv, ref)
            got = torch.autograd.grad((mv * out_g).sum(), inputs, allow_unused=True)
            want = torch.autograd.grad((ref * out_g).sum(), inputs, allow_unused=True)
            for a, b in zip(got, want):
                if b is not None:
                    torch.testing.assert_close(a, b)
            quad = kernel_quadratic(x1, x2, ls, amp, w, v, c1, c2, chunk_elements=chunk)
            ref = (gen_se_ard(x1, x2, ls, amp, c1, c2) @ v.unsqueeze(-1)).squeeze(-1)
            torch.testing.assert_close(quad, (w * ref).sum(-1))
            got = torch.autograd.grad((quad * torch.tensor([0.7, -1.3], dtype=F64)).sum(), inputs)
            want = torch.autograd.grad(((w * ref).sum(-1) * torch.tensor([0.7, -1.3], dtype=F64)).sum(), inputs)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b)


def test_hand_written_backwards_pass_gradcheck():
    from gpdyn.gp.kernels import _ExpMatvec, _PairMatvec, _PairQuadratic

    g = torch.Generator().manual_seed(2)
    a = torch.randn(2, 4, 3, generator=g, dtype=F64).requires_grad_()
    b = (0.3 * torch.randn(2, 6, 3, generator=g, dtype=F64)).requires_grad_()
    v = torch.randn(2, 6, generator=g, dtype=F64).requires_grad_()
    w = torch.randn(2, 4, generator=g, dtype=F64).requires_grad_()
    t1 = (torch.rand(2, 4, generator=g, dtype=F64) + 0.2).requires_grad_()
    t2 = (torch.rand(2, 6, generator=g, dtype=F64) + 0.2).requires_grad_()
    e1 = torch.randn(2, 4, generator=g, dtype=F64).requires_grad_()
    e2 = torch.randn(2, 6, generator=g, dtype=F64).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b, v: _ExpMatvec.apply(a, b, v, 4), (a, b, v))
    assert torch.autograd.gradcheck(lambda *t: _PairMatvec.apply(*t, 1.5, 4), (a, b, t1, t2, e1, e2, v))
    assert torch.autograd.gradcheck(lambda *t: _PairQuadratic.apply(*t, 1.5, 4), (a, b, t1, t2, e1, e2, v, w))


def test_svdgp_step_is_the_same_with_any_chunk_size(monkeypatch):
    import gpdyn.gp.kernels as kernels

    losses, params = [], []
    for chunk in (64, kernels.CHUNK_ELEMENTS):
        defaults = {f: (*kernels.__dict__[f].__defaults__[:-1], chunk) for f in ("kernel_matvec", "kernel_quadratic", "exp_matvec")}
        for f, dflt in defaults.items():
            monkeypatch.setattr(kernels.__dict__[f], "__defaults__", dflt)
        model, x, y = _fitted_svdgp(24, 4, n_columns=8)
        with torch.no_grad():
            model.params["alpha_logc"].uniform_(-0.3, 0.3, generator=torch.Generator().manual_seed(6))
        losses.append(model.step(x, y)["loss"])
        params.append({k: v.detach().clone() for k, v in model.params.items()})
        params[-1]["pred"] = model.predict(x)[0]
    torch.testing.assert_close(losses[0], losses[1])
    for key in params[0]:
        torch.testing.assert_close(params[0][key], params[1][key])


def test_exp2_matvec_is_the_kernel_times_a_vector_in_any_blocks():
    """The prediction path (base-2 features, blocks of rows and columns, one kernel for every
    output when the features carry no output axis) equals the autograd path to rounding."""
    from gpdyn.gp.kernels import basis_features, exp2_matvec, exp_matvec, input_features

    g = torch.Generator().manual_seed(3)
    p, n, m, d = 3, 37, 53, 4
    x = torch.randn(n, d, generator=g, dtype=F64)
    z = torch.randn(p, m, d, generator=g, dtype=F64)
    ls = torch.rand(p, d, generator=g, dtype=F64) + 0.5
    amp = torch.rand(p, generator=g, dtype=F64) + 0.5
    vec = torch.randn(p, m, generator=g, dtype=F64)
    for c in (None, torch.rand(p, m, 1, generator=g, dtype=F64) + 0.5, torch.rand(p, m, d, generator=g, dtype=F64) + 0.5):
        per_dim = c is not None and c.shape[-1] > 1
        u = input_features(x, ls, per_dim)
        want = exp_matvec(u, basis_features(z, c, ls, amp), vec)
        for block, cols in ((10**6, 10**6), (50, 7), (1, 1)):
            got = exp2_matvec(u, basis_features(z, c, ls, amp, base2=True), vec, block, cols)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12 * float(want.abs().max()))
        # shared features: output 0's kernel for every vector
        c0 = None if c is None else c[:1]
        shared = exp2_matvec(input_features(x, ls[:1], per_dim)[0], basis_features(z[:1], c0, ls[:1], amp[:1], base2=True)[0],
                             vec, 50, 7)
        per_output = exp_matvec(input_features(x, ls[:1], per_dim).expand(p, -1, -1),
                                basis_features(z[:1], c0, ls[:1], amp[:1]).expand(p, -1, -1), vec)
        torch.testing.assert_close(shared, per_output, rtol=1e-12, atol=1e-12 * float(per_output.abs().max()))


def test_predictions_are_the_same_whether_outputs_share_features_or_not(monkeypatch):
    """A model whose outputs have equal hyperparameters and bases (a fresh one) keeps one set
    of features, one kernel for all outputs; its predictions equal the per-output path's."""
    import gpdyn.gp.variational as variational
    from gpdyn.gp import make_learner
    from learner_data import random_data

    x, y = random_data(64, 3, 2, seed=5)
    model = make_learner("svdgp", 3, 2, m_alpha=32, m_beta=8, n_delta=32)
    model.observe(x, y)
    with torch.no_grad():
        shared = (*model.predict(x), model.predict_mean(x))
    assert model._cache["fa"].dim() == 2 and model._cache["fb"].dim() == 2 and model._cache["ls"].shape[0] == 1
    monkeypatch.setattr(variational, "same_across_outputs", lambda *t: False)
    model._cache = None
    with torch.no_grad():
        per_output = (*model.predict(x), model.predict_mean(x))
    assert model._cache["fa"].dim() == 3 and model._cache["ls"].shape[0] == 2
    for got, want in zip(shared, per_output):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # outputs that differ are never merged
    monkeypatch.undo()
    with torch.no_grad():
        model.params["log_ls"][1] += 0.1
    model._cache = None
    with torch.no_grad():
        model.predict(x)
    assert model._cache["fa"].dim() == 3 and model._cache["ls"].shape[0] == 2



@pytest.mark.parametrize(("left", "right"), [((7, 30, 30), (7, 30)), ((30, 30), (30,)), ((1, 3, 30), (7, 30))])
@pytest.mark.parametrize("columns", [1, 2, 16, 17])
def test_matmul_few_columns_is_the_product(left: tuple[int, ...], right: tuple[int, ...], columns: int) -> None:
    """Batched, unbatched and broadcast (WISKI's shared interpolation rows against per-output blocks)."""
    g = torch.Generator().manual_seed(columns)
    a = torch.randn(*left, generator=g, dtype=torch.float64)
    b = torch.randn(*right, columns, generator=g, dtype=torch.float64)
    torch.testing.assert_close(matmul_few_columns(a, b), a @ b, rtol=1e-12, atol=1e-12)
