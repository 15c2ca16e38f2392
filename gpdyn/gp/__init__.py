"""GP learners, batched over outputs, with one registry of names (DESIGN.md "Command line")."""

from __future__ import annotations

import importlib

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


def make_learner(name: str, input_dim: int, output_dim: int, **kwargs) -> Learner:
    """Construct the learner registered under ``name``."""
    return learner_class(name)(input_dim, output_dim, **kwargs)


__all__ = ["LEARNERS", "Learner", "LearnerError", "LearnerUnavailable", "learner_class", "make_learner"]
