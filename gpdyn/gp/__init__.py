"""GP learners, batched over outputs, with one registry of names (DESIGN.md "Command line")."""

from __future__ import annotations

import importlib
import inspect

from gpdyn.gp.base import Learner, LearnerError

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
    """Keyword options of ``cls``'s constructor, through the ``**kwargs`` it forwards to its bases."""
    options: dict[str, inspect.Parameter] = {}
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


def make_learner(name: str, input_dim: int, output_dim: int, **kwargs) -> Learner:
    """Construct the learner registered under ``name``; an unknown option or a value of the
    wrong kind (text for a number) is a LearnerError naming the learner and the option."""
    cls = learner_class(name)
    options = learner_options(cls)
    for key, value in kwargs.items():
        if key not in options:
            raise LearnerError(f"learner '{name}' has no option '{key}'; it takes {', '.join(sorted(options))}")
        default = options[key].default
        numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
        optional = value is None and "None" in str(options[key].annotation)
        if numeric and not optional and not isinstance(value, (int, float)):
            raise LearnerError(f"learner '{name}': option '{key}' takes a number (default {default}), got {value!r}")
    return cls(input_dim, output_dim, **kwargs)


__all__ = ["LEARNERS", "Learner", "LearnerError", "LearnerUnavailable", "learner_class", "learner_options", "make_learner"]
