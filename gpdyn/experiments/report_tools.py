"""What every report writer shares (learn, replay, stream and control reports): plots drawn only
when their records changed (as SVG files: :mod:`gpdyn.experiments.svg_plot`), and the common end
of a learner report."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpdyn.runs import METRICS_FILE, RunDir

#: the files a run's plots are drawn from: a plot newer than both shows the records as they are
PLOT_SOURCES = (METRICS_FILE, "config.json")


def draw_plot(out: Path, draw: Callable[[Path], Any], redraw: bool = False) -> Path:
    """``out``, drawn by ``draw(out)`` unless it is newer than the ``metrics.jsonl`` and
    ``config.json`` beside it (and ``redraw`` is false): then it shows the same records and
    is kept. Newer means a strictly later modification time, so a plot written in the same
    clock tick as the records is drawn again."""
    if not redraw and out.is_file():
        sources = [out.parent / name for name in PLOT_SOURCES]
        newest = max((p.stat().st_mtime_ns for p in sources if p.is_file()), default=None)
        if newest is not None and out.stat().st_mtime_ns > newest:
            return out
    draw(out)
    return out


def finish_report(run_dir: Path, lines: list[str], config: dict[str, Any], plots: list[Path], rows: str) -> Path:
    """Append the learners' sizes, the plots and where every number is (``rows``: what the table
    rows are) to ``lines``; write them as ``report.md`` and return its path.

    The report of an unfinished run says so under its title: how far it got and how to
    continue it (:meth:`gpdyn.runs.RunDir.status`).
    """
    status = RunDir(run_dir).status()
    if status is not None and not status.finished:
        lines = lines[:1] + ["", f"**Unfinished run: {status.describe()}.** The numbers below are those of the "
                                 "last evaluation so far, not final ones."] + lines[1:]
    lines = lines + sizes_section(config) + ["", "## Curves", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    lines += ["", f"Every curve point is in `curves.csv`; the table rows are {rows} (`final.csv`).", ""]
    report = run_dir / "report.md"
    report.write_text("\n".join(lines))
    return report


def sizes_section(config: dict[str, Any]) -> list[str]:
    """Each learner's resolved options (preset, capped bases, overrides), where the run recorded them."""
    learners = config.get("learner_config")
    if not learners:
        return []
    lines = ["", f"## Sizes (preset {config.get('preset', '?')}, bases capped at the training rows)", ""]
    for name, options in learners.items():
        shown = {k: v for k, v in options.items() if k not in ("input_dim", "output_dim", "seed", "preset")}
        lines.append(f"- {name}: " + ", ".join(f"{k} = {v}" for k, v in shown.items()))
    return lines


__all__ = ["PLOT_SOURCES", "draw_plot", "finish_report", "sizes_section"]
