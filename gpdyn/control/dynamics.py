"""Models for control: a learner with its problem's normaliser, and forward dynamics on top of it.

- :class:`LearnedModel`: the one wrapper of a :class:`~gpdyn.gp.base.Learner` and the
  :class:`~gpdyn.data.problems.Normalizer` of the problem it was trained on. Callers speak
  physical units; the learner sees normalised ones. With ``delta_columns`` the learner's
  target is the change of those input columns, ``y - x[..., delta_columns]`` (PILCO's and
  PETS' usual dynamics target: away from its data the GP's zero prior mean then says "the
  state persists" instead of reverting to the training mean), and ``predict`` adds them back.
  Every controller's learned model is one: the walker's forward dynamics below, the arm's
  inverse dynamics (computed torque).
- the robot's :class:`~gpdyn.robots.layout.StateLayout` (its own module) says how a planning
  state and action become a model input.
- :class:`LearnedDynamics`: forward dynamics from a learned model of the next velocities;
  positions follow by the trapezoid rule ``q' = q + dt/2 (v + v')``.
- :class:`SimDynamics`: the true simulator as a batched model (``mujoco.rollout`` from
  copied states), for any ``MjModel`` whose control step holds the action for ``frame_skip``
  simulator steps.

Both forward models implement :class:`gpdyn.control.planner.PlanningModel` on torch tensors:
``predict_mean(state [K, nx], action [K, nu]) -> next_state [K, nx]`` (for the learned one
through the learners' mean-only path), which the planners use when their cost ignores the
variance. Called, they map ``(state, action)`` to the next state (the simulator) or to
``(mean, variance)`` of it (learned), as :mod:`gpdyn.control.mpc` expects.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import mujoco
import numpy as np
import torch
from torch import Tensor

from gpdyn.compiled import SignatureCompiled, compile_errors
from gpdyn.control.planner import PlanningModel, env_state, state_of
from gpdyn.data.problems import Normalizer
from gpdyn.errors import InputError
from gpdyn.gp.base import Learner, LearnerError, MeanProgram, NonFiniteError
from gpdyn.robots.layout import StateLayout
from gpdyn.sim.rollout_states import RolloutStates

# What a forward model's learner predicts: "change" = qvel[t+1] - qvel[t] (delta target),
# "velocity" = qvel[t+1] itself (walker-1 as in the SVDGP paper).
TARGETS = ("change", "velocity")


def physical_mean(mean: Tensor, x: Tensor, y_mean: Tensor, y_std: Tensor, delta_columns: slice | Tensor | None) -> Tensor:
    """A normalised predicted mean ``[..., P]`` in physical units at raw inputs ``x [..., D]``;
    the known input is exact: a delta target adds it to the mean only (:class:`LearnedModel`)."""
    mean = mean * y_std + y_mean
    return mean + x[..., delta_columns] if delta_columns is not None else mean


class LearnedModel:
    """A learner and its problem's normaliser: predictions and training pairs in physical units.

    ``delta_columns`` (a slice or indices of the input): the learner was trained on
    ``y - x[..., delta_columns]``; :meth:`predict` adds those columns back and
    :meth:`training_pair` subtracts them, so both speak of ``y`` itself. The normaliser's
    output statistics are those of what the learner was trained on.
    """

    def __init__(self, learner: Learner, normalizer: Normalizer, delta_columns: slice | Sequence[int] | None = None) -> None:
        d, p = learner.input_dim, learner.output_dim
        shapes = {k: np.shape(getattr(normalizer, k)) for k in ("x_mean", "x_std", "y_mean", "y_std")}
        want = {"x_mean": (d,), "x_std": (d,), "y_mean": (p,), "y_std": (p,)}
        bad = [f"{k} {shapes[k]} (want {want[k]})" for k in want if shapes[k] != want[k]]
        if bad:
            raise InputError(f"LearnedModel: the normaliser does not fit the {learner.name or 'learner'} "
                             f"({d} -> {p}): {', '.join(bad)}")
        self.learner, self.normalizer = learner, normalizer
        kw = {"device": learner.device, "dtype": learner.dtype}
        # the statistics live on the learner's device once, not copied there at every call
        self._x_mean, self._x_std = (torch.as_tensor(np.asarray(normalizer.x_mean), **kw),
                                     torch.as_tensor(np.asarray(normalizer.x_std), **kw))
        self._y_mean, self._y_std = (torch.as_tensor(np.asarray(normalizer.y_mean), **kw),
                                     torch.as_tensor(np.asarray(normalizer.y_std), **kw))
        self._y_var = self._y_std**2  # the variance's scale, once rather than at every prediction
        self.delta_columns: slice | Tensor | None = None
        if delta_columns is not None:
            if isinstance(delta_columns, slice):
                width = len(range(d)[delta_columns])
                self.delta_columns = delta_columns
            else:
                cols = [int(c) for c in delta_columns]
                if any(not 0 <= c < d for c in cols):
                    raise InputError(f"LearnedModel: delta_columns {cols} outside the {d} inputs")
                width = len(cols)
                self.delta_columns = torch.as_tensor(cols, device=learner.device, dtype=torch.long)
            if width != p:
                raise InputError(f"LearnedModel: delta_columns {delta_columns} select {width} inputs for {p} outputs")

    @property
    def device(self) -> torch.device:
        return self.learner.device

    @property
    def dtype(self) -> torch.dtype:
        return self.learner.dtype

    @property
    def input_dim(self) -> int:
        return self.learner.input_dim

    @property
    def output_dim(self) -> int:
        return self.learner.output_dim

    def _tensor(self, a: Tensor | np.ndarray, name: str, width: int) -> Tensor:
        t = torch.as_tensor(a, device=self.device, dtype=self.dtype)
        if t.ndim == 0 or t.shape[-1] != width:
            raise InputError(f"LearnedModel: {name} has shape {tuple(t.shape)}, its last axis must be {width}")
        return t

    def predict(self, x_raw: Tensor | np.ndarray) -> tuple[Tensor, Tensor]:
        """Mean and variance of ``y`` in physical units, ``[..., P]`` each, from raw inputs ``[..., D]``.

        A learner whose Cholesky factor fails predicts NaN here on every device, which the
        controllers' checks turn into a fallback, never into an action; so does an input the
        learner refuses (NaN, inf: a diverged rollout state), as a GPU gives NaN for it."""
        x, flat = self._normalized(x_raw)
        try:
            mean, var = self.learner.predict(flat)
        except (torch.linalg.LinAlgError, NonFiniteError):  # the CPU raises where a GPU gives NaN (gpdyn.gp.base)
            mean = var = flat.new_full((flat.shape[0], self.output_dim), math.nan)
        var = (var * self._y_var).reshape(*x.shape[:-1], self.output_dim)
        return self._physical_mean(mean, x), var

    def predict_mean(self, x_raw: Tensor | np.ndarray) -> Tensor:
        """Mean of ``y`` in physical units, ``[..., P]``, from raw inputs ``[..., D]``, through the
        learner's :meth:`~gpdyn.gp.base.Learner.predict_mean` (no variance arithmetic): what
        a planner whose cost ignores the variance asks for. NaN where a Cholesky factor
        fails, as :meth:`predict`."""
        x, flat = self._normalized(x_raw)
        try:
            mean = self.learner.predict_mean(flat)
        except (torch.linalg.LinAlgError, NonFiniteError):
            mean = flat.new_full((flat.shape[0], self.output_dim), math.nan)
        return self._physical_mean(mean, x)

    def _normalized(self, x_raw: Tensor | np.ndarray) -> tuple[Tensor, Tensor]:
        """The raw inputs as a tensor ``[..., D]`` and normalised, flattened to ``[N, D]``."""
        x = self._tensor(x_raw, "x", self.input_dim)
        return x, (x.reshape(-1, self.input_dim) - self._x_mean) / self._x_std

    def _physical_mean(self, mean: Tensor, x: Tensor) -> Tensor:
        return physical_mean(mean.reshape(*x.shape[:-1], self.output_dim), x, self._y_mean, self._y_std,
                             self.delta_columns)

    def training_pair(self, x_raw: Tensor | np.ndarray, y_raw: Tensor | np.ndarray) -> tuple[Tensor, Tensor]:
        """Observed raw ``x [..., D]`` and ``y [..., P]`` as the learner's normalised ``(x [N, D], y [N, P])``."""
        x = self._tensor(x_raw, "x", self.input_dim).reshape(-1, self.input_dim)
        y = self._tensor(y_raw, "y", self.output_dim).reshape(-1, self.output_dim)
        if x.shape[0] != y.shape[0]:
            raise InputError(f"LearnedModel.training_pair: {x.shape[0]} inputs but {y.shape[0]} targets")
        if self.delta_columns is not None:
            y = y - x[:, self.delta_columns]
        return (x - self._x_mean) / self._x_std, (y - self._y_mean) / self._y_std

    def diagnostics(self) -> dict[str, float]:
        """The learner's counters (see :meth:`gpdyn.gp.base.Learner.diagnostics`)."""
        return self.learner.diagnostics()


class LearnedDynamics(PlanningModel):
    """Forward dynamics from a learned model of the next velocities, positions by the trapezoid rule.

    ``model`` maps :meth:`StateLayout.features` to ``qvel`` at t+1 (physical units; with the
    delta target its ``delta_columns`` are the layout's velocity inputs). Positions
    follow by ``q' = q + dt/2 (v + v')``, exact for a velocity linear over the step; it needs
    ``nq == nv`` (hinge and slide joints, no quaternions). Calling returns ``(next_state,
    variance)``, the position variance through the same rule, for the uncertainty-aware planners.
    """

    def __init__(self, model: LearnedModel, layout: StateLayout) -> None:
        if layout.nq != layout.nv:
            raise InputError(f"LearnedDynamics: the trapezoid rule needs nq == nv, the layout has {layout.nq}, {layout.nv}")
        if model.input_dim != layout.input_dim or model.output_dim != layout.nv:
            raise InputError(f"LearnedDynamics: the model maps {model.input_dim} -> {model.output_dim}, the layout needs "
                             f"{layout.input_dim} -> {layout.nv}")
        self.model, self.layout = model, layout

    @classmethod
    def from_learner(cls, learner: Learner, normalizer: Normalizer, layout: StateLayout,
                     target: str = "change") -> LearnedDynamics:
        """Dynamics from a learner trained on ``target`` (:data:`TARGETS`) with ``normalizer``'s statistics."""
        if target not in TARGETS:
            raise InputError(f"LearnedDynamics: target must be one of {', '.join(TARGETS)}, got '{target}'")
        delta = layout.velocity_inputs if target == "change" else None
        return cls(LearnedModel(learner, normalizer, delta), layout)

    def predict_velocity(self, state: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and variance of qvel at t+1 in physical units, ``[K, nv]`` each."""
        return self.model.predict(self.layout.features(state, action))

    def training_pair(self, state: Tensor, action: Tensor, next_state: Tensor) -> tuple[Tensor, Tensor]:
        """Observed transitions as the learner's normalised ``(x [N, D], y [N, nv])``."""
        kw = {"device": self.model.device, "dtype": self.model.dtype}
        state, action, next_state = (torch.as_tensor(a, **kw) for a in (state, action, next_state))
        return self.model.training_pair(self.layout.features(state, action), next_state[..., self.layout.nq :])

    def __call__(self, state: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """``(next_state [K, nx], variance [K, nx])``."""
        v1, var_v = self.predict_velocity(state, action)
        v1, var_v = v1.to(state.dtype), var_v.to(state.dtype)
        half = 0.5 * self.layout.dt
        return self.layout.integrate(state, v1), torch.cat([half**2 * var_v, var_v], dim=-1)

    def predict_mean(self, state: Tensor, action: Tensor) -> Tensor:
        """The mean next state ``[K, nx]`` alone, through the learner's mean-only path: what the
        planners call when their cost does not use the variance (:mod:`gpdyn.control.mpc`).

        A learner that offers its mean as a :class:`~gpdyn.gp.base.MeanProgram` (WISKI with
        ``compiled_mean``) runs the whole step, features, normalisation, mean, physical units
        and integration, as one compiled program (:meth:`_program_step`) for a batch ``[K, nx]``
        in the learner's dtype."""
        program = self.model.learner.mean_program()
        if program is not None and state.ndim == 2 and state.dtype == self.model.dtype:
            return self._program_step(state, action, program)
        v1 = self.model.predict_mean(self.layout.features(state, action)).to(state.dtype)
        return self.layout.integrate(state, v1)

    def _program_step(self, state: Tensor, action: Tensor, program: MeanProgram) -> Tensor:
        """:meth:`predict_mean` through :func:`_compiled_mean_step`: one compiled call where the
        eager path runs about 20 small ops, a large part of a WISKI step
        (docs/results/implementation-timings.md). The inputs
        are checked as the learner checks them, from the sum of the features the program returns
        (a NaN or inf anywhere makes it non-finite)."""
        model = self.model
        state = model._tensor(state, "state", self.layout.nx)
        action = model._tensor(action, "action", self.layout.nu)
        if state.shape[0] != action.shape[0]:
            raise InputError(f"LearnedDynamics.predict_mean: {state.shape[0]} states but {action.shape[0]} actions")
        step = _compiled_mean_step(self.layout, model.delta_columns, program.function)
        with compile_errors("LearnedDynamics.predict_mean", "the learner's eager mean (compiled_mean=False)",
                            LearnerError):
            nxt, feature_sum = step(state, action, model._x_mean, model._x_std, model._y_mean, model._y_std,
                                    *program.operands)
        if not math.isfinite(feature_sum.item()):  # a Python float: cheaper than torch.isfinite on one number
            model.learner.check_finite("predict_mean", x=self.layout.features(state, action))
        return nxt


_STEPS: dict[tuple[Any, ...], SignatureCompiled] = {}


def _compiled_mean_step(layout: StateLayout, delta_columns: slice | Tensor | None,
                        function: Callable[..., Tensor]) -> SignatureCompiled:
    """``step(state, action, x_mean, x_std, y_mean, y_std, *operands) -> (next_state, feature sum)``:
    :meth:`LearnedDynamics.predict_mean`'s eager path as one compiled program
    (:class:`~gpdyn.compiled.SignatureCompiled`), built once per layout, delta columns and
    mean function; every tensor is an argument."""
    delta_key = (delta_columns.start, delta_columns.stop, delta_columns.step) if isinstance(delta_columns, slice) \
        else None if delta_columns is None else tuple(delta_columns.tolist())
    key = (layout, delta_key, function)
    if key not in _STEPS:
        def step(state: Tensor, action: Tensor, x_mean: Tensor, x_std: Tensor, y_mean: Tensor, y_std: Tensor,
                 *operands: Tensor) -> tuple[Tensor, Tensor]:
            x = layout.features(state, action)
            v1 = physical_mean(function((x - x_mean) / x_std, *operands), x, y_mean, y_std, delta_columns)
            return layout.integrate(state, v1), x.sum()

        # a planner's fixed [K, nx] batches without guards; other batch sizes share one dynamic-shape compile
        _STEPS[key] = SignatureCompiled(step, fallback=torch.compile(step, dynamic=True))
    return _STEPS[key]


class SimDynamics(PlanningModel):
    """The true simulator as a batched forward model: ``mujoco.rollout`` from copied states.

    State ``[qpos (nq), qvel (nv)]`` of ``model``. Uses the plant's own ``MjModel`` (so plant
    changes made to it in place apply) and a scratch ``MjData`` (``mujoco.rollout`` overwrites
    the data it is given). One step holds the action for ``frame_skip`` simulator steps, as a
    gymnasium MuJoCo env's ``step`` does. Models with actuator activation state are refused:
    the planning state does not carry it.
    """

    def __init__(self, model: mujoco.MjModel, frame_skip: int) -> None:
        from mujoco import rollout

        if int(frame_skip) < 1:
            raise InputError(f"SimDynamics: frame_skip must be >= 1, got {frame_skip}")
        if model.na:
            raise InputError(f"SimDynamics: the model has {model.na} actuator activation states, which [qpos, qvel] "
                             "does not carry")
        self._rollout = rollout.rollout
        self.model, self.frame_skip = model, int(frame_skip)
        self.scratch = mujoco.MjData(model)
        self.states = RolloutStates(model)  # no activations (checked above): [qpos, qvel] is the whole state

    def __call__(self, state: Tensor, action: Tensor) -> Tensor:
        """``next_state [K, nx]`` of ``state [K, nx]`` under ``action [K, nu]``, held for ``frame_skip`` steps."""
        return self.predict_mean(state, action)

    def predict_mean(self, state: Tensor, action: Tensor) -> Tensor:
        """The next states: the simulator's, deterministic (its mean)."""
        s = state.detach().cpu().numpy().astype(np.float64)
        if s.ndim != 2 or s.shape[1] != self.model.nq + self.model.nv:
            raise InputError(f"SimDynamics: state has shape {s.shape}, want [K, {self.model.nq + self.model.nv}]")
        init = self.states.initial(s[:, : self.model.nq], s[:, self.model.nq :])
        ctrl = np.repeat(action.detach().cpu().numpy().astype(np.float64)[:, None, :], self.frame_skip, axis=1)
        out, _ = self._rollout(self.model, self.scratch, init, ctrl)
        last = out[:, -1]
        nxt = np.concatenate([last[:, self.states.qpos], last[:, self.states.qvel]], axis=1)
        return torch.as_tensor(nxt, device=state.device, dtype=state.dtype)


__all__ = ["TARGETS", "LearnedDynamics", "LearnedModel", "SimDynamics", "StateLayout", "env_state", "state_of"]
