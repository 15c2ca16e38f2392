"""Coupled baselines of SVDGP Table 1: SVI, iVSGPR, VSGPR, GPR."""

from __future__ import annotations

import pytest
import torch
from learner_data import F64, random_data

from gpdyn.errors import InputError
from gpdyn.gp.baselines import GPR, IVSGPR, SVI, VSGPR
from gpdyn.gp.orthdgp import coupled_optimum

N, D, P, M = 60, 2, 2, 8


def test_svi_unit_natural_step_reaches_the_optimal_coupled_posterior():
    x, y = random_data(N, D, P)
    model = SVI(D, P, m=M, n_delta=M, n_data=N, scales="none", jitter=1e-12)
    model.observe(x, y)
    model.natural_step(x, y, tau=1.0)
    with torch.no_grad():
        k = model.kern_basis("beta")
        a, s = coupled_optimum(k, model.kern_data(x, "beta").transpose(-1, -2), y.T, model.noise, jitter=0.0)
        # Titsias (2009) independently: m = s^-2 K (K + s^-2 Kzx Kxz)^-1 Kzx y
        k_zx = model.kern_data(x, "beta").transpose(-1, -2)
        mid = k + k_zx @ k_zx.transpose(-1, -2) / model.noise[:, None, None]
        m_titsias = (k @ torch.linalg.solve(mid, k_zx @ y.T.unsqueeze(-1))).squeeze(-1) / model.noise[:, None]
    torch.testing.assert_close(model.params["m_beta"].detach(), m_titsias)
    torch.testing.assert_close(model.params["m_beta"].detach(), (k @ a.unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(model.params["S"].detach(), s)
    # the optimum is stationary: a second unit step stays there
    before = model.params["S"].detach().clone()
    model.natural_step(x, y, tau=1.0)
    torch.testing.assert_close(model.params["S"].detach(), before)


def test_ivsgpr_closed_form_mirror_step_equals_svi_autograd_natural_step():
    x, y = random_data(N, D, P, seed=1)
    svi = SVI(D, P, m=M, n_delta=M, n_data=500, scales="basis", jitter=1e-12)
    ivs = IVSGPR(D, P, m=M, n_delta=M, n_data=500, scales="basis", jitter=1e-12)
    for model in (svi, ivs):
        model.observe(x, y)
    ivs.load_state_dict({**svi.state_dict(), "name": "ivsgpr"})
    batch = slice(0, 20)  # a minibatch: both weight it by N / N_m = 25
    svi.natural_step(x[batch], y[batch], tau=0.3)  # gradients by autograd, eqs. (15b)-(15c)
    ivs.mirror_update(x[batch], y[batch], tau=0.3)  # closed form, no gradients
    torch.testing.assert_close(ivs.params["S"], svi.params["S"])
    torch.testing.assert_close(ivs.params["m_beta"], svi.params["m_beta"])


def test_vsgpr_collapsed_bound_equals_uncollapsed_bound_at_the_optimal_q():
    x, y = random_data(N, D, P, seed=2)
    model = VSGPR(D, P, m=M, n_subset=N, n_delta=M, jitter=1e-12)
    model.observe(x, y)
    model.step(x, y)  # one Adam step, then q is set to its optimum for the subset
    collapsed = model.loss(x, y).detach()
    torch.testing.assert_close(-model.vlb(x, y), collapsed)


def test_gpr_is_the_exact_gp():
    x, y = random_data(40, D, P, seed=4)
    model = GPR(D, P, n_subset=30, jitter=1e-12)
    model.observe(x, y)  # keeps the first 30 points
    model.step(x, y)
    xs, ys = x[:30], y[:30]
    with torch.no_grad():
        k = model.kern(xs, xs) + model.noise[:, None, None] * torch.eye(30, dtype=F64)
        mvn = torch.distributions.MultivariateNormal(torch.zeros(P, 30, dtype=F64), covariance_matrix=k)
        torch.testing.assert_close(-model.loss(x, y) * 30, mvn.log_prob(ys.T))
        k_star = model.kern(x[30:], xs)
        mean = (k_star @ torch.linalg.solve(k, ys.T.unsqueeze(-1))).squeeze(-1).T
        var = (model.amplitude[:, None] - (k_star * torch.linalg.solve(k, k_star.transpose(-1, -2)).transpose(-1, -2)).sum(-1)).T
    got_mean, got_var = model.predict(x[30:])
    torch.testing.assert_close(got_mean, mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_var, var, rtol=1e-5, atol=1e-6)


def test_bad_configuration():
    with pytest.raises(InputError, match="n_subset"):
        GPR(2, 1, n_subset=0)
    with pytest.raises(InputError, match="m_beta"):
        SVI(2, 1, m=0)
