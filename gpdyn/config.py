"""Config trees: nested dataclasses whose fields declare themselves once.

A run's settings are a tree of dataclasses (sections: the task, the learned model, the planner,
the adaptation, the plant change, the compute device). Each setting is one field made by
:func:`setting`, which carries its help text and its bounds or choices; from that one
declaration come

- the command-line option (:func:`gpdyn.cli.options.add_config_options`: ``--name``, its type,
  range and help with the effective default of the chosen recipe),
- the check of a value from a recipe or the command line (:func:`check_leaf`, :func:`check`),
- the recipe's keys (a recipe sets a setting by its leaf name: names are unique in a tree),
- the report's settings table (:func:`settings_table`).

A new option is one field. This module imports no torch and no MuJoCo, so that ``--help``
and the recipe listing stay fast.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING, dataclass, field
from functools import cached_property
from typing import Any

from gpdyn.errors import InputError


class RegistryNames(Sequence[str]):
    """The keys of the registry ``attr`` of ``module`` (a dict or tuple of names).

    As choices it lists ``listed`` (the registry's names, copied here) in help and in
    errors without importing ``module`` (which may import torch), and checks a given value
    against the registry itself, imported then; ``str()`` joins the names with commas.
    :meth:`registry` is what the copy must equal (the test suite checks it).
    """

    def __init__(self, module: str, attr: str, listed: tuple[str, ...]) -> None:
        self.module, self.attr, self.listed = module, attr, listed

    @cached_property
    def registry(self) -> tuple[str, ...]:
        return tuple(getattr(importlib.import_module(self.module), self.attr))

    def __getitem__(self, i):  # type: ignore[override]
        return self.listed[i]

    def __len__(self) -> int:
        return len(self.listed)

    def __iter__(self) -> Iterator[str]:
        return iter(self.listed)

    def __contains__(self, name: object) -> bool:
        return name in self.registry

    def __str__(self) -> str:
        return ", ".join(self.listed)


# the registries' names, listed here so that help and checks of names need no torch (the test suite checks the copies)
LEARNER_NAMES = RegistryNames("gpdyn.gp", "LEARNERS", ("svdgp", "orth", "orthnat", "svi", "ivsgpr", "vsgpr", "gpr",
                                                        "wiski", "exact", "residual", "ssgp", "svdgp-stream", "rls"))
PROBLEM_NAMES = RegistryNames("gpdyn.robots.tasks", "PROBLEMS", ("kuka", "arm", "walker-1", "walker-2", "hopper-1",
                                                                "hopper-2"))
#: the legged tasks (``collect``/``control`` subcommands): gpdyn.robots.task.BUILTIN_TASKS
LEGGED_TASKS = RegistryNames("gpdyn.robots.task", "BUILTIN_TASKS", ("walker", "hopper"))
PRESET_NAMES = RegistryNames("gpdyn.gp", "PRESETS", ("small", "cpu", "paper"))
PROTOCOL_NAMES = RegistryNames("gpdyn.data.problems", "PROTOCOLS", ("iid", "ordered", "block", "split", "stream"))
DTYPE_NAMES = RegistryNames("gpdyn.device", "DTYPES", ("float32", "float64"))
FAMILY_NAMES = RegistryNames("gpdyn.sim.arm", "FAMILIES", ("kuka1", "kuka2"))  # trajectory families of the arm streams


def setting(default: Any = MISSING, *, help: str, low: float | None = None, high: float | None = None,
            open_low: bool = False, choices: Sequence[str] | None = None, metavar: str | None = None,
            default_factory: Callable[[], Any] | Any = MISSING, cli: bool = True, recipe: bool = True,
            none_means: str | None = None) -> Any:
    """A setting of a config tree: a dataclass field with what the command line, recipes and
    reports need to know of it.

    ``help``: what it does, in one phrase (the effective default is added where it is shown);
    ``low``/``high`` (``open_low``: strictly above): the range of a number, each number of a
    list; ``choices``: the names it may take (each name of a tuple of names); ``metavar``: its
    placeholder in usage lines; ``cli``/``recipe``: whether the command line or a recipe may set
    it (the machine's device is the command line's alone, a run's task is its command's);
    ``none_means``: what the value None does, in words.
    """
    meta = {"help": help, "low": low, "high": high, "open_low": open_low, "choices": choices, "metavar": metavar,
            "cli": cli, "recipe": recipe, "none_means": none_means}
    return field(default=default, default_factory=default_factory, metadata={"setting": meta})


@dataclass(frozen=True)
class Leaf:
    """One setting of a tree: its ``name`` (unique in the tree), ``path`` (the attributes from the
    root to it), ``field``, type ``hint`` and the :func:`setting` metadata ``meta``."""

    name: str
    path: tuple[str, ...]
    field: dataclasses.Field
    hint: Any

    @property
    def meta(self) -> dict[str, Any]:
        return self.field.metadata["setting"]

    @property
    def help(self) -> str:
        return self.meta["help"]


def is_section(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def leaves(cls: type) -> dict[str, Leaf]:
    """Every setting of the tree rooted at dataclass ``cls``, by leaf name, in declaration order.
    A field whose type is a dataclass is a section; every other field must be a :func:`setting`."""
    return dict(_leaves(cls))


_FOUND: dict[type, tuple[tuple[str, Leaf], ...]] = {}  # leaves by root class, worked out once


def _leaves(cls: type) -> tuple[tuple[str, Leaf], ...]:
    if cls in _FOUND:
        return _FOUND[cls]
    hints = typing.get_type_hints(cls)
    out: list[tuple[str, Leaf]] = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if is_section(hint):
            out += [(name, dataclasses.replace(leaf, path=(f.name, *leaf.path))) for name, leaf in _leaves(hint)]
        elif "setting" in f.metadata:
            out.append((f.name, Leaf(f.name, (f.name,), f, hint)))
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: a config tree's field is a section or a setting()")
    names = [name for name, _ in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise TypeError(f"{cls.__name__}: setting names must be unique in the tree, {', '.join(twice)} repeat")
    _FOUND[cls] = tuple(out)
    return _FOUND[cls]


def get(obj: Any, leaf: Leaf) -> Any:
    for name in leaf.path:
        obj = getattr(obj, name)
    return obj


def put(obj: Any, leaf: Leaf, value: Any) -> None:
    for name in leaf.path[:-1]:
        obj = getattr(obj, name)
    setattr(obj, leaf.path[-1], value)


def flat(obj: Any) -> dict[str, Any]:
    """The tree's settings by leaf name."""
    return {name: get(obj, leaf) for name, leaf in leaves(type(obj)).items()}


def build(cls: type, values: dict[str, Any] | None = None, where: str = "config") -> Any:
    """A tree of ``cls`` with its defaults, then ``values`` (by leaf name) set over them; an
    unknown name is an InputError naming ``where``."""
    obj = cls()
    known = leaves(cls)
    for name, value in (values or {}).items():
        if name not in known:
            raise InputError(f"{where}: unknown setting '{name}'; choose one of {', '.join(known)}")
        put(obj, known[name], value)
    return obj


def _items(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def check_leaf(leaf: Leaf, value: Any, where: str) -> None:
    """InputError naming ``where`` and the setting when ``value`` is outside the setting's range or choices.
    (Types are the caller's: argparse and the recipe reader convert them.)"""
    if value is None:
        return
    meta = leaf.meta
    low, high, choices = meta["low"], meta["high"], meta["choices"]
    for item in _items(value):
        if choices is not None and item not in choices:
            raise InputError(f"{where}: {leaf.name} {item!r} is not one of {', '.join(map(str, choices))}")
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            continue
        if not math.isfinite(item):
            raise InputError(f"{where}: {leaf.name} must be finite, got {item}")
        below = low is not None and (item <= low if meta["open_low"] else item < low)
        if below or (high is not None and item > high):
            bound = ([f"{'>' if meta['open_low'] else '>='} {low:g}"] if low is not None else []) + (
                [f"<= {high:g}"] if high is not None else [])
            raise InputError(f"{where}: {leaf.name} must be {' and '.join(bound)}, got {item}")


def check(obj: Any, where: str, sections: bool = True) -> None:
    """Every setting of the tree within its range and choices (:func:`check_leaf`); then, with
    ``sections``, each section's own ``validate()`` (the checks that relate settings), the root's
    last (a section's ``validate`` calls this with ``sections=False`` for its own settings)."""
    for leaf in leaves(type(obj)).values():
        check_leaf(leaf, get(obj, leaf), where)
    if sections:
        for section in _sections(obj):
            if hasattr(section, "validate"):
                section.validate()


def _sections(obj: Any) -> list[Any]:
    """The sections of a tree, innermost first, the root last."""
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out += _sections(value)
    return out + [obj]


@dataclass
class Compute:
    """Where a run computes: the one resolved device and dtype that the learners', models' and
    planners' constructors read (:meth:`kwargs`)."""

    device: str = setting("cpu", recipe=False, help="torch device: cpu, cuda or cuda:N")
    dtype: str | None = setting(None, choices=DTYPE_NAMES, none_means="the device's: float64 on the CPU, float32 on CUDA",
                                help="floating-point type of the models and planners")

    def validate(self) -> None:
        from gpdyn.device import resolve_device, resolve_dtype

        resolve_device(self.device)
        resolve_dtype(self.dtype, self.device, option="dtype")

    @property
    def torch_dtype(self) -> Any:
        from gpdyn.device import resolve_dtype

        return resolve_dtype(self.dtype, self.device)

    def kwargs(self) -> dict[str, Any]:
        """``device=`` and ``dtype=`` for a constructor."""
        return {"device": self.device, "dtype": self.torch_dtype}


def show(value: Any) -> str:
    """A setting's value as a recipe or the command line writes it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ",".join(show(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={show(v)}" for k, v in value.items()) or "none"
    return str(value)


def settings_table(values: dict[str, Any], cls: type, given: Sequence[str] = ()) -> list[str]:
    """A markdown table of a run's settings (``values`` by leaf name, e.g. from its config.json),
    grouped by section, each with its help; ``given``: the names set by the recipe or the command line."""
    lines = ["| section | setting | value | what it does |", "|---|---|---|---|"]
    for name, leaf in leaves(cls).items():
        if name not in values:
            continue
        section = ".".join(leaf.path[:-1]) or "run"
        mark = " *" if name in given else ""
        value = values[name]
        shown = show(value) if value is not None else (leaf.meta["none_means"] or "none")
        lines.append(f"| {section} | `{name}`{mark} | {shown} | {leaf.help} |")
    return lines


def flatten_dict(values: dict[str, Any]) -> dict[str, Any]:
    """A nested dict (a tree's ``dataclasses.asdict``, e.g. a config.json) by leaf name; a flat one as it is."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and key not in ("learner_options", "recipe_values", "options_given"):
            out.update(flatten_dict(value))
        else:
            out[key] = value
    return out


def hint_base(hint: Any) -> tuple[Any, bool]:
    """The type of a setting without ``None`` and whether None is allowed (``int | None`` -> ``(int, True)``)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else hint), len(rest) < len(args)
    return hint, False


__all__ = ["Compute", "DTYPE_NAMES", "FAMILY_NAMES", "LEARNER_NAMES", "LEGGED_TASKS", "PRESET_NAMES", "PROBLEM_NAMES", "PROTOCOL_NAMES", "Leaf",
           "RegistryNames", "build", "check", "check_leaf", "flat", "flatten_dict", "get", "hint_base", "is_section", "leaves",
           "put", "setting", "settings_table", "show"]
