"""Command-line options made from a config tree (:mod:`gpdyn.config`): one option per setting.

:func:`add_config_options` adds ``--name`` for every setting of a tree that the command line
may set, typed and bounded from the setting's declaration, its help the setting's own with
the effective default appended (worked out when the help is printed, from the chosen recipe);
:func:`apply_config_options` puts the options that were given into a built config and returns
them. Nothing here imports torch: the trees do not.
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Callable
from typing import Any

from gpdyn.cli.common import Number, Numbers
from gpdyn.config import Leaf, hint_base, leaves, put


class EffectiveDefault:
    """An option's ``%(effective)s`` in its help: ``effective(name)``, worked out when the help is printed."""

    def __init__(self, effective: Callable[[str], str], name: str) -> None:
        self.effective, self.name = effective, name

    def __str__(self) -> str:
        return self.effective(self.name)


class NameList:
    """An argparse ``type``: comma-separated names, each one of ``choices`` (a tuple)."""

    def __init__(self, choices: Any) -> None:
        self.choices = choices
        self.__name__ = "names"

    def __call__(self, text: str) -> tuple[str, ...]:
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        bad = [n for n in names if self.choices is not None and n not in self.choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated names of {', '.join(self.choices)}")
        return names


def _number(leaf: Leaf, kind: type) -> Number:
    meta = leaf.meta
    return Number(kind, meta["low"], meta["high"], open_low=meta["open_low"])


def _option(leaf: Leaf) -> dict[str, Any]:
    """The ``add_argument`` keywords of a setting."""
    meta = leaf.meta
    base, _ = hint_base(leaf.hint)
    args = typing.get_args(base)
    kw: dict[str, Any] = {"default": None, "dest": leaf.name}
    if meta["metavar"]:
        kw["metavar"] = meta["metavar"]
    if base is bool:
        kw["action"] = argparse.BooleanOptionalAction
    elif typing.get_origin(base) is tuple:
        kw["type"] = NameList(meta["choices"])
    elif typing.get_origin(base) is list or any(typing.get_origin(a) is list for a in args):  # one number or a list
        numbers = Numbers(float, meta["low"], meta["high"], open_low=meta["open_low"])
        kw["type"] = lambda text, numbers=numbers: (lambda v: v[0] if len(v) == 1 else v)(numbers(text))
        kw["type"].__name__ = "numbers"
    elif base in (int, float):
        kw["type"] = _number(leaf, base)
    elif meta["choices"] is not None:
        kw["choices"] = meta["choices"]
        kw.setdefault("metavar", leaf.name.upper())
    return kw


def add_config_options(p: argparse.ArgumentParser, cls: type, effective: Callable[[str], str],
                       skip: tuple[str, ...] = ()) -> list[str]:
    """``--name`` for each setting of tree ``cls`` the command line may set (not in ``skip``); returns their names."""
    added = []
    for name, leaf in leaves(cls).items():
        if not leaf.meta["cli"] or name in skip:
            continue
        kw = _option(leaf)
        choices = f": {', '.join(map(str, leaf.meta['choices']))}" if leaf.meta["choices"] is not None else ""
        action = p.add_argument("--" + name.replace("_", "-"), help=f"{leaf.help}{choices} (default %(effective)s)",
                                **kw)
        action.effective = EffectiveDefault(effective, name)
        added.append(name)
    return added


def apply_config_options(cfg: Any, args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """Put the options of ``names`` that were given (not None) into the config tree ``cfg``; returns them."""
    known = leaves(type(cfg))
    given = {}
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            put(cfg, known[name], value)
            given[name] = value
    return given


__all__ = ["EffectiveDefault", "NameList", "add_config_options", "apply_config_options"]
