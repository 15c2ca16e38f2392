"""``gpdyn bench mpc``: the planning-rate table of every learner, mean only and with variance
(tiny K and H here: what is checked is the table, not the speed)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from gpdyn.cli import main
from gpdyn.experiments.bench_mpc import BENCH_MODELS, bench_mpc, filled_learner, ratio_text, table
from gpdyn.gp import LEARNERS


@pytest.mark.slow
def test_every_learner_is_benched_and_the_bench_model_has_distinct_outputs() -> None:
    assert set(BENCH_MODELS) == set(LEARNERS)
    learner = filled_learner("svdgp", torch.device("cpu"), torch.float64, "small")
    assert learner.basis_counts == learner.basis_capacity  # every basis function in place
    ls = learner.lengthscale
    assert not torch.equal(ls[0], ls[1])  # outputs as after training: no shared kernel
    fresh = filled_learner("svdgp", torch.device("cpu"), torch.float64, "small", distinct=False)
    assert torch.equal(fresh.lengthscale[0], fresh.lengthscale[1])


@pytest.mark.slow
def test_bench_rows_modes_and_ratios() -> None:
    torch.set_num_threads(1)
    models = ["svdgp", "orth", "exact", "residual"]
    rows, ratios = bench_mpc(models, 8, 2, 1, torch.device("cpu"), torch.float32, ratio_presets=("small",),
                             progress=lambda _: None)
    seen = {(r["model"], r["mode"]) for r in rows}
    for name in models:
        assert {(name, "mean"), (name, "mean+variance")} <= seen
    assert ("svdgp (fresh)", "mean") in seen and ("(planner alone)", "mean") in seen
    compiler = any(shutil.which(c) for c in ("g++", "c++", "clang++"))  # the compiled planner's row needs one
    assert (("(planner alone, compiled)", "mean") in seen) == compiler
    assert all(r["seconds_per_step"] > 0 and "error" not in r for r in rows if compiler or "compiled" not in r["model"])
    assert ratios["sgemm_gflops"] > 0
    assert [r["features"] for r in ratios["svdgp"]] == ["per output", "one kernel (shared_kernel)"]
    assert [r["kernels"] for r in ratios["svdgp"]] == [9, 1] and ratios["exp2_gps"] > 0
    assert all(0 < r["torch_share_of_floor"] and r["floor_seconds"] > 0 for r in ratios["svdgp"])
    # both paths timed in one run: the fused native kernel (where it builds) and the torch path
    assert all(r["share_of_sgemm"] > 0 and r["torch_share_of_sgemm"] > 0 for r in ratios["svdgp"])
    from gpdyn.gp import native

    assert all(r["native"] == (native.library() is not None) for r in ratios["svdgp"])
    text = table(rows)
    assert all(f"| {name} |" in text for name in models)


@pytest.mark.slow
def test_cli_bench_mpc_writes_its_report(tmp_path) -> None:
    out = tmp_path / "bench"
    assert main(["bench", "mpc", "--samples", "4", "--horizon", "2", "--models", "orth", "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "| orth |" in report and "CPU" in report and "float32" in report and "Command: `gpdyn --threads" in report
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "float32" and config["threads"] == torch.get_num_threads() and config["preset"] == "small"
    assert main(["bench", "mpc", "--models", "nope", "--out", str(tmp_path / "x")]) == 2


def test_wiski_ratio_lines_name_each_path_and_report_errors() -> None:
    ratios = {"wiski": {"label": "wiski", "N": 10, "m": 392, "mean_seconds": 2e-3, "gather_seconds": 5e-4, "ratio": 4.0},
              "wiski_compiled": {"label": "wiski compiled_mean", "error": "LearnerError: no compiler"}}
    text = ratio_text(ratios)
    assert "`wiski` `predict_mean` at N = 10: 2.000 CPU-ms" in text and "**ratio 4.00**" in text
    assert "`wiski compiled_mean` mean vs gather: error: LearnerError: no compiler" in text
