"""`gpdyn report RUN` on every kind of run folder: learn (iid, stream), replay (ordered, stream), control walker,
kuka and arm.

Each folder is made by the real command at its smallest settings; the report is then rewritten from the folder
alone. A control report rewritten from its folder is the one the run wrote; every report is the same when it is
written twice.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
from synthetic import make_kuka_store, make_walker_store

from gpdyn.cli import main
from gpdyn.runs import RunDir

THREE_LINK = Path(__file__).parent / "data" / "three_link_arm.xml"
WALKER_TINY = ["--learner", "svdgp", "--samples", "8", "--sim-samples", "4", "--horizon", "3",
               "--pretrain-iterations", "3"]
# the report files of each kind: sections of report.md and its plots
EXPECTED = {
    "learn": (["# svi on kuka (iid protocol), iteration 4", "| output | nMSE |", "| mean ± std |", "## Sizes",
               "## Curves"], ["nmse", "vlb", "nll", "coverage"]),
    "replay": (["# Replay: kuka (ordered protocol)", "## Table 2 layout", "## Appendix C layout", "## Curves"],
               ["nmse", "vlb", "nll", "coverage"]),
    "learn_stream": (["# Stream (prequential): kuka", "## nMSE per output", "## Curves"],
                     ["stream_nmse", "stream_calibration"]),
    "replay_stream": (["# Stream (prequential): kuka", "| svi | 280 |", "| rls | 280 |", "## Curves"],
                      ["stream_nmse", "stream_calibration"]),
    "walker": (["# walker online control", "## Returns", "## Distance and falls",
                "## CPU time per control step (the period is 8 ms)", "## Model one-step error", "## Plots"],
               ["walker_return", "walker_distance", "walker_episode_returns", "walker_model_error", "walker_cpu"]),
    "kuka": (["# kuka_iiwa.xml computed-torque tracking (7 joints)", "## Tracking RMSE per joint",
              "## Feed-forward error against the plant's inverse dynamics",
              "## CPU time per control step (the period is 10 ms)", "## Plots"],
             ["kuka_tracking", "kuka_ff_error", "kuka_cpu"]),
    "arm": (["# three_link_arm.xml computed-torque tracking (3 joints)", "## Tracking RMSE per joint",
             "## CPU time per control step (the period is 10 ms)", "## Plots"], ["arm_tracking", "arm_cpu"]),
}


def _made(code: int, out: Path) -> Path:
    assert code == 0 and (out / "report.md").is_file()
    return out


# ------------------------------------------------------------------------------------------ run folders
@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reports")


@pytest.fixture(scope="module")
def kuka_zarr(root: Path) -> Path:
    return make_kuka_store(root / "kuka.zarr", offline=[50], online=[80, 70]).path


@pytest.fixture(scope="module")
def stream_zarr(root: Path) -> Path:
    make_kuka_store(root / "stream.zarr", offline=[], online=[150, 130]).close()
    return root / "stream.zarr"


def _protocol(store: Path) -> list[str]:
    return ["--store", str(store), "--problem", "kuka", "--iterations", "4", "--batch-size", "32", "--eval-every", "2",
            "--n-delta", "8"]


def _stream(store: Path) -> list[str]:
    return ["--store", str(store), "--problem", "kuka", "--protocol", "stream", "--preset", "small", "--init-rows", "64",
            "--chunk", "32", "--warm-rows", "96"]


@pytest.fixture(scope="module")
def learn(root: Path, kuka_zarr: Path) -> Path:
    out = root / "learn"
    return _made(main(["learn", *_protocol(kuka_zarr), "--learner", "svi", "--size", "m=16", "--out", str(out)]), out)


@pytest.fixture(scope="module")
def replay(root: Path, kuka_zarr: Path) -> Path:
    out = root / "replay"
    return _made(main(["replay", *_protocol(kuka_zarr), "--protocol", "ordered", "--init-iterations", "2",
                       "--learners", "svi,svdgp", "--size", "svi.m=16", "--size", "svdgp.m_alpha=32",
                       "--size", "svdgp.m_beta=4", "--out", str(out)]), out)


@pytest.fixture(scope="module")
def learn_stream(root: Path, stream_zarr: Path) -> Path:
    out = root / "learn-stream"
    return _made(main(["learn", *_stream(stream_zarr), "--learner", "svi", "--out", str(out)]), out)


@pytest.fixture(scope="module")
def replay_stream(root: Path, stream_zarr: Path) -> Path:
    out = root / "replay-stream"
    return _made(main(["replay", *_stream(stream_zarr), "--learners", "svi,rls", "--out", str(out)]), out)


@pytest.fixture(scope="module")
def walker_zarr(root: Path) -> Path:
    make_walker_store(root / "walker.zarr", [40, 35, 50])
    return root / "walker.zarr"


@pytest.fixture(scope="module")
def walker(root: Path, walker_zarr: Path) -> Path:
    out = root / "walker"
    return _made(main(["control", "walker", "--store", str(walker_zarr), *WALKER_TINY, "--steps", "3", "--episodes", "2",
                       "--change-at", "1", "--controllers", "trpo,frozen,online", "--conditions", "nominal,changed",
                       "--out", str(out)]), out)


@pytest.fixture(scope="module")
def kuka(root: Path, kuka_zarr: Path) -> Path:
    out = root / "kuka"
    return _made(main(["control", "kuka", "--store", str(kuka_zarr), "--learner", "svdgp", "--steps", "6",
                       "--pretrain-iterations", "3", "--out", str(out)]), out)


@pytest.fixture(scope="module")
def arm(root: Path) -> Path:
    out = root / "arm"  # no learner: PD alone and the arm's own inverse dynamics
    return _made(main(["control", "arm", "--model", str(THREE_LINK), "--controllers", "pd,true", "--steps", "6",
                       "--out", str(out)]), out)


# ------------------------------------------------------------------------------------------------ tests
def _outputs(folder: Path) -> dict[str, bytes]:
    """Every file a report writes: report.md, the plots, the CSV files."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix in (".md", ".svg", ".csv")}


def _curves_drawn(plot: Path) -> int:
    """The curves (paths through two points or more: not the frame, ticks or reference lines) in an SVG plot,
    which must parse."""
    root = ElementTree.parse(plot).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg", plot
    return sum(1 for e in root.iter("{http://www.w3.org/2000/svg}path") if "L" in e.get("d", ""))


@pytest.mark.parametrize("kind", list(EXPECTED))
@pytest.mark.slow
def test_every_run_folder_reports_its_sections_and_plots_the_same_twice(kind, request, capsys) -> None:
    folder: Path = request.getfixturevalue(kind)
    assert main(["report", str(folder)]) == 0
    assert f"gpdyn report: wrote {folder / 'report.md'}" in capsys.readouterr().out
    report = (folder / "report.md").read_text()
    sections, plots = EXPECTED[kind]
    for section in sections:
        assert section in report, section
    linked = re.findall(r"!\[([^\]]+)\]\(([^)]+)\)", report)
    assert [stem for stem, _ in linked] == plots
    for _, name in linked:
        assert _curves_drawn(folder / name) > 0, name
    first = _outputs(folder)
    assert main(["report", str(folder)]) == 0
    assert _outputs(folder) == first  # deterministic: the same report, plots and CSV files


@pytest.mark.parametrize("kind", ["walker", "kuka", "arm"])
@pytest.mark.slow
def test_a_control_report_rewritten_from_its_folder_is_the_one_the_run_wrote(kind, request, tmp_path) -> None:
    folder: Path = request.getfixturevalue(kind)
    copy = shutil.copytree(folder, tmp_path / kind)
    written = _outputs(copy)
    for name in written:  # nothing of the run's report is left to reuse
        (copy / name).unlink()
    assert main(["report", str(copy)]) == 0
    assert _outputs(copy) == written


@pytest.mark.slow
def test_reporting_a_learn_or_control_folder_imports_neither_torch_nor_mujoco(learn, walker, kuka, arm, tmp_path) -> None:
    """In a fresh interpreter (this one has both loaded): they take seconds of CPU that a report does not need."""
    probe = ("import json, sys\nfrom gpdyn.cli import main\n"
             "codes = [main(['report', path]) for path in json.loads(sys.argv[1])]\n"
             "print(json.dumps([codes, [m for m in ('torch', 'mujoco') if m in sys.modules]]))")
    folders = [str(shutil.copytree(f, tmp_path / f.name)) for f in (learn, walker, kuka, arm)]
    done = subprocess.run([sys.executable, "-c", probe, json.dumps(folders)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [[0, 0, 0, 0], []]


@pytest.mark.slow
def test_walker_steps_record_the_torso_position_and_the_report_counts_falls(walker_zarr, tmp_path) -> None:
    """A torso three times heavier brings the TRPO walker down within its 130 steps."""
    out = tmp_path / "fall"
    assert main(["control", "walker", "--store", str(walker_zarr), "--controllers", "trpo", "--conditions",
                 "nominal,changed", "--episodes", "1", "--change", "torso_mass", "--change-factor", "3", "--steps", "130",
                 "--out", str(out)]) == 0
    records = RunDir(out).metrics()
    lengths = {e["condition"]: e["length"] for e in records if e.get("kind") == "episode"}
    assert lengths["nominal"] == 130 and lengths["changed"] < 130
    steps = [r for r in records if r.get("kind") == "step" and r["condition"] == "nominal"]
    x = [r["x_position"] for r in steps]
    assert len(x) == 130 and x[-1] > x[0] + 0.5  # the TRPO policy walks forwards on the nominal plant
    assert main(["report", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert f"| trpo | nominal | 1 | 0 | {x[-1]:.2f} |" in report
    assert re.search(r"\| trpo \| changed \| 1 \| 1 \| \d", report)
    assert f"({lengths['changed']} steps)" in report  # the returns table gives the length of the episode that fell
    assert _curves_drawn(out / "walker_distance.svg") > 0


def test_a_stopped_control_run_reports_the_controllers_it_finished(kuka, tmp_path) -> None:
    copy = shutil.copytree(kuka, tmp_path / "stopped")
    lines = (copy / "metrics.jsonl").read_text().splitlines(keepends=True)
    tracking = [i for i, line in enumerate(lines) if json.loads(line).get("kind") == "tracking"]
    # stopped in the third controller's episode, as a killed run leaves its records
    (copy / "metrics.jsonl").write_text("".join(lines[: tracking[1] + 4]))
    assert main(["report", str(copy)]) == 0
    report = (copy / "report.md").read_text()
    assert "**Unfinished run: 2 of 4 episodes recorded (one per controller)" in report
    assert "| true | after |" in report and "| frozen | after |" not in report


@pytest.mark.parametrize("damage, message", [
    (lambda f: _edit_config(f, steps=None), "config.json: no 'steps'"),
    (lambda f: _edit_config(f, rate_hz="fast"), "config.json: 'rate_hz' must be a finite number > 0, is 'fast'"),
    (lambda f: _edit_record(f, "step", cpu_ms="slow"), "metrics.jsonl: line 1: step record: 'cpu_ms' must be a number"),
    (lambda f: _edit_record(f, "episode", length=None), "metrics.jsonl: line 7: episode record without 'length'"),
], ids=["config-without-steps", "config-rate-text", "step-cpu-text", "episode-without-length"])
def test_a_damaged_control_folder_is_refused_naming_the_file_and_field(arm, tmp_path, capsys, damage, message) -> None:
    copy = shutil.copytree(arm, tmp_path / "damaged")
    damage(copy)
    assert main(["report", str(copy)]) == 2
    assert message in capsys.readouterr().err


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            del config[key]
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


def _edit_record(folder: Path, kind: str, **changes) -> None:
    """Change the first record of ``kind`` (None: drop the field)."""
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in records if r.get("kind") == kind)
    for key, value in changes.items():
        if value is None:
            del first[key]
        else:
            first[key] = value
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_folders_without_a_report_say_what_they_hold(arm, root, tmp_path, capsys) -> None:
    collect = tmp_path / "collect"
    assert main(["collect", "arm", "--model", str(THREE_LINK), "--store", str(tmp_path / "s.zarr"), "--offline", "50",
                 "--online", "50", "--out", str(collect)]) == 0
    capsys.readouterr()
    assert main(["report", str(collect)]) == 2
    assert "a collect-arm run has no report" in capsys.readouterr().err
    demo = RunDir.create("demo", {"seed": 0}, out=tmp_path / "demo")  # a demo's stages are run folders inside it
    demo.close()
    shutil.copytree(arm, demo.path / "control")
    assert main(["report", str(demo.path)]) == 2
    assert f"a demo folder, whose stages are run folders of their own: gpdyn report {demo.path / 'control'}" in (
        capsys.readouterr().err)


def test_what_reports_know_of_the_robots_without_importing_them_is_the_robots() -> None:
    from gpdyn.experiments.control_report import KUKA_FILE, LEGGED_PERIOD_S
    from gpdyn.robots.kuka import model_path
    from gpdyn.robots.walker import DT

    assert LEGGED_PERIOD_S == DT and KUKA_FILE == model_path().name
