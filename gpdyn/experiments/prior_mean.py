"""Prior means: a fixed function of the inputs whose residual a learner models.

A GP with a prior mean ``m`` models ``y = m(x) + f(x) + eps`` with ``f ~ GP(0, k)``: the
learner sees ``y - m(x)`` and its prediction of ``y`` is ``m(x)`` plus its own. Because
``m`` is fixed, it is evaluated once per row, before any learning, in physical units; the
learner keeps speaking the problem's normalised units (:meth:`PriorMean.normalized`).

``--prior-mean SPEC`` (``gpdyn learn`` and ``gpdyn replay``, every protocol):

- ``rigid-body`` (problem ``kuka``) or ``rigid-body:FILE.xml`` (any arm store): the
  rigid-body inverse dynamics of the arm's MJCF file, ``M(q) qdd + c(q, qd) + g(q)`` with
  the rotor inertias (armature) and without joint damping and dry friction, one
  ``mj_inverse`` per row (Nguyen-Tuong & Peters 2010, "Using model knowledge for learning
  inverse dynamics": the GP learns what the rigid-body class leaves, friction, a payload,
  unmodelled drives);
- ``learner:RUN_DIR``: the frozen learner of a ``gpdyn learn`` run folder (its mean,
  through its own normalisation; a learner is trained on the residual of its prior, so a
  learner run folder made with ``--prior-mean`` is refused as one);
- from Python, any callable ``physical x [N, D] -> physical y [N, P]``
  (:class:`PriorMean`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpdyn.data.problems import Normalizer, Problem
from gpdyn.errors import InputError

ROWS_PER_CALL = 65536  # rows of one learner prediction (a frozen learner's prior)


@dataclass(frozen=True)
class PriorMean:
    """A fixed mean function ``fn(x) -> y`` in physical units, named ``name``."""

    name: str
    fn: Callable[[np.ndarray], np.ndarray]

    def physical(self, x: np.ndarray) -> np.ndarray:
        """The prior at physical inputs ``x [N, D]``: ``[N, P]``, checked for shape and finiteness."""
        y = np.asarray(self.fn(x), dtype=np.float64)
        if y.ndim != 2 or y.shape[0] != x.shape[0]:
            raise InputError(f"prior mean {self.name}: returned shape {y.shape} for {x.shape[0]} rows")
        bad = ~np.isfinite(y)
        if bad.any():
            row, col = np.argwhere(bad)[0]
            raise InputError(f"prior mean {self.name}: non-finite value at row {row}, output {col}")
        return y

    def normalized_fn(self, normalizer: Normalizer) -> Callable[[torch.Tensor], torch.Tensor]:
        """The prior as a function of normalised inputs ``[..., D]`` to normalised outputs ``[..., P]`` in the units
        of ``normalizer`` (a learner's): what :class:`gpdyn.gp.prior_mean.WithPriorMean` adds to its learner. It runs
        on the CPU in float64 (an arm's prior is MuJoCo's inverse dynamics), one row per control step there."""

        def prior(x: torch.Tensor) -> torch.Tensor:
            flat = x.detach().reshape(-1, x.shape[-1]).double().cpu().numpy()
            y = normalizer.normalize_y(self.physical(normalizer.denormalize_x(flat)))
            return torch.as_tensor(y, dtype=x.dtype, device=x.device).reshape(*x.shape[:-1], y.shape[-1])

        return prior

    def normalized(self, problem: Problem, split: str) -> np.ndarray:
        """The prior on ``problem``'s ``split`` in the problem's normalised output units ``[N, P]``
        (the scale of the normalised targets; the mean offset is the targets')."""
        x, y = problem.split(split)
        prior = self.physical(x)
        if prior.shape[1] != y.shape[1]:
            raise InputError(f"prior mean {self.name}: gives {prior.shape[1]} outputs, problem {problem.name} has "
                             f"{y.shape[1]}")
        return problem.normalizer.normalize_y(prior)


def split_tensors(problem: Problem, split: str, device: str | torch.device, dtype: torch.dtype,
                  prior: PriorMean | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``problem``'s ``split`` as normalised tensors ``x, y`` and the prior at ``x`` in the units of
    ``y`` (None without a prior): a learner learns ``y - prior`` and predicts ``y`` as ``prior`` plus
    its own mean."""
    x, y = problem.tensors(split, device, dtype)
    if prior is None:
        return x, y, None
    return x, y, torch.as_tensor(prior.normalized(problem, split), device=device, dtype=dtype)


def rigid_body_prior(model_file: str | Path, joints: int, joint_names: list[str] | None = None) -> PriorMean:
    """The rigid-body inverse dynamics of an arm's MJCF file (damping and dry friction off) on
    inputs ``[q, qd, qdd]`` of ``joints`` joints (``joint_names``: the arm's joints where they are a
    selection of the file's, as a store collected with ``--joints`` records them)."""
    from gpdyn.robots.arm import ArmModel, inverse_dynamics

    import mujoco

    arm = ArmModel(model_file, joints=joint_names, damping=0.0, friction=0.0)
    if arm.n != joints:
        raise InputError(f"--prior-mean rigid-body: {model_file} has {arm.n} joints, the problem {joints}")
    model = arm.model
    data = mujoco.MjData(model)

    def torques(x: np.ndarray) -> np.ndarray:
        n = arm.n
        return inverse_dynamics(model, data, x[:, :n], x[:, n : 2 * n], x[:, 2 * n : 3 * n])

    return PriorMean(f"rigid-body:{Path(model_file).name}", torques)


def learner_prior(run_dir: str | Path) -> PriorMean:
    """The mean of the frozen learner of a ``gpdyn learn`` run folder."""
    from gpdyn.experiments.learned import load_learned as load

    learner, normalizer = load(run_dir)  # refuses a learner trained on the residual of its own prior mean

    @torch.no_grad()
    def mean(x: np.ndarray) -> np.ndarray:
        xn = torch.as_tensor(normalizer.normalize_x(x), dtype=learner.dtype)
        out = [learner.predict_mean(xn[i : i + ROWS_PER_CALL]) for i in range(0, len(xn), ROWS_PER_CALL)]
        return normalizer.denormalize_y(torch.cat(out).double().numpy())

    return PriorMean(f"learner:{Path(run_dir).name}", mean)


def load_prior_mean(spec: str | None, store: str | Path, problem: Problem) -> PriorMean | None:
    """The prior mean of ``--prior-mean spec`` for ``problem`` built from ``store`` (None without one)."""
    if spec is None:
        return None
    from gpdyn.data.store import EpisodeStore

    return parse_prior_mean(spec, problem, dict(EpisodeStore.open(store).attrs))


def parse_prior_mean(spec: str, problem: Problem, store_attrs: dict) -> PriorMean:
    """The prior of ``--prior-mean SPEC`` for ``problem`` (see the module docs)."""
    kind, _, arg = spec.partition(":")
    if kind == "rigid-body":
        if problem.name not in ("kuka", "arm"):
            raise InputError(f"--prior-mean rigid-body: an arm's prior; problem {problem.name} is not an arm's")
        if not arg:
            from gpdyn.robots.kuka import model_path

            if store_attrs.get("model_file") != model_path().name:
                raise InputError(f"--prior-mean rigid-body: the store was not collected from the shipped KUKA model "
                                 f"(its model_file is {store_attrs.get('model_file')!r}); name the arm's file: "
                                 "--prior-mean rigid-body:FILE.xml")
            arg = str(model_path())
        if not Path(arg).is_file():
            raise InputError(f"--prior-mean {spec}: no such MJCF file {arg}")
        # a store of joints picked out of a larger file records them (and the joints removed)
        chosen = store_attrs.get("joint_names") if store_attrs.get("removed_joints") else None
        return rigid_body_prior(arg, problem.output_dim, chosen)
    if kind == "learner":
        if not arg:
            raise InputError("--prior-mean learner:RUN_DIR: name the run folder of a gpdyn learn run")
        return learner_prior(arg)
    raise InputError(f"--prior-mean {spec!r}: expected rigid-body, rigid-body:FILE.xml or learner:RUN_DIR")


def load_learned_model(run_dir: str | Path, store: str | Path, problem: Problem,
                       device: str | torch.device | None = None) -> tuple[Any, Normalizer]:
    """The model of a ``gpdyn learn`` run folder as a learner of the targets themselves: its learner, wrapped
    with the run's prior mean when it learned a residual (:class:`~gpdyn.gp.prior_mean.WithPriorMean`, the prior
    rebuilt from the run's ``--prior-mean`` for ``problem`` of ``store``), and its normaliser."""
    from gpdyn.experiments.learned import load_with_prior_spec
    from gpdyn.gp.prior_mean import WithPriorMean

    learner, normalizer, spec = load_with_prior_spec(run_dir, device)
    if spec is None:
        return learner, normalizer

    prior = load_prior_mean(spec, store, problem)
    return WithPriorMean(learner, prior.normalized_fn(normalizer), prior.name), normalizer


__all__ = ["PriorMean", "learner_prior", "load_learned_model", "load_prior_mean", "parse_prior_mean", "rigid_body_prior", "split_tensors"]
