"""The gpdyn command: --help everywhere, inspect, doctor, clear errors."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpdyn.cli import build_parser, main
from gpdyn.errors import InputError
from gpdyn.runs import RunDir

DESIGN_COMMANDS = [
    "demo", "collect walker", "collect kuka", "import kuka-ilgr", "import sarcos", "inspect", "learn",
    "replay", "control walker", "control kuka", "bench learners", "bench wiski", "bench mpc", "report", "render", "doctor",
]


def _leaf_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [prefix]
    return [leaf for name, p in subs[0].choices.items() for leaf in _leaf_commands(p, prefix + (name,))]


def test_every_design_subcommand_exists():
    leaves = {" ".join(c) for c in _leaf_commands(build_parser())}
    assert leaves >= set(DESIGN_COMMANDS)


@pytest.mark.parametrize("command", [" ".join(c) for c in _leaf_commands(build_parser())])
def test_help_of_every_subcommand(command, capsys):
    assert main([*command.split(), "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: gpdyn " + command)


def test_group_help_lists_its_subcommands(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per command
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    groups: dict[str, set[str]] = {}
    for leaf in _leaf_commands(build_parser()):
        if len(leaf) == 2:
            groups.setdefault(leaf[0], set()).add(leaf[1])
    assert set(groups) >= {"collect", "import", "control", "bench"}
    for group, names in groups.items():
        line = next(line for line in out.splitlines() if line.split()[:1] == [group])
        listed = line[line.rindex("(") + 1 : line.rindex(")")]
        assert set(listed.split(", ")) == names, line


def test_names_come_from_the_registries(capsys):
    from gpdyn.robots.tasks import PROBLEMS  # the registry with the legged tasks' problems registered (PROBLEM_NAMES's home)
    from gpdyn.gp import LEARNERS

    from gpdyn.config import LEARNER_NAMES, PROBLEM_NAMES

    # the problems register in the order their tasks are first imported (another test may import the hopper
    # first): the copy lists the same names in its own order, which the help shows
    assert tuple(LEARNER_NAMES) == tuple(LEARNERS) and sorted(PROBLEM_NAMES) == sorted(PROBLEMS)
    assert main(["learn", "--store", "s.zarr", "--problem", "walker-1", "--learner", "nope"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nope'" in err and all(repr(name) in err for name in LEARNERS)
    assert main(["learn", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ", ".join(LEARNERS) in out and ", ".join(PROBLEM_NAMES) in out
    assert main(["replay", "--store", "s.zarr", "--problem", "kuka", "--learners", "svdgp,nope"]) == 2
    assert "unknown learner(s) ['nope']" in capsys.readouterr().err


def test_the_parser_imports_no_stage():
    # --help and argument errors stay fast: torch, numpy and MuJoCo load only when a job runs
    code = "import sys, gpdyn.cli; gpdyn.cli.build_parser(); print(sorted({'torch', 'numpy', 'mujoco', 'zarr'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_inspect_store_and_run_folder(walker_store, tmp_path, capsys):
    assert main(["inspect", str(walker_store.path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 5 and summary["rows"] == 140 and "qvel" in summary["fields"]
    run = RunDir.create("unit", {"x": 1}, out=tmp_path / "run")
    run.log(step=1, loss=0.5)
    assert main(["inspect", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "metric_records: 1" in out and "job: unit" in out


def test_bad_paths_exit_2_with_a_clear_message(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "missing.zarr")]) == 2
    err = capsys.readouterr().err
    assert "missing.zarr" in err and "no such file" in err
    (tmp_path / "empty").mkdir()
    assert main(["inspect", str(tmp_path / "empty")]) == 2
    assert "neither an episode store" in capsys.readouterr().err


def test_corrupt_store_exits_2_naming_the_field(walker_store, capsys):
    shutil.rmtree(Path(walker_store.path) / "data" / "qvel")
    assert main(["inspect", str(walker_store.path)]) == 2
    assert "data/qvel" in capsys.readouterr().err


@pytest.mark.slow
def test_console_script_and_doctor():
    exe = Path(sys.executable).parent / "gpdyn"
    result = subprocess.run([str(exe), "doctor", "--deep"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "torch threads  1" in result.stdout and "Walker2d-v5    ok" in result.stdout


def test_run_folder_layout(tmp_path):
    run = RunDir.create("job", {"seed": 3, "path": tmp_path}, logs=tmp_path / "logs")
    assert run.path.parent == tmp_path / "logs" and run.path.name.startswith("job-")
    run.log(iteration=1, nmse=[0.1, 0.2])
    run.log(iteration=2, nmse=[0.05, 0.1])
    assert run.config() == {"job": "job", "seed": 3, "path": str(tmp_path)}
    assert [m["iteration"] for m in run.metrics()] == [1, 2]
    other = RunDir.create("job", {}, logs=tmp_path / "logs")
    assert other.path != run.path
    with pytest.raises(InputError, match="choose another --out"):
        RunDir.create("job", {}, out=run.path)  # would mix two runs' metrics
    assert [m["iteration"] for m in run.metrics()] == [1, 2]


def test_learner_options_are_checked_by_name_and_kind():
    from gpdyn.gp import LearnerError, make_learner

    with pytest.raises(LearnerError, match="no option 'm_alfa'"):
        make_learner("svdgp", 3, 2, m_alfa=64)
    with pytest.raises(LearnerError, match="'m_alpha' takes a number"):
        make_learner("svdgp", 3, 2, m_alpha="abc")
    assert make_learner("svdgp", 3, 2, m_alpha=16, m_beta=4, n_columns=None).config["n_columns"] is None


@pytest.mark.slow
def test_learn_takes_a_preset_and_sizes_over_it(walker_store, tmp_path):
    from gpdyn.gp import learner_class

    out = tmp_path / "run"
    argv = ["learn", "--store", str(walker_store.path), "--problem", "walker-1", "--learner", "svdgp", "--iterations", "2",
            "--batch-size", "16", "--n-delta", "4", "--eval-every", "2", "--preset", "small", "--size", "m_beta=4",
            "--out", str(out)]
    assert main(argv) == 0
    run_config = json.loads((out / "config.json").read_text())
    config = run_config["learner_config"]
    # the preset's basis, capped at the training rows
    rows = run_config["problem"]["train"]
    assert config["preset"] == "small" and config["m_alpha"] == min(learner_class("svdgp").presets["small"]["m_alpha"], rows)
    assert config["m_beta"] == 4 and config["n_delta"] == 4
    assert main([*argv[:-2], "--preset", "huge", "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()


def test_size_values_read_numbers_switches_and_none():
    from gpdyn.cli.jobs import learner_size_option, size_option

    assert size_option("m_alpha=4096") == ("m_alpha", 4096) and size_option("lr=0.1") == ("lr", 0.1)
    # "false" is a switch turned off, never the text "false" (which Python reads as True)
    assert size_option("jacobi=false") == ("jacobi", False) and size_option("jacobi=True") == ("jacobi", True)
    assert size_option("n_columns=none") == ("n_columns", None)
    assert learner_size_option("svdgp.jacobi=false") == ("svdgp", "jacobi", False)
