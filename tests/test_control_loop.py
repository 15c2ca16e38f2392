"""The online control loops run a few steps with each learner on CPU and write their reports.

Sizes are tiny (a few steps, K = 8, H = 3) and the stores are synthetic: these tests check
the loop, the logs, the fallback and the report, not control quality.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic import make_walker_store

from gpdyn.cli import main
from gpdyn.control.dynamics import LearnedDynamics
from gpdyn.experiments.control_legged import (
    LeggedRunConfig,
    plant_change_step,
    pretrained_model,
    run_legged,
    legged_controller,
)
from gpdyn.robots.walker import LAYOUT
from gpdyn.config import flatten_dict
from gpdyn.data.store import EpisodeStore
from gpdyn.errors import InputError
from gpdyn.gp import LEARNERS, make_learner
from gpdyn.runs import RunDir
from gpdyn.robots.policy import load_policy
from gpdyn.sim.loop import run_episode

TINY = {"samples": 8, "sim_samples": 4, "horizon": 3, "pretrain_iterations": 3, "pretrain_batch": 32, "progress": False}


@pytest.fixture(scope="module")
def walker_zarr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ctl") / "walker.zarr"
    make_walker_store(path, [40, 35, 50])
    return path


def _records(run: RunDir, kind: str) -> list[dict]:
    return [r for r in run.metrics() if r.get("kind") == kind]


def _script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("learner", sorted(LEARNERS))
@pytest.mark.slow
def test_walker_loop_runs_with_each_learner(learner: str, walker_zarr: Path, tmp_path: Path) -> None:
    cfg = LeggedRunConfig.of(learner=learner, steps=3, change_at=1, controllers=("frozen", "online"), conditions=("changed",),
                          adapt="steps", **TINY)  # each learner's own observe/step
    run = RunDir.create("t", {}, out=tmp_path / "run")
    result = run_legged(run, cfg, walker_zarr)
    episodes = _records(run, "episode")
    assert [e["controller"] for e in episodes] == ["frozen", "online"]
    steps = _records(run, "step")
    assert all(math.isfinite(s["model_rmse"]) and s["pred_variance"] >= 0 for s in steps)
    assert [s["changed"] for s in steps if s["controller"] == "online"][:2] == [False, True]
    assert any("update_seconds" in s for s in steps if s["controller"] == "online")
    report = Path(result["report"]).read_text()
    assert "| online |" in report and "walker_return.svg" in report
    assert (run.path / "walker_return.svg").stat().st_size > 0
    assert EpisodeStore.open(run.path / "episodes.zarr").n_episodes == 2


@pytest.mark.slow
def test_walker_baselines_both_conditions(walker_zarr: Path, tmp_path: Path) -> None:
    cfg = LeggedRunConfig.of(learner="svdgp", steps=3, change="weak_motor", **TINY)
    run = RunDir.create("t", {}, out=tmp_path / "run")
    run_legged(run, cfg, walker_zarr)
    got = {(e["condition"], e["controller"]) for e in _records(run, "episode")}
    assert got == {(c, k) for c in ("nominal", "changed") for k in ("trpo", "true", "frozen", "online")}
    changed = [e for e in _records(run, "episode") if e["condition"] == "changed"]
    assert all(e["change"] == "right hip motor strength x0.5" for e in changed)
    report = (run.path / "report.md").read_text()
    for ctrl in ("trpo", "true", "frozen", "online"):
        assert f"| {ctrl} |" in report


def test_nan_model_falls_back_to_the_policy_and_logs_it(walker_zarr: Path, tmp_path: Path) -> None:
    cfg = LeggedRunConfig.of(learner="svdgp", steps=3, conditions=("nominal",), **TINY)
    _, dyn, _ = pretrained_model(cfg, walker_zarr)

    class Broken(LearnedDynamics):
        def predict_velocity(self, state, action):
            mean, var = super().predict_velocity(state, action)
            return torch.full_like(mean, math.nan), var

    broken = Broken(dyn.model, dyn.layout)
    run = RunDir.create("t", {}, out=tmp_path / "run")
    policy = load_policy()
    out = run_episode(cfg.legged_task.make_env(), legged_controller("frozen", cfg, policy, broken), steps=cfg.steps, reset_seed=3, log=run.log)
    steps = _records(run, "step")
    assert out.record["fallbacks"] == len(steps) == 3
    assert all(s["fallback"] for s in steps)
    actions = out.rows["action"]
    assert np.isfinite(actions).all()
    np.testing.assert_allclose(actions, policy.act(out.rows["obs"]), atol=1e-9)


def test_cli_control_bad_options_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["control", "walker", "--learner", "svdgp", "--steps", "5", "--change-at", "9", "--out", str(tmp_path / "a")]) == 2
    assert "change-at" in capsys.readouterr().err
    assert main(["control", "walker", "--learner", "nope", "--out", str(tmp_path / "b")]) == 2
    assert main(["control", "walker", "--learner", "svdgp", "--episodes", "0", "--out", str(tmp_path / "d")]) == 2
    assert "episodes" in capsys.readouterr().err
    assert main(["control", "kuka", "--learner", "svdgp", "--payload", "-1", "--out", str(tmp_path / "c")]) == 2


def test_a_plant_changed_in_mid_episode_stays_changed(walker_zarr: Path, tmp_path: Path) -> None:
    cfg = LeggedRunConfig.of(steps=4, episodes=2, change_at=2, controllers=("trpo",), conditions=("changed",), **TINY)
    # change_at counts the condition's steps over its episodes: after a fall at step 1 it comes at step 1
    assert [plant_change_step(cfg, "changed", elapsed) for elapsed in (0, 1, 4)] == [2, 1, 0]
    assert plant_change_step(cfg, "nominal", 0) is None
    run = RunDir.create("t", {}, out=tmp_path / "run")
    run_legged(run, cfg, walker_zarr)
    changed = [(s["episode"], s["t"], s["changed"]) for s in _records(run, "step")]
    assert changed == [(0, 0, False), (0, 1, False), (0, 2, True), (0, 3, True)] + [(1, t, True) for t in range(4)]


@pytest.mark.parametrize("kernel", ["se", "linear"])
@pytest.mark.slow
def test_walker_loop_with_residual_adaptation(kernel: str, walker_zarr: Path, tmp_path: Path) -> None:
    cfg = LeggedRunConfig.of(learner="svdgp", steps=4, change_at=1, adapt="residual", window=8, residual_kernel=kernel,
                          residual_gate=True, residual_gate_z=1.0, controllers=("online",), conditions=("changed",), **TINY)
    run = RunDir.create("t", {}, out=tmp_path / "run")
    run_legged(run, cfg, walker_zarr)
    steps = _records(run, "step")
    assert len(steps) == 4 and all(math.isfinite(s["model_rmse"]) for s in steps)
    assert all("update_seconds" in s for s in steps)
    with pytest.raises(InputError, match="adapt"):
        LeggedRunConfig.of(adapt="nope").validate()
    for bad in ({"residual_kernel": "nope"}, {"residual_forget": 0.0}, {"residual_gate_z": -1.0}, {"scale": "huge"}):
        with pytest.raises(InputError, match=next(iter(bad))):
            LeggedRunConfig.of(**bad).validate()


@pytest.mark.parametrize("target", ["change", "velocity"])
def test_learned_walker_dynamics_inverts_its_training_pairs(target: str, walker_zarr: Path) -> None:
    """What the learner is trained on maps back to the observed next velocity, for either target."""
    from gpdyn.data.problems import load_problem
    from gpdyn.robots.walker import QVEL_INPUTS

    problem = load_problem(walker_zarr, "walker-1")
    if target == "change":
        problem = problem.as_change_of(QVEL_INPUTS)
    learner = make_learner("exact", 23, 9, max_points=200)
    dyn = LearnedDynamics.from_learner(learner, problem.normalizer, LAYOUT, target=target)
    store = EpisodeStore.open(walker_zarr)
    ep = store.episode(0, ["qpos", "qvel", "action"])
    states = torch.as_tensor(np.concatenate([ep["qpos"], ep["qvel"]], 1))
    state, nxt = states[:20], states[1:21]
    action = torch.as_tensor(ep["action"][:20])
    x, y = dyn.training_pair(state, action, nxt)
    learner.observe(x, y)
    learner.set_hyperparameters(noise=1e-5)  # interpolate what it observed
    with torch.no_grad():
        v, _ = dyn.predict_velocity(state, action)
    torch.testing.assert_close(v, nxt[:, 9:], atol=0.05 * float(nxt[:, 9:].abs().max()), rtol=0)
    if target == "change":  # far from its data the model predicts the mean change: the velocity persists
        far = state.clone()
        far[:, 1:9] += 1e3
        with torch.no_grad():
            v0, _ = dyn.predict_velocity(far, action)
        torch.testing.assert_close(v0 - far[:, 9:], torch.as_tensor(problem.normalizer.y_mean).expand(20, 9))
    with pytest.raises(InputError, match="target"):
        LearnedDynamics.from_learner(learner, problem.normalizer, LAYOUT, target="position")


@pytest.mark.slow
def test_summarize_control_tables_several_seeds(walker_zarr: Path, tmp_path: Path) -> None:
    from dataclasses import asdict

    summarize_control = _script("summarize_control")
    runs = []
    for seed in (0, 1):
        cfg = LeggedRunConfig.of(learner="svi", steps=3, seed=seed, controllers=("trpo", "frozen", "online"), **TINY)
        run = RunDir.create("t", {"robot": "walker", **asdict(cfg)}, out=tmp_path / f"s{seed}")
        run_legged(run, cfg, walker_zarr)
        runs.append(run)
    text = summarize_control.summarize([r.path for r in runs])
    assert "| mean ± se |" in text and "online wins" in text
    for seed, run in enumerate(runs):
        row = next(line for line in text.splitlines() if line.startswith(f"| {seed} |"))
        got = [float(v.split()[0]) for v in row.strip(" |").split("|")[1:]]
        want = {(e["controller"], e["condition"]): e["return"] for e in _records(run, "episode")}
        expected = [want[(c, k)] for c in ("trpo", "frozen", "online") for k in ("nominal", "changed")]
        np.testing.assert_allclose(got, expected, atol=0.051)
    with pytest.raises(SystemExit, match="config.json"):
        summarize_control.summarize([tmp_path])


def test_plant_change_factor_scales_the_change_and_bad_factors_are_refused() -> None:
    from gpdyn.robots.walker import WALKER, make_env

    env = make_env()
    model = env.unwrapped.model
    gear = float(model.actuator_gear[0, 0])
    assert WALKER.apply_plant_change(model, "weak_motor", 0.3) == "right hip motor strength x0.3"
    assert float(model.actuator_gear[0, 0]) == pytest.approx(0.3 * gear)
    assert WALKER.apply_plant_change(model, "weak_motor") == "right hip motor strength x0.5"  # the default
    assert float(model.actuator_gear[0, 0]) == pytest.approx(0.15 * gear)
    env.close()
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(InputError, match="factor"):
            LeggedRunConfig.of(change="torso_mass", change_factor=bad).validate()
    with pytest.raises(InputError, match="unknown plant change"):
        LeggedRunConfig.of(change="gravity").validate()


@pytest.mark.slow
def test_walker_planning_relative_to_the_policy_runs_and_is_reported(walker_zarr: Path, tmp_path: Path) -> None:
    cfg = LeggedRunConfig.of(learner="svdgp", steps=3, relative_to_proposal=True, terminal_value=True, noise_std=0.1,
                          temperature=5.0, control_cost=1.0, proposal_tail=2, warm_start=False,
                          controllers=("true", "frozen", "online"),
                          conditions=("changed",), **TINY)
    run = RunDir.create("t", {}, out=tmp_path / "run")
    run_legged(run, cfg, walker_zarr)
    steps = _records(run, "step")
    assert len(steps) == 9 and not any(s.get("fallback") for s in steps)
    for s in steps:  # MPPI's weights rest on between one sample and all of them
        k = cfg.planner.sim_samples if s["controller"] == "true" else cfg.planner.mpc.samples
        assert 1.0 - 1e-9 <= s["effective_samples"] <= k + 1e-9
    report = (run.path / "report.md").read_text()
    assert "offsets to the TRPO policy's actions" in report and "TRPO critic as terminal value" in report
    assert "temperature 5," in report and "MPPI control cost x1" in report and "| effective samples |" in report
    assert "then 2 steps of the TRPO policy through the model" in report and "no warm start" in report
    for bad in ({"residual_lengthscale": 0.0}, {"residual_noise": -1.0}):
        with pytest.raises(InputError, match="residual"):
            LeggedRunConfig.of(**bad).validate()


@pytest.mark.slow
def test_walker_consecutive_episodes_keep_the_online_model(walker_zarr: Path, tmp_path: Path) -> None:
    from dataclasses import asdict

    cfg = LeggedRunConfig.of(learner="svdgp", steps=3, episodes=2, controllers=("trpo", "frozen", "online"),
                          conditions=("changed",), **TINY)
    run = RunDir.create("t", {"robot": "walker", **asdict(cfg)}, out=tmp_path / "run")
    run_legged(run, cfg, walker_zarr)
    episodes = _records(run, "episode")
    assert [(e["controller"], e["episode"]) for e in episodes] == [
        (c, k) for c in ("trpo", "frozen", "online") for k in (0, 1)]
    online = [e for e in episodes if e["controller"] == "online"]
    # the residual GP of episode 1 still holds episode 0's transitions
    assert [e["residual_points"] for e in online] == [online[0]["length"], online[0]["length"] + online[1]["length"]]
    assert all("residual_points" not in e for e in episodes if e["controller"] == "frozen")
    # an online controller names what it updates and counts the updates (over the episodes so far)
    # (each transition is one observe plus the updater's steps)
    assert [e["online_learner"] for e in online] == ["residual", "residual"]
    assert online[1]["gp_updates"] > online[0]["gp_updates"] >= online[0]["residual_points"]
    assert all("online_learner" not in e for e in episodes if e["controller"] != "online")
    steps = _records(run, "step")
    assert sorted({(s["controller"], s["episode"]) for s in steps}) == sorted((c, k) for c in ("frozen", "online", "trpo") for k in (0, 1))
    store = EpisodeStore.open(run.path / "episodes.zarr")
    assert store.n_episodes == 6
    start = [store.episode(i, ["qpos"])["qpos"][0] for i in range(6)]
    # episode k starts from the same state under every controller, and the two episodes differ
    for i in range(6):
        np.testing.assert_array_equal(start[i], start[i % 2])
    assert not np.array_equal(start[0], start[1])
    report = (run.path / "report.md").read_text()
    assert "Cells: mean over 2 consecutive episodes" in report and "after the first episode" in report
    assert "## CPU time per control step (the period is 8 ms)" in report and "| online | " in report.split("## CPU time")[1]
    assert (run.path / "walker_episode_returns.svg").stat().st_size > 0
    text = _script("summarize_control").summarize([run.path])
    returns = {(e["controller"], e["episode"]): e["return"] for e in episodes}
    for k in (0, 1):
        row = next(line for line in text.splitlines() if line.startswith(f"| 0 | {k + 1} |"))
        got = [float(v.split()[0]) for v in row.strip(" |").split("|")[2:]]
        np.testing.assert_allclose(got, [returns[(c, k)] for c in ("trpo", "frozen", "online")], atol=0.051)
    second = returns[("online", 1)] - returns[("frozen", 1)]
    assert f"- episodes 2–2 (after the online model has learned): {second:.1f} ± nan; online wins {int(second > 0)} of 1" in text


def test_cli_walker_episodes_and_cold_start_reach_the_run(walker_zarr: Path, tmp_path: Path) -> None:
    import json

    out = tmp_path / "run"
    assert main(["control", "walker", "--learner", "svdgp", "--store", str(walker_zarr), "--steps", "2", "--episodes", "2",
                 "--no-warm-start", "--cost", "track", "--track-offset-weight", "3", "--residual-gate",
                 "--residual-gate-z", "2", "--residual-kernel", "linear", "--residual-forget", "0.98",
                 "--controllers", "trpo", "--conditions", "changed", "--compiled", "--out", str(out)]) == 0
    config = flatten_dict(json.loads((out / "config.json").read_text()))
    assert config["episodes"] == 2 and config["warm_start"] is False and config["cost"] == "track"
    assert config["compiled"] is True
    assert config["track_offset_weight"] == 3.0 and config["residual_gate"] is True
    assert config["residual_gate_z"] == 2.0 and config["residual_kernel"] == "linear" and config["residual_forget"] == 0.98
    assert [(e["controller"], e["episode"]) for e in _records(RunDir(out), "episode")] == [("trpo", 0), ("trpo", 1)]


def test_tracking_cost_asks_a_weakened_motor_for_the_control_that_undoes_it() -> None:
    import copy

    from gpdyn.control.dynamics import SimDynamics, state_of
    from gpdyn.robots.walker import FRAME_SKIP, WALKER, make_env
    from gpdyn.robots.legged import NominalTrackingCost

    env = make_env()
    env.reset(seed=3)
    sim = env.unwrapped
    for _ in range(5):  # off the reset pose, feet on the ground or not
        env.step(0.3 * np.ones(6))
    nominal = SimDynamics(copy.deepcopy(sim.model), FRAME_SKIP)
    WALKER.apply_plant_change(sim.model, "weak_motor", 0.25)
    weak = SimDynamics(sim.model, FRAME_SKIP)
    state = torch.as_tensor(state_of(sim.data))[None].expand(3, -1).contiguous()
    policy_action = torch.tensor([0.2, -0.1, 0.3, -0.2, 0.1, 0.0], dtype=torch.float64)
    cost = NominalTrackingCost(nominal, lambda x: policy_action.expand(x.shape[0], -1), WALKER.cost())
    undo = policy_action.clone()
    undo[0] /= 0.25  # four times the control on the hip at a quarter strength: the same torque
    candidates = torch.stack([policy_action, undo, -policy_action])
    costs, done = cost(state, candidates, weak(state, candidates))
    assert float(costs[1]) < 1e-10 < float(costs[0]) < float(costs[2])
    assert not bool(done.any())
    same, _ = NominalTrackingCost(nominal, lambda x: policy_action.expand(x.shape[0], -1), WALKER.cost())(
        state, candidates, nominal(state, candidates))
    assert float(same[0]) == 0.0 and float(same[1]) > 0  # on the nominal plant the policy's own action is the best
    priced, _ = NominalTrackingCost(nominal, lambda x: policy_action.expand(x.shape[0], -1), WALKER.cost(), offset_weight=10.0)(
        state, candidates, weak(state, candidates))
    offsets = (candidates - policy_action).pow(2).sum(-1)
    torch.testing.assert_close(priced, costs + 10.0 * offsets)
    # samples from different states (later planned steps) are scored each against its own reference
    apart = torch.cat([state[:1], weak(state[:1], undo[None])])
    pair = cost(apart, undo.expand(2, -1), weak(apart, undo.expand(2, -1)))[0]
    alone = [float(cost(apart[i : i + 1], undo[None], weak(apart[i : i + 1], undo[None]))[0]) for i in range(2)]
    np.testing.assert_allclose(pair.numpy(), alone, rtol=1e-12, atol=1e-12)
    env.close()


@pytest.mark.slow
def test_walker_tracking_cost_with_the_frozen_model_is_the_policy(walker_zarr: Path, tmp_path: Path) -> None:
    # CEM returns its best sample; with the pretrained model tracking itself, zero offsets cost
    # exactly 0, so the frozen controller acts as the TRPO policy does, step for step
    cfg = LeggedRunConfig.of(learner="svdgp", steps=4, planner="cem", cost="track", relative_to_proposal=True,
                          warm_start=False, controllers=("trpo", "true", "frozen", "online"), conditions=("changed",),
                          change="weak_motor", change_factor=0.3, **{**TINY, "horizon": 1})
    run = RunDir.create("t", {}, out=tmp_path / "run")
    run_legged(run, cfg, walker_zarr)
    store = EpisodeStore.open(run.path / "episodes.zarr")
    actions = [store.episode(i, ["action"])["action"] for i in range(4)]
    np.testing.assert_allclose(actions[2], actions[0], atol=1e-12)
    assert not np.allclose(actions[1], actions[0])  # the true model knows the hip is weak
    steps = _records(run, "step")
    assert not any(s.get("fallback") for s in steps)
    assert "`--cost track`), action offsets priced x10" in (run.path / "report.md").read_text()
    with pytest.raises(InputError, match="terminal-value"):
        LeggedRunConfig.of(cost="track", terminal_value=True).validate()
    with pytest.raises(InputError, match="cost .regret. is not one of reward, track"):
        LeggedRunConfig.of(cost="regret").validate()
    with pytest.raises(InputError, match="track_offset_weight"):
        LeggedRunConfig.of(cost="track", track_offset_weight=-1.0).validate()


def test_run_episode_collects_rows_applies_the_change_and_logs_each_step() -> None:
    from gpdyn.sim.loop import PolicyController
    from gpdyn.sim.loop import BASE_ROWS, run_episode
    from gpdyn.robots.walker import make_env
    from gpdyn.robots.legged import state_rows

    policy = load_policy()
    logs: list[dict] = []
    env = make_env()
    changes = {2: "stiffer"}
    out = run_episode(env, PolicyController(policy.act, "trpo"), steps=5, reset_seed=4,
                      before_step=lambda t, e: changes.get(t), rows=state_rows, next_rows=("qpos", "qvel"),
                      log=lambda **r: logs.append(r), tags={"robot": "walker", "controller": "trpo"})
    env.close()
    assert set(out.rows) == {*BASE_ROWS, "qpos", "qvel", "next_qpos", "next_qvel"}
    assert all(v.shape[0] == 5 for v in out.rows.values()) and out.rows["reward"].shape == (5, 1)
    np.testing.assert_array_equal(out.rows["next_qpos"][:-1], out.rows["qpos"][1:])  # consecutive steps chain
    np.testing.assert_allclose(out.rows["action"], policy.act(out.rows["obs"]), atol=1e-12)
    steps = [r for r in logs if r["kind"] == "step"]
    assert [s["t"] for s in steps] == list(range(5)) and [s["changed"] for s in steps] == [False, False, True, True, True]
    assert all(s["controller"] == "trpo" for s in steps)
    assert logs[-1] == out.record and out.record["kind"] == "episode" and out.record["change"] == "stiffer"
    assert out.record["length"] == 5 and out.record["return"] == pytest.approx(float(out.rows["reward"].sum()))
    # the controller's CPU time per step: every step logs it, the episode its mean and 95th percentile
    cpu = np.array([s["cpu_ms"] for s in steps])
    assert (cpu >= 0).all() and out.record["cpu_ms_per_step"] == pytest.approx(cpu.mean())
    assert out.record["cpu_ms_per_step_p95"] == pytest.approx(np.percentile(cpu, 95))
    with pytest.raises(InputError, match="steps"):
        run_episode(make_env(), PolicyController(policy.act), steps=0, reset_seed=0)


def test_sim_dynamics_reproduces_the_environment_step() -> None:
    from gpdyn.sim.loop import PolicyController
    from gpdyn.control.dynamics import SimDynamics
    from gpdyn.sim.loop import run_episode
    from gpdyn.robots.walker import FRAME_SKIP, make_env
    from gpdyn.robots.legged import state_rows

    env = make_env()
    out = run_episode(env, PolicyController(load_policy().act), steps=6, reset_seed=5, rows=state_rows,
                      next_rows=("qpos", "qvel"))
    sim = SimDynamics(env.unwrapped.model, FRAME_SKIP)
    state = torch.as_tensor(np.concatenate([out.rows["qpos"], out.rows["qvel"]], 1))
    nxt = sim(state, torch.as_tensor(out.rows["action"]))
    np.testing.assert_allclose(nxt.numpy(), np.concatenate([out.rows["next_qpos"], out.rows["next_qvel"]], 1),
                               rtol=0, atol=1e-12)
    with pytest.raises(InputError, match="frame_skip"):
        SimDynamics(env.unwrapped.model, 0)
    with pytest.raises(InputError, match="state"):
        sim(state[:, :9], torch.as_tensor(out.rows["action"]))
    env.close()


def test_learned_model_adds_back_its_delta_columns_for_any_batch_shape() -> None:
    from gpdyn.control.dynamics import LearnedModel
    from gpdyn.data.problems import Normalizer

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(30, 4, generator=gen, dtype=torch.float64)
    y = torch.stack([x[:, 1] + 0.3 * x[:, 0], x[:, 3] - x[:, 2]], 1)  # y's change from x[:, [1, 3]] is smooth
    change = y - x[:, [1, 3]]
    normalizer = Normalizer(x.mean(0).numpy(), x.std(0).numpy(), change.mean(0).numpy(), change.std(0).numpy())
    learner = make_learner("exact", 4, 2, max_points=100)
    by_index = LearnedModel(learner, normalizer, delta_columns=[1, 3])
    xn, yn = by_index.training_pair(x, y)
    torch.testing.assert_close(yn, (change - torch.as_tensor(normalizer.y_mean)) / torch.as_tensor(normalizer.y_std))
    learner.observe(xn, yn)
    learner.set_hyperparameters(noise=1e-5)  # interpolate what it observed
    with torch.no_grad():
        mean, var = by_index.predict(x.numpy())  # numpy in, tensors out
        torch.testing.assert_close(mean, y, atol=0.02 * float(y.abs().max()), rtol=0)
        batched, batched_var = by_index.predict(x[:24].reshape(2, 3, 4, 4))
        torch.testing.assert_close(batched, mean[:24].reshape(2, 3, 4, 2))
        torch.testing.assert_close(batched_var, var[:24].reshape(2, 3, 4, 2))
        no_delta, _ = LearnedModel(learner, normalizer).predict(x)
        torch.testing.assert_close(mean - no_delta, x[:, [1, 3]])  # the delta adds the known inputs, nothing else
        torch.testing.assert_close(by_index.predict_mean(x[:24].reshape(2, 3, 4, 4)), batched, rtol=1e-10, atol=1e-10)
    with pytest.raises(InputError, match="x_mean"):
        LearnedModel(learner, Normalizer(np.zeros(3), np.ones(3), np.zeros(2), np.ones(2)))
    with pytest.raises(InputError, match="delta_columns"):
        LearnedModel(learner, normalizer, delta_columns=slice(0, 3))
    with pytest.raises(InputError, match="last axis"):
        by_index.predict(x[:, :3])


def test_learned_dynamics_integrates_positions_by_the_trapezoid_rule(walker_zarr: Path) -> None:
    cfg = LeggedRunConfig.of(learner="svdgp", **TINY)
    _, dyn, _ = pretrained_model(cfg, walker_zarr)
    store = EpisodeStore.open(walker_zarr)
    ep = store.episode(1, ["qpos", "qvel", "action"])
    state, action = torch.as_tensor(np.concatenate([ep["qpos"], ep["qvel"]], 1)), torch.as_tensor(ep["action"])
    with torch.no_grad():
        nxt, var = dyn(state, action)
        v1, var_v = dyn.predict_velocity(state, action)
    half = 0.5 * LAYOUT.dt
    torch.testing.assert_close(nxt, torch.cat([state[:, :9] + half * (state[:, 9:] + v1), v1], 1))
    torch.testing.assert_close(var, torch.cat([half**2 * var_v, var_v], 1))
    with torch.no_grad():  # the mean-only path the planners use when the cost ignores the variance
        torch.testing.assert_close(dyn.predict_mean(state, action), nxt, rtol=1e-10, atol=1e-10)
    with pytest.raises(InputError, match="nq == nv"):
        LearnedDynamics(dyn.model, type(LAYOUT)(nq=10, nv=9, nu=6, dt=0.008, position_inputs=tuple(range(2, 10))))


def test_walker_layout_matches_the_walker_1_problem(walker_zarr: Path) -> None:
    from gpdyn.data.problems import load_problem
    from gpdyn.robots.walker import ACTION_INPUTS, NU, NV, QVEL_INPUTS

    names = load_problem(walker_zarr, "walker-1").input_names  # the synthetic store numbers its columns
    assert len(names) == LAYOUT.input_dim
    assert names[: len(LAYOUT.position_inputs)] == tuple(f"qpos{i}[t]" for i in LAYOUT.position_inputs)
    assert names[QVEL_INPUTS] == tuple(f"qvel{j}[t]" for j in range(NV))
    assert names[ACTION_INPUTS] == tuple(f"a{k}[t]" for k in range(NU))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA (checks the refusal)")
def test_control_walker_refuses_a_missing_gpu_before_collecting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["control", "walker", "--learner", "svdgp", "--device", "cuda", "--out", str(tmp_path / "a")]) == 2
    assert "CUDA" in capsys.readouterr().err and not (tmp_path / "a").exists()
    run = RunDir.create("t", {}, out=tmp_path / "b")
    with pytest.raises(InputError, match="CUDA"):
        run_legged(run, LeggedRunConfig.of(device="cuda", **TINY))
    assert not (run.path / "walker.zarr").exists()


def test_residual_refit_iters_reach_the_residual_gp() -> None:
    """--residual-refit-iters sets the SE residual GP's Adam steps per refit: 0 keeps its
    hyperparameters as set (the GP learns none), the default 10 refits them; below 0 is refused."""
    from gpdyn.experiments.control_legged import residual_gp

    prior = make_learner("svdgp", LAYOUT.input_dim, LAYOUT.nv, preset="small", seed=0)
    reference = torch.randn(50, LAYOUT.input_dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for iters in (0, 10):
        res = residual_gp(prior, reference, LeggedRunConfig.of(residual_refit_iters=iters))
        assert res.config["refit_iters"] == iters and res.residual.learn_hyperparameters == (iters > 0)
    assert LeggedRunConfig().adaptation.residual_refit_iters == 10
    with pytest.raises(InputError, match="residual_refit_iters"):
        LeggedRunConfig.of(residual_refit_iters=-1).validate()


def test_the_online_model_is_built_with_its_prediction_caches(walker_zarr: Path) -> None:
    """online_model copies the pretrained learner with its prediction caches built (the first
    control step pays for planning only) and predicts as the frozen model before it learns."""
    from gpdyn.experiments.control_legged import online_model, train_inputs

    cfg = LeggedRunConfig.of(learner="svdgp", **TINY)
    learner, frozen, _ = pretrained_model(cfg, walker_zarr)
    model, _ = online_model(learner, frozen, cfg, train_inputs(cfg, walker_zarr))
    assert model.model.learner.prior._cache is not None
    state = torch.zeros(5, LAYOUT.nx, dtype=torch.float64)
    action = torch.full((5, LAYOUT.nu), 0.1, dtype=torch.float64)
    for got, want in zip(model(state, action), frozen(state, action)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
