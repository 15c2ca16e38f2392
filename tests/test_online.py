"""The online protocol, the sinc problem of SVDGP Fig. 1, checkpoints and ``gpdyn learn``."""

from __future__ import annotations

import json

import pytest
import torch
from learner_data import sinc_data

from gpdyn.cli import main
from gpdyn.data.streams import IIDStream
from gpdyn.errors import InputError
from gpdyn.gp import make_learner
from gpdyn.gp.online import SCORES, evaluate, load_learner, run_online, save_learner

# small bases that emulate the large-data regime of SVDGP Fig. 1; nMSE targets on the noise-free grid
SINC = {
    "svdgp": ({"m_alpha": 128, "m_beta": 4, "n_columns": 64}, 0.03),
    "orth": ({"m_gamma": 128, "m_beta": 4, "n_columns": 64}, 0.05),  # Adam on a_beta: 600 iterations
    "orthnat": ({"m_gamma": 128, "m_beta": 4, "n_columns": 64}, 0.05),
    "svi": ({"m": 16}, 0.05),
    "ivsgpr": ({"m": 16}, 0.05),
    "vsgpr": ({"m": 8, "n_subset": 256}, 0.05),
    "gpr": ({"n_subset": 64}, 0.05),
}


def _run(name: str, sizes: dict, iterations: int = 250):
    x, y, xt, yt = sinc_data()
    learner = make_learner(name, 1, 1, seed=0, lr=0.05, **sizes)
    stream = IIDStream(x, y, batch_size=128, seed=0)
    records = run_online(learner, stream, xt, yt, iterations=iterations, n_delta=32, eval_every=iterations, n_data=500, progress=False)
    return learner, records


@pytest.mark.parametrize("name", list(SINC))
@pytest.mark.slow
def test_each_learner_fits_sinc(name):
    sizes, target = SINC[name]
    # svdgp: with its covariance learning, the noise falls to its true level and Adam's minibatch
    # noise in the mean coefficients takes longer to settle
    iterations = 600 if name in ("orth", "svdgp") else 250
    _, records = _run(name, sizes, iterations)
    assert records[-1]["iteration"] == iterations
    assert records[-1]["nmse_mean"] < target, records[-1]


@pytest.mark.slow
def test_decoupled_beats_coupled_with_the_same_covariance_basis():
    _, dec = _run("svdgp", {"m_alpha": 128, "m_beta": 4, "n_columns": 64}, iterations=600)
    _, cpl = _run("svi", {"m": 4}, iterations=600)
    assert dec[-1]["nmse_mean"] < 0.5 * cpl[-1]["nmse_mean"], (dec[-1]["nmse_mean"], cpl[-1]["nmse_mean"])


@pytest.mark.parametrize("name", list(SINC))
def test_checkpoint_round_trip_is_exact(name, tmp_path):
    x, y, xt, _ = sinc_data(100)
    learner = make_learner(name, 1, 1, seed=3, **SINC[name][0])
    for i in range(3):
        learner.observe(x[i * 30 : i * 30 + 40], y[i * 30 : i * 30 + 40])
        learner.step(x[i * 30 : i * 30 + 40], y[i * 30 : i * 30 + 40])
    save_learner(learner, tmp_path / "ck.pt", note="kept")
    restored, extra = load_learner(tmp_path / "ck.pt")
    assert extra == {"note": "kept"}
    for a, b in zip(learner.predict(xt), restored.predict(xt)):
        assert torch.equal(a, b)
    # resuming continues exactly as the original would (Adam state, generator, counters)
    for model in (learner, restored):
        model.observe(x[60:], y[60:])
        model.step(x[60:], y[60:])
    for a, b in zip(learner.predict(xt), restored.predict(xt)):
        assert torch.equal(a, b)


def test_run_online_records_and_errors():
    x, y, xt, yt = sinc_data(100)
    learner = make_learner("svdgp", 1, 1, m_alpha=32, m_beta=4)
    seen = []
    records = run_online(learner, IIDStream(x, y, 20), xt, yt, iterations=5, n_delta=8, eval_every=2, callback=seen.append, n_data=100, progress=False)
    assert [r["iteration"] for r in records] == [2, 4, 5] and seen == records
    assert learner.counts == {"alpha": 32, "beta": 4} and learner.n_data == 100
    for key in SCORES:
        assert len(records[-1][key]) == 1 and f"{key}_mean" in records[-1] and f"{key}_std" in records[-1]
    with pytest.raises(InputError, match="iterations"):
        run_online(learner, IIDStream(x, y, 20), xt, yt, iterations=0)
    with pytest.raises(InputError, match="stream ended"):
        run_online(learner, [(x[:10], y[:10])], xt, yt, iterations=3, progress=False)
    with pytest.raises(InputError, match="checkpoint"):
        load_learner("/nonexistent/ck.pt")


@pytest.mark.slow
def test_gpdyn_learn_writes_a_run_that_load_restores(walker_store, tmp_path, capsys):
    from gpdyn.experiments.learned import load_learned as load

    out = tmp_path / "run"
    argv = ["learn", "--store", str(walker_store.path), "--problem", "walker-1", "--learner", "svdgp", "--iterations", "4",
            "--batch-size", "32", "--n-delta", "8", "--eval-every", "2", "--size", "m_alpha=16", "--size", "m_beta=4", "--out", str(out)]
    assert main(argv) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [2, 4] and len(metrics[-1]["nmse"]) == 9
    assert len(metrics[-1]["nll"]) == len(metrics[-1]["coverage"]) == 9
    report = (out / "report.md").read_text()
    assert "| output | nMSE | bound | NLL | MSLL | 95% coverage |" in report and "| qvel8[t+1] |" in report
    assert "NLL " in capsys.readouterr().out
    learner, normalizer = load(out)
    assert learner.t == 4 and normalizer.y_mean.shape == (9,)
    assert "(iid protocol)" in report and "a seeded 10% of the samples" in report
    block = tmp_path / "block"
    assert main(argv[:-2] + ["--protocol", "block", "--out", str(block)]) == 0
    assert "(block protocol)" in (block / "report.md").read_text()
    assert json.loads((block / "config.json").read_text())["problem"]["held_out"].startswith("one contiguous block")
    assert main(argv[:-2] + ["--protocol", "ordered", "--out", str(tmp_path / "ordered")]) == 2
    assert main(argv[:-2] + ["--size", "m_alpha=oops=1", "--out", str(tmp_path / "bad")]) == 2
    assert main(argv[:-2] + ["--size", "bogus=1", "--out", str(tmp_path / "bad2")]) == 2


def test_in_memory_copy_shares_no_optimiser_state():
    """A learner copied through state_dict steps independently of its original (control loops copy them)."""
    import torch

    from gpdyn.gp import make_learner

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g, dtype=torch.float64)
    y = torch.sin(x[:, :2])
    a = make_learner("svi", 3, 2, m=8, n_delta=8)
    a.observe(x, y)
    a.step(x, y)
    b = make_learner("svi", 3, 2, m=8, n_delta=8)
    b.load_state_dict(a.state_dict())
    reference = make_learner("svi", 3, 2, m=8, n_delta=8)
    reference.load_state_dict(a.state_dict())
    b.step(x, y)
    b.step(x, y)  # must not move a's Adam moments
    a.step(x, y)
    reference.step(x, y)
    torch.testing.assert_close(a.predict(x)[0], reference.predict(x)[0], rtol=0, atol=0)


def test_a_learner_with_a_point_limit_observes_what_fits_and_counts_the_rest():
    x, y, xt, yt = sinc_data(100)
    learner = make_learner("exact", 1, 1, max_points=50, refit_every=2, refit_iters=1)
    records = run_online(learner, IIDStream(x, y, 20, seed=0), xt, yt, iterations=5, eval_every=5, progress=False)
    assert learner.n == 50 and learner.room() == 0
    assert records[-1]["unobserved"] == 5 * 20 - 50
    assert "unobserved" not in run_online(make_learner("svi", 1, 1, m=8), IIDStream(x, y, 20), xt, yt, iterations=1,
                                          progress=False)[-1]


@pytest.mark.parametrize("name", [*SINC, "wiski", "exact"])
def test_every_learner_predicts_y_with_its_noise(name):
    x, y, xt, _ = sinc_data(100)
    learner = make_learner(name, 1, 1, seed=0, **(SINC[name][0] if name in SINC else {}))
    learner.observe(x, y)
    learner.step(x, y)
    noise = learner.noise_variance()
    assert noise.shape == (1,) and bool((noise > 0).all()) and not noise.requires_grad
    (f_mean, f_var), (y_mean, y_var) = learner.predict(xt), learner.predict_y(xt)
    assert torch.equal(f_mean, y_mean)
    torch.testing.assert_close(y_var, f_var + noise, rtol=1e-12, atol=0)


def test_evaluate_scores_the_predictive_distribution_of_y_noise_included():
    x, y, _, _ = sinc_data(700, seed=1)  # noise sd 0.1
    x_train, y_train, x_test, y_test = x[:500], y[:500], x[500:], y[500:]

    def scored(noise: float) -> dict:
        gp = make_learner("exact", 1, 1, max_points=500, learn_hyperparameters=False)
        gp.set_hyperparameters(lengthscale=1.0, amplitude=0.3, noise=noise)
        gp.observe(x_train, y_train)
        scores = evaluate(gp, x_test, y_test)
        mean, var = gp.predict(x_test)
        normal = torch.distributions.Normal(mean, (var + noise).sqrt())
        assert scores["nll"][0] == pytest.approx(-float(normal.log_prob(y_test).mean()), rel=1e-10)
        trivial = -float(torch.distributions.Normal(0.0, 1.0).log_prob(y_test).mean())
        assert scores["msll"][0] == pytest.approx(scores["nll"][0] - trivial, rel=1e-10)
        inside = ((y_test - mean).abs() <= 1.959964 * (var + noise).sqrt()).double().mean()
        assert scores["coverage"][0] == pytest.approx(float(inside), abs=1e-12)
        return scores

    right = scored(0.01)  # the data's own noise: the 95% intervals hold about 95% of the targets
    assert 0.9 <= right["coverage_mean"] <= 0.99 and right["msll_mean"] < -1.0
    # with a noise 100x too small the latent variance alone is near zero at the data:
    # the intervals are far too narrow and the log likelihood says so
    tight = scored(1e-4)
    assert tight["coverage_mean"] < 0.5 and tight["nll_mean"] > right["nll_mean"] + 1.0
