"""Real arm files: the MJCF files that ship with gymnasium, whose scenes hold more than the arm.

gymnasium's reacher (two hinges and a target on two slide joints) and pusher (a 7-joint
arm, an object and a goal on slide joints) go through ``gpdyn collect arm --joints``,
``gpdyn learn --problem arm`` and ``gpdyn control arm --joints --from-run``: the joints
left out are removed, the recorded torques stay inside the actuators' ranges, and a
store or learner of another choice of joints is refused. Without ``--joints`` such a file
is refused with a message that names the option and the joints it holds; a payload on an
arm without a payload body is refused, naming ``--payload-body``, before anything is
collected.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium
import mujoco
import numpy as np
import pytest

from gpdyn.cli import main
from gpdyn.config import flatten_dict
from gpdyn.data.problems import load_problem
from gpdyn.data.store import EpisodeStore
from gpdyn.experiments.prior_mean import load_prior_mean
from gpdyn.robots.arm import ArmModel, ArmModelError, inverse_dynamics, mjcf_identity
from gpdyn.runs import RunDir

ASSETS = Path(gymnasium.__file__).parent / "envs" / "mujoco" / "assets"
REACHER = ASSETS / "reacher.xml"
PUSHER = ASSETS / "pusher.xml"
REACHER_ARM = ["joint0", "joint1"]
PUSHER_ARM = ["r_shoulder_pan_joint", "r_shoulder_lift_joint", "r_upper_arm_roll_joint", "r_elbow_flex_joint",
              "r_forearm_roll_joint", "r_wrist_flex_joint", "r_wrist_roll_joint"]
# the pusher's motors give 2 N m; at 1 rad/s its damping and inertia stay inside that
PUSHER_VELOCITY = ",".join(["1"] * len(PUSHER_ARM))
# a learner small enough for a test: the pipeline, not its accuracy, is what is checked
LEARN = ["--learner", "svdgp", "--iterations", "20", "--batch-size", "128", "--n-delta", "16", "--eval-every", "10",
         "--size", "m_alpha=128", "--size", "m_beta=32", "--size", "n_columns=64"]


def _collect(model: Path, joints: list[str], store: Path, out: Path, *extra: str) -> int:
    return main(["collect", "arm", "--model", str(model), "--joints", ",".join(joints), "--store", str(store),
                 "--offline", "300", "--online", "300", *extra, "--out", str(out)])


@pytest.fixture(scope="module")
def reacher_learned(tmp_path_factory) -> tuple[Path, Path]:
    """A reacher store collected with ``--joints joint0,joint1`` and a learn run on it."""
    root = tmp_path_factory.mktemp("reacher")
    store, learn = root / "reacher.zarr", root / "learn"
    assert _collect(REACHER, REACHER_ARM, store, root / "collect") == 0
    assert main(["learn", "--store", str(store), "--problem", "arm", *LEARN, "--out", str(learn)]) == 0
    return store, learn


def _check_store(store: Path, joints: list[str], removed: list[str]) -> None:
    """The store records the chosen joints and those removed, and no torque beyond an actuator's range."""
    opened = EpisodeStore.open(store)
    attrs = opened.attrs
    assert attrs["joint_names"] == joints and attrs["removed_joints"] == removed and attrs["n_joints"] == len(joints)
    assert opened.fields["tau"].width == len(joints) and opened.n_rows == 600
    assert opened.episode_values("tau_over_limits").tolist() == [0] * opened.n_episodes
    limits = np.array(attrs["limits"]["torque"], dtype=np.float64)
    tau = opened.read("tau", 0, opened.n_rows)
    assert np.abs(tau).max() > 0 and (tau >= limits[:, 0]).all() and (tau <= limits[:, 1]).all()


def _check_control(run: Path, controllers: list[str], joints: list[str]) -> None:
    """The control run tracked with every controller and wrote its report; its config records the joints."""
    tracking = {r["controller"]: r["rmse"] for r in RunDir(run).metrics() if r.get("kind") == "tracking"}
    assert sorted(tracking) == sorted(controllers)
    for phases in tracking.values():
        assert all(len(v) == len(joints) and np.isfinite(v).all() for v in phases.values())
    assert flatten_dict(RunDir(run).config())["joints"] == joints  # the config tree's mjcf section
    assert f"({len(joints)} joints)" in (run / "report.md").read_text()


@pytest.mark.slow
def test_gymnasium_reacher_goes_through_collect_learn_and_control(reacher_learned, tmp_path: Path, capsys) -> None:
    store, learn = reacher_learned
    _check_store(store, REACHER_ARM, ["target_x", "target_y"])
    final = [r for r in RunDir(learn).metrics() if "nmse_mean" in r][-1]
    assert np.isfinite(final["nmse_mean"])
    control = tmp_path / "control"
    controllers = ["pd", "true", "frozen"]
    assert main(["control", "arm", "--model", str(REACHER), "--joints", ",".join(REACHER_ARM), "--learner", "svdgp",
                 "--from-run", str(learn), "--steps", "30", "--controllers", ",".join(controllers),
                 "--out", str(control)]) == 0
    said = capsys.readouterr()
    assert "reacher.xml (2 joints)" in said.out + said.err  # a message, on whichever stream messages go
    _check_control(control, controllers, REACHER_ARM)


@pytest.mark.slow
def test_gymnasium_pusher_arm_goes_through_collect_learn_and_control(tmp_path: Path) -> None:
    store, learn, control = tmp_path / "pusher.zarr", tmp_path / "learn", tmp_path / "control"
    assert _collect(PUSHER, PUSHER_ARM, store, tmp_path / "collect", "--velocity-limits", PUSHER_VELOCITY) == 0
    _check_store(store, PUSHER_ARM, ["obj_slidey", "obj_slidex", "goal_slidey", "goal_slidex"])
    assert main(["learn", "--store", str(store), "--problem", "arm", *LEARN, "--out", str(learn)]) == 0
    controllers = ["pd", "true", "frozen", "online"]  # online: the rigid-body filter on the 7 arm bodies
    assert main(["control", "arm", "--model", str(PUSHER), "--joints", ",".join(PUSHER_ARM), "--velocity-limits",
                 PUSHER_VELOCITY, "--learner", "svdgp", "--from-run", str(learn), "--steps", "30",
                 "--controllers", ",".join(controllers), "--out", str(control)]) == 0
    _check_control(control, controllers, PUSHER_ARM)


@pytest.mark.parametrize(("model", "found"), [
    (REACHER, ["joint0 (hinge)", "joint1 (hinge)", "target_x (slide)", "target_y (slide)", "--joints joint0,joint1"]),
    (PUSHER, [f"{j} (hinge)" for j in PUSHER_ARM] + ["obj_slidey (slide)", "goal_slidex (slide)",
                                                    "--joints " + ",".join(PUSHER_ARM)]),
])
def test_a_scene_file_without_joints_is_refused_naming_the_option_and_its_joints(
        model: Path, found: list[str], tmp_path: Path, capsys) -> None:
    store, run = tmp_path / "s.zarr", tmp_path / "run"
    assert main(["collect", "arm", "--model", str(model), "--store", str(store), "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert "name the arm's joints with --joints" in err and all(text in err for text in found), err
    assert main(["control", "arm", "--model", str(model), "--learner", "svdgp", "--out", str(run)]) == 2
    assert "--joints" in capsys.readouterr().err
    assert not store.exists() and not run.exists()


@pytest.mark.slow
def test_another_choice_of_joints_is_another_arm(reacher_learned, tmp_path: Path, capsys) -> None:
    store, learn = reacher_learned
    both, one = ArmModel(REACHER, joints=REACHER_ARM), ArmModel(REACHER, joints=["joint0"])
    assert both.sha256 == ArmModel(REACHER, joints=REACHER_ARM).sha256 == EpisodeStore.open(store).attrs["model_sha256"]
    assert both.sha256 != mjcf_identity(REACHER)[0] and one.sha256 not in (both.sha256, mjcf_identity(REACHER)[0])
    assert one.n == 1 and one.removed_joints == ("joint1", "target_x", "target_y")
    run = tmp_path / "run"
    for source in (["--from-run", str(learn)], ["--store", str(store)]):
        assert main(["control", "arm", "--model", str(REACHER), "--joints", "joint0", "--learner", "svdgp", *source,
                     "--steps", "10", "--out", str(run)]) == 2
        err = capsys.readouterr().err
        assert "collected from another arm" in err and "joints ['joint0']" in err, err
    assert not run.exists()
    # nor is the store continued with another choice
    assert _collect(REACHER, ["joint0"], store, tmp_path / "collect") == 2
    assert "collected with different" in capsys.readouterr().err


def test_joints_are_named_in_the_files_order_once_each(tmp_path: Path) -> None:
    for joints, message in ((["joint1", "joint0"], "in the file's order, joint0,joint1"),
                            (["joint0", "joint0"], "joint0 named more than once"),
                            (["joint0", "elbow"], "no joint 'elbow' in the file .its joints: joint0 .hinge."),
                            (["joint0", "target_x"], "'target_x' is a slide joint.*choose hinge joints with --joints"),
                            ([], "give the arm's joint names")):
        with pytest.raises(ArmModelError, match=message) as err:
            ArmModel(REACHER, joints=joints)
        assert str(REACHER) in str(err.value)
    # naming every joint of a file is the file itself, with the file's identity
    path = tmp_path / "two.xml"
    path.write_text(REACHER.read_text().split("<!-- Target -->")[0] + "</worldbody><actuator>"
                    + REACHER.read_text().split("<actuator>")[1])
    assert ArmModel(path, joints=REACHER_ARM).sha256 == ArmModel(path).sha256 == mjcf_identity(path)[0]
    assert "removed_joints" not in ArmModel(path, joints=REACHER_ARM).describe()


def test_a_joint_left_out_is_held_where_the_file_puts_it() -> None:
    """The inverse dynamics of the arm without its upper-arm roll joint is the full arm's with that joint at rest at
    its reference angle: the joint is welded, not dropped with its links."""
    full = ArmModel(PUSHER, joints=PUSHER_ARM)
    held = PUSHER_ARM.index("r_upper_arm_roll_joint")
    part = ArmModel(PUSHER, joints=[j for j in PUSHER_ARM if j != "r_upper_arm_roll_joint"])
    assert part.n == 6 and "r_upper_arm_roll_joint" in part.removed_joints
    assert part.model.body_mass.sum() == pytest.approx(full.model.body_mass.sum())  # every link is still there
    rng = np.random.default_rng(0)
    q, qd, qdd = (rng.uniform(-0.5, 0.5, (5, 7)) for _ in range(3))
    for a in (q, qd, qdd):
        a[:, held] = 0.0
    keep = [j for j in range(7) if j != held]
    tau_full = inverse_dynamics(full.model, mujoco.MjData(full.model), q, qd, qdd)
    tau_part = inverse_dynamics(part.model, mujoco.MjData(part.model), q[:, keep], qd[:, keep], qdd[:, keep])
    np.testing.assert_allclose(tau_part, tau_full[:, keep], atol=1e-10)
    assert np.abs(tau_full[:, held]).max() > 1e-3  # the held joint bears a load: the weld carries it


def test_a_payload_without_a_payload_body_names_the_option_before_collecting(tmp_path: Path, capsys) -> None:
    store, run = tmp_path / "s.zarr", tmp_path / "run"
    assert _collect(REACHER, REACHER_ARM, store, run, "--payload", "1") == 2
    err = capsys.readouterr().err
    assert "no body 'payload'" in err and "--payload-body" in err, err
    # control: refused before its run folder and its own collection (the load goes on only at --change-at)
    assert main(["control", "arm", "--model", str(REACHER), "--joints", ",".join(REACHER_ARM), "--learner", "svdgp",
                 "--payload", "1", "--steps", "10", "--out", str(run)]) == 2
    assert "--payload-body" in capsys.readouterr().err
    assert not store.exists() and not run.exists()
    no_body = "--payload-body nowhere: no body 'nowhere' to carry the payload .the arm has no named massless body"
    with pytest.raises(ArmModelError, match=no_body):
        ArmModel(REACHER, joints=REACHER_ARM, payload_body="nowhere")


@pytest.mark.slow
def test_the_rigid_body_prior_of_a_store_takes_its_joints(reacher_learned) -> None:
    store, _ = reacher_learned
    problem = load_problem(store, "arm")
    prior = load_prior_mean(f"rigid-body:{REACHER}", store, problem)
    x, y = problem.split("train")
    # the prior leaves out the joints' damping (1 N m s/rad in the file): the data is the prior plus it, exactly
    np.testing.assert_allclose(y - prior.physical(x), x[:, 2:4], atol=1e-8)


SCENE = """<mujoco><compiler angle="radian" autolimits="true"/><worldbody>
  <body><joint name="a" axis="0 0 1"/><geom size=".05" mass="1"/>
    <body pos=".3 0 0"><joint name="b" axis="0 1 0" range="-1 2"/><geom size=".05" mass="1"/></body></body>
  <body name="box" pos="1 0 .5"><freejoint name="box_free"/><geom size=".05" mass="1"/></body></worldbody>
  {tendon}<actuator><motor joint="a"/><motor joint="b"/></actuator>
  <sensor><jointpos joint="b"/><framepos objtype="body" objname="box"/></sensor>
  <keyframe><key qpos="0 0 1 0 .5 1 0 0 0"/></keyframe></mujoco>"""


def test_a_free_body_is_fixed_where_the_file_puts_it_and_what_names_a_removed_joint_goes_or_is_named(
        tmp_path: Path) -> None:
    path = tmp_path / "scene.xml"
    path.write_text(SCENE.format(tendon=""))
    arm = ArmModel(path, joints=["a", "b"])
    assert arm.n == arm.model.nq == arm.model.nv == 2 and arm.removed_joints == ("box_free",)
    box = arm.model.body("box")
    assert box.weldid[0] == 0 and box.pos.tolist() == [1.0, 0.0, 0.5]  # part of the fixed scene, where the file has it
    assert arm.model.nkey == 0 and arm.model.nsensor == 2  # the full model's keyframe goes; the sensors still read
    yaw = ArmModel(path, joints=["a"])  # b's actuator and its sensor go with it
    assert yaw.n == yaw.model.nu == 1 and yaw.model.nsensor == 1 and yaw.removed_joints == ("b", "box_free")
    path.write_text(SCENE.format(tendon='<tendon><fixed><joint joint="a" coef="1"/><joint joint="b" coef="1"/>'
                                        '</fixed></tendon>'))
    with pytest.raises(ArmModelError, match="--joints a: MuJoCo cannot compile the file without the joints b, "
                                            "box_free: .*joint 'b' not found in tendon"):
        ArmModel(path, joints=["a"])
