"""A generic n-DOF arm built from any MuJoCo MJCF file.

:class:`ArmModel` loads the file and reads what the rest of gpdyn needs from the
compiled model, so that a new arm needs no code:

- the joints: every joint must be a hinge (a fixed-base serial or branched chain);
  ``n`` joints give ``q, qd, qdd, tau`` of ``n`` columns each. ``joints`` picks the arm
  out of a larger scene (:func:`select_joints`): every other joint is removed from the
  model, so its body is welded at its pose in the file (a target or object on slide or
  free joints becomes part of the fixed scene), and the actuators and sensors of removed
  joints go with them;
- position limits: ``jnt_range`` where the joint is limited (``jnt_limited``); an
  unlimited hinge moves within +-pi (:data:`UNLIMITED_RANGE`), the room the
  trajectory generator may use;
- torque limits: the joint torque each joint's one actuator can give, read as MuJoCo
  applies it (:func:`actuator_torque_range`): a motor's ``ctrlrange`` times its gain,
  a servo's (``<position>``, ``<velocity>``) ``forcerange``, either clipped by
  ``forcerange`` where ``forcelimited`` and by the joint's ``actuatorfrcrange``, and
  all multiplied by the gear ratio (the joint torque is gear x actuator force);
- velocity limits: MJCF has no such property, so they are an option (``None``: the
  trajectories are bounded by the position room alone);
- dynamics: :func:`inverse_dynamics` (``mj_inverse``), :func:`inertia_matrix`
  (``mj_fullM``), critically damped PD gains (:func:`pd_gains`) and the stability of
  the sampled PD loop (:func:`sampled_loop_radius`);
- the arm's identity (:func:`mjcf_identity`): a sha256 over the file and every file it
  pulls in (included MJCF files, mesh and height-field files) and, when ``joints``
  removes any joint, over the chosen joints: what stores and runs record and compare, so
  that an edited include, or another choice of joints in the same file, is a different arm;
- a payload at a named, massless body (``payload_body``; by default the body named
  ``payload`` when the model has one), set in place on any copy of the model;
- joint damping, armature and dry friction as options that replace the file's values.

Torque commands. gpdyn's controllers command joint torques. :meth:`ArmModel.torque_model`
gives the plant they act on: each joint's actuator becomes a direct torque source
(gain 1, gear 1, no bias) whose command range is that joint's torque range, so the
action of :class:`~gpdyn.sim.arm_env.ArmEnv` is the joint torque itself. A motor
keeps exactly its behaviour; a position or velocity servo is replaced by a torque
source with the servo's force range (its stiffness, damping and target range are
dropped): computed-torque control assumes torque-controlled joints, as a simulation
of a servo-driven arm under torque control. Inverse-dynamics data (``mj_inverse``)
does not depend on the actuators at all.

Checks. A file is refused (:class:`ArmModelError`, naming the file and the element or
attribute) before any collection or control when its ``<option timestep>`` is not a
finite time > 0, a joint ``range`` is NaN, infinite or not increasing, an actuator's
``gear`` is 0 or not finite, or it has active ``<equality>`` constraints: their
constraint forces would be counted by ``mj_inverse`` as joint torque that no actuator
gives. Contacts are excluded from the inverse dynamics instead (:func:`inverse_dynamics`):
a collision of the arm with itself or the scene is not a torque its motors give.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from gpdyn.errors import InputError

DEFAULT_PAYLOAD_OFFSET = (0.0, 0.0, 0.05)
PAYLOAD_BODY = "payload"  # the body a payload goes to unless another is named
PAYLOAD_RADIUS = 0.05  # m: the payload is a solid sphere of this radius
UNLIMITED_RANGE = np.pi  # rad: the motion room of a hinge without limits
JOINT_TERMS = {"damping": "dof_damping", "armature": "dof_armature", "friction": "dof_frictionloss"}
# the slowest sample (and control) rate: one sample a second. Slower rates only thin out
# the data, and a control step of more simulator steps than MAX_STEPS_PER_SAMPLE is absurd
MIN_RATE_HZ = 1.0
MAX_STEPS_PER_SAMPLE = 100_000
# asset elements whose files change the dynamics (mesh inertia and collision shapes);
# textures and skins are looks only and are not part of the arm's identity
DYNAMIC_ASSETS = ("mesh", "hfield", "model")
COMMENT = re.compile(r"<!--.*?-->", re.S)
TAG = re.compile(r"<([A-Za-z_][\w.-]*)(\s[^<>]*?)?/?>")
ATTRIBUTE = re.compile(r"([A-Za-z_][\w.-]*)\s*=\s*(['\"])(.*?)\2", re.S)


class ArmModelError(InputError):
    """An MJCF file that is not a usable arm, or an impossible arm setting; the message names the file."""


@dataclass(frozen=True)
class ArmLimits:
    """Per-joint limits: ``position`` and ``torque`` are ``[n, 2]`` (low, high), ``velocity`` ``[n]`` or None.

    Torque bounds are +-inf where the model does not limit the actuator.
    """

    position: np.ndarray
    velocity: np.ndarray | None
    torque: np.ndarray

    def to_json(self) -> dict[str, Any]:
        """Plain lists for store and run attributes (an unlimited torque bound is written as null)."""
        def bound(a: np.ndarray) -> list:
            return [[float(v) if np.isfinite(v) else None for v in row] for row in a]

        return {
            "position": bound(self.position),
            "velocity": None if self.velocity is None else [float(v) for v in self.velocity],
            "torque": bound(self.torque),
        }


def actuator_torque_range(model: mujoco.MjModel, actuator: int) -> np.ndarray:
    """``[low, high]`` of the joint torque one joint-transmission actuator can apply.

    Actuator force: a motor (fixed gain, no bias) gives ``gain x ctrl`` inside ``ctrlrange``
    when ``ctrllimited``; a servo (fixed gain, affine bias: ``<position>``, ``<velocity>``)
    is bounded only by ``forcerange``; ``forcerange`` clips both when ``forcelimited``. The
    joint torque is ``gear x force``, clipped to the joint's ``actuatorfrcrange`` when
    ``actfrclimited``. Other actuator kinds (muscles, filters, integrators) are refused.
    """
    act = model.actuator(actuator)
    name = act.name or f"#{actuator}"
    gaintype, biastype, dyntype = int(act.gaintype[0]), int(act.biastype[0]), int(act.dyntype[0])
    if gaintype != mujoco.mjtGain.mjGAIN_FIXED or dyntype != mujoco.mjtDyn.mjDYN_NONE or biastype not in (
        mujoco.mjtBias.mjBIAS_NONE, mujoco.mjtBias.mjBIAS_AFFINE
    ):
        raise ArmModelError(
            f"actuator '{name}' is neither a motor nor a position/velocity servo (gain type {gaintype}, bias type "
            f"{biastype}, dynamics type {dyntype}); gpdyn arms use <motor>, <position> or <velocity> actuators"
        )
    force = np.array([-np.inf, np.inf])
    if biastype == mujoco.mjtBias.mjBIAS_NONE and act.ctrllimited[0]:
        force = np.sort(act.gainprm[0] * act.ctrlrange)
    if act.forcelimited[0]:
        force = np.array([max(force[0], act.forcerange[0]), min(force[1], act.forcerange[1])])
    gear = float(act.gear[0])
    with np.errstate(invalid="ignore"):
        torque = np.sort(gear * force)
    torque[np.isnan(torque)] = 0.0  # 0 x inf: a zero gear gives no torque at all
    joint = int(act.trnid[0])
    if model.jnt_actfrclimited[joint]:
        lo, hi = model.jnt_actfrcrange[joint]
        torque = np.array([max(torque[0], lo), min(torque[1], hi)])
    return torque


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _first_existing(candidates: Sequence[Path]) -> Path | None:
    return next((c for c in candidates if c.is_file()), None)


def mjcf_identity(path: str | Path, joints: Sequence[str] | None = None) -> tuple[str, list[dict[str, str | None]]]:
    """The identity of an MJCF arm: ``(sha256, files)``, over the file and every file it pulls in.

    ``files`` lists, in document order, each included MJCF file (recursively) and
    each mesh, height-field or ``<model>`` file of the ``<asset>`` elements, as
    ``{"file": path relative to the main file's folder, "sha256": ...}``. Paths are
    resolved as MuJoCo does: an include relative to the main file's folder, else to the
    including file's; an asset under the compiler's ``meshdir`` (or ``assetdir``). An
    asset file that cannot be found this way has ``"sha256": None``. The identity is the
    sha256 of the file's bytes when it pulls in no file, else the sha256 of the main
    file's hash and the list: changing any of them changes the arm's identity.

    ``joints``: the arm's joints where they are a selection of the file's (the others
    removed, :func:`select_joints`); the identity is then the sha256 of the file's identity
    and the joint names, so that two arms picked out of one file are two arms. None (every
    joint of the file is the arm's) leaves the file's identity as it is.
    """
    main = Path(path)
    root_dir = main.parent
    raw = main.read_bytes()
    seen: set[Path] = {main.resolve()}
    files: list[dict[str, str | None]] = []
    assets: list[tuple[Path, str]] = []  # (folder of the file naming it, file attribute)
    dirs: dict[str, str] = {}

    def name_of(file: Path) -> str:
        try:
            return file.resolve().relative_to(root_dir.resolve()).as_posix()
        except ValueError:  # outside the main file's folder
            return str(file.resolve())

    def walk(data: bytes, source: Path) -> None:
        # a scan of the tags rather than an XML parser: MuJoCo's parser takes files a strict one
        # refuses (a "--" inside a comment, as in a comment that quotes a command line)
        text = COMMENT.sub("", data.decode("utf-8", errors="replace"))
        for tag, attributes in TAG.findall(text):
            values = {k: v for k, _, v in ATTRIBUTE.findall(attributes)}
            file = values.get("file")
            if tag == "compiler":
                dirs.update({k: values[k] for k in ("meshdir", "assetdir") if k in values})
            elif tag == "include" and file:
                found = _first_existing([root_dir / file, source.parent / file])
                if found is None:
                    raise ArmModelError(f"{source}: <include file=\"{file}\"> not found next to {main.name} or "
                                        f"{source.name}")
                if found.resolve() in seen:
                    continue
                seen.add(found.resolve())
                content = found.read_bytes()
                files.append({"file": name_of(found), "sha256": _sha256(content)})
                walk(content, found)
            elif tag in DYNAMIC_ASSETS and file:
                assets.append((source.parent, file))

    walk(raw, main)
    folder = dirs.get("meshdir", dirs.get("assetdir", ""))
    for source_dir, file in assets:
        candidates = [Path(file)] if Path(file).is_absolute() else [
            root_dir / folder / file, source_dir / folder / file, root_dir / file]
        found = _first_existing(candidates)
        entry = {"file": name_of(found) if found else file, "sha256": _sha256(found.read_bytes()) if found else None}
        if entry not in files:
            files.append(entry)
    identity = _sha256(raw)
    if files:
        identity = _sha256(json.dumps({"main": identity, "files": files}, sort_keys=True).encode())
    if joints is not None:
        identity = _sha256(json.dumps({"mjcf": identity, "joints": list(joints)}).encode())
    return identity, files


def _joint_kind(model_or_type: Any) -> str:
    """``hinge``, ``slide``, ``ball`` or ``free`` of a joint type."""
    return mujoco.mjtJoint(int(model_or_type)).name.removeprefix("mjJNT_").lower()


def _listed_joints(names: Sequence[str], kinds: Sequence[str]) -> str:
    """``a (hinge), b (slide), #3 (free, unnamed)``: the joints of a file, for messages."""
    return ", ".join(f"{name} ({kind})" if name else f"#{j} ({kind}, unnamed)"
                     for j, (name, kind) in enumerate(zip(names, kinds)))


def select_joints(path: Path, joints: Sequence[str]) -> tuple[mujoco.MjModel, tuple[str, ...]]:
    """The model of ``path`` with the joints ``joints`` only, and the names of the joints removed.

    Every other joint is deleted from the MJCF spec (``mujoco.MjSpec``) before it is
    compiled: its body is welded to its parent at the pose the file gives it (where a
    joint's ``ref`` puts it), so a target or object on slide or free joints becomes part of
    the fixed scene and an arm joint left out is held at its reference angle. Actuators
    that drove a removed joint, sensors that read one, and the keyframes (sized for the
    full model) are deleted with them. Removed, not held by a constraint: an equality's or
    a locked joint's constraint force is counted by ``mj_inverse`` as joint torque, and the
    held joints would still be columns of ``q`` and ``tau``; without them the inverse
    dynamics is the chosen joints' alone, with the welded bodies' mass where they sit.

    ``joints`` are named in the file's order (the order of the arm's columns and of the
    per-joint options); an unknown, repeated or out-of-order name is refused.
    """
    where = f"--joints {','.join(joints)}"
    spec = mujoco.MjSpec.from_file(str(path))
    names = [j.name for j in spec.joints]
    kinds = [_joint_kind(j.type) for j in spec.joints]
    found = _listed_joints(names, kinds)
    if not joints or any(not isinstance(j, str) or not j for j in joints):
        raise ArmModelError(f"{where}: give the arm's joint names, comma-separated (the file's joints: {found})")
    repeated = sorted({j for j in joints if list(joints).count(j) > 1})
    if repeated:
        raise ArmModelError(f"{where}: {', '.join(repeated)} named more than once")
    unknown = [j for j in joints if j not in names]
    if unknown:
        raise ArmModelError(f"{where}: no joint {', '.join(repr(j) for j in unknown)} in the file "
                            f"(its joints: {found})")
    in_file_order = [n for n in names if n in joints]
    if list(joints) != in_file_order:
        raise ArmModelError(f"{where}: name the joints in the file's order, {','.join(in_file_order)} (the order of "
                            "the arm's columns and of per-joint options such as --velocity-limits)")
    keep = set(joints)
    removed = [j for j in spec.joints if j.name not in keep]
    if not removed:  # the whole file is the arm: the model as the file gives it
        return mujoco.MjModel.from_xml_path(str(path)), ()
    removed_names = {j.name for j in removed if j.name}
    for joint in removed:
        spec.delete(joint)
    joint_targets = (mujoco.mjtTrn.mjTRN_JOINT, mujoco.mjtTrn.mjTRN_JOINTINPARENT)
    for actuator in list(spec.actuators):
        if actuator.trntype in joint_targets and actuator.target in removed_names:
            spec.delete(actuator)
    for sensor in list(spec.sensors):
        if sensor.objtype == mujoco.mjtObj.mjOBJ_JOINT and sensor.objname in removed_names:
            spec.delete(sensor)
    for key in list(spec.keys):
        spec.delete(key)
    try:
        model = spec.compile()
    except ValueError as err:  # a tendon, equality or other element that names a removed joint
        raise ArmModelError(f"{where}: MuJoCo cannot compile the file without the joints "
                            f"{', '.join(sorted(removed_names)) or '(unnamed)'}: {str(err).strip()}") from err
    return model, tuple(names[i] or f"#{i}" for i in range(len(names)) if names[i] not in keep)


def _joint_terms(n: int, name: str, value: float | Sequence[float]) -> np.ndarray:
    values = np.atleast_1d(np.asarray(value, dtype=np.float64))
    if values.ndim != 1 or values.shape[0] not in (1, n) or not np.isfinite(values).all() or (values < 0).any():
        raise ArmModelError(f"{name} must be one finite value >= 0 or one per joint ({n}), got {value!r}")
    return np.broadcast_to(values, (n,)).copy()


class ArmModel:
    """An n-DOF arm from an MJCF file: joints, limits, and fresh or torque-controlled copies of its model.

    ``joints``: the names of the arm's joints, in the file's order, where the file holds
    more (targets, objects, other robots): the others are removed (:func:`select_joints`)
    and the identity covers the choice; None: every joint of the file.
    ``velocity_limits``: rad/s per joint (MJCF has none); ``payload_body``: a massless body
    that carries the payload (default: ``payload`` if the model has it); ``damping``,
    ``armature``, ``friction``: one value or one per joint, replacing the file's
    ``dof_damping``, ``dof_armature``, ``dof_frictionloss``; ``env_id``: the name stores
    and runs record (default ``mjcf:<file name>``).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        joints: Sequence[str] | None = None,
        velocity_limits: Sequence[float] | None = None,
        payload_body: str | None = None,
        damping: float | Sequence[float] | None = None,
        armature: float | Sequence[float] | None = None,
        friction: float | Sequence[float] | None = None,
        env_id: str | None = None,
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ArmModelError(f"{self.path}: no such MJCF file")
        try:
            model = mujoco.MjModel.from_xml_path(str(self.path))
        except ValueError as err:  # MuJoCo's parse and compile errors
            raise ArmModelError(f"{self.path}: MuJoCo cannot load it: {str(err).strip()}") from err
        self.removed_joints: tuple[str, ...] = ()
        if joints is not None:
            try:
                model, self.removed_joints = select_joints(self.path, tuple(joints))
            except ArmModelError as err:
                raise ArmModelError(f"{self.path}: {err}") from None
        self.env_id = env_id or f"mjcf:{self.path.name}"
        try:
            self._check_joints(model, chosen=joints is not None)
            self._check_simulation(model)
            self.actuator_of_joint = self._actuators(model)
            torque = np.stack([actuator_torque_range(model, a) for a in self.actuator_of_joint])
            for joint, a in enumerate(self.actuator_of_joint):
                if np.isnan(torque[joint]).any():
                    raise ArmModelError(f"actuator '{model.actuator(int(a)).name or a}': its torque range is NaN; "
                                        "check its ctrlrange, forcerange and gain")
            for option, value in (("damping", damping), ("armature", armature), ("friction", friction)):
                if value is not None:
                    getattr(model, JOINT_TERMS[option])[:] = _joint_terms(model.nv, option, value)
            self.payload_body = self._payload_body(model, payload_body)
        except ArmModelError as err:
            raise ArmModelError(f"{self.path}: {err}") from None
        self.model = model
        self.n = model.njnt
        self.joint_names = tuple(model.joint(j).name or f"joint{j}" for j in range(self.n))
        # what stores and runs record as the arm: the file with everything it includes, and the joints chosen in it
        self.sha256, self.files = mjcf_identity(self.path, self.joint_names if self.removed_joints else None)
        position = np.where(model.jnt_limited[:, None], model.jnt_range, [-UNLIMITED_RANGE, UNLIMITED_RANGE])
        velocity = None
        if velocity_limits is not None:
            velocity = np.asarray(velocity_limits, dtype=np.float64)
            if velocity.shape != (self.n,) or not (np.isfinite(velocity).all() and (velocity > 0).all()):
                raise ArmModelError(f"{self.path}: velocity limits must be {self.n} finite values > 0 rad/s, "
                                    f"got {velocity_limits!r}")
        self.limits = ArmLimits(position=position, velocity=velocity, torque=torque)

    # ------------------------------------------------------------------ checks
    @staticmethod
    def _check_joints(model: mujoco.MjModel, chosen: bool = False) -> None:
        """Hinge joints only; a file with other joints is told to name the arm's with ``--joints`` (``chosen``: it
        did)."""
        hinge = int(mujoco.mjtJoint.mjJNT_HINGE)
        names = [model.joint(j).name for j in range(model.njnt)]
        kinds = [_joint_kind(t) for t in model.jnt_type]
        driven = {int(model.actuator_trnid[a, 0]) for a in range(model.nu)
                  if model.actuator_trntype[a] == mujoco.mjtTrn.mjTRN_JOINT}
        arm_like = [names[j] for j in range(model.njnt) if model.jnt_type[j] == hinge and j in driven and names[j]]
        pick = ("choose hinge joints with --joints" if chosen else
                f"name the arm's joints with --joints NAME,NAME,... (the file's joints: {_listed_joints(names, kinds)}"
                + (f"; its hinge joints with an actuator: --joints {','.join(arm_like)}" if arm_like else "") + "); "
                "the others are removed, their bodies fixed where the file puts them")
        if not (model.jnt_type == hinge).any():
            raise ArmModelError(f"the model has no hinge joints; a gpdyn arm is a fixed-base chain of hinge joints: "
                                f"{pick}")
        for j in range(model.njnt):
            if model.jnt_type[j] != hinge:
                raise ArmModelError(f"joint '{names[j] or j}' is a {kinds[j]} joint; a gpdyn arm has hinge joints only "
                                    f"(a fixed base, no grippers on slide joints): {pick}")

    @staticmethod
    def _check_simulation(model: mujoco.MjModel) -> None:
        """The timestep, joint ranges, gears and constraints that make the file's inverse dynamics the actuators'."""
        step = float(model.opt.timestep)
        if not (np.isfinite(step) and step > 0):
            raise ArmModelError(f'<option timestep="{step:g}">: the simulation timestep must be a finite time > 0 s')
        for j in range(model.njnt):
            low, high = (float(v) for v in model.jnt_range[j])
            given = model.jnt_limited[j] or (low, high) != (0.0, 0.0)  # (0, 0): no range in the file
            if given and not (np.isfinite(low) and np.isfinite(high) and low < high):
                raise ArmModelError(
                    f"joint '{model.joint(j).name or j}': range=\"{low:g} {high:g}\" (as compiled, rad) must be two "
                    "finite numbers, low < high (MuJoCo leaves a joint with an inverted or empty range unlimited)")
        for a in range(model.nu):
            gear = float(model.actuator_gear[a, 0])
            if not (np.isfinite(gear) and gear != 0):
                raise ArmModelError(f"actuator '{model.actuator(a).name or a}': gear=\"{gear:g}\" gives no joint "
                                    "torque; give it a finite gear ratio other than 0")
        for e in np.flatnonzero(model.eq_active0):
            kind = mujoco.mjtEq(int(model.eq_type[e])).name.removeprefix("mjEQ_").lower()
            name = model.equality(int(e)).name
            element = f'<{kind} name="{name}">' if name else f"<{kind}> (#{e})"
            raise ArmModelError(
                f"<equality>{element}: an equality constraint's force is counted "
                "by mj_inverse as joint torque that no actuator gives, so the recorded torques would not describe the "
                "actuators; a gpdyn arm has no active equality constraints (remove it, or set active=\"false\")")

    @staticmethod
    def _actuators(model: mujoco.MjModel) -> np.ndarray:
        """The one actuator of each joint, in joint order."""
        owner = np.full(model.njnt, -1)
        for a in range(model.nu):
            name = model.actuator(a).name or f"#{a}"
            if model.actuator_trntype[a] != mujoco.mjtTrn.mjTRN_JOINT:
                raise ArmModelError(f"actuator '{name}' does not drive a joint directly (transmission type "
                                    f"{int(model.actuator_trntype[a])}); gpdyn arms have one joint actuator per joint")
            joint = int(model.actuator_trnid[a, 0])
            if owner[joint] >= 0:
                raise ArmModelError(f"joint '{model.joint(joint).name or joint}' has two actuators "
                                    f"('{model.actuator(int(owner[joint])).name}' and '{name}'); give it one")
            owner[joint] = a
        missing = [model.joint(j).name or str(j) for j in np.flatnonzero(owner < 0)]
        if missing:
            raise ArmModelError(f"joint(s) {', '.join(missing)} have no actuator; add a <motor> or <position> "
                                "actuator for every joint, or leave them out of the arm with --joints")
        return owner

    @staticmethod
    def _payload_body(model: mujoco.MjModel, name: str | None) -> str | None:
        if name is None:
            return PAYLOAD_BODY if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, PAYLOAD_BODY) >= 0 else None
        body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, name)
        if body < 0:
            raise ArmModelError(f"--payload-body {name}: no body '{name}' to carry the payload ({_massless(model)})")
        if model.body_mass[body] > 0:
            raise ArmModelError(f"payload body '{name}' has {model.body_mass[body]:g} kg in the file; the payload "
                                "replaces a body's mass, so name a massless body fixed to the end effector")
        return name

    # ------------------------------------------------------------------ models
    @property
    def timestep(self) -> float:
        return float(self.model.opt.timestep)

    def joint_terms(self) -> dict[str, list[float]]:
        """The damping, armature and dry friction per joint that the models carry."""
        return {option: getattr(self.model, field).tolist() for option, field in JOINT_TERMS.items()}

    def rate_range(self) -> tuple[float, float]:
        """The sample (and control) rates in Hz this arm takes: at least one simulator step per sample, at least
        :data:`MIN_RATE_HZ`, at most :data:`MAX_STEPS_PER_SAMPLE` steps per sample."""
        return max(MIN_RATE_HZ, 1.0 / (MAX_STEPS_PER_SAMPLE * self.timestep)), 1.0 / self.timestep

    def steps_per_sample(self, rate_hz: float, option: str = "sample rate") -> int:
        """Simulator steps per sample at ``rate_hz``, refused (naming ``option``) unless a whole number in range."""
        low, high = self.rate_range()
        try:
            rate = float(rate_hz)
        except (TypeError, ValueError):
            rate = np.nan
        # relative tolerances: 1 / (rate x timestep) is rarely an exact float
        if not (np.isfinite(rate) and low * (1 - 1e-9) <= rate <= high * (1 + 1e-9)):
            raise ArmModelError(
                f"{self.path}: {option} must be a finite rate in [{low:g}, {high:g}] Hz (at least {MIN_RATE_HZ:g} Hz "
                f"and at most one sample per {self.timestep * 1e3:g} ms simulation step), got {rate_hz}")
        steps = 1.0 / (rate * self.timestep)
        if abs(steps - round(steps)) > 1e-9 * max(1.0, steps):
            raise ArmModelError(
                f"{self.path}: {option} {rate_hz} Hz is not a whole number of the model's "
                f"{self.timestep * 1e3:g} ms simulation steps ({steps:.4g} steps per sample)"
            )
        return max(1, int(round(steps)))

    def new_model(self, payload_kg: float = 0.0, payload_offset: Sequence[float] = DEFAULT_PAYLOAD_OFFSET) -> mujoco.MjModel:
        """A copy of the arm's model (options applied) with ``payload_kg`` at ``payload_offset``."""
        model = copy.deepcopy(self.model)
        self.set_payload(model, payload_kg, payload_offset)
        return model

    def torque_model(self, payload_kg: float = 0.0, payload_offset: Sequence[float] = DEFAULT_PAYLOAD_OFFSET) -> mujoco.MjModel:
        """:meth:`new_model` with every actuator a direct joint-torque source (see the module notes).

        Actuator ``actuator_of_joint[j]`` then takes joint ``j``'s torque in N m as its
        control, inside the joint's torque range.
        """
        model = self.new_model(payload_kg, payload_offset)
        for joint, a in enumerate(self.actuator_of_joint):
            model.actuator_gaintype[a] = mujoco.mjtGain.mjGAIN_FIXED
            model.actuator_gainprm[a] = 0.0
            model.actuator_gainprm[a, 0] = 1.0
            model.actuator_biastype[a] = mujoco.mjtBias.mjBIAS_NONE
            model.actuator_biasprm[a] = 0.0
            model.actuator_gear[a] = 0.0
            model.actuator_gear[a, 0] = 1.0
            model.actuator_forcelimited[a] = False
            model.actuator_ctrlrange[a] = self.limits.torque[joint]
            model.actuator_ctrllimited[a] = bool(np.isfinite(self.limits.torque[joint]).any())
        return model

    def set_payload(
        self, model: mujoco.MjModel, payload_kg: float, payload_offset: Sequence[float] = DEFAULT_PAYLOAD_OFFSET
    ) -> None:
        """Give the payload body of ``model`` (a copy of this arm's) a mass at a centre-of-mass offset, in place.

        The load is a solid sphere of :data:`PAYLOAD_RADIUS` (inertia 2/5 m r^2) at
        ``payload_offset`` (m, in the payload body's frame). MuJoCo recomputes composite
        inertias from ``body_mass``/``body_inertia`` at every step, so this is a plant change
        that takes effect on the next ``mj_step``/``mj_inverse``.
        """
        offset = np.asarray(payload_offset, dtype=np.float64)
        if not np.isfinite(payload_kg) or payload_kg < 0:
            raise ArmModelError(f"{self.path}: payload must be a finite mass >= 0 kg, got {payload_kg}")
        if offset.shape != (3,) or not np.isfinite(offset).all():
            raise ArmModelError(f"{self.path}: payload offset must be 3 finite numbers (m), got {payload_offset!r}")
        if self.payload_body is None:
            if payload_kg == 0:
                return
            raise ArmModelError(
                f"{self.path}: a payload of {payload_kg:g} kg needs a body to carry it and the model has no body "
                f"'{PAYLOAD_BODY}': name a massless body fixed to the end effector with --payload-body NAME "
                f"({_massless(self.model)}), or add a massless <body name=\"{PAYLOAD_BODY}\"> there")
        body = model.body(self.payload_body).id
        model.body_mass[body] = payload_kg
        model.body_ipos[body] = offset
        # the compiler marks a zero-offset body "same frame" (inertia frame = body frame),
        # a shortcut that would ignore the new offset in the kinematics
        model.body_sameframe[body] = mujoco.mjtSameFrame.mjSAMEFRAME_NONE
        model.body_inertia[body] = 0.4 * payload_kg * PAYLOAD_RADIUS**2

    def describe(self) -> dict[str, Any]:
        """What stores and runs record about the arm: file, hash, joints (and those removed), limits, joint terms,
        payload body."""
        return {
            "model_file": self.path.name,
            "model_sha256": self.sha256,
            "model_files": self.files,
            "env_id": self.env_id,
            "n_joints": self.n,
            "joint_names": list(self.joint_names),
            # only where --joints removed any: the record of arms that are their whole file stays as it was
            **({"removed_joints": list(self.removed_joints)} if self.removed_joints else {}),
            "sim_timestep": self.timestep,
            "limits": self.limits.to_json(),
            "joint_terms": self.joint_terms(),
            "payload_body": self.payload_body,
        }


def _massless(model: mujoco.MjModel) -> str:
    """``massless bodies on the arm: a, b`` (the bodies a payload can go to), or that there are none, for messages."""
    bodies = [model.body(b).name for b in range(1, model.nbody)
              if model.body_mass[b] == 0 and model.body_weldid[b] != 0 and model.body(b).name]  # moving, not the scene
    return f"massless bodies on the arm: {', '.join(bodies)}" if bodies else "the arm has no named massless body"


# ---------------------------------------------------------------------------- dynamics
def inverse_dynamics(
    model: mujoco.MjModel,
    data: mujoco.MjData,
    q: np.ndarray,
    qd: np.ndarray,
    qdd: np.ndarray,
    *,
    discrete: bool = False,
) -> np.ndarray:
    """Joint torques [N, n] that realise (q, qd, qdd), one ``mj_inverse`` per row.

    ``qfrc_inverse`` is the generalised force on each joint (gear x actuator force); it
    includes armature, damping and the soft dry-friction force, and excludes contacts
    (MuJoCo's contact flag is off for the computation): a collision's force is not a
    torque the actuators give, and in ``mj_inverse`` a penetrating geom at a commanded
    pose gives forces orders of magnitude past any actuator's. ``discrete=False`` is
    continuous-time inverse dynamics (what the datasets record). ``discrete=True`` sets
    MuJoCo's ``invdiscrete`` flag: the torque that makes one simulator step (Euler,
    implicit damping) produce exactly ``qdd`` as the finite-difference acceleration, i.e.
    the torque a controller at the simulator rate holds.
    """
    flag = int(mujoco.mjtEnableBit.mjENBL_INVDISCRETE)
    saved, saved_disabled = model.opt.enableflags, model.opt.disableflags
    model.opt.enableflags = (saved | flag) if discrete else (saved & ~flag)
    model.opt.disableflags = saved_disabled | int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
    try:
        tau = np.empty_like(q)
        for i in range(q.shape[0]):
            data.qpos[:] = q[i]
            data.qvel[:] = qd[i]
            data.qacc[:] = qdd[i]
            mujoco.mj_inverse(model, data)
            tau[i] = data.qfrc_inverse
    finally:
        model.opt.enableflags, model.opt.disableflags = saved, saved_disabled
    return tau


def without_contacts(model: mujoco.MjModel) -> mujoco.MjModel:
    """``model`` with MuJoCo's contacts off, in place: for inverse dynamics computed outside :func:`inverse_dynamics`."""
    model.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
    return model


def discrete_feedforward(model: mujoco.MjModel, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Torques that make the simulator follow positions ``q`` [m + 2, n] on its own time grid.

    With the semi-implicit Euler step (v' = v + h a, q' = q + h v'), the velocities
    v_k = (q_k - q_{k-1}) / h and accelerations a_k = (v_{k+1} - v_k) / h reproduce
    ``q`` exactly; ``mj_inverse`` in discrete mode gives the torque of each step.
    Returns (tau [m, n] for steps 1..m, v_1 [n], the initial velocity to set with q_1).
    """
    h = model.opt.timestep
    v = np.diff(q, axis=0) / h
    a = np.diff(v, axis=0) / h
    tau = inverse_dynamics(model, mujoco.MjData(model), q[1:-1], v[:-1], a, discrete=True)
    return tau, v[0]


def inertia_matrix(model: mujoco.MjModel, q: np.ndarray, data: mujoco.MjData | None = None) -> np.ndarray:
    """Joint-space inertia ``M(q)`` [nv, nv] (armature included). Only the stages ``M`` needs (kinematics, the
    composite rigid bodies): a quarter of ``mj_forward``'s cost, on a controller's every step."""
    data = data if data is not None else mujoco.MjData(model)
    data.qpos[:] = q
    mujoco.mj_kinematics(model, data)
    mujoco.mj_comPos(model, data)
    mujoco.mj_makeM(model, data)
    full = np.zeros((model.nv, model.nv))
    mujoco.mj_fullM(model, data, full)
    return full


def _poses(model: mujoco.MjModel, poses: np.ndarray) -> np.ndarray:
    poses = np.atleast_2d(np.asarray(poses, dtype=np.float64))
    if poses.shape[-1] != model.nq or poses.shape[0] < 1 or not np.isfinite(poses).all():
        raise InputError(f"pd gains: poses must be finite [N, {model.nq}] joint positions, got shape {poses.shape}")
    return poses


def pd_gains(model: mujoco.MjModel, poses: np.ndarray, omega: float) -> tuple[np.ndarray, np.ndarray]:
    """Critically damped gains ``(Kp, Kd)`` [nv] on the smallest effective inertia over ``poses`` [N, nq].

    ``Kp = w^2 m_j``, ``Kd = 2 w m_j`` with ``m_j = 1 / (M^-1)_jj``, the inertia joint j feels
    with the other joints free. The diagonal ``M_jj`` (the others locked) is larger on
    coupled joints (up to 2.4x on the iiwa's joints 2 and 4), and gains built on it can
    make the sampled loop unstable (:func:`sampled_loop_radius`).
    """
    if not omega > 0:
        raise InputError(f"pd gains: omega must be > 0 rad/s, got {omega}")
    data = mujoco.MjData(model)
    eff = np.min([1.0 / np.diag(np.linalg.inv(inertia_matrix(model, q, data))) for q in _poses(model, poses)], axis=0)
    return omega**2 * eff, 2.0 * omega * eff


def sampled_loop_radius(model: mujoco.MjModel, poses: np.ndarray, kp: np.ndarray, kd: np.ndarray, dt: float) -> float:
    """Largest spectral radius over ``poses`` of the linearised PD loop sampled at ``dt`` (< 1: stable).

    Error dynamics ``M e'' = -Kp e - Kd e'`` with the torque held for ``dt`` and the
    semi-implicit Euler update ``v+ = v + dt a``, ``e+ = e + dt v+``.
    """
    data = mujoco.MjData(model)
    eye = np.eye(model.nv)
    worst = 0.0
    for q in _poses(model, poses):
        mi = np.linalg.inv(inertia_matrix(model, q, data))
        a_p, a_d = dt * mi @ np.diag(kp), dt * mi @ np.diag(kd)
        vel = np.hstack([-a_p, eye - a_d])
        pos = np.hstack([eye, dt * eye]) + dt * vel
        worst = max(worst, float(np.abs(np.linalg.eigvals(np.vstack([pos, vel]))).max()))
    return worst


__all__ = [
    "DEFAULT_PAYLOAD_OFFSET",
    "MAX_STEPS_PER_SAMPLE",
    "MIN_RATE_HZ",
    "ArmLimits",
    "ArmModel",
    "ArmModelError",
    "actuator_torque_range",
    "discrete_feedforward",
    "inertia_matrix",
    "inverse_dynamics",
    "mjcf_identity",
    "pd_gains",
    "sampled_loop_radius",
    "select_joints",
    "without_contacts",
]
