"""scripts/sarcos_table.py: the summary table of replay run folders and its least-squares reference."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from gpdyn.data.arm_schema import arm_episode_keys, arm_fields
from gpdyn.data.store import EpisodeStore

_spec = importlib.util.spec_from_file_location("sarcos_table", Path(__file__).parents[1] / "scripts" / "sarcos_table.py")
sarcos_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sarcos_table)


def _run_folder(path: Path, protocol: str, rows: dict[str, dict[str, float]]) -> Path:
    """A replay run folder with config.json and final.csv: ``rows`` maps learner -> metric -> value."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"job": "replay", "problem": "arm", "protocol": protocol, "seed": 0}))
    lines = ["learner,metric,mean,std,tau0[t],tau1[t]"]
    for learner, metrics in rows.items():
        lines += [f"{learner},{m},{v},{abs(v) / 10},{v * 2},{v / 2}" for m, v in metrics.items()]
    (path / "final.csv").write_text("\n".join(lines) + "\n")
    return path


def test_the_table_has_a_row_per_learner_and_protocol(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full = {"nmse": 0.05, "nll": -0.2, "msll": -1.5, "coverage": 0.97, "vlb": -1.0}
    iid = _run_folder(tmp_path / "iid", "iid", {"svdgp": full, "svi": {**full, "nmse": 0.03}})
    block = _run_folder(tmp_path / "block", "block", {"svdgp": full, "svi": {"nmse": 0.04}})  # block svi: no NLL, no row
    assert sarcos_table.main([str(iid), str(block)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "| svdgp | iid | 0.05 ± 0.005 | -0.2 ± 0.02 | -1.5 ± 0.15 | 0.97 ± 0.097 | 0.1 | -3 |"
    assert [line.split(" | ")[:2] for line in out[2:]] == [["| svdgp", "iid"], ["| svdgp", "block"], ["| svi", "iid"]]
    (block / "final.csv").unlink()
    assert sarcos_table.main([str(iid), str(block)]) == 2
    assert "block/final.csv: no such file" in capsys.readouterr().err


def test_the_least_squares_reference_scores_a_linear_arm_at_its_noise(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n, noise = 2000, 0.1
    x = rng.normal(size=(n, 6))
    weights = rng.normal(size=(6, 2))
    tau = x @ weights + 0.5 + noise * rng.normal(size=(n, 2))
    store = EpisodeStore.create(tmp_path / "arm.zarr", arm_fields(2), source="test", env_id="arm", dt=0.01, seed=0,
                                episode_keys=arm_episode_keys())
    store.append_episodes([{"q": x[:, :2], "qd": x[:, 2:4], "qdd": x[:, 4:], "tau": tau}], [{"online": 0}])
    store.close()
    for protocol in ("iid", "block"):
        ref = sarcos_table.linear_reference(tmp_path / "arm.zarr", {"problem": "arm", "protocol": protocol, "seed": 0})
        # the residual is the noise alone: nMSE = noise variance over the targets' variance
        expected = noise**2 / tau.var(axis=0)
        assert ref["nmse"]["mean"] == pytest.approx(expected.mean(), rel=0.3)
        assert 0.9 <= ref["coverage"]["mean"] <= 1.0
        # far better than the training mean and variance (MSLL << 0), consistent with NLL in normalised units
        assert ref["msll"]["mean"] < -2.5
        assert ref["nll"]["mean"] - ref["msll"]["mean"] == pytest.approx(0.5 * np.log(2 * np.pi * np.e), abs=0.15)
