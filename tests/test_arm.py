"""Bring-your-own arm: a 3-link arm that gpdyn has never seen, from its MJCF file alone.

The file ``tests/data/three_link_arm.xml`` goes through ``gpdyn collect arm --model``,
the ``arm`` problem, ``gpdyn learn`` and ``gpdyn control arm --model`` with no code for it;
limits are read from motor and servo actuators as MuJoCo applies them; bad files are
refused with a message that names them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import mujoco
import numpy as np
import pytest
from synthetic import make_kuka_store

from gpdyn.cli import main
from gpdyn.data.problems import load_problem
from gpdyn.data.store import EpisodeStore, StoreError
from gpdyn.robots.arm import ArmModel, ArmModelError, inverse_dynamics
from gpdyn.sim.arm_env import ArmEnv
from gpdyn.runs import RunDir

THREE_LINK = Path(__file__).parent / "data" / "three_link_arm.xml"


def _tracking(run: Path) -> dict[str, dict[str, list[float]]]:
    return {r["controller"]: r["rmse"] for r in RunDir(run).metrics() if r.get("kind") == "tracking"}


@pytest.mark.slow
def test_a_new_arm_goes_from_its_mjcf_file_through_collect_learn_and_control(tmp_path: Path, capsys) -> None:
    store = tmp_path / "three.zarr"
    assert main(["collect", "arm", "--model", str(THREE_LINK), "--store", str(store), "--offline", "1500",
                 "--online", "1500", "--out", str(tmp_path / "collect")]) == 0
    assert "three_link_arm.xml (3 joints)" in capsys.readouterr().out
    opened = EpisodeStore.open(store)
    assert {f: opened.fields[f].width for f in ("q", "qd", "qdd", "tau")} == {"q": 3, "qd": 3, "qdd": 3, "tau": 3}
    assert opened.attrs["n_joints"] == 3 and opened.attrs["joint_names"] == ["yaw", "shoulder", "elbow"]
    assert opened.attrs["model_file"] == "three_link_arm.xml"
    assert opened.attrs["model_sha256"] == hashlib.sha256(THREE_LINK.read_bytes()).hexdigest()
    assert opened.n_rows == 3000 and list(opened.episode_values("online")) == [0] * 3 + [1] * 6

    problem = load_problem(store, "arm")
    assert problem.input_dim == 9 and problem.output_dim == 3
    with pytest.raises(StoreError, match="width 7"):  # the 7-DOF problem refuses a 3-joint store
        load_problem(store, "kuka")

    learn = tmp_path / "learn"
    assert main(["learn", "--store", str(store), "--problem", "arm", "--learner", "svdgp", "--iterations", "100",
                 "--batch-size", "256", "--n-delta", "32", "--eval-every", "50", "--size", "m_alpha=512",
                 "--size", "m_beta=64", "--size", "n_columns=256", "--out", str(learn)]) == 0
    final = [r for r in RunDir(learn).metrics() if "nmse_mean" in r][-1]
    assert np.isfinite(final["nmse_mean"]) and final["nmse_mean"] < 0.05

    control = tmp_path / "control"
    assert main(["control", "arm", "--model", str(THREE_LINK), "--learner", "svdgp", "--from-run", str(learn),
                 "--steps", "150", "--controllers", "pd,true,frozen", "--out", str(control)]) == 0
    rmse = {c: np.mean(phases["before"] + phases["after"]) for c, phases in _tracking(control).items()}
    assert rmse["true"] < 0.1 * rmse["pd"]  # the arm's own inverse dynamics: tracking ten times better
    assert rmse["frozen"] < 0.5 * rmse["pd"]  # the learned inverse dynamics beats PD alone
    report = (control / "report.md").read_text()
    assert "three_link_arm.xml computed-torque tracking (3 joints)" in report and "| frozen | before |" in report


def _write(tmp_path: Path, body: str, actuators: str = "", name: str = "arm.xml") -> Path:
    path = tmp_path / name
    path.write_text(f"""<mujoco><compiler angle="radian" autolimits="true"/><worldbody>{body}</worldbody>
                        <actuator>{actuators}</actuator></mujoco>""")
    return path


TWO_HINGES = """<body><joint name="a" axis="0 0 1"/><geom size=".05" mass="1"/>
  <body pos=".3 0 0"><joint name="b" axis="0 1 0" range="-1 2"/><geom size=".05" mass="1"/>
    <body name="tip" pos=".3 0 0"/></body></body>"""


@pytest.mark.parametrize(
    ("actuators", "torque"),
    [
        # motors: gear x ctrlrange (x gain), clipped by forcerange; a negative gear flips the range
        ('<motor joint="a" ctrlrange="-3 3" gear="2"/><motor joint="b" ctrlrange="-1 3" gear="-2"/>',
         [[-6, 6], [-6, 2]]),
        ('<motor joint="a" ctrlrange="-10 10" forcerange="-4 4" gear="2"/>'
         '<general joint="b" ctrlrange="-1 1" gainprm="5"/>', [[-8, 8], [-5, 5]]),
        # servos: only forcerange bounds the force (ctrlrange is a target position or velocity)
        ('<position joint="a" kp="50" ctrlrange="-1 1" forcerange="-7 7" gear="2"/>'
         '<velocity joint="b" kv="3" ctrlrange="-1 1"/>', [[-14, 14], [-np.inf, np.inf]]),
    ],
)
def test_torque_limits_are_read_as_mujoco_applies_them(tmp_path: Path, actuators: str, torque: list) -> None:
    arm = ArmModel(_write(tmp_path, TWO_HINGES, actuators))
    assert arm.n == 2 and arm.joint_names == ("a", "b")
    np.testing.assert_array_equal(arm.limits.torque, torque)
    np.testing.assert_allclose(arm.limits.position, [[-np.pi, np.pi], [-1, 2]])  # joint a is unlimited
    assert arm.limits.velocity is None and arm.payload_body is None


def test_joint_actuator_force_range_clips_the_torque(tmp_path: Path) -> None:
    body = TWO_HINGES.replace('name="b" axis="0 1 0"', 'name="b" axis="0 1 0" actuatorfrcrange="-5 1"')
    arm = ArmModel(_write(tmp_path, body, '<motor joint="a" ctrlrange="-3 3"/><position joint="b" kp="10" forcerange="-9 9" gear="2"/>'))
    np.testing.assert_array_equal(arm.limits.torque, [[-3, 3], [-5, 1]])


def test_servo_and_motor_arms_are_the_same_plant_under_torque_control(tmp_path: Path) -> None:
    """A servo becomes a torque source with its force range; a gear-2 motor takes the same joint torques."""
    motor = ArmModel(_write(tmp_path, TWO_HINGES, '<motor joint="a" ctrlrange="-4 4" gear="2"/>'
                                                   '<motor joint="b" ctrlrange="-3 3"/>', "motor.xml"))
    servo = ArmModel(_write(tmp_path, TWO_HINGES, '<position joint="b" kp="80" kv="4" forcerange="-3 3"/>'
                                                   '<velocity joint="a" kv="5" forcerange="-4 4" gear="2"/>', "servo.xml"))
    np.testing.assert_array_equal(motor.limits.torque, servo.limits.torque)
    rng = np.random.default_rng(0)
    tau = rng.uniform(-9, 9, size=(30, 2))  # some past the limits: both clamp the same way
    finals = []
    for arm in (motor, servo):
        env = ArmEnv(arm, frame_skip=5, reset_noise_scale=0.0)
        env.reset(seed=0)
        for t in tau:
            obs, *_ = env.step(t)
        finals.append(obs)
        env.close()
    np.testing.assert_allclose(finals[0], finals[1], atol=1e-12)
    assert np.abs(finals[0][2:]).max() > 0.1  # the torques moved the arm


def test_payload_body_and_joint_terms(tmp_path: Path) -> None:
    path = _write(tmp_path, TWO_HINGES, '<motor joint="a"/><motor joint="b"/>')
    with pytest.raises(ArmModelError, match="no body 'payload'"):
        ArmModel(path).new_model(payload_kg=1.0)
    arm = ArmModel(path, payload_body="tip", damping=0.3, armature=[0.01, 0.02])
    assert arm.joint_terms()["damping"] == [0.3, 0.3] and arm.joint_terms()["armature"] == [0.01, 0.02]
    plain, loaded = arm.new_model(), arm.new_model(payload_kg=2.0, payload_offset=(0.1, 0, 0))
    q = np.array([[0.0, 0.0]])
    zero = np.zeros((1, 2))
    extra = inverse_dynamics(loaded, mujoco.MjData(loaded), q, zero, zero) - inverse_dynamics(
        plain, mujoco.MjData(plain), q, zero, zero)
    # 2 kg on the vertical axis of a: no torque there; on b (axis +y) a lever of 0.3 + 0.1 m along +x,
    # where gravity's moment is +0.4 m g about y and holding it takes the opposite torque
    np.testing.assert_allclose(extra[0], [0.0, -2.0 * 9.81 * 0.4], atol=1e-9)
    with pytest.raises(ArmModelError, match="has 1 kg"):  # a body with mass is not a payload holder
        ArmModel(_write(tmp_path, TWO_HINGES.replace('<body name="tip" pos=".3 0 0"/>',
                                                     '<body name="tip" pos=".3 0 0"><geom size=".02" mass="1"/></body>'),
                        '<motor joint="a"/><motor joint="b"/>', "heavy.xml"), payload_body="tip")
    with pytest.raises(ArmModelError, match="damping must be one finite value >= 0 or one per joint"):
        ArmModel(path, damping=[0.1, 0.2, 0.3])


@pytest.mark.parametrize(
    ("body", "actuators", "message"),
    [
        ('<body><freejoint/><geom size=".1" mass="1"/></body>', "", "no hinge joints"),
        ('<body><geom size=".1" mass="1"/></body>', "", "no hinge joints"),
        (TWO_HINGES.replace('name="b" axis="0 1 0"', 'name="b" type="slide" axis="0 1 0"'),
         '<motor joint="a"/><motor joint="b"/>', "'b' is a slide joint"),
        (TWO_HINGES, '<motor joint="a"/>', "joint.s. b have no actuator"),
        (TWO_HINGES, '<motor joint="a"/><motor joint="b"/><motor name="twice" joint="b"/>', "has two actuators"),
        (TWO_HINGES, '<general joint="a" dyntype="filter" dynprm="0.1"/><motor joint="b"/>', "neither a motor nor a position/velocity servo"),
    ],
)
def test_unusable_models_are_refused_naming_the_file(tmp_path: Path, body: str, actuators: str, message: str) -> None:
    path = _write(tmp_path, body, actuators)
    with pytest.raises(ArmModelError, match=message) as err:
        ArmModel(path)
    assert str(path) in str(err.value)


def test_bad_model_files_exit_2_with_the_path(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nowhere.xml"
    assert main(["collect", "arm", "--model", str(missing), "--store", str(tmp_path / "s.zarr")]) == 2
    assert f"{missing}: no such MJCF file" in capsys.readouterr().err
    broken = tmp_path / "broken.xml"
    broken.write_text("<mujoco><worldbody><body></mujoco>")
    assert main(["control", "arm", "--model", str(broken), "--learner", "svdgp", "--out", str(tmp_path / "c")]) == 2
    assert "broken.xml: MuJoCo cannot load it" in capsys.readouterr().err
    assert not (tmp_path / "c").exists() and not (tmp_path / "s.zarr").exists()


def test_arm_problem_takes_any_joint_count_but_one_per_field(tmp_path: Path) -> None:
    seven = load_problem(make_kuka_store(tmp_path / "seven.zarr", offline=[30], online=[40]), "arm")
    assert (seven.input_dim, seven.output_dim) == (21, 7)
    four = load_problem(make_kuka_store(tmp_path / "four.zarr", offline=[30], online=[40], n_joints=4), "arm")
    assert (four.input_dim, four.output_dim) == (12, 4)
    odd = make_kuka_store(tmp_path / "odd.zarr", offline=[30], online=[40], n_joints=3, widths={"tau": 2})
    with pytest.raises(StoreError, match="'tau' of width 3 \\(as 'q'\\)"):
        load_problem(odd, "arm")


def test_the_users_example_arm_loads() -> None:
    """envs/three_link_arm.xml, the file envs/README.md walks through, is a valid arm."""
    arm = ArmModel(Path(__file__).parents[1] / "envs" / "three_link_arm.xml")
    assert arm.n == 3 and arm.payload_body == "payload" and arm.steps_per_sample(100.0) == 5
    np.testing.assert_array_equal(arm.limits.torque, [[-10, 10], [-20, 20], [-8, 8]])  # the shoulder's 4:1 gear
