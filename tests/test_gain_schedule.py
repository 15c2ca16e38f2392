"""PD gains rebuilt on the load the rigid-body filter identifies (gpdyn.control.gain_schedule)."""

import mujoco
import numpy as np
import pytest
import torch

from gpdyn.control.feedback import InertiaFeedback
from gpdyn.control.gain_schedule import LOAD_RADIUS, PayloadGains, compact_load
from gpdyn.errors import InputError
from gpdyn.gp.residual import ZeroMean
from gpdyn.gp.rigid_body import RigidBodyGP
from gpdyn.robots.arm import inertia_matrix, inverse_dynamics, pd_gains
from gpdyn.robots.kuka import kuka_arm
from gpdyn.robots.regressor import InertialRegressor, body_linear, set_body_linear

N = 7
OMEGA, DT = 20.0, 0.01


def _samples(arm, rows, seed, payload):
    rng = np.random.default_rng(seed)
    low, high = arm.model.jnt_range[:N].T
    q = rng.uniform(0.8 * low, 0.8 * high, size=(rows, N))
    qd, qdd = rng.normal(0, 1, (rows, N)), rng.normal(0, 3, (rows, N))
    model = arm.torque_model(payload)
    tau = inverse_dynamics(model, mujoco.MjData(model), q, qd, qdd)
    return torch.as_tensor(np.concatenate([q, qd, qdd], 1)), torch.as_tensor(tau)


def test_a_compact_load_is_its_mass_at_its_centre_with_a_sphere_inertia() -> None:
    arm = kuka_arm()
    model = arm.torque_model()
    body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, arm.payload_body)
    centre = np.array([0.01, -0.02, 0.05])
    set_body_linear(model, body, body_linear(model, body) + compact_load(3.0, centre))
    expected_centre = (body_linear(arm.torque_model(), body)[1:4] + 3.0 * centre) / model.body_mass[body]
    np.testing.assert_allclose(model.body_ipos[body], expected_centre, atol=1e-12)
    assert model.body_mass[body] == pytest.approx(arm.torque_model().body_mass[body] + 3.0)
    assert (model.body_inertia[body] >= 0.4 * 3.0 * LOAD_RADIUS**2 - 1e-12).all()  # positive principal moments


def test_gains_follow_the_identified_payload_at_doubling_intervals() -> None:
    arm = kuka_arm(friction=0.0)
    x, tau = _samples(arm, 60, 1, 0.0)
    x_load, tau_load = _samples(arm, 200, 2, 3.0)
    stats = (np.zeros(3 * N), np.ones(3 * N), np.zeros(N), np.ones(N))  # physical units
    gp = RigidBodyGP(ZeroMean(3 * N, N), InertialRegressor(arm.torque_model()), stats, x,
                     change_bodies=[arm.payload_body])
    poses = x[:20, :N].numpy()
    schedule = PayloadGains(gp, arm.torque_model(), arm.payload_body, poses, OMEGA, DT, first=10, horizon=40)
    for row in range(60):  # the unloaded arm: no change detected, no new gains
        gp.observe(x[row : row + 1], tau[row : row + 1])
        assert schedule.update() is None
    assert gp.resets == 0
    rebuilt = {}
    for row in range(100):  # the payload: a detected change, then the gains at 10, 20 and 40 steps after it
        gp.observe(x_load[row : row + 1], tau_load[row : row + 1])
        gains = schedule.update()
        if gains is not None:
            rebuilt[row] = gains
    first = min(rebuilt)
    assert gp.resets >= 1 and sorted(rebuilt) == [first, first + 10, first + 30] and schedule.rebuilt == 3
    mass, centre = schedule.load
    assert mass == pytest.approx(3.0, abs=0.05) and np.allclose(centre, [0.0, 0.0, 0.05], atol=0.005)
    kp, kd = rebuilt[max(rebuilt)].kp, rebuilt[max(rebuilt)].kd
    nominal_kp, _ = pd_gains(arm.torque_model(), poses, OMEGA)
    assert (kp >= nominal_kp - 1e-9).all() and kp[5] > 1.5 * nominal_kp[5]  # the wrist (joint 6) feels the load most
    # the gains of the nominal arm with the true load as a compact one: what a perfect estimate would give
    model = arm.torque_model()
    body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, arm.payload_body)
    set_body_linear(model, body, body_linear(model, body) + compact_load(3.0, np.array([0.0, 0.0, 0.05])))
    ideal_kp, ideal_kd = pd_gains(model, poses, OMEGA)
    np.testing.assert_allclose(kp, ideal_kp, rtol=0.02)
    np.testing.assert_allclose(kd, ideal_kd, rtol=0.02)
    # the plant's load is a 5 cm sphere: the gains of joints 1-6 are within 5 % of its own (joint 7 turns the
    # sphere about its centre, where the compact load's smaller radius makes the difference)
    loaded_kp, _ = pd_gains(arm.torque_model(3.0), poses, OMEGA)
    np.testing.assert_allclose(kp[:6], loaded_kp[:6], rtol=0.05)


def test_the_inertia_feedback_is_rebuilt_on_the_arm_with_the_identified_load() -> None:
    arm = kuka_arm(friction=0.0)
    x, tau = _samples(arm, 60, 1, 0.0)
    x_load, tau_load = _samples(arm, 30, 2, 3.0)
    stats = (np.zeros(3 * N), np.ones(3 * N), np.zeros(N), np.ones(N))
    gp = RigidBodyGP(ZeroMean(3 * N, N), InertialRegressor(arm.torque_model()), stats, x,
                     change_bodies=[arm.payload_body])
    schedule = PayloadGains(gp, arm.torque_model(), arm.payload_body, x[:20, :N].numpy(), OMEGA, DT, first=10,
                            horizon=10, inertia=True)
    gp.observe(x, tau)
    feedback = []
    for row in range(30):
        gp.observe(x_load[row : row + 1], tau_load[row : row + 1])
        feedback.append(schedule.update())
    built = [f for f in feedback if f is not None]
    assert len(built) == 1 and isinstance(built[0], InertiaFeedback) and schedule.rebuilt == 1
    body = mujoco.mj_name2id(arm.torque_model(), mujoco.mjtObj.mjOBJ_BODY, arm.payload_body)
    nominal = arm.torque_model().body_mass[body]
    assert built[0].model.body_mass[body] == pytest.approx(nominal + 3.0, abs=0.05)
    # its inertia is the loaded arm's: M(q) of the plant with the 3 kg sphere, within the compact load's difference
    q = x_load[0, :N].numpy()
    plant = arm.torque_model(3.0)
    np.testing.assert_allclose(built[0].torque(q, np.full(N, 0.01), np.zeros(N)),
                               inertia_matrix(plant, q, mujoco.MjData(plant)) @ np.full(N, OMEGA**2 * 0.01),
                               rtol=0.05, atol=0.02)


def test_a_small_or_negative_mass_change_builds_no_gains_and_bad_options_are_refused() -> None:
    arm = kuka_arm(friction=0.0)
    x, tau = _samples(arm, 60, 3, 0.0)
    stats = (np.zeros(3 * N), np.ones(3 * N), np.zeros(N), np.ones(N))
    gp = RigidBodyGP(ZeroMean(3 * N, N), InertialRegressor(arm.torque_model()), stats, x,
                     change_bodies=[arm.payload_body])
    poses = x[:20, :N].numpy()
    schedules = [PayloadGains(gp, arm.torque_model(), arm.payload_body, poses, OMEGA, DT, first=1, min_mass=5.0),
                 PayloadGains(gp, arm.torque_model(), arm.payload_body, poses, OMEGA, DT, first=1, max_offset=0.01),
                 PayloadGains(gp, arm.torque_model(), arm.payload_body, poses, OMEGA, DT, first=1)]
    gp.observe(x, tau)
    x_load, tau_load = _samples(arm, 30, 4, 3.0)
    for row in range(30):
        gp.observe(x_load[row : row + 1], tau_load[row : row + 1])
        for schedule in schedules:
            schedule.update()
    # the 3 kg load 5 cm out is below 5 kg, and beyond 1 cm; the default schedule takes it
    assert gp.resets >= 1 and [s.rebuilt for s in schedules[:2]] == [0, 0] and schedules[2].rebuilt > 0
    with pytest.raises(InputError, match="no body 'gripper'"):
        PayloadGains(gp, arm.torque_model(), "gripper", x[:20, :N].numpy(), OMEGA, DT)
    with pytest.raises(InputError, match="first >= 1"):
        PayloadGains(gp, arm.torque_model(), arm.payload_body, x[:20, :N].numpy(), OMEGA, DT, first=0)
