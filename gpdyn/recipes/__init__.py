"""Named control recipes: documented settings of the control runs, as TOML files in this package.

A recipe is data, never code: a TOML file (read with :mod:`tomllib`) with

- ``name`` (the file's stem for a shipped recipe), ``robot`` (which run it configures,
  a key of :data:`KINDS`), ``title``, ``description`` (one paragraph: what it does and
  why it is set so), ``use`` (what it is for) and ``result`` (the reported result it
  reproduces, a docs path);
- one table per section of its run, each checked field by field against the run's config
  dataclass: ``[config]`` for ``walker`` (:class:`~gpdyn.experiments.control_legged.LeggedRunConfig`)
  and ``kuka`` (:class:`~gpdyn.experiments.arm_config.ArmRunConfig`); ``[sampler]``
  (:class:`~gpdyn.control.spline_sampling.SamplerConfig`), ``[cost]``
  (:class:`~gpdyn.robots.legged.WalkingCost`) and ``[run]`` (:class:`WalkRun`) for
  ``walker-sampling``; the same ``[sampler]`` and ``[cost]``,
  ``[residual]`` (:class:`~gpdyn.control.hybrid_model.ResidualConfig`), ``[identification]``
  (:class:`~gpdyn.control.identified_model.IdentificationConfig`) and ``[run]``
  (:class:`~gpdyn.experiments.walk_learned_model.WalkLearnedConfig`) for ``walker-learned``.

Loading is strict: an unknown key, a value of the wrong type, a non-finite number or a
value the config's own ``validate`` refuses raises :class:`~gpdyn.errors.InputError`
naming the file, the section and the key; arrays or inline tables nested more than
:data:`MAX_NESTING` deep are refused before parsing, naming the file and the line. Keys a recipe may not set (:data:`NOT_IN_RECIPES`)
belong to the machine or the process, not to the setting.

Reading a file without checking its sections (:func:`read_recipe`) needs only :mod:`tomllib`;
checking them imports the run configs, and with them torch. ``gpdyn control recipes`` lists
the shipped recipes from their files, one line each (:func:`recipe_table`), ``--explain``
prints their prose (:func:`describe`); the command of its kind in :data:`RUNNERS`,
``gpdyn control walker|hopper|kuka --recipe NAME|FILE.toml``, runs one (``walker-sampling``
and ``walker-learned`` recipes too, through :mod:`gpdyn.cli.control_sampling`), explicit
options overriding its values. Without ``--recipe`` a robot runs its
:data:`DEFAULT_RECIPES` entry.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpdyn.config import build, leaves
from gpdyn.errors import InputError

RECIPE_DIR = Path(__file__).resolve().parent
# the run each recipe kind configures: section -> "module:Class" of its dataclass (imported when loaded)
KINDS: dict[str, dict[str, str]] = {
    "walker": {"config": "gpdyn.experiments.legged_config:LeggedRunConfig"},
    "hopper": {"config": "gpdyn.experiments.legged_config:LeggedRunConfig"},
    "kuka": {"config": "gpdyn.experiments.arm_config:ArmRunConfig"},
    "walker-sampling": {"sampler": "gpdyn.control.spline_sampling:SamplerConfig",
                        "cost": "gpdyn.robots.legged:WalkingCost",
                        "run": "gpdyn.recipes:WalkRun"},
    "walker-learned": {"sampler": "gpdyn.control.spline_sampling:SamplerConfig",
                       "cost": "gpdyn.robots.legged:WalkingCost",
                       "residual": "gpdyn.control.hybrid_model:ResidualConfig",
                       "identification": "gpdyn.control.identified_model:IdentificationConfig",
                       "run": "gpdyn.experiments.walk_learned_model:WalkLearnedConfig"},
}
# the command that runs each kind of recipe (with --recipe NAME)
RUNNERS = {"walker": "gpdyn control walker", "hopper": "gpdyn control hopper", "kuka": "gpdyn control kuka",
           "walker-sampling": "gpdyn control walker", "walker-learned": "gpdyn control walker"}
# what a robot's command runs without --recipe: the best reported setting (see each recipe's description)
DEFAULT_RECIPES = {"walker": "walker-weak-motor", "hopper": "hopper-weak-motor", "kuka": "kuka-payload"}
# fields a recipe may not set: the machine (device), the process (progress), the run's own name
# (robot) and the task it runs (task: the recipe's robot)
NOT_IN_RECIPES = frozenset({"device", "progress", "robot", "task"})
METADATA = ("name", "robot", "title", "description", "use", "result")
# what `gpdyn control recipes` shows of each kind's values in its one line: (section, key), when set
MAIN_SETTINGS: dict[str, tuple[tuple[str, str], ...]] = {
    **{legged: tuple(("config", k) for k in ("learner", "cost", "planner", "samples", "horizon", "uncertainty", "adapt",
                                             "change", "change_factor", "steps", "episodes"))
       for legged in ("walker", "hopper")},
    "kuka": tuple(("config", k) for k in ("learner", "adapt", "change", "payload", "change_at", "steps", "family")),
    "walker-sampling": (("sampler", "samples"), ("sampler", "horizon"), ("sampler", "knots"), ("run", "steps"),
                        ("run", "seeds")),
    "walker-learned": (("run", "model"), ("run", "changes"), ("run", "controllers"), ("sampler", "samples"),
                       ("sampler", "horizon"), ("run", "steps"), ("run", "seeds")),
}
#: arrays and inline tables nested deeper than this are refused before parsing: a recipe's
#: values are at most lists of numbers, and tomllib parses nesting by recursion, so a file
#: of thousands of ``[`` would end in a RecursionError instead of a message
MAX_NESTING = 32
# what the nesting count skips (strings, comments) and what it counts: TOML's brackets
_TOML_TOKENS = re.compile(
    r'''"{3}(?:[^\\]|\\.)*?"{3,5}|'{3}.*?'{3,5}|"(?:[^"\\\n]|\\.)*"|'[^'\n]*'|\#[^\n]*|[\[\]{}]''',
    re.DOTALL)


@dataclass
class WalkRun:
    """The episodes of a ``walker-sampling`` recipe: one per seed, up to ``steps`` control steps."""

    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 1000

    def validate(self) -> None:
        if not self.seeds or any(s < 0 for s in self.seeds):
            raise InputError(f"seeds must be a non-empty list of seeds >= 0, got {list(self.seeds)}")
        if not 1 <= self.steps <= 1000:
            raise InputError(f"steps must be in [1, 1000] (a Walker2d episode), got {self.steps}")


@dataclass(frozen=True)
class RecipeText:
    """A recipe as its file has it: the metadata checked, the sections' ``values`` not yet
    (what listing a recipe needs; :func:`load_recipe` checks them)."""

    name: str
    robot: str
    title: str
    description: str
    use: str
    result: str
    path: Path
    values: dict[str, dict[str, Any]] = field(default_factory=dict)  # section -> key -> value as written


@dataclass(frozen=True)
class Recipe(RecipeText):
    """A loaded, validated recipe (its ``values`` checked against the configs); :meth:`build` makes its configs."""

    def build(self, section: str = "config", **fixed: Any) -> Any:
        """A new config of ``section`` holding the recipe's values (``fixed``: fields the caller sets first)."""
        cls = _section_class(self.robot, section)
        return _make(cls, {**_robot_fields(self.robot, cls), **fixed, **self.values.get(section, {})})

    def record(self, given: dict[str, Any], section: str = "config") -> dict[str, Any]:
        """What a run's config.json keeps of its recipe: name, file, the section's values and the options over them."""
        return {"recipe": self.name, "recipe_file": str(self.path), "recipe_values": self.values[section],
                "options_given": given}

    def write_summary(self, folder: Any, options: dict[str, Any], not_options: tuple[str, ...] = ()) -> None:
        """``recipe.json`` in a script's run folder (a :class:`~gpdyn.runs.RunDir`): the recipe and the
        options given over it (``options``, e.g. ``vars(args)``: those that are None were not given;
        ``recipe``, ``out`` and ``not_options`` are not settings)."""
        given = {k: v for k, v in options.items() if k not in ("recipe", "out", *not_options) and v is not None}
        folder.write_json("recipe.json", {"name": self.name, "file": str(self.path),
                                          "values": {s: dict(v) for s, v in self.values.items()}, "options_given": given})


def _section_class(robot: str, section: str) -> type:
    module, _, name = KINDS[robot][section].partition(":")
    return getattr(importlib.import_module(module), name)


def recipe_names(robot: str | None = None) -> list[str]:
    """The shipped recipes' names (of ``robot`` only, when given), sorted."""
    names = sorted(p.stem for p in RECIPE_DIR.glob("*.toml"))
    if robot is None:
        return names
    return [n for n in names if read_recipe(n).robot == robot]


def recipe_path(name: str) -> Path:
    """The file of a shipped recipe ``name``, or ``name`` itself when it is a path to a ``.toml`` file."""
    if name.endswith(".toml") or "/" in name or "\\" in name:
        path = Path(name).expanduser()
        if not path.is_file():
            raise InputError(f"recipe {path}: no such file")
        return path
    path = RECIPE_DIR / f"{name}.toml"
    if not path.is_file():
        raise InputError(f"unknown recipe '{name}'; shipped recipes: {', '.join(recipe_names())} "
                         "(or give a path to your own .toml file)")
    return path


def is_shipped(name: str) -> bool:
    """Whether ``name`` (a recipe name or a file path) is one of the recipes in this package."""
    return recipe_path(name).resolve().parent == RECIPE_DIR


def load_recipe(name: str, robot: str | None = None) -> Recipe:
    """Read and validate recipe ``name`` (shipped name or file path); ``robot``: the kind it must be."""
    text = read_recipe(name, robot)
    values = {section: _check_section(text.path, text.robot, section, text.values.get(section, {}))
              for section in KINDS[text.robot]}
    return Recipe(**{**vars(text), "values": values})


def read_recipe(name: str, robot: str | None = None) -> RecipeText:
    """Read recipe ``name`` (shipped name or file path) and check its metadata and the names of its
    sections, not their values (that imports the run configs: :func:`load_recipe`)."""
    path = recipe_path(name)
    try:
        text = path.read_bytes().decode("utf-8")
        _check_nesting(path, text)
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"recipe {path}: not valid TOML: {err}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"recipe {path}: cannot be read: {err}") from None
    meta = {}
    for key in METADATA:
        value = data.get(key)
        if not isinstance(value, str) or not value.strip():
            raise InputError(f"recipe {path}: key '{key}' must be a non-empty string, got {value!r}")
        meta[key] = " ".join(value.split()) if key in ("description", "use", "title") else value.strip()
    kind = meta["robot"]
    if kind not in KINDS:
        raise InputError(f"recipe {path}: robot '{kind}' is not one of {', '.join(KINDS)}")
    if robot is not None and kind != robot:
        raise InputError(f"recipe {path}: it is a '{kind}' recipe, not one for '{robot}'; run it with "
                         f"{RUNNERS[kind]} --recipe {meta['name']}")
    if path.parent == RECIPE_DIR and meta["name"] != path.stem:
        raise InputError(f"recipe {path}: name '{meta['name']}' differs from the file's name '{path.stem}'")
    sections = KINDS[kind]
    for key in data:
        if key not in METADATA and key not in sections:
            raise InputError(f"recipe {path}: unknown key '{key}'; a {kind} recipe has {', '.join(METADATA)} and "
                             f"the sections {', '.join(f'[{s}]' for s in sections)}")
    values = {}
    for section in sections:
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise InputError(f"recipe {path}: '{section}' must be a table ([{section}]), got {table!r}")
        values[section] = table
    return RecipeText(path=path, values=values, **meta)


def _check_nesting(path: Path, text: str) -> None:
    """InputError naming the file and the line where arrays or inline tables nest deeper than
    :data:`MAX_NESTING` (brackets in strings and comments do not count)."""
    depth = 0
    for token in _TOML_TOKENS.finditer(text):
        bracket = token.group()
        if bracket in "[{":
            depth += 1
            if depth > MAX_NESTING:
                line = text.count("\n", 0, token.start()) + 1
                raise InputError(f"recipe {path}: line {line}: arrays or tables nested more than {MAX_NESTING} deep "
                                 f"(the nesting limit of a recipe)")
        elif bracket in "]}":
            depth = max(0, depth - 1)


def _is_tree(cls: type) -> bool:
    """Whether ``cls`` is a config tree (:mod:`gpdyn.config`: its fields are setting()s and sections), whose settings
    a recipe names by leaf name."""
    return any("setting" in f.metadata for f in dataclasses.fields(cls))


def _settings(cls: type) -> dict[str, tuple[Any, bool]]:
    """What a recipe section of ``cls`` may hold: setting name -> (type hint, whether a recipe may set it)."""
    if _is_tree(cls):
        return {name: (leaf.hint, leaf.meta["recipe"]) for name, leaf in leaves(cls).items()}
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.init and f.name not in NOT_IN_RECIPES) for f in dataclasses.fields(cls)}


def _make(cls: type, values: dict[str, Any]) -> Any:
    """A config of ``cls`` holding ``values`` (settings by name in a tree; keyword arguments otherwise)."""
    return build(cls, values, where=cls.__name__) if _is_tree(cls) else cls(**values)


def _robot_fields(robot: str, cls: type) -> dict[str, Any]:
    """The settings the recipe's robot fixes in a config of ``cls``: the task a legged run controls."""
    return {"task": robot} if "task" in _settings(cls) else {}


def _check_section(path: Path, robot: str, section: str, table: dict[str, Any]) -> dict[str, Any]:
    """The section's values converted to the dataclass's field types; InputError naming file, section and key."""
    cls = _section_class(robot, section)
    known = _settings(cls)
    settable = [name for name, (_, allowed) in known.items() if allowed and name not in NOT_IN_RECIPES]
    out = {}
    for key, value in table.items():
        where = f"recipe {path}: [{section}] {key}"
        if key not in settable:
            raise InputError(f"{where}: unknown key; [{section}] takes {', '.join(settable)}")
        out[key] = _convert(value, known[key][0], where)
    # ranges and combinations: the config's own checks, on the recipe's values alone
    fixed = _robot_fields(robot, cls)
    try:
        _validate(_make(cls, {**fixed, **out}))
    except InputError as err:
        culprit = _culprit(cls, out, fixed)
        named = f"[{section}] {culprit} = {out[culprit]!r}" if culprit else f"[{section}] the combination of its keys"
        raise InputError(f"recipe {path}: {named}: {err}") from None
    return out


def _validate(config: Any) -> None:
    if hasattr(config, "validate"):
        try:
            config.validate()
        except (TypeError, ValueError) as err:  # a config's check that trips on a value of the right type
            if isinstance(err, InputError):
                raise
            raise InputError(str(err)) from None


def _culprit(cls: type, values: dict[str, Any], fixed: dict[str, Any]) -> str | None:
    """The first key whose value alone, on the defaults, the config refuses (None: only their combination)."""
    for key, value in values.items():
        try:
            _validate(_make(cls, {**fixed, key: value}))
        except InputError:
            return key
    return None


def _convert(value: Any, hint: Any, where: str) -> Any:
    """``value`` as the field type ``hint``: exact types (an int for a float is fine, a bool is no
    number), finite floats, lists for tuples; TOML has no null, so ``X | None`` takes an X."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _convert(value, option, where)
            except InputError as err:
                # what the value was meant to be: a list's error for a list, else the others'
                if isinstance(value, list) == (typing.get_origin(option) in (list, tuple)):
                    errors.append(str(err))
        raise InputError(errors[0] if len(errors) == 1 else f"{where}: {value!r} is none of {hint}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise InputError(f"{where}: must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise InputError(f"{where}: must be an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise InputError(f"{where}: must be a finite number, got {value!r}")
            return float(value)
        raise InputError(f"{where}: must be a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise InputError(f"{where}: must be a string, got {value!r}")
    if (origin is tuple and len(args) == 2 and args[1] is Ellipsis) or origin is list:
        if not isinstance(value, list):
            raise InputError(f"{where}: must be a list, got {value!r}")
        items = [_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict and args[0] is str:
        if not isinstance(value, dict):
            raise InputError(f"{where}: must be a table, got {value!r}")
        return {k: _convert(v, args[1], f"{where}.{k}") for k, v in value.items()}
    raise InputError(f"{where}: a field of type {hint} cannot be set by a recipe")


def default_recipe(robot: str) -> Recipe:
    """The recipe ``gpdyn control ROBOT`` runs without ``--recipe``."""
    return load_recipe(DEFAULT_RECIPES[robot], robot)


def all_recipes() -> list[Recipe]:
    """Every shipped recipe, loaded and validated."""
    return [load_recipe(n) for n in recipe_names()]


def show_value(value: Any) -> str:
    """A recipe value as ``--help`` and the listings show it: lists comma-separated, floats as written."""
    if isinstance(value, (list, tuple)):
        return ",".join(show_value(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}:{show_value(v)}" for k, v in value.items())
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def main_settings(recipe: RecipeText) -> str:
    """The recipe's main settings (:data:`MAIN_SETTINGS` of its kind) that it sets, as ``key=value``."""
    shown = []
    for section, key in MAIN_SETTINGS.get(recipe.robot, ()):
        if key not in recipe.values.get(section, {}):
            continue
        value = recipe.values[section][key]
        if isinstance(value, (list, tuple)) and len(value) > 3:  # seeds: the first, the last and how many
            shown.append(f"{key}={show_value(value[0])},...,{show_value(value[-1])} ({len(value)})")
        else:
            shown.append(f"{key}={show_value(value)}")
    return " ".join(shown) or "the run config's defaults"


def recipe_table(recipes: list[RecipeText]) -> str:
    """One line per recipe: its name (``*`` for a robot's default), robot, title and main settings."""
    header = ("NAME", "ROBOT", "SUMMARY", "MAIN SETTINGS")
    rows = [(r.name + (" *" if DEFAULT_RECIPES.get(r.robot) == r.name else ""), r.robot, r.title, main_settings(r))
            for r in recipes]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(3)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths)) + "  " + row[3]
                     for row in (header, *rows))


def describe(recipe: RecipeText, width: int = 100) -> str:
    """A recipe's listing: name, robot, title, description, use, result and its values."""
    import textwrap

    default = " (the default)" if DEFAULT_RECIPES.get(recipe.robot) == recipe.name else ""
    lines = [f"{recipe.name} [{recipe.robot}]{default}: {recipe.title}"]
    for label, text in (("", recipe.description), ("for: ", recipe.use), ("reported: ", recipe.result)):
        lines += textwrap.wrap(label + text, width, initial_indent="    ", subsequent_indent="    ")
    for section, values in recipe.values.items():
        if values:
            shown = ", ".join(f"{k}={list(v) if isinstance(v, tuple) else v}" for k, v in values.items())
            lines += textwrap.wrap(f"[{section}] {shown}", width, initial_indent="    ", subsequent_indent="      ")
    return "\n".join(lines)


__all__ = ["DEFAULT_RECIPES", "KINDS", "MAIN_SETTINGS", "MAX_NESTING", "NOT_IN_RECIPES", "RECIPE_DIR", "Recipe",
           "RecipeText", "WalkRun", "all_recipes", "default_recipe", "describe", "is_shipped", "load_recipe",
           "main_settings", "read_recipe", "recipe_names", "recipe_path", "recipe_table", "show_value"]
