"""Reports of run folders (:func:`write_report`, ``gpdyn report``): replay runs here (SVDGP Table 2
and Appendix C tables, CSV curves, Fig. 2-style plots), learn runs here too (the final table per
output and the same curves), stream-protocol runs of either in
:mod:`gpdyn.experiments.stream_report`, control runs in :mod:`gpdyn.experiments.control_report`.
The report of an unfinished replay says how far it got and how to continue it, above numbers
marked as not final; an unfinished learn run has no report yet and says the same.

Input: the evaluation records a replay writes to ``metrics.jsonl``, one per learner
and evaluation point::

    {"kind": "eval", "learner": "svdgp", "iteration": 200, "seconds": 12.3,
     "nmse": [P floats], "vlb": [P floats], "nll": [P floats], "msll": [P floats], "coverage": [P floats]}

(the scores of :func:`gpdyn.gp.online.evaluate`; a run written before a score existed
shows "–" for it). ``seconds`` is the learner's cumulative training wall-clock time
(evaluation excluded). Output, in the run folder: ``report.md``, ``curves.csv``,
``final.csv`` and an SVG plot per score of :data:`PLOTS` (against iterations and against time).

Plots (here, in the stream and the control reports) are SVG files written by
:mod:`gpdyn.experiments.svg_plot` (not matplotlib, whose import and text layout cost several times
the rest of a report: docs/results/startup.md), through :func:`draw_plot`: only when the plot is missing or not newer
than the run's ``metrics.jsonl`` and ``config.json`` (the records it is drawn from), or when
asked to (``redraw``, ``gpdyn report --redraw``): a report of unchanged records has the same plots.
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
from gpdyn.runs import RunDir, is_run_dir, read_json

STEP_SIZE_FILE = "step_size.json"  # gamma_0 per learner, when replay chose it
#: the held-out scores (gpdyn.gp.online.SCORES) and their titles
METRICS = {
    "nmse": "nMSE",
    "vlb": "variational lower bound (per point)",
    "nll": "negative log predictive density of y (per point)",
    "msll": "mean standardised log loss",
    "coverage": "fraction of targets in the central 95% interval",
}
#: their short names, the column headers of the tables
COLUMNS = {"nmse": "nMSE", "vlb": "bound", "nll": "NLL", "msll": "MSLL", "coverage": "95% coverage"}
PLOTS = ("nmse", "vlb", "nll", "coverage")  # msll is nll less a constant per output: the same curves
#: what the calibration columns mean, under the tables
CALIBRATION_NOTE = (
    "NLL: the mean negative log density of each held-out target under the predictive distribution of y "
    "(latent variance plus noise), in the units of the outputs normalised by the training mean and standard "
    "deviation (add log sd of an output for its physical units). MSLL: NLL minus that of N(0, 1), the "
    "training mean and variance (Rasmussen & Williams 2006, Sec. 2.5; below 0 is better than that). "
    "95% coverage: the fraction of held-out targets inside the central 95% predictive interval (0.95 when "
    "the variance is right; lower is overconfident, higher underconfident)."
)


def eval_curves(records: list[tuple[int, dict[str, Any]]], file: Path | str = "metrics.jsonl") -> dict[str, list[dict[str, Any]]]:
    """Evaluation records grouped by learner, in iteration order (later duplicates win).

    ``records`` are ``(line number, record)`` pairs of ``file`` (:meth:`RunDir.numbered_metrics`);
    a malformed evaluation record is an InputError naming the file and line.
    """
    by_learner: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    width: int | None = None
    for line, r in records:
        if r.get("kind") == "eval":
            width = _check_eval(f"{file}: line {line}: evaluation record", r, width)
            by_learner[r["learner"]][r["iteration"]] = r
    return {k: [v[i] for i in sorted(v)] for k, v in by_learner.items()}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_eval(where: str, r: dict[str, Any], width: int | None) -> int:
    """Check one evaluation record's fields; return its number of outputs (equal across records)."""
    if not isinstance(r.get("learner"), str):
        raise InputError(f"{where}: 'learner' must be a name, is {r.get('learner')!r:.80}")
    if not (isinstance(r.get("iteration"), int) and not isinstance(r["iteration"], bool) and r["iteration"] >= 0):
        raise InputError(f"{where}: 'iteration' must be an integer >= 0, is {r.get('iteration')!r:.80}")
    if not (_is_number(r.get("seconds")) and r["seconds"] >= 0):
        raise InputError(f"{where}: 'seconds' must be a number >= 0, is {r.get('seconds')!r:.80}")
    for metric in METRICS:
        if metric not in r and metric not in ("nmse", "vlb"):
            continue  # a score added after the run was written
        v = r.get(metric)
        if not (isinstance(v, list) and v and all(_is_number(x) for x in v)):
            raise InputError(f"{where}: '{metric}' must be a list of numbers, one per output, is {v!r:.80}")
        if width is not None and len(v) != width:
            raise InputError(f"{where}: '{metric}' has {len(v)} outputs, other records have {width}")
        width = len(v)
    return width


def mean_std(values: list[float] | None) -> str:
    """``mean ± std`` over outputs, "–" where the run has no such score."""
    if values is None:
        return "–"
    v = np.asarray(values)
    return f"{v.mean():.4g} ± {v.std():.2g}"


#: jobs whose folders hold no report for :func:`write_report` (name prefixes), and what they hold instead
NO_REPORT = {
    "collect-": "made an episode store; `gpdyn inspect` summarises the store and the folder",
    "import-": "made an episode store; `gpdyn inspect` summarises the store and the folder",
    "bench-": "a benchmark writes its tables when it runs",
}


def write_report(run_dir: str | Path, redraw: bool = False) -> Path:
    """(Re)generate the report of a run folder: its tables, CSV files and plots (replay, learn,
    stream, control runs); return the path of its ``report.md``. A plot newer than the records
    it shows is kept unless ``redraw`` (:func:`draw_plot`)."""
    run_dir = Path(run_dir)
    if not is_run_dir(run_dir):
        raise InputError(f"{run_dir}: not a run folder (no config.json)")
    run = RunDir(run_dir)
    config = run.config()
    job = config.get("job")
    if isinstance(job, str) and job.startswith("control-"):
        from gpdyn.experiments.control_report import write_control_report

        return write_control_report(run, redraw=redraw)
    if job == "demo":
        inside = sorted(str(p) for p in run_dir.iterdir() if is_run_dir(p))
        raise InputError(f"{run_dir}: a demo folder, whose stages are run folders of their own: "
                         + ("; ".join(f"gpdyn report {p}" for p in inside) if inside else "none written yet"))
    for prefix, held in NO_REPORT.items():
        if isinstance(job, str) and job.startswith(prefix):
            raise InputError(f"{run_dir}: a {job} run has no report ({held}); gpdyn report reads learn, replay and "
                             "control run folders")
    if job == "learn" and config.get("protocol") != "stream":
        return _learn_report(run, config, redraw)
    records = run.numbered_metrics()
    curves = eval_curves(records, run_dir / "metrics.jsonl")
    if not curves:
        from gpdyn.experiments.stream_report import stream_curves, write_stream_report

        streams = stream_curves(records, run_dir / "metrics.jsonl")
        if streams:
            return write_stream_report(run_dir, config, streams, redraw=redraw)
        raise InputError(f"{run_dir}/metrics.jsonl: no evaluation records to report")
    width = len(next(iter(curves.values()))[-1]["nmse"])
    outputs = config.get("outputs") or [f"y{i}" for i in range(width)]
    if not (isinstance(outputs, list) and len(outputs) == width and all(isinstance(o, str) for o in outputs)):
        raise InputError(f"{run_dir / 'config.json'}: 'outputs' must list {width} output names, is {outputs!r:.80}")
    step_sizes = _step_size_section(run_dir)  # every input is read and checked before any output is written
    status = run.status()
    final_yet = status is None or status.finished

    _write_curves_csv(run_dir / "curves.csv", curves, outputs)
    final = {name: rows[-1] for name, rows in curves.items()}
    _write_final_csv(run_dir / "final.csv", final, outputs)
    plots = [draw_plot(run_dir / f"{metric}.svg", lambda out, metric=metric: _plot(out, curves, metric), redraw)
             for metric in PLOTS if any(metric in r for r in final.values())]

    lines = [
        f"# Replay: {config.get('problem', '?')} ({config.get('protocol', '?')} protocol)",
        "",
        f"Store `{config.get('store', '?')}`, seed {config.get('seed', '?')}, "
        f"{config.get('iterations', '?')} iterations{'' if final_yet else ' planned'}, "
        f"minibatch {config.get('batch_size', '?')}, "
        f"device {config.get('device', '?')}. Every learner saw the same minibatches in the same order"
        + (f"; scored on a seeded subset of {config['eval_rows']} held-out rows." if config.get("eval_rows") else "."),
        *_split_line(config),
        "",
        "## Table 2 layout: mean ± std over outputs, at the last evaluation"
        + ("" if final_yet else " so far (the run is unfinished: not final numbers)"),
        "",
        "| learner | iterations | " + " | ".join(COLUMNS.values()) + " | train time (s) | s / iteration |",
        "| --- | ---: |" + " ---: |" * (len(COLUMNS) + 2),
    ]
    for name, r in final.items():
        per_it = r["seconds"] / max(int(r["iteration"]), 1)
        scores = " | ".join(mean_std(r.get(metric)) for metric in METRICS)
        lines.append(f"| {name} | {r['iteration']} | {scores} | {r['seconds']:.1f} | {per_it:.4f} |")
    lines += ["", CALIBRATION_NOTE]
    for metric, title in METRICS.items():
        lines += ["", f"## Appendix C layout: {title} per output", ""]
        lines.append("| learner | " + " | ".join(outputs) + " |")
        lines.append("| --- |" + " ---: |" * len(outputs))
        for name, r in final.items():
            cells = [f"{v:.4g}" for v in r[metric]] if metric in r else ["–"] * len(outputs)
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += step_sizes
    return finish_report(run_dir, lines, config, plots, "the last rows per learner")


def _learn_report(run: RunDir, config: dict[str, Any], redraw: bool) -> Path:
    """The report of a finished ``gpdyn learn`` run: the final evaluation per output (the table the
    run wrote when it finished), the curves over its evaluations, ``curves.csv`` and ``final.csv``.
    An unfinished run has no report yet and says how to continue it."""
    status = run.status()
    if status is not None and not status.finished:
        raise InputError(f"{run.path}: an unfinished learn run, no report yet: {status.describe()}")
    curves = eval_curves(run.numbered_metrics(), run.path / "metrics.jsonl")
    if not curves:
        raise InputError(f"{run.path}/metrics.jsonl: no evaluation records to report")
    if len(curves) > 1:
        raise InputError(f"{run.path}/metrics.jsonl: a learn run of one learner has records of {', '.join(curves)}")
    name, rows = next(iter(curves.items()))
    final = rows[-1]
    problem = config.get("problem") if isinstance(config.get("problem"), dict) else {}
    width = len(final["nmse"])
    outputs = problem.get("outputs") or [f"y{i}" for i in range(width)]
    if not (isinstance(outputs, list) and len(outputs) == width and all(isinstance(o, str) for o in outputs)):
        raise InputError(f"{run.path / 'config.json'}: 'problem.outputs' must list {width} output names, "
                         f"is {outputs!r:.80}")
    _write_curves_csv(run.path / "curves.csv", curves, outputs)
    _write_final_csv(run.path / "final.csv", {name: final}, outputs)
    plots = [draw_plot(run.path / f"{metric}.svg", lambda out, metric=metric: _plot(out, curves, metric), redraw)
             for metric in PLOTS if metric in final]
    protocol = problem.get("protocol", config.get("protocol", "?"))
    lines = [f"# {name} on {problem.get('name', '?')} ({protocol} protocol), iteration {final['iteration']}", ""]
    if problem.get("held_out"):
        lines += [f"Held out: {problem['held_out']} ({problem.get('test', '?')} test rows; "
                  f"{problem.get('train', '?')} training rows).", ""]
    lines += [
        f"Seed {config.get('seed', '?')}, minibatch {config.get('batch_size', '?')}, device {config.get('device', '?')}, "
        f"dtype {config.get('dtype', '?')}; evaluated every {config.get('eval_every', '?')} iterations"
        + (f"; the learner models the residual of the prior mean `{config['prior_mean']}`." if config.get("prior_mean")
           else "."),
        "",
        "| output | " + " | ".join(COLUMNS.values()) + " |",
        "|---|" + "---|" * len(COLUMNS),
    ]
    for i, output in enumerate(outputs):
        cells = [f"{final[m][i]:.4f}" if m in final else "–" for m in COLUMNS]
        lines.append(f"| {output} | " + " | ".join(cells) + " |")
    lines += ["| mean ± std | " + " | ".join(mean_std(final.get(m)) for m in COLUMNS) + " |", "", CALIBRATION_NOTE]
    if isinstance(config.get("learner_config"), dict):  # a learn run records one learner's options
        config = {**config, "learner_config": {name: config["learner_config"]}}
    return finish_report(run.path, lines, config, plots, "the last evaluation")


def _split_line(config: dict[str, Any]) -> list[str]:
    """Which rows were held out and how many rows each split has (runs that recorded it)."""
    summary = config.get("problem_summary")
    if not summary:
        return []
    init = f", {summary['init']} initialisation rows" if summary.get("init") else ""
    return ["", f"Held out: {summary['held_out']} ({summary['test']} test rows; {summary['train']} training rows{init})."]


def _step_size_section(run_dir: Path) -> list[str]:
    """The gamma_0 each learner ran with, when replay chose it (``--select-lr``)."""
    path = run_dir / STEP_SIZE_FILE
    if not path.exists():
        return []
    chosen = read_json(path)
    _check_step_sizes(path, chosen)
    candidates = sorted({lr for entry in chosen.values() for lr in entry["objective"]}, key=float, reverse=True)
    iterations = {entry["iterations"] for entry in chosen.values()}
    lines = [
        "", "## Step size gamma_0, chosen per learner (SVDGP Section 4)", "",
        f"Minibatch objective (negative bound per point, before each update) over the last tenth of "
        f"{'/'.join(map(str, sorted(iterations)))} probe iterations from the same start; lowest wins; "
        "'diverged' marks a non-finite loss or a failed factorisation.", "",
        "| learner | chosen | " + " | ".join(f"gamma_0 = {lr}" for lr in candidates) + " |",
        "| --- | ---: |" + " ---: |" * len(candidates),
    ]
    for name, entry in chosen.items():
        cells = []
        for lr in candidates:
            value = entry["objective"].get(lr, "–")
            cells.append("diverged" if value is None else value if isinstance(value, str) else f"{value:.4f}")
        lines.append(f"| {name} | {entry['lr']:g} | " + " | ".join(cells) + " |")
    return lines


def _check_step_sizes(path: Path, chosen: Any) -> None:
    """``{learner: {"lr": gamma_0, "objective": {candidate: value or null}, "iterations": n}}``, or an InputError."""
    if not isinstance(chosen, dict):
        raise InputError(f"{path}: expected an object of learners, found {type(chosen).__name__}")
    for name, entry in chosen.items():
        if not (
            isinstance(entry, dict) and _is_number(entry.get("lr")) and isinstance(entry.get("iterations"), int)
            and isinstance(entry.get("objective"), dict)
            and all(_is_number(v) or v is None or isinstance(v, str) for v in entry["objective"].values())
        ):
            raise InputError(
                f"{path}: learner '{name}': expected {{'lr': number, 'objective': {{candidate: number or null}}, "
                f"'iterations': integer}}, is {entry!r:.120}"
            )
        for lr in entry["objective"]:
            try:
                float(lr)
            except ValueError:
                raise InputError(f"{path}: learner '{name}': candidate step size {lr!r:.40} is not a number") from None


def _score_cells(r: dict[str, Any]) -> list[str]:
    """Mean and std of every score, then every score per output ("" where the run has none)."""
    summary, per_output = [], []
    for metric in METRICS:
        v = np.asarray(r[metric]) if metric in r else None
        summary += [f"{v.mean():.8g}", f"{v.std():.8g}"] if v is not None else ["", ""]
        per_output += [f"{x:.8g}" for x in v] if v is not None else [""] * len(r["nmse"])
    return summary + per_output


def _write_curves_csv(path: Path, curves: dict[str, list[dict[str, Any]]], outputs: list[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["learner", "iteration", "seconds"]
            + [f"{metric}_{stat}" for metric in METRICS for stat in ("mean", "std")]
            + [f"{metric}[{o}]" for metric in METRICS for o in outputs]
        )
        for name, rows in curves.items():
            for r in rows:
                w.writerow([name, r["iteration"], f"{r['seconds']:.6g}"] + _score_cells(r))


def _write_final_csv(path: Path, final: dict[str, dict[str, Any]], outputs: list[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["learner", "metric", "mean", "std"] + outputs)
        for name, r in final.items():
            for metric in METRICS:
                if metric in r:
                    v = np.asarray(r[metric])
                    w.writerow([name, metric, f"{v.mean():.8g}", f"{v.std():.8g}"] + [f"{x:.8g}" for x in v])


def _plot(out: Path, curves: dict[str, list[dict[str, Any]]], metric: str) -> Path:
    """``metric``'s mean over outputs (a band from their min to max) per learner, against iterations and time."""
    fig = Figure(2, sharey=True, title=f"{METRICS[metric]} on the held-out split")
    axes = fig.panels
    for name, rows in curves.items():
        rows = [r for r in rows if metric in r]
        mean = [float(np.mean(r[metric])) for r in rows]
        # the band spans the outputs' range: mean ± std would cross zero on the log nMSE axis
        low, high = [float(np.min(r[metric])) for r in rows], [float(np.max(r[metric])) for r in rows]
        color = None
        for ax, xs in zip(axes, ([r["iteration"] for r in rows], [r["seconds"] for r in rows])):
            color = ax.plot(xs, mean, color=color, label=name, marker=".")
            ax.band(xs, low, high, color)
    axes[0].xlabel, axes[1].xlabel = "iteration", "training wall-clock time (s)"
    axes[0].ylabel = f"{METRICS[metric]}, mean over outputs (band: min to max)"
    for ax in axes:
        ax.yscale = "log" if metric == "nmse" else "linear"
        if metric == "coverage":
            ax.hline(0.95)
    return fig.save(out)
