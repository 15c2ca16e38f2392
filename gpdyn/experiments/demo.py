"""`gpdyn demo`: every stage of the pipeline on a small default, in one run folder.

Stages, in data-flow order (docs/architecture.md "Data flow"):

1. collect Walker2d episodes with the shipped TRPO policy (``walker.zarr``);
2. collect a small simulated KUKA inverse-dynamics stream (``kuka.zarr``);
3. build the regression problems ``walker-1``, ``walker-2`` and ``kuka`` from them;
4. replay: SVDGP, ORTHNAT, SVI and WISKI side by side on walker-1 (SVDGP Table 2 layout,
   small models), with its report in ``replay-walker-1/``;
5. control: the ``kuka-payload`` recipe (:mod:`gpdyn.recipes`), computed-torque tracking of
   the iiwa with PD alone, the true model, the frozen learned model and the online one, a
   3 kg payload added half-way (``control/``); it prints and logs each controller's tracking
   error before and after the payload, and whether the online model adapted: it is the
   reported control setting that shows adaptation reliably in well under a minute.

Each stage logs one record to ``metrics.jsonl`` and says what it did (the ``logging``
module: stderr under the ``gpdyn`` command); the tables, report paths and run folder are
printed to stdout.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpdyn.runs import RunDir

log = logging.getLogger(__name__)

# Small defaults: the whole demo takes a few minutes on 2 cores.
DEMO = {
    "walker_episodes": 4,
    "walker_envs": 2,
    "kuka_offline": 1000,
    "kuka_online": 4000,
    "replay_learners": ["svdgp", "orthnat", "svi", "wiski"],
    "replay_iterations": 60,
    "replay_batch": 128,
    "replay_n_delta": 32,
    "replay_preset": "small",  # every learner's small sizes (its presets table)
    "control_recipe": "kuka-payload",
}


def _stage(run: RunDir, name: str, fn, *args: Any) -> Any:
    log.info(f"== {name}")
    t0 = time.perf_counter()
    result = fn(*args)
    seconds = time.perf_counter() - t0
    run.log(stage=name, seconds=seconds, **(result if isinstance(result, dict) else {}))
    log.info(f"   ({seconds:.1f} s)")
    return result


def _collect_walker(run: RunDir, seed: int) -> dict[str, Any]:
    from gpdyn.sim.legged import collect_legged
    from gpdyn.robots.walker import WALKER

    info = collect_legged(WALKER, 
        run.path / "walker.zarr", DEMO["walker_episodes"], envs=DEMO["walker_envs"], seed=seed, progress=True
    )
    log.info(f"   {info['episodes']} episodes, {info['rows']} steps -> {info['store']}")
    return {k: info[k] for k in ("episodes", "rows", "steps_per_second")}


def _collect_kuka(run: RunDir, seed: int) -> dict[str, Any]:
    from gpdyn.sim.arm import collect_arm

    store = collect_arm(run.path / "kuka.zarr", offline=DEMO["kuka_offline"], online=DEMO["kuka_online"], seed=seed)
    log.info(f"   {store.n_episodes} episodes, {store.n_rows} samples -> {store.path}")
    return {"episodes": store.n_episodes, "rows": store.n_rows}


def _problems(run: RunDir, seed: int) -> dict[str, Any]:
    from gpdyn.data.problems import load_problem

    sizes = {}
    # the problems table, the replay table and the paths are results: stdout, not the log
    print(f"   {'problem':<10} {'protocol':<8} {'x':>3} {'y':>3} {'train':>7} {'test':>6} {'init':>6}")
    for name, store, protocol in (
        ("walker-1", "walker.zarr", "iid"),
        ("walker-2", "walker.zarr", "iid"),
        ("kuka", "kuka.zarr", "ordered"),
    ):
        p = load_problem(run.path / store, name, protocol=protocol, seed=seed)
        d = p.describe()
        print(f"   {name:<10} {protocol:<8} {d['input_dim']:>3} {d['output_dim']:>3} {d['train']:>7} {d['test']:>6} {d['init']:>6}")
        sizes[name] = {k: d[k] for k in ("train", "test", "init")}
    return {"problems": sizes}


def _replay(run: RunDir, seed: int) -> dict[str, Any]:
    from gpdyn.experiments.replay import ReplayConfig, open_run, print_table, replay
    from gpdyn.experiments.report import write_report

    cfg = ReplayConfig(
        store=str(run.path / "walker.zarr"),
        problem="walker-1",
        learners=list(DEMO["replay_learners"]),
        iterations=DEMO["replay_iterations"],
        batch_size=DEMO["replay_batch"],
        n_delta=DEMO["replay_n_delta"],
        eval_every=DEMO["replay_iterations"] // 3,
        seed=seed,
        preset=DEMO["replay_preset"],
    )
    replay_run = open_run(cfg, run.path / "replay-walker-1")
    finals = replay(cfg, replay_run)
    report = write_report(replay_run.path)
    print_table(finals)
    print(f"   report: {report}")
    return {"replay": {name: {"nmse_mean": r["nmse_mean"], "vlb_mean": r["vlb_mean"]} for name, r in finals.items()}}


def control_stage(out: str | Path, seed: int = 0, recipe: str = DEMO["control_recipe"], store: str | Path | None = None,
                  **options: Any) -> dict[str, Any]:
    """The demo's control stage: the ``kuka`` recipe ``recipe`` (``options`` override its values)
    into the run folder ``out``, pretrained on ``store`` (None: a collection of its own); returns
    each controller's mean tracking RMSE over the joints before and after the payload, and
    whether the online model adapted (after the payload it tracks better than the frozen model
    by at least a factor 2)."""
    from dataclasses import asdict

    from gpdyn.config import leaves, put
    from gpdyn.experiments.arm_config import ArmRunConfig
    from gpdyn.experiments.control_arm import run_arm
    from gpdyn.recipes import load_recipe

    chosen = load_recipe(recipe, "kuka")
    known = leaves(ArmRunConfig)
    cfg = chosen.build(robot="kuka", progress=False)
    for name, value in {"seed": seed, **options}.items():  # over the recipe's values
        if name not in known:
            raise TypeError(f"control_stage: ArmRunConfig has no option '{name}'")
        put(cfg, known[name], value)
    cfg.validate()
    run = RunDir.create("control-kuka", {**asdict(cfg), **chosen.record(options)}, out=out)
    log.info(f"   recipe {chosen.name}: {chosen.title}")
    result = run_arm(run, cfg, store)
    rmse = {c: {phase: float(np.mean(v)) for phase, v in phases.items()} for c, phases in result["rmse"].items()}
    summary: dict[str, Any] = {"recipe": chosen.name, "rmse_before": {c: p.get("before") for c, p in rmse.items()},
                               "rmse_after": {c: p.get("after") for c, p in rmse.items()}, "report": result["report"]}
    if {"online", "frozen"} <= rmse.keys() and "after" in rmse["online"]:
        online, frozen = rmse["online"]["after"], rmse["frozen"]["after"]
        ratio = frozen / online if online > 0 else float("inf")
        summary.update(online_gain_after=ratio, adapted=bool(ratio >= 2.0))
        others = "".join(f", {label} {rmse[c]['after']:.4f}" for c, label in (("pd", "PD alone"), ("true", "true model"))
                         if "after" in rmse.get(c, {}))
        verdict = "the online model adapted" if summary["adapted"] else "the online model did NOT adapt"
        log.info(f"   after the +{cfg.plant.payload:g} kg payload (step {cfg.plant.change_at}), tracking RMSE: online {online:.4f} "
                 f"rad, frozen {frozen:.4f}{others}: {verdict} ({ratio:.1f}x better than frozen)")
    print(f"   report: {result['report']}")
    return summary


def _control(run: RunDir, seed: int) -> dict[str, Any]:
    return control_stage(run.path / "control", seed=seed, store=run.path / "kuka.zarr")  # stage 2's stream


def demo(out: str | Path | None = None, seed: int = 0) -> RunDir:
    """Run every stage into one run folder (``out``, default ``logs/demo-<time>``) and return it."""
    run = RunDir.create("demo", {"seed": seed, **DEMO}, out=out)
    print(f"gpdyn demo: run folder {run.path}")
    _stage(run, "collect walker", _collect_walker, run, seed)
    _stage(run, "collect kuka", _collect_kuka, run, seed)
    _stage(run, "problems", _problems, run, seed)
    _stage(run, "replay walker-1", _replay, run, seed)
    _stage(run, "control kuka", _control, run, seed)
    print(f"gpdyn demo: done; everything is in {run.path}")
    return run

