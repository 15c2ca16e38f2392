"""The feedback around the computed-torque feed-forward (gpdyn.control.feedback)."""

import mujoco
import numpy as np
import pytest

from gpdyn.control.computed_torque import ComputedTorqueController
from gpdyn.control.feedback import DiagonalFeedback, InertiaFeedback
from gpdyn.errors import InputError
from gpdyn.robots.arm import inertia_matrix, pd_gains
from gpdyn.robots.kuka import kuka_arm
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
    with pytest.raises(InputError, match="before reset"):
        InertiaFeedback.of_plant(OMEGA, model.nv).torque(np.zeros(model.nv), np.zeros(model.nv), np.zeros(model.nv))
    with pytest.raises(InputError, match="gains"):
        DiagonalFeedback(np.ones(3), np.ones(2))
