"""The spline sampler's recipes (walker-sampling, walker-learned) run from the walker's command line options
(gpdyn/cli/control_sampling.py): the options fit the walker's parser, and a run writes its folder."""

from __future__ import annotations

import argparse
import json

import pytest

from gpdyn.cli import build_parser
from gpdyn.cli.control_sampling import (LEARNED_MODELS, SAMPLING_KINDS, add_sampling_options, is_sampling_recipe,
                                        parse_changes, run_sampling_recipe)
from gpdyn.errors import InputError
from gpdyn.recipes import KINDS, RUNNERS, recipe_names


def _walker_parser() -> argparse.ArgumentParser:
    """``gpdyn control walker``'s parser with the sampling options added, as the command wires them."""
    control = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["control"]
    walker = next(a for a in control._actions if isinstance(a, argparse._SubParsersAction)).choices["walker"]
    if "--seeds" not in walker._option_string_actions:
        add_sampling_options(walker)  # argparse refuses an option string the walker already has
    return walker


def _args(*words: str) -> argparse.Namespace:
    args = _walker_parser().parse_args(list(words))
    args.device = "cpu"  # as gpdyn.cli.main resolves it
    return args


def test_the_kinds_are_the_recipe_kinds_and_the_models_the_experiments():
    from gpdyn.experiments.walk_learned_model import MODELS

    assert set(SAMPLING_KINDS) <= set(KINDS) and LEARNED_MODELS == MODELS
    assert {RUNNERS[k] for k in SAMPLING_KINDS} == {"gpdyn control walker"}
    assert {n for n in recipe_names() if is_sampling_recipe(n)} == {n for k in SAMPLING_KINDS for n in recipe_names(k)}
    assert not is_sampling_recipe("walker-weak-motor")


def test_a_walker_sampling_recipe_runs_with_options_over_it(tmp_path, capsys):
    args = _args("--recipe", "walker-true-model-walk", "--seeds", "5", "--steps", "2", "--samples", "4",
                 "--out", str(tmp_path / "w"))
    assert run_sampling_recipe(args.recipe, args) == 0
    config = json.loads((tmp_path / "w" / "config.json").read_text())
    recipe = json.loads((tmp_path / "w" / "recipe.json").read_text())
    assert recipe["name"] == "walker-true-model-walk" and recipe["options_given"] == {"seeds": [5], "steps": 2,
                                                                                      "samples": 4}
    assert config["seeds"] == [5] and config["steps"] == 2 and config["sampler"]["samples"] == 4
    assert config["sampler"]["knots"] == recipe["values"]["sampler"]["knots"] and config["cost"] == recipe["values"]["cost"]
    assert "| 5 | 2 |" in (tmp_path / "w" / "report.md").read_text()
    assert "gpdyn control walker: recipe walker-true-model-walk" in capsys.readouterr().out


def test_a_walker_learned_recipe_runs_and_combines(tmp_path, capsys):
    args = _args("--recipe", "walker-learned-hip", "--seeds", "5", "--steps", "2", "--controllers", "frozen",
                 "--eval-every", "0", "--learned-window", "50", "--changes", "weak_motor:0.5", "--out", str(tmp_path / "w"))
    assert run_sampling_recipe(args.recipe, args) == 0
    config = json.loads((tmp_path / "w" / "config.json").read_text())
    recipe = json.loads((tmp_path / "w" / "recipe.json").read_text())
    assert recipe["options_given"]["learned_window"] == 50 and config["residual"]["window"] == 50
    assert config["seeds"] == [5] and config["controllers"] == ["frozen"] and config["changes"] == ["weak_motor:0.5"]
    assert config["model"] == "residual" == recipe["values"]["run"]["model"]
    capsys.readouterr()
    combined = _args("--recipe", "walker-learned-hip", "--combine", f"{tmp_path / 'w'}@renamed")
    assert run_sampling_recipe(combined.recipe, combined) == 0
    assert "| right hip motor strength x0.5 | frozen | 5 | 2 |" in capsys.readouterr().out  # the per-seed row


@pytest.mark.parametrize(("recipe", "words", "named"), [
    ("walker-true-model-walk", ("--planner", "cem"), "--planner"),  # a legged MPC option
    ("walker-true-model-walk", ("--changes", "torso_mass"), "--changes"),  # walker-learned's
    ("walker-true-model-walk", ("--controllers", "frozen"), "--controllers"),
    ("walker-learned-hip", ("--learner", "exact"), "--learner"),
])
def test_an_option_the_recipe_does_not_take_is_refused_by_name_before_any_run(tmp_path, recipe, words, named):
    args = _args("--recipe", recipe, *words, "--out", str(tmp_path / "x"))
    with pytest.raises(InputError, match=f"^{named} does not apply to a walker-"):
        run_sampling_recipe(args.recipe, args)
    assert not (tmp_path / "x").exists()


def test_bad_values_are_refused_before_any_run(tmp_path):
    with pytest.raises(InputError, match="not one of walker-sampling, walker-learned"):
        run_sampling_recipe("walker-weak-motor", _args("--out", str(tmp_path / "x")))
    args = _args("--recipe", "walker-learned-hip", "--changes", "gravity", "--out", str(tmp_path / "x"))
    with pytest.raises(InputError, match="gravity"):
        run_sampling_recipe(args.recipe, args)
    with pytest.raises(InputError, match="factor of 'weak_motor' must be a number"):
        parse_changes("weak_motor:strong")
    args = _args("--recipe", "walker-true-model-walk", "--out", str(tmp_path / "x"))
    args.device = "cuda:0"
    with pytest.raises(InputError, match="plans on the CPU"):
        run_sampling_recipe(args.recipe, args)
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit):
        _args("--recipe", "walker-learned-hip", "--learned-model", "gp")


def test_the_walker_command_runs_a_sampling_recipe_and_refuses_its_mpc_options(tmp_path, capsys):
    from gpdyn.cli import main

    assert main(["control", "walker", "--recipe", "walker-true-model-walk", "--seeds", "5", "--steps", "2",
                 "--samples", "4", "--out", str(tmp_path / "w")]) == 0
    assert "| 5 | 2 |" in (tmp_path / "w" / "report.md").read_text()
    assert main(["control", "walker", "--recipe", "walker-true-model-walk", "--planner", "cem",
                 "--out", str(tmp_path / "x")]) == 2
    assert "--planner" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_one_change_at_two_factors_runs_two_plants():
    """``--changes weak_motor:0.3,weak_motor:0.1`` is two plants: each entry keeps its own factor."""
    from gpdyn.experiments.walk_learned_model import WalkLearnedConfig, plant

    config = WalkLearnedConfig(changes=parse_changes("weak_motor:0.3,weak_motor:0.1,torso_mass"), factors={})
    config.validate()
    assert [config.change_factor(c) for c in config.changes] == [("weak_motor", 0.3), ("weak_motor", 0.1),
                                                                  ("torso_mass", None)]
    gears = []
    for change in config.changes[:2]:
        env, description = plant(*config.change_factor(change))
        gears.append(float(env.unwrapped.model.actuator_gear[0, 0]))
        env.close()
    assert gears[0] == pytest.approx(gears[1] * 3)
    with pytest.raises(InputError, match="each plant change once"):
        WalkLearnedConfig(changes=["weak_motor:0.3", "weak_motor:0.3"]).validate()
    assert WalkLearnedConfig(changes=["weak_motor"]).change_factor("weak_motor") == ("weak_motor", 0.3)
