"""Simulated KUKA LBR iiwa inverse-dynamics streams (KUKA1/KUKA2-like data).

The real KUKA1/KUKA2 datasets (Meier et al. 2014, used in SVDGP Section 5 and
Appendix C.1) record a 7-DOF KUKA arm "performing rhythmic motions at various
speeds": inputs are joint positions, velocities and accelerations (21), outputs
the 7 joint torques. Here the arm is the MJCF model ``gpdyn/robots/assets/kuka_iiwa.xml`` and the
motion is a sum of sinusoids per joint with seeded frequencies, phases and
amplitudes, played at several speed factors. Torques come from
``mujoco.mj_inverse`` at each sample, i.e. the generalised force that realises the
commanded (q, qd, qdd) including gravity, Coriolis terms, rotor armature, joint
damping and dry friction, plus an optional end-effector payload.

Pipeline: :class:`RhythmicPattern` (the seeded motion of a family) ->
:class:`KukaStream` (the live process, sample by sample or in chunks, with sensor
noise and finite-difference derivatives as options) -> :func:`collect_kuka`
(whole segments buffered into the episode store, offline part then online part).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
from tqdm import tqdm

from gpdyn.data.kuka_schema import N_JOINTS, OFFLINE, ONLINE, kuka_episode_keys, kuka_fields
from gpdyn.data.store import EpisodeStore
from gpdyn.errors import InputError
from gpdyn.runs import run_for_args

ENV_ID = "gpdyn/KukaIiwa-v0"  # registered with gymnasium by gpdyn.robots.arm_env
SIM_TIMESTEP = 0.001
DEFAULT_RATE_HZ = 100.0
DEFAULT_PAYLOAD_OFFSET = (0.0, 0.0, 0.05)
# iiwa 14 velocity limits (DESIGN.md facts); MuJoCo joints have no velocity limit,
# so the trajectories are scaled to stay inside these.
VELOCITY_LIMITS = np.array([1.484, 1.484, 1.745, 1.309, 2.269, 2.356, 2.356])
# Fractions of each limit that trajectories may use: a margin as a real controller keeps.
POSITION_MARGIN = 0.9
VELOCITY_MARGIN = 0.9
DERIVATIVES = ("exact", "fd")


class KukaConfigError(InputError):
    """An impossible KUKA simulation setting (negative counts, unknown family, ...)."""


# ---------------------------------------------------------------------------- model
def model_path() -> Path:
    """The shipped iiwa MJCF file (package data of :mod:`gpdyn.robots`)."""
    from importlib import resources

    return Path(str(resources.files("gpdyn.robots").joinpath("assets", "kuka_iiwa.xml")))


def load_model(payload_kg: float = 0.0, payload_offset: Sequence[float] = DEFAULT_PAYLOAD_OFFSET) -> mujoco.MjModel:
    """The iiwa model with ``payload_kg`` at ``payload_offset`` (m, flange frame)."""
    model = mujoco.MjModel.from_xml_path(str(model_path()))
    set_payload(model, payload_kg, payload_offset)
    return model


def set_payload(
    model: mujoco.MjModel, payload_kg: float, payload_offset: Sequence[float] = DEFAULT_PAYLOAD_OFFSET
) -> None:
    """Give the flange body ``payload`` a mass and centre-of-mass offset, in place.

    The load is a solid sphere of 5 cm radius (inertia 2/5 m r^2); MuJoCo recomputes
    composite inertias from ``body_mass``/``body_inertia`` at every step, so this is a
    plant change that takes effect on the next ``mj_step``/``mj_inverse``.
    """
    offset = np.asarray(payload_offset, dtype=np.float64)
    if not np.isfinite(payload_kg) or payload_kg < 0:
        raise KukaConfigError(f"payload must be a finite mass >= 0 kg, got {payload_kg}")
    if offset.shape != (3,) or not np.isfinite(offset).all():
        raise KukaConfigError(f"payload offset must be 3 finite numbers (m), got {payload_offset!r}")
    body = model.body("payload").id
    model.body_mass[body] = payload_kg
    model.body_ipos[body] = offset
    # the compiler marked the zero-offset body "same frame" (inertia frame = body
    # frame), a shortcut that would ignore the new offset in the kinematics
    model.body_sameframe[body] = mujoco.mjtSameFrame.mjSAMEFRAME_NONE
    model.body_inertia[body] = 0.4 * payload_kg * 0.05**2


def model_limits(model: mujoco.MjModel) -> dict[str, np.ndarray]:
    """Position, velocity and torque limits per joint (the MJCF is the home of the first and last)."""
    return {
        "position": np.abs(model.jnt_range[:, 1]).copy(),
        "velocity": VELOCITY_LIMITS.copy(),
        "torque": np.abs(model.actuator_ctrlrange[:, 1]).copy(),
    }


def inverse_dynamics(
    model: mujoco.MjModel,
    data: mujoco.MjData,
    q: np.ndarray,
    qd: np.ndarray,
    qdd: np.ndarray,
    *,
    discrete: bool = False,
) -> np.ndarray:
    """Joint torques [N, 7] that realise (q, qd, qdd), one ``mj_inverse`` per row.

    The actuators are direct-drive motors (gear 1), so ``qfrc_inverse`` is the
    motor torque; it includes armature, damping and the soft dry-friction force.
    ``discrete=False`` is continuous-time inverse dynamics (what the datasets
    record). ``discrete=True`` sets MuJoCo's ``invdiscrete`` flag: the torque that
    makes one simulator step (Euler, implicit damping) produce exactly ``qdd`` as
    the finite-difference acceleration, i.e. the torque a 1 kHz controller holds.
    """
    flag = int(mujoco.mjtEnableBit.mjENBL_INVDISCRETE)
    saved = model.opt.enableflags
    model.opt.enableflags = (saved | flag) if discrete else (saved & ~flag)
    try:
        tau = np.empty_like(q)
        for i in range(q.shape[0]):
            data.qpos[:] = q[i]
            data.qvel[:] = qd[i]
            data.qacc[:] = qdd[i]
            mujoco.mj_inverse(model, data)
            tau[i] = data.qfrc_inverse
    finally:
        model.opt.enableflags = saved
    return tau


def discrete_feedforward(
    model: mujoco.MjModel, q: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Torques that make the simulator follow positions ``q`` [n + 2, 7] on its own time grid.

    With the semi-implicit Euler step (v' = v + h a, q' = q + h v'), the velocities
    v_k = (q_k - q_{k-1}) / h and accelerations a_k = (v_{k+1} - v_k) / h reproduce
    ``q`` exactly; ``mj_inverse`` in discrete mode gives the torque of each step.
    Returns (tau [n, 7] for steps 1..n, v_1 [7], the initial velocity to set with q_1).
    """
    h = model.opt.timestep
    v = np.diff(q, axis=0) / h
    a = np.diff(v, axis=0) / h
    tau = inverse_dynamics(model, mujoco.MjData(model), q[1:-1], v[:-1], a, discrete=True)
    return tau, v[0]


# ---------------------------------------------------------------------------- motion
@dataclass(frozen=True)
class RhythmicPattern:
    """A sum of sinusoids per joint: q_j(t) = c_j + sum_k a_jk sin(2 pi f_jk s t + phi_jk).

    ``s`` is the speed factor: the same path traced ``s`` times as fast. Arrays are
    ``center [7]`` and ``amplitude, frequency (Hz at s = 1), phase [7, K]``.
    """

    center: np.ndarray
    amplitude: np.ndarray
    frequency: np.ndarray
    phase: np.ndarray

    def evaluate(self, t: np.ndarray, speed: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Exact q, qd, qdd [N, 7] at times ``t`` [N] (s)."""
        omega = 2.0 * np.pi * self.frequency * speed  # [7, K]
        theta = omega[None] * np.asarray(t, dtype=np.float64)[:, None, None] + self.phase[None]
        sin, cos = np.sin(theta), np.cos(theta)
        q = self.center + (self.amplitude * sin).sum(-1)
        qd = (self.amplitude * omega * cos).sum(-1)
        qdd = -(self.amplitude * omega**2 * sin).sum(-1)
        return q, qd, qdd

    def bounds(self, speed: float) -> tuple[np.ndarray, np.ndarray]:
        """Upper bounds of |q_j| and |qd_j| over all time (triangle inequality)."""
        q_max = np.abs(self.center) + np.abs(self.amplitude).sum(-1)
        qd_max = (np.abs(self.amplitude) * 2.0 * np.pi * self.frequency * speed).sum(-1)
        return q_max, qd_max


@dataclass(frozen=True)
class TrajectoryFamily:
    """A KUKA1- or KUKA2-like trajectory family: seed, sinusoid layout and speeds."""

    name: str
    seed: int
    n_sines: int
    frequency_range: tuple[float, float]  # Hz at speed 1
    center_fraction: float  # posture centres drawn in +- this fraction of each joint range
    offline_speeds: tuple[float, ...]
    online_speeds: tuple[float, ...]

    @property
    def max_speed(self) -> float:
        return max(self.offline_speeds + self.online_speeds)

    def speeds(self, part: int) -> tuple[float, ...]:
        return self.online_speeds if part == ONLINE else self.offline_speeds

    def pattern(self, seed: int, limits: dict[str, np.ndarray]) -> RhythmicPattern:
        """The seeded motion, scaled so that every speed stays inside every limit.

        Amplitudes are scaled per joint by the tighter of the position room
        (``POSITION_MARGIN`` x range minus |centre|) and the velocity room
        (``VELOCITY_MARGIN`` x limit) at the family's fastest speed, so that all
        speeds trace the same path.
        """
        if seed < 0:
            raise KukaConfigError(f"seed must be >= 0, got {seed}")
        rng = np.random.default_rng([self.seed, seed])
        k = self.n_sines
        center = rng.uniform(-self.center_fraction, self.center_fraction, N_JOINTS) * limits["position"]
        frequency = rng.uniform(*self.frequency_range, size=(N_JOINTS, k))
        phase = rng.uniform(0.0, 2.0 * np.pi, size=(N_JOINTS, k))
        # decreasing weights so that slow components dominate, as in smooth rhythmic motion
        raw = rng.uniform(0.5, 1.0, size=(N_JOINTS, k)) / np.arange(1, k + 1)
        pos_room = POSITION_MARGIN * limits["position"] - np.abs(center)
        vel_room = VELOCITY_MARGIN * limits["velocity"]
        pos_scale = pos_room / raw.sum(-1)
        vel_scale = vel_room / (raw * 2.0 * np.pi * frequency * self.max_speed).sum(-1)
        amplitude = raw * np.minimum(pos_scale, vel_scale)[:, None]
        return RhythmicPattern(center=center, amplitude=amplitude, frequency=frequency, phase=phase)


FAMILIES: dict[str, TrajectoryFamily] = {
    "kuka1": TrajectoryFamily(
        name="kuka1",
        seed=1,
        n_sines=3,
        frequency_range=(0.05, 0.25),
        center_fraction=0.3,
        offline_speeds=(0.6, 1.0, 1.4),
        online_speeds=(0.5, 0.8, 1.0, 1.2, 1.5, 1.8),
    ),
    "kuka2": TrajectoryFamily(
        name="kuka2",
        seed=2,
        n_sines=4,
        frequency_range=(0.04, 0.3),
        center_fraction=0.4,
        offline_speeds=(0.5, 0.9, 1.3, 1.7),
        online_speeds=(0.4, 0.7, 1.0, 1.3, 1.6, 1.9, 2.2),
    ),
}


def get_family(name: str) -> TrajectoryFamily:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KukaConfigError(f"unknown trajectory family {name!r}; choose from {sorted(FAMILIES)}") from None


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
                raise KukaConfigError(f"{name} must be a finite std >= 0, got {value}")
        if self.derivatives not in DERIVATIVES:
            raise KukaConfigError(f"derivatives must be one of {DERIVATIVES}, got {self.derivatives!r}")


class KukaStream:
    """The live KUKA process: the arm cycles through its speeds, one segment per speed.

    Sample by sample (``for sample in stream``) or in chunks (:meth:`next_chunk`);
    :func:`collect_kuka` takes whole segments (:meth:`next_segment`) from the same
    object. Kinematics of a segment are drawn when it starts; torques are computed
    when samples are taken, so :meth:`set_payload` changes the plant from the next
    sample on (for online control runs where the payload changes mid-run).

    Each sample is a dict of ``q, qd, qdd, tau`` ([7] each, or [n, 7] in a chunk) plus
    ``t`` (s since the segment start), ``speed`` and ``segment`` (index).
    """

    def __init__(
        self,
        family: str = "kuka1",
        part: str = "online",
        seed: int = 0,
        *,
        payload_kg: float = 0.0,
        payload_offset: Sequence[float] = DEFAULT_PAYLOAD_OFFSET,
        rate_hz: float = DEFAULT_RATE_HZ,
        sensors: SensorConfig | None = None,
        segment_samples: int = 3000,
        speeds: Sequence[float] | None = None,
    ) -> None:
        if part not in ("offline", "online"):
            raise KukaConfigError(f"part must be 'offline' or 'online', got {part!r}")
        self.family = get_family(family)
        self.part = OFFLINE if part == "offline" else ONLINE
        self.rate_hz = check_rate(rate_hz)
        if segment_samples < 1:
            raise KukaConfigError(f"segment_samples must be >= 1, got {segment_samples}")
        self.segment_samples = int(segment_samples)
        self.sensors = sensors or SensorConfig()
        self.model = load_model(payload_kg, payload_offset)
        self._data = mujoco.MjData(self.model)
        self.limits = model_limits(self.model)
        self.pattern = self.family.pattern(seed, self.limits)
        self.speeds = tuple(float(s) for s in (speeds if speeds is not None else self.family.speeds(self.part)))
        if not self.speeds or min(self.speeds) <= 0 or max(self.speeds) > self.family.max_speed:
            raise KukaConfigError(
                f"speeds must be in (0, {self.family.max_speed}] (the family's velocity-safe range), got {self.speeds}"
            )
        self._rng = np.random.default_rng([self.family.seed, seed, self.part, 7])
        self.n_segments = 0
        self._segment: dict[str, np.ndarray] | None = None
        self._pos = 0
        self._speed = 0.0

    @property
    def dt(self) -> float:
        return 1.0 / self.rate_hz

    def set_payload(self, payload_kg: float, payload_offset: Sequence[float] = DEFAULT_PAYLOAD_OFFSET) -> None:
        """Change the payload from the next sample on."""
        set_payload(self.model, payload_kg, payload_offset)

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

    def _take(self, n: int) -> dict[str, np.ndarray]:
        seg = self._segment
        if seg is None:
            raise RuntimeError("no segment started")  # internal: callers start one first
        sl = slice(self._pos, self._pos + n)
        tau = inverse_dynamics(self.model, self._data, seg["q_true"][sl], seg["qd_true"][sl], seg["qdd_true"][sl])
        if self.sensors.torque_noise:
            tau += self.sensors.torque_noise * self._rng.standard_normal(tau.shape)
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
            raise KukaConfigError(f"a segment needs at least 1 sample, got {length}")
        self._start_segment(length)
        return self._take(length)

    def next_chunk(self, n: int) -> dict[str, np.ndarray]:
        """The next ``n`` samples, crossing into new segments (speeds) as needed."""
        if n < 1:
            raise KukaConfigError(f"a chunk needs at least 1 sample, got {n}")
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
        """Endless samples, one at a time (arrays [7], scalars for t, speed, segment)."""
        while True:
            chunk = self.next_chunk(1)
            yield {k: (v[0] if v.ndim > 1 else v[0].item()) for k, v in chunk.items()}


def check_rate(rate_hz: float) -> float:
    """A sample rate that is a whole number of 1 ms simulation steps."""
    if not np.isfinite(rate_hz) or rate_hz <= 0:
        raise KukaConfigError(f"sample rate must be > 0 Hz, got {rate_hz}")
    steps = 1.0 / (rate_hz * SIM_TIMESTEP)
    if abs(steps - round(steps)) > 1e-9 or round(steps) < 1:
        raise KukaConfigError(
            f"sample rate {rate_hz} Hz is not a whole number of {SIM_TIMESTEP * 1e3:g} ms simulation steps "
            f"(use e.g. 1000, 500, 250, 200, 100 or 50 Hz)"
        )
    return float(rate_hz)


# ---------------------------------------------------------------------------- collection
def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` samples over at most ``parts`` segments, no empty segment."""
    parts = min(parts, total)
    if parts == 0:
        return []
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def collect_kuka(
    store_path: str | Path,
    offline: int = 17560,
    online: int = 180360,
    payload: float = 0.0,
    family: str = "kuka1",
    seed: int = 0,
    *,
    payload_offset: Sequence[float] = DEFAULT_PAYLOAD_OFFSET,
    rate_hz: float = DEFAULT_RATE_HZ,
    sensors: SensorConfig | None = None,
    progress: bool = True,
) -> EpisodeStore:
    """Collect a KUKA1/KUKA2-like dataset into a new episode store at ``store_path``.

    The offline part (``offline`` samples) comes first, then the online part, each
    split evenly into one episode per speed of the family, in time order; the
    per-episode key ``online`` marks the part and ``speed`` the speed factor. The
    settings go to the store attributes. Returns the store (open for appending).
    """
    store_path = Path(store_path)
    if store_path.exists():
        raise KukaConfigError(f"{store_path}: already exists; a KUKA collection writes a new store")
    if offline < 0 or online < 0 or offline + online < 1:
        raise KukaConfigError(f"need offline >= 0, online >= 0 and at least one sample, got {offline} and {online}")
    sensors = sensors or SensorConfig()
    fam = get_family(family)
    rate_hz = check_rate(rate_hz)
    streams = {
        part: KukaStream(
            family, name, seed, payload_kg=payload, payload_offset=payload_offset, rate_hz=rate_hz, sensors=sensors
        )
        for part, name in ((OFFLINE, "offline"), (ONLINE, "online"))
    }
    limits = streams[OFFLINE].limits
    store = EpisodeStore.create(
        store_path,
        kuka_fields(),
        source="gpdyn.sim.kuka",
        env_id=ENV_ID,
        dt=1.0 / rate_hz,
        seed=seed,
        episode_keys=kuka_episode_keys(speed="float64"),
        extra_attrs={
            "family": fam.name,
            "family_config": asdict(fam),
            "rate_hz": rate_hz,
            "sim_timestep": SIM_TIMESTEP,
            "payload_kg": float(payload),
            "payload_offset": [float(v) for v in payload_offset],
            **asdict(sensors),
            "offline_samples": int(offline),
            "online_samples": int(online),
            "torque_source": "mujoco.mj_inverse on the true state",
            "tau_scale": [1.0] * N_JOINTS,
            "limits": {k: v.tolist() for k, v in limits.items()},
            "model_file": model_path().name,
        },
    )
    with tqdm(total=offline + online, desc=f"kuka {fam.name}", unit="sample", disable=not progress) as bar:
        for part, total in ((OFFLINE, offline), (ONLINE, online)):
            stream = streams[part]
            for length in split_evenly(total, len(stream.speeds)):
                seg = stream.next_segment(length)
                episode = {k: seg[k] for k in ("q", "qd", "qdd", "tau")}
                store.append_episode(episode, online=part, speed=float(seg["speed"][0]))
                bar.update(length)
    return store


def torque_ranges(store: EpisodeStore) -> np.ndarray:
    """[7, 2] min and max of ``tau`` per joint over the whole store (read in chunks)."""
    lo = np.full(N_JOINTS, np.inf)
    hi = np.full(N_JOINTS, -np.inf)
    for start in range(0, store.n_rows, 65536):
        tau = store.read("tau", start, start + 65536)
        lo = np.minimum(lo, tau.min(0))
        hi = np.maximum(hi, tau.max(0))
    return np.stack([lo, hi], axis=1)


def cli_collect(args: argparse.Namespace) -> int:
    """``gpdyn collect kuka``: collect, then print time and torque ranges beside the limits."""
    sensors = SensorConfig(
        torque_noise=getattr(args, "torque_noise", 0.0),
        position_noise=getattr(args, "position_noise", 0.0),
        derivatives=getattr(args, "derivatives", "exact"),
    )
    start = time.perf_counter()
    store = collect_kuka(
        args.store,
        offline=args.offline,
        online=args.online,
        payload=args.payload,
        family=args.family,
        seed=args.seed,
        rate_hz=getattr(args, "rate", DEFAULT_RATE_HZ),
        sensors=sensors,
    )
    elapsed = time.perf_counter() - start
    ranges = torque_ranges(store)
    run_for_args("collect-kuka", args).log(store=str(store.path), episodes=store.n_episodes, rows=store.n_rows, seconds=elapsed,
            tau_min=ranges[:, 0], tau_max=ranges[:, 1])
    limits = store.attrs["limits"]["torque"]
    print(f"{store.path}: {store.n_rows} samples in {store.n_episodes} episodes, {elapsed:.1f} s")
    print("joint  tau min [N m]  tau max [N m]  limit [N m]")
    for j, (lo, hi) in enumerate(ranges):
        print(f"  {j + 1}    {lo:12.2f}  {hi:12.2f}  {limits[j]:10.0f}")
    return 0


__all__ = [
    "ENV_ID",
    "FAMILIES",
    "KukaConfigError",
    "KukaStream",
    "RhythmicPattern",
    "SensorConfig",
    "TrajectoryFamily",
    "VELOCITY_LIMITS",
    "cli_collect",
    "collect_kuka",
    "discrete_feedforward",
    "get_family",
    "inverse_dynamics",
    "load_model",
    "model_limits",
    "model_path",
    "set_payload",
    "torque_ranges",
]
