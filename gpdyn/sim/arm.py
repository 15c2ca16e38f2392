"""Simulated inverse-dynamics streams of any arm (KUKA1/KUKA2-like data; the iiwa 14 by default).

The real KUKA1/KUKA2 datasets (Meier et al. 2014, used in SVDGP Section 5 and
Appendix C.1) record a 7-DOF KUKA arm "performing rhythmic motions at various
speeds": inputs are joint positions, velocities and accelerations (3n), outputs the
n joint torques. Here the arm is any :class:`~gpdyn.robots.arm.ArmModel` (an MJCF
file; default the shipped iiwa 14, :func:`gpdyn.robots.kuka.kuka_arm`) and the motion
is a sum of sinusoids per joint with seeded frequencies, phases and amplitudes,
played at several speed factors and kept inside the arm's position and velocity
limits. Torques come from ``mujoco.mj_inverse`` at each sample, i.e. the generalised
force that realises the commanded (q, qd, qdd) including gravity, Coriolis terms,
rotor armature, joint damping and dry friction, plus an optional payload; contacts are
excluded (:func:`gpdyn.robots.arm.inverse_dynamics`). Samples whose torque is beyond an
actuator's range (a motion faster than the arm can follow) are counted per episode
(the per-episode key ``tau_over_limits``) and reported with a :class:`TorqueLimitWarning`.

Pipeline: :class:`RhythmicPattern` (the seeded motion of a family) ->
:class:`ArmStream` (the live process, sample by sample or in chunks, with sensor
noise and finite-difference derivatives as options) -> :func:`collect_arm`
(whole segments buffered into the episode store, offline part then online part).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from gpdyn.data.arm_schema import OFFLINE, ONLINE, arm_episode_keys, arm_fields
from gpdyn.data.store import EpisodeStore, StoreError
from gpdyn.device import check_memory
from gpdyn.errors import InputError
from gpdyn.progress import progress_bar
from gpdyn.robots.arm import DEFAULT_PAYLOAD_OFFSET, ArmLimits, ArmModel, inverse_dynamics
from gpdyn.robots.kuka import kuka_arm
from gpdyn.sim.stopping import StopSignals

SOURCE = "gpdyn.sim.arm"  # the store attribute 'source' of a simulated arm collection
DEFAULT_RATE_HZ = 100.0
# Fractions of each limit that trajectories may use: a margin as a real controller keeps.
POSITION_MARGIN = 0.9
VELOCITY_MARGIN = 0.9
DERIVATIVES = ("exact", "fd")


TORQUE_SOURCE = "mujoco.mj_inverse on the true state, contacts excluded"


class ArmConfigError(InputError):
    """An impossible arm simulation setting (negative counts, unknown family, ...)."""


class TorqueLimitWarning(UserWarning):
    """A collection recorded torques beyond the actuators' ranges: motions the arm's motors cannot make."""


def beyond_limits(tau: np.ndarray, torque_limits: np.ndarray) -> np.ndarray:
    """``[N, n]`` True where a joint torque of ``tau`` ``[N, n]`` is outside its ``[n, 2]`` actuator range."""
    return (tau < torque_limits[:, 0]) | (tau > torque_limits[:, 1])


# ---------------------------------------------------------------------------- motion
@dataclass(frozen=True)
class RhythmicPattern:
    """A sum of sinusoids per joint: q_j(t) = c_j + sum_k a_jk sin(2 pi f_jk s t + phi_jk).

    ``s`` is the speed factor: the same path traced ``s`` times as fast. Arrays are
    ``center [n]`` and ``amplitude, frequency (Hz at s = 1), phase [n, K]``.
    """

    center: np.ndarray
    amplitude: np.ndarray
    frequency: np.ndarray
    phase: np.ndarray

    @property
    def n_joints(self) -> int:
        return self.center.shape[0]

    def evaluate(self, t: np.ndarray, speed: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Exact q, qd, qdd [N, n] at times ``t`` [N] (s)."""
        omega = 2.0 * np.pi * self.frequency * speed  # [n, K]
        theta = omega[None] * np.asarray(t, dtype=np.float64)[:, None, None] + self.phase[None]
        sin, cos = np.sin(theta), np.cos(theta)
        q = self.center + (self.amplitude * sin).sum(-1)
        qd = (self.amplitude * omega * cos).sum(-1)
        qdd = -(self.amplitude * omega**2 * sin).sum(-1)
        return q, qd, qdd

    def bounds(self, speed: float) -> tuple[np.ndarray, np.ndarray]:
        """``[n, 2]`` bounds of q_j and the bound of |qd_j| ``[n]`` over all time (triangle inequality)."""
        reach = np.abs(self.amplitude).sum(-1)
        qd_max = (np.abs(self.amplitude) * 2.0 * np.pi * self.frequency * speed).sum(-1)
        return np.stack([self.center - reach, self.center + reach], axis=1), qd_max


@dataclass(frozen=True)
class TrajectoryFamily:
    """A KUKA1- or KUKA2-like trajectory family: seed, sinusoid layout and speeds (for any joint count)."""

    name: str
    seed: int
    n_sines: int
    frequency_range: tuple[float, float]  # Hz at speed 1
    center_fraction: float  # posture centres drawn in +- this fraction of each joint's half range
    offline_speeds: tuple[float, ...]
    online_speeds: tuple[float, ...]

    @property
    def max_speed(self) -> float:
        return max(self.offline_speeds + self.online_speeds)

    def speeds(self, part: int) -> tuple[float, ...]:
        return self.online_speeds if part == ONLINE else self.offline_speeds

    def pattern(self, seed: int, limits: ArmLimits) -> RhythmicPattern:
        """The seeded motion of an arm with ``limits``, scaled so that every speed stays inside them.

        Posture centres lie around the middle of each joint's range. Amplitudes are
        scaled per joint by the tighter of the position room (``POSITION_MARGIN`` x half
        range minus the centre's distance from the middle) and the velocity room
        (``VELOCITY_MARGIN`` x limit, where the arm has one) at the family's fastest
        speed, so that all speeds trace the same path.
        """
        if seed < 0:
            raise ArmConfigError(f"seed must be >= 0, got {seed}")
        n = limits.position.shape[0]
        rng = np.random.default_rng([self.seed, seed])
        k = self.n_sines
        middle = limits.position.mean(axis=1)
        half = 0.5 * (limits.position[:, 1] - limits.position[:, 0])
        center = middle + rng.uniform(-self.center_fraction, self.center_fraction, n) * half
        frequency = rng.uniform(*self.frequency_range, size=(n, k))
        phase = rng.uniform(0.0, 2.0 * np.pi, size=(n, k))
        # decreasing weights so that slow components dominate, as in smooth rhythmic motion
        raw = rng.uniform(0.5, 1.0, size=(n, k)) / np.arange(1, k + 1)
        pos_room = POSITION_MARGIN * half - np.abs(center - middle)
        scale = pos_room / raw.sum(-1)
        if limits.velocity is not None:
            vel_room = VELOCITY_MARGIN * limits.velocity
            scale = np.minimum(scale, vel_room / (raw * 2.0 * np.pi * frequency * self.max_speed).sum(-1))
        amplitude = raw * scale[:, None]
        return RhythmicPattern(center=center, amplitude=amplitude, frequency=frequency, phase=phase)


FAMILIES: dict[str, TrajectoryFamily] = {
    family.name: family
    for family in (
        TrajectoryFamily("kuka1", seed=1, n_sines=3, frequency_range=(0.05, 0.25), center_fraction=0.3,
                         offline_speeds=(0.6, 1.0, 1.4), online_speeds=(0.5, 0.8, 1.0, 1.2, 1.5, 1.8)),
        TrajectoryFamily("kuka2", seed=2, n_sines=4, frequency_range=(0.04, 0.3), center_fraction=0.4,
                         offline_speeds=(0.5, 0.9, 1.3, 1.7), online_speeds=(0.4, 0.7, 1.0, 1.3, 1.6, 1.9, 2.2)),
    )
}


def get_family(name: str) -> TrajectoryFamily:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ArmConfigError(f"unknown trajectory family {name!r}; choose from {sorted(FAMILIES)}") from None


# ---------------------------------------------------------------------------- stream
@dataclass(frozen=True)
class SensorConfig:
    """Measurement model: noise standard deviations and how derivatives are obtained.

    ``derivatives='exact'`` records the commanded qd, qdd; ``'fd'`` computes them by
    central differences of the measured (noisy) positions at the sample rate, as on a
    real robot: qd_i = (q_{i+1} - q_{i-1}) / (2 dt), qdd_i = (q_{i+1} - 2 q_i + q_{i-1}) / dt^2.
    Torques are always computed from the true state; their noise is added after.
    """

    torque_noise: float = 0.0  # N m, std of Gaussian noise on every torque
    position_noise: float = 0.0  # rad, std of Gaussian noise on every measured position
    derivatives: str = "exact"

    def __post_init__(self) -> None:
        for name in ("torque_noise", "position_noise"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise ArmConfigError(f"{name} must be a finite std >= 0, got {value}")
        if self.derivatives not in DERIVATIVES:
            raise ArmConfigError(f"derivatives must be one of {DERIVATIVES}, got {self.derivatives!r}")


class ArmStream:
    """The live process of an arm (default the iiwa 14): it cycles through its speeds, one segment per speed.

    Sample by sample (``for sample in stream``) or in chunks (:meth:`next_chunk`);
    :func:`collect_arm` takes whole segments (:meth:`next_segment`) from the same
    object. Kinematics of a segment are drawn when it starts; torques are computed
    when samples are taken, so :meth:`set_payload` changes the plant from the next
    sample on (for online control runs where the payload changes mid-run).

    Each sample is a dict of ``q, qd, qdd, tau`` ([n] each, or [m, n] in a chunk) plus
    ``t`` (s since the segment start), ``speed`` and ``segment`` (index).
    """

    def __init__(
        self,
        family: str = "kuka1",
        part: str = "online",
        seed: int = 0,
        *,
        arm: ArmModel | None = None,
        payload_kg: float = 0.0,
        payload_offset: Sequence[float] = DEFAULT_PAYLOAD_OFFSET,
        rate_hz: float = DEFAULT_RATE_HZ,
        sensors: SensorConfig | None = None,
        segment_samples: int = 3000,
        speeds: Sequence[float] | None = None,
    ) -> None:
        if part not in ("offline", "online"):
            raise ArmConfigError(f"part must be 'offline' or 'online', got {part!r}")
        self.arm = arm if arm is not None else kuka_arm()
        self.family = get_family(family)
        self.part = OFFLINE if part == "offline" else ONLINE
        self.arm.steps_per_sample(rate_hz)
        self.rate_hz = float(rate_hz)
        if segment_samples < 1:
            raise ArmConfigError(f"segment_samples must be >= 1, got {segment_samples}")
        self.segment_samples = int(segment_samples)
        self.sensors = sensors or SensorConfig()
        self.model = self.arm.new_model(payload_kg, payload_offset)
        self._data = mujoco.MjData(self.model)
        self.pattern = self.family.pattern(seed, self.arm.limits)
        self.speeds = tuple(float(s) for s in (speeds if speeds is not None else self.family.speeds(self.part)))
        if not self.speeds or min(self.speeds) <= 0 or max(self.speeds) > self.family.max_speed:
            raise ArmConfigError(
                f"speeds must be in (0, {self.family.max_speed}] (the family's velocity-safe range), got {self.speeds}"
            )
        # the joint count joins the seed so that arms of different sizes draw unrelated noise
        self._rng = np.random.default_rng([self.family.seed, seed, self.part, self.arm.n])
        self.n_segments = 0
        self._segment: dict[str, np.ndarray] | None = None
        self._pos = 0
        self._speed = 0.0

    @property
    def dt(self) -> float:
        return 1.0 / self.rate_hz

    def set_payload(self, payload_kg: float, payload_offset: Sequence[float] = DEFAULT_PAYLOAD_OFFSET) -> None:
        """Change the payload from the next sample on."""
        self.arm.set_payload(self.model, payload_kg, payload_offset)

    def _start_segment(self, length: int) -> None:
        speed = self.speeds[self.n_segments % len(self.speeds)]
        # a random phase into the periodic-ish motion so that segments differ
        t0 = self._rng.uniform(0.0, 1000.0)
        t = t0 + np.arange(-1, length + 1) * self.dt  # one extra sample each side for differences
        q_true, qd_true, qdd_true = self.pattern.evaluate(t, speed)
        q_meas = q_true + self.sensors.position_noise * self._rng.standard_normal(q_true.shape)
        if self.sensors.derivatives == "fd":
            qd = (q_meas[2:] - q_meas[:-2]) / (2.0 * self.dt)
            qdd = (q_meas[2:] - 2.0 * q_meas[1:-1] + q_meas[:-2]) / self.dt**2
        else:
            qd, qdd = qd_true[1:-1], qdd_true[1:-1]
        self._segment = {
            "q": q_meas[1:-1],
            "qd": qd,
            "qdd": qdd,
            "q_true": q_true[1:-1],
            "qd_true": qd_true[1:-1],
            "qdd_true": qdd_true[1:-1],
            "t": t[1:-1] - t0,
        }
        self._speed = speed
        self._pos = 0
        self.n_segments += 1

    def _torque_noise(self, rows: int) -> np.ndarray | float:
        """Noise for ``rows`` torque samples; it draws from the stream's generator only when there is noise."""
        if not self.sensors.torque_noise:
            return 0.0
        return self.sensors.torque_noise * self._rng.standard_normal((rows, self.arm.n))

    def _take(self, n: int) -> dict[str, np.ndarray]:
        seg = self._segment
        if seg is None:
            raise RuntimeError("no segment started")  # internal: callers start one first
        sl = slice(self._pos, self._pos + n)
        tau = inverse_dynamics(self.model, self._data, seg["q_true"][sl], seg["qd_true"][sl], seg["qdd_true"][sl])
        tau += self._torque_noise(tau.shape[0])
        self._pos += n
        rows = tau.shape[0]
        return {
            "q": seg["q"][sl].copy(),
            "qd": seg["qd"][sl].copy(),
            "qdd": seg["qdd"][sl].copy(),
            "tau": tau,
            "t": seg["t"][sl].copy(),
            "speed": np.full(rows, self._speed),
            "segment": np.full(rows, self.n_segments - 1, dtype=np.int64),
        }

    def next_segment(self, length: int | None = None) -> dict[str, np.ndarray]:
        """A whole new segment of ``length`` samples (default ``segment_samples``) at the next speed."""
        length = self.segment_samples if length is None else int(length)
        if length < 1:
            raise ArmConfigError(f"a segment needs at least 1 sample, got {length}")
        self._start_segment(length)
        return self._take(length)

    def skip_segment(self, length: int) -> None:
        """Move past a segment of ``length`` samples as :meth:`next_segment` would, without its torques.

        The same random draws in the same order, so the segments after it are the ones
        an uninterrupted stream gives: how a stopped collection resumes.
        """
        self._start_segment(int(length))
        self._torque_noise(int(length))
        self._pos = int(length)

    def next_chunk(self, n: int) -> dict[str, np.ndarray]:
        """The next ``n`` samples, crossing into new segments (speeds) as needed."""
        if n < 1:
            raise ArmConfigError(f"a chunk needs at least 1 sample, got {n}")
        parts = []
        while n > 0:
            left = self._segment["t"].shape[0] - self._pos if self._segment is not None else 0
            if left == 0:
                self._start_segment(self.segment_samples)
                left = self.segment_samples
            take = min(n, left)
            parts.append(self._take(take))
            n -= take
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Endless samples, one at a time (arrays [n], scalars for t, speed, segment)."""
        while True:
            chunk = self.next_chunk(1)
            yield {k: (v[0] if v.ndim > 1 else v[0].item()) for k, v in chunk.items()}


# ---------------------------------------------------------------------------- collection
def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` samples over at most ``parts`` segments, no empty segment."""
    parts = min(parts, total)
    if parts == 0:
        return []
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def collect_arm(
    store_path: str | Path,
    offline: int = 17560,
    online: int = 180360,
    payload: float = 0.0,
    family: str = "kuka1",
    seed: int = 0,
    *,
    arm: ArmModel | None = None,
    payload_offset: Sequence[float] = DEFAULT_PAYLOAD_OFFSET,
    rate_hz: float = DEFAULT_RATE_HZ,
    sensors: SensorConfig | None = None,
    progress: bool = True,
) -> EpisodeStore:
    """Collect a KUKA1/KUKA2-like dataset of ``arm`` (default the iiwa 14) into the store at ``store_path``.

    The offline part (``offline`` samples) comes first, then the online part, each
    split evenly into one episode per speed of the family, in time order; the
    per-episode key ``online`` marks the part and ``speed`` the speed factor. The
    settings and the arm (file name, identity hash with its included files, joints, limits,
    joint terms) go to the store attributes, and ``planned_rows`` says how many samples
    the finished store holds. The per-episode key ``tau_over_limits`` counts the samples
    with a joint torque beyond its actuator's range; when the store holds any, a
    :class:`TorqueLimitWarning` says how many.

    Each episode is committed as it is made. A store that exists is continued where it
    stopped, if it was collected with the same settings (a crash, SIGTERM or Ctrl-C): the
    streams move past the committed episodes with the same random draws, so the finished
    store equals an uninterrupted collection. A finished store is returned unchanged.
    SIGTERM or SIGINT stops the collection after the episode being made is committed
    and raises :class:`~gpdyn.sim.stopping.CollectionStopped`. Returns the store,
    closed (readable; its writer lock released).
    """
    store_path = Path(store_path)
    if offline < 0 or online < 0 or offline + online < 1:
        raise ArmConfigError(f"need offline >= 0, online >= 0 and at least one sample, got {offline} and {online}")
    arm = arm if arm is not None else kuka_arm()
    sensors = sensors or SensorConfig()
    fam = get_family(family)
    streams = {
        part: ArmStream(family, name, seed, arm=arm, payload_kg=payload, payload_offset=payload_offset,
                        rate_hz=rate_hz, sensors=sensors)
        for part, name in ((OFFLINE, "offline"), (ONLINE, "online"))
    }
    plan = [(part, length) for part, total in ((OFFLINE, offline), (ONLINE, online))
            for length in split_evenly(total, len(streams[part].speeds))]
    # an episode is made whole in memory (time, q, qd, qdd, tau and their temporaries, about
    # four copies of 4n + 1 float64 columns per sample): refused here, before the store exists
    check_memory(max(length for _, length in plan) * 32 * (4 * arm.n + 1), f"--offline {offline} / --online {online}")
    settings = {
        "source": SOURCE,
        "env_id": arm.env_id,
        "dt": 1.0 / rate_hz,
        "seed": seed,
        **arm.describe(),
        "family": fam.name,
        "family_config": asdict(fam),
        "rate_hz": float(rate_hz),
        "payload_kg": float(payload),
        "payload_offset": [float(v) for v in payload_offset],
        **asdict(sensors),
        "offline_samples": int(offline),
        "online_samples": int(online),
        "planned_rows": int(offline + online),
        "torque_source": TORQUE_SOURCE,
        "tau_scale": [1.0] * arm.n,
    }
    store = _open_or_create(store_path, arm.n, settings)
    try:
        done = _committed_plan(store, plan)
        with StopSignals() as stop, progress_bar(total=offline + online, initial=store.n_rows, unit="sample",
                                         desc=f"{arm.path.stem} {fam.name}", disable=not progress) as bar:
            for i, (part, length) in enumerate(plan):
                stream = streams[part]
                if i < done:
                    stream.skip_segment(length)
                    continue
                stop.check(f"{store.path} holds {store.n_episodes} of {len(plan)} episodes ({store.n_rows} of "
                           f"{offline + online} samples)")
                seg = stream.next_segment(length)
                episode = {k: seg[k] for k in ("q", "qd", "qdd", "tau")}
                over = int(beyond_limits(seg["tau"], arm.limits.torque).any(axis=1).sum())
                store.append_episode(episode, online=part, speed=float(seg["speed"][0]), tau_over_limits=over)
                bar.update(length)
        over = int(store.episode_values("tau_over_limits").sum())
    finally:
        store.close()
    if over:
        warnings.warn(
            f"{store.path}: {over} of {store.n_rows} samples have a joint torque beyond its actuator's range (the "
            "arm's motors cannot make these motions at these speeds; see the per-episode key tau_over_limits)",
            TorqueLimitWarning, stacklevel=2)
    return store


def _open_or_create(path: Path, n_joints: int, settings: dict[str, Any]) -> EpisodeStore:
    """A new store with ``settings`` as attributes, or the store at ``path`` if it was made with the same ones."""
    # JSON round trip: the stored attributes come back as lists and plain numbers
    want = json.loads(json.dumps(settings))
    if not path.exists():
        core = ("source", "env_id", "dt", "seed")
        try:
            return EpisodeStore.create(
                path, arm_fields(n_joints), **{k: settings[k] for k in core},
                episode_keys=arm_episode_keys(speed="float64", tau_over_limits="int64"),
                extra_attrs={k: v for k, v in settings.items() if k not in core},
            )
        except StoreError:
            if not path.exists():
                raise
            # another collector created it meanwhile: continue it, or be refused by its lock
    store = EpisodeStore.open(path, mode="a")
    mismatched = [k for k, v in want.items() if store.attrs.get(k) != v]
    if mismatched:
        recorded = store.attrs
        store.close()
        arm = ""
        if "model_sha256" in mismatched:
            arm = (f" (the arm: the store's {recorded.get('model_file')} sha256 {recorded.get('model_sha256')}, this "
                   f"{want['model_file']} sha256 {want['model_sha256']}{_changed_files(recorded, want)})")
        raise ArmConfigError(
            f"{path}: exists and was collected with different {', '.join(mismatched)}{arm}; continuing it would mix "
            "settings (use the same options to finish it, or a new --store)"
        )
    return store


def _changed_files(recorded: dict[str, Any], want: dict[str, Any]) -> str:
    """``; changed: a.xml, ...``: the files an arm pulls in whose hashes differ from the store's record."""
    old = recorded.get("model_files")
    if not isinstance(old, list):
        return ""
    before = {f.get("file"): f.get("sha256") for f in old if isinstance(f, dict)}
    after = {f["file"]: f["sha256"] for f in want["model_files"]}
    changed = sorted(str(f) for f in before.keys() | after.keys() if before.get(f) != after.get(f))
    if not changed and recorded.get("model_sha256") != want["model_sha256"]:
        changed = [want["model_file"]]
    return f"; changed: {', '.join(changed)}" if changed else ""


def _committed_plan(store: EpisodeStore, plan: list[tuple[int, int]]) -> int:
    """How many episodes of ``plan`` the store holds; anything but a prefix of the plan is refused."""
    lengths, parts = store.episode_lengths, store.episode_values("online")
    expected = np.array([length for _, length in plan[: len(lengths)]], dtype=np.int64)
    if len(lengths) > len(plan) or not np.array_equal(lengths, expected) or not np.array_equal(
        parts, [part for part, _ in plan[: len(parts)]]
    ):
        raise ArmConfigError(
            f"{store.path}: its {len(lengths)} episodes (lengths {lengths.tolist()[:12]}) are not the start of this "
            f"collection's {len(plan)} (lengths {[n for _, n in plan][:12]}); use a new --store"
        )
    return len(lengths)


def torque_ranges(store: EpisodeStore, torque_limits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[n, 2] min and max of ``tau`` per joint over the whole store (read in chunks), and [n] how many samples of
    each joint are beyond its actuator's range (``torque_limits`` [n, 2])."""
    n = store.fields["tau"].width
    lo = np.full(n, np.inf)
    hi = np.full(n, -np.inf)
    over = np.zeros(n, dtype=np.int64)
    for start in range(0, store.n_rows, 65536):
        tau = store.read("tau", start, start + 65536)
        lo = np.minimum(lo, tau.min(0))
        hi = np.maximum(hi, tau.max(0))
        over += beyond_limits(tau, torque_limits).sum(0)
    return np.stack([lo, hi], axis=1), over


__all__ = [
    "FAMILIES",
    "TORQUE_SOURCE",
    "ArmConfigError",
    "ArmStream",
    "RhythmicPattern",
    "SensorConfig",
    "TorqueLimitWarning",
    "TrajectoryFamily",
    "beyond_limits",
    "collect_arm",
    "get_family",
    "split_evenly",
    "torque_ranges",
]
