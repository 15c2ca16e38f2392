"""Control recipes (gpdyn/recipes): the shipped ones load and are documented, bad ones are refused
by file and key, command-line options override them, and the defaults are the documented ones."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from gpdyn.cli import main
from gpdyn.config import flatten_dict
from gpdyn.errors import InputError
from gpdyn.recipes import DEFAULT_RECIPES, KINDS, RECIPE_DIR, all_recipes, default_recipe, load_recipe, recipe_names

ROOT = Path(__file__).resolve().parents[1]
CONTROL_MD = ROOT / "docs" / "control.md"

HEAD = 'name = "mine"\nrobot = "walker"\ntitle = "t"\ndescription = "d"\nuse = "u"\nresult = "r"\n'


def _write(tmp_path: Path, body: str, head: str = HEAD) -> Path:
    path = tmp_path / "mine.toml"
    path.write_text(head + body)
    return path


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", markdown, re.M)}


def _settings_of(config):
    """A config's settings by name: a config tree's by leaf name (gpdyn.config), a flat dataclass's by field."""
    from gpdyn.config import flat

    try:
        return flat(config)
    except TypeError:  # not a tree: its fields are not setting()s
        return vars(config)


@pytest.mark.parametrize("name", recipe_names())
def test_every_shipped_recipe_loads_validates_and_points_at_its_result(name):
    recipe = load_recipe(name)
    assert recipe.name == name == recipe.path.stem and recipe.path.parent == RECIPE_DIR
    assert recipe.robot in KINDS and len(recipe.description) > 200  # a paragraph, not a label
    for section in KINDS[recipe.robot]:
        config = recipe.build(section)
        settings = _settings_of(config)
        for key, value in recipe.values[section].items():
            assert settings[key] == value
        if hasattr(config, "validate"):
            config.validate()
    # the reported result it reproduces: a file in docs/, and the heading it names
    target = recipe.result.split()[0]
    path, _, anchor = target.partition("#")
    assert path.startswith("docs/") and (ROOT / path).is_file(), recipe.result
    if anchor:
        assert anchor in _anchors((ROOT / path).read_text()), f"{name}: {path} has no heading #{anchor}"
    # the guide names every recipe
    assert f"`{name}`" in CONTROL_MD.read_text()


def test_the_defaults_are_the_documented_ones():
    assert DEFAULT_RECIPES == {"walker": "walker-weak-motor", "hopper": "hopper-weak-motor", "kuka": "kuka-payload"}
    assert default_recipe("walker").name == "walker-weak-motor" and default_recipe("kuka").name == "kuka-payload"
    text = CONTROL_MD.read_text()
    for robot, name in DEFAULT_RECIPES.items():
        assert re.search(rf"`gpdyn control {robot}` with no `--recipe` runs `{name}`", text), robot
    # the walker default is the reported setting: the tracking cost, one-step plans, the weakened hip
    walker = default_recipe("walker").build()
    assert ((walker.planner.cost, walker.planner.mpc.horizon, walker.plant.change, walker.plant.change_factor)
            == ("track", 1, "weak_motor", 0.3))


def test_the_walker_sampling_recipe_is_the_planner_reported():
    from gpdyn.control.spline_sampling import SamplerConfig
    from gpdyn.robots.legged import WalkingCost

    recipe = load_recipe("walker-true-model-walk", "walker-sampling")
    # the sampler's defaults with 14 samples, which plan within the 8 ms control period
    assert recipe.build("sampler") == SamplerConfig(samples=14) and recipe.build("cost") == WalkingCost()
    assert recipe.build("run").seeds == tuple(range(108, 116)) and recipe.build("run").steps == 1000


@pytest.mark.parametrize("body, key, what", [
    ("[config]\nno_such_option = 3\n", "no_such_option", "unknown key"),
    ("[config]\nsteps = \"300\"\n", "steps", "integer"),
    ("[config]\nsteps = 2.5\n", "steps", "integer"),
    ("[config]\nsteps = true\n", "steps", "integer"),
    ("[config]\nrelative_to_proposal = 1\n", "relative_to_proposal", "true or false"),
    ("[config]\nnoise_std = nan\n", "noise_std", "finite"),
    ("[config]\ntemperature = inf\n", "temperature", "finite"),
    ("[config]\nchange_factor = nan\n", "change_factor", "finite"),
    ("[config]\nconditions = \"changed\"\n", "conditions", "list"),
    ("[config]\nconditions = [\"changed\", 3]\n", "conditions[1]", "string"),
    ("[config]\nhorizon = 5000\n", "horizon", "longer than an episode (1000 steps)"),
    ("[config]\nnoise_std = -0.1\n", "noise_std", ""),
    ("[config]\nlearner = \"nosuch\"\n", "learner", "'nosuch' is not one of svdgp"),
    ("[config]\nconditions = [\"windy\"]\n", "conditions", "windy"),
    ("[config]\ndevice = \"cuda\"\n", "device", "unknown key"),
    ("[config]\nextra = { m_alpha = 3 }\n", "extra", "unknown key"),
    ("[config]\nlearner_options = { m_alpha = [3] }\n", "learner_options.m_alpha", "none of"),
    ("[config]\nlearner = \"wiski\"\nlearner_options = { m_alpha = 3 }\n", "learner_options", "takes no option m_alpha"),
    ("[config]\nsteps = 10\nchange_at = 20\n", "the combination", "change-at"),
    ("[sampler]\nsamples = 3\n", "sampler", "unknown key"),
    ("config = 3\n", "config", "table"),
])
def test_a_bad_recipe_is_refused_naming_its_file_and_key(tmp_path, body, key, what):
    path = _write(tmp_path, body)
    with pytest.raises(InputError) as err:
        load_recipe(str(path))
    message = str(err.value)
    assert str(path) in message and key in message and what in message, message


@pytest.mark.parametrize("head, key", [
    (HEAD.replace('title = "t"\n', ""), "title"),
    (HEAD.replace('description = "d"', "description = 3"), "description"),
    (HEAD.replace('robot = "walker"', 'robot = "hexapod"'), "hexapod"),
    (HEAD + 'command = "rm -rf /"\n', "command"),
])
def test_a_recipe_with_bad_metadata_is_refused(tmp_path, head, key):
    path = _write(tmp_path, "", head)
    with pytest.raises(InputError, match=re.escape(key)) as err:
        load_recipe(str(path))
    assert str(path) in str(err.value)


def test_a_recipe_that_is_not_toml_or_not_there_is_refused(tmp_path):
    path = _write(tmp_path, "[config\nsteps = 3\n")
    with pytest.raises(InputError, match="not valid TOML") as err:
        load_recipe(str(path))
    assert str(path) in str(err.value)
    with pytest.raises(InputError, match="no such file"):
        load_recipe(str(tmp_path / "none.toml"))
    with pytest.raises(InputError, match="unknown recipe 'none'.*walker-weak-motor"):
        load_recipe("none")
    with pytest.raises(InputError, match="not one for 'kuka'"):
        load_recipe("walker-weak-motor", "kuka")


def test_a_good_user_recipe_builds_its_values(tmp_path):
    path = _write(tmp_path, '[config]\nsteps = 7\nconditions = ["nominal"]\nnoise_std = 1\nchange_factor = 0.7\n')
    cfg = _settings_of(load_recipe(str(path), "walker").build())
    assert (cfg["steps"], cfg["conditions"], cfg["noise_std"], cfg["change_factor"]) == (7, ("nominal",), 1.0, 0.7)
    assert isinstance(cfg["noise_std"], float) and cfg["horizon"] == 10  # the rest: the defaults


@pytest.fixture
def captured(monkeypatch):
    """The configs the control commands would run, without running them."""
    import gpdyn.experiments.control_arm as arm
    import gpdyn.experiments.control_legged as walker

    seen = {}

    def fake(name):
        def run(run_dir, cfg, store=None):
            seen[name] = (run_dir, cfg)
            return {"report": str(run_dir.path / "report.md")}
        return run

    monkeypatch.setattr(walker, "run_legged", fake("walker"))
    monkeypatch.setattr(arm, "run_arm", fake("kuka"))
    return seen


def test_control_walker_without_a_recipe_runs_the_default_and_records_it(tmp_path, captured):
    assert main(["control", "walker", "--out", str(tmp_path / "a")]) == 0
    run, cfg = captured["walker"]
    expected = default_recipe("walker").build()
    assert dataclasses.asdict(cfg) == dataclasses.asdict(expected)
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["recipe"] == "walker-weak-motor" and config["options_given"] == {}
    assert config["recipe_values"]["cost"] == "track" and config["steps"] == 300 and config["seed"] == 60


def test_options_override_the_recipe(tmp_path, captured):
    assert main(["control", "walker", "--recipe", "walker-weak-motor", "--steps", "7", "--seed", "3",
                 "--learner", "svi", "--conditions", "nominal,changed", "--change-factor", "0.5",
                 "--out", str(tmp_path / "a")]) == 0
    cfg = _settings_of(captured["walker"][1])
    assert ((cfg["steps"], cfg["seed"], cfg["learner"], cfg["conditions"], cfg["change_factor"])
            == (7, 3, "svi", ("nominal", "changed"), 0.5))
    assert (cfg["cost"], cfg["horizon"], cfg["residual_kernel"]) == ("track", 1, "linear")  # the recipe's, not the defaults
    config = flatten_dict(json.loads((tmp_path / "a" / "config.json").read_text()))
    assert config["options_given"]["steps"] == 7 and config["recipe_values"]["steps"] == 300 and config["steps"] == 7
    # another plant change takes its own factor, not the recipe's 0.3 for the motor
    assert main(["control", "walker", "--change", "foot_friction", "--out", str(tmp_path / "b")]) == 0
    assert (captured["walker"][1].plant.change, captured["walker"][1].plant.change_factor) == ("foot_friction", None)
    # a recipe's switches can be turned off (and a cold start back on) from the command line
    assert main(["control", "walker", "--no-relative-to-proposal", "--no-residual-gate", "--warm-start",
                 "--out", str(tmp_path / "d")]) == 0
    off = _settings_of(captured["walker"][1])
    assert (off["relative_to_proposal"], off["residual_gate"], off["warm_start"]) == (False, False, True)
    # the quick look is the configuration's defaults but for a planner that fits the control period
    assert main(["control", "walker", "--recipe", "walker-quick-look", "--out", str(tmp_path / "c")]) == 0
    quick = captured["walker"][1]
    defaults = type(quick)()
    defaults.planner.mpc.samples, defaults.planner.mpc.horizon, defaults.adaptation.residual_refit_iters = 48, 6, 0
    assert dataclasses.asdict(quick) == dataclasses.asdict(defaults)


def test_learner_options_come_from_the_recipe_and_the_command_line(tmp_path, captured):
    path = _write(tmp_path, '[config]\nlearner = "wiski"\nlearner_options = { compiled_mean = true, lr = 0.01 }\n')
    assert main(["control", "walker", "--recipe", str(path), "--learner-option", "lr=0.2",
                 "--learner-option", "predict_chunk=512", "--out", str(tmp_path / "a")]) == 0
    cfg = captured["walker"][1].model
    assert cfg.learner_options == {"compiled_mean": True, "lr": 0.2, "predict_chunk": 512}
    config = flatten_dict(json.loads((tmp_path / "a" / "config.json").read_text()))
    assert config["learner_options"] == cfg.learner_options and config["options_given"]["learner_options"]["lr"] == 0.2
    assert main(["control", "walker", "--learner", "svi", "--learner-option", "compiled_mean=true",
                 "--out", str(tmp_path / "b")]) == 2  # svi takes no such option: refused before the run


def test_kuka_runs_its_recipe_and_a_user_file(tmp_path, captured):
    assert main(["control", "kuka", "--payload", "1.5", "--out", str(tmp_path / "a")]) == 0
    cfg = _settings_of(captured["kuka"][1])
    assert ((cfg["robot"], cfg["payload"], cfg["steps"], cfg["change_at"], cfg["learner"], cfg["gp_online"])
            == ("kuka", 1.5, 400, 200, "wiski", True))
    assert json.loads((tmp_path / "a" / "config.json").read_text())["recipe"] == "kuka-payload"
    path = _write(tmp_path, "[config]\nsteps = 60\nchange_at = 20\npayload = 2\n",
                  HEAD.replace('robot = "walker"', 'robot = "kuka"'))
    assert main(["control", "kuka", "--recipe", str(path), "--out", str(tmp_path / "b")]) == 0
    cfg = _settings_of(captured["kuka"][1])
    assert (cfg["steps"], cfg["change_at"], cfg["payload"]) == (60, 20, 2.0)
    assert json.loads((tmp_path / "b" / "config.json").read_text())["recipe_file"] == str(path)


def test_a_bad_recipe_on_the_command_line_exits_2_before_any_run_folder(tmp_path, captured, capsys):
    path = _write(tmp_path, "[config]\nsamples = nan\n")
    assert main(["control", "walker", "--recipe", str(path), "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "samples" in err and not (tmp_path / "a").exists() and not captured
    assert main(["control", "kuka", "--recipe", "walker-weak-motor", "--out", str(tmp_path / "b")]) == 2
    assert "not one for 'kuka'" in capsys.readouterr().err and not (tmp_path / "b").exists()


def test_control_recipes_lists_every_recipe_with_its_description(capsys):
    assert main(["control", "recipes", "--explain"]) == 0
    out = capsys.readouterr().out
    for recipe in all_recipes():
        assert f"{recipe.name} [{recipe.robot}]" in out and recipe.description[:60] in " ".join(out.split())
    assert "walker-weak-motor [walker] (the default)" in out


@pytest.mark.slow
def test_the_demo_control_stage_reports_the_comparison_it_computes(tmp_path):
    from gpdyn.experiments.demo import control_stage
    from gpdyn.runs import RunDir

    summary = control_stage(tmp_path / "c", seed=0, steps=30, change_at=15, offline=200, pretrain_iterations=5)
    config = flatten_dict(json.loads((tmp_path / "c" / "config.json").read_text()))
    assert summary["recipe"] == config["recipe"] == "kuka-payload" and config["payload"] == 3.0
    tracking = {r["controller"]: r["rmse"] for r in RunDir(tmp_path / "c").metrics() if r.get("kind") == "tracking"}
    assert set(tracking) == set(summary["rmse_after"]) == {"pd", "true", "frozen", "online"}
    for name, rmse in tracking.items():
        assert summary["rmse_after"][name] == pytest.approx(sum(rmse["after"]) / len(rmse["after"]))
    ratio = summary["rmse_after"]["frozen"] / summary["rmse_after"]["online"]
    assert summary["online_gain_after"] == pytest.approx(ratio) and summary["adapted"] == (ratio >= 2.0)
    with pytest.raises(TypeError, match="no_such"):
        control_stage(tmp_path / "d", no_such=1)


def test_kuka_from_a_learn_run_takes_its_learner_unless_one_is_given(tmp_path, captured):
    folder = tmp_path / "learn"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"job": "learn", "learner": "svi"}))
    assert main(["control", "kuka", "--from-run", str(folder), "--out", str(tmp_path / "a")]) == 0
    assert captured["kuka"][1].model.learner == "svi"  # not the recipe's svdgp
    assert main(["control", "kuka", "--from-run", str(folder), "--learner", "exact", "--out", str(tmp_path / "b")]) == 0
    assert captured["kuka"][1].model.learner == "exact"


def test_the_walking_script_runs_its_recipe_with_options_over_it(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("walk_true_model_script", ROOT / "scripts" / "walk_true_model.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--seeds", "5", "--steps", "2", "--samples", "4", "--out", str(tmp_path / "w")]) == 0
    config = json.loads((tmp_path / "w" / "config.json").read_text())
    recipe = json.loads((tmp_path / "w" / "recipe.json").read_text())
    assert recipe["name"] == "walker-true-model-walk" and recipe["options_given"]["samples"] == 4
    assert config["seeds"] == [5] and config["steps"] == 2 and config["sampler"]["samples"] == 4
    assert config["sampler"]["knots"] == recipe["values"]["sampler"]["knots"] == 5
    assert config["cost"] == recipe["values"]["cost"]
    bad = _write(tmp_path, "[sampler]\nknots = 1\n", HEAD.replace('robot = "walker"', 'robot = "walker-sampling"'))
    assert script.main(["--recipe", str(bad), "--out", str(tmp_path / "x")]) == 2 and not (tmp_path / "x").exists()


def test_the_learned_walking_script_runs_its_recipe_with_options_over_it(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("walk_learned_model_script", ROOT / "scripts" / "walk_learned_model.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--recipe", "walker-learned-hip", "--seeds", "5", "--steps", "2", "--controllers", "frozen",
                        "--eval-every", "0", "--window", "50", "--no-progress", "--out", str(tmp_path / "w")]) == 0
    config = json.loads((tmp_path / "w" / "config.json").read_text())
    recipe = json.loads((tmp_path / "w" / "recipe.json").read_text())
    assert recipe["name"] == "walker-learned-hip" and recipe["options_given"]["learned_window"] == 50
    assert config["seeds"] == [5] and config["steps"] == 2 and config["controllers"] == ["frozen"]
    assert config["factors"] == {"weak_motor": 0.3} == recipe["values"]["run"]["factors"]  # the recipe's
    assert config["residual"]["window"] == 50 and config["residual"]["space"] == recipe["values"]["residual"]["space"]
    assert config["cost"] == recipe["values"]["cost"] and config["model"] == "residual"
    # the default recipe: the identified model, the window its own
    assert script.main(["--seeds", "5", "--steps", "2", "--controllers", "frozen", "--eval-every", "0",
                        "--window", "60", "--no-progress", "--out", str(tmp_path / "p")]) == 0
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    assert json.loads((tmp_path / "p" / "recipe.json").read_text())["name"] == "walker-learned-parameters"
    assert config["model"] == "parameters" and config["identification"]["window"] == 60
    bad = _write(tmp_path, "[run]\nfactors = { weak_motor = \"strong\" }\n",
                 HEAD.replace('robot = "walker"', 'robot = "walker-learned"'))
    assert script.main(["--recipe", str(bad), "--out", str(tmp_path / "x")]) == 2 and not (tmp_path / "x").exists()


def test_a_recipe_of_another_kind_is_refused_naming_the_command_that_runs_it():
    from gpdyn.recipes import RUNNERS

    assert set(RUNNERS) == set(KINDS)
    assert all(command.startswith("gpdyn control ") for command in RUNNERS.values())
    with pytest.raises(InputError, match="run it with gpdyn control walker --recipe walker-learned-parameters"):
        load_recipe("walker-learned-parameters", "walker")
