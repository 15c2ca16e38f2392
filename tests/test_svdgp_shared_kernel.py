"""SVDGP with ``shared_kernel=True``: one SE-ARD kernel (length scales) and one set of bases
alpha, beta for every output, each output with its own a, L, amplitude and noise.

The reference is a one-output SVDGP per output, given the tied length scales and bases and
that output's own parameters: its prediction goes through the per-output features (the
amplitude inside the kernel), the shared model's through one unit-amplitude kernel with the
amplitudes folded into a and W (SVDGP eq. (8), module docs of gpdyn.gp.svdgp)."""

from __future__ import annotations

import pytest
import torch
from learner_data import F64, random_data

from gpdyn.gp import LearnerError, make_learner
from gpdyn.gp.online import load_learner, save_learner
from gpdyn.gp.svdgp import SVDGP

D, P = 3, 4


def _trained(scales: str = "basis", steps: int = 6, jacobi: bool = True, seed: int = 0) -> tuple[SVDGP, torch.Tensor, torch.Tensor]:
    """A shared-kernel SVDGP after Algorithm 1's observe/step rounds, its outputs then given
    clearly different amplitudes, noises and coefficients (as a longer training leaves them)."""
    x, y = random_data(120, D, P, seed=seed)
    y = y * torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=F64)  # outputs of different scales
    model = SVDGP(D, P, m_alpha=40, m_beta=12, n_delta=8, n_columns=None, scales=scales, jacobi=jacobi, lr=0.05,
                  shared_kernel=True, seed=seed, dtype=F64)
    for i in range(steps):
        lo = (i * 20) % 120
        model.observe(x[lo : lo + 20], y[lo : lo + 20])
        model.step(x, y)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.params["log_amp"].add_(torch.linspace(-0.7, 0.9, P, dtype=F64))
        model.params["log_noise"].add_(torch.linspace(-0.5, 0.3, P, dtype=F64))
        model.params["a"].add_(0.3 * torch.randn(model.params["a"].shape, generator=g, dtype=F64))
        model.params["L"].add_(0.1 * torch.randn(model.params["L"].shape, generator=g, dtype=F64))
    model._cache = None
    return model, x, y


def _reference(model: SVDGP, p: int) -> SVDGP:
    """A one-output SVDGP (the paper's per-output model) holding output ``p`` of ``model``."""
    ref = SVDGP(D, 1, m_alpha=model.capacity["alpha"], m_beta=model.capacity["beta"], n_columns=None,
                scales=model.scales, jacobi=model.jacobi, dtype=F64)
    with torch.no_grad():
        for key, value in ref.params.items():
            src = model.params[key]
            # the tied tensors have one row; the per-output ones are indexed by the output
            value.copy_(src[:1] if src.shape[0] == 1 else src[p : p + 1])
    ref.counts = dict(model.counts)
    ref.initialized, ref.n_seen = True, model.n_seen
    return ref


@pytest.mark.parametrize("scales", ["basis", "dim", "none"])
@pytest.mark.parametrize("jacobi", [True, False])
@pytest.mark.slow
def test_predictions_equal_the_per_output_reference(scales, jacobi):
    model, x, y = _trained(scales, jacobi=jacobi)
    assert model.params["log_ls"].shape == (1, D) and model.params["alpha_z"].shape[0] == 1
    assert not torch.allclose(model.amplitude[0], model.amplitude[-1])  # the fold has work to do
    xt = torch.randn(2, 7, D, generator=torch.Generator().manual_seed(5), dtype=F64)  # any leading shape
    mean, var = model.predict(xt)
    mean_only = model.predict_mean(xt)
    assert mean.shape == var.shape == mean_only.shape == (2, 7, P)
    vlb = model.vlb(x, y)
    for p in range(P):
        ref = _reference(model, p)
        rm, rv = ref.predict(xt)
        torch.testing.assert_close(mean[..., p], rm[..., 0], rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(var[..., p], rv[..., 0], rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(mean_only[..., p], rm[..., 0], rtol=1e-9, atol=1e-11)
        # the training path (the bound through the [P, ...] views) agrees too
        torch.testing.assert_close(vlb[p], ref.vlb(x, y[:, p : p + 1])[0], rtol=1e-9, atol=1e-11)


def test_one_kernel_serves_every_output_after_training():
    """The prediction features stay one ``[M, R]`` set whatever the amplitudes: the shared path."""
    model, x, _ = _trained()
    cache = model.prepare()
    assert cache["ls"].shape == (1, D)
    assert cache["fa"].dim() == 2 and cache["fb"].dim() == 2
    # a per-output model given distinct length scales (as training does) has per-output features
    per_output = SVDGP(D, P, m_alpha=40, m_beta=12, n_delta=8, dtype=F64)
    per_output.observe(x[:40], x[:40, :1].expand(-1, P))
    with torch.no_grad():
        per_output.params["log_ls"].add_(torch.linspace(-0.1, 0.1, P, dtype=F64)[:, None])
    assert per_output.prepare()["fa"].dim() == 3


def test_lengthscales_and_bases_stay_tied_and_get_the_summed_gradient():
    model, x, y = _trained(steps=3)
    refs = [_reference(model, p) for p in range(P)]
    for key in ("log_ls", "alpha_z", "alpha_logc", "beta_z", "beta_logc"):
        assert model.params[key].shape[0] == 1, key
    # one step's gradient of the tied tensors is the sum of the outputs' (SVDGP eq. (5) summed)
    model.optimizer.zero_grad(set_to_none=True)
    model.loss(x, y).sum().backward()
    for key in ("log_ls", "alpha_z", "beta_logc"):
        total = torch.zeros_like(model.params[key])
        for p, ref in enumerate(refs):
            ref.params[key].grad = None
            ref.loss(x, y[:, p : p + 1]).sum().backward()
            total += ref.params[key].grad
            ref.params[key].grad = None
        torch.testing.assert_close(model.params[key].grad, total, rtol=1e-8, atol=1e-12)
        assert total.abs().sum() > 0, key
    before = model.params["log_ls"].detach().clone()
    for _ in range(3):
        model.observe(x[:8], y[:8])
        model.step(x, y)
    assert model.params["log_ls"].shape == (1, D)
    assert not torch.equal(before, model.params["log_ls"].detach())  # it learns
    ls = model.lengthscale
    assert ls.shape == (P, D) and torch.equal(ls, ls[:1].expand(P, D))
    z, c = model.basis("alpha")
    assert z.shape[0] == P and torch.equal(z, z[:1].expand_as(z)) and torch.equal(c, c[:1].expand_as(c))


def test_online_bases_fill_once_for_all_outputs():
    model = SVDGP(D, P, m_alpha=20, m_beta=6, n_delta=5, shared_kernel=True, dtype=F64)
    x, y = random_data(30, D, P)
    model.observe(x[:10], y[:10])
    model.observe(x[10:20], y[10:20])
    assert model.basis_counts == {"alpha": 10, "beta": 6}
    torch.testing.assert_close(model.params["alpha_z"][0, :10], torch.cat([x[:5], x[10:15]]))
    # each output's new covariance directions start at B = I / sigma_p^2 (module docs)
    _, lo = model.coefficients()
    b = lo @ lo.transpose(-1, -2)
    torch.testing.assert_close(b.diagonal(dim1=-2, dim2=-1), (1.0 / model.noise)[:, None].expand(P, 6).detach())


def test_state_round_trip(tmp_path):
    model, x, y = _trained()
    xt = x[:9]
    twin = make_learner("svdgp", D, P, dtype=F64, **{k: v for k, v in model.config.items()
                                                      if k not in ("input_dim", "output_dim")})
    twin.load_state_dict(model.state_dict())
    torch.testing.assert_close(twin.predict(xt), model.predict(xt), rtol=0, atol=0)
    # both go on identically (Adam state, counters and the generator included)
    for m in (model, twin):
        m.observe(x[20:28], y[20:28])
        m.step(x, y)
    torch.testing.assert_close(twin.predict(xt), model.predict(xt), rtol=0, atol=0)
    # a checkpoint rebuilds the shared-kernel layout from the config
    path = save_learner(model, tmp_path / "svdgp.pt")
    loaded, _ = load_learner(path, dtype=F64)
    assert loaded.config["shared_kernel"] is True and loaded.params["log_ls"].shape == (1, D)
    torch.testing.assert_close(loaded.predict_mean(xt), model.predict_mean(xt), rtol=0, atol=0)


def test_a_per_output_state_does_not_load_into_a_shared_model():
    x, y = random_data(30, D, P)
    per_output = SVDGP(D, P, m_alpha=10, m_beta=4, n_delta=5, dtype=F64)
    per_output.observe(x, y)
    shared = SVDGP(D, P, m_alpha=10, m_beta=4, n_delta=5, shared_kernel=True, dtype=F64)
    with pytest.raises(LearnerError, match=r"log_ls: shape \(4, 3\), expected \(1, 3\)"):
        shared.load_state_dict(per_output.state_dict())


def test_default_is_the_per_output_model():
    model = make_learner("svdgp", D, P, preset="small", dtype=F64)
    assert model.config["shared_kernel"] is False and model.params["log_ls"].shape == (P, D)
    assert model.params["alpha_z"].shape[0] == P


def test_bad_config_is_a_clear_error():
    with pytest.raises(LearnerError, match="shared_kernel must be True or False, got 'true'"):
        make_learner("svdgp", D, P, preset="small", shared_kernel="true")
    with pytest.raises(LearnerError, match="shared_kernel must be True or False, got 1"):
        SVDGP(D, P, m_alpha=10, m_beta=4, shared_kernel=1)
    # the option is SVDGP's: the other learners refuse it by name
    with pytest.raises(LearnerError, match="learner 'orthnat' has no option 'shared_kernel'"):
        make_learner("orthnat", D, P, preset="small", shared_kernel=True)


def test_column_sampled_loss_equals_the_references_on_the_same_columns():
    """A step's bound (SVDGP Section 3.4: a^T K_alpha a from sampled columns) per output equals
    the one-output model's on the same draw of columns."""
    model, x, y = _trained()
    model.n_columns = 10  # of 40 basis functions
    refs = [_reference(model, p) for p in range(P)]
    state = model.generator.get_state()
    loss = model.loss(x, y)
    for p, ref in enumerate(refs):
        ref.n_columns = 10
        ref.generator.set_state(state)
        torch.testing.assert_close(loss[p], ref.loss(x, y[:, p : p + 1])[0], rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("k", [None, 1, D])
def test_shared_kernel_matmul_is_the_kernel_times_every_vector(k):
    """Against gen_se_ard: value and gradients, in one block and in checkpointed blocks."""
    from gpdyn.gp.kernels import gen_se_ard, shared_kernel_matmul

    g = torch.Generator().manual_seed(3)
    n, m = 7, 11
    leaves = {"x1": torch.randn(n, D, generator=g, dtype=F64), "x2": torch.randn(m, D, generator=g, dtype=F64),
              "ls": torch.rand(1, D, generator=g, dtype=F64) + 0.5, "v": torch.randn(P, m, generator=g, dtype=F64)}
    if k is not None:
        leaves["c1"] = torch.rand(n, k, generator=g, dtype=F64) + 0.5
        leaves["c2"] = torch.rand(m, k, generator=g, dtype=F64) + 0.5
    leaves = {name: t.requires_grad_() for name, t in leaves.items()}
    c1, c2 = leaves.get("c1"), leaves.get("c2")
    one = torch.ones(1, dtype=F64)
    want = (gen_se_ard(leaves["x1"][None], leaves["x2"][None], leaves["ls"], one,
                       None if c1 is None else c1[None], None if c2 is None else c2[None])[0] @ leaves["v"].T).T
    w = torch.randn(P, n, generator=g, dtype=F64)
    want_grads = torch.autograd.grad((w * want).sum(), list(leaves.values()))
    for chunk in (10**6, 2 * n):  # one block; blocks of two columns (recomputed in backward)
        got = shared_kernel_matmul(leaves["x1"], leaves["x2"], leaves["ls"], leaves["v"], c1, c2, chunk_elements=chunk)
        torch.testing.assert_close(got, want)
        grads = torch.autograd.grad((w * got).sum(), list(leaves.values()))
        for name, a, b in zip(leaves, grads, want_grads):
            torch.testing.assert_close(a, b, msg=lambda text, name=name: f"{name}: {text}")
