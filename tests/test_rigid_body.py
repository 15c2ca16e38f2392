"""The rigid-body regressor and the rigid-body GP (Kalman updates, covariance reset on a plant change)."""

from pathlib import Path

import mujoco
import numpy as np
import pytest
import torch

from gpdyn.errors import InputError
from gpdyn.gp.base import LearnerError
from gpdyn.gp.residual import ZeroMean
from gpdyn.gp.rigid_body import WINDOW_HOLD, RigidBodyGP
from gpdyn.robots.arm import ArmModel, inverse_dynamics
from gpdyn.robots.kuka import kuka_arm
from gpdyn.robots.regressor import InertialRegressor

N = 7


@pytest.fixture(scope="module")
def arm():
    return kuka_arm()


@pytest.fixture(scope="module")
def regressor(arm):
    return InertialRegressor(arm.torque_model())


def states(arm, rows, seed):
    """Random states inside the joint limits (a limit's constraint force is not rigid-body dynamics)."""
    rng = np.random.default_rng(seed)
    low, high = arm.model.jnt_range[:N].T
    q = rng.uniform(0.8 * low, 0.8 * high, size=(rows, N))
    return q, rng.normal(0, 1, (rows, N)), rng.normal(0, 3, (rows, N))


def torques(arm, payload, q, qd, qdd):
    model = arm.torque_model(payload)
    return inverse_dynamics(model, mujoco.MjData(model), q, qd, qdd)


@pytest.mark.parametrize("payload", [0.0, 3.0])
def test_the_regressor_times_the_parameters_is_the_inverse_dynamics(arm, regressor, payload):
    q, qd, qdd = states(arm, 12, seed=1)
    frictionless = kuka_arm(friction=0.0)
    tau = torques(frictionless, payload, q, qd, qdd)
    predicted = regressor(q, qd, qdd) @ regressor.parameters(frictionless.torque_model(payload))
    np.testing.assert_allclose(predicted, tau, atol=1e-8 * np.abs(tau).max())  # exactly linear
    # dry friction is MuJoCo's soft constraint: linear in the friction loss only nearly (within 0.2 N m here)
    tau = torques(arm, payload, q, qd, qdd)
    predicted = regressor(q, qd, qdd) @ regressor.parameters(arm.torque_model(payload))
    np.testing.assert_allclose(predicted, tau, atol=0.2)
    assert regressor.p == 10 * len(regressor.bodies) + 3 * N
    with pytest.raises(InputError, match="finite"):
        regressor(q[0], qd[0], np.full(N, np.nan))
    with pytest.raises(InputError, match=r"\[N, 7\]"):
        regressor(q[:, :3], qd, qdd)


@pytest.mark.parametrize(("which", "payload"), [("kuka", 0.0), ("kuka", 1.0), ("three-link", 1.0)])
def test_each_regressor_column_is_the_inverse_dynamics_moved_along_its_parameter(which, payload):
    """The regressor's Newton-Euler columns against their definition (``by_differences``: the inverse dynamics
    of the arm with one parameter moved, minus the arm's), the massless payload mount included."""
    arm = kuka_arm() if which == "kuka" else ArmModel(Path(__file__).parent / "data" / "three_link_arm.xml")
    regressor = InertialRegressor(arm.torque_model(payload))
    n = regressor.n
    rng = np.random.default_rng(3)
    low, high = arm.model.jnt_range[:n].T
    q, qd, qdd = rng.uniform(0.8 * low, 0.8 * high, (4, n)), rng.normal(0, 1, (4, n)), rng.normal(0, 3, (4, n))
    np.testing.assert_allclose(regressor(q, qd, qdd), regressor.by_differences(q, qd, qdd), atol=1e-7, rtol=0)


def test_the_regressor_takes_a_bodys_gravity_compensation_off_its_weight(tmp_path):
    """MuJoCo's passive gravcomp (half of the upper arm's weight here) leaves that part out of the inverse dynamics;
    compensation through the actuators is refused by name."""
    text = (Path(__file__).parent / "data" / "three_link_arm.xml").read_text()
    assert '<body name="upper" pos="0 0 0.1">' in text
    path = tmp_path / "arm.xml"
    path.write_text(text.replace('<body name="upper" pos="0 0 0.1">', '<body name="upper" pos="0 0 0.1" gravcomp="0.5">'))
    arm = ArmModel(path)
    regressor = InertialRegressor(arm.torque_model(1.0))
    rng = np.random.default_rng(4)
    q, qd, qdd = rng.uniform(-1, 1, (4, 3)), rng.normal(0, 1, (4, 3)), rng.normal(0, 3, (4, 3))
    np.testing.assert_allclose(regressor(q, qd, qdd), regressor.by_differences(q, qd, qdd), atol=1e-7, rtol=0)
    path.write_text(path.read_text().replace('<joint name="shoulder"', '<joint name="shoulder" actuatorgravcomp="true"'))
    with pytest.raises(InputError, match="shoulder.*actuatorgravcomp"):
        InertialRegressor(ArmModel(path).torque_model())


def make_gp(regressor, x_reference, **options):
    stats = (np.zeros(3 * N), np.ones(3 * N), np.zeros(N), np.ones(N))  # physical units in and out
    return RigidBodyGP(ZeroMean(3 * N, N), regressor, stats, x_reference, **options)


def tensor(*parts):
    return torch.as_tensor(np.concatenate(parts, axis=-1), dtype=torch.float64)


def test_the_rigid_body_gp_learns_the_arm_and_follows_a_payload(arm, regressor):
    q, qd, qdd = states(arm, 120, seed=2)
    x = tensor(q, qd, qdd)
    gp = make_gp(regressor, x)
    held_q, held_qd, held_qdd = states(arm, 20, seed=3)
    held = tensor(held_q, held_qd, held_qdd)
    truth = {p: torch.as_tensor(torques(arm, p, held_q, held_qd, held_qdd)) for p in (0.0, 3.0)}
    # it starts as its prior (zero), with a variance
    assert torch.equal(gp.predict_mean(held), torch.zeros(20, N, dtype=torch.float64))
    var_before = gp.predict(held)[1]

    gp.observe(x[:60], torch.as_tensor(torques(arm, 0.0, q[:60], qd[:60], qdd[:60])))
    error = (gp.predict_mean(held) - truth[0.0]).abs().max()
    assert error < 0.05 * truth[0.0].abs().max() and gp.resets == 0
    assert (gp.predict(held)[1] < var_before).all()

    # the payload: the first sample of the changed arm is far outside the predictive distribution
    gp.observe(x[60:], torch.as_tensor(torques(arm, 3.0, q[60:], qd[60:], qdd[60:])))
    assert gp.resets >= 1
    error_after = (gp.predict_mean(held) - truth[3.0]).abs().max()
    assert error_after < 0.05 * truth[3.0].abs().max()
    assert error_after < 0.2 * (truth[3.0] - truth[0.0]).abs().max()  # it learned the payload, not kept the old arm
    assert torch.isfinite(gp.vlb(held, truth[3.0])).all()


def test_the_rigid_body_gp_refuses_bad_input(arm, regressor):
    q, qd, qdd = states(arm, 4, seed=4)
    x = tensor(q, qd, qdd)
    gp = make_gp(regressor, x)
    with pytest.raises(LearnerError, match="noise_std"):
        make_gp(regressor, x, noise_std=float("nan"))
    with pytest.raises(LearnerError, match="finite|NaN"):
        gp.observe(x[:1], torch.full((1, N), float("nan"), dtype=torch.float64))
    assert gp.observed == 0
    with pytest.raises(LearnerError, match="reference_x"):
        make_gp(regressor, x[:, :5])
    with pytest.raises(LearnerError, match="change_bodies.*gripper"):
        make_gp(regressor, x, change_bodies=["gripper"])


def test_a_change_at_the_payload_mount_is_learnt_in_a_few_samples(arm, regressor):
    """Re-opening the payload body's parameters at a detected change identifies a load from a few samples;
    re-opening all alike leaves ~100 unknowns against 7 equations per sample."""
    q, qd, qdd = states(arm, 70, seed=5)
    x = tensor(q, qd, qdd)
    held = tensor(*states(arm, 20, seed=6))
    held_np = held.numpy()
    truth = torch.as_tensor(torques(arm, 3.0, held_np[:, :N], held_np[:, N:2 * N], held_np[:, 2 * N:]))
    errors = {}
    for bodies in ([], [arm.payload_body]):
        gp = make_gp(regressor, x, change_bodies=bodies)
        gp.observe(x[:60], torch.as_tensor(torques(arm, 0.0, q[:60], qd[:60], qdd[:60])))
        gp.observe(x[60:63], torch.as_tensor(torques(arm, 3.0, q[60:63], qd[60:63], qdd[60:63])))  # 3 samples
        assert gp.resets == 1
        errors[len(bodies)] = float((gp.predict_mean(held) - truth).abs().max())
    assert errors[1] < 0.1 * errors[0] and errors[1] < 0.01 * float(truth.abs().max())


def test_a_batch_update_equals_one_sample_at_a_time_and_the_state_round_trips(arm, regressor):
    q, qd, qdd = states(arm, 8, seed=7)
    x, y = tensor(q, qd, qdd), torch.as_tensor(torques(arm, 0.0, q, qd, qdd))
    together, one_by_one = make_gp(regressor, x), make_gp(regressor, x)
    together.observe(x, y)
    for row in range(8):
        one_by_one.observe(x[row : row + 1], y[row : row + 1])
    torch.testing.assert_close(together.theta, one_by_one.theta, rtol=1e-6, atol=1e-8)
    # restored into one built on other reference inputs: the column scales come with the state
    restored = make_gp(regressor, tensor(*states(arm, 8, seed=8)))
    assert not torch.equal(restored.column_scale, together.column_scale)
    restored.load_state_dict(together.state_dict())
    assert torch.equal(restored.predict_mean(x), together.predict_mean(x)) and restored.observed == 8


def test_a_large_batch_is_one_update_of_fixed_size(arm, regressor):
    """300 rows (2,100 torques) are taken a chunk at a time: no 2,100 x 2,100 innovation covariance."""
    q, qd, qdd = states(arm, 300, seed=9)
    x, y = tensor(q, qd, qdd), torch.as_tensor(torques(arm, 0.0, q, qd, qdd))
    gp = make_gp(regressor, x)
    gp.observe(x, y)
    held = tensor(*states(arm, 10, seed=10))
    h = held.numpy()
    truth = torch.as_tensor(torques(arm, 0.0, h[:, :N], h[:, N:2 * N], h[:, 2 * N:]))
    assert (gp.predict_mean(held) - truth).abs().max() < 0.01 * truth.abs().max()


def test_an_arm_run_refuses_a_bad_change_body_before_collecting(tmp_path):
    from gpdyn.experiments.arm_config import ArmRunConfig
    from gpdyn.experiments.control_arm import run_arm
    from gpdyn.runs import RunDir

    cfg = ArmRunConfig.of(change_bodies=("gripper",), progress=False)
    with pytest.raises(InputError, match=r"change_bodies \['gripper'\].*payload"):
        cfg.check_arm(cfg.arm())
    run = RunDir.create("t", {}, out=tmp_path / "run")
    with pytest.raises(InputError, match="change_bodies"):
        run_arm(run, cfg)
    assert not (tmp_path / "run" / "kuka.zarr").exists()  # refused before any data was collected
    ArmRunConfig.of(change_bodies=("payload", "link7")).check_arm(cfg.arm())  # real bodies pass


def test_a_load_is_identified_sooner_when_a_change_reopens_its_mass_and_first_moment_alone(arm, regressor):
    """Consecutive samples of a tracking arm (10 ms apart, torques with 0.1 N m of noise) are nearly the same 7
    equations: after three of them a reset that opened the mount's mass and first moment (a compact load)
    predicts the next ones better than one that opened all ten of its terms; a term no body has is refused."""
    q, qd, qdd = states(arm, 60, seed=7)
    x = tensor(q, qd, qdd)
    seen = 3
    errors: dict[int, list[float]] = {4: [], 10: []}
    for path_seed in range(3):
        rng = np.random.default_rng(8 + path_seed)
        t = np.arange(8)[:, None] * 0.01
        amp, w, phase = rng.uniform(0.2, 0.5, N), rng.uniform(1, 3, N), rng.uniform(0, 2 * np.pi, N)
        q0 = 0.5 * np.mean(arm.model.jnt_range[:N], axis=1)
        path = (q0 + amp * np.sin(w * t + phase), amp * w * np.cos(w * t + phase), -amp * w**2 * np.sin(w * t + phase))
        loaded = torch.as_tensor(torques(arm, 3.0, *path))
        measured = loaded + 0.1 * torch.as_tensor(rng.standard_normal(loaded.shape))
        first, rest = tensor(*(p[:seen] for p in path)), tensor(*(p[seen:] for p in path))
        for terms in (("m", "mcx", "mcy", "mcz"), ("m", "mcx", "mcy", "mcz", "Ixx", "Iyy", "Izz", "Ixy", "Ixz", "Iyz")):
            gp = make_gp(regressor, x, change_bodies=[arm.payload_body], change_terms=terms)
            gp.observe(x, torch.as_tensor(torques(arm, 0.0, q, qd, qdd)))
            for row in range(seen):  # one sample per control step
                gp.observe(first[row : row + 1], measured[row : row + 1])
            assert gp.resets == 1
            errors[len(terms)].append(float((gp.predict_mean(rest) - loaded[seen:]).abs().max()))
    assert np.mean(errors[4]) < 0.6 * np.mean(errors[10]), errors
    with pytest.raises(LearnerError, match="change_terms"):
        make_gp(regressor, x, change_bodies=[arm.payload_body], change_terms=("mass",))


def test_the_windowed_change_test_catches_a_persistent_error_that_no_single_sample_shows(arm, regressor):
    """A torque error of 0.25 N m on one joint (2.5 times the assumed noise) never fails one sample's test
    (chi-square 20 with 7 degrees of freedom) but over 10 samples the summed innovations do: a small load that
    the arm's sag hides at first is found within the window instead of never (docs/control.md, the arm's
    change test)."""
    q, qd, qdd = states(arm, 80, seed=11)
    x = tensor(q, qd, qdd)
    nominal = torch.as_tensor(torques(arm, 0.0, q, qd, qdd))
    offset = torch.zeros(N, dtype=torch.float64)
    offset[1] = 0.25
    resets = {}
    for window in (0, 10):
        gp = make_gp(regressor, x, change_window=window)
        gp.observe(x[:60], nominal[:60])
        for row in range(60, 80):  # one sample per control step
            gp.observe(x[row : row + 1], nominal[row : row + 1] + offset)
            if window and gp.resets:
                resets["step"] = row - 60 + 1
                break
        resets[window] = gp.resets
    assert resets[0] == 0 and resets[10] == 1 and resets["step"] <= 12, resets
    with pytest.raises(LearnerError, match="change_window"):
        make_gp(regressor, x, change_window=-1)


def test_a_friction_change_is_identified_where_it_acts_when_a_reset_reopens_the_joints_dry_friction(arm, regressor):
    """Dry friction added at every joint (5 % of each torque limit, as `--change joint-friction`) is a torque offset
    on all seven joints that no payload explains. On a tracked path (one sample per 10 ms step, 200 before the
    change), re-opening each joint's dry friction at the reset (``change_friction_std``) predicts the samples 3-10
    after the change far better than re-opening the mount alone, whose terms take up what they can of the offset
    and leave the rest to creep in."""
    q, qd, qdd = states(arm, 60, seed=12)
    x = tensor(q, qd, qdd)
    changed = arm.torque_model(0.0)
    changed.dof_frictionloss[:N] += 0.05 * np.abs(arm.limits.torque).max(axis=1)
    rng = np.random.default_rng(13)
    t = np.arange(210)[:, None] * 0.01
    amp, w, phase = rng.uniform(0.2, 0.5, N), rng.uniform(1, 3, N), rng.uniform(0, 2 * np.pi, N)
    q0 = 0.5 * np.mean(arm.model.jnt_range[:N], axis=1)
    path = (q0 + amp * np.sin(w * t + phase), amp * w * np.cos(w * t + phase), -amp * w**2 * np.sin(w * t + phase))
    xs = tensor(*path)
    measured = torch.cat([torch.as_tensor(torques(arm, 0.0, *(p[:200] for p in path))),
                          torch.as_tensor(inverse_dynamics(changed, mujoco.MjData(changed), *(p[200:] for p in path)))])
    measured += 0.1 * torch.as_tensor(rng.standard_normal(measured.shape))
    errors = {}
    for std in (0.0, 3.0):
        gp = make_gp(regressor, x, change_bodies=[arm.payload_body], change_window=10, change_friction_std=std)
        predicted = []
        for row in range(210):  # one sample per control step, each predicted before it is learnt
            predicted.append(gp.predict_mean(xs[row : row + 1]))
            gp.observe(xs[row : row + 1], measured[row : row + 1])
        error = torch.cat(predicted)[202:210] - measured[202:210]
        errors[std] = float(error.pow(2).mean().sqrt())
    assert errors[3.0] < 0.2 * errors[0.0], errors
    with pytest.raises(LearnerError, match="change_friction_std"):
        make_gp(regressor, x, change_friction_std=-1.0)


def test_a_weaker_motor_is_not_taken_up_as_friction_that_flips_at_the_next_reversal(arm, regressor):
    """Motors at 70 % of their strength ask for every torque over 0.7: on a gravity-loaded joint an offset that
    does not follow the motion. Re-opening the dry friction only where the torque rose along the joint's motion
    keeps the one-step-ahead error after the change, across every joint's reversals, within 10 % of the filter
    that re-opens no friction; re-opening every joint's (the first version) made it 3.5x worse on this path."""
    q, qd, qdd = states(arm, 60, seed=17)
    x = tensor(q, qd, qdd)
    rng = np.random.default_rng(18)
    t = np.arange(400)[:, None] * 0.01
    amp, w, phase = rng.uniform(0.2, 0.5, N), rng.uniform(1, 3, N), rng.uniform(0, 2 * np.pi, N)
    q0 = 0.5 * np.mean(arm.model.jnt_range[:N], axis=1)
    path = (q0 + amp * np.sin(w * t + phase), amp * w * np.cos(w * t + phase), -amp * w**2 * np.sin(w * t + phase))
    assert (np.diff(np.sign(path[1][210:]), axis=0) != 0).any(axis=0).all()  # every joint reverses after the change
    xs = tensor(*path)
    commands = torch.as_tensor(torques(arm, 0.0, *path))
    commands[200:] /= 0.7
    commands += 0.1 * torch.as_tensor(rng.standard_normal(commands.shape))
    errors = {}
    for std in (0.0, 3.0):
        gp = make_gp(regressor, x, change_bodies=[arm.payload_body], change_window=10, change_friction_std=std)
        gp.observe(x, torch.as_tensor(torques(arm, 0.0, q, qd, qdd)))  # the arm, from states all over its range
        predicted = []
        for row in range(400):  # one sample per control step, each predicted before it is learnt
            predicted.append(gp.predict_mean(xs[row : row + 1]))
            gp.observe(xs[row : row + 1], commands[row : row + 1])
        assert gp.resets >= 1
        errors[std] = float((torch.cat(predicted)[210:] - commands[210:]).pow(2).mean().sqrt())
    assert errors[3.0] < 1.1 * errors[0.0], errors


def test_a_start_from_stored_samples_is_the_kalman_posterior_of_those_samples(arm, regressor):
    """start_from conditions theta on every stored torque at once: the same posterior as the Kalman updates
    of observe (whose change test is kept out of the way here), then re-opened by reset_std^2 on every
    parameter; it neither counts as observed nor resets, and the windowed test waits as after a reset."""
    q, qd, qdd = states(arm, 40, seed=11)
    x, y = tensor(q, qd, qdd), torch.as_tensor(torques(arm, 0.0, q, qd, qdd))
    started, filtered = make_gp(regressor, x), make_gp(regressor, x, change_threshold=1e12)
    started.start_from(x, y)
    filtered.observe(x, y)
    assert filtered.resets == 0 and started.resets == 0 and started.observed == 0
    torch.testing.assert_close(started.theta, filtered.theta, rtol=1e-6, atol=1e-6)
    opened = filtered.covariance + 0.3**2 * torch.eye(filtered.covariance.shape[0], dtype=torch.float64)
    torch.testing.assert_close(started.covariance, opened, rtol=1e-6, atol=1e-6)  # the prior variance is 100
    assert started.window_rows == -WINDOW_HOLD
    held = tensor(*states(arm, 10, seed=12))
    h = held.numpy()
    truth = torch.as_tensor(torques(arm, 0.0, h[:, :N], h[:, N:2 * N], h[:, 2 * N:]))
    assert (started.predict_mean(held) - truth).abs().max() < 0.05 * truth.abs().max()
    with pytest.raises(LearnerError, match="start_from"):
        make_gp(regressor, x).start_from(x, y * float("nan"))
