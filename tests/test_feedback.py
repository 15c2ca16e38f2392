"""The feedback around the computed-torque feed-forward (gpdyn.control.feedback)."""

import mujoco
import numpy as np
import pytest

from gpdyn.control.computed_torque import ComputedTorqueController
from gpdyn.control.feedback import BOUND_MARGIN, DiagonalFeedback, InertiaFeedback, stable_inertia_ratio
from gpdyn.control.gain_schedule import compact_load
from gpdyn.errors import InputError
from gpdyn.robots.arm import inertia_matrix, pd_gains
from gpdyn.robots.kuka import kuka_arm
from gpdyn.robots.regressor import body_linear, set_body_linear
from gpdyn.sim.arm_env import ArmEnv

OMEGA = 20.0


def _tracking_rms(feedback: str, payload: float, bias: float) -> float:
    """RMS tracking error of the plant's own feed-forward plus ``bias`` N m on every joint (a feed-forward error),
    steps 10-60 at 100 Hz, on the iiwa carrying ``payload`` kg."""
    arm = kuka_arm()
    env = ArmEnv(arm, frame_skip=arm.steps_per_sample(100.0))
    obs, info = env.reset(seed=0)
    env.set_payload(payload)
    poses = np.stack([env.reference(t)[0] for t in np.linspace(0.0, 4.0, 40)])
    law = (InertiaFeedback.of_plant(OMEGA, arm.n) if feedback == "inertia"
           else DiagonalFeedback(*pd_gains(arm.torque_model(), poses, OMEGA)))
    controller = ComputedTorqueController("true", "true", law, env.dt)
    controller.reset(env)
    errors = []
    for _ in range(60):
        obs, _, _, _, info = env.step(controller.act(obs, info)[0] + bias)
        errors.append(info["tracking_error"])
    return float(np.sqrt(np.mean(np.square(errors[10:]))))


def test_feedback_through_the_loaded_inertia_holds_a_loaded_arm_closer() -> None:
    # the diagonal gains are critically damped on the unloaded arm's smallest effective inertia: a 3 kg load at the
    # flange makes its wrist softer against the same feed-forward error; through the plant's inertia it is not
    loaded = {law: _tracking_rms(law, 3.0, 1.0) for law in ("inertia", "diagonal")}
    assert loaded["inertia"] < 0.8 * loaded["diagonal"], loaded
    unloaded = {law: _tracking_rms(law, 0.0, 1.0) for law in ("inertia", "diagonal")}
    assert unloaded["inertia"] == pytest.approx(unloaded["diagonal"], rel=0.15), unloaded
    assert loaded["inertia"] < unloaded["inertia"]  # the load's inertia resists the same torque error


def test_a_bounded_inertia_keeps_the_loop_stable_under_a_load_that_is_not_there() -> None:
    # a "load" the filter's first samples can show, 1.6 kg 22 cm off the flange, on the unloaded arm: through its
    # inertia the wrist is driven far past the stable ratio and the arm drifts off; bounded against the nominal arm's
    # inertia the loop stays stable and tracks
    arm = kuka_arm()
    nominal = arm.torque_model()
    body = mujoco.mj_name2id(nominal, mujoco.mjtObj.mjOBJ_BODY, arm.payload_body)
    spurious = arm.torque_model()
    set_body_linear(spurious, body, body_linear(spurious, body) + compact_load(1.6, np.array([-0.11, -0.19, 0.0])))
    final = {}
    for bounded in (False, True):
        env = ArmEnv(kuka_arm(), frame_skip=arm.steps_per_sample(100.0))
        obs, info = env.reset(seed=0)
        law = InertiaFeedback(spurious, OMEGA, arm.n, bound=(nominal, env.dt) if bounded else None)
        controller = ComputedTorqueController("true", "true", law, env.dt)
        controller.reset(env)
        for _ in range(100):
            obs, _, _, _, info = env.step(controller.act(obs, info)[0])
        final[bounded] = info["tracking_error"]
    assert final[True] < 0.002 and final[False] > 0.1, final
    # the bound: every generalised eigenvalue of the feedback's inertia against the nominal arm's within it
    law = InertiaFeedback(spurious, OMEGA, arm.n, bound=(nominal, 0.01))
    q = np.full(arm.n, 0.3)
    e = np.linalg.solve(inertia_matrix(nominal, q, mujoco.MjData(nominal)), np.eye(arm.n))
    applied = np.column_stack([law.torque(q, e[:, k] / OMEGA**2, np.zeros(arm.n)) for k in range(arm.n)])  # M_b M^-1
    ratios = np.linalg.eigvals(applied).real
    assert ratios.max() == pytest.approx(BOUND_MARGIN * stable_inertia_ratio(OMEGA, 0.01), rel=1e-9)
    assert stable_inertia_ratio(OMEGA, 0.01) == pytest.approx(4.0 / 0.84)


def test_inertia_feedback_is_the_inertia_times_the_pd_acceleration() -> None:
    model = kuka_arm().torque_model()
    law = InertiaFeedback(model, OMEGA, model.nv)
    rng = np.random.default_rng(0)
    q, e, ed = rng.normal(0, 0.5, model.nv), rng.normal(0, 0.01, model.nv), rng.normal(0, 0.1, model.nv)
    inertia = inertia_matrix(model, q, mujoco.MjData(model))
    np.testing.assert_allclose(law.torque(q, e, ed), inertia @ (OMEGA**2 * e + 2 * OMEGA * ed), rtol=1e-12)


def test_bad_feedback_settings_are_refused() -> None:
    model = kuka_arm().torque_model()
    with pytest.raises(InputError, match="omega"):
        InertiaFeedback(model, 0.0, model.nv)
    with pytest.raises(InputError, match="joints"):
        InertiaFeedback(model, OMEGA, model.nv + 1)
    with pytest.raises(InputError, match="dt > 0"):
        InertiaFeedback(model, OMEGA, model.nv, bound=(model, 0.0))
    with pytest.raises(InputError, match="before reset"):
        InertiaFeedback.of_plant(OMEGA, model.nv).torque(np.zeros(model.nv), np.zeros(model.nv), np.zeros(model.nv))
    with pytest.raises(InputError, match="gains"):
        DiagonalFeedback(np.ones(3), np.ones(2))
