"""MJCF arm files and arm stores: checks before collection or control, and the arm's identity.

A file is refused, naming it and the element or attribute, when its timestep, a joint
range or an actuator's gear is unusable or it has equality constraints; contacts are left
out of the inverse dynamics; torques beyond the actuators' ranges are counted and
reported; the identity hash covers included files, so a store or learner of another arm
(or of the same file with an edited include) is refused; sample rates outside what the
arm's timestep allows are refused naming --rate.
"""

from __future__ import annotations

import re
import struct
import warnings
import zlib
from pathlib import Path

import gymnasium
import mujoco
import numpy as np
import pytest
from synthetic import make_kuka_store

from gpdyn.cli import main
from gpdyn.data.store import EpisodeStore
from gpdyn.errors import InputError
from gpdyn.experiments.arm_config import ArmRunConfig
from gpdyn.experiments.control_arm import check_recorded_arm
from gpdyn.robots.arm import ArmModel, ArmModelError, inverse_dynamics, mjcf_identity
from gpdyn.runs import RunDir
from gpdyn.sim.arm import ArmConfigError, ArmStream, TorqueLimitWarning, collect_arm

GYM_ASSETS = Path(gymnasium.__file__).parent / "envs" / "mujoco" / "assets"
BODIES = """<body name="upper" pos="0 0 0.5"><joint name="{a}" axis="0 0 1"/><geom size=".05" mass="{mass}"/>
      <body name="fore" pos=".3 0 0"><joint name="{b}" axis="0 1 0" {range_b}/><geom size=".05" mass="1"/>
        <body name="tip" pos=".3 0 0"/></body></body>"""
ARM = """<mujoco model="two">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="{timestep}"/>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>{floor}{bodies}</worldbody>
  <actuator><motor name="ma" joint="{a}" ctrlrange="-{limit} {limit}" gear="{gear}"/>
    <motor name="mb" joint="{b}" ctrlrange="-{limit} {limit}"/></actuator>
  {equality}
</mujoco>"""


def _arm(tmp_path: Path, name: str = "arm.xml", *, timestep: str = "0.002", range_b: str = 'range="-1 2"',
         gear: str = "1", limit: float = 100, equality: str = "", floor: str = "", mass: float = 1.0,
         a: str = "a", b: str = "b", bodies: str | None = None) -> Path:
    """A two-hinge arm (vertical yaw joint a, pitch joint b) written to ``tmp_path/name``."""
    bodies = BODIES.format(a=a, b=b, range_b=range_b, mass=mass) if bodies is None else bodies
    path = tmp_path / name
    path.write_text(ARM.format(timestep=timestep, gear=gear, limit=limit, equality=equality, floor=floor,
                               bodies=bodies, a=a, b=b))
    return path


def _refused(path: Path, *names: str) -> str:
    """The message of ArmModelError for ``path``; it names the file and each of ``names``."""
    with pytest.raises(ArmModelError) as err:
        ArmModel(path)
    message = str(err.value)
    assert isinstance(err.value, InputError) and str(path) in message
    for name in names:
        assert name in message, (name, message)
    return message


# ---------------------------------------------------------------------------- timestep
@pytest.mark.parametrize("timestep", ["0", "nan", "-0.002", "inf", "-inf"])
def test_a_timestep_that_is_not_a_finite_time_above_0_is_refused(tmp_path: Path, timestep: str) -> None:
    _refused(_arm(tmp_path, timestep=timestep), "<option timestep=", "timestep must be a finite time > 0")


@pytest.mark.parametrize("timestep", ["0", "nan"])
def test_collect_arm_refuses_a_bad_timestep_with_exit_2_and_no_store(tmp_path: Path, timestep: str, capsys) -> None:
    """Before: ZeroDivisionError (0) and a ValueError traceback (nan) from the sample-rate arithmetic."""
    path, store = _arm(tmp_path, timestep=timestep), tmp_path / "s.zarr"
    assert main(["collect", "arm", "--model", str(path), "--store", str(store), "--offline", "10", "--online",
                 "10"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "timestep" in err and "Traceback" not in err
    assert not store.exists()


# ---------------------------------------------------------------------------- joint ranges
@pytest.mark.parametrize("range_b", ['range="1 -1"', 'range="nan 1"', 'range="0 inf"', 'range="1 1"',
                                     'range="-inf inf"', 'limited="true" range="-1 nan"'])
def test_a_joint_range_that_is_not_finite_and_increasing_is_refused(tmp_path: Path, range_b: str) -> None:
    """MuJoCo leaves an inverted or empty autolimits range unlimited (motion over +-pi) and keeps NaN or inf."""
    _refused(_arm(tmp_path, range_b=range_b), "joint 'b'", "range=", "low < high")


# ---------------------------------------------------------------------------- gear
@pytest.mark.parametrize(
    ("actuators", "actuator"),
    [
        ('<motor name="m0" joint="a" gear="0"/><motor joint="b"/>', "m0"),
        ('<motor joint="a"/><motor name="m1" joint="b" gear="0"/>', "m1"),
        ('<motor name="every" joint="a" gear="0"/><motor name="other" joint="b" gear="0"/>', "every"),
        ('<motor joint="a"/><position name="servo" joint="b" kp="10" forcerange="-5 5" gear="0"/>', "servo"),
        ('<motor name="nan" joint="a" gear="nan"/><motor joint="b"/>', "nan"),
    ],
)
def test_an_actuator_with_zero_or_no_gear_is_refused(tmp_path: Path, actuators: str, actuator: str) -> None:
    path = _arm(tmp_path)
    path.write_text(re.sub(r"<actuator>.*</actuator>", f"<actuator>{actuators}</actuator>", path.read_text(),
                           flags=re.S))
    _refused(path, f"actuator '{actuator}'", "gear=")


# ---------------------------------------------------------------------------- equality constraints
@pytest.mark.parametrize(
    ("equality", "element"),
    [
        ('<joint joint1="a" joint2="b"/>', "<joint>"),
        ('<joint name="coupled" joint1="b" polycoef="0.3 0 0 0 0"/>', '<joint name="coupled">'),
        ('<connect body1="tip" body2="world" anchor="0 0 0"/>', "<connect>"),
        ('<weld name="held" body1="fore"/>', '<weld name="held">'),
    ],
)
def test_active_equality_constraints_are_refused(tmp_path: Path, equality: str, element: str) -> None:
    """Their forces went into the recorded torques (a joint coupling: +-84 N m against +-5 N m actuators)."""
    path = _arm(tmp_path, equality=f"<equality>{equality}</equality>")
    _refused(path, "<equality>" + element, "mj_inverse")


def test_collect_arm_refuses_an_equality_constraint_with_exit_2(tmp_path: Path, capsys) -> None:
    path = _arm(tmp_path, equality='<equality><joint joint1="a" joint2="b"/></equality>')
    assert main(["collect", "arm", "--model", str(path), "--store", str(tmp_path / "s.zarr"), "--offline", "10",
                 "--online", "10"]) == 2
    assert "<equality><joint>" in capsys.readouterr().err and not (tmp_path / "s.zarr").exists()


# ---------------------------------------------------------------------------- good files pass every check
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"timestep": "0.001"},
        {"range_b": 'limited="true" range="-0.5 0.5"'},
        {"range_b": ""},  # an unlimited joint
        {"gear": "-3"},  # a negative gear turns the other way: a usable actuator
        {"equality": '<equality><joint joint1="a" joint2="b" active="false"/></equality>'},  # inactive: no force
    ],
)
def test_good_files_pass_the_checks(tmp_path: Path, options: dict) -> None:
    arm = ArmModel(_arm(tmp_path, **options))
    assert arm.n == 2 and arm.steps_per_sample(100.0) >= 1


# ---------------------------------------------------------------------------- contacts
FLOOR = '<geom name="floor" type="plane" size="2 2 .1" pos="0 0 0.5" contype="1" conaffinity="1"/>'


def _touching(tmp_path: Path, floor: str) -> Path:
    """The forearm's sphere lies on (inside) a floor plane when ``floor`` is given and collides with it."""
    bodies = BODIES.format(a="a", b="b", range_b='range="-1 2"', mass=1.0).replace(
        '<geom size=".05" mass="1"/>', '<geom size=".05" mass="1" contype="1" conaffinity="1"/>')
    return _arm(tmp_path, "floor.xml" if floor else "free.xml", floor=floor, bodies=bodies)


def test_contacts_are_left_out_of_the_recorded_torques(tmp_path: Path) -> None:
    """Before: the penetrating sphere's contact forces were recorded as joint torque."""
    torques = []
    for floor in (FLOOR, ""):
        stream = ArmStream("kuka1", "offline", 0, arm=ArmModel(_touching(tmp_path, floor)))
        torques.append(stream.next_segment(40)["tau"])
    np.testing.assert_allclose(torques[0], torques[1], rtol=0, atol=1e-9)
    model = ArmModel(_touching(tmp_path, FLOOR)).new_model()
    flags = model.opt.disableflags
    inverse_dynamics(model, mujoco.MjData(model), np.zeros((1, 2)), np.zeros((1, 2)), np.zeros((1, 2)))
    assert model.opt.disableflags == flags  # the model itself keeps its contacts (the control plant has them)


def test_gymnasiums_pusher_arm_records_torques_inside_its_actuators(tmp_path: Path) -> None:
    """The pusher arm without its object and goal: its wrist geoms collide with the table (before: 6500 N m vs 2).

    The offline speeds: at the fastest online ones the shoulder's inertia alone takes more than its 2 N m.
    """
    text = (GYM_ASSETS / "pusher.xml").read_text()
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r'<body name="object".*?</body>\s*<body name="goal".*?</body>', "", text, flags=re.S)
    path = tmp_path / "pusher_arm.xml"
    path.write_text(text)
    arm = ArmModel(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TorqueLimitWarning)
        store = collect_arm(tmp_path / "pusher.zarr", offline=90, online=0, arm=arm, progress=False)
    assert np.abs(store.read("tau")).max() <= 2.0 and store.episode_values("tau_over_limits").sum() == 0
    assert store.attrs["torque_source"] == "mujoco.mj_inverse on the true state, contacts excluded"


# ---------------------------------------------------------------------------- torques beyond the limits
def test_torques_beyond_the_actuators_are_counted_and_warned(tmp_path: Path) -> None:
    """Swinging 1 kg 0.3 m out about the yaw joint takes more than the motors' 0.5 N m."""
    arm = ArmModel(_arm(tmp_path, limit=0.5))
    with pytest.warns(TorqueLimitWarning, match="beyond its actuator's range") as record:
        store = collect_arm(tmp_path / "weak.zarr", offline=20, online=30, arm=arm, progress=False)
    counts = store.episode_values("tau_over_limits")
    tau = store.read("tau")
    expected = ((tau < -0.5) | (tau > 0.5)).any(axis=1)
    assert counts.sum() == expected.sum() > 0 and f"{counts.sum()} of 50 samples" in str(record[0].message)


def test_collect_arm_reports_torques_beyond_the_limits_per_joint(tmp_path: Path, capsys) -> None:
    path = _arm(tmp_path, limit=0.5)
    assert main(["collect", "arm", "--model", str(path), "--store", str(tmp_path / "s.zarr"), "--offline", "20",
                 "--online", "30", "--out", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    assert "samples beyond" in captured.out
    assert re.search(r"warning: \d+ of 50 samples have a joint torque beyond its actuator's range \(a \d+",
                     captured.err)
    logged = [r for r in RunDir(tmp_path / "run").metrics() if "tau_over_limits" in r][-1]
    assert logged["tau_over_limits"][0] > 0 and logged["samples_over_limits"] > 0


def test_a_strong_arm_collects_without_a_warning(tmp_path: Path, capsys) -> None:
    path = _arm(tmp_path, limit=100)
    assert main(["collect", "arm", "--model", str(path), "--store", str(tmp_path / "s.zarr"), "--offline", "20",
                 "--online", "30"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert EpisodeStore.open(tmp_path / "s.zarr").episode_values("tau_over_limits").sum() == 0


# ---------------------------------------------------------------------------- identity with includes
def _included(tmp_path: Path, mass: float = 1.0, nested: bool = False) -> Path:
    """main.xml includes parts/links.xml (the bodies); with ``nested`` links.xml includes parts/fore.xml."""
    parts = tmp_path / "parts"
    parts.mkdir(exist_ok=True)
    bodies = BODIES.format(a="a", b="b", range_b='range="-1 2"', mass=mass)
    if nested:
        fore = bodies[bodies.index('<body name="fore"'):bodies.rindex("</body>")]
        (parts / "fore.xml").write_text(f"<mujoco>{fore}</mujoco>")
        bodies = bodies.replace(fore, '<include file="parts/fore.xml"/>')
    (parts / "links.xml").write_text(f"<mujoco>{bodies}</mujoco>")
    return _arm(tmp_path, "main.xml", bodies='<include file="parts/links.xml"/>')


def _heavier(path: Path, factor: float = 5.0) -> None:
    path.write_text(path.read_text().replace('mass="1"', f'mass="{factor:g}"'))


def _png(grey: int) -> bytes:
    """A 1 x 1 grey PNG image."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)  # 1 x 1, 8-bit greyscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes([0, grey]))) + chunk(
        b"IEND", b"")


def _mesh_arm(tmp_path: Path) -> Path:
    """An arm whose forearm has a mesh (meshes/link.obj, under the compiler's meshdir) and a texture (look.png)."""
    (tmp_path / "meshes").mkdir(exist_ok=True)
    (tmp_path / "meshes" / "link.obj").write_text(
        "v 0 0 0\nv .1 0 0\nv 0 .1 0\nv 0 0 .1\nf 1 3 2\nf 1 2 4\nf 1 4 3\nf 2 3 4\n")
    (tmp_path / "look.png").write_bytes(_png(0))
    path = _arm(tmp_path, "mesh.xml", bodies=BODIES.format(a="a", b="b", range_b="", mass=1.0).replace(
        '<body name="tip"', '<geom type="mesh" mesh="link" density="1000"/><body name="tip"'))
    path.write_text(path.read_text().replace(
        "<worldbody>", '<compiler meshdir="meshes"/><asset><mesh name="link" file="link.obj"/>'
                       '<texture name="look" type="2d" file="look.png"/></asset><worldbody>'))
    return path


@pytest.mark.parametrize(
    ("make", "change"),
    [
        (lambda d: _included(d), lambda d: _heavier(d / "parts" / "links.xml")),
        (lambda d: _included(d, nested=True), lambda d: _heavier(d / "parts" / "fore.xml")),
        (lambda d: _included(d), lambda d: _heavier(d / "main.xml", 1.0) or (d / "main.xml").write_text(
            (d / "main.xml").read_text().replace('ctrlrange="-100 100" gear="1"', 'ctrlrange="-100 100" gear="2"'))),
        (_mesh_arm, lambda d: (d / "meshes" / "link.obj").write_text(
            (d / "meshes" / "link.obj").read_text().replace("v .1 0 0", "v .2 0 0"))),
    ],
    ids=["include", "nested-include", "main-file", "mesh"],
)
def test_the_arm_identity_changes_with_any_file_it_pulls_in(tmp_path: Path, make, change) -> None:
    path = make(tmp_path)
    before = ArmModel(path)
    change(tmp_path)
    after = ArmModel(path)
    assert before.sha256 != after.sha256
    assert after.describe()["model_sha256"] == after.sha256 == mjcf_identity(path)[0]


def test_the_arm_identity_lists_its_files_and_ignores_textures(tmp_path: Path) -> None:
    path = _included(tmp_path, nested=True)
    assert [f["file"] for f in ArmModel(path).files] == ["parts/links.xml", "parts/fore.xml"]
    mesh = _mesh_arm(tmp_path)
    before = ArmModel(mesh)
    assert [f["file"] for f in before.files] == ["meshes/link.obj"]
    (tmp_path / "look.png").write_bytes(_png(255))
    assert ArmModel(mesh).sha256 == before.sha256


def test_collect_refuses_to_continue_a_store_after_an_included_file_changed(tmp_path: Path) -> None:
    """Before: the recorded sha256 covered main.xml only, and the store was finished with a 5x heavier link."""
    path, store = _included(tmp_path), tmp_path / "s.zarr"
    collect_arm(store, offline=20, online=30, arm=ArmModel(path), progress=False)
    recorded = EpisodeStore.open(store).attrs
    assert recorded["model_files"][0]["file"] == "parts/links.xml"
    links = tmp_path / "parts" / "links.xml"
    original = links.read_text()
    _heavier(links)
    arm = ArmModel(path)
    with pytest.raises(ArmConfigError, match="different model_sha256") as err:
        collect_arm(store, offline=20, online=30, arm=arm, progress=False)
    message = str(err.value)
    assert recorded["model_sha256"] in message and arm.sha256 in message and "changed: parts/links.xml" in message
    links.write_text(original)  # back as it was: the store is that arm's again
    assert collect_arm(store, offline=20, online=30, arm=ArmModel(path), progress=False).n_rows == 50


# ---------------------------------------------------------------------------- stores and learners of another arm
@pytest.mark.parametrize(
    ("other", "change"),
    [
        ({"mass": 5.0}, None),  # same joints, another link mass
        ({"a": "yaw", "b": "pitch"}, None),  # same dynamics, other joints
        (None, "include"),  # the same main file, an included file edited since the collection
    ],
    ids=["heavier-link", "other-joint-names", "edited-include"],
)
@pytest.mark.slow
def test_control_arm_refuses_a_store_of_another_arm(tmp_path: Path, other, change, capsys) -> None:
    """Before: any store of the same joint count was accepted."""
    if change == "include":
        collected = controlled = _included(tmp_path)
    else:
        collected, controlled = _arm(tmp_path, "collected.xml"), _arm(tmp_path, "controlled.xml", **other)
    store = tmp_path / "s.zarr"
    collect_arm(store, offline=20, online=30, arm=ArmModel(collected), progress=False)
    if change == "include":
        _heavier(tmp_path / "parts" / "links.xml")
    recorded, arm = EpisodeStore.open(store).attrs["model_sha256"], ArmModel(controlled)
    assert main(["control", "arm", "--model", str(controlled), "--store", str(store), "--controllers", "pd,frozen",
                 "--steps", "4", "--out", str(tmp_path / "control")]) == 2
    err = capsys.readouterr().err
    assert f"--store {store} was collected from another arm" in err
    assert recorded in err and arm.sha256 in err and str(controlled) in err and collected.name in err
    assert not (tmp_path / "control").exists()


def test_control_arm_refuses_a_learner_trained_on_another_arm(tmp_path: Path, capsys) -> None:
    store = tmp_path / "s.zarr"
    collect_arm(store, offline=20, online=30, arm=ArmModel(_arm(tmp_path, "collected.xml")), progress=False)
    learn = RunDir.create("learn", {"learner": "svdgp", "problem": {"name": "arm", "source": str(store)}},
                          out=tmp_path / "learn")
    controlled = _arm(tmp_path, "controlled.xml", mass=2.0)
    assert main(["control", "arm", "--model", str(controlled), "--from-run", str(learn.path), "--steps", "4",
                 "--out", str(tmp_path / "control")]) == 2
    err = capsys.readouterr().err
    assert f"the learner of --from-run {learn.path} was trained on {store}" in err
    assert ArmModel(controlled).sha256 in err and not (tmp_path / "control").exists()


def test_stores_of_the_same_arm_or_without_a_record_pass(tmp_path: Path) -> None:
    path = _arm(tmp_path)
    store = tmp_path / "s.zarr"
    collect_arm(store, offline=20, online=30, arm=ArmModel(path), progress=False)
    copy = tmp_path / "copy" / "arm.xml"  # the same file elsewhere is the same arm
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())
    check_recorded_arm(store, ArmModel(copy), "test", "store")
    imported = make_kuka_store(tmp_path / "imported.zarr", offline=[20], online=[20], n_joints=2).path
    check_recorded_arm(imported, ArmModel(path), "test", "store")  # no arm recorded: the joint count decides


# ---------------------------------------------------------------------------- sample rates
@pytest.mark.parametrize("rate", ["1e-300", "0.001", "0.5", "1000", "1e300"])
def test_collect_refuses_a_rate_outside_what_the_timestep_allows(tmp_path: Path, rate: str, capsys) -> None:
    """Before: 1e-300 and 0.001 Hz were accepted (a sample every 1e300 s, every 1000 s)."""
    store = tmp_path / "s.zarr"
    assert main(["collect", "arm", "--model", str(_arm(tmp_path)), "--store", str(store), "--offline", "10",
                 "--online", "10", "--rate", rate]) == 2
    err = capsys.readouterr().err
    assert "--rate must be a finite rate in [1, 500] Hz" in err and not store.exists()


def test_collect_refuses_a_rate_that_is_not_a_whole_number_of_steps(tmp_path: Path, capsys) -> None:
    assert main(["collect", "arm", "--model", str(_arm(tmp_path)), "--store", str(tmp_path / "s.zarr"),
                 "--offline", "10", "--online", "10", "--rate", "333"]) == 2
    assert "--rate 333.0 Hz is not a whole number of the model's 2 ms simulation steps" in capsys.readouterr().err


@pytest.mark.parametrize(("rate", "steps"), [("500", 1), ("250", 2), ("1", 500)])
@pytest.mark.slow
def test_rates_from_one_step_to_one_hertz_collect(tmp_path: Path, rate: str, steps: int) -> None:
    store = tmp_path / "s.zarr"
    assert main(["collect", "arm", "--model", str(_arm(tmp_path)), "--store", str(store), "--offline", "10",
                 "--online", "10", "--rate", rate]) == 0
    attrs = EpisodeStore.open(store).attrs
    assert attrs["rate_hz"] == float(rate) and attrs["dt"] == pytest.approx(steps * 0.002)


def test_control_refuses_a_rate_before_anything_runs(tmp_path: Path) -> None:
    cfg = ArmRunConfig.of(robot="arm", model=str(_arm(tmp_path)), rate_hz=1e-300, payload=0.0, progress=False)
    cfg.validate()
    with pytest.raises(ArmModelError, match=r"rate_hz must be a finite rate in \[1, 500\] Hz"):
        cfg.check_arm(cfg.arm())
