"""KUKA iiwa model, trajectories, mj_inverse stream, collection and gymnasium env."""

from __future__ import annotations

from pathlib import Path

import gymnasium
import mujoco
import numpy as np
import pytest

import gpdyn.sim.arm_env  # noqa: F401  (registers gpdyn/KukaIiwa-v0)
from gpdyn.cli import main
from gpdyn.data.problems import load_problem
from gpdyn.data.store import EpisodeStore
from gpdyn.errors import InputError
from gpdyn.robots.arm import DEFAULT_PAYLOAD_OFFSET, discrete_feedforward, inverse_dynamics
from gpdyn.robots.kuka import ENV_ID, kuka_arm
from gpdyn.sim.arm import FAMILIES, ArmConfigError, ArmStream, SensorConfig, collect_arm

# Forward simulation of the feedforward torques over 1 s must stay this close to
# the commanded positions (it is exact up to round-off: the same Euler step inverted).
FORWARD_SIM_BOUND_RAD = 1e-9


def test_model_carries_published_parameters() -> None:
    arm = kuka_arm()
    model = arm.new_model()
    link_masses = [model.body(f"link{i}").mass[0] for i in range(1, 8)]
    np.testing.assert_allclose(link_masses, [5.76, 6.35, 3.5, 3.5, 3.5, 1.8, 1.2])
    limits = arm.limits
    np.testing.assert_allclose(limits.position[:, 1], [2.967, 2.094, 2.967, 2.094, 2.967, 2.094, 3.054])
    np.testing.assert_allclose(limits.position[:, 0], -limits.position[:, 1])
    np.testing.assert_allclose(limits.torque[:, 1], [320, 320, 176, 176, 110, 40, 40])
    np.testing.assert_allclose(limits.torque[:, 0], -limits.torque[:, 1])
    assert arm.n == 7 and arm.payload_body == "payload" and len(arm.sha256) == 64
    assert (model.dof_damping > 0).all() and (model.dof_armature > 0).all() and (model.dof_frictionloss > 0).all()
    assert model.opt.timestep == 0.001


def test_feedforward_torques_reproduce_trajectory_in_forward_simulation() -> None:
    env = gymnasium.make(ENV_ID, frame_skip=1, payload_kg=2.0, speed=1.8)
    sim = env.unwrapped
    h = sim.model.opt.timestep
    q_ref, _, _ = sim.pattern.evaluate(np.arange(-1, 1002) * h, 1.8)  # 1 s of 1 ms steps
    tau, v0 = discrete_feedforward(sim.model, q_ref)
    assert (np.abs(tau) <= sim.arm.limits.torque[:, 1]).all()  # MuJoCo would clamp otherwise
    env.reset(seed=0)
    sim.set_state(q_ref[1], v0)
    worst = 0.0
    for i in range(1000):
        obs, reward, terminated, truncated, info = env.step(tau[i])
        worst = max(worst, float(np.abs(obs[:7] - q_ref[i + 2]).max()))
    assert worst < FORWARD_SIM_BOUND_RAD
    assert info["t"] == pytest.approx(1.0)
    # open loop with zero torque, the arm falls away from the reference
    env.reset(seed=0)
    sim.set_state(q_ref[1], v0)
    for _ in range(200):
        obs, *_ = env.step(np.zeros(7))
    assert np.abs(obs[:7] - q_ref[201]).max() > 0.05
    env.close()


def test_stored_torques_give_the_commanded_acceleration() -> None:
    stream = ArmStream("kuka1", "online", seed=3, payload_kg=1.5)
    chunk = stream.next_chunk(200)
    model = stream.model
    data = mujoco.MjData(model)
    for i in range(0, 200, 7):
        data.qpos[:], data.qvel[:], data.ctrl[:] = chunk["q"][i], chunk["qd"][i], chunk["tau"][i]
        mujoco.mj_forward(model, data)
        np.testing.assert_allclose(data.qacc, chunk["qdd"][i], atol=1e-8)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.slow
def test_trajectories_stay_inside_every_joint_limit(family: str) -> None:
    fam = FAMILIES[family]
    limits = kuka_arm().limits
    lo, hi = limits.position.T
    pattern = fam.pattern(seed=11, limits=limits)
    t = np.arange(0.0, 600.0, 0.01)
    for speed in fam.offline_speeds + fam.online_speeds:
        q, qd, _ = pattern.evaluate(t, speed)
        assert ((lo < q) & (q < hi)).all()
        assert (np.abs(qd) < limits.velocity).all()
        q_range, qd_max = pattern.bounds(speed)
        assert (lo < q_range[:, 0]).all() and (q_range[:, 1] < hi).all() and (qd_max < limits.velocity).all()
    # the motion uses a good part of the velocity range at the fastest speed
    _, qd, _ = pattern.evaluate(t, fam.max_speed)
    assert (np.abs(qd).max(0) > 0.5 * limits.velocity).all()


def test_payload_adds_the_gravity_term_at_rest() -> None:
    mass, offset = 3.0, np.array([0.02, -0.01, 0.08])
    arm = kuka_arm()
    plain, loaded = arm.new_model(), arm.new_model(mass, offset)
    data = mujoco.MjData(loaded)
    rng = np.random.default_rng(0)
    for _ in range(5):
        q = rng.uniform(-0.8, 0.8, 7) * arm.limits.position[:, 1]
        zero = np.zeros((1, 7))
        diff = inverse_dynamics(loaded, data, q[None], zero, zero)[0] - inverse_dynamics(
            plain, mujoco.MjData(plain), q[None], zero, zero
        )[0]
        # expected: tau = -J_p^T m g, with J_p the translational Jacobian of the point
        # at ``offset`` in the flange frame (computed from the flange site, not the payload body)
        data.qpos[:] = q
        mujoco.mj_kinematics(loaded, data)
        mujoco.mj_comPos(loaded, data)
        flange = data.site("flange")
        point = flange.xpos + flange.xmat.reshape(3, 3) @ offset
        jacp = np.zeros((3, 7))
        mujoco.mj_jac(loaded, data, jacp, None, point, loaded.body("link7").id)
        expected = -jacp.T @ (mass * loaded.opt.gravity)
        np.testing.assert_allclose(diff, expected, atol=1e-10)
        assert np.abs(expected).max() > 1.0
    # by hand: arm stretched horizontally (joint 2 at 90 deg), 2 kg at 5 cm past the flange;
    # joint 2 to flange is 0.2045 + 0.2155 + 0.1845 + 0.2155 + 0.081 + 0.045 = 0.946 m
    q = np.array([[0.0, np.pi / 2, 0, 0, 0, 0, 0]])
    zero = np.zeros((1, 7))
    two_kg = arm.new_model(2.0, (0.0, 0.0, 0.05))
    diff = inverse_dynamics(two_kg, mujoco.MjData(two_kg), q, zero, zero) - inverse_dynamics(
        plain, mujoco.MjData(plain), q, zero, zero
    )
    assert diff[0, 1] == pytest.approx(-2.0 * 9.81 * (0.946 + 0.05), rel=1e-9)


def test_stream_chunks_samples_payload_change_and_seeding() -> None:
    a = ArmStream("kuka2", "offline", seed=5, segment_samples=40)
    b = ArmStream("kuka2", "offline", seed=5, segment_samples=40)
    chunk = a.next_chunk(100)  # crosses two segment (speed) boundaries
    assert chunk["tau"].shape == (100, 7) and list(np.unique(chunk["segment"])) == [0, 1, 2]
    np.testing.assert_allclose(np.unique(chunk["speed"]), sorted(FAMILIES["kuka2"].offline_speeds[:3]))
    samples = [s for _, s in zip(range(100), b)]
    assert samples[0]["q"].shape == (7,) and isinstance(samples[0]["speed"], float)
    np.testing.assert_array_equal(np.stack([s["tau"] for s in samples]), chunk["tau"])
    # a payload change acts from the next sample on
    before = a.next_chunk(5)
    b_next = b.next_chunk(5)
    np.testing.assert_array_equal(before["tau"], b_next["tau"])
    b.set_payload(5.0)
    after_b, after_a = b.next_chunk(5), a.next_chunk(5)
    np.testing.assert_array_equal(after_b["q"], after_a["q"])
    assert np.abs(after_b["tau"] - after_a["tau"]).max() > 1.0


def test_finite_difference_derivatives_and_noise() -> None:
    exact = ArmStream("kuka1", "online", seed=2).next_segment(500)
    fd = ArmStream("kuka1", "online", seed=2, sensors=SensorConfig(derivatives="fd")).next_segment(500)
    np.testing.assert_array_equal(fd["q"], exact["q"])
    assert np.abs(fd["qd"] - exact["qd"]).max() < 1e-3
    assert np.abs(fd["qdd"] - exact["qdd"]).max() < 1e-2
    noisy = ArmStream(
        "kuka1", "online", seed=2, sensors=SensorConfig(torque_noise=0.5, position_noise=1e-3)
    ).next_segment(500)
    assert np.std(noisy["tau"] - exact["tau"]) == pytest.approx(0.5, rel=0.1)
    assert np.std(noisy["q"] - exact["q"]) == pytest.approx(1e-3, rel=0.1)
    np.testing.assert_array_equal(noisy["qdd"], exact["qdd"])


def test_collect_writes_the_store_contract(tmp_path: Path) -> None:
    store = collect_arm(tmp_path / "k.zarr", offline=130, online=250, payload=1.0, family="kuka1", seed=4, progress=False)
    store = EpisodeStore.open(tmp_path / "k.zarr")
    assert store.n_rows == 380
    for name in ("q", "qd", "qdd", "tau"):
        assert store.fields[name].width == 7 and store.fields[name].dtype == "float64"
    assert [store.fields[n].unit for n in ("q", "qd", "qdd", "tau")] == ["rad", "rad/s", "rad/s^2", "N m"]
    online = store.episode_values("online")
    assert online.dtype == np.int8 and list(online) == [0] * 3 + [1] * 6
    assert store.episode_lengths[:3].sum() == 130 and store.episode_lengths[3:].sum() == 250
    assert store.attrs["family"] == "kuka1" and store.attrs["payload_kg"] == 1.0
    assert store.attrs["dt"] == 0.01 and store.attrs["rate_hz"] == 100.0
    assert store.attrs["payload_offset"] == list(DEFAULT_PAYLOAD_OFFSET)
    problem = load_problem(store, "kuka", protocol="ordered")  # ILGR: offline part initialises
    assert problem.input_dim == 21 and problem.output_dim == 7 and len(problem.x_init) == 130
    mixed = load_problem(store, "kuka", protocol="iid")  # SVDGP: both parts mixed, 90/10
    assert len(mixed.x_train) + len(mixed.x_test) == 380 and len(mixed.x_init) == 0
    # the same seed gives the same data
    again = collect_arm(tmp_path / "k2.zarr", offline=130, online=250, payload=1.0, seed=4, progress=False)
    np.testing.assert_array_equal(again.read("tau"), store.read("tau"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"offline": -1},
        {"offline": 0, "online": 0},
        {"family": "kuka3"},
        {"payload": -1.0},
        {"payload": float("nan")},
        {"payload_offset": (0.0, 0.1)},
        {"rate_hz": 300.0},
        {"seed": -1},
    ],
)
def test_collect_refuses_impossible_settings(tmp_path: Path, kwargs: dict) -> None:
    with pytest.raises(InputError):
        collect_arm(tmp_path / "bad.zarr", **{"offline": 10, "online": 10, "progress": False, **kwargs})
    assert not (tmp_path / "bad.zarr").exists()


@pytest.mark.parametrize(
    "kwargs", [{"torque_noise": float("nan")}, {"position_noise": -1e-3}, {"derivatives": "spline"}]
)
def test_sensor_config_refuses_bad_values(kwargs: dict) -> None:
    with pytest.raises(ArmConfigError, match=next(iter(kwargs))):
        SensorConfig(**kwargs)


def test_estimated_joint_terms_are_options() -> None:
    """Damping, armature and friction are guesses; joint 7's torque is almost all theirs."""
    shipped, rigid = kuka_arm(), kuka_arm(damping=0, armature=0, friction=0)
    assert shipped.joint_terms()["damping"] == [0.5] * 7  # the file's values by default
    assert rigid.joint_terms() == {"damping": [0.0] * 7, "armature": [0.0] * 7, "friction": [0.0] * 7}
    tau = {name: ArmStream(arm=arm, part="online", seed=0).next_chunk(1000)["tau"]
           for name, arm in (("shipped", shipped), ("rigid", rigid))}
    rms = {name: np.sqrt((t**2).mean(0)) for name, t in tau.items()}
    assert rms["rigid"][6] < 0.01 * rms["shipped"][6]
    assert rms["rigid"][1] == pytest.approx(rms["shipped"][1], rel=0.05)  # gravity dominates joint 2
    one = kuka_arm(friction=[0, 0, 0, 0, 0, 0, 0.3])
    assert one.joint_terms()["friction"] == [0.0] * 6 + [0.3]
    with pytest.raises(InputError, match="armature must be one finite value >= 0 or one per joint"):
        kuka_arm(armature=[0.1, 0.1])


@pytest.mark.slow
def test_cli_collect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cli.zarr"
    args = ["collect", "kuka", "--store", str(path), "--offline", "20", "--online", "40", "--family", "kuka2"]
    assert main([*args, "--torque-noise", "0.1", "--derivatives", "fd"]) == 0
    out = capsys.readouterr().out
    assert "60 samples" in out and "320" in out
    store = EpisodeStore.open(path)
    assert store.attrs["derivatives"] == "fd" and store.attrs["torque_noise"] == 0.1
    assert main(args) == 2  # the store exists, collected with other settings
    assert "collected with different torque_noise, derivatives" in capsys.readouterr().err
    damped = tmp_path / "damped.zarr"
    assert main(["collect", "kuka", "--store", str(damped), "--offline", "10", "--online", "10", "--damping", "0.2",
                 "--friction", "0,0,0,0,0,0,0.05"]) == 0
    terms = EpisodeStore.open(damped).attrs["joint_terms"]
    assert terms["damping"] == [0.2] * 7 and terms["friction"] == [0.0] * 6 + [0.05]
    assert terms["armature"] == kuka_arm().joint_terms()["armature"]
    assert main(["collect", "kuka", "--store", str(tmp_path / "bad.zarr"), "--damping", "0.1,0.2"]) == 2
    assert "damping must be one finite value" in capsys.readouterr().err


def test_env_tracks_its_reference_with_computed_torque() -> None:
    env = gymnasium.make(ENV_ID, payload_kg=1.0)
    sim = env.unwrapped
    obs, info = env.reset(seed=0)
    assert obs.shape == (14,) and env.action_space.shape == (7,)
    data = mujoco.MjData(sim.model)
    rewards = []
    for _ in range(100):  # 1 s at 100 Hz: PD on top of the true inverse dynamics
        q, qd = obs[:7], obs[7:]
        t_next = info["t"] + sim.dt
        q_ref, qd_ref, qdd_ref = sim.reference(t_next)
        qdd_cmd = qdd_ref + 400.0 * (q_ref - q) + 40.0 * (qd_ref - qd)
        tau = inverse_dynamics(sim.model, data, q[None], qd[None], qdd_cmd[None])[0]
        obs, reward, terminated, truncated, info = env.step(tau)
        rewards.append(reward)
    assert info["tracking_error"] < 0.01 and not terminated
    env.close()
