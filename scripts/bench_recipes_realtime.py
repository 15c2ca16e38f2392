"""Every shipped recipe's recommended controller against its control period, in CPU time.

For each recipe in ``gpdyn/recipes/``, one short ``gpdyn control`` run of the controller the recipe
exists to recommend (its online learned model; the true-model planner where it has no learned one),
one seed, one torch thread, in this one process tree one after another, so that the rows compare.
Reads the run's episode records (``cpu_ms_per_step`` and ``cpu_ms_per_step_p95``: planning plus model
update per control step, process CPU time) and prints one markdown table: mean and the worst
episode's 95th percentile, their ratios to the period, the online learner and its updates.

    python scripts/bench_recipes_realtime.py --out /tmp/realtime              # every recipe, ~6 min on 2 cores
    python scripts/bench_recipes_realtime.py --recipes walker-learned-hip --steps 300 --out /tmp/rt
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from gpdyn.recipes import recipe_names

#: recipe -> (command robot, the recommended controller, the option that limits the run to that controller,
#: the option that sets its seed): the online learned model where the recipe has one
RECOMMENDED = {
    "walker-weak-motor": ("walker", "online"),
    "walker-quick-look": ("walker", "online"),
    "walker-reward-mpc": ("walker", "online"),
    "walker-learned-walk": ("walker", "online"),
    "hopper-weak-motor": ("hopper", "online"),
    "kuka-payload": ("kuka", "online"),
    "walker-learned-hip": ("walker", "online"),
    "walker-learned-parameters": ("walker", "online"),
    "walker-true-model-walk": ("walker", "true"),
    "walker-true-model-robust": ("walker", "true"),
}
#: recipes whose command takes --seeds (the predictive-sampling kinds) rather than --seed
SEEDS_OPTION = {"walker-learned-hip", "walker-learned-parameters", "walker-true-model-walk", "walker-true-model-robust"}
#: the true-model recipes run their one planner (their command has no --controllers)
NO_CONTROLLERS_OPTION = {"walker-true-model-walk", "walker-true-model-robust"}
PERIOD_MS = {"walker": 8.0, "hopper": 8.0, "kuka": 10.0}  # frame_skip x the model's time step


def command(recipe: str, steps: int, seed: int, out: Path) -> list[str]:
    robot, controller = RECOMMENDED[recipe]
    cmd = [sys.executable, "-m", "gpdyn", "--threads", "1", "--quiet", "control", robot, "--recipe", recipe,
           "--out", str(out)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    cmd += ["--seeds" if recipe in SEEDS_OPTION else "--seed", str(seed)]
    if recipe not in NO_CONTROLLERS_OPTION:
        cmd += ["--controllers", controller]
    if robot in ("walker", "hopper") and recipe not in SEEDS_OPTION:
        cmd += ["--episodes", "1"]
    return cmd


def episodes(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    return [r for r in rows if r.get("kind") == "episode" and "cpu_ms_per_step" in r]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", default=",".join(RECOMMENDED), help="comma list (default: every shipped recipe)")
    ap.add_argument("--steps", type=int, default=None,
                    help="control steps per episode (default: each recipe's own, 1,000 for the walking recipes)")
    ap.add_argument("--seed", type=int, default=900, help="episode seed (default 900)")
    ap.add_argument("--out", type=Path, required=True, help="folder for the runs and table.md")
    args = ap.parse_args(argv)
    recipes = [r for r in args.recipes.split(",") if r]
    missing = sorted(set(recipe_names()) - set(RECOMMENDED))
    if missing:
        raise SystemExit(f"bench_recipes_realtime: no recommended controller named for recipe(s) {', '.join(missing)}: "
                         "add them to RECOMMENDED")
    unknown = [r for r in recipes if r not in RECOMMENDED]
    if unknown:
        raise SystemExit(f"bench_recipes_realtime: unknown recipe(s) {', '.join(unknown)}; shipped: {', '.join(RECOMMENDED)}")
    length = "each recipe's own episode length" if args.steps is None else f"{args.steps} control steps per episode"
    here = Path(__file__).resolve().parent
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=here).stdout.strip()
    lines = [f"{time.strftime('%Y-%m-%d')}, commit {commit or 'unknown'}, {platform.processor() or platform.machine()}; "
             f"seed {args.seed}, {length}, one episode per condition, one torch thread; CPU ms of planning plus model "
             "update per control step (process time).", "",
             "| recipe | controller | steps run | period [ms] | mean [ms] | p95 [ms] | mean / period | p95 / period | online learner | updates |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for recipe in recipes:
        robot, controller = RECOMMENDED[recipe]
        run = args.out / recipe
        if run.exists():
            raise SystemExit(f"bench_recipes_realtime: {run} exists; give a new --out")
        done = subprocess.run(command(recipe, args.steps, args.seed, run), capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"bench_recipes_realtime: {recipe} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        # the true-model recipes' records name no controller: they run only the one
        eps = [e for e in episodes(run) if e.get("controller", controller) == controller]
        if not eps:
            raise SystemExit(f"bench_recipes_realtime: {run / 'metrics.jsonl'} has no episode of controller {controller}")
        steps = sum(e["length"] for e in eps)  # over every episode the run made (an episode that fell ends early)
        mean = sum(e["cpu_ms_per_step"] * e["length"] for e in eps) / steps
        p95 = max(e["cpu_ms_per_step_p95"] for e in eps)
        period = PERIOD_MS[robot]
        learner = eps[-1].get("online_learner") or "-"
        updates = eps[-1].get("gp_updates")
        lines.append(f"| `{recipe}` | {controller} | {steps} | {period:g} | {mean:.2f} | {p95:.2f} | {mean / period:.2f} | "
                     f"{p95 / period:.2f} | {learner} | {'-' if updates is None else updates} |")
        print(lines[-1], flush=True)
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
