"""``gpdyn bench learners --peer gpytorch``: GPyTorch's SVGP beside gpdyn's learners.

gpytorch is a benchmark-only peer, never a dependency: the tests that run it skip where it
is not installed (CI), and the refusal without it is always tested, by making its import fail.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import pytest
import torch

from gpdyn.cli import main
from gpdyn.errors import InputError
from gpdyn.experiments import bench_learners as bl

NEEDS_GPYTORCH = "needs the peer library GPyTorch: bash scripts/install_peer.sh gpytorch"
TINY_PEER = {"gpytorch-svgp-16": ("gpytorch-svgp", {"m": 16})}


@pytest.fixture
def no_gpytorch(monkeypatch):
    """Make ``import gpytorch`` fail as it does where it is not installed (a None entry in
    sys.modules raises ImportError on import, whether or not the package is there)."""
    for name in [m for m in sys.modules if m == "gpytorch" or m.startswith("gpytorch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "gpytorch", None)


def test_missing_gpytorch_is_refused_with_the_install_command(no_gpytorch, tmp_path, capsys):
    with pytest.raises(InputError, match="--peer gpytorch: gpytorch is not installed") as err:
        bl.import_peer("gpytorch")
    assert "scripts/install_peer.sh" in str(err.value) and "--no-deps" in str(err.value)
    out = tmp_path / "run"
    assert main(["bench", "learners", "--peer", "gpytorch", "--only", "svi-1024", "--out", str(out)]) == 2
    stderr = capsys.readouterr().err
    assert "gpytorch is not installed" in stderr and "pip install --no-deps gpytorch" in stderr
    assert "Traceback" not in stderr
    assert not out.exists()  # refused before any work


def test_unknown_peer_and_peer_config_without_peer_are_refused(tmp_path, capsys):
    with pytest.raises(InputError, match="unknown peer"):
        bl.import_peer("gpflow")
    assert main(["bench", "learners", "--peer", "gpflow"]) == 2  # argparse's choices
    out = tmp_path / "run"
    assert main(["bench", "learners", "--only", "gpytorch-svgp-1024", "--out", str(out)]) == 2
    assert "needs --peer gpytorch" in capsys.readouterr().err and not out.exists()


def test_race_options_are_checked_before_any_work(tmp_path, kuka_store, capsys):
    out = tmp_path / "run"
    assert main(["bench", "learners", "--store", str(kuka_store.path), "--out", str(out)]) == 2
    assert "needs both --store and --problem" in capsys.readouterr().err
    assert main(["bench", "learners", "--store", str(tmp_path / "nope.zarr"), "--problem", "kuka", "--out", str(out)]) == 2
    assert "no such store" in capsys.readouterr().err
    assert main(["bench", "learners", "--store", str(kuka_store.path), "--problem", "kuka", "--learners", "gpr",
                 "--preset", "small", "--budget", "0", "--out", str(out)]) == 2
    assert not out.exists()


@pytest.mark.slow
def test_the_default_bench_does_not_import_gpytorch():
    code = ("import sys, gpdyn.experiments.bench_learners, gpdyn.cli.jobs; "
            "assert 'gpytorch' not in sys.modules and 'linear_operator' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- with gpytorch ---------------------------------------------------------------------------
def _sine(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.rand(n, 2, generator=gen, dtype=torch.float64) * 4 - 2
    y = torch.stack([torch.sin(2 * x[:, 0]) + 0.5 * x[:, 1], torch.cos(x[:, 0] * x[:, 1])], dim=1)
    return x, y + 0.05 * torch.randn(n, 2, generator=gen, dtype=torch.float64)


def test_peer_svgp_learns_a_smooth_function():
    pytest.importorskip("gpytorch", reason=NEEDS_GPYTORCH)
    gen = torch.Generator().manual_seed(0)
    x, y = _sine(512, gen)
    x_test, y_test = _sine(256, gen)
    peer = bl.GPyTorchSVGP(x[:128], y[:128], 32, n_data=len(x), lr=0.05)
    before = bl._nmse(peer, x_test, y_test)
    losses = []
    for i in range(150):
        rows = torch.randint(len(x), (128,), generator=gen)
        losses.append(float(peer.step(x[rows], y[rows])["loss"]))
    after = bl._nmse(peer, x_test, y_test)
    mean, var = peer.predict(x_test)
    assert mean.shape == var.shape == (256, 2) and bool((var > 0).all())
    assert torch.allclose(mean, peer.predict_mean(x_test))
    assert max(after) < 0.05 < min(before), (before, after)
    assert sum(losses[-10:]) < sum(losses[:10])
    # the P outputs are a batch of independent GPs, each with its own hyperparameters
    assert peer.model.covar_module.base_kernel.lengthscale.shape == (2, 1, 2)
    assert peer.likelihood.noise.shape == (2, 1)
    assert peer.model.variational_strategy.inducing_points.requires_grad  # learned inducing locations


def test_peer_step_is_timed_on_the_bench_batch():
    pytest.importorskip("gpytorch", reason=NEEDS_GPYTORCH)
    r = bl.bench_one("gpytorch-svgp", {"m": 16}, "cpu", torch.float64, 2)
    assert r["learner"] == "gpytorch-svgp" and r["counts"] == {"inducing": 16}
    assert r["step_s"] > 0 and r["step_cpu_s"] > 0 and r["predict_s"] > 0 and r["step_gpu_s"] is None


def test_race_gives_every_learner_the_same_budget(kuka_store):
    pytest.importorskip("gpytorch", reason=NEEDS_GPYTORCH)
    results = {name: bl.race_one(name, str(kuka_store.path), "kuka", "small", 0.4, "cpu", torch.float64, batch=32,
                                 peer_m=16)
               for name in ("svi", "gpytorch-svgp")}
    for name, r in results.items():
        assert r["learner"] == name and r["steps"] >= 1
        assert [m["budget_s"] for m in r["marks"]] == pytest.approx([0.1, 0.2, 0.4])
        assert all(m["used_s"] >= m["budget_s"] for m in r["marks"])
        steps = [m["steps"] for m in r["marks"]]
        assert steps == sorted(steps) and r["steps"] == steps[-1]
        assert len(r["nmse"]) == 7 and all(math.isfinite(v) for v in r["nmse"])
        assert r["rows"]["test"] >= 1
    assert results["gpytorch-svgp"]["sizes"] == {"m": 16, "lr": 0.1}


def test_cli_peer_table_and_race(kuka_store, tmp_path, monkeypatch):
    pytest.importorskip("gpytorch", reason=NEEDS_GPYTORCH)
    # the paper-size peer (M = 1024) takes seconds a step on a small CPU: time a tiny one here
    monkeypatch.setattr(bl, "PEER_CONFIGS", TINY_PEER)
    out = tmp_path / "run"
    argv = ["bench", "learners", "--peer", "gpytorch", "--only", "gpytorch-svgp-16", "--repeats", "1",
            "--store", str(kuka_store.path), "--problem", "kuka", "--budget", "0.3", "--learners", "svi",
            "--preset", "small", "--out", str(out)]
    assert main(argv) == 0
    bench = json.loads((out / "bench.json").read_text())
    assert set(bench["results"]) == {"gpytorch-svgp-16"} and set(bench["race"]) == {"svi", "gpytorch-svgp"}
    assert bench["device_name"]
    config = json.loads((out / "config.json").read_text())
    assert config["peer"] == "gpytorch" and config["race"]["budget_s"] == 0.3 and config["race"]["clock"] == "process CPU"
    report = (out / "report.md").read_text()
    assert "| gpytorch-svgp-16 |" in report and "nMSE at equal time" in report and "| gpytorch-svgp |" in report


def test_the_report_names_the_device():
    assert bl.device_name("cpu")  # the processor or machine name, never empty


@pytest.mark.gpu
def test_steps_on_cuda_are_timed_by_events_too():
    assert bl.device_name("cuda") == torch.cuda.get_device_name(torch.cuda.current_device())
    r = bl.bench_one("svi", {"m": 16}, "cuda", torch.float32, 2)
    assert r["step_gpu_s"] > 0 and r["peak_mb"] >= r["base_mb"] > 0
    if importlib.util.find_spec("gpytorch") is not None:
        r = bl.bench_one("gpytorch-svgp", {"m": 16}, "cuda", torch.float32, 2)
        assert r["step_gpu_s"] > 0
