"""The residual learners: a frozen prior plus a GP on its residuals."""

from __future__ import annotations

import pytest
import torch

from gpdyn.errors import InputError
from gpdyn.gp import make_learner
from gpdyn.gp.residual import LinearKernelGP, ResidualGP


def test_residual_gp_adapts_to_a_changed_function_at_once() -> None:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, 3, generator=gen, dtype=torch.float64)

    def f(z: torch.Tensor) -> torch.Tensor:
        return torch.stack([z.sin().sum(-1), z.cos().sum(-1)], -1)

    prior = make_learner("exact", 3, 2, max_points=500)
    prior.observe(x, f(x))
    t = torch.linspace(0, 3, 60, dtype=torch.float64)
    path = torch.stack([t.sin(), t.cos(), 0.3 * t], -1)

    def changed(z: torch.Tensor) -> torch.Tensor:  # the plant change: an offset and a slope
        return f(z) + 1.0 + 0.5 * z[:, :1]

    res = ResidualGP(prior, x, window=20, amplitude=1.0)
    errors = []
    for i in range(len(t) - 1):
        xi = path[i : i + 1]
        res.observe(xi, changed(xi))
        res.step(xi, changed(xi))
        nxt = path[i + 1 : i + 2]
        errors.append(float((res.predict(nxt)[0] - changed(nxt)).abs().max()))
    prior_error = float((prior.predict(path)[0] - changed(path)).abs().max(-1).values.mean())
    assert prior_error > 0.5 and max(errors[5:]) < 0.05 * prior_error
    assert res.residual.n <= 20 and res.observed == len(t) - 1  # the window rebuilt itself
    twin = ResidualGP(make_learner("exact", 3, 2, max_points=500), x, window=20, amplitude=1.0)
    twin.load_state_dict(res.state_dict())
    torch.testing.assert_close(twin.predict(path)[0], res.predict(path)[0])
    for bad in ({"window": 2}, {"noise": 0.0}, {"lengthscale_factor": [1.0, 2.0]}):
        with pytest.raises(InputError, match="ResidualGP"):
            ResidualGP(prior, x, **bad)


def test_gated_residual_gp_uses_the_residual_only_where_it_predicts_better() -> None:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(200, 3, generator=gen, dtype=torch.float64)
    prior = make_learner("exact", 3, 2, max_points=500)
    prior.observe(x, torch.zeros(200, 2, dtype=torch.float64))  # the prior predicts 0 for both outputs
    t = torch.linspace(0, 6, 120, dtype=torch.float64)
    path = torch.stack([t.sin(), t.cos(), 0.1 * t], -1)
    # output 0 changed smoothly (a residual the GP can learn); output 1 is white noise around
    # the prior (a residual the GP can only overfit)
    targets = torch.stack([1.0 + 0.5 * path[:, 0], 0.3 * torch.randn(len(t), generator=gen, dtype=torch.float64)], -1)
    res = ResidualGP(prior, x, window=400, amplitude=1.0, noise=1e-4, gated=True, refit_iters=0)
    plain = ResidualGP(prior, x, window=400, amplitude=1.0, noise=1e-4, refit_iters=0)
    assert res.gate().tolist() == [False, False]  # nothing seen: the prior alone
    for i in range(len(t)):
        for model in (res, plain):
            model.observe(path[i : i + 1], targets[i : i + 1])
    assert res.gate().tolist() == [True, False]
    assert res.diagnostics()["residual_outputs"] == 1.0
    probe = path[:1] + 0.05
    gated_mean, plain_mean = res.predict(probe)[0], plain.predict(probe)[0]
    torch.testing.assert_close(gated_mean[:, 0], plain_mean[:, 0])  # the learnt output keeps its residual
    torch.testing.assert_close(gated_mean[:, 1], prior.predict(probe)[0][:, 1])  # the noise output does not
    twin = ResidualGP(make_learner("exact", 3, 2, max_points=500), x, window=400, amplitude=1.0, noise=1e-4, gated=True)
    twin.load_state_dict(res.state_dict())
    assert twin.gate().tolist() == [True, False]
    with pytest.raises(InputError, match="gate_decay"):
        ResidualGP(prior, x, gated=True, gate_decay=1.0)
    with pytest.raises(InputError, match="gate_z"):
        ResidualGP(prior, x, gated=True, gate_z=-1.0)


def test_residual_gate_asks_for_evidence() -> None:
    """gate_z = 0 compares the two averaged squared errors; gate_z > 0 keeps the residual out
    until its improvement is that many standard errors above zero."""
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(200, 3, generator=gen, dtype=torch.float64)
    prior = make_learner("exact", 3, 2, max_points=500)
    prior.observe(x, torch.zeros(200, 2, dtype=torch.float64))
    t = torch.linspace(0, 6, 120, dtype=torch.float64)
    path = torch.stack([t.sin(), t.cos(), 0.1 * t], -1)
    targets = torch.stack([1.0 + 0.5 * path[:, 0], 0.3 * torch.randn(len(t), generator=gen, dtype=torch.float64)], -1)
    plain = ResidualGP(prior, x, window=400, amplitude=1.0, noise=1e-4, gated=True, refit_iters=0)
    strict = ResidualGP(prior, x, window=400, amplitude=1.0, noise=1e-4, gated=True, gate_z=2.0, refit_iters=0)
    averages = torch.zeros(2, 2, dtype=torch.float64)  # [prior alone, with residual] x output
    for i in range(len(t)):
        r_pred = plain.residual.predict(path[i : i + 1])[0][0] if plain.residual.n else torch.zeros(2, dtype=torch.float64)
        averages = 0.98 * averages + 0.02 * torch.stack([targets[i].pow(2), (targets[i] - r_pred).pow(2)])
        for model in (plain, strict):
            model.observe(path[i : i + 1], targets[i : i + 1])
        assert plain.gate().tolist() == (averages[1] < averages[0]).tolist()
        if i < 2:
            assert strict.gate().tolist() == [False, False]  # two samples are no evidence
    assert strict.gate().tolist() == [True, False]


def test_linear_residual_gp_learns_how_the_plant_answers_the_action() -> None:
    """A weakened actuator is a gain on one action column: the linear kernel over the action
    learns it from on-policy samples and predicts actions the policy never took."""
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(2)

    def plant(z: torch.Tensor, gain: float) -> torch.Tensor:  # inputs [state (2), action (2)]
        return torch.stack([z[:, 0].sin() + gain * z[:, 2], z[:, 1].cos() + z[:, 3]], -1)

    x = torch.randn(400, 4, generator=gen, dtype=torch.float64)
    prior = make_learner("exact", 4, 2, max_points=500)
    prior.set_hyperparameters(lengthscale=2.0, amplitude=4.0, noise=1e-4)  # a close fit of the nominal plant
    prior.observe(x, plant(x, 1.0))
    states = torch.randn(160, 2, generator=gen, dtype=torch.float64)
    on_policy = torch.cat([states, torch.tanh(2 * states)], -1)  # the action follows the state
    res = ResidualGP(prior, x, window=100, noise=1e-4, kernel="linear", linear_inputs=[2, 3])
    for i in range(len(on_policy)):
        res.observe(on_policy[i : i + 1], plant(on_policy[i : i + 1], 0.3))
    assert res.residual.n == 100 and res.observed == 160  # a sliding window
    # the posterior mean is ridge regression on [1, action] over the window
    phi = torch.cat([torch.ones(100, 1, dtype=torch.float64), on_policy[-100:, 2:]], -1)
    r = plant(on_policy[-100:], 0.3) - prior.predict(on_policy[-100:])[0]
    ridge = torch.linalg.solve(phi.T @ phi + 1e-4 * torch.eye(3, dtype=torch.float64), phi.T @ r)
    torch.testing.assert_close(res.residual.predict(on_policy[:5])[0], on_policy[:5].new_ones(5, 1).mul(ridge[0])
                               + on_policy[:5, 2:] @ ridge[1:])
    off_policy = torch.cat([torch.randn(50, 2, generator=gen, dtype=torch.float64),
                            2 * torch.rand(50, 2, generator=gen, dtype=torch.float64) - 1], -1)
    prior_error = (prior.predict(off_policy)[0] - plant(off_policy, 0.3)).abs().mean()
    online_error = (res.predict(off_policy)[0] - plant(off_policy, 0.3)).abs().mean()
    assert prior_error > 0.1 and online_error < 0.05 * prior_error
    assert (res.residual.predict(off_policy)[1] > 0).all()
    twin = ResidualGP(prior, x, window=100, noise=1e-4, kernel="linear", linear_inputs=[2, 3])
    twin.load_state_dict(res.state_dict())
    torch.testing.assert_close(twin.predict(off_policy), res.predict(off_policy))
    for bad in ({"kernel": "nope"}, {"kernel": "linear"}, {"kernel": "linear", "linear_inputs": [4]},
                {"kernel": "linear", "linear_inputs": [2], "forget": 0.0}):
        with pytest.raises(InputError, match="ResidualGP"):
            ResidualGP(prior, x, **bad)


def test_linear_kernel_gp_forgetting_is_weighted_bayesian_linear_regression() -> None:
    gen = torch.Generator().manual_seed(4)
    x, y = torch.randn(30, 3, generator=gen, dtype=torch.float64), torch.randn(30, 2, generator=gen, dtype=torch.float64)
    gp = LinearKernelGP(2, [1, 2], window=20, noise=0.5, prior_var=2.0, forget=0.9,
                        device=torch.device("cpu"), dtype=torch.float64)
    for i in range(30):
        gp.observe(x[i : i + 1], y[i : i + 1])
    phi = torch.cat([torch.ones(20, 1, dtype=torch.float64), x[-20:, 1:]], -1)  # the window: the last 20
    w = 0.9 ** torch.arange(19, -1, -1, dtype=torch.float64) / 0.5  # weight / noise, newest last
    precision = phi.T @ (w[:, None] * phi) + torch.eye(3, dtype=torch.float64) / 2.0
    mean_weights = torch.linalg.solve(precision, phi.T @ (w[:, None] * y[-20:]))
    probe = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    probe_phi = torch.cat([torch.ones(4, 1, dtype=torch.float64), probe[:, 1:]], -1)
    mean, var = gp.predict(probe)
    torch.testing.assert_close(mean, probe_phi @ mean_weights)
    torch.testing.assert_close(var[:, 0], (probe_phi @ torch.linalg.solve(precision, probe_phi.T)).diagonal())


@pytest.mark.parametrize("kernel", ["se", "linear"])
def test_residual_checkpoint_rebuilds_its_prior_from_name_and_config(kernel: str, tmp_path) -> None:
    from gpdyn.gp.online import load_learner, save_learner

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(200, 3, generator=gen, dtype=torch.float64)
    y = torch.stack([x.sin().sum(-1), x.cos().sum(-1)], -1)
    prior = make_learner("svdgp", 3, 2, preset="small", rows=64, seed=2)
    for lo in range(0, 120, 40):
        prior.observe(x[lo : lo + 40], y[lo : lo + 40])
        prior.step(x[lo : lo + 40], y[lo : lo + 40])
    path = save_learner(prior, tmp_path / "prior.pt")
    # the prior by checkpoint path, as `--size residual.prior=PATH` gives it
    res = make_learner("residual", 3, 2, prior=str(path), reference_x=x, window=30, gated=True, refit_every=3,
                       refit_iters=2, kernel=kernel, linear_inputs=[1, 2])
    assert res.config["prior"]["learner"] == "svdgp" and res.config["prior"]["config"]["m_alpha"] == 64
    changed = y + 0.5 + 0.2 * x[:, :1]
    for i in range(120, 160):  # past the window: the SE residual rebuilds itself
        res.observe(x[i : i + 1], changed[i : i + 1])
        res.step(x[i : i + 1], changed[i : i + 1])
    restored, _ = load_learner(save_learner(res, tmp_path / "residual.pt"))
    assert type(restored.prior) is type(prior) and restored.prior.config == prior.config
    for got, want in zip(restored.predict(x[160:]), res.predict(x[160:])):
        assert torch.equal(got, want)
    for model in (res, restored):
        for i in range(160, 170):
            model.observe(x[i : i + 1], changed[i : i + 1])
            model.step(x[i : i + 1], changed[i : i + 1])
    for got, want in zip(restored.predict(x[170:]), res.predict(x[170:])):
        assert torch.equal(got, want)
    assert restored.gate().tolist() == res.gate().tolist()


def test_residual_without_a_prior_is_a_window_gp_on_y() -> None:
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(30, 3, generator=gen, dtype=torch.float64)
    y = torch.stack([x[:, 0], -x[:, 1]], -1)
    res = make_learner("residual", 3, 2, window=50, refit_iters=0, amplitude=1.0)
    res.observe(x, y)
    gp = make_learner("exact", 3, 2, max_points=50, learn_hyperparameters=False)
    gp.set_hyperparameters(**res.hyper)
    gp.observe(x, y)
    torch.testing.assert_close(res.predict(x[:5]), gp.predict(x[:5]), rtol=0, atol=0)
    assert res.config["prior"] is None
    with pytest.raises(InputError, match="prior must be"):
        make_learner("residual", 3, 2, prior=3.5)
    with pytest.raises(InputError, match="maps 3 -> 2"):
        make_learner("residual", 4, 2, prior=make_learner("exact", 3, 2))


@pytest.mark.parametrize("options", [{}, {"gated": True}, {"kernel": "linear", "linear_inputs": [0, 2]}])
def test_residual_predict_mean_is_prior_mean_plus_residual_mean(options) -> None:
    """``predict_mean`` goes through the prior's and the residual's mean-only paths and equals
    ``predict``'s mean, with or without the gate and for either residual kernel."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(90, 3, generator=g, dtype=torch.float64)
    y = torch.sin(x[:, :2]) + 0.05 * torch.randn(90, 2, generator=g, dtype=torch.float64)
    prior = make_learner("svdgp", 3, 2, m_alpha=32, m_beta=8, n_delta=32)
    prior.observe(x[:40], y[:40])
    learner = make_learner("residual", 3, 2, prior=prior, reference_x=x[:40], window=60, **options)
    xt = torch.randn(3, 5, 3, generator=g, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(learner.predict_mean(xt), prior.predict_mean(xt))  # nothing observed yet
    for lo in range(40, 90, 10):
        learner.observe(x[lo : lo + 10], y[lo : lo + 10] + 0.3)
    with torch.no_grad():
        mean, _ = learner.predict(xt)
        got = learner.predict_mean(xt)
    torch.testing.assert_close(got, mean, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(got, prior.predict_mean(xt))  # the residual is in


def test_residual_step_refits_on_its_samples_without_predicting_the_batch(monkeypatch) -> None:
    """The SE residual's step refits on the samples it holds every refit_every steps and reads no
    batch: ResidualGP.step makes no prior prediction over the batch it is given, and the refit
    is the one the residual GP makes on its own (float64)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(120, 3, generator=gen, dtype=torch.float64)
    y = torch.stack([x.sin().sum(-1), x.cos().sum(-1)], -1)
    prior = make_learner("exact", 3, 2, max_points=200)
    prior.observe(x[:60], y[:60])
    res = ResidualGP(prior, x, window=100, amplitude=1.0, refit_every=5, refit_iters=3)
    twin = ResidualGP(make_learner("exact", 3, 2, max_points=200), x, window=100, amplitude=1.0, refit_every=5,
                      refit_iters=3)
    twin.load_state_dict(res.state_dict())
    prior_calls = []
    real = prior.predict_mean
    monkeypatch.setattr(prior, "predict_mean", lambda z: prior_calls.append(z.shape[0]) or real(z))
    refits = []
    for i in range(60, 72):
        xi, yi = x[i : i + 1], y[i : i + 1] + 0.3
        res.observe(xi, yi)
        twin.observe(xi, yi)
        before = len(prior_calls)
        refits.append(res.step(x[50 : i + 1], y[50 : i + 1] + 0.3)["refit"])
        assert len(prior_calls) == before  # no prior prediction over the batch
        twin.residual.step(xi, yi - twin.prior.predict_mean(xi))  # the residual's own step on its residuals
    assert refits.count(1.0) == 2
    for name, value in twin.residual.hp.as_dict().items():
        torch.testing.assert_close(res.residual.hp.as_dict()[name], value, rtol=0, atol=0)
    torch.testing.assert_close(res.predict(x[:20]), twin.predict(x[:20]), rtol=0, atol=0)


def test_observe_takes_the_prior_mean_of_the_transition_just_predicted(monkeypatch) -> None:
    """A controller predicts a transition (its log), then learns from it: observe takes the prior
    mean of that predict instead of predicting again, and conditions on the same residual as a
    learner that never predicted; other rows are predicted afresh."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(80, 3, generator=gen, dtype=torch.float64)
    y = torch.stack([x.sin().sum(-1), x.cos().sum(-1)], -1)
    prior = make_learner("svdgp", 3, 2, preset="small", seed=0)
    prior.observe(x[:60], y[:60])
    prior.step(x[:60], y[:60])
    res, twin = ResidualGP(prior, x, amplitude=1.0), ResidualGP(prior, x, amplitude=1.0)
    calls = []
    real = prior.predict_mean
    monkeypatch.setattr(prior, "predict_mean", lambda z: calls.append(z.shape[0]) or real(z))
    for i in range(60, 70):
        xi, yi = x[i : i + 1], y[i : i + 1] + 0.2
        res.predict(xi.clone())
        before = len(calls)
        res.observe(xi, yi)
        assert len(calls) == before  # the remembered prior mean
        twin.observe(xi, yi)
    res.observe(x[70:72], y[70:72])  # rows not just predicted
    twin.observe(x[70:72], y[70:72])
    assert calls[-2:] == [2, 2]
    torch.testing.assert_close(res.residual.targets, twin.residual.targets, rtol=0, atol=0)
    # equal to rounding: the learner that predicted grew its cached factor inverse block by block as rows came,
    # the twin's is solved afresh
    torch.testing.assert_close(res.predict(x[:5]), twin.predict(x[:5]), rtol=1e-12, atol=1e-15)


def test_online_updater_steps_on_the_most_recent_rows_in_order() -> None:
    """OnlineUpdater keeps its recent rows stacked: each step gets the last `batch` transitions,
    oldest first, whatever the sizes of the chunks observed (one row, several, more than a batch)."""
    from gpdyn.gp.base import Learner
    from gpdyn.gp.training import OnlineUpdater

    class Recorder(Learner):
        name = "recorder"
        initialized = True

        def __init__(self) -> None:
            super().__init__(2, 1)
            self.batches: list[tuple[torch.Tensor, torch.Tensor]] = []

        def observe(self, x, y) -> None:
            pass

        def step(self, x, y):
            self.batches.append((x.clone(), y.clone()))
            return {}

        def predict(self, x):
            return x[..., :1], x[..., :1]

        def vlb(self, x, y):
            return x.new_zeros(1)

        def noise_variance(self):
            return torch.ones(1)

    rows = torch.arange(40, dtype=torch.float64)
    x, y = torch.stack([rows, -rows], -1), rows[:, None] * 10
    learner = Recorder()
    updater = OnlineUpdater(learner, batch=6)
    seen = 0
    for size in (1, 1, 3, 9, 1, 2, 7, 1):
        updater(x[seen : seen + size], y[seen : seen + size])
        seen += size
        got_x, got_y = learner.batches[-1]
        lo = max(0, seen - 6)
        assert torch.equal(got_x, x[lo:seen]) and torch.equal(got_y, y[lo:seen])
