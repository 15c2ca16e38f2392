"""The stream (prequential) protocol: no row is scored after it was learned, the scores are the
closed forms, the problem's statistics come from the init rows alone, and the commands run it."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic import make_kuka_store
from torch import Tensor

from gpdyn.cli import main
from gpdyn.runs import RunDir
from gpdyn.data.problems import load_problem
from gpdyn.errors import InputError
from gpdyn.gp.base import Learner
from gpdyn.gp.prequential import StreamProtocol, StreamScores, prequential


class RowSpy(Learner):
    """A learner that records, by the row index carried in input column 0, which rows it has
    observed and which it was asked to predict, and predicts the running mean of what it saw
    (a real, if simple, online learner: the closed forms below are its scores)."""

    name = "row-spy"

    def __init__(self, input_dim: int, output_dim: int, **kwargs) -> None:
        super().__init__(input_dim, output_dim, **kwargs)
        self.observed: list[int] = []
        self.predicted: list[list[int]] = []
        self.steps: list[list[int]] = []
        self.sum_y = torch.zeros(output_dim, dtype=self.dtype)
        self.count = 0

    def observe(self, x: Tensor, y: Tensor) -> None:
        self.observed += x[:, 0].long().tolist()
        self.sum_y += y.sum(0)
        self.count += len(y)

    def step(self, x: Tensor, y: Tensor) -> dict[str, float]:
        self.steps.append(x[:, 0].long().tolist())
        return {"loss": 0.0}

    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        rows = x[:, 0].long().tolist()
        assert not set(rows) & set(self.observed), "a row was predicted after it was learned"
        self.predicted.append(rows)
        mean = (self.sum_y / self.count).expand(x.shape[0], -1)
        return mean, torch.zeros_like(mean)

    def vlb(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.zeros(self.output_dim, dtype=self.dtype)

    def noise_variance(self) -> Tensor:
        return torch.ones(self.output_dim, dtype=self.dtype)


def _stream(n: int, p: int = 2, seed: int = 0) -> tuple[Tensor, Tensor]:
    rng = np.random.default_rng(seed)
    x = torch.tensor(np.c_[np.arange(n), rng.normal(size=(n, 2))])
    y = torch.tensor(rng.normal(size=(n, p)) + np.linspace(0, 3, n)[:, None])
    return x, y


@pytest.mark.parametrize("init_rows, chunk, warm_rows", [(100, 32, 200), (64, 50, 64), (10, 1, 30)])
def test_every_row_is_predicted_once_before_it_is_learned(init_rows: int, chunk: int, warm_rows: int) -> None:
    n = 403
    x, y = _stream(n)
    spy = RowSpy(3, 2)
    protocol = StreamProtocol(init_rows=init_rows, chunk=chunk, warm_rows=warm_rows, init_steps=2, steps_per_chunk=3)
    records = prequential(spy, x, y, protocol, progress=False)
    predicted = [r for rows in spy.predicted for r in rows]
    assert predicted == list(range(init_rows, n))  # each streamed row once, in order
    assert spy.observed == list(range(n))  # then every row learned, in order
    # the init rows: observed as one batch, then init_steps updates on them; each chunk: steps_per_chunk on itself
    assert spy.steps[:2] == [list(range(init_rows))] * 2
    chunks = [list(range(a, min(a + chunk, n))) for a in range(init_rows, n, chunk)]
    assert spy.steps[2:] == [c for c in chunks for _ in range(3)]
    final = records[-1]
    assert final["rows"] == n and final["scored"] == n - warm_rows


def test_the_scores_are_the_closed_forms_of_the_running_mean() -> None:
    n, init_rows, chunk, warm_rows = 300, 40, 20, 100
    x, y = _stream(n, seed=1)
    final = prequential(RowSpy(3, 2), x, y, StreamProtocol(init_rows, chunk, warm_rows), progress=False)[-1]
    yn = y.numpy()
    means = np.array([yn[: a].mean(0) for a in range(init_rows, n, chunk) for _ in range(min(chunk, n - a))])
    scored, targets = means[warm_rows - init_rows :], yn[warm_rows:]
    r2 = (targets - scored) ** 2
    np.testing.assert_allclose(final["nmse"], r2.mean(0) / targets.var(0), rtol=1e-12)
    np.testing.assert_allclose(final["nll"], (0.5 * (r2 + math.log(2 * math.pi))).mean(0), rtol=1e-12)
    np.testing.assert_allclose(final["coverage"], (r2 <= 1.959963984540054**2).mean(0), rtol=1e-12)
    assert final["update_ms_per_row"] >= 0 and final["predict_ms_per_row"] >= 0


def test_scores_accumulate_like_one_batch() -> None:
    rng = np.random.default_rng(2)
    mean, var, y = (torch.tensor(rng.normal(size=(50, 3))) for _ in range(3))
    var = var.abs() + 0.1
    whole, parts = StreamScores(3, torch.device("cpu")), StreamScores(3, torch.device("cpu"))
    whole.add(mean, var, y)
    for a in range(0, 50, 7):
        parts.add(mean[a : a + 7], var[a : a + 7], y[a : a + 7])
    for key, value in whole.summary().items():
        np.testing.assert_allclose(parts.summary()[key], value, rtol=1e-12)


@pytest.mark.parametrize("protocol, rows, message", [
    (StreamProtocol(init_rows=100, warm_rows=50), None, "--warm-rows 50 is below --init-rows 100"),
    (StreamProtocol(chunk=0), None, "--chunk must be >= 1"),
    (StreamProtocol(init_steps=-1), None, "--init-steps must be >= 0"),
    (StreamProtocol(), 2048, "none of them after --warm-rows 2048"),
])
def test_impossible_settings_are_refused_by_name(protocol: StreamProtocol, rows: int | None, message: str) -> None:
    with pytest.raises(InputError, match=message):
        protocol.validate(rows)


def test_the_stream_problem_keeps_store_order_and_init_statistics(tmp_path: Path) -> None:
    store = make_kuka_store(tmp_path / "k.zarr", offline=[60], online=[90, 70])
    problem = load_problem(store, "kuka", protocol="stream", init_rows=50)
    iid = load_problem(store, "kuka", protocol="iid")
    assert len(problem.x_train) == 220 and len(problem.x_test) == 0 and len(problem.x_init) == 0
    # every sample, in store order: the iid train and test rows together, re-sorted, are the same rows
    assert np.array_equal(np.sort(problem.x_train, axis=0), np.sort(np.r_[iid.x_train, iid.x_test], axis=0))
    np.testing.assert_allclose(problem.normalizer.x_mean, problem.x_train[:50].mean(0))
    np.testing.assert_allclose(problem.normalizer.y_std, problem.y_train[:50].std(0, ddof=1))
    with pytest.raises(InputError, match="none after the 300 init rows"):
        load_problem(store, "kuka", protocol="stream", init_rows=300)


def _final_csv(run: Path) -> dict[tuple[str, str], float]:
    with open(run / "final.csv") as f:
        return {(r["learner"], r["metric"]): float(r["mean"]) for r in csv.DictReader(f)}


@pytest.mark.slow
def test_replay_and_learn_run_the_stream_protocol(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_kuka_store(tmp_path / "k.zarr", offline=[], online=[300, 260]).close()
    common = ["--store", str(tmp_path / "k.zarr"), "--problem", "kuka", "--protocol", "stream", "--preset", "small",
              "--init-rows", "128", "--chunk", "64", "--warm-rows", "192"]
    out = tmp_path / "replay"
    assert main(["replay", *common, "--learners", "svi,wiski", "--out", str(out)]) == 0
    table = _final_csv(out)
    for learner in ("svi", "wiski"):
        for metric in ("nmse", "nll", "coverage", "update_ms_per_row", "predict_ms_per_row"):
            assert math.isfinite(table[learner, metric])
        assert 0 <= table[learner, "coverage"] <= 1
    assert (out / "stream_nmse.svg").stat().st_size > 0 and "Stream (prequential)" in (out / "report.md").read_text()
    finals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sorted(r["learner"] for r in finals if r.get("final")) == ["svi", "wiski"]
    # a rerun on the same folder finds both streams finished and streams nothing again
    lines = len(finals)
    assert main(["replay", *common, "--learners", "svi,wiski", "--out", str(out)]) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == lines
    # other stream sizes on the same folder are another run
    assert main(["replay", *common[:-1], "256", "--learners", "svi,wiski", "--out", str(out)]) == 2
    assert "stream" in capsys.readouterr().err

    assert main(["learn", *common, "--learner", "svi", "--out", str(tmp_path / "learn")]) == 0
    assert (tmp_path / "learn" / "checkpoint.pt").is_file()
    assert _final_csv(tmp_path / "learn")["svi", "nmse"] == pytest.approx(table["svi", "nmse"], rel=1e-9)


def test_a_prior_mean_is_learned_around_and_added_back() -> None:
    n, init_rows, chunk, warm_rows = 300, 40, 20, 100
    x, y = _stream(n, seed=3)
    prior = 0.5 * y + 0.1  # a fixed function's values at the rows
    spy = RowSpy(3, 2)
    final = prequential(spy, x, y, StreamProtocol(init_rows, chunk, warm_rows), prior=prior, progress=False)[-1]
    residual = (y - prior).numpy()
    np.testing.assert_allclose(spy.sum_y.numpy(), residual.sum(0), rtol=1e-12)  # the learner saw y - prior only
    means = np.array([residual[: a].mean(0) for a in range(init_rows, n, chunk) for _ in range(min(chunk, n - a))])
    predicted = prior.numpy()[warm_rows:] + means[warm_rows - init_rows :]
    targets = y.numpy()[warm_rows:]
    np.testing.assert_allclose(final["nmse"], ((targets - predicted) ** 2).mean(0) / targets.var(0), rtol=1e-12)
    with pytest.raises(InputError, match="prior mean has shape"):
        prequential(RowSpy(3, 2), x, y, StreamProtocol(init_rows, chunk, warm_rows), prior=prior[:, :1], progress=False)


@pytest.mark.slow
def test_the_rigid_body_prior_leaves_friction_and_damping_to_the_learner(tmp_path: Path) -> None:
    """On a real (small) KUKA stream the rigid-body prior is the simulator's torque less the joint
    damping and dry friction, and a learner on its residual predicts far better than without it."""
    from gpdyn.data.store import EpisodeStore
    from gpdyn.experiments.prior_mean import parse_prior_mean

    store = tmp_path / "kuka.zarr"
    assert main(["collect", "kuka", "--store", str(store), "--offline", "0", "--online", "1200",
                 "--out", str(tmp_path / "collect")]) == 0
    problem = load_problem(store, "kuka", protocol="stream", init_rows=256)
    attrs = dict(EpisodeStore.open(store).attrs)
    prior = parse_prior_mean("rigid-body", problem, attrs)
    x, tau = problem.split("train")
    residual = tau - prior.physical(x)
    terms = attrs["joint_terms"]
    # the residual is the joint damping plus a bounded dry friction: no rigid-body term left
    friction = np.abs(residual - np.asarray(terms["damping"]) * x[:, 7:14])
    assert (friction <= np.asarray(terms["friction"]) + 1e-6).all()
    common = ["--store", str(store), "--problem", "kuka", "--protocol", "stream", "--preset", "small",
              "--init-rows", "256", "--chunk", "128", "--warm-rows", "512", "--learners", "svi"]
    assert main(["replay", *common, "--out", str(tmp_path / "plain")]) == 0
    assert main(["replay", *common, "--prior-mean", "rigid-body", "--out", str(tmp_path / "prior")]) == 0
    plain, with_prior = _final_csv(tmp_path / "plain"), _final_csv(tmp_path / "prior")
    assert with_prior["svi", "nmse"] < 0.5 * plain["svi", "nmse"]
    assert "rigid-body" in (tmp_path / "prior" / "report.md").read_text()

    # the iid protocol takes it too, in replay and learn (scored on the torques, not the residual)
    iid = ["--store", str(store), "--problem", "kuka", "--preset", "small", "--iterations", "30", "--eval-every", "30",
           "--batch-size", "128"]
    assert main(["replay", *iid, "--learners", "svi", "--out", str(tmp_path / "iid-plain")]) == 0
    assert main(["replay", *iid, "--learners", "svi", "--prior-mean", "rigid-body", "--out", str(tmp_path / "iid-prior")]) == 0
    iid_plain, iid_prior = _final_csv(tmp_path / "iid-plain"), _final_csv(tmp_path / "iid-prior")
    assert iid_prior["svi", "nmse"] < 0.5 * iid_plain["svi", "nmse"]
    assert main(["learn", *iid, "--learner", "svi", "--prior-mean", "rigid-body", "--out", str(tmp_path / "learn")]) == 0
    from gpdyn.experiments.learned import load_learned as load

    with pytest.raises(InputError, match="residual of the prior mean 'rigid-body'"):
        load(tmp_path / "learn")  # its mean alone would be silently wrong

    # the controllers take it with its prior: the model of the torques is the prior plus the learner
    from gpdyn.experiments.prior_mean import load_learned_model
    from gpdyn.gp.prior_mean import WithPriorMean

    kuka = load_problem(store, "kuka", protocol="iid")
    model, normalizer = load_learned_model(tmp_path / "learn", store, kuka)
    assert isinstance(model, WithPriorMean) and model.base.name == "svi"
    x, tau = kuka.split("test")
    xn = torch.as_tensor(normalizer.normalize_x(x))
    with torch.no_grad():
        predicted = normalizer.denormalize_y(model.predict_mean(xn).numpy())
        residual = normalizer.y_std * model.base.predict_mean(xn).numpy()
    np.testing.assert_allclose(predicted, prior.physical(x) + residual, atol=1e-8)
    assert ((predicted - tau) ** 2).mean() < 0.5 * ((prior.physical(x) - tau) ** 2).mean()  # the residual helps
    assert main(["control", "kuka", "--from-run", str(tmp_path / "learn"), "--learner", "svi", "--steps", "20",
                 "--controllers", "frozen,online", "--out", str(tmp_path / "control")]) == 0
    tracking = {r["controller"]: r["rmse"] for r in RunDir(tmp_path / "control").metrics() if r.get("kind") == "tracking"}
    assert set(tracking) == {"frozen", "online"} and all(np.isfinite(v).all() for r in tracking.values()
                                                         for v in r.values())


@pytest.mark.parametrize("spec, message", [
    ("rigid-body", "not collected from the shipped KUKA model"),
    ("rigid-body:/nonexistent.xml", "no such MJCF file"),
    ("learner:", "name the run folder"),
    ("physics", "expected rigid-body, rigid-body:FILE.xml or learner:RUN_DIR"),
])
def test_bad_prior_means_are_refused_before_any_run_folder(tmp_path: Path, spec: str, message: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    make_kuka_store(tmp_path / "k.zarr", offline=[], online=[300]).close()
    out = tmp_path / "run"
    assert main(["replay", "--store", str(tmp_path / "k.zarr"), "--problem", "kuka", "--protocol", "stream",
                 "--init-rows", "64", "--warm-rows", "128", "--learners", "svi", "--prior-mean", spec,
                 "--out", str(out)]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_a_learner_with_a_prior_mean_learns_the_residual_and_adds_the_prior_back() -> None:
    import copy

    from gpdyn.gp import make_learner
    from gpdyn.gp.prior_mean import WithPriorMean

    x = torch.linspace(-2, 2, 40, dtype=torch.float64)[:, None]
    y = torch.cat([3.0 * x + torch.sin(x), -x], dim=-1)

    def prior(z):  # the linear part of each output
        return torch.cat([3.0 * z, -z], dim=-1)

    base = make_learner("exact", 1, 2, preset="small", dtype=torch.float64, seed=0)
    model = WithPriorMean(base, prior, "linear")
    model.observe(x, y)
    for _ in range(30):
        model.step(x, y)
    with torch.no_grad():
        assert torch.allclose(model.predict_mean(x), base.predict_mean(x) + prior(x))
        residual = base.predict_mean(x)  # what the base learned: sin x and 0, not the linear part
        assert (residual[:, 0] - torch.sin(x[:, 0])).abs().max() < 0.1 and residual[:, 1].abs().max() < 0.1
        mean, var = model.predict(x)
        assert torch.allclose(var, base.predict(x)[1]) and (mean - y).abs().max() < 0.1
    twin = copy.deepcopy(model)  # a controller's online copy: its own learner, the same fixed prior
    assert twin.base is not base and twin.prior is prior


def test_a_prior_mean_wrapper_keeps_the_base_learners_step_rule_and_computes_the_prior_once_per_batch() -> None:
    """An online updater observes a row and steps on it (WISKI eq. (18), the ``step_on_observed`` trait): the
    wrapper passes that trait on and evaluates its prior, an arm's inverse dynamics, once for the two calls."""
    from gpdyn.gp import make_learner
    from gpdyn.gp.prior_mean import WithPriorMean
    from gpdyn.gp.training import OnlineUpdater
    from gpdyn.gp.wiski import for_control

    calls = []

    def prior(z):
        calls.append(z.shape[0])
        return 2.0 * z[:, :1]

    x = torch.linspace(-1, 1, 30, dtype=torch.float64)[:, None]
    wiski = WithPriorMean(make_learner("wiski", 1, 1, preset="small", dtype=torch.float64, seed=0), prior)
    assert wiski.can("step_on_observed") and not WithPriorMean(make_learner("svdgp", 1, 1, preset="small"), prior).can(
        "step_on_observed")
    wiski.observe(x[:20], 2 * x[:20] + torch.sin(x[:20]))
    for_control(wiski)
    assert wiski.base.incremental_rows > 0  # the wrapped WISKI is readied for a controller too
    update = OnlineUpdater(wiski)
    calls.clear()
    update(x[20:21], 2 * x[20:21] + torch.sin(x[20:21]))
    assert calls == [1]  # observe and step on the same row: one prior evaluation


class FailsAfter(RowSpy):
    """The running-mean learner whose predictions of output 1 turn NaN from ``row`` on: what a
    factorisation that failed on a GPU hands on (gpdyn.gp.base.cholesky)."""

    def __init__(self, input_dim: int, output_dim: int, row: int) -> None:
        super().__init__(input_dim, output_dim)
        self.row = row

    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        mean, var = super().predict(x)
        if x[0, 0] >= self.row:
            mean = mean.clone()
            mean[:, 1] = math.nan
        return mean, var


def test_a_stream_stops_with_the_rows_and_outputs_where_predictions_turned_non_finite() -> None:
    x, y = _stream(400)
    with pytest.raises(FloatingPointError, match=r"row-spy .*output\(s\) \[1\] between rows 300 and 320"):
        prequential(FailsAfter(3, 2, row=300), x, y, StreamProtocol(100, 20, 100), record_every=1, progress=False)


def test_svi_streams_a_1khz_arm_log_in_float32() -> None:
    """Consecutive rows of a 1 kHz arm log are nearly equal, so are the bases picked from them:
    in float32 their kernel matrix is singular within rounding unless the jitter has a floor
    fit for the precision (gpdyn.gp.variational.chol); without it the first chunk fails."""
    from gpdyn.gp import make_learner

    rng = np.random.default_rng(0)
    t = np.arange(3000)[:, None] / 1000.0
    w = 2 * np.pi * rng.uniform(0.2, 1.0, (1, 7))
    phase = rng.uniform(0, 2 * np.pi, (1, 7))
    q = np.sin(w * t + phase)
    x = np.c_[q, w * np.cos(w * t + phase), -w * w * q]
    x = (x - x[:1024].mean(0)) / x[:1024].std(0)
    y = np.c_[x[:, :7].sum(1), (x[:, 7:14] * x[:, :7]).sum(1)]
    learner = make_learner("svi", 21, 2, preset="cpu", dtype=torch.float32, seed=0)
    final = prequential(learner, torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32),
                        StreamProtocol(), progress=False)[-1]
    assert all(math.isfinite(v) for v in final["nmse"])
