"""Walker2d walking by predictive sampling on a learned model after a plant change (``gpdyn control walker --recipe NAME`` of a ``walker-learned`` recipe).

For each plant change (``the task's ``plant_changes````, e.g. the right hip motor at
30 %) and each seed, one episode of Walker2d-v5 on the CHANGED plant under three
spline-sampling controllers (:mod:`gpdyn.control.spline_sampling`, :class:`gpdyn.robots.legged.WalkingCost`):

- ``true``: the changed plant's own ``MjModel`` as the planning model (the reference);
- ``frozen``: the learned model never updated, i.e. the NOMINAL plant's planning model;
- ``online``: the nominal model learning online from every executed transition (``explore_std``:
  exploration noise on the executed action, off by default). ``model="parameters"`` (the
  default): the plant's physical parameters identified by Bayesian linear regression on their
  sensitivities (:class:`gpdyn.control.identified_model.IdentifiedForward`); ``"residual"``: a
  GP residual (``space``: a generalized force or a velocity change,
  :class:`gpdyn.control.hybrid_model.HybridForward`); ``"parameters+residual"``: the residual
  learned on top of the identified parameters (both).

The "learned model" is nominal MuJoCo physics with a learned part, not a pure GP model (a pure
GP of walking does not rank plans: ``scripts/sampler_learned_model.py``).

Reported: return, steps walked, falls, mean forward speed and CPU ms per control step
(act + observe, ``time.process_time``, one torch thread), per controller and seed; per
change the recovery fraction ``(online - frozen) / (true - frozen)`` of mean returns.
Diagnostics on the online controller's own states, every ``eval_every`` steps: the
Spearman rank correlation of the sampler's ``K`` sample costs under the nominal and the
current hybrid model against the changed plant's planning model; and the open-loop error
over ``eval_horizon`` planning steps of the executed actions, of the nominal model and of
the hybrid model as it was at the checkpoint (a snapshot: the transitions it is scored
on come after it).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpdyn.control.hybrid_model import HybridForward, HybridSamplingController, ResidualConfig
from gpdyn.control.identified_model import IdentificationConfig, IdentifiedForward
from gpdyn.control.planner import env_state
from gpdyn.sim.loop import run_episode
from gpdyn.control.spline_sampling import MujocoForward, SamplerConfig, SamplingController, split_state
from gpdyn.errors import InputError
from gpdyn.progress import progress_bar
from gpdyn.robots.walker import DT, WALKER, make_env
from gpdyn.robots.legged import WalkingCost, state_rows
from gpdyn.runs import RunDir

log = logging.getLogger(__name__)

CONTROLLERS = ("true", "frozen", "online")
#: what the online controller learns: the plant's parameters (IdentifiedForward), a GP residual on the nominal model
#: (HybridForward) or a GP residual on the identified parameters (HybridForward with identification)
MODELS = ("parameters", "residual", "parameters+residual")
NOMINAL = "none"  # the plant unchanged


def split_change(entry: str, where: str = "walk_learned_model") -> tuple[str, float | None]:
    """``"weak_motor:0.1"`` -> ``("weak_motor", 0.1)``, a bare name -> ``(name, None)``; InputError (prefixed by
    ``where``) on a factor that is no number."""
    name, _, factor = entry.partition(":")
    if not factor:
        return name, None
    try:
        return name, float(factor)
    except ValueError:
        raise InputError(f"{where}: factor of {name!r} must be a number, got {factor!r}") from None


@dataclass
class WalkLearnedConfig:
    """What :func:`run` runs (see the module docs)."""

    seeds: list[int] = field(default_factory=lambda: [200, 201, 202, 203, 204, 205, 206, 207])
    steps: int = 1000
    # plant changes, each a name of the task's plant_changes (or "none"), with its own factor as "name:factor"
    changes: list[str] = field(default_factory=lambda: ["weak_motor"])
    factors: dict[str, float] = field(default_factory=lambda: {"weak_motor": 0.3})  # a name's factor, else its default
    controllers: list[str] = field(default_factory=lambda: list(CONTROLLERS))
    explore_std: float = 0.0  # action noise while learning (off: it made the online walker fall more on seeds 200-207)
    eval_every: int = 100  # steps between diagnostics of the online model (0: none)
    eval_horizon: int = 16  # planning steps of the open-loop error
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    model: str = "parameters"  # one of MODELS
    residual: ResidualConfig = field(default_factory=ResidualConfig)  # model="residual", "parameters+residual"
    identification: IdentificationConfig = field(default_factory=IdentificationConfig)  # "parameters", "parameters+residual"

    def change_factor(self, change: str) -> tuple[str, float | None]:
        """The plant change's name and factor of an entry of ``changes``: ``"weak_motor:0.1"`` names its own,
        a bare name takes ``factors``' (None: the change's default)."""
        name, factor = split_change(change)
        return name, self.factors.get(name) if factor is None else factor

    @property
    def learned(self) -> ResidualConfig | IdentificationConfig:
        """The learned model's config (``model``): the residual's where there is one."""
        return self.identification if self.model == "parameters" else self.residual

    @property
    def identification_under_residual(self) -> IdentificationConfig | None:
        """The identification the residual is learned on top of (``model="parameters+residual"``), else None."""
        return self.identification if self.model == "parameters+residual" else None

    def validate(self) -> None:
        """Raise InputError naming the first impossible option."""
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise InputError(f"walk_learned_model: need distinct seeds, got {self.seeds}")
        if self.steps < 1:
            raise InputError(f"walk_learned_model: steps must be >= 1, got {self.steps}")
        if not self.changes:
            raise InputError("walk_learned_model: need at least one plant change")
        if len(set(self.changes)) != len(self.changes):
            raise InputError(f"walk_learned_model: each plant change once, got {self.changes}")
        for change in self.changes:
            name, factor = self.change_factor(change)
            if name != NOMINAL:
                WALKER.plant_change_factor(name, factor)
        unknown = [c for c in self.controllers if c not in CONTROLLERS]
        if unknown or not self.controllers:
            raise InputError(f"walk_learned_model: controllers must be among {', '.join(CONTROLLERS)}, got {self.controllers}")
        if not (np.isfinite(self.explore_std) and self.explore_std >= 0):
            raise InputError(f"walk_learned_model: explore_std must be finite and >= 0, got {self.explore_std}")
        if self.eval_every < 0 or self.eval_horizon < 1:
            raise InputError(f"walk_learned_model: eval_every >= 0 and eval_horizon >= 1, got {self.eval_every}, "
                             f"{self.eval_horizon}")
        if self.model not in MODELS:
            raise InputError(f"walk_learned_model: model must be one of {', '.join(MODELS)}, got {self.model!r}")
        self.sampler.validate()
        self.residual.validate()
        self.identification.validate()


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of ``values``, tied values sharing the mean of their ranks."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)
    return (last - (counts - 1) / 2.0)[inverse.reshape(-1)]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two samples (NaN when either is constant), in numpy:
    scipy is an optional dependency (the SARCOS importer's), not one of the walker's."""
    ra, rb = _average_ranks(np.ravel(a)), _average_ranks(np.ravel(b))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    norm = float(np.sqrt((ra @ ra) * (rb @ rb)))
    return float(ra @ rb) / norm if norm > 0 else float("nan")


def plant(change: str, factor: float | None) -> tuple[Any, str]:
    """A Walker2d env whose model has the named change (``"none"``: nominal) and its description."""
    env = make_env()
    if change == NOMINAL:
        return env, "nominal"
    return env, WALKER.apply_plant_change(env.unwrapped.model, change, factor)


def nominal_model() -> Any:
    """A copy of the nominal plant's ``MjModel``."""
    env = make_env()
    model = copy.deepcopy(env.unwrapped.model)
    env.close()
    return model


class Diagnostics:
    """The online model's ranking and open-loop checks at every ``every``-th step (module docs).

    ``before_step`` of :func:`gpdyn.sim.loop.run_episode`: at a checkpoint it scores
    ``K`` spline samples drawn as the sampler draws them (its nominal knots plus noise)
    through the changed plant's planning model, the nominal model and the current hybrid
    model, and keeps a snapshot of the hybrid model and the state for :meth:`open_loop`.
    """

    def __init__(self, controller: HybridSamplingController, changed: Any, cost: WalkingCost, every: int, seed: int) -> None:
        self.controller, self.cost, self.every = controller, cost, every
        cfg = controller.config
        self.truth = MujocoForward(changed, DT, cfg.stride, cfg.integrator)  # the changed plant's planning model
        self.nominal = HybridForward(controller.nominal, DT, cfg.stride, cfg.integrator)  # never observes: nominal
        self.rng = np.random.default_rng(seed + 104729)
        self.rank: list[dict[str, float]] = []
        self.snapshots: list[tuple[int, Any]] = []  # (step, a frozen copy of the online model)

    def __call__(self, t: int, env: Any) -> None:
        if not self.every or t % self.every or not self.controller.forward.active:
            return None
        sampler, cfg = self.controller.sampler, self.controller.config
        state = env_state(env)
        knots = sampler.nominal + cfg.noise_std * self.rng.standard_normal((cfg.samples, cfg.knots, sampler.nu))
        controls = sampler.controls(np.clip(knots, sampler.low, sampler.high))
        costs = {name: self.cost(*split_state(model.rollout(state, controls), sampler.nq), controls) for name, model in
                 (("true", self.truth), ("nominal", self.nominal), ("online", self.controller.forward))}
        self.rank.append({"t": t, **{f"spearman_{k}": spearman(costs["true"], costs[k])
                                     for k in ("nominal", "online")}})
        self.snapshots.append((t, self.controller.forward.snapshot()))
        return None

    def open_loop(self, rows: dict[str, np.ndarray], horizon: int) -> list[dict[str, float]]:
        """Per snapshot: open-loop errors over ``horizon`` planning steps of the executed actions, nominal vs snapshot.

        ``qvel_rmse``: RMS over the path's joint velocities (rad/s, m/s); ``one_step_qvel_rmse``: its
        first planning step alone; ``torso_end_err``: |error| of torso height (m) + pitch (rad) at the end.
        """
        stride = self.controller.config.stride
        qpos, qvel, actions = rows["qpos"], rows["qvel"], rows["action"]
        next_qpos, next_qvel = rows["next_qpos"], rows["next_qvel"]
        out = []
        for t, snap in self.snapshots:
            if t + stride * horizon > len(actions):
                continue
            u = actions[t : t + stride * horizon].reshape(horizon, stride, -1).mean(1)[None]
            idx = t + stride * np.arange(1, horizon + 1) - 1  # rows after each planning step
            true_q, true_v = next_qpos[idx], next_qvel[idx]
            record: dict[str, float] = {"t": t}
            for name, model in (("nominal", self.nominal), ("online", snap)):
                pq, pv = split_state(model.rollout(np.concatenate([qpos[t], qvel[t]]), u), qpos.shape[1])
                record[f"qvel_rmse_{name}"] = float(np.sqrt(((pv[0] - true_v) ** 2).mean()))
                record[f"one_step_qvel_rmse_{name}"] = float(np.sqrt(((pv[0, 0] - true_v[0]) ** 2).mean()))
                record[f"torso_end_err_{name}"] = float(np.abs(pq[0, -1, 1:3] - true_q[-1, 1:3]).sum())
            out.append(record)
        return out


def episode(controller_name: str, change: str, seed: int, config: WalkLearnedConfig, cost: WalkingCost,
            nominal: Any, progress: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One episode on the changed plant under the named controller: its record and (online) its diagnostics."""
    env, description = plant(*config.change_factor(change))
    if controller_name == "true":
        controller: SamplingController = SamplingController(cost, DT, config.sampler, seed=seed, name="true")
    else:
        online = controller_name == "online"
        controller = HybridSamplingController(cost, DT, nominal, config.sampler, config.learned, learn=online,
                                              explore_std=config.explore_std if online else 0.0, seed=seed,
                                              name=controller_name, identification=config.identification_under_residual)
    diag = (Diagnostics(controller, env.unwrapped.model, cost, config.eval_every, seed)
            if controller_name == "online" and config.eval_every else None)
    ep = run_episode(env, controller, steps=config.steps, reset_seed=seed, before_step=diag, rows=state_rows,
                     next_rows=("qpos", "qvel"), tags={"change": change, "controller": controller_name, "seed": seed},
                     progress=progress)
    env.close()
    rows, length = ep.rows, ep.record["length"]
    x0, x1 = rows["qpos"][0, 0], rows["next_qpos"][-1, 0]
    record = {**ep.record, "change": change, "plant": description, "fell": bool(rows["terminated"][-1, 0]),
              "distance_m": float(x1 - x0), "speed_m_s": float((x1 - x0) / (length * DT)),
              "cpu_ms_per_step": ep.record["plan_cpu_ms_mean"]}
    forward = getattr(controller, "forward", None)
    under = forward.identified if isinstance(forward, HybridForward) else None  # parameters+residual: the parameters
    identified = under if under is not None else forward
    if isinstance(identified, IdentifiedForward) and identified.active:
        record["identified"] = identified.factors()  # the factors the planning model ends with
        if identified.joint_gp is not None:  # its force of each joint's angle and velocity, as a spring and a damper
            record["joint_gp"] = identified.joint_gp.stiffness_damping()
    if under is not None:  # (the residual's own check is residual_distrusted_steps)
        record["parameters_distrusted_steps"] = float(under.distrusted_steps)
    diagnostics: list[dict[str, Any]] = []
    if diag is not None:
        loops = {r["t"]: r for r in diag.open_loop(rows, config.eval_horizon)}
        diagnostics = [{**r, **loops.get(r["t"], {})} for r in diag.rank]
        for key in ("spearman_nominal", "spearman_online", "qvel_rmse_nominal", "qvel_rmse_online",
                    "one_step_qvel_rmse_nominal", "one_step_qvel_rmse_online", "torso_end_err_nominal", "torso_end_err_online"):
            record[key] = _mean(diagnostics, key)
    return record, diagnostics


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if key in r and np.isfinite(r[key])]
    return float(np.mean(values)) if values else float("nan")


def recovery(learner: float, frozen: float, true: float) -> float:
    """The share of the return the frozen model loses against the true one that the learner wins back,
    ``(learner - frozen) / (true - frozen)``; NaN where nothing is lost."""
    lost = true - frozen
    return (learner - frozen) / lost if np.isfinite(lost) and abs(lost) > 1e-9 else float("nan")


def summary(records: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """Per plant (change and factor) and controller: means over seeds, falls, and per plant the recovery fraction."""
    out = []
    for plant_text in dict.fromkeys(r["plant"] for r in records):  # per change and factor
        names = list(CONTROLLERS) + [c for c in dict.fromkeys(r["controller"] for r in records) if c not in CONTROLLERS]
        by = {c: [r for r in records if r["plant"] == plant_text and r["controller"] == c] for c in names}
        means = {c: _mean(rows, "return") for c, rows in by.items()}
        for c, rows in by.items():
            if not rows:
                continue
            out.append({"change": rows[0]["change"], "plant": plant_text, "controller": c, "seeds": len(rows),
                        "return": means[c], "return_std": float(np.std([r["return"] for r in rows])),
                        "steps": _mean(rows, "length"), "falls": sum(r["fell"] for r in rows),
                        "walked_all": sum(r["length"] == steps and not r["fell"] for r in rows),
                        "speed_m_s": _mean(rows, "speed_m_s"), "cpu_ms_per_step": _mean(rows, "cpu_ms_per_step"),
                        "recovery": (recovery(means[c], means["frozen"], means["true"]) if c not in ("true", "frozen")
                                     else float("nan")),
                        **{k: _mean(rows, k) for k in ("spearman_nominal", "spearman_online", "qvel_rmse_nominal",
                                                       "qvel_rmse_online", "one_step_qvel_rmse_nominal",
                                                       "one_step_qvel_rmse_online", "torso_end_err_nominal",
                                                       "torso_end_err_online") if c not in ("true", "frozen")}})
    return out


def paired(records: list[dict[str, Any]], resamples: int = 10000, seed: int = 0) -> list[dict[str, Any]]:
    """Per plant and learning controller, over the seeds that ran true, frozen and it: paired differences of
    returns (mean and standard error over seeds) and the recovery fraction with a bootstrap over seeds.

    The returns of one seed are paired (the same start state); falls make them heavy-tailed, so the
    recovery, a ratio of two such differences, gets a percentile interval (5-95 %, ``resamples`` seed
    resamples, the ratio undefined where a resample's loss is 0) instead of a normal one."""
    rng = np.random.default_rng(seed)
    out = []
    for plant_text in dict.fromkeys(r["plant"] for r in records):
        by_seed: dict[str, dict[int, dict[str, Any]]] = {}
        for r in records:
            if r["plant"] == plant_text:
                by_seed.setdefault(r["controller"], {})[r["seed"]] = r
        for learner in [c for c in by_seed if c not in ("true", "frozen")]:
            seeds = sorted(set(by_seed[learner]) & set(by_seed.get("true", {})) & set(by_seed.get("frozen", {})))
            if not seeds:
                continue
            ret = {c: np.array([by_seed[c][s]["return"] for s in seeds], dtype=float) for c in ("true", "frozen", learner)}
            falls = {c: sum(bool(by_seed[c][s]["fell"]) for s in seeds) for c in ("true", "frozen", learner)}
            n = len(seeds)

            def diff(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
                d = a - b
                return float(d.mean()), float(d.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
            picks = rng.integers(0, n, size=(resamples, n))
            lost = ret["true"][picks].mean(1) - ret["frozen"][picks].mean(1)
            gained = ret[learner][picks].mean(1) - ret["frozen"][picks].mean(1)
            ratios = np.divide(gained, lost, out=np.full(resamples, np.nan), where=np.abs(lost) > 1e-9)
            finite = ratios[np.isfinite(ratios)]
            out.append({"plant": plant_text, "controller": learner, "seeds": n, "seed_list": seeds,
                        **{f"return_{c}": float(v.mean()) for c, v in (("true", ret["true"]), ("frozen", ret["frozen"]),
                                                                         ("learner", ret[learner]))},
                        "falls_true": falls["true"], "falls_frozen": falls["frozen"], "falls_learner": falls[learner],
                        "learner_minus_frozen": diff(ret[learner], ret["frozen"]),
                        "learner_minus_true": diff(ret[learner], ret["true"]),
                        "true_minus_frozen": diff(ret["true"], ret["frozen"]),
                        "recovery": float(recovery(ret[learner].mean(), ret["frozen"].mean(), ret["true"].mean())),
                        "recovery_5": float(np.percentile(finite, 5)) if finite.size else float("nan"),
                        "recovery_95": float(np.percentile(finite, 95)) if finite.size else float("nan")})
    return out


def _f(value: float, fmt: str = ".2f") -> str:
    return "-" if not np.isfinite(value) else format(value, fmt)


def tables(rows: list[dict[str, Any]], records: list[dict[str, Any]], steps: int) -> str:
    """The report's markdown: the summary table, the diagnostics table, the per-seed table."""
    lines = [f"| plant | controller | seeds | return (mean ± std) | steps (mean) | falls | walked {steps} | speed (m/s) "
             "| CPU ms / step | recovery |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['plant']} | {r['controller']} | {r['seeds']} | {r['return']:.0f} ± {r['return_std']:.0f} "
                     f"| {r['steps']:.0f} | {r['falls']} | {r['walked_all']} | {_f(r['speed_m_s'])} "
                     f"| {_f(r['cpu_ms_per_step'], '.1f')} | {_f(r['recovery'])} |")
    lines += ["", "Model checks on the online controller's own states (mean over checkpoints and seeds; "
              "nominal = the frozen model, online = the hybrid model at the checkpoint):", "",
              "| plant | Spearman nominal | Spearman online | 1-step qvel RMSE nominal | online "
              "| open-loop qvel RMSE nominal | online | torso end error nominal | online |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["controller"] in ("true", "frozen"):
            continue
        lines.append(f"| {r['plant']} ({r['controller']}) | {_f(r['spearman_nominal'])} | {_f(r['spearman_online'])} "
                     f"| {_f(r['one_step_qvel_rmse_nominal'], '.3f')} | {_f(r['one_step_qvel_rmse_online'], '.3f')} "
                     f"| {_f(r['qvel_rmse_nominal'], '.3f')} | {_f(r['qvel_rmse_online'], '.3f')} "
                     f"| {_f(r['torso_end_err_nominal'], '.3f')} | {_f(r['torso_end_err_online'], '.3f')} |")
    lines += ["", "Paired over seeds (± : standard error of the paired differences; recovery with a bootstrap "
              "over seeds, 5-95 %):", "",
              "| plant | controller | seeds | true | frozen | it | falls true / frozen / it | it − frozen | it − true "
              "| true − frozen | recovery (5-95 %) |", "|---|---|---|---:|---:|---:|---|---:|---:|---:|---|"]

    def pm(pair: tuple[float, float]) -> str:
        return f"{pair[0]:.0f} ± {_f(pair[1], '.0f')}"
    for p in paired(records):
        lines.append(f"| {p['plant']} | {p['controller']} | {p['seeds']} | {p['return_true']:.0f} | {p['return_frozen']:.0f} "
                     f"| {p['return_learner']:.0f} | {p['falls_true']} / {p['falls_frozen']} / {p['falls_learner']} "
                     f"| {pm(p['learner_minus_frozen'])} | {pm(p['learner_minus_true'])} | {pm(p['true_minus_frozen'])} "
                     f"| {_f(p['recovery'])} ({_f(p['recovery_5'])} to {_f(p['recovery_95'])}) |")
    identified = [r for r in records if r.get("identified")]
    if identified:
        lines += ["", "Identified parameters at the end of each online episode (factors on the nominal values, "
                  "mean ± std over seeds; those off by more than 2 % in the mean):", "",
                  "| plant | controller | parameter | factor |", "|---|---|---|---|"]
        for key in dict.fromkeys((r["plant"], r["controller"]) for r in identified):
            factors = [r["identified"] for r in identified if (r["plant"], r["controller"]) == key]
            for name in factors[0]:
                values = np.array([f[name] for f in factors])
                if abs(values.mean() - 1) > 0.02:
                    lines.append(f"| {key[0]} | {key[1]} | {name} | {values.mean():.3f} ± {values.std():.3f} |")
    lines += ["", "Per seed:", "", "| plant | controller | seed | steps | fell | return | speed (m/s) | CPU ms / step |",
              "|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['plant']} | {r['controller']} | {r['seed']} | {r['length']} | {'yes' if r['fell'] else 'no'} "
                     f"| {r['return']:.0f} | {r['speed_m_s']:.2f} | {r['cpu_ms_per_step']:.1f} |")
    return "\n".join(lines)


def run(config: WalkLearnedConfig | None = None, cost: WalkingCost | None = None, out: str | Path | None = None,
        progress: bool = True) -> RunDir:
    """Every change x seed x controller into a run folder (``metrics.jsonl``: one ``episode`` record per
    episode, one ``diagnostic`` record per checkpoint, one ``summary`` record per change and controller; ``report.md``)."""
    config, cost = config or WalkLearnedConfig(), cost or WalkingCost()
    config.validate()
    run_dir = RunDir.create("walk-learned-model", {**asdict(config), "cost": asdict(cost)}, out=out)
    print(f"walk_learned_model: run folder {run_dir.path}", flush=True)  # the run folder and the tables: stdout
    nominal = nominal_model()
    jobs = [(change, seed, c) for change in config.changes for seed in config.seeds for c in config.controllers]
    records = []
    for change, seed, c in progress_bar(jobs, desc="episodes", disable=not progress):
        record, diagnostics = episode(c, change, seed, config, cost, nominal, progress=progress)
        for d in diagnostics:
            run_dir.log(kind="diagnostic", change=change, controller=c, seed=seed, **d)
        run_dir.log(**{k: v for k, v in record.items() if k != "kind"}, kind="episode")
        records.append(record)
        log.info(f"{change} {c} seed {seed}: {record['length']} steps, return {record['return']:.0f}, "
                 f"{record['speed_m_s']:.2f} m/s, {record['cpu_ms_per_step']:.1f} CPU ms/step")
    rows = summary(records, config.steps)
    for r in rows:
        run_dir.log(kind="summary", **r)
    parameters = ("its physical parameters (body masses, gears, foot friction) identified by Bayesian regression on "
                  "their sensitivities (gpdyn/control/identified_model.py)")
    residual = f"a GP residual per planning step (space: {config.residual.space}, gpdyn/control/hybrid_model.py)"
    learned = {"parameters": parameters, "residual": residual,
               "parameters+residual": f"{parameters} and {residual} on top of them"}[config.model]
    text = (f"# Walker2d, predictive sampling on a learned model after a plant change\n\n"
            f"The learned model is the NOMINAL plant's MuJoCo planning model with {learned}, learned online from the "
            "controller's own transitions. true: the changed plant's own model; frozen: the nominal model (never "
            "updated); online: learned while walking. recovery = (online - frozen) / (true - frozen) of "
            f"the mean returns.\n\n{tables(rows, records, config.steps)}\n\nConfig: {asdict(config)}; cost: {asdict(cost)}.\n")
    (run_dir.path / "report.md").write_text(text)
    print(tables(rows, records, config.steps))
    return run_dir


def combine(paths: list[str | Path]) -> str:
    """One markdown report (:func:`tables`) of the episodes of several finished run folders (e.g. one per plant
    change). ``FOLDER@NAME`` renames that folder's learning controller ("online") to NAME: a variant beside the
    main run's true / frozen / online rows of the same seeds."""
    records, steps = [], set()
    for item in paths:
        path, _, rename = str(item).partition("@")
        run_dir = RunDir(path)
        steps.add(int(run_dir.config()["steps"]))
        for m in run_dir.metrics():
            if m.get("kind") == "episode":
                if rename and m.get("controller") == "online":
                    m = {**m, "controller": rename}
                records.append(m)
    if not records:
        raise InputError(f"no episode records in {', '.join(map(str, paths))}")
    if len(steps) != 1:
        raise InputError(f"the runs have different episode lengths {sorted(steps)}")
    (n,) = steps
    return tables(summary(records, n), records, n)


__all__ = ["CONTROLLERS", "MODELS", "NOMINAL", "Diagnostics", "WalkLearnedConfig", "combine", "episode", "nominal_model", "paired", "split_change",
           "plant", "recovery", "run", "summary", "tables"]
