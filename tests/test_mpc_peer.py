"""gpdyn's MPPI beside pytorch-mppi's (``gpdyn bench mpc --peer pytorch-mppi``).

pytorch-mppi is a benchmark-only peer, never a dependency: the tests that run it skip where
it is not installed (CI); the refusal without it is always tested, by making its import fail.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from double_integrator import GOAL, linear

from gpdyn.cli import main
from gpdyn.control.mpc import MPPI, MPCConfig
from gpdyn.errors import InputError
from gpdyn.experiments import bench_mpc as bm

NEEDS_PYTORCH_MPPI = "needs the peer library pytorch-mppi: bash scripts/install_peer.sh pytorch-mppi"


def step_cost(nxt: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Cost of arriving at ``nxt`` under ``u`` (the form both planners take)."""
    err = nxt - GOAL
    return err[:, 0] ** 2 + 0.1 * err[:, 1] ** 2 + 0.01 * (u**2).sum(-1)


@pytest.fixture
def no_peer(monkeypatch):
    """Make ``import pytorch_mppi`` fail as it does where it is not installed."""
    for name in [m for m in sys.modules if m == "pytorch_mppi" or m.startswith("pytorch_mppi.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pytorch_mppi", None)


def test_missing_peer_is_refused_with_the_install_command(no_peer, tmp_path, capsys) -> None:
    with pytest.raises(InputError, match="--peer pytorch-mppi: pytorch-mppi is not installed") as err:
        bm.import_peer("pytorch-mppi")
    assert "scripts/install_peer.sh pytorch-mppi" in str(err.value) and "--no-deps" in str(err.value)
    out = tmp_path / "run"
    assert main(["bench", "mpc", "--peer", "pytorch-mppi", "--models", "orth", "--samples", "4", "--horizon", "2",
                 "--out", str(out)]) == 2
    assert "pytorch-mppi is not installed" in capsys.readouterr().err
    assert not out.exists()  # refused before the run folder


def test_unknown_peer_is_refused() -> None:
    with pytest.raises(InputError, match="choose one of pytorch-mppi"):
        bm.import_peer("mppi-elsewhere")


def test_double_integrator_is_the_walker_sized_trivial_model() -> None:
    model = bm.DoubleIntegrator(torch.device("cpu"), torch.float64, gain=10.0, dt=0.01)
    x = torch.zeros(3, bm.NX, dtype=torch.float64)
    x[:, bm.NQ] = 2.0  # root x velocity
    a = torch.zeros(3, bm.NU, dtype=torch.float64)
    a[1, 0] = 1.0  # first actuated joint
    nxt = model(x, a)
    assert nxt.shape == (3, bm.NX)
    assert torch.allclose(nxt[:, 0], torch.full((3,), 0.02, dtype=torch.float64))  # drift at 2 m/s for 10 ms
    assert float(nxt[1, bm.NQ + bm.NV - bm.NU]) == pytest.approx(0.1)  # gain * dt * action
    assert float(nxt[1, bm.NV - bm.NU]) == pytest.approx(0.001)  # dt * new velocity
    assert torch.equal(nxt[0, bm.NQ + 1:], torch.zeros(bm.NV - 1, dtype=torch.float64))


def test_both_planners_drive_a_double_integrator_to_its_target() -> None:
    PeerMPPI = pytest.importorskip("pytorch_mppi", reason=NEEDS_PYTORCH_MPPI).MPPI
    torch.set_num_threads(1)
    torch.manual_seed(3)
    cfg = MPCConfig(horizon=15, samples=200, noise_std=0.5, temperature=0.05, control_cost=1.0)
    ours = MPPI(linear, lambda x, u, nxt: (step_cost(nxt, u), torch.zeros(len(u), dtype=torch.bool)), [-1.0], [1.0],
                cfg, seed=1)
    theirs = PeerMPPI(linear, step_cost, 2, torch.tensor([[0.25]], dtype=torch.float64), num_samples=200, horizon=15,
                      lambda_=0.05, u_min=torch.tensor([-1.0], dtype=torch.float64),
                      u_max=torch.tensor([1.0], dtype=torch.float64))
    for planner, act in ((ours, lambda x: ours.plan(x)[0]), (theirs, lambda x: theirs.command(x))):
        x = torch.zeros(2, dtype=torch.float64)
        for _ in range(60):
            u = act(x).reshape(1)
            assert -1.0 <= float(u) <= 1.0
            x = linear(x[None], u[None])[0]
        assert abs(float(x[0]) - 1.0) < 0.05 and abs(float(x[1])) < 0.1, (type(planner).__module__, x)


def test_peer_comparison_times_both_on_the_same_models(tmp_path) -> None:
    pytest.importorskip("pytorch_mppi", reason=NEEDS_PYTORCH_MPPI)
    torch.set_num_threads(1)
    rows = bm.peer_comparison(["orth"], 8, 3, 1, torch.device("cpu"), torch.float32, progress=lambda _: None)
    assert [r["model"] for r in rows] == [bm.TRIVIAL, "orth"]
    assert rows[0]["repeats"] == bm.TRIVIAL_REPEATS and rows[1]["repeats"] == 1
    for r in rows:
        assert r["gpdyn_seconds"] > 0 and r["peer_seconds"] > 0 and r["model_seconds"] > 0
        assert r["ratio"] == pytest.approx(r["gpdyn_seconds"] / r["peer_seconds"])
    assert "| orth |" in bm.peer_table(rows)
    out = tmp_path / "bench"
    assert main(["bench", "mpc", "--peer", "pytorch-mppi", "--models", "orth", "--samples", "4", "--horizon", "2",
                 "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "## Peer: gpdyn's MPPI against pytorch-mppi" in report and f"| {bm.TRIVIAL} |" in report
    assert "--peer pytorch-mppi" in report
    peer_rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum(1 for r in peer_rows if r.get("table") == "peer") == 2
