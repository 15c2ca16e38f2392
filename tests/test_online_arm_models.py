"""The GP learning online inside the arm controller: WISKI's incremental posterior, the rigid-body
filter whose prior learner keeps learning, the arm plant changes and their records."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic import make_kuka_store
from test_rigid_body import N, make_gp, states, tensor, torques

from gpdyn.control.computed_torque import ComputedTorqueController
from gpdyn.errors import InputError
from gpdyn.experiments.arm_config import CHANGES, ArmRunConfig
from gpdyn.experiments.control_arm import apply_change, run_arm
from gpdyn.gp import make_learner
from gpdyn.gp.base import LearnerError
from gpdyn.sim.arm_env import ArmEnv
from gpdyn.robots.kuka import kuka_arm
from gpdyn.robots.regressor import InertialRegressor
from gpdyn.runs import RunDir


def _data(rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 5, generator=g, dtype=torch.float64)
    return x, torch.sin(x[:, :2]) + 0.1 * torch.randn(rows, 2, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("structure", ["additive", "single"])
@pytest.mark.slow
def test_wiski_incremental_posterior_equals_a_full_refresh(structure: str) -> None:
    x, y = _data(260)
    options = {"structure": structure, "init_iters": 0, "seed": 0, "dtype": torch.float64}
    online = make_learner("wiski", 5, 2, incremental_rows=50, **options)
    full = make_learner("wiski", 5, 2, **options)
    for learner in (online, full):
        learner.observe(x[:200], y[:200])
        learner.predict_mean(x[:1])  # the full refresh both start from
    for row in range(200, 240):  # one row per "control step", each predicted after it entered
        for learner in (online, full):
            learner.observe(x[row : row + 1], y[row : row + 1])
        torch.testing.assert_close(online.predict_mean(x[240:]), full.predict_mean(x[240:]), rtol=1e-9, atol=1e-10)
    assert online._incremental_since == 40 and not online._stale  # no full solve was needed
    mean_o, var_o = online.predict(x[240:])
    mean_f, var_f = full.predict(x[240:])
    torch.testing.assert_close((mean_o, var_o), (mean_f, var_f), rtol=1e-9, atol=1e-10)
    # past incremental_rows the next prediction refreshes in full (the rounding of the updates is bounded)
    online.observe(x[240:251], y[240:251])
    assert online._stale


def test_wiski_incremental_rows_must_be_non_negative() -> None:
    with pytest.raises(LearnerError, match="incremental_rows"):
        make_learner("wiski", 5, 2, incremental_rows=-1)


@pytest.fixture(scope="module")
def arm():
    return kuka_arm()


@pytest.mark.slow
def test_the_rigid_body_filter_teaches_its_prior_what_the_rigid_body_term_leaves(arm) -> None:
    regressor = InertialRegressor(arm.torque_model())
    q, qd, qdd = states(arm, 40, seed=4)
    x = tensor(q, qd, qdd)
    y = torch.as_tensor(torques(arm, 3.0, q, qd, qdd))
    # a GP prior in physical units (the test's normaliser is the identity), learning online
    prior = make_learner("wiski", 3 * N, N, init_iters=0, incremental_rows=100, seed=0, dtype=torch.float64)
    prior.observe(x[:2], torch.zeros(2, N, dtype=torch.float64))
    gp = make_gp(regressor, x, learn_prior=True, prior_steps=1, prior_batch=8)
    gp.prior = prior
    assert gp.online_name == "wiski"
    for row in range(30):
        gp.observe(x[row : row + 1], y[row : row + 1])
        gp.step(x[row : row + 1], y[row : row + 1])
    assert gp.prior_updates == 60 and prior.n == 32 and gp.recent_rows == 30
    # what the prior observed: the torque less the rigid-body term, over beta
    p = regressor.p
    design = gp._design(x[29:30])
    rest = (y[29:30] - design[..., :p] @ gp.theta[:p]) / gp.theta[p:].clamp_min(0.1)
    assert torch.allclose(gp.recent_y[(gp.recent_rows - 1) % 8], rest[0], atol=1e-6 * rest.abs().max())
    # the model is the filter's rigid-body term plus beta times the prior, as before
    design = gp._design(x[30:])
    torch.testing.assert_close(gp.predict_mean(x[30:]), design @ gp.theta)
    # the state round trips with the ring of recent rows
    twin = make_gp(regressor, x, learn_prior=True, prior_steps=1, prior_batch=8)
    twin.prior = make_learner("wiski", 3 * N, N, init_iters=0, incremental_rows=100, seed=0, dtype=torch.float64)
    twin.load_state_dict(gp.state_dict())
    assert twin.recent_rows == 30 and torch.equal(twin.recent_y, gp.recent_y)
    torch.testing.assert_close(twin.predict_mean(x[30:]), gp.predict_mean(x[30:]))


def test_a_full_prior_stops_learning_and_says_so_while_the_filter_goes_on(arm) -> None:
    """An exact GP prior at its max_points takes no more rows (its observe would refuse them): the filter keeps
    learning, and the rows the prior could not take are counted in the diagnostics."""
    regressor = InertialRegressor(arm.torque_model())
    q, qd, qdd = states(arm, 12, seed=6)
    x = tensor(q, qd, qdd)
    y = torch.as_tensor(torques(arm, 3.0, q, qd, qdd))
    prior = make_learner("exact", 3 * N, N, max_points=6, seed=0, dtype=torch.float64)
    prior.observe(x[:4], torch.zeros(4, N, dtype=torch.float64))
    gp = make_gp(regressor, x, learn_prior=True)
    gp.prior = prior
    for row in range(4, 12):
        gp.observe(x[row : row + 1], y[row : row + 1])
    assert prior.n == 6 and gp.observed == 8
    assert gp.diagnostics()["prior_rows_refused"] == 6 and gp.prior_updates == 2


def test_a_frozen_prior_is_the_filter_alone(arm) -> None:
    regressor = InertialRegressor(arm.torque_model())
    x = tensor(*states(arm, 4, seed=5))
    gp = make_gp(regressor, x)
    assert gp.online_name == "rigid-body" and gp.step(x, torch.zeros(4, N, dtype=torch.float64)) == {}
    with pytest.raises(LearnerError, match="prior_steps"):
        make_gp(regressor, x, learn_prior=True, prior_steps=-1)


def _env() -> ArmEnv:
    env = ArmEnv(kuka_arm(), frame_skip=5)
    env.reset(seed=0)
    return env


def test_joint_friction_and_motor_gain_change_the_plant_by_what_they_say() -> None:
    env = _env()
    n = env.arm.n
    dofs = env.model.jnt_dofadr[:n]
    friction, damping = env.model.dof_frictionloss[dofs].copy(), env.model.dof_damping[dofs].copy()
    env.add_joint_friction(np.full(n, 2.0), np.arange(n, dtype=float))
    np.testing.assert_allclose(env.model.dof_frictionloss[dofs], friction + 2.0)
    np.testing.assert_allclose(env.model.dof_damping[dofs], damping + np.arange(n))
    gear = env.model.actuator_gear[env.arm.actuator_of_joint, 0].copy()
    env.scale_motor_gain(0.5)
    np.testing.assert_allclose(env.model.actuator_gear[env.arm.actuator_of_joint, 0], 0.5 * gear)
    # a weaker motor: the same command moves the arm less than before
    for bad in ((np.full(n, -1.0), np.zeros(n)), (np.zeros(n), np.full(n, np.nan)), (np.zeros(n - 1), np.zeros(n))):
        with pytest.raises(InputError, match="friction"):
            env.add_joint_friction(*bad)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InputError, match="motor gain"):
            env.scale_motor_gain(bad)


def test_the_true_feed_forward_drives_a_weakened_motor_harder() -> None:
    # the oracle of a motor-gain change commands the plant's inverse-dynamics torque over the gear:
    # with the feed-forward alone (no PD) it tracks the weakened arm as it tracks the nominal one
    n = _env().arm.n
    errors = []
    for gain in (1.0, 0.6):
        env = _env()
        env.scale_motor_gain(gain)
        controller = ComputedTorqueController("true", "true", (np.zeros(n), np.zeros(n)), env.dt)
        controller.reset(env)
        obs, info = env.reset(seed=0)
        for _ in range(30):
            obs, _, _, _, info = env.step(controller.act(obs, info)[0])
        errors.append(info["tracking_error"])
    assert errors[1] < 1.2 * errors[0] + 1e-3, errors


@pytest.mark.parametrize("change", CHANGES)
def test_each_arm_change_is_applied_and_named(change: str) -> None:
    env = _env()
    before = (env.model.body_mass.copy(), env.model.dof_frictionloss.copy(), env.model.actuator_gear.copy(),
              env.model.jnt_stiffness.copy())
    text = apply_change(ArmRunConfig.of(change=change), env)
    after = (env.model.body_mass, env.model.dof_frictionloss, env.model.actuator_gear, env.model.jnt_stiffness)
    changed = [not np.array_equal(a, b) for a, b in zip(before, after)]
    assert changed == [change == "payload", change == "joint-friction", change == "motor-gain",
                       change == "joint-spring"] and text


def test_joint_spring_pulls_each_joint_back_to_where_it_was_by_its_stiffness() -> None:
    """The spring is a passive torque -k (q - rest) on each arm joint, which the rigid-body regressor's
    inverse dynamics (inertia, armature, damping, friction) lacks; bad stiffness or rest is refused."""
    import mujoco

    env = _env()
    n = env.arm.n
    rest = env.data.qpos[:n].copy()
    k = np.arange(1, n + 1, dtype=float)
    env.add_joint_spring(k, rest)
    env.data.qpos[:n] = rest + 0.1
    env.data.qvel[:] = 0
    mujoco.mj_forward(env.model, env.data)
    spring = np.zeros(env.model.nv)
    mujoco.mj_passive(env.model, env.data)
    spring[:] = env.data.qfrc_spring if hasattr(env.data, "qfrc_spring") else env.data.qfrc_passive
    np.testing.assert_allclose(spring[env.model.jnt_dofadr[:n]], -0.1 * k, rtol=1e-9, atol=1e-9)
    for bad in ((np.full(n, -1.0), rest), (k, np.full(n, np.nan)), (np.zeros(n - 1), rest)):
        with pytest.raises(InputError, match="spring"):
            env.add_joint_spring(*bad)


@pytest.mark.parametrize("field, value", [("change", "gravity"), ("joint_friction", -0.1), ("motor_gain", 0.0),
                                          ("motor_gain", float("nan")), ("joint_spring", 0.0), ("gp_steps", -1)])
def test_bad_change_settings_are_refused_by_name(field: str, value) -> None:
    with pytest.raises(InputError, match=f"control kuka: {field} "):
        ArmRunConfig.of(**{field: value}).validate()


@pytest.mark.slow
def test_the_online_gp_is_the_recorded_online_learner_and_counts_its_updates(tmp_path: Path) -> None:
    store = make_kuka_store(tmp_path / "kuka.zarr", offline=[60], online=[40, 40]).path
    values = dict(learner="wiski", steps=8, change_at=4, change="motor-gain", controllers=("frozen", "online"), gp_online=True,
                  pretrain_iterations=2, pretrain_batch=32, progress=False)
    cfg = ArmRunConfig.of(**values)
    run = RunDir.create("t", {}, out=tmp_path / "run")
    run_arm(run, cfg, store)
    episodes = [r for r in run.metrics() if r.get("kind") == "episode"]
    online = next(e for e in episodes if e["controller"] == "online")
    # an observe per step: with gp_steps 0 (the default) the filter's steps learn nothing and are not taken
    assert online["online_learner"] == "wiski" and online["gp_updates"] == 8
    assert online["prior_updates"] == 8 and online["change"] == "motor gain x0.7"
    assert "motor gain x0.7 from step 4" in (run.path / "report.md").read_text()
    # with steps on the GP (gp_steps 1) each control step is an observe and a step
    stepped = RunDir.create("t", {}, out=tmp_path / "stepped")
    run_arm(stepped, ArmRunConfig.of(**values, gp_steps=1), store)
    online = next(e for e in stepped.metrics() if e.get("kind") == "episode" and e["controller"] == "online")
    assert online["gp_updates"] == 2 * 8
    # the default: the GP keeps learning under the filter (the recommended online model), a WISKI
    assert ArmRunConfig().adaptation.gp_online is True and ArmRunConfig().model.learner == "wiski"
