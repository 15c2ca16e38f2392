"""Reports of stream-protocol runs (``learn``/``replay --protocol stream``): tables, CSV, curves.

Input: the ``{"kind": "stream", ...}`` records of :mod:`gpdyn.experiments.stream` in
``metrics.jsonl``. Output, in the run folder: ``report.md`` (the prequential table and the
nMSE per output), ``final.csv`` (per learner the metric rows ``nmse``, ``nll``,
``coverage``, ``update_ms_per_row``, ``predict_ms_per_row``, ``cpu_s``; the columns of
:func:`gpdyn.experiments.report.write_report`'s), ``curves.csv`` and two SVG plots: nMSE
against the rows seen (cumulative and over each recording window) and against CPU time,
the calibration (NLL, 95% coverage) and the update time per row against the rows seen.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from gpdyn.errors import InputError
from gpdyn.experiments.report_tools import draw_plot, finish_report
from gpdyn.experiments.svg_plot import Figure

#: the kind of the records :mod:`gpdyn.experiments.stream` writes (``gpdyn.experiments.stream.KIND``, whose module
#: imports torch: a report needs none)
KIND = "stream"

SCORES = ("nmse", "nll", "coverage")  # per output
TIMES = ("update_ms_per_row", "predict_ms_per_row", "cpu_s")  # one number per learner


def stream_curves(records: list[tuple[int, dict[str, Any]]], file: Path | str) -> dict[str, list[dict[str, Any]]]:
    """Stream records grouped by learner in row order (a later record for the same rows wins:
    a learner streamed again after an interruption); a malformed one is an InputError naming
    ``file`` and its line."""
    by_learner: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for line, r in records:
        if r.get("kind") != KIND:
            continue
        where = f"{file}: line {line}: stream record"
        if not isinstance(r.get("learner"), str) or not isinstance(r.get("rows"), int) or isinstance(r["rows"], bool):
            raise InputError(f"{where}: needs 'learner' (a name) and 'rows' (an integer)")
        for key in SCORES:
            v = r.get(key)
            if not (isinstance(v, list) and all(isinstance(x, (int, float)) for x in v)):
                raise InputError(f"{where}: '{key}' must be a list of numbers, is {v!r:.80}")
        for key in TIMES:
            if not isinstance(r.get(key), (int, float)):
                raise InputError(f"{where}: '{key}' must be a number, is {r.get(key)!r:.80}")
        by_learner[r["learner"]][r["rows"]] = r
    return {name: [rows[k] for k in sorted(rows)] for name, rows in by_learner.items()}


def _mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    v = np.asarray(values)
    return f"{v.mean():.4g} ± {v.std():.2g}"


def write_stream_report(run_dir: Path, config: dict[str, Any], curves: dict[str, list[dict[str, Any]]],
                        redraw: bool = False) -> Path:
    """Write ``report.md``, ``final.csv``, ``curves.csv`` and the plots of a stream run (a plot newer than the
    run's records kept unless ``redraw``: :func:`gpdyn.experiments.report_tools.draw_plot`); return the report."""
    final = {name: rows[-1] for name, rows in curves.items()}
    width = max(len(r["nmse"]) for r in final.values())
    summary = config.get("problem") if isinstance(config.get("problem"), dict) else {}
    outputs = config.get("outputs") or summary.get("outputs") or [f"y{i}" for i in range(width)]
    _write_final_csv(run_dir / "final.csv", final, outputs)
    _write_curves_csv(run_dir / "curves.csv", curves, outputs)
    plots = [draw_plot(run_dir / "stream_nmse.svg", lambda out: _plot_nmse(out, curves), redraw),
             draw_plot(run_dir / "stream_calibration.svg", lambda out: _plot_calibration(out, curves), redraw)]
    stream = config.get("stream", {})
    # replay records the problem's name and the store; learn the problem's summary
    summary = config.get("problem") if isinstance(config.get("problem"), dict) else {}
    problem = summary.get("name") or config.get("problem", "?")
    lines = [
        f"# Stream (prequential): {problem}",
        "",
        f"Store `{config.get('store') or summary.get('source', '?')}`, "
        f"seed {config.get('seed', '?')}, device {config.get('device', '?')}, dtype {config.get('dtype', '?')}, "
        f"preset {config.get('preset', '?')}. One pass in store order: the first {stream.get('init_rows', '?')} rows "
        f"start each learner ({stream.get('init_steps', 0)} updates on them) and give the normalisation; then chunks "
        f"of {stream.get('chunk', '?')} rows, each predicted (noise included) before it is observed, "
        f"{stream.get('steps_per_chunk', 1)} update(s) per chunk; scored from row {stream.get('warm_rows', '?')} on."
        + (f" Every learner models the residual of the prior mean `{config['prior_mean']}`." if config.get("prior_mean")
           else ""),
        "",
        "| learner | rows | scored | nMSE | NLL | 95% coverage | update ms/row | predict ms/row | total s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in final.items():
        lines.append(f"| {name} | {r['rows']} | {r.get('scored', '?')} | {_mean_std(r['nmse'])} | {_mean_std(r['nll'])} | "
                     f"{_mean_std(r['coverage'])} | {r['update_ms_per_row']:.3f} | {r['predict_ms_per_row']:.3f} | "
                     f"{r['cpu_s']:.1f} |")
    lines += [
        "",
        "nMSE: squared error over the variance of the scored targets (1 = predicting their mean), mean ± std over "
        "outputs. NLL: mean negative log predictive density of y in normalised units. Times: process CPU time on "
        "the CPU (wall time between device syncs on a GPU); total = init + updates + predictions.",
        "",
        "## nMSE per output",
        "",
        "| learner | " + " | ".join(outputs) + " |",
        "| --- |" + " ---: |" * len(outputs),
    ]
    for name, r in final.items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.4g}" for v in r["nmse"]) + " |")
    if isinstance(config.get("learner"), str):  # a learn run records one learner's options
        config = {**config, "learner_config": {config["learner"]: config.get("learner_config") or {}}}
    return finish_report(run_dir, lines, config, plots, "the final records")


def _write_final_csv(path: Path, final: dict[str, dict[str, Any]], outputs: list[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["learner", "metric", "mean", "std"] + outputs)
        for name, r in final.items():
            for metric in SCORES:
                v = np.asarray(r[metric], dtype=float)
                w.writerow([name, metric, f"{v.mean():.8g}", f"{v.std():.8g}"] + [f"{x:.8g}" for x in v])
            for metric in TIMES:
                w.writerow([name, metric, f"{r[metric]:.8g}", "0"] + [""] * len(outputs))


def _write_curves_csv(path: Path, curves: dict[str, list[dict[str, Any]]], outputs: list[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["learner", "rows", "scored", *TIMES, "window_update_ms_per_row", "window_nmse_mean"]
                   + [f"{m}_mean" for m in SCORES] + [f"{m}[{o}]" for m in SCORES for o in outputs])
        for name, rows in curves.items():
            for r in rows:
                window = r.get("window_nmse") or []
                means = [f"{np.mean(r[m]):.8g}" if r[m] else "" for m in SCORES]
                per_output = [f"{x:.8g}" for m in SCORES for x in (r[m] or [float("nan")] * len(outputs))]
                w.writerow([name, r["rows"], r.get("scored", ""), *(f"{r[t]:.6g}" for t in TIMES),
                            f"{r['window_update_ms_per_row']:.6g}" if "window_update_ms_per_row" in r else "",
                            f"{np.mean(window):.8g}" if window else "", *means, *per_output])


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float], list[float]]:
    """(rows, cpu seconds, mean over outputs) of the records that have ``key`` scored."""
    kept = [r for r in rows if r.get(key)]
    return [r["rows"] for r in kept], [r["cpu_s"] for r in kept], [float(np.mean(r[key])) for r in kept]


def _plot_nmse(out: Path, curves: dict[str, list[dict[str, Any]]]) -> Path:
    fig = Figure(3)
    axes = fig.panels
    for name, rows in curves.items():
        x, t, cumulative = _series(rows, "nmse")
        color = axes[0].plot(x, cumulative, label=name)
        wx, _, window = _series(rows, "window_nmse")
        axes[1].plot(wx, window, color=color, label=name, width=0.9)
        axes[2].plot(t, cumulative, color=color, label=name)
    axes[0].title = "prequential nMSE (cumulative)"
    axes[1].title = "nMSE of each recording window"
    axes[2].title = "prequential nMSE against CPU time"
    for ax, xlabel in zip(axes, ("rows seen", "rows seen", "CPU seconds (init + updates + predictions)")):
        ax.xlabel, ax.yscale = xlabel, "log"
        ax.hline(1.0)  # predicting the mean
    axes[0].ylabel = "nMSE, mean over outputs (1 = the targets' mean)"
    return fig.save(out)


def _plot_calibration(out: Path, curves: dict[str, list[dict[str, Any]]]) -> Path:
    fig = Figure(3)
    axes = fig.panels
    for name, rows in curves.items():
        x, _, nll = _series(rows, "nll")
        color = axes[0].plot(x, nll, label=name)
        x, _, coverage = _series(rows, "coverage")
        axes[1].plot(x, coverage, color=color, label=name)
        timed = [r for r in rows if "window_update_ms_per_row" in r]
        axes[2].plot([r["rows"] for r in timed], [r["window_update_ms_per_row"] for r in timed], color=color, label=name)
    axes[0].title = "prequential NLL of y (normalised units)"
    axes[1].title = "fraction inside the central 95% interval"
    axes[1].hline(0.95)
    axes[2].title = "update time per row (CPU ms, each recording window)"
    axes[0].yscale = "symlog"  # one learner's NLL can be 100x another's
    axes[2].yscale = "log"
    for ax in axes:
        ax.xlabel = "rows seen"
    return fig.save(out)


__all__ = ["stream_curves", "write_stream_report"]
