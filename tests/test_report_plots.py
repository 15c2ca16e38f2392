"""``gpdyn report`` draws a plot only when it is missing or older than the run's records
(drawing is most of a report's CPU time), and every plot with ``--redraw``; a report whose
plots are up to date imports no matplotlib.

The run folder is written by hand: a replay run's ``config.json`` and two learners'
evaluation records, the format :mod:`gpdyn.experiments.report` reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpdyn.cli import main
from gpdyn.experiments import stream, stream_report

PLOTS = ("nmse.png", "vlb.png")


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
    (run / "vlb.png").unlink()
    assert main(["report", str(run)]) == 0
    assert (run / "vlb.png").is_file() and _mtimes(run)["nmse.png"] == drawn["nmse.png"]
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


def test_a_report_whose_plots_are_up_to_date_imports_no_matplotlib(run):
    _age(run, 10)
    probe = ("import json, sys\nfrom gpdyn.cli import main\ncodes = [main(['report', sys.argv[1]]) for _ in range(2)]\n"
             "print(json.dumps([codes, sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'torch', "
             "'mujoco', 'zarr'})]))")
    done = subprocess.run([sys.executable, "-c", probe, str(run)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [[0, 0], ["matplotlib"]]  # the first drew them
    done = subprocess.run([sys.executable, "-c", probe, str(run)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [[0, 0], []]


def test_the_stream_report_reads_the_records_the_stream_protocol_writes():
    assert stream_report.KIND == stream.KIND  # the report keeps its own copy: stream imports torch
