"""ORTH / ORTHNAT (Salimbeni et al. 2018): natural steps against Appendix D, bases, bad input."""

from __future__ import annotations

import pytest
import torch
from learner_data import F64, random_data

from gpdyn.errors import InputError
from gpdyn.gp.orthdgp import ORTH, ORTHNAT

N, D, P, MB, MG = 50, 2, 2, 6, 10


def appendix_d_optimum(model, x, y):
    """ORTHDGP Appendix D: optimal S on beta and optimal a on alpha = {gamma, beta}."""
    zg, _ = model.basis("gamma")
    zb, _ = model.basis("beta")
    za = torch.cat([zg, zb], 1)
    noise = model.noise[:, None, None]
    k_a, k_ax = model.kern(za, za), model.kern(za, x)
    a = torch.linalg.solve(k_ax @ k_ax.transpose(-1, -2) / noise + k_a, (k_ax @ y.T.unsqueeze(-1)) / noise).squeeze(-1)
    k_b, k_bx = model.kern(zb, zb), model.kern(zb, x)
    s = k_b @ torch.linalg.solve(k_bx @ k_bx.transpose(-1, -2) / noise + k_b, k_b)
    return a[:, :MG], a[:, MG:], s, za, a


def _model(cls, **kw):
    x, y = random_data(N, D, P, seed=3)
    model = cls(D, P, m_gamma=MG, m_beta=MB, n_delta=MG, n_columns=None, n_data=N, scales="none", jitter=1e-12, **kw)
    model.observe(x, y)  # beta takes rows 0..5, gamma rows 6..15
    return model, x, y


@torch.no_grad()
def _opt_mean(model, x, y):
    _, _, _, za, a = appendix_d_optimum(model, x, y)
    return (model.kern(x, za) @ a.unsqueeze(-1)).squeeze(-1).T


def test_unit_natural_step_reaches_appendix_d_optimum():
    model, x, y = _model(ORTHNAT)
    with torch.no_grad():
        a_g, a_b, s_opt, _, _ = appendix_d_optimum(model, x, y)
        k_b, k_bg = model.kern_basis("beta"), model.kern_basis("beta", "gamma")
        # gamma at its optimum in orthogonal coordinates; beta anywhere (here: the prior)
        model.params["a_gamma"][:, :MG] = a_g
        m_b_opt = (k_b @ a_b.unsqueeze(-1) + k_bg @ a_g.unsqueeze(-1)).squeeze(-1)  # K_b a_b + K_bg a_g
    model.natural_step(x, y, tau=1.0)
    torch.testing.assert_close(model.params["S"].detach(), s_opt)  # eq. (15c): S in one step
    torch.testing.assert_close(model.params["m_beta"].detach(), m_b_opt)  # eq. (15b)
    torch.testing.assert_close(model.predict(x)[0], _opt_mean(model, x, y))


def test_appendix_d_optimum_is_stationary_for_orth():
    model, x, y = _model(ORTH)
    with torch.no_grad():
        a_g, a_b, s_opt, _, _ = appendix_d_optimum(model, x, y)
        k_b, k_bg = model.kern_basis("beta"), model.kern_basis("beta", "gamma")
        model.params["a_gamma"][:, :MG] = a_g
        model.params["a_beta"][:, :MB] = a_b + torch.linalg.solve(k_b, k_bg @ a_g.unsqueeze(-1)).squeeze(-1)
        model.params["L"][:, :MB, :MB] = torch.linalg.cholesky(s_opt)
    per_output = model.loss(x, y)
    loss = per_output.sum()
    grads = torch.autograd.grad(loss, [model.params["a_gamma"], model.params["a_beta"], model.params["L"]])
    for g in grads:
        assert g.abs().max() < 1e-7, g.abs().max()
    torch.testing.assert_close(model.predict(x)[0], _opt_mean(model, x, y))
    # and a perturbation lowers the bound: the optimum is a maximum, not any stationary point
    with torch.no_grad():
        model.params["a_gamma"][:, 0] += 0.1
    assert (model.loss(x, y) > per_output.detach()).all()


def test_hybrid_basis_is_the_same_family_reparametrised():
    orth, x, y = _model(ORTH)
    hyb, _, _ = _model(ORTH, basis="hybrid")
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        a_g = torch.randn(P, MG, generator=g, dtype=F64)
        a_h = torch.randn(P, MB, generator=g, dtype=F64)
        lo = torch.tril(torch.randn(P, MB, MB, generator=g, dtype=F64)) + 3 * torch.eye(MB, dtype=F64)
        k_b, k_bg = orth.kern_basis("beta"), orth.kern_basis("beta", "gamma")
        for m in (orth, hyb):
            m.params["a_gamma"][:] = a_g
            m.params["L"][:] = lo
        hyb.params["a_beta"][:] = a_h
        # ORTHDGP eq. (11) vs (10): a_b(orth) = a_b(hybrid) + K_b^{-1} K_bg a_g gives the same mean
        orth.params["a_beta"][:] = a_h + torch.linalg.solve(k_b, k_bg @ a_g.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(orth.predict(x)[0], hyb.predict(x)[0])
    torch.testing.assert_close(orth.vlb(x, y), hyb.vlb(x, y))


@pytest.mark.slow
def test_orthnat_diag_update_and_adam_learn():
    from learner_data import sinc_data

    x, y, xt, yt = sinc_data(200)
    for kw in ({"gamma_update": "diag"}, {}):
        model = ORTHNAT(1, 1, m_gamma=32, m_beta=4, n_delta=16, n_columns=16, n_data=200, lr=0.05, **kw)
        losses = []
        for i in range(60):
            idx = torch.arange(i * 50, i * 50 + 100) % 200
            model.observe(x[idx], y[idx])
            losses.append(float(model.step(x[idx], y[idx])["loss"]))
        assert sum(losses[-10:]) < sum(losses[:10])


def test_bad_configuration():
    with pytest.raises(InputError, match="basis"):
        ORTH(2, 1, basis="decoupled")
    with pytest.raises(InputError, match="m_beta"):
        ORTH(2, 1, m_beta=0)
    with pytest.raises(InputError, match="gamma_update"):
        ORTHNAT(2, 1, m_gamma=4, m_beta=2, gamma_update="exact")
    with pytest.raises(InputError, match="nat_lr"):
        ORTHNAT(2, 1, m_gamma=4, m_beta=2, nat_lr=2.0)


@pytest.mark.parametrize("basis", ["orth", "hybrid"])
def test_closed_form_natural_step_equals_autograd_natural_step(basis):
    """step() uses the closed-form gradients of eqs. (15b)-(15c); natural_step() takes them from autograd."""
    ref, x, y = _model(ORTHNAT, basis=basis)
    fast, _, _ = _model(ORTHNAT, basis=basis)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        a_g, m_b = torch.randn(P, MG, generator=g, dtype=F64), torch.randn(P, MB, generator=g, dtype=F64)
        for m in (ref, fast):  # away from the prior, so that every term of the step is active
            m.params["a_gamma"][:] = a_g
            m.params["m_beta"][:] = m_b
            m.params["log_ls"].add_(0.2)
    batch = slice(0, 20)  # a minibatch of 20 from N = 50: the data term is weighted by 2.5
    state = ref.state_dict()
    ref.natural_step(x[batch], y[batch], tau=0.4)
    fast.closed_form_step(x[batch], y[batch], tau=0.4)
    torch.testing.assert_close(fast.params["S"], ref.params["S"])
    torch.testing.assert_close(fast.params["m_beta"], ref.params["m_beta"])
    assert not ref.params["S"].requires_grad  # natural_step leaves S out of autograd again
    # inside step() the closed form reuses the bound's factorisations (before Adam moves anything)
    ref.load_state_dict(state)
    fast.load_state_dict(state)
    fast.step(x[batch], y[batch])
    ref.natural_step(x[batch], y[batch], tau=fast.nat_step_size())
    torch.testing.assert_close(fast.params["S"], ref.params["S"])
    torch.testing.assert_close(fast.params["m_beta"], ref.params["m_beta"])


@pytest.mark.parametrize("name", ["orth", "orthnat", "svi", "gpr"])
def test_orth_predictions_are_the_same_whether_outputs_share_features_or_not(name, monkeypatch):
    """Before any step, a model's outputs share hyperparameters and points: one kernel serves
    them all (features without the output axis, beta and gamma concatenated for the mean);
    mean, variance and the mean alone equal the per-output path's."""
    import gpdyn.gp.variational as variational
    from gpdyn.gp import make_learner
    from learner_data import random_data

    x, y = random_data(64, 3, 2, seed=5)
    sizes = {"orth": {"m_gamma": 16, "m_beta": 8}, "orthnat": {"m_gamma": 16, "m_beta": 8}, "svi": {"m": 12},
             "gpr": {"n_subset": 24}}[name]
    model = make_learner(name, 3, 2, n_delta=32, **sizes) if name != "gpr" else make_learner(name, 3, 2, **sizes)
    model.observe(x, y)
    with torch.no_grad():
        shared = (*model.predict(x), model.predict_mean(x))
    assert model._cache["fb"].dim() == 2 and model._cache["fm"].dim() == 2
    monkeypatch.setattr(variational, "same_across_outputs", lambda *t: False)
    model._cache = None
    with torch.no_grad():
        per_output = (*model.predict(x), model.predict_mean(x))
    assert model._cache["fm"].dim() == 3
    for got, want in zip(shared, per_output):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(shared[2], shared[0], rtol=1e-10, atol=1e-10)


def test_orth_mean_with_one_basis_shared_and_the_other_per_output():
    """Length scales shared, beta the same for every output but gamma not: the mean's
    concatenated features take the output axis, and the numbers stay predict's."""
    from gpdyn.gp import make_learner
    from learner_data import random_data

    x, y = random_data(64, 3, 2, seed=6)
    model = make_learner("orth", 3, 2, m_gamma=16, m_beta=8, n_delta=32)
    model.observe(x, y)
    with torch.no_grad():
        model.params["gamma_z"][1] += 0.05
        model.params["a_gamma"].normal_(generator=torch.Generator().manual_seed(1))
    model._cache = None
    with torch.no_grad():
        mean, _ = model.predict(x)
        got = model.predict_mean(x)
    assert model._cache["fb"].dim() == 2 and model._cache["fg"].dim() == 3 and model._cache["fm"].dim() == 3
    torch.testing.assert_close(got, mean, rtol=1e-10, atol=1e-10)
