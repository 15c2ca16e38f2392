"""`gpdyn demo`: every stage of the pipeline on a small default, in one run folder.

Stages, in data-flow order (docs/architecture.md "Data flow"):

1. collect Walker2d episodes with the shipped TRPO policy (``walker.zarr``);
2. collect a small simulated KUKA inverse-dynamics stream (``kuka.zarr``);
3. build the regression problems ``walker-1``, ``walker-2`` and ``kuka`` from them;
4. replay: SVDGP, ORTHNAT, SVI and WISKI side by side on walker-1 (SVDGP Table 2 layout,
   small models), with its report in ``replay-walker-1/``;
5. control: a short Walker2d run of online-updated MPC beside the TRPO policy, with the
   torso mass raised mid-episode (``control/``).

Each stage logs one record to ``metrics.jsonl`` and prints what it did.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpdyn.runs import RunDir

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
}


def _stage(run: RunDir, name: str, fn, *args: Any) -> Any:
    print(f"\n== {name}")
    t0 = time.perf_counter()
    result = fn(*args)
    seconds = time.perf_counter() - t0
    run.log(stage=name, seconds=seconds, **(result if isinstance(result, dict) else {}))
    print(f"   ({seconds:.1f} s)")
    return result


def _collect_walker(run: RunDir, seed: int) -> dict[str, Any]:
    from gpdyn.sim.walker import collect_walker

    info = collect_walker(
        run.path / "walker.zarr", DEMO["walker_episodes"], envs=DEMO["walker_envs"], seed=seed, progress=True
    )
    print(f"   {info['episodes']} episodes, {info['rows']} steps -> {info['store']}")
    return {k: info[k] for k in ("episodes", "rows", "steps_per_second")}


def _collect_kuka(run: RunDir, seed: int) -> dict[str, Any]:
    from gpdyn.sim.arm import collect_arm

    store = collect_arm(run.path / "kuka.zarr", offline=DEMO["kuka_offline"], online=DEMO["kuka_online"], seed=seed)
    print(f"   {store.n_episodes} episodes, {store.n_rows} samples -> {store.path}")
    return {"episodes": store.n_episodes, "rows": store.n_rows}


def _problems(run: RunDir, seed: int) -> dict[str, Any]:
    from gpdyn.data.problems import load_problem

    sizes = {}
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


def _control(run: RunDir, seed: int) -> dict[str, Any]:
    from gpdyn.experiments.control_walker import control_demo

    result = control_demo(run.path / "control", seed=seed, store=run.path / "walker.zarr")
    print(f"   report: {result['report']}")
    return {"returns": {f"{e['controller']}/{e['condition']}": e["return"] for e in result["episodes"]}}


def demo(out: str | Path | None = None, seed: int = 0) -> RunDir:
    """Run every stage into one run folder (``out``, default ``logs/demo-<time>``) and return it."""
    run = RunDir.create("demo", {"seed": seed, **DEMO}, out=out)
    print(f"gpdyn demo: run folder {run.path}")
    _stage(run, "collect walker", _collect_walker, run, seed)
    _stage(run, "collect kuka", _collect_kuka, run, seed)
    _stage(run, "problems", _problems, run, seed)
    _stage(run, "replay walker-1", _replay, run, seed)
    _stage(run, "control walker", _control, run, seed)
    print(f"\ngpdyn demo: done; everything is in {run.path}")
    return run

