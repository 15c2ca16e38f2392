"""GP learners, batched over outputs, with one registry of names (docs/architecture.md "Command line").

:func:`make_learner` builds a registered learner at one of its named sizes
(``preset``: "small", "cpu" or "paper", the learner's ``presets`` table), with any
option overridden, and records the resolved options in ``learner.config``.
"""

from __future__ import annotations

import importlib
import inspect

from typing import Any

from gpdyn.gp.base import PRESETS, Learner, LearnerError

# name -> "module:Class". Modules import lazily so that one learner's absence or
# import cost never affects the others.
LEARNERS: dict[str, str] = {
    "svdgp": "gpdyn.gp.svdgp:SVDGP",
    "orth": "gpdyn.gp.orthdgp:ORTH",
    "orthnat": "gpdyn.gp.orthdgp:ORTHNAT",
    "svi": "gpdyn.gp.baselines:SVI",
    "ivsgpr": "gpdyn.gp.baselines:IVSGPR",
    "vsgpr": "gpdyn.gp.baselines:VSGPR",
    "gpr": "gpdyn.gp.baselines:GPR",
    "wiski": "gpdyn.gp.wiski:WISKI",
    "exact": "gpdyn.gp.exact:ExactOnlineGP",
    "residual": "gpdyn.gp.residual:ResidualGP",
    "ssgp": "gpdyn.gp.ssgp:SSGP",
    "svdgp-stream": "gpdyn.gp.svdgp_stream:StreamSVDGP",
    "rls": "gpdyn.gp.rls:RLS",
}


class LearnerUnavailable(LookupError):
    """The learner's module is not part of this build yet."""


def learner_class(name: str) -> type[Learner]:
    """The class registered under ``name``; LearnerError for an unknown name."""
    if name not in LEARNERS:
        raise LearnerError(f"unknown learner '{name}'; choose one of {', '.join(LEARNERS)}")
    module_name, cls_name = LEARNERS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name == module_name:
            raise LearnerUnavailable(f"learner '{name}' ({module_name}) is not implemented yet") from err
        raise
    return getattr(module, cls_name)


def learner_options(cls: type[Learner]) -> dict[str, inspect.Parameter]:
    """Keyword options of ``cls``'s constructor, through the ``**kwargs`` it forwards to its bases
    (and those of its :meth:`~gpdyn.gp.base.Learner.from_options`, where it has its own)."""
    options: dict[str, inspect.Parameter] = {}
    if cls.from_options.__func__ is not Learner.from_options.__func__:  # type: ignore[attr-defined]
        for p in inspect.signature(cls.from_options).parameters.values():
            if p.kind is inspect.Parameter.KEYWORD_ONLY:
                options[p.name] = p
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(vars(klass)["__init__"]).parameters
        for p in params.values():
            if p.kind is inspect.Parameter.KEYWORD_ONLY:
                options.setdefault(p.name, p)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            break
    return options


def preset_options(cls: type[Learner], preset: str | None) -> dict[str, Any]:
    """The options of ``cls`` at ``preset`` (a copy; None: none, the constructor's defaults)."""
    if preset is None:
        return {}
    if preset not in PRESETS:
        raise LearnerError(f"unknown preset '{preset}'; choose one of {', '.join(PRESETS)}")
    if preset not in cls.presets:
        raise LearnerError(f"learner '{cls.name}' has no preset '{preset}' (it has {', '.join(cls.presets) or 'none'})")
    return dict(cls.presets[preset])


def make_learner(
    name: str, input_dim: int, output_dim: int, *, preset: str | None = None, rows: int | None = None, **kwargs: Any
) -> Learner:
    """Construct the learner registered under ``name``.

    ``preset`` picks the sizes of the learner's ``presets`` table ("small", "cpu",
    "paper"; None: the constructor's defaults); ``kwargs`` override any option. ``rows``,
    the training-set size where the caller knows it, caps the options that size a basis
    or a data subset (the class's ``basis_options``): a basis larger than the data only
    repeats points. The resolved options are in ``learner.config`` (with the preset's
    name). An unknown option, a missing required one or a value of the wrong kind (text
    for a number) is a LearnerError naming the learner and the option.
    """
    cls = learner_class(name)
    options = learner_options(cls)
    for key, value in kwargs.items():
        if key not in options:
            raise LearnerError(f"learner '{name}' has no option '{key}'; it takes {', '.join(sorted(options))}")
        default = options[key].default
        numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
        # text (from a command line) or None where a number is due; lists and tensors pass
        # to the constructor, which checks the options that take them
        wrong = isinstance(value, str) or (value is None and "None" not in str(options[key].annotation))
        if numeric and wrong:
            raise LearnerError(f"learner '{name}': option '{key}' takes a number (default {default}), got {value!r}")
    resolved = {**preset_options(cls, preset), **kwargs}
    missing = [k for k, p in options.items() if p.default is inspect.Parameter.empty and k not in resolved]
    if missing:
        raise LearnerError(f"learner '{name}' needs option(s) {', '.join(missing)}")
    if rows is not None:
        if int(rows) < 1:
            raise LearnerError(f"learner '{name}': rows must be >= 1, got {rows}")
        for key in cls.basis_options:
            size = resolved.get(key, options[key].default)
            if isinstance(size, int) and size > rows:
                resolved[key] = int(rows)
    learner = cls.from_options(input_dim, output_dim, **resolved)
    if preset is not None:
        learner.config["preset"] = preset
    return learner


__all__ = ["LEARNERS", "PRESETS", "Learner", "LearnerError", "LearnerUnavailable", "learner_class", "learner_options",
           "make_learner", "preset_options"]
