"""``gpdyn report`` draws a plot only when it is missing or older than the run's records, and
every plot with ``--redraw``; the plots are SVG files of :mod:`gpdyn.experiments.svg_plot`,
written without matplotlib: the curves, bands, axes and legend they hold.

The run folder is written by hand: a replay run's ``config.json`` and two learners'
evaluation records, the format :mod:`gpdyn.experiments.report` reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from gpdyn.cli import main
from gpdyn.experiments import stream, stream_report
from gpdyn.experiments.svg_plot import Figure

PLOTS = ("nmse.svg", "vlb.svg")
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"job": "replay", "problem": "kuka", "protocol": "iid",
                                                    "outputs": ["a", "b"]}))
    records = [{"kind": "eval", "learner": learner, "iteration": i, "seconds": 0.5 * i, "nmse": [0.5 / i, 0.2],
                "vlb": [-1.0 - i, -2.0]} for learner in ("svi", "svdgp") for i in (1, 2, 3)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def _age(folder: Path, seconds: float) -> None:
    """Set the run's records ``seconds`` into the past, as if written that long before the report."""
    for name in ("config.json", "metrics.jsonl"):
        stat = (folder / name).stat()
        os.utime(folder / name, ns=(stat.st_atime_ns, stat.st_mtime_ns - int(seconds * 1e9)))


def _mtimes(folder: Path) -> dict[str, int]:
    return {name: (folder / name).stat().st_mtime_ns for name in PLOTS}


def test_plots_are_drawn_when_missing_or_older_than_the_records_and_kept_otherwise(run, capsys):
    _age(run, 10)
    assert main(["report", str(run)]) == 0
    drawn = _mtimes(run)
    assert main(["report", str(run)]) == 0
    assert _mtimes(run) == drawn  # newer than the records: kept
    (run / "vlb.svg").unlink()
    assert main(["report", str(run)]) == 0
    assert (run / "vlb.svg").is_file() and _mtimes(run)["nmse.svg"] == drawn["nmse.svg"]
    with open(run / "metrics.jsonl", "a") as f:  # a record more: both plots are out of date
        f.write(json.dumps({"kind": "eval", "learner": "svi", "iteration": 4, "seconds": 2.0, "nmse": [0.1, 0.1],
                            "vlb": [-1.0, -1.0]}) + "\n")
    assert main(["report", str(run)]) == 0
    again = _mtimes(run)
    assert all(again[name] > drawn[name] for name in PLOTS)
    assert "| svi | 4 |" in (run / "report.md").read_text()
    _age(run, 10)
    assert main(["report", "--redraw", str(run)]) == 0
    assert all(t > again[name] for name, t in _mtimes(run).items())
    capsys.readouterr()


def test_a_plot_no_newer_than_its_records_is_drawn_again(run):
    _age(run, 10)
    assert main(["report", str(run)]) == 0
    for name in PLOTS:  # the same clock tick as the records: the plot may predate their last write
        os.utime(run / name, ns=(0, (run / "metrics.jsonl").stat().st_mtime_ns))
    before = _mtimes(run)
    assert main(["report", str(run)]) == 0
    assert all(t > before[name] for name, t in _mtimes(run).items())


def test_a_report_that_draws_its_plots_imports_neither_matplotlib_nor_torch(run):
    _age(run, 10)
    probe = ("import json, sys\nfrom gpdyn.cli import main\ncodes = [main(['report', sys.argv[1]])]\n"
             "print(json.dumps([codes, sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'torch', "
             "'mujoco', 'zarr'})]))")
    done = subprocess.run([sys.executable, "-c", probe, str(run)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [[0], []]
    assert all((run / name).is_file() for name in PLOTS)


def _elements(path: Path, tag: str) -> list[ElementTree.Element]:
    return list(ElementTree.parse(path).getroot().iter(SVG + tag))


def test_a_replay_plot_shows_each_learners_curve_and_band_the_axis_labels_and_the_legend(run):
    _age(run, 10)
    assert main(["report", str(run)]) == 0
    plot = run / "nmse.svg"
    texts = [e.text for e in _elements(plot, "text")]
    for label in ("nMSE on the held-out split", "iteration", "training wall-clock time (s)", "svi", "svdgp",
                  "nMSE, mean over outputs (band: min to max)"):
        assert label in texts, label
    curves = [e for e in _elements(plot, "path") if "L" in e.get("d", "")]
    assert len(curves) == 2 * 2  # a curve per learner in each panel...
    assert len({e.get("stroke") for e in curves}) == 2  # ...in the learner's colour
    assert len(_elements(plot, "polygon")) == 2 * 2  # the bands from the outputs' min to max
    assert len(_elements(plot, "circle")) == 2 * 2 * 3 + 2  # a dot per evaluation, and in the legend
    assert {"0.2", "0.3", "0.4", "0.5"} <= set(texts)  # nMSE from 0.5/3 to 0.5 on a log axis: evenly spaced ticks


def test_a_svg_line_breaks_at_a_missing_point_and_a_log_axis_leaves_out_zero(tmp_path):
    fig = Figure(2)
    fig.panels[0].plot([0, 1, 2, 3, 4], [1.0, 2.0, float("nan"), 3.0, 4.0], label="a & <b>")
    fig.panels[1].plot([0, 1, 2, 3], [1.0, 0.0, 10.0, 100.0], color="#000000")
    fig.panels[1].yscale = "log"
    fig.save(tmp_path / "f.svg")
    paths = [e.get("d") for e in _elements(tmp_path / "f.svg", "path") if "L" in e.get("d", "")]
    assert sorted(d.count("L") for d in paths) == [1, 1, 1]  # 0-1 and 3-4; 2-3 on the log axis
    texts = [e.text for e in _elements(tmp_path / "f.svg", "text")]
    assert "a & <b>" in texts and {"1", "10", "100"} <= set(texts)


def test_a_svg_line_of_many_points_keeps_each_pixel_columns_extremes(tmp_path):
    fig = Figure(1)
    x = list(range(100_000))
    fig.panels[0].plot(x, [(-1.0) ** i * (i % 1000) for i in x])
    fig.save(tmp_path / "f.svg")
    (d,) = [e.get("d") for e in _elements(tmp_path / "f.svg", "path") if "L" in e.get("d", "")]
    ys = [float(p.split(",")[1]) for p in d[1:].split("L")]
    assert len(ys) < 4 * 600 and min(ys) < 60 and max(ys) > 300  # about 500 columns; the +-999 peaks kept


def test_a_svg_plot_names_what_it_cannot_draw():
    with pytest.raises(ValueError, match="'a': 2 x values but 1 y values"):
        Figure(1).panels[0].plot([0, 1], [1], label="a")
    with pytest.raises(ValueError, match="line style '~'"):
        Figure(1).panels[0].plot([0], [1], dash="~")


def test_the_stream_report_reads_the_records_the_stream_protocol_writes():
    assert stream_report.KIND == stream.KIND  # the report keeps its own copy: stream imports torch
