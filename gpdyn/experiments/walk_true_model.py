"""Walker2d walking by predictive sampling on the true model (``gpdyn control walker --recipe NAME`` of a ``walker-sampling`` recipe).

The check that the planner and its cost can walk before any learned model is involved:
for each seed, one episode of Walker2d-v5 (up to ``steps`` control steps) under
:class:`gpdyn.control.spline_sampling.SamplingController` with the plant's own
``MjModel`` as the planning model and :class:`gpdyn.robots.legged.WalkingCost`. Reported
per seed: steps survived, distance, mean forward speed, Gym return and the planner's CPU
time per control step (``time.process_time``, one thread), in the run folder's
``report.md`` and ``metrics.jsonl``.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpdyn.sim.loop import run_episode
from gpdyn.control.spline_sampling import SamplerConfig, SamplingController
from gpdyn.errors import InputError
from gpdyn.robots.walker import DT, make_env
from gpdyn.robots.legged import WalkingCost, state_rows
from gpdyn.runs import RunDir

log = logging.getLogger(__name__)

REAL_TIME_MS = DT * 1e3  # one control step of Walker2d: 8 ms


def walk(seed: int, steps: int, config: SamplerConfig, cost: WalkingCost, progress: bool = False) -> dict[str, Any]:
    """One episode from ``env.reset(seed=seed)``; its record with distance and speed added."""
    env = make_env()
    controller = SamplingController(cost, DT, config, seed=seed)
    episode = run_episode(env, controller, steps=steps, reset_seed=seed, rows=state_rows, next_rows=("qpos",),
                          tags={"seed": seed}, progress=progress)
    env.close()
    x0, x1 = episode.rows["qpos"][0, 0], episode.rows["next_qpos"][-1, 0]
    length = episode.record["length"]
    fell = bool(episode.rows["terminated"][-1, 0])
    return {**episode.record, "fell": fell, "distance_m": float(x1 - x0), "speed_m_s": float((x1 - x0) / (length * DT))}


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`walk` records, one per seed."""
    lines = ["| seed | steps | fell | distance (m) | speed (m/s) | return | plan CPU ms (mean / p95) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['length']} | {'yes' if r['fell'] else 'no'} | {r['distance_m']:.2f} "
                     f"| {r['speed_m_s']:.2f} | {r['return']:.0f} | {r['plan_cpu_ms_mean']:.2f} / {r['plan_cpu_ms_p95']:.2f} |")
    return "\n".join(lines)


def run(seeds: list[int], steps: int = 1000, config: SamplerConfig | None = None, cost: WalkingCost | None = None,
        out: str | Path | None = None, progress: bool = True) -> RunDir:
    """Every seed's episode into a run folder (``report.md``, one ``metrics.jsonl`` record per seed)."""
    config, cost = config or SamplerConfig(), cost or WalkingCost()
    config.validate()
    if not seeds or steps < 1:
        raise InputError(f"walk_true_model: need at least one seed and steps >= 1, got {seeds}, {steps}")
    run_dir = RunDir.create("walk-true-model", {"seeds": seeds, "steps": steps, "sampler": asdict(config),
                                                "cost": asdict(cost)}, out=out)
    print(f"walk_true_model: run folder {run_dir.path}")  # the run folder and the table: results, on stdout
    rows = []
    for seed in seeds:
        record = walk(seed, steps, config, cost, progress)
        run_dir.log(**record)
        rows.append(record)
        log.info(f"seed {seed}: {record['length']} steps, {record['speed_m_s']:.2f} m/s, "
                 f"{record['plan_cpu_ms_mean']:.2f} CPU ms per plan")
    walked = sum(not r["fell"] and r["length"] == steps for r in rows)
    text = (f"# Walker2d, predictive sampling on the true model\n\n"
            f"{walked} of {len(rows)} seeds walked all {steps} steps. Sampler: {asdict(config)}; cost: {asdict(cost)}. "
            f"Real time is {REAL_TIME_MS:.0f} ms per control step.\n\n{table(rows)}\n")
    (run_dir.path / "report.md").write_text(text)
    print(table(rows))
    return run_dir


__all__ = ["REAL_TIME_MS", "run", "table", "walk"]
