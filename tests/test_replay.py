"""gpdyn replay: complete reports, table = CSV, resumable with the same numbers."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from gpdyn.errors import InputError
from gpdyn.experiments.replay import ReplayConfig, open_run, replay
from gpdyn.experiments.report import write_report
from gpdyn.data.problems import load_problem

SIZES = {"svdgp": {"m_alpha": 48, "m_beta": 8, "n_columns": 16}, "svi": {"m": 16}}


def _config(store, **kw) -> ReplayConfig:
    base = dict(store=str(store.path), problem="kuka", learners=["svdgp", "svi"], iterations=6, batch_size=32,
                n_delta=8, eval_every=2, seed=3, sizes=SIZES)
    base.update(kw)
    return ReplayConfig(**base)


def _run(cfg, out, **kw):
    problem = load_problem(cfg.store, cfg.problem, protocol=cfg.protocol, seed=cfg.seed)
    run = open_run(cfg, out, problem)
    return run, replay(cfg, run, problem=problem, progress=False, **kw)


@pytest.mark.slow
def test_two_learners_complete_report(kuka_store, tmp_path):
    run, finals = _run(_config(kuka_store), tmp_path / "run")
    write_report(run.path)
    for name in ("report.md", "curves.csv", "final.csv", "nmse.svg", "vlb.svg", "nll.svg", "coverage.svg", "metrics.jsonl",
                 "config.json"):
        assert (run.path / name).stat().st_size > 0, name
    rows = list(csv.DictReader(open(run.path / "curves.csv")))
    assert [r["learner"] for r in rows] == ["svdgp"] * 3 + ["svi"] * 3
    report = (run.path / "report.md").read_text()
    for name in ("svdgp", "svi"):
        last = [r for r in rows if r["learner"] == name][-1]
        assert int(last["iteration"]) == 6
        np.testing.assert_allclose(float(last["nmse_mean"]), finals[name]["nmse_mean"], rtol=1e-6)
        # the Table 2 row shows the CSV's last row
        row = next(line for line in report.splitlines() if line.startswith(f"| {name} | 6 |"))
        table_nmse = float(row.split("|")[3].split("±")[0])
        assert table_nmse == pytest.approx(float(last["nmse_mean"]), rel=1e-3)
        assert np.all(np.isfinite([float(last[f"{m}_mean"]) for m in ("nmse", "vlb", "nll", "msll", "coverage")]))
        # calibration beside nMSE: NLL and 95% coverage, mean ± std over outputs, as in the CSV
        header = next(line for line in report.splitlines() if line.startswith("| learner | iterations |"))
        cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
        assert float(cells["NLL"].split("±")[0]) == pytest.approx(float(last["nll_mean"]), rel=1e-3)
        assert float(cells["95% coverage"].split("±")[0]) == pytest.approx(float(last["coverage_mean"]), rel=1e-3)
        assert 0 <= float(last["coverage_mean"]) <= 1 and len(finals[name]["coverage"]) == 7
    assert "tau0[t]" in report  # Appendix C per-output columns
    assert "fraction of targets in the central 95% interval per output" in report
    final_rows = list(csv.DictReader(open(run.path / "final.csv")))
    assert {(r["learner"], r["metric"]) for r in final_rows} == {
        (n, m) for n in ("svdgp", "svi") for m in ("nmse", "vlb", "nll", "msll", "coverage")}


@pytest.mark.slow
def test_a_run_recorded_without_calibration_scores_still_reports(kuka_store, tmp_path):
    import json

    run, _ = _run(_config(kuka_store, iterations=2, learners=["svi"], sizes={"svi": {"m": 16}}), tmp_path / "run")
    old = [{k: v for k, v in r.items() if not k.startswith(("nll", "msll", "coverage"))} for r in run.metrics()]
    (run.path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    report = write_report(run.path).read_text()
    row = next(line for line in report.splitlines() if line.startswith("| svi | 2 |"))
    assert row.count("| – |") >= 2 and not (run.path / "nll.svg").exists()


@pytest.mark.slow
def test_interrupted_replay_resumes_to_the_same_numbers(kuka_store, tmp_path):
    cfg = _config(kuka_store)
    _, straight = _run(cfg, tmp_path / "straight")

    class Interrupt(Exception):
        pass

    def stop(learner, iteration):
        if learner == "svi" and iteration == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        _run(cfg, tmp_path / "resumed", on_checkpoint=stop)
    seen = []
    reordered = _config(kuka_store, learners=["svi", "svdgp"])  # the order of learners decides no number
    _, resumed = _run(reordered, tmp_path / "resumed", on_checkpoint=lambda n, i: seen.append((n, i)))
    assert seen == [("svi", 4), ("svi", 6)]  # no repeated work
    for name in cfg.learners:
        np.testing.assert_allclose(resumed[name]["nmse"], straight[name]["nmse"], rtol=1e-10)
        np.testing.assert_allclose(resumed[name]["vlb"], straight[name]["vlb"], rtol=1e-10)


def test_ordered_protocol_initialises_then_streams(kuka_store, tmp_path):
    cfg = _config(kuka_store, protocol="ordered", init_iterations=2, iterations=100, learners=["svi"], sizes={"svi": {"m": 16}})
    run, finals = _run(cfg, tmp_path / "ordered")
    phases = [(r["phase"], r["iteration"]) for r in run.metrics()]
    # 135 streamed training rows in chunks of 32 -> 5 iterations after the 2 init ones
    assert phases == [("init", 2), ("stream", 4), ("stream", 6), ("stream", 7)]


def test_bad_replay_settings(kuka_store, tmp_path):
    with pytest.raises(InputError, match="unknown"):
        _config(kuka_store, learners=["svdgp", "nope"]).validate()
    with pytest.raises(InputError, match="--eval-every"):
        _config(kuka_store, eval_every=0).validate()
    cfg = _config(kuka_store, iterations=2)
    _run(cfg, tmp_path / "run")
    with pytest.raises(InputError, match="other settings"):
        _run(_config(kuka_store, iterations=4, seed=9), tmp_path / "run")


@pytest.mark.slow
def test_checkpoints_keep_the_protocol_settings_and_eval_subset(kuka_store, tmp_path):
    import torch

    from gpdyn.gp.online import load_learner

    cfg = _config(kuka_store, learners=["svi"], sizes={"svi": {"m": 16}}, iterations=2, eval_rows=7)
    run, finals = _run(cfg, tmp_path / "run")
    learner, extra = load_learner(run.path / "checkpoints" / "svi.pt")
    assert learner.n_delta == cfg.n_delta == learner.config["n_delta"]
    assert extra["iteration"] == 2 and not list((run.path / "checkpoints").glob("*.partial"))
    # the scores are those of a 7-row subset of the held-out split
    problem = load_problem(cfg.store, "kuka", seed=cfg.seed)
    x, y = problem.tensors("test")
    keep = torch.randperm(len(x), generator=torch.Generator().manual_seed(cfg.seed))[:7].sort().values
    mean = learner.predict(x[keep])[0]
    nmse = ((mean - y[keep]) ** 2).mean(0) / y[keep].var(0, unbiased=False)
    np.testing.assert_allclose(finals["svi"]["nmse"], nmse.numpy(), rtol=1e-8)
    write_report(run.path)
    assert "subset of 7 held-out rows" in (run.path / "report.md").read_text()


@pytest.mark.slow
def test_step_size_selection_picks_the_best_probe_and_does_not_disturb_the_run(kuka_store, tmp_path):
    import json

    candidates = [1e4, 0.1, 1e-3]  # 1e4 is far past what any step survives
    cfg = _config(kuka_store, learners=["svi"], sizes={"svi": {"m": 16}}, select_lr=candidates, select_iterations=5)
    run, finals = _run(cfg, tmp_path / "select")
    chosen = json.loads((run.path / "step_size.json").read_text())["svi"]
    probes = {r["lr"]: r["objective"] for r in run.metrics() if r.get("kind") == "step_size"}
    assert sorted(probes) == sorted(candidates)
    finite = {lr: v for lr, v in probes.items() if np.isfinite(v)}
    assert chosen["lr"] == min(finite, key=finite.get)
    # the probes leave no trace: the same learner with that gamma_0 given by hand scores the same
    fixed = _config(kuka_store, learners=["svi"], sizes={"svi": {"m": 16, "lr": chosen["lr"]}})
    _, by_hand = _run(fixed, tmp_path / "by-hand")
    np.testing.assert_allclose(finals["svi"]["nmse"], by_hand["svi"]["nmse"], rtol=1e-10)
    write_report(run.path)
    assert "Step size gamma_0, chosen per learner" in (run.path / "report.md").read_text()
    # a resumed run reuses the choice: no second probe
    run.close()  # the first run's process has ended: it no longer holds the folder
    _run(cfg, run.path)
    assert sum(r.get("kind") == "step_size" for r in run.metrics()) == len(candidates)


def test_bad_step_size_selection(kuka_store):
    with pytest.raises(InputError, match="choose the step size one way"):
        _config(kuka_store, select_lr=[0.1], sizes={"svi": {"lr": 0.1}}).validate()
    with pytest.raises(InputError, match="finite number > 0"):
        _config(kuka_store, select_lr=[0.1, -1.0]).validate()
    with pytest.raises(InputError, match="fewer minibatches"):
        cfg = _config(kuka_store, protocol="ordered", learners=["svi"], sizes={"svi": {"m": 16}},
                      init_iterations=0, select_lr=[0.1], select_iterations=1000)
        _run(cfg, None)


def test_a_preset_sizes_every_learner_and_sizes_override_it(kuka_store, tmp_path):
    from gpdyn.gp import learner_class
    from gpdyn.gp.online import load_learner

    cfg = _config(kuka_store, iterations=2, preset="small", sizes={"svi": {"m": 16}})
    run, _ = _run(cfg, tmp_path / "run")
    svdgp, _ = load_learner(run.path / "checkpoints" / "svdgp.pt")
    small = learner_class("svdgp").presets["small"]
    rows = len(load_problem(cfg.store, "kuka", seed=cfg.seed).x_train)
    assert svdgp.config["preset"] == "small" and small["m_beta"] < rows < small["m_alpha"]
    # a basis is capped at the training rows: a larger one only repeats points
    assert (svdgp.config["m_alpha"], svdgp.config["m_beta"]) == (rows, small["m_beta"])
    svi, _ = load_learner(run.path / "checkpoints" / "svi.pt")
    assert svi.config["m"] == 16 and svi.config["n_delta"] == cfg.n_delta  # --size and the protocol's N_Delta win
    with pytest.raises(InputError, match="unknown preset 'huge'"):
        _config(kuka_store, preset="huge").validate()


def test_the_default_preset_fits_the_device_and_config_records_every_learners_sizes(kuka_store, tmp_path):
    import json

    import torch

    from gpdyn.experiments.learn import default_preset

    assert default_preset("cpu") == "cpu" and default_preset(torch.device("cuda", 0)) == "paper"
    cfg = _config(kuka_store, iterations=2, sizes={"svi": {"m": 16}}, n_delta=None)
    assert cfg.preset == "cpu"  # resolved when made, so that the run folder says which sizes ran
    problem = load_problem(cfg.store, cfg.problem, seed=cfg.seed)
    run = open_run(cfg, tmp_path / "run", problem)

    def before_training(name, iteration):  # config.json holds every learner's sizes from the start
        recorded = json.loads((run.path / "config.json").read_text())["learner_config"]
        assert set(recorded) == {"svdgp", "svi"}

    replay(cfg, run, problem=problem, progress=False, on_checkpoint=before_training)
    config = json.loads((run.path / "config.json").read_text())
    assert config["preset"] == "cpu" and config["problem_summary"]["train"] == len(problem.x_train)
    svdgp, svi = config["learner_config"]["svdgp"], config["learner_config"]["svi"]
    assert svdgp["preset"] == "cpu" and svdgp["m_alpha"] == len(problem.x_train)  # cpu's 1024, capped
    assert svdgp["n_delta"] == 64 and svdgp["lr"] == 0.1  # the cpu preset's N_Delta and gamma_0
    assert svi["m"] == 16


@pytest.mark.parametrize("protocol", ["block", "split"])
@pytest.mark.slow
def test_block_and_split_protocols_replay_on_iid_minibatches(protocol, tmp_path):
    from scipy.io import savemat

    from gpdyn.data.importers import import_sarcos

    rng = np.random.default_rng(0)
    for name, n in (("sarcos_inv", 120), ("sarcos_inv_test", 40)):
        savemat(tmp_path / f"{name}.mat", {name: rng.normal(size=(n, 28))})
    store = import_sarcos([tmp_path / "sarcos_inv.mat", tmp_path / "sarcos_inv_test.mat"], tmp_path / "s.zarr")
    cfg = ReplayConfig(store=str(store.path), problem="kuka", learners=["svi"], protocol=protocol, iterations=3,
                       batch_size=16, eval_every=3, sizes={"svi": {"m": 8}})
    run, finals = _run(cfg, tmp_path / "run")
    problem = load_problem(store, "kuka", protocol=protocol)
    assert len(problem.x_test) == (40 if protocol == "split" else 12 + 4)
    assert [(r["phase"], r["iteration"]) for r in run.metrics()] == [("train", 3)]
    assert len(finals["svi"]["coverage"]) == 7
    report = write_report(run.path).read_text()
    assert f"({protocol} protocol)" in report and problem.held_out in report
