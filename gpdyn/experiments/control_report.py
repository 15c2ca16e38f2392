"""Reports of control runs: ``report.md`` with the tables and SVG plots with the plant change marked.

Everything is read back from the run folder: the settings from ``config.json`` (the run's
config object while it runs: both give the same report), the rest from ``metrics.jsonl``.
So ``gpdyn report RUN`` (:func:`write_control_report`) rewrites the report of a finished
run, or of a stopped one from the episodes it recorded, without torch or MuJoCo; a plot newer
than the run's records is kept (:func:`gpdyn.experiments.report_tools.draw_plot`). Plots per controller over the control
steps: a legged robot's return, torso x position (falls marked), one-step model error and
CPU time per step against the control period; an arm's tracking error, feed-forward error
against the plant's inverse dynamics and CPU time per step against ``1 / rate_hz``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpdyn.config import flatten_dict, settings_table
from gpdyn.errors import InputError
from gpdyn.experiments.report_tools import draw_plot
from gpdyn.experiments.svg_plot import COLORS, Figure, Panel
from gpdyn.runs import METRICS_FILE, RunDir

#: the control period of a legged run folder written before its runs logged theirs, s: Walker2d-v5's timestep
#: 0.002 x frame skip 4 (a report imports neither MuJoCo nor torch, so it does not ask the task)
LEGGED_PERIOD_S = 0.008
#: the file of the shipped iiwa, the arm of a run that names no model (gpdyn.robots.kuka.model_path, which imports
#: MuJoCo)
KUKA_FILE = "kuka_iiwa.xml"


def _series(records: list[dict[str, Any]], kind: str, robot: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("kind") == kind and r.get("robot") == robot:
            out[(r["condition"], r["controller"])].append(r)
    return out


def _mark_change(ax: Panel, change_at: int, label: str) -> None:
    if change_at > 0:
        ax.vline(change_at)
        ax.note(change_at, label)


def planner_text(config: dict[str, Any]) -> str:
    """How a legged run planned, from its config (a dict; older run folders lack the newer keys)."""
    parts = [f"planner `{config.get('planner', 'mppi')}`, K = {config['samples']} (true model: K = {config['sim_samples']}), "
             f"H = {config['horizon']}, noise {config.get('noise_std', 0.2):g}, "
             f"temperature {config['temperature']:g}, uncertainty `{config['uncertainty']}`"
             + (f" (weight {config['var_weight']:g})" if config["uncertainty"] == "penalty" else "")]
    if config.get("cost", "reward") == "track":
        parts.append("cost: distance to the nominal plant's next velocities under the TRPO policy (`--cost track`), "
                     f"action offsets priced x{config.get('track_offset_weight', 0):g}")
    if config.get("control_cost"):
        parts.append(f"MPPI control cost x{config['control_cost']:g}")
    if config.get("relative_to_proposal"):
        parts.append("offsets to the TRPO policy's actions")
    if not config.get("warm_start", True):
        parts.append("no warm start (every plan starts from the policy)")
    if config.get("proposal_tail"):
        parts.append(f"then {config['proposal_tail']} steps of the TRPO policy through the model")
    if config.get("terminal_value"):
        parts.append("TRPO critic as terminal value")
    return ", ".join(parts)


def write_legged_report(run: RunDir, cfg: Any, redraw: bool = False) -> Path:
    """Return table (controller x condition), distance and falls, CPU time per step, and the plots over time:
    return, distance, one-step model error, CPU ms per step against the control period.

    ``cfg``: the run's :class:`~gpdyn.experiments.control_legged.LeggedRunConfig`, or its
    ``config.json`` as a dict (:func:`write_control_report`): both give the same report. A plot newer than the
    run's records is kept unless ``redraw`` (:func:`gpdyn.experiments.report_tools.draw_plot`).
    """
    c = _settings(cfg, LEGGED_SETTINGS, run.path / "config.json")
    robot = c["task"]
    numbered = run.numbered_metrics()
    _check_records(numbered, robot, LEGGED_REQUIRED, run.path / METRICS_FILE)
    records = [r for _, r in numbered]
    episodes = _series(records, "episode", robot)
    steps = _series(records, "step", robot)
    period = next((r["control_period_s"] for r in records if r.get("kind") == "task" and r.get("robot") == robot
                   and _is_number(r.get("control_period_s"))), LEGGED_PERIOD_S)
    conditions, controllers = list(c["conditions"]), list(c["controllers"])
    change_label = next((e[0]["change"] for e in episodes.values() if e and e[0].get("change")), c["change"])
    lines = [
        f"# {robot} online control",
        "",
        f"Learner `{c['learner']}` ({c['scale']} sizes, target `{c['target']}`), {planner_text(c)}; "
        f"{c['steps']} control steps per episode, device `{c['device']}`; online model `{c['adapt']}`"
        + (f" ({c['residual_kernel']} kernel"
           + (f", gated, z = {c['residual_gate_z']:g}" if c["residual_gate"] else "") + ")."
           if c["adapt"] == "residual" else "."),
        f"Plant change in the `changed` condition: {change_label}, "
        + ("from the start." if c["change_at"] == 0 else f"at step {c['change_at']}"
           + (", counted over the consecutive episodes; it stays changed after." if c["episodes"] > 1 else ".")),
        *_unfinished(sum(len(v) for v in episodes.values()), len(conditions) * len(controllers) * c["episodes"],
                     "controller, condition and episode"),
        "",
        "## Returns",
        "",
        "| controller | " + " | ".join(conditions)
        + " | mean plan time [ms] | effective samples | log-weight spread: costs / control term | fallbacks |",
        "|---|" + "---|" * len(conditions) + "---|---|---|---|",
    ]
    returns: dict[tuple[str, str], list[float]] = {}
    for ctrl in controllers:
        row, times, effective, spreads, fallbacks = [], [], [], [], 0
        for cond in conditions:
            eps = sorted(episodes.get((cond, ctrl), []), key=lambda e: e.get("episode", 0))
            if eps:
                returns[(cond, ctrl)] = [e["return"] for e in eps]
                row.append(_returns_cell(eps, c["steps"]))
                times += [e["plan_seconds_mean"] for e in eps if e.get("plan_seconds_mean")]
                effective += [e["effective_samples_mean"] for e in eps if e.get("effective_samples_mean")]
                spreads += [(e["cost_spread_mean"], e["control_spread_mean"]) for e in eps if "cost_spread_mean" in e]
                fallbacks += sum(int(e.get("fallbacks", 0)) for e in eps)
            else:
                row.append("-")
        t = f"{1e3 * np.mean(times):.1f}" if times else "-"
        ess = f"{np.mean(effective):.1f}" if effective else "-"
        spread = " / ".join(f"{np.mean(s):.2f}" for s in zip(*spreads)) if spreads else "-"
        lines.append(f"| {ctrl} | " + " | ".join(row) + f" | {t} | {ess} | {spread} | {fallbacks if times else '-'} |")
    if c["episodes"] > 1:
        lines += ["", f"Cells: mean over {c['episodes']} consecutive episodes, then each episode's return, with its "
                      "length where the robot fell. The online model is kept from one episode to the next."]
    lines += _online_verdict(returns)
    lines += _distance_section(episodes, steps, conditions, controllers, c["steps"])
    lines += compute_section([e for eps in episodes.values() for e in eps], period)
    errs = {k: v for k, v in steps.items() if any("model_rmse" in r for r in v)}
    if errs:
        lines += ["", "## Model one-step error (velocity RMSE, mean over the steps of all episodes)", "",
                  "| condition | controller | velocity RMSE | mean predictive variance (sum over the velocities) |", "|---|---|---|---|"]
        for (cond, ctrl), rs in sorted(errs.items()):
            e = [r["model_rmse"] for r in rs if "model_rmse" in r]
            v = [r["pred_variance"] for r in rs if "pred_variance" in r]
            lines.append(f"| {cond} | {ctrl} | {np.mean(e):.3f} | {np.mean(v) if v else float('nan'):.4f} |")
    falls = _falls(episodes, c["steps"])
    change_at = c["change_at"]
    quantities = ["return"] + (["distance"] if any("x_position" in r for rs in steps.values() for r in rs) else [])
    plots = [draw_plot(run.path / f"{robot}_{LEGGED_QUANTITIES[quantity][1]}",
                       lambda out, quantity=quantity: _plot_legged(out, steps, conditions, controllers, change_at,
                                                                   change_label, falls, quantity), redraw)
             for quantity in quantities]
    if c["episodes"] > 1:
        plots.append(draw_plot(run.path / f"{robot}_episode_returns.svg",
                               lambda out: _plot_legged_episodes(out, returns, conditions, controllers), redraw))
    if errs:
        plots.append(draw_plot(run.path / f"{robot}_model_error.svg",
                               lambda out: _plot_legged_error(out, errs, c["steps"], change_at, change_label), redraw))
    styles = dict(zip(conditions, ("-", "--")))
    timed = [(f"{cond}/{ctrl}", ctrl, styles.get(cond, ":"), steps[(cond, ctrl)]) for cond in conditions
             for ctrl in controllers if any("cpu_ms" in r for r in steps.get((cond, ctrl), []))]
    if timed:
        def draw_cpu(out: Path) -> Path:
            colors = _colors(controllers)  # a colour per controller, as in the plots above
            return _plot_cpu(out, [(name, colors[ctrl], style, rs) for name, ctrl, style, rs in timed],
                             period, c["steps"], change_at, change_label)

        plots.append(draw_plot(run.path / f"{robot}_cpu.svg", draw_cpu, redraw))
    from gpdyn.experiments.legged_config import LeggedRunConfig

    lines += _settings_section(run, cfg, LeggedRunConfig)
    lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    path = run.path / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _settings_section(run: RunDir, cfg: Any, tree: type) -> list[str]:
    """Every setting of the run, by section of its config ``tree``, with what it does (from the tree's declarations),
    the options given over the recipe marked."""
    values = flatten_dict(dict(asdict(cfg) if is_dataclass(cfg) else cfg))
    recorded = run.config() if (run.path / "config.json").is_file() else {}
    given = recorded.get("options_given") if isinstance(recorded.get("options_given"), dict) else {}
    recipe = recorded.get("recipe")
    note = (f"Recipe `{recipe}`; * marks the options given over it." if recipe
            else "The settings as run (no recipe recorded).")
    return ["", "## Settings", "", note, "", *settings_table(values, tree, tuple(given))]


def mean_se(values: list[float], digits: int = 1) -> str:
    """``"mean ± standard error"`` of ``values`` (the error nan for one value), to ``digits`` decimals."""
    a = np.asarray(values, dtype=float)
    se = a.std(ddof=1) / np.sqrt(len(a)) if len(a) > 1 else float("nan")
    return f"{a.mean():.{digits}f} ± {se:.{digits}f}"


def _returns_cell(eps: list[dict[str, Any]], steps: int) -> str:
    """One controller's returns on one plant: the return, or the mean then each episode's; lengths where it fell."""
    each = [f"{e['return']:.1f}" + (f" ({e['length']} steps)" if e["length"] < steps else "") for e in eps]
    return each[0] if len(eps) == 1 else f"{np.mean([e['return'] for e in eps]):.1f}: " + ", ".join(each)


def _online_verdict(returns: dict[tuple[str, str], list[float]]) -> list[str]:
    """Whether the online model recovers return on the changed plant, against the frozen one, episode by episode."""
    frozen, online = returns.get(("changed", "frozen")), returns.get(("changed", "online"))
    if not frozen or not online:
        return []
    lines = []
    spans = [("over all episodes", slice(None))]
    if len(frozen) > 1:
        spans.append(("after the first episode (the online model has learned from at least one)", slice(1, None)))
    for label, span in spans:
        f, o = float(np.mean(frozen[span])), float(np.mean(online[span]))
        diff = o - f
        # under 1 % of the frozen return is within the run-to-run spread of a single episode
        verdict = ("recovers" if diff > 0 else "loses") if abs(diff) > 0.01 * abs(f) else "makes no measurable difference to"
        lines += ["", f"On the changed plant, {label}, the online-updated model {verdict} return against the frozen "
                     f"one: {o:.2f} vs {f:.2f} ({diff:+.2f})."]
    return lines


#: what a legged run's step plots show: the y label and the file (after the robot's name)
LEGGED_QUANTITIES = {"return": ("return so far", "return.svg"), "distance": ("torso x position [m]", "distance.svg")}


def _plot_legged(out: Path, steps, conditions, controllers, change_at: int, label: str,
                 falls: set[tuple[str, str, int]], quantity: str = "return") -> Path:
    """Return so far (or the torso's x position, ``quantity="distance"``) against the control step: a panel per
    condition, a colour per controller, later episodes drawn darker, an x where an episode ended in a fall."""
    ylabel = LEGGED_QUANTITIES[quantity][0]
    fig = Figure(len(conditions))
    colors = _colors(controllers)
    for ax, cond in zip(fig.panels, conditions):
        for ctrl in controllers:
            by_episode = _by_episode(steps.get((cond, ctrl), []))
            for k, (episode, rs) in enumerate(by_episode.items()):
                if quantity == "return":
                    t, y = [r["t"] for r in rs], list(np.cumsum([r["reward"] for r in rs]))
                else:
                    kept = [r for r in rs if "x_position" in r]
                    t, y = [r["t"] for r in kept], [r["x_position"] for r in kept]
                if not t:
                    continue
                color = colors[ctrl]
                ax.plot(t, y, color=color, alpha=(k + 1) / len(by_episode), label=ctrl if k == len(by_episode) - 1 else None)
                if (cond, ctrl, episode) in falls:
                    ax.plot([t[-1]], [y[-1]], marker="x", color=color, dash=None)
        if any(f[0] == cond for f in falls):
            ax.plot([], [], marker="x", color="black", dash=None, label="fell")
        ax.title, ax.xlabel, ax.ylabel = f"{cond} plant", "control step", ylabel
        if cond == "changed":
            _mark_change(ax, change_at, label)
    return fig.save(out)


def _falls(episodes: dict[tuple[str, str], list[dict[str, Any]]], steps: int) -> set[tuple[str, str, int]]:
    """(condition, controller, episode) of the episodes that ended before ``steps``: the robot fell (a legged task ends
    an episode early only when the torso leaves its healthy height or angle)."""
    return {(cond, ctrl, e.get("episode", 0)) for (cond, ctrl), eps in episodes.items() for e in eps
            if e["length"] < steps}


def _distance_section(episodes, steps, conditions, controllers, n_steps: int) -> list[str]:
    """Per controller and condition: the episodes, the falls and the torso's x position at each episode's end."""
    lines = ["", "## Distance and falls", "",
             "| controller | condition | episodes | falls | x at the end [m] |", "|---|---|---|---|---|"]
    for ctrl in controllers:
        for cond in conditions:
            eps = episodes.get((cond, ctrl))
            if not eps:
                continue
            ends = [xs[-1] for rs in _by_episode(steps.get((cond, ctrl), [])).values()
                    if (xs := [r["x_position"] for r in rs if "x_position" in r])]
            cell = "-" if not ends else f"{ends[0]:.2f}" if len(ends) == 1 else (
                f"{np.mean(ends):.2f}: " + ", ".join(f"{x:.2f}" for x in ends))
            fell = sum(e["length"] < n_steps for e in eps)
            lines.append(f"| {ctrl} | {cond} | {len(eps)} | {fell} | {cell} |")
    lines += ["", f"A fall: the episode ended before its {n_steps} steps (the torso left the healthy height or angle). "
                  "x: the torso's position along the track after the last step (an episode starts at x = 0); the "
                  "mean over episodes, then each episode's."]
    return lines


def _unfinished(recorded: int, planned: int, unit: str) -> list[str]:
    """A notice under the title of a run that stopped (or is still running) before all its episodes."""
    if recorded >= planned:
        return []
    return ["", f"**Unfinished run: {recorded} of {planned} episodes recorded (one per {unit}); the run stopped, or "
                "is still running, before the others.** The tables and plots show the episodes recorded."]


def _colors(names: list[str]) -> dict[str, str]:
    """A colour per name (controller), the same in every plot of a report: matplotlib's colour cycle."""
    return {name: COLORS[i % len(COLORS)] for i, name in enumerate(names)}


def _by_episode(rows: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[r.get("episode", 0)].append(r)
    return dict(sorted(out.items()))


def _plot_legged_episodes(out: Path, returns: dict[tuple[str, str], list[float]], conditions, controllers) -> Path:
    """Return per consecutive episode: does the online model's return climb while the frozen one's stays?"""
    fig = Figure(len(conditions))
    colors = _colors(controllers)  # the same colour in every panel, as in the other plots
    for ax, cond in zip(fig.panels, conditions):
        for ctrl in controllers:
            r = returns.get((cond, ctrl))
            if r:
                ax.plot(range(1, len(r) + 1), r, color=colors[ctrl], marker="o", label=ctrl)
        ax.title, ax.xlabel, ax.ylabel, ax.integer_x = f"{cond} plant", "episode", "return", True
    return fig.save(out)


def _plot_legged_error(out: Path, errs, steps: int, change_at: int, label: str) -> Path:
    """One-step model error over the control steps of all consecutive episodes (episode k from k x steps)."""
    fig = Figure(1)
    ax, colors = fig.panels[0], COLORS
    for i, ((cond, ctrl), rs) in enumerate(sorted(errs.items())):
        # one line per episode, so that a fall leaves a gap instead of a line to the next episode
        for k, (episode, ers) in enumerate(_by_episode([r for r in rs if "model_rmse" in r]).items()):
            ax.plot([episode * steps + r["t"] for r in ers], [r["model_rmse"] for r in ers], color=colors[i % len(colors)],
                    label=f"{cond}/{ctrl}" if k == 0 else None, width=1)
    ax.xlabel, ax.ylabel, ax.yscale = "control step (episodes laid end to end)", "one-step velocity RMSE", "log"
    n_episodes = 1 + max((r.get("episode", 0) for rs in errs.values() for r in rs), default=0)
    for k in range(1, n_episodes):
        ax.vline(k * steps, color="#999999", dash=":")
    _mark_change(ax, change_at, label)  # once: the plant stays changed in the episodes after
    return fig.save(out)


def _plot_cpu(out: Path, series: list[tuple[str, str, str, list[dict[str, Any]]]], period_s: float, steps: int,
              change_at: int, label: str) -> Path:
    """The controller's CPU time of every control step (``cpu_ms``) against the control period, a line per series
    ``(label, colour, line style, step records)`` (consecutive episodes laid end to end, episode k from k x
    ``steps``)."""
    fig = Figure(1)
    ax, several = fig.panels[0], False
    for name, color, style, rs in series:
        by_episode = _by_episode([r for r in rs if "cpu_ms" in r])
        several = several or len(by_episode) > 1
        for k, (episode, ers) in enumerate(by_episode.items()):
            ax.plot([episode * steps + r["t"] for r in ers], [r["cpu_ms"] for r in ers], color=color, dash=style,
                    label=name if k == 0 else None, width=0.8)
    ax.hline(1e3 * period_s, width=1, label=f"control period {1e3 * period_s:g} ms")
    ax.yscale = "log"
    ax.xlabel = "control step" + (" (episodes laid end to end)" if several else "")
    ax.ylabel = "controller CPU time per step [ms]"
    _mark_change(ax, change_at, label)
    return fig.save(out)


def compute_section(episodes: list[dict[str, Any]], period_s: float) -> list[str]:
    """Per controller: its CPU time per control step (act plus observe: planning or feed-forward and the model
    update), mean and 95th percentile over its episodes' steps, against the control period; and for an online
    controller the learner it updates and the updates applied to it."""
    by_ctrl: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in episodes:
        if "cpu_ms_per_step" in e:
            by_ctrl[e["controller"]].append(e)
    if not by_ctrl:
        return []
    lines = ["", f"## CPU time per control step (the period is {1e3 * period_s:g} ms)", "",
             "| controller | mean [ms] | 95th percentile [ms] | within the period | online learner | updates |",
             "|---|---|---|---|---|---|"]
    for ctrl, eps in by_ctrl.items():
        mean = float(np.mean([e["cpu_ms_per_step"] for e in eps]))
        p95 = float(np.max([e["cpu_ms_per_step_p95"] for e in eps]))  # the worst episode's
        learner = eps[-1].get("online_learner", "-")
        updates = eps[-1].get("gp_updates", "-")
        lines.append(f"| {ctrl} | {mean:.2f} | {p95:.2f} | {'yes' if p95 <= 1e3 * period_s else 'no'} | {learner} | {updates} |")
    lines.append("")
    lines.append("CPU time of the process (one thread); the 95th percentile is the worst episode's. Updates: "
                 "observes plus optimiser steps applied to the online learner over the run's episodes so far.")
    return lines


def _feedback_text(c: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """The arm report's words on the feedback law (``feedback``) and the gain schedule (``payload_gains``): how often
    the online controller rebuilt its feedback on the load its filter identified (nothing where the run has no
    schedule, or predates it)."""
    if c["feedback"] == "inertia":
        text = (f"Feedback: M(q) ({c['omega']:g}^2 e + 2 {c['omega']:g} e') through each controller's inertia model "
                "(`true`: the plant's; the others: the nominal arm's")
        built = "; the online controller's is rebuilt with the load its filter identifies after a detected change"
    else:
        text = f"Feedback: PD gains critically damped at {c['omega']:g} rad/s on the effective joint inertia (of the unloaded arm"
        built = "; the online controller rebuilds them on the load its filter identifies after a detected change"
    if c["adapt"] != "rigid-body" or not c["payload_gains"]:
        return text + ")."
    rebuilt = [r["gains_rebuilt"] for r in records if r.get("kind") == "episode" and "gains_rebuilt" in r]
    times = f": {int(sum(rebuilt))} time(s) in this run" if rebuilt else ""
    return f"{text}{built} (--payload-gains{times}))."


def write_arm_report(run: RunDir, cfg: Any, arm: Any = None, joint_rmse: dict[str, dict[str, list[float]]] | None = None,
                     redraw: bool = False) -> Path:
    """Tracking RMSE per joint before/after the plant change, the feed-forward error, CPU time per step, and the
    plots over time: tracking error, feed-forward error, CPU ms per step against the control period (any arm).

    ``cfg``: the run's :class:`~gpdyn.experiments.control_arm.ArmRunConfig`, or its ``config.json`` as a dict
    (:func:`write_control_report`); ``arm`` and ``joint_rmse`` (the ``tracking`` records) are read from the run
    folder when not given: both give the same report. A plot newer than the run's records is kept unless
    ``redraw`` (:func:`gpdyn.experiments.report_tools.draw_plot`).
    """
    c = _settings(cfg, ARM_SETTINGS, run.path / "config.json")
    robot = c["robot"]
    numbered = run.numbered_metrics()
    _check_records(numbered, robot, ARM_REQUIRED, run.path / METRICS_FILE)
    records = [r for _, r in numbered]
    steps = [r for r in records if r.get("kind") == "step" and r.get("robot") == robot]
    if joint_rmse is None:
        joint_rmse = {r["controller"]: r["rmse"] for r in records if r.get("kind") == "tracking" and r.get("robot") == robot}
    n = arm.n if arm is not None else _joint_count(joint_rmse, steps, run.path / METRICS_FILE)
    change_at, period = c["change_at"], 1.0 / c["rate_hz"]
    source = f"from {c['from_run']}" if c["from_run"] else f"{c['scale']} sizes"
    lines = [
        f"# {arm.path.name if arm is not None else _arm_file_name(c)} computed-torque tracking ({n} joints)",
        "",
        f"Learner `{c['learner']}` ({source}), "
        f"{c['steps']} control steps at {c['rate_hz']:.0f} Hz, "
        f"trajectory family `{c['family']}` at speed {c['speed']}; {arm_change_text(c)}.",
        "Control law: tau = f(q_ref, qd_ref, qdd_ref) + feedback(q_ref - q, qd_ref - qd); "
        "`pd` has no feed-forward, `true` uses MuJoCo's inverse dynamics of the actual plant (over the actuators' gear, which a motor-gain change scales); f is evaluated "
        f"at the reference of the middle of the step. {_feedback_text(c, records)}",
        f"Online model: `{c['adapt']}` " + {
            "rigid-body": "(RigidBodyGP: the arm's rigid-body regressor and the frozen model as features, one Kalman "
                          "update per control step, covariance reset on a detected change: one sample's innovation "
                          "out of its distribution" + (f", or the summed innovations of the last {c['change_window']}"
                                                        if c["change_window"] else "")
                          + (f"; a reset also re-opens the dry friction of each joint whose torque rose along its "
                             f"motion (std {c['change_friction_std']:g} N m)"
                             if c["change_friction_std"] else "")
                          + (f"; a GP of the joint angles in the filter's state ({c['angle_gp_points']} grid points per "
                             f"angle, prior std {c['angle_gp_std']:g} N m per joint, re-opened at {c['angle_gp_reset_std']:g})"
                             if c["angle_gp_points"] else "")
                          + ").",
            "residual": f"(ResidualGP: exact GP on the frozen model's residuals, window {c['window']}).",
        }.get(c["adapt"], f"({c['updates']} learner step(s) per control step on the latest {c['online_batch']} samples)."),
        *_unfinished(len(joint_rmse), len(c["controllers"]), "controller"),
        "",
        "## Tracking RMSE per joint [rad]",
        "",
        "| controller | phase | " + " | ".join(f"j{j + 1}" for j in range(n)) + " | mean |",
        "|---|---|" + "---|" * (n + 1),
    ]
    for ctrl, phases in joint_rmse.items():
        for phase, values in phases.items():
            lines.append(f"| {ctrl} | {phase} | " + " | ".join(f"{v:.4f}" for v in values) + f" | {np.mean(values):.4f} |")
    ff = [r for r in steps if "ff_error" in r]
    if ff:
        lines += ["", "## Feed-forward error against the plant's inverse dynamics, RMS per joint [N m]", "",
                  "| controller | phase | " + " | ".join(f"j{j + 1}" for j in range(n)) + " |", "|---|---|" + "---|" * n]
        for ctrl in dict.fromkeys(r["controller"] for r in ff):
            for phase, keep in (("before", lambda t: t < change_at), ("after", lambda t: t >= change_at)):
                e = np.array([r["ff_error"] for r in ff if r["controller"] == ctrl and keep(r["t"])])
                if len(e):
                    lines.append(f"| {ctrl} | {phase} | " + " | ".join(f"{v:.2f}" for v in np.sqrt((e**2).mean(0))) + " |")
    lines += compute_section([r for r in records if r.get("kind") == "episode" and r.get("robot") == robot], period)
    by_ctrl: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in steps:
        by_ctrl[r["controller"]].append(r)
    mark = c["change"] != "payload" or bool(c["payload"])  # a payload of 0 kg changes nothing
    window = max(1, c["steps"] // 50)
    names = list(dict.fromkeys([*c["controllers"], *by_ctrl]))  # a controller's colour in every plot (_colors)
    plots = [draw_plot(run.path / f"{robot}_tracking.svg",
                       lambda out: _plot_arm_error(out, by_ctrl, _colors(names), "tracking_error", window,
                                                   "joint-position error norm [rad]", change_at if mark else 0), redraw)]
    if ff:
        plots.append(draw_plot(run.path / f"{robot}_ff_error.svg",
                               lambda out: _plot_arm_error(out, by_ctrl, _colors(names), "ff_error", window,
                                                           "feed-forward error norm [N m]", change_at if mark else 0),
                               redraw))
    timed = [ctrl for ctrl, rs in by_ctrl.items() if any("cpu_ms" in r for r in rs)]
    if timed:
        def draw_cpu(out: Path) -> Path:
            colors = _colors(names)
            return _plot_cpu(out, [(ctrl, colors[ctrl], "-", by_ctrl[ctrl]) for ctrl in timed], period, c["steps"],
                             change_at if mark else 0, "change")

        plots.append(draw_plot(run.path / f"{robot}_cpu.svg", draw_cpu, redraw))
    from gpdyn.experiments.arm_config import ArmRunConfig

    lines += _settings_section(run, cfg, ArmRunConfig)
    lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    path = run.path / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _plot_arm_error(out: Path, by_ctrl: dict[str, list[dict[str, Any]]], colors: dict[str, str], key: str,
                    window: int, ylabel: str, change_at: int) -> Path:
    """The norm over the joints of each step's ``key`` (a number or a list per joint), as a moving RMS over
    ``window`` steps, a line per controller that records it."""
    fig = Figure(1, size=(620, 380))
    ax = fig.panels[0]
    for ctrl, rs in by_ctrl.items():
        rs = [r for r in rs if key in r]
        if not rs:
            continue
        err = np.array([np.linalg.norm(np.atleast_1d(np.asarray(r[key], dtype=float))) for r in rs])
        smooth = np.sqrt(np.convolve(err**2, np.ones(window) / window, mode="same"))
        ax.plot([r["t"] for r in rs], smooth, label=ctrl, color=colors[ctrl], width=1)
    ax.yscale, ax.xlabel, ax.ylabel = "log", "control step", ylabel
    _mark_change(ax, change_at, "change")
    return fig.save(out)


def arm_change_text(config: dict[str, Any]) -> str:
    """The plant change of an arm run (its settings as a dict), as reports name it."""
    change, at = config.get("change", "payload"), config["change_at"]
    if change == "payload":
        return f"payload {config['payload']:g} kg added at step {at}" if config["payload"] else "no plant change"
    if change == "joint-friction":
        friction = config.get("joint_friction", 0.05)
        return (f"joint friction added at step {at}: dry {friction:g} of each joint's torque "
                f"limit, viscous {friction:g} of it per rad/s")
    if change == "joint-spring":
        return (f"joint spring added at step {at}: {config.get('joint_spring', 0.1):g} of each joint's torque limit "
                f"per rad, at rest where the arm was")
    return f"motor gain x{config.get('motor_gain', 0.7):g} from step {at}"


def _arm_file_name(config: dict[str, Any]) -> str:
    """The MJCF file name of a run's arm: its ``model``, or the shipped iiwa's when it names none."""
    return Path(config["model"]).name if config.get("model") else KUKA_FILE


def _joint_count(joint_rmse: dict[str, dict[str, list[float]]], steps: list[dict[str, Any]], file: Path) -> int:
    """The arm's joint count, from its tracking records (or the feed-forward errors of its steps)."""
    widths = {len(v) for phases in joint_rmse.values() for v in phases.values()}
    widths |= {len(r["ff_error"]) for r in steps if "ff_error" in r}
    if len(widths) != 1:
        raise InputError(f"{file}: " + ("no tracking records (the run stopped before its first controller finished)"
                                        if not widths else f"the records disagree on the joint count: {sorted(widths)}"))
    return widths.pop()


# --------------------------------------------------------------------------------- a run folder's report
def write_control_report(run: RunDir, redraw: bool = False) -> Path:
    """(Re)generate the report of a ``gpdyn control walker|kuka|arm`` run folder from its ``config.json`` and
    ``metrics.jsonl``: the report the run wrote, and for a stopped run the episodes it recorded (a plot newer than
    the records kept unless ``redraw``)."""
    config = run.config()
    job = config.get("job")
    if job in ("control-kuka", "control-arm"):
        return write_arm_report(run, config, redraw=redraw)
    if isinstance(job, str) and job.startswith("control-"):  # a legged task's: control-walker, control-hopper, ...
        return write_legged_report(run, config, redraw=redraw)
    raise InputError(f"{run.path / 'config.json'}: job {job!r:.40} is not a control run (control-TASK of a legged task, "
                     "control-kuka, control-arm)")


# ------------------------------------------------------------------------------ settings and records read back
class _Required:
    """The default of a setting every run folder records."""


REQUIRED = _Required()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_names(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(isinstance(x, str) for x in v)


# (check, what it must be)
_NAME = (lambda v: isinstance(v, str), "a name")
_NAME_OR_NONE = (lambda v: v is None or isinstance(v, str), "a name or null")
_NAMES = (_is_names, "a non-empty list of names")
_COUNT = (lambda v: _is_int(v) and v >= 0, "an integer >= 0")
_POSITIVE_INT = (lambda v: _is_int(v) and v >= 1, "an integer >= 1")
_NUMBER = (lambda v: _is_number(v) and np.isfinite(v), "a finite number")
_POSITIVE = (lambda v: _is_number(v) and np.isfinite(v) and v > 0, "a finite number > 0")
_SWITCH = (lambda v: isinstance(v, bool), "true or false")

#: the settings a legged run's report reads: (check, default for a folder written before the setting existed)
LEGGED_SETTINGS: dict[str, tuple[tuple[Any, str], Any]] = {
    "task": (_NAME, "walker"),
    "conditions": (_NAMES, REQUIRED), "controllers": (_NAMES, REQUIRED), "steps": (_POSITIVE_INT, REQUIRED),
    "episodes": (_POSITIVE_INT, 1), "change_at": (_COUNT, 0), "change": (_NAME, REQUIRED),
    "learner": (_NAME, REQUIRED), "scale": (_NAME, "?"), "target": (_NAME, "?"), "device": (_NAME, "?"),
    "adapt": (_NAME, "?"), "planner": (_NAME, "mppi"), "samples": (_COUNT, REQUIRED), "sim_samples": (_COUNT, REQUIRED),
    "horizon": (_COUNT, REQUIRED), "noise_std": (_NUMBER, 0.2), "temperature": (_NUMBER, REQUIRED),
    "uncertainty": (_NAME, REQUIRED), "var_weight": (_NUMBER, 1.0), "cost": (_NAME, "reward"),
    "track_offset_weight": (_NUMBER, 0.0), "control_cost": (_NUMBER, 0.0), "relative_to_proposal": (_SWITCH, False),
    "warm_start": (_SWITCH, True), "proposal_tail": (_COUNT, 0), "terminal_value": (_SWITCH, False),
    "residual_kernel": (_NAME, "se"), "residual_gate": (_SWITCH, False), "residual_gate_z": (_NUMBER, 0.0),
}
#: the settings an arm report reads
ARM_SETTINGS: dict[str, tuple[tuple[Any, str], Any]] = {
    "robot": (_NAME, REQUIRED), "model": (_NAME_OR_NONE, None), "learner": (_NAME, REQUIRED),
    "from_run": (_NAME_OR_NONE, None), "scale": (_NAME, "?"), "steps": (_POSITIVE_INT, REQUIRED),
    "change_at": (_COUNT, REQUIRED), "change": (_NAME, "payload"), "payload": (_NUMBER, REQUIRED),
    "joint_friction": (_NUMBER, 0.05), "motor_gain": (_NUMBER, 0.7),
    "joint_spring": (_NUMBER, 0.1), "family": (_NAME, "?"),
    "speed": (_NUMBER, REQUIRED), "rate_hz": (_POSITIVE, 100.0), "omega": (_NUMBER, REQUIRED),
    "adapt": (_NAME, "?"), "window": (_COUNT, 400), "updates": (_COUNT, 1), "online_batch": (_COUNT, 64),
    "payload_gains": (_SWITCH, False),  # a folder from before the gain schedule kept its gains
    "feedback": (_NAME, "diagonal"),  # nor chose its feedback law
    "change_window": (_COUNT, 0),  # nor had a windowed change test
    "change_friction_std": (_NUMBER, 0.0),  # nor re-opened the joints' dry friction at a reset
    # nor had a GP of the joint angles in the filter's state
    "angle_gp_points": (_COUNT, 0), "angle_gp_std": (_NUMBER, 3.0), "angle_gp_reset_std": (_NUMBER, 1.5),
    "controllers": (_NAMES, REQUIRED),
}


def _settings(cfg: Any, schema: dict[str, tuple[tuple[Any, str], Any]], file: Path) -> dict[str, Any]:
    """The settings of ``schema`` from a run's config dataclass or its ``config.json`` dict (``file``), defaults filled
    in for a folder written before a setting existed; a missing or malformed one is an InputError naming the file."""
    given = asdict(cfg) if is_dataclass(cfg) else cfg
    if not isinstance(given, Mapping):
        raise InputError(f"{file}: expected a JSON object, found {type(given).__name__}")
    given = flatten_dict(dict(given))  # a config tree's sections (gpdyn.config); an older folder's flat config as it is
    out: dict[str, Any] = {}
    for key, ((check, what), default) in schema.items():
        if key not in given:
            if default is REQUIRED:
                raise InputError(f"{file}: no '{key}' (a control run records it)")
            out[key] = default
        elif not check(given[key]):
            raise InputError(f"{file}: '{key}' must be {what}, is {given[key]!r:.80}")
        else:
            out[key] = given[key]
    return out


#: the fields of a control run's records that its report reads: (check, required)
RECORD_FIELDS: dict[str, dict[str, tuple[tuple[Any, str], bool]]] = {
    "step": {"controller": (_NAME, True), "t": (_COUNT, True), "reward": ((_is_number, "a number"), False),
             "condition": (_NAME, False), "episode": (_COUNT, False), "cpu_ms": ((_is_number, "a number"), False),
             "model_rmse": ((_is_number, "a number"), False), "pred_variance": ((_is_number, "a number"), False),
             "x_position": ((_is_number, "a number"), False),
             "tracking_error": ((_is_number, "a number"), False),
             "ff_error": ((lambda v: isinstance(v, list) and all(_is_number(x) for x in v), "a list of numbers"), False)},
    "episode": {"controller": (_NAME, True), "condition": (_NAME, False), "episode": (_COUNT, False),
                "return": ((_is_number, "a number"), True), "length": (_POSITIVE_INT, True),
                "cpu_ms_per_step": ((_is_number, "a number"), False),
                "cpu_ms_per_step_p95": ((_is_number, "a number"), False),
                "plan_seconds_mean": ((lambda v: v is None or _is_number(v), "a number or null"), False),
                "effective_samples_mean": ((lambda v: v is None or _is_number(v), "a number or null"), False),
                "cost_spread_mean": ((_is_number, "a number"), False),
                "control_spread_mean": ((_is_number, "a number"), False), "fallbacks": (_COUNT, False)},
    "tracking": {"controller": (_NAME, True),
                 "rmse": ((lambda v: isinstance(v, dict) and all(isinstance(x, list) and x and all(_is_number(y) for y in x)
                                                                 for x in v.values()),
                           "an object of phases, each a list of numbers"), True)},
}
#: fields a legged run's records must have beside RECORD_FIELDS' required ones
LEGGED_REQUIRED = {"step": ("condition", "reward"), "episode": ("condition",)}
#: the arm's
ARM_REQUIRED = {"step": ("tracking_error",)}


def _check_records(numbered: list[tuple[int, dict[str, Any]]], robot: str, extra: dict[str, tuple[str, ...]],
                   file: Path) -> None:
    """Raise InputError naming the file and line of the first record of ``robot`` whose fields the report reads
    (those of :data:`RECORD_FIELDS`, and ``extra`` by kind) are missing or malformed."""
    for line, r in numbered:
        fields = RECORD_FIELDS.get(r.get("kind"))
        if fields is None or r.get("robot") != robot:
            continue
        for key, ((check, what), required) in fields.items():
            if key not in r:
                if required or key in extra.get(r["kind"], ()):
                    raise InputError(f"{file}: line {line}: {r['kind']} record without '{key}'")
            elif not check(r[key]):
                raise InputError(f"{file}: line {line}: {r['kind']} record: '{key}' must be {what}, is {r[key]!r:.80}")
        if r["kind"] == "episode" and ("cpu_ms_per_step" in r) != ("cpu_ms_per_step_p95" in r):
            raise InputError(f"{file}: line {line}: episode record with only one of 'cpu_ms_per_step' and "
                             "'cpu_ms_per_step_p95'")


__all__ = ["arm_change_text", "compute_section", "mean_se", "write_arm_report", "write_control_report",
           "write_legged_report"]
