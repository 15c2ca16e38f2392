"""Conventions of the ``gpdyn`` command line: every option explains itself and states its effective
default, the usage lines name every option, and a command that fails on bad input leaves no run
folder behind."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gpdyn.cli import build_parser, main
from gpdyn.cli.collect import IMPORT_UNITS
from gpdyn.config import DTYPE_NAMES, FAMILY_NAMES, LEARNER_NAMES, LEGGED_TASKS, PRESET_NAMES, PROBLEM_NAMES, PROTOCOL_NAMES
from gpdyn.config import flat, leaves
from gpdyn.runs import RunDir, discard_empty_new_runs

ROOT = Path(__file__).resolve().parents[1]


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """``(words, parser)`` of gpdyn and of every command and subcommand."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, (*path, name))


def _shown(value) -> list[str]:
    """The ways a help text may write ``value``."""
    if isinstance(value, (list, tuple)):
        return [",".join(str(v) for v in value)]
    if isinstance(value, float):
        return [f"{value:g}", str(value)]
    return [str(value)]


def test_every_option_has_help_that_states_its_default():
    missing, silent = [], []
    for path, parser in _parsers(build_parser()):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            where = f"gpdyn {' '.join(path)} {'/'.join(action.option_strings) or action.dest}"
            if not action.help:
                missing.append(where)
                continue
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{where} {a.dest}" for a in action._choices_actions if not a.help]
            if action.help == argparse.SUPPRESS:
                continue
            text = formatter._expand_help(action)
            default = action.default
            if default is None or default is False or default is argparse.SUPPRESS or default == []:
                continue
            flag = action.nargs == 0  # a switch: its default is its absence, said in words
            if "default" not in text or not (flag or any(s in text for s in _shown(default))):
                silent.append(f"{where} (default {default!r}): {text}")
    assert not missing, f"options without help: {missing}"
    assert not silent, "options whose help does not state their default:\n" + "\n".join(silent)


@pytest.mark.parametrize("columns", [50, 80, 160])
def test_usage_lines_name_every_option(columns, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(columns))
    for path, parser in _parsers(build_parser()):
        usage = parser.format_usage()
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
                continue
            names = action.option_strings or [action.metavar or action.dest]
            assert any(name in usage for name in names), f"gpdyn {' '.join(path)}: {names} not in {usage}"


def test_the_names_help_lists_are_the_registries():
    for names in (LEARNER_NAMES, PROBLEM_NAMES, PRESET_NAMES, PROTOCOL_NAMES, DTYPE_NAMES, FAMILY_NAMES, IMPORT_UNITS,
                  LEGGED_TASKS):
        # the problems' registry fills in the order the tasks were first loaded, which earlier tests vary
        assert sorted(names) == sorted(names.registry), f"{names.module}.{names.attr}"


@pytest.fixture
def control_runs(monkeypatch, tmp_path):
    """The config each ``gpdyn control ROBOT`` command builds with no option given, without running it."""
    import gpdyn.experiments.control_arm as arm
    import gpdyn.experiments.control_legged as walker

    seen = {}
    monkeypatch.setattr(walker, "run_legged", lambda run, cfg, store=None: seen.setdefault(cfg.task, cfg) and {
        "report": str(run.path / "report.md")})
    monkeypatch.setattr(arm, "run_arm", lambda run, cfg, store=None: seen.setdefault(cfg.robot, cfg) and {
        "report": str(run.path / "report.md")})
    model = ["--model", str(ROOT / "tests" / "data" / "three_link_arm.xml")]
    for robot, extra in (("walker", []), ("hopper", []), ("kuka", []), ("arm", model)):
        assert main(["control", robot, *extra, "--out", str(tmp_path / robot)]) == 0
    return seen


@pytest.mark.parametrize("robot", ["walker", "hopper", "kuka", "arm"])
def test_control_help_states_the_default_the_command_runs(robot, control_runs):
    cfg = control_runs[robot]
    parser = dict(_parsers(build_parser()))[("control", robot)]
    formatter = parser._get_formatter()
    settings, known = flat(cfg), leaves(type(cfg))
    stated = 0
    for action in parser._actions:
        # the arm's file options (--model, --joints, ...) are the collectors' and say their default in words
        if action.dest not in settings or not known[action.dest].meta["cli"] or action.dest == "device":
            continue
        assert hasattr(action, "effective"), f"control {robot} {action.option_strings}: no effective default"
        value = settings[action.dest]
        said = str(action.effective)
        if value is None:
            assert said.startswith(known[action.dest].meta["none_means"])
        elif isinstance(value, bool):
            assert said.split(",")[0] == ("on" if value else "off"), (action.dest, said)
        else:
            assert said.split(", from recipe")[0] in _shown(value), (action.dest, said, value)
        assert said in formatter._expand_help(action)
        stated += 1
    assert stated >= {"walker": 30, "hopper": 30, "kuka": 15, "arm": 15}[robot]
    recipe = str(next(a for a in parser._actions if a.dest == "recipe").effective)
    assert recipe == {"walker": "walker-weak-motor", "hopper": "hopper-weak-motor", "kuka": "kuka-payload"}.get(robot, recipe)


# --- failed commands leave no run folder --------------------------------------------


def test_a_control_run_on_a_store_it_cannot_use_leaves_no_folder(kuka_store, tmp_path, capsys):
    kuka_store.close()
    # the walker reads the store only after making its run folder; a missing store is refused before
    assert main(["control", "walker", "--store", str(kuka_store.path), "--steps", "2"]) == 2
    assert main(["control", "kuka", "--store", str(tmp_path / "missing.zarr"), "--steps", "4"]) == 2
    err = capsys.readouterr().err
    assert "needs field 'qpos'" in err and "missing.zarr does not exist" in err and "removed the run folder" in err
    assert not (tmp_path / "logs").exists()


def test_a_replay_whose_learner_refuses_an_option_leaves_no_folder(kuka_store, tmp_path, capsys):
    kuka_store.close()
    (tmp_path / "logs" / "earlier-run").mkdir(parents=True)
    argv = ["replay", "--store", str(kuka_store.path), "--problem", "kuka", "--learners", "svi", "--iterations", "2",
            "--size", "svi.no_such_option=1"]
    assert main(argv) == 2
    assert "no option 'no_such_option'" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "logs").iterdir()] == ["earlier-run"]  # logs/ gained nothing
    assert main([*argv, "--out", str(tmp_path / "a" / "b")]) == 2
    assert not (tmp_path / "a").exists()  # nor the parents made for --out
    (tmp_path / "empty").mkdir()
    assert main([*argv, "--out", str(tmp_path / "empty")]) == 2
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())  # it was there: it stays


def test_only_a_bare_folder_made_inside_the_block_goes(tmp_path):
    before = RunDir.create("before", {}, out=tmp_path / "before")  # made outside: never touched
    with pytest.raises(ValueError), discard_empty_new_runs() as removed:
        bare = RunDir.create("bare", {"x": 1}, out=tmp_path / "bare")
        (bare.path / "checkpoints").mkdir()  # an empty folder is no output
        worked = RunDir.create("worked", {}, out=tmp_path / "worked")
        worked.log(step=1)
        raise ValueError("bad input")
    assert removed == [tmp_path / "bare"] and not (tmp_path / "bare").exists()
    assert json.loads((tmp_path / "worked" / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1
    assert (tmp_path / "before" / "config.json").is_file()
    before.close()
    with discard_empty_new_runs() as removed:  # a block that succeeds keeps its folders
        RunDir.create("fine", {}, out=tmp_path / "fine")
    assert removed == [] and (tmp_path / "fine" / "config.json").is_file()
