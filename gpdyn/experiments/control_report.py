"""Reports of control runs: ``report.md`` with the tables and PNG plots with the plant change marked.

Everything is read back from the run folder's ``metrics.jsonl``, so a report can be
rewritten from a finished (or interrupted) run.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from gpdyn.runs import RunDir


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: Path) -> Path:
    """Lay out, write as PNG and close a figure."""
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    _plt().close(fig)
    return out


def _series(records: list[dict[str, Any]], kind: str, robot: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("kind") == kind and r.get("robot") == robot:
            out[(r["condition"], r["controller"])].append(r)
    return out


def _mark_change(ax: Any, change_at: int, label: str) -> None:
    if change_at > 0:
        ax.axvline(change_at, color="k", linestyle="--", linewidth=1)
        ax.text(change_at, ax.get_ylim()[1], f" {label}", va="top", fontsize=8)


def walker_planner_text(config: dict[str, Any]) -> str:
    """How a Walker2d run planned, from its config (a dict; older run folders lack the newer keys)."""
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


def write_walker_report(run: RunDir, cfg: Any) -> Path:
    """Return table (controller x condition), return-over-time and model-error plots."""
    records = run.metrics()
    episodes = _series(records, "episode", "walker")
    steps = _series(records, "step", "walker")
    conditions = [c for c in cfg.conditions]
    controllers = [c for c in cfg.controllers]
    change_label = next((e[0]["change"] for e in episodes.values() if e and e[0].get("change")), cfg.change)
    lines = [
        "# Walker2d online control",
        "",
        f"Learner `{cfg.learner}` ({cfg.scale} sizes, target `{cfg.target}`), {walker_planner_text(asdict(cfg))}; "
        f"{cfg.steps} control steps per episode, device `{cfg.device}`; online model `{cfg.adapt}`"
        + (f" ({cfg.residual_kernel} kernel" + (f", gated, z = {cfg.residual_gate_z:g}" if cfg.residual_gate else "") + ")."
           if cfg.adapt == "residual" else "."),
        f"Plant change in the `changed` condition: {change_label}, "
        + ("from the start." if cfg.change_at == 0 else f"at step {cfg.change_at}"
           + (", counted over the consecutive episodes; it stays changed after." if cfg.episodes > 1 else ".")),
        "",
        "## Returns",
        "",
        "| controller | " + " | ".join(conditions)
        + " | mean plan time [ms] | effective samples | log-weight spread: costs / control term | fallbacks |",
        "|---|" + "---|" * len(conditions) + "---|---|---|---|",
    ]
    returns: dict[tuple[str, str], list[float]] = {}
    for ctrl in controllers:
        row, times, effective, spreads, falls = [], [], [], [], 0
        for cond in conditions:
            eps = sorted(episodes.get((cond, ctrl), []), key=lambda e: e.get("episode", 0))
            if eps:
                returns[(cond, ctrl)] = [e["return"] for e in eps]
                row.append(_returns_cell(eps, cfg.steps))
                times += [e["plan_seconds_mean"] for e in eps if e.get("plan_seconds_mean")]
                effective += [e["effective_samples_mean"] for e in eps if e.get("effective_samples_mean")]
                spreads += [(e["cost_spread_mean"], e["control_spread_mean"]) for e in eps if "cost_spread_mean" in e]
                falls += sum(int(e.get("fallbacks", 0)) for e in eps)
            else:
                row.append("-")
        t = f"{1e3 * np.mean(times):.1f}" if times else "-"
        ess = f"{np.mean(effective):.1f}" if effective else "-"
        spread = " / ".join(f"{np.mean(s):.2f}" for s in zip(*spreads)) if spreads else "-"
        lines.append(f"| {ctrl} | " + " | ".join(row) + f" | {t} | {ess} | {spread} | {falls if times else '-'} |")
    if cfg.episodes > 1:
        lines += ["", f"Cells: mean over {cfg.episodes} consecutive episodes, then each episode's return, with its "
                      "length where the walker fell. The online model is kept from one episode to the next."]
    lines += _online_verdict(returns)
    from gpdyn.robots.walker import DT  # the control period; robots/walker imports MuJoCo, which reports need not

    lines += compute_section([e for eps in episodes.values() for e in eps], DT)
    errs = {k: v for k, v in steps.items() if any("model_rmse" in r for r in v)}
    if errs:
        lines += ["", "## Model one-step error (velocity RMSE, mean over the steps of all episodes)", "",
                  "| condition | controller | velocity RMSE | mean predictive variance (sum of 9) |", "|---|---|---|---|"]
        for (cond, ctrl), rs in sorted(errs.items()):
            e = [r["model_rmse"] for r in rs if "model_rmse" in r]
            v = [r["pred_variance"] for r in rs if "pred_variance" in r]
            lines.append(f"| {cond} | {ctrl} | {np.mean(e):.3f} | {np.mean(v):.4f} |")
    plots = [_plot_walker(run.path, steps, conditions, controllers, cfg.change_at, change_label)]
    if cfg.episodes > 1:
        plots.append(_plot_walker_episodes(run.path, returns, conditions, controllers))
    if errs:
        plots.append(_plot_walker_error(run.path, errs, cfg.steps, cfg.change_at, change_label))
    lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    path = run.path / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


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


def _plot_walker(path: Path, steps, conditions, controllers, change_at: int, label: str) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(1, len(conditions), figsize=(5.5 * len(conditions), 3.8), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, cond in zip(axes[0], conditions):
        for i, ctrl in enumerate(controllers):
            by_episode = _by_episode(steps.get((cond, ctrl), []))
            for k, rs in enumerate(by_episode.values()):
                # one colour per controller; later episodes drawn darker
                ax.plot([r["t"] for r in rs], np.cumsum([r["reward"] for r in rs]), color=colors[i % len(colors)],
                        alpha=(k + 1) / len(by_episode), label=ctrl if k == len(by_episode) - 1 else None)
        ax.set_title(f"{cond} plant")
        ax.set_xlabel("control step")
        ax.set_ylabel("return so far")
        ax.legend(fontsize=8)
        if cond == "changed":
            _mark_change(ax, change_at, label)
    return _save(fig, path / "walker_return.png")


def _by_episode(rows: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[r.get("episode", 0)].append(r)
    return dict(sorted(out.items()))


def _plot_walker_episodes(path: Path, returns: dict[tuple[str, str], list[float]], conditions, controllers) -> Path:
    """Return per consecutive episode: does the online model's return climb while the frozen one's stays?"""
    plt = _plt()
    fig, axes = plt.subplots(1, len(conditions), figsize=(5.5 * len(conditions), 3.8), squeeze=False)
    for ax, cond in zip(axes[0], conditions):
        for ctrl in controllers:
            r = returns.get((cond, ctrl))
            if r:
                ax.plot(np.arange(1, len(r) + 1), r, marker="o", label=ctrl)
        ax.set_title(f"{cond} plant")
        ax.set_xlabel("episode")
        ax.set_ylabel("return")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=8)
    return _save(fig, path / "walker_episode_returns.png")


def _plot_walker_error(path: Path, errs, steps: int, change_at: int, label: str) -> Path:
    """One-step model error over the control steps of all consecutive episodes (episode k from k x steps)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, ((cond, ctrl), rs) in enumerate(sorted(errs.items())):
        # one line per episode, so that a fall leaves a gap instead of a line to the next episode
        for k, (episode, ers) in enumerate(_by_episode([r for r in rs if "model_rmse" in r]).items()):
            ax.plot([episode * steps + r["t"] for r in ers], [r["model_rmse"] for r in ers], color=colors[i % len(colors)],
                    label=f"{cond}/{ctrl}" if k == 0 else None, linewidth=1)
    ax.set_xlabel("control step (episodes laid end to end)")
    ax.set_ylabel("one-step velocity RMSE")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    n_episodes = 1 + max((r.get("episode", 0) for rs in errs.values() for r in rs), default=0)
    for k in range(1, n_episodes):
        ax.axvline(k * steps, color="0.6", linestyle=":", linewidth=1)
    _mark_change(ax, change_at, label)  # once: the plant stays changed in the episodes after
    return _save(fig, path / "walker_model_error.png")


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


def write_arm_report(run: RunDir, cfg: Any, arm: Any, joint_rmse: dict[str, dict[str, list[float]]]) -> Path:
    """Tracking RMSE per joint before/after the payload change, and the error over time (any arm)."""
    records = run.metrics()
    steps = [r for r in records if r.get("kind") == "step" and r.get("robot") == cfg.robot]
    n = arm.n
    from gpdyn.experiments.control_arm import change_text

    change = change_text(cfg)
    lines = [
        f"# {arm.path.name} computed-torque tracking ({n} joints)",
        "",
        f"Learner `{cfg.learner}` ({f'from {cfg.from_run}' if cfg.from_run else f'{cfg.scale} sizes'}), "
        f"{cfg.steps} control steps at {1 / cfg.dt:.0f} Hz, "
        f"trajectory family `{cfg.family}` at speed {cfg.speed}; {change}.",
        "Control law: tau = f(q_ref, qd_ref, qdd_ref) + Kp (q_ref - q) + Kd (qd_ref - qd); "
        "`pd` has no feed-forward, `true` uses MuJoCo's inverse dynamics of the actual plant; f is evaluated "
        "at the reference of the middle of the step. PD gains: critically damped at "
        f"{cfg.omega:g} rad/s on the effective joint inertia.",
        f"Online model: `{cfg.adapt}` " + {
            "rigid-body": "(RigidBodyGP: the arm's rigid-body regressor and the frozen model as features, one Kalman "
                          "update per control step, covariance reset on a detected change).",
            "residual": f"(ResidualGP: exact GP on the frozen model's residuals, window {cfg.window}).",
        }.get(cfg.adapt, f"({cfg.updates} learner step(s) per control step on the latest {cfg.online_batch} samples)."),
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
            for phase, keep in (("before", lambda t: t < cfg.change_at), ("after", lambda t: t >= cfg.change_at)):
                e = np.array([r["ff_error"] for r in ff if r["controller"] == ctrl and keep(r["t"])])
                if len(e):
                    lines.append(f"| {ctrl} | {phase} | " + " | ".join(f"{v:.2f}" for v in np.sqrt((e**2).mean(0))) + " |")
    lines += compute_section([r for r in records if r.get("kind") == "episode" and r.get("robot") == cfg.robot], cfg.dt)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    by_ctrl: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in steps:
        by_ctrl[r["controller"]].append(r)
    window = max(1, cfg.steps // 50)
    for ctrl, rs in by_ctrl.items():
        err = np.array([r["tracking_error"] for r in rs])
        smooth = np.sqrt(np.convolve(err**2, np.ones(window) / window, mode="same"))
        ax.plot([r["t"] for r in rs], smooth, label=ctrl, linewidth=1)
    ax.set_yscale("log")
    ax.set_xlabel("control step")
    ax.set_ylabel("joint-position error norm [rad]")
    ax.legend(fontsize=8)
    ax.autoscale()
    if cfg.change != "payload" or cfg.payload:
        _mark_change(ax, cfg.change_at, "change")
    plot = _save(fig, run.path / f"{cfg.robot}_tracking.png")
    lines += ["", "## Plot", "", f"![{plot.stem}]({plot.name})"]
    path = run.path / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


__all__ = ["compute_section", "mean_se", "write_arm_report", "write_walker_report"]
