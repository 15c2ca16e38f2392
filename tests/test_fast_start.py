"""Commands that only print or read files start fast: ``--help`` of every command, ``inspect``,
``report`` and ``control recipes`` import neither torch nor MuJoCo (each costs seconds of CPU);
``control recipes`` is a one-line-per-recipe table, ``--explain`` its prose.

Each command runs in a fresh interpreter (this process has torch loaded already), which
reports the heavy modules present after the command's work.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpdyn.cli import build_parser, main
from gpdyn.recipes import DEFAULT_RECIPES, all_recipes, recipe_names

HEAVY = ("torch", "mujoco")
# runs each command line of argv[1] (a JSON list) through gpdyn.cli.main in turn and prints,
# as its last line, each one's exit status and the heavy modules loaded by the end of it
PROBE = f"""
import json, sys
from gpdyn.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    code = main(argv)
    results.append({{"argv": argv, "code": code, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}})
print(json.dumps(results))
"""


def _probe(argvs: list[list[str]], cwd: Path) -> list[dict]:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], capture_output=True, text=True, cwd=cwd,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand of the parser tree, as the words that name it."""
    paths = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                paths += _command_paths(child, (*path, name))
    return paths


def test_help_of_every_command_imports_neither_torch_nor_mujoco(tmp_path):
    argvs = [[*path, "--help"] for path in _command_paths(build_parser())]
    assert len(argvs) > 20  # gpdyn, its commands and their subcommands
    for result in _probe(argvs, tmp_path):
        assert result["code"] == 0, result
        assert result["heavy"] == [], f"gpdyn {' '.join(result['argv'])} imported {result['heavy']}"


@pytest.fixture
def replay_run(kuka_store, tmp_path) -> Path:
    """A finished replay run folder of one small learner."""
    from gpdyn.data.problems import load_problem
    from gpdyn.experiments.replay import ReplayConfig, open_run, replay

    cfg = ReplayConfig(store=str(kuka_store.path), problem="kuka", learners=["svi"], iterations=2, batch_size=16,
                       eval_every=1, seed=0, sizes={"svi": {"m": 8}})
    problem = load_problem(cfg.store, cfg.problem, protocol=cfg.protocol, seed=cfg.seed)
    run = open_run(cfg, tmp_path / "replay", problem)
    replay(cfg, run, problem=problem, progress=False)
    run.close()
    return run.path


@pytest.mark.parametrize("command", ["inspect store", "inspect run", "report", "control recipes",
                                     "control recipes NAME --explain"])
@pytest.mark.slow
def test_reading_commands_import_neither_torch_nor_mujoco(command, request, tmp_path):
    if command == "inspect store":
        store = request.getfixturevalue("kuka_store")
        store.close()
        argv = ["inspect", str(store.path)]
    elif command in ("inspect run", "report"):
        argv = [command.split()[0], str(request.getfixturevalue("replay_run"))]
    else:
        argv = ["control", "recipes", *(["walker-weak-motor", "--explain"] if "--explain" in command else [])]
    [result] = _probe([argv], tmp_path)
    assert result["code"] == 0 and result["heavy"] == [], result


def test_control_recipes_prints_one_line_per_recipe_with_its_main_settings(capsys):
    assert main(["control", "recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = recipe_names()
    rows = [line for line in lines if line.split(" ", 1)[0] in names]
    assert [row.split(" ", 1)[0] for row in rows] == names and lines[0].split()[:2] == ["NAME", "ROBOT"]
    for recipe, row in zip(all_recipes(), rows):
        assert f" {recipe.robot} " in row and recipe.title in row
        assert (f"{recipe.name} *" in row) == (DEFAULT_RECIPES.get(recipe.robot) == recipe.name)
        assert recipe.description[:40] not in row  # the prose is --explain's
    weak_motor = rows[names.index("walker-weak-motor")]
    for setting in ("learner=svdgp", "cost=track", "horizon=1", "change=weak_motor", "change_factor=0.3", "steps=300"):
        assert setting in weak_motor.split()
    assert "seeds=108,...,115 (8)" in rows[names.index("walker-true-model-walk")]
    assert len(lines) < 2 * len(names) + 6  # a table and a short footer, no paragraphs


def test_control_recipes_explain_prints_the_prose_of_the_recipes_named(capsys):
    assert main(["control", "recipes", "kuka-payload", "--explain"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    kuka = next(r for r in all_recipes() if r.name == "kuka-payload")
    assert "kuka-payload [kuka] (the default)" in out and kuka.description[:80] in out and kuka.use in out
    assert "walker-weak-motor" not in out


def test_control_recipes_checks_a_users_file_in_full(tmp_path, capsys):
    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\nrobot = "walker"\ntitle = "t"\ndescription = "d"\nuse = "u"\nresult = "r"\n'
                    "[config]\nsamples = 1\n")
    assert main(["control", "recipes", str(path)]) == 2
    assert "[config] samples" in capsys.readouterr().err
    path.write_text(path.read_text().replace("samples = 1", "samples = 8"))
    assert main(["control", "recipes", str(path)]) == 0
    assert "samples=8" in capsys.readouterr().out
