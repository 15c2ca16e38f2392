"""Computed-torque tracking of arms with learned inverse dynamics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synthetic import make_kuka_store

from gpdyn.errors import InputError
from gpdyn.experiments.arm_config import ArmRunConfig
from gpdyn.experiments.control_arm import run_arm
from gpdyn.runs import RunDir


def _records(run: RunDir, kind: str) -> list[dict]:
    return [r for r in run.metrics() if r.get("kind") == kind]


@pytest.mark.slow
def test_kuka_tracking_runs_and_reports_rmse(tmp_path: Path) -> None:
    store = make_kuka_store(tmp_path / "kuka.zarr", offline=[60], online=[40, 40]).path
    cfg = ArmRunConfig.of(learner="svdgp", steps=6, change_at=3, pretrain_iterations=3, pretrain_batch=32, progress=False)
    run = RunDir.create("t", {}, out=tmp_path / "run")
    result = run_arm(run, cfg, store)
    assert set(result["rmse"]) == {"pd", "true", "frozen", "online"}
    for phases in result["rmse"].values():
        assert set(phases) == {"before", "after"} and all(len(v) == 7 for v in phases.values())
    # payload after the change, none before
    changed = [s["changed"] for s in _records(run, "step") if s["controller"] == "pd"]
    assert changed == [False] * 3 + [True] * 3
    episodes = _records(run, "episode")
    assert [e["controller"] for e in episodes] == ["pd", "true", "frozen", "online"]
    assert all(e["change"] == "+3 kg" and e["length"] == 6 for e in episodes)
    assert all(e["cpu_ms_per_step"] > 0 and e["cpu_ms_per_step_p95"] >= 0 for e in episodes)
    online = episodes[-1]
    assert online["gp_updates"] > 0 and online["online_learner"]
    assert all("online_learner" not in e for e in episodes[:-1])
    report = (run.path / "report.md").read_text()
    assert "| true | after |" in report and (run.path / "kuka_tracking.svg").exists()
    assert "## CPU time per control step (the period is 10 ms)" in report
    assert f"| online " in report.split("## CPU time")[1]
    # the gain schedule (on by default) is in the episode record and said in the report
    assert online["gains_rebuilt"] >= 0 and "rebuilt with the load its filter identifies" in report


def test_kuka_pd_gains_keep_the_sampled_loop_stable() -> None:
    """Gains on the diagonal of M made the 100 Hz loop unstable (the old 0.05 rad 'true model' error)."""
    from gpdyn.robots.arm import inertia_matrix, pd_gains, sampled_loop_radius
    from gpdyn.sim.arm_env import ArmEnv

    env = ArmEnv(family="kuka1", pattern_seed=0)
    poses = env.pattern.evaluate(np.arange(0.0, 4.0, 0.05), 1.0)[0]
    kp, kd = pd_gains(env.model, poses, 20.0)
    assert sampled_loop_radius(env.model, poses, kp, kd, 0.01) < 1.0
    m_diag = np.diag(inertia_matrix(env.model, poses[0]))
    assert sampled_loop_radius(env.model, poses, 400.0 * m_diag, 40.0 * m_diag, 0.01) > 1.2
    with pytest.raises(InputError, match="poses"):
        pd_gains(env.model, np.zeros((3, 6)), 20.0)
    env.close()


def test_kuka_true_model_tracks_to_a_millirad(tmp_path: Path) -> None:
    """Past t = 1.1 s, where the unstable gains used to chatter against the torque limits."""
    cfg = ArmRunConfig.of(steps=160, change_at=80, controllers=("pd", "true"), progress=False)
    result = run_arm(RunDir.create("t", {}, out=tmp_path / "run"), cfg)
    true = result["rmse"]["true"]
    assert max(true["before"]) < 5e-3 and max(true["after"]) < 1e-3
    assert np.mean(result["rmse"]["pd"]["after"]) > 10 * np.mean(true["after"])
