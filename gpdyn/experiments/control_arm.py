"""Computed-torque tracking of the KUKA iiwa with learned inverse dynamics (``gpdyn control kuka``).

Control law at 100 Hz (feed-forward plus PD, as in learned inverse-dynamics control,
Nguyen-Tuong & Peters 2011)::

    tau = f(q_ref, qd_ref, qdd_ref) + Kp (q_ref - q) + Kd (qd_ref - qd)

with ``f`` one of: nothing (``pd``), MuJoCo's inverse dynamics of the actual plant
(``true``, payload included), the pretrained learner (``frozen``), or the same learner
updated online (``online``) from the measured torques: after each step the applied
torque is the target for the state at the middle of the step and the finite-difference
acceleration, ``x = [(q + q')/2, (qd + qd')/2, (qd' - qd)/dt]``, ``y = tau``. The torque is
held for the whole 10 ms step, so ``f`` is evaluated at the reference of the middle of
the step (``t + dt/2``), the same point its training pairs describe.

PD gains (:func:`pd_gains`): critically damped per joint, ``Kp = w^2 m_j``, ``Kd = 2 w m_j``,
on the *effective* inertia ``m_j = 1 / (M^-1)_jj`` (the inertia joint j feels with the
other joints free), its minimum over the reference poses. The diagonal ``M_jj`` is what
a joint feels with the others locked; it is up to 2.4x larger on the iiwa's coupled
joints 2 and 4, and gains built on it made the sampled 100 Hz loop unstable (spectral
radius up to 1.78, :func:`sampled_loop_radius`): the arm chattered at the Nyquist rate
against the torque limits from about t = 1.1 s, which was the 0.04-0.05 rad "true model"
error on joints 2 and 4.

A payload is added at the flange at step ``change_at``. Tracking RMSE per joint is
reported before and after the change for each controller.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
import torch
from tqdm import tqdm

from gpdyn.gp.residual import ResidualGP
from gpdyn.gp.training import OnlineUpdater, build_learner, pretrain_learner
from gpdyn.errors import InputError
from gpdyn.gp import Learner
from gpdyn.gp.online import DTYPES
from gpdyn.runs import RunDir

KUKA_CONTROLLERS = ("pd", "true", "frozen", "online")
ADAPT = ("residual", "steps")
N_JOINTS = 7


@dataclass
class KukaRunConfig:
    """Settings of a KUKA tracking run; defaults run in about a minute on 2 cores."""

    learner: str = "svdgp"
    scale: str = "small"
    steps: int = 400  # control steps at 100 Hz
    change_at: int = 200
    payload: float = 3.0  # kg at the flange from step change_at
    family: str = "kuka1"
    speed: float = 1.0
    offline: int = 3000  # samples collected to pretrain on when no store is given
    pretrain_iterations: int = 100
    pretrain_batch: int = 128
    online_batch: int = 64
    updates: int = 1
    adapt: str = "residual"  # online model: "residual" (ResidualGP on the frozen one) or "steps" (the learner's own steps)
    window: int = 400  # ResidualGP: most recent samples it conditions on
    qdd_lengthscale: float = 10.0  # ResidualGP: factor on the median-trick lengthscales of the 7 accelerations
    omega: float = 20.0  # PD bandwidth, rad/s
    controllers: tuple[str, ...] = KUKA_CONTROLLERS
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float64"
    progress: bool = True

    @property
    def dt(self) -> float:
        return 0.01  # KukaIiwaEnv: frame_skip 10 x 1 ms

    def validate(self) -> None:
        """Raise InputError naming the first bad option."""
        if self.steps < 2 or not 0 <= self.change_at < self.steps:
            raise InputError(f"control kuka: need steps >= 2 and 0 <= change_at < steps, got {self.steps}, {self.change_at}")
        if not np.isfinite(self.payload) or self.payload < 0:
            raise InputError(f"control kuka: --payload must be a finite mass >= 0 kg, got {self.payload}")
        if not self.omega > 0:
            raise InputError(f"control kuka: omega must be > 0, got {self.omega}")
        bad = [c for c in self.controllers if c not in KUKA_CONTROLLERS]
        if bad or not self.controllers:
            raise InputError(f"control kuka: controllers {bad or '(none)'} not in {', '.join(KUKA_CONTROLLERS)}")
        if self.adapt not in ADAPT:
            raise InputError(f"control kuka: adapt must be one of {', '.join(ADAPT)}, got '{self.adapt}'")
        if self.window < 4 or self.updates < 0 or not self.qdd_lengthscale > 0:
            raise InputError(f"control kuka: need window >= 4, updates >= 0 and qdd_lengthscale > 0, got "
                             f"{self.window}, {self.updates}, {self.qdd_lengthscale}")
        if self.dtype not in DTYPES:
            raise InputError(f"control kuka: dtype must be one of {', '.join(DTYPES)}, got '{self.dtype}'")


class LearnedInverseDynamics:
    """Torques ``[7]`` from a ``kuka`` learner (inputs [q, qd, qdd] normalised by the problem)."""

    def __init__(self, learner: Learner, normalizer: Any) -> None:
        if learner.input_dim != 3 * N_JOINTS or learner.output_dim != N_JOINTS:
            raise InputError(f"LearnedInverseDynamics: learner maps {learner.input_dim} -> {learner.output_dim}, kuka needs 21 -> 7")
        self.learner, self.normalizer = learner, normalizer

    def _x(self, q: np.ndarray, qd: np.ndarray, qdd: np.ndarray) -> torch.Tensor:
        x = torch.as_tensor(np.concatenate([q, qd, qdd])[None], device=self.learner.device, dtype=self.learner.dtype)
        return self.normalizer.normalize_x(x)

    def __call__(self, q: np.ndarray, qd: np.ndarray, qdd: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            mean, _ = self.learner.predict(self._x(q, qd, qdd))
        return self.normalizer.denormalize_y(mean)[0].cpu().numpy().astype(np.float64)

    def training_pair(self, q: np.ndarray, qd: np.ndarray, qdd: np.ndarray, tau: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.as_tensor(tau[None], device=self.learner.device, dtype=self.learner.dtype)
        return self._x(q, qd, qdd), self.normalizer.normalize_y(y)


def inertia_matrix(model: mujoco.MjModel, q: np.ndarray, data: mujoco.MjData | None = None) -> np.ndarray:
    """Joint-space inertia ``M(q)`` [nv, nv] (armature included)."""
    data = data if data is not None else mujoco.MjData(model)
    data.qpos[:] = q
    mujoco.mj_forward(model, data)
    full = np.zeros((model.nv, model.nv))
    mujoco.mj_fullM(model, data, full)
    return full


def _poses(model: mujoco.MjModel, poses: np.ndarray) -> np.ndarray:
    poses = np.atleast_2d(np.asarray(poses, dtype=np.float64))
    if poses.shape[-1] != model.nq or poses.shape[0] < 1 or not np.isfinite(poses).all():
        raise InputError(f"pd gains: poses must be finite [N, {model.nq}] joint positions, got shape {poses.shape}")
    return poses


def pd_gains(model: mujoco.MjModel, poses: np.ndarray, omega: float) -> tuple[np.ndarray, np.ndarray]:
    """Critically damped gains ``(Kp, Kd)`` [nv] on the smallest effective inertia over ``poses`` [N, nq]."""
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


def _kuka_problem(run: RunDir, cfg: KukaRunConfig, store: str | Path | None):
    from gpdyn.data.problems import load_problem
    from gpdyn.sim.kuka import collect_kuka

    if store is None:
        store = run.path / "kuka.zarr"
        collect_kuka(store, offline=cfg.offline, online=max(100, cfg.offline // 10), family=cfg.family, seed=cfg.seed,
                     progress=cfg.progress)
    elif not Path(store).exists():
        raise InputError(f"control kuka: --store {store} does not exist")
    return load_problem(store, "kuka", protocol="ordered", seed=cfg.seed)


def run_kuka(run: RunDir, cfg: KukaRunConfig, store: str | Path | None = None) -> dict[str, Any]:
    """Pretrain, track with every controller (payload added mid-run), write the report."""
    from gpdyn.robots.arm_env import KukaIiwaEnv
    from gpdyn.experiments.control_report import write_kuka_report
    from gpdyn.sim.kuka import inverse_dynamics

    cfg.validate()
    dtype = DTYPES[cfg.dtype]
    learned = [c for c in cfg.controllers if c in ("frozen", "online")]
    base: Learner | None = None
    problem = None
    if learned:
        problem = _kuka_problem(run, cfg, store)
        xs = [problem.tensors(s, cfg.device, dtype) for s in ("init", "train") if len(problem.split(s)[0])]
        x_train, y_train = torch.cat([a for a, _ in xs]), torch.cat([b for _, b in xs])
        base = build_learner(cfg.learner, 21, 7, scale=cfg.scale, device=cfg.device, dtype=dtype, seed=cfg.seed)
        t0 = time.perf_counter()
        fit = pretrain_learner(base, x_train, y_train, iterations=cfg.pretrain_iterations, batch=cfg.pretrain_batch,
                               seed=cfg.seed, progress=cfg.progress)
        run.log(kind="pretrain", robot="kuka", learner=cfg.learner, rows=int(x_train.shape[0]),
                seconds=time.perf_counter() - t0, **fit)
        print(f"   pretrained {cfg.learner} on {x_train.shape[0]} kuka rows in {time.perf_counter() - t0:.1f} s")
    joint_rmse: dict[str, dict[str, list[float]]] = {}
    for ctrl in cfg.controllers:
        env = KukaIiwaEnv(family=cfg.family, speed=cfg.speed, pattern_seed=cfg.seed)
        obs, info = env.reset(seed=cfg.seed)
        limits = np.abs(env.model.actuator_ctrlrange[:, 1])
        poses = env.pattern.evaluate(np.arange(0.0, cfg.steps * cfg.dt, 0.05), cfg.speed)[0]
        kp, kd = pd_gains(env.model, poses, cfg.omega)
        scratch = mujoco.MjData(env.model)
        model = updater = None
        if ctrl in ("frozen", "online"):
            assert base is not None and problem is not None
            learner = base
            if ctrl == "online":
                learner = build_learner(cfg.learner, 21, 7, scale=cfg.scale, device=cfg.device, dtype=dtype, seed=cfg.seed)
                learner.load_state_dict(base.state_dict())
                if cfg.adapt == "residual":
                    factors = [1.0] * (2 * N_JOINTS) + [cfg.qdd_lengthscale] * N_JOINTS
                    learner = ResidualGP(learner, x_train, window=cfg.window, amplitude=1.0, lengthscale_factor=factors)
                updater = OnlineUpdater(learner, batch=cfg.online_batch, updates=cfg.updates)
            model = LearnedInverseDynamics(learner, problem.normalizer)
        errors = np.zeros((cfg.steps, N_JOINTS))
        for t in tqdm(range(cfg.steps), desc=f"kuka/{ctrl}", disable=not cfg.progress, leave=False):
            if t == cfg.change_at:
                env.set_payload(cfg.payload)
            q, qd = obs[:N_JOINTS].copy(), obs[N_JOINTS:].copy()
            ref = (info["q_ref"], info["qd_ref"])
            mid = env.reference(info["t"] + 0.5 * cfg.dt)  # the torque is held over the whole step
            if ctrl == "pd":
                ff = np.zeros(N_JOINTS)
            elif ctrl == "true":
                ff = inverse_dynamics(env.model, scratch, *(r[None] for r in mid))[0]
            else:
                ff = model(*mid)
            record: dict[str, Any] = {}
            if ctrl in ("frozen", "online"):  # the learned feed-forward against the plant's own, N m
                exact = inverse_dynamics(env.model, scratch, *(r[None] for r in mid))[0]
                record["ff_error"] = (ff - exact).tolist()
            ff_ok = bool(np.isfinite(ff).all())
            if not ff_ok:  # a non-finite model output never reaches the motors: PD alone this step
                ff = np.zeros(N_JOINTS)
            tau = np.clip(ff + kp * (ref[0] - q) + kd * (ref[1] - qd), -limits, limits)
            obs, _, _, _, info = env.step(tau)
            q1, qd1 = obs[:N_JOINTS], obs[N_JOINTS:]
            errors[t] = q1 - info["q_ref"]
            if updater is not None:
                t_up = time.perf_counter()
                updater(*model.training_pair(0.5 * (q + q1), 0.5 * (qd + qd1), (qd1 - qd) / cfg.dt, tau))
                record["update_seconds"] = time.perf_counter() - t_up
            run.log(kind="step", robot="kuka", controller=ctrl, t=t, tracking_error=float(np.linalg.norm(errors[t])),
                    payload=cfg.payload if t >= cfg.change_at else 0.0, fallback="" if ff_ok else "feed-forward not finite",
                    **record)
        env.close()
        phases = {"before": errors[: cfg.change_at], "after": errors[cfg.change_at :]}
        joint_rmse[ctrl] = {k: np.sqrt((v**2).mean(0)).tolist() for k, v in phases.items() if len(v)}
        run.log(kind="tracking", robot="kuka", controller=ctrl, rmse=joint_rmse[ctrl],
                **(model.learner.diagnostics() if model is not None else {}))
        print(f"   {ctrl:<7} " + "  ".join(f"{k} RMSE {np.mean(v):.4f} rad" for k, v in joint_rmse[ctrl].items()))
    report = write_kuka_report(run, cfg, joint_rmse)
    return {"rmse": joint_rmse, "report": str(report)}


__all__ = ["KUKA_CONTROLLERS", "KukaRunConfig", "LearnedInverseDynamics", "inertia_matrix", "pd_gains", "run_kuka",
           "sampled_loop_radius"]
