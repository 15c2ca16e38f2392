"""The learner contract shared by every GP learner (docs/architecture.md "Learners").

Every learner models P outputs at once: each output has its own GP, and the outputs
are a leading batch dimension on every tensor (lengthscales ``[P, D]``, bases
``[P, M, D]``). No Python loop runs over outputs or points.

Three things every learner declares on its class, so that no caller has to probe it:

- ``capabilities``: the optional traits it has, from :data:`CAPABILITIES` (a batch
  pretraining phase, bases that ``observe`` grows, a point limit, ...). Each trait comes
  with base-class members whose defaults say "not this learner"; a class that declares
  a trait must override them (checked when the class is created).
- ``state_fields``: the attributes that make up its state. :class:`Stateful` builds
  ``state_dict`` / ``load_state_dict`` from them, validating keys, shapes and dtypes,
  and keeps the state to plain data (tensors, numbers, strings, dicts, lists) so that a
  checkpoint loads with ``torch.load(..., weights_only=True)``.
- ``presets``: its sizes at each named scale of :data:`PRESETS`, the one size table of
  the learner (``gpdyn.gp.make_learner(name, ..., preset="cpu")``).

Input checks are the base class's, not a convention each learner keeps: every entry point
of :data:`ENTRY_POINTS` a class defines (``observe``, ``step``, ``predict``, ...) is
wrapped when the class is created, so that its inputs are checked before its body runs
(:meth:`Learner.check_inputs`: tensors on the learner's device and dtype, their ranks and
widths, matching rows, values finite and within :data:`MAX_ABS`) and an empty batch gets
the one answer of the contract. A learner's body sees checked input only.
"""

from __future__ import annotations

import abc
import copy
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from gpdyn.errors import InputError


LOG_2PI = math.log(2.0 * math.pi)  # the constant of every Gaussian log density here


@dataclass(frozen=True)
class MeanProgram:
    """A learner's predictive mean as a pure tensor function: ``function(x, *operands)`` is
    :meth:`Learner.predict_mean` at normalised inputs ``x [N, D]``, ``[N, P]``.

    No checks, no Python state, no control flow on values: a caller can trace it into a
    larger :func:`torch.compile` program (the learned dynamics' whole model step,
    :meth:`gpdyn.control.dynamics.LearnedDynamics.predict_mean`). The operands are the
    learner's current caches, so a program is asked for again after every update.
    """

    function: Callable[..., Tensor]
    operands: tuple[Tensor, ...]


class BatchMemo:
    """What was computed for the last batch of rows, handed back when the same rows come again.

    An online learner is asked about a transition and then learns from it (predict, then observe;
    observe, then step on the same rows): the second call need not repeat the first's work. Rows
    are compared exactly; a batch of more than ``max_rows`` rows (None: any) is not kept."""

    def __init__(self, max_rows: int | None = None) -> None:
        self.max_rows = max_rows
        self._x: Tensor | None = None
        self._value: Any = None

    def get(self, x: Tensor) -> Any:
        """The value kept for rows equal to ``x``, else None."""
        if self._x is not None and self._x.shape == x.shape and torch.equal(self._x, x):
            return self._value
        return None

    def put(self, x: Tensor, value: Any) -> None:
        """Keep ``value`` for the rows ``x [N, D]`` (forgetting the previous batch)."""
        keep = self.max_rows is None or (x.dim() == 2 and x.shape[0] <= self.max_rows)
        self._x, self._value = (x.detach().clone(), value) if keep else (None, None)

    def clear(self) -> None:
        self._x = self._value = None


def cholesky(a: Tensor) -> Tensor:
    """Lower Cholesky factor of the (batched) positive-definite ``a``, with no host sync on a GPU.

    ``torch.linalg.cholesky`` synchronises a CUDA device with the host on every call to
    check for failure. Here ``cholesky_ex`` reports failure per batch member instead: on
    the CPU (where the check is free) a failure raises ``torch.linalg.LinAlgError`` naming
    the batch member; on a GPU the failed members' factors are set to NaN, so the failure
    reaches the loss and the predictions, and the checks that guard those, never a number
    that looks right.
    """
    factor, info = torch.linalg.cholesky_ex(a)
    if a.device.type == "cpu":
        failed = (info != 0).nonzero()
        if len(failed):
            where = tuple(failed[0].tolist())
            raise torch.linalg.LinAlgError(
                f"cholesky: batch member {where} of shape {tuple(a.shape)} is not positive definite "
                f"(leading minor of order {int(info[where])})"
            )
        return factor
    return torch.where((info != 0)[..., None, None], torch.full_like(factor, math.nan), factor)


class LearnerError(InputError):
    """Bad input to a learner (wrong shape, NaN, wrong device); the message says where."""


class NonFiniteError(LearnerError, FloatingPointError):
    """A value in a learner's input that is not a finite number within :data:`MAX_ABS` (NaN,
    inf, 1e200), raised before the learner changes any state. A ``FloatingPointError`` too:
    a planner whose rollout feeds a diverged state to the model falls back
    (:meth:`gpdyn.control.mpc.Planner.plan`) instead of stopping the run."""


# -- checkpoint data ------------------------------------------------------------------
PLAIN_TYPES = (bool, int, float, str, type(None))


def check_plain(value: Any, where: str) -> None:
    """Raise LearnerError unless ``value`` is checkpoint data: tensors, numbers, strings, None,
    and dicts (string or integer keys), lists and tuples of them. That is what
    ``torch.load(..., weights_only=True)`` reads back without running pickled code."""
    if isinstance(value, (Tensor, *PLAIN_TYPES)):
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise LearnerError(f"{where}: key {key!r} is a {type(key).__name__}, not a string or integer")
            check_plain(item, f"{where}.{key}")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_plain(item, f"{where}[{i}]")
        return
    raise LearnerError(f"{where}: an object of type {type(value).__name__} is not checkpoint data (tensors, numbers, "
                       "strings, dicts and lists of them)")


def _save(value: Any) -> Any:
    """The checkpoint form of one state attribute (copies: the state never aliases the learner)."""
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, torch.Generator):
        return value.get_state()
    if isinstance(value, torch.optim.Optimizer):
        return copy.deepcopy(value.state_dict())  # Adam's moment tensors are live
    if isinstance(value, Stateful):
        return value.state_dict()
    if isinstance(value, Mapping):
        return {k: _save(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_save(v) for v in value]
    return value


def _check(current: Any, saved: Any, where: str, shape: tuple[int, ...] | None = None) -> None:
    """Raise LearnerError unless ``saved`` can replace ``current`` (see :class:`Stateful`)."""
    if isinstance(current, Tensor):
        if not isinstance(saved, Tensor):
            raise LearnerError(f"{where}: expected a tensor, got {type(saved).__name__}")
        want = tuple(current.shape) if shape is None else tuple(shape)
        if tuple(saved.shape) != want:
            raise LearnerError(f"{where}: shape {tuple(saved.shape)}, expected {want}")
        if saved.dtype != current.dtype and not (saved.is_floating_point() and current.is_floating_point()):
            raise LearnerError(f"{where}: dtype {saved.dtype}, expected {current.dtype}")
    elif isinstance(current, torch.Generator):
        mine = current.get_state()
        if not isinstance(saved, Tensor) or saved.dtype != mine.dtype or saved.shape != mine.shape:
            raise LearnerError(f"{where}: not a generator state like {tuple(mine.shape)} {mine.dtype}")
    elif isinstance(current, torch.optim.Optimizer):
        groups = saved.get("param_groups") if isinstance(saved, Mapping) else None
        if not isinstance(groups, list) or "state" not in saved:
            raise LearnerError(f"{where}: not an optimiser state (state, param_groups)")
        mine = [len(g["params"]) for g in current.param_groups]
        theirs = [len(g.get("params", ())) for g in groups]
        if mine != theirs:
            raise LearnerError(f"{where}: parameter groups of sizes {theirs}, expected {mine}")
        check_plain(saved, where)
    elif isinstance(current, Stateful):
        if not isinstance(saved, Mapping):
            raise LearnerError(f"{where}: expected a state dict, got {type(saved).__name__}")
        current.check_state(saved, where)
    elif isinstance(current, dict):
        if not isinstance(saved, Mapping):
            raise LearnerError(f"{where}: expected a dict, got {type(saved).__name__}")
        _check_keys(set(current), set(saved), where)
        for key, value in current.items():
            _check(value, saved[key], f"{where}.{key}")
    else:
        check_plain(saved, where)


def _check_keys(mine: set[Any], theirs: set[Any], where: str) -> None:
    missing, extra = sorted(map(str, mine - theirs)), sorted(map(str, theirs - mine))
    if missing:
        raise LearnerError(f"{where}: missing key(s) {', '.join(repr(k) for k in missing)}")
    if extra:
        raise LearnerError(f"{where}: unexpected key(s) {', '.join(repr(k) for k in extra)}")


@torch.no_grad()
def _restore(current: Any, saved: Any) -> Any:
    """Put ``saved`` (checked by :func:`_check`) into ``current``; returns the value to keep.

    Tensors of the same shape are copied in place, so that an optimiser's references to
    them stay valid; dicts are updated key by key; generators, optimisers and nested
    :class:`Stateful` objects load their own state.
    """
    if isinstance(current, Tensor):
        if saved.shape == current.shape:
            return current.copy_(saved)
        return saved.to(device=current.device, dtype=current.dtype).clone().requires_grad_(current.requires_grad)
    if isinstance(current, torch.Generator):
        current.set_state(saved)
        return current
    if isinstance(current, torch.optim.Optimizer):
        # torch keeps the given tensors where device and dtype already match: a copy, so
        # that two learners loaded from one state never share Adam moments
        current.load_state_dict(copy.deepcopy(dict(saved)))
        return current
    if isinstance(current, Stateful):
        current.load_state_dict(saved)
        return current
    if isinstance(current, dict):
        for key in current:
            current[key] = _restore(current[key], saved[key])
        return current
    return copy.deepcopy(saved)


class Stateful:
    """One declared save/load mechanism: ``state_fields`` names the attributes that are the
    object's state, and ``state_dict`` / ``load_state_dict`` are built from them.

    Each field is saved by the kind of its current value: a tensor (a copy), a
    ``torch.Generator`` (its state), an optimiser (its state dict), a nested
    :class:`Stateful`, a dict of any of these, or plain data (numbers, strings, None,
    lists). Loading first checks the whole state (every key present and no other, each
    tensor's shape and dtype, nested states) and raises LearnerError naming the key;
    only then does it restore the fields, in the declared order, and call
    :meth:`_after_load`. A tensor's expected shape is its current one, unless
    :meth:`_state_shapes` says otherwise (state that grows with the data). Floating
    tensors take the object's dtype, so a float64 checkpoint loads into a float32 learner.
    """

    state_fields: ClassVar[tuple[str, ...]] = ()

    def state_names(self) -> tuple[str, ...]:
        """The fields of this object's state (``state_fields`` unless an option adds some)."""
        return self.state_fields

    def _state_header(self) -> dict[str, Any]:
        """Entries a state must carry with exactly these values (e.g. the learner's name)."""
        return {}

    def _state_shapes(self, state: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        """Expected shapes of the tensor fields that grow with the data, read from ``state``'s
        own sizes (checked here); other tensors keep their current shape."""
        return {}

    def _after_load(self) -> None:
        """Drop caches derived from the state (called after every load)."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume, as checkpoint data (copies)."""
        return {**self._state_header(), **{name: _save(getattr(self, name)) for name in self.state_names()}}

    def check_state(self, state: Mapping[str, Any], where: str | None = None) -> None:
        """Raise LearnerError unless ``state`` is a complete, consistent state for this object
        (``where``: the path of a nested state in the messages)."""
        prefix = f"{where}." if where else f"{type(self).__name__}.load_state_dict: "
        where = where or f"{type(self).__name__}.load_state_dict"
        header = self._state_header()
        _check_keys(set(header) | set(self.state_names()), set(state), where)
        for key, value in header.items():
            if state[key] != value:
                raise LearnerError(f"{prefix}{key}: the state is for {state[key]!r}, this is {value!r}")
        shapes = self._state_shapes(state)
        for name in self.state_names():
            _check(getattr(self, name), state[name], f"{prefix}{name}", shapes.get(name))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore exactly what :meth:`state_dict` returned (checked first, see the class docs)."""
        self.check_state(state)
        for name in self.state_names():
            current = getattr(self, name)
            value = _restore(current, state[name])
            if value is not current or isinstance(current, PLAIN_TYPES):  # plain values go through setters
                setattr(self, name, value)
        self._after_load()


# -- capabilities and presets ------------------------------------------------------------
#: optional traits a learner declares in ``capabilities``, each with the base-class members
#: it must override
CAPABILITIES: dict[str, tuple[str, ...]] = {
    # a batch phase, pretrain(x, y, iterations=, progress=), used instead of minibatch steps (WISKI Sec. 5.1)
    "pretrain": ("pretrain",),
    # bases of inducing functions that observe() fills up to a capacity (SVDGP Algorithm 1)
    "basis": ("basis_capacity", "basis_counts"),
    # observe() adds this many basis functions per call, settable (SVDGP N_Delta)
    "n_delta": ("set_n_delta",),
    # the bound's data size N is an option, settable
    "n_data": ("set_n_data",),
    # conditions on at most point_limit points; observe() beyond that raises
    "point_limit": ("point_limit", "room"),
    # step() must be given the batch just observed (WISKI eq. (18)), not any recent minibatch
    "step_on_observed": (),
    # observe() conditions on its rows once and for good (a row observed twice counts twice) and
    # step() learns nothing: pretraining observes each row once, online updates take no steps
    "one_pass": (),
}
#: the named scales of every learner's size table (``presets``): "small", sized for the control
#: runs (minutes on 2 cores); "cpu", sized so that a 2000-iteration replay at N_m = 1024 takes
#: minutes of one core (the times: docs/results/implementation-timings.md); "paper", the
#: papers' sizes (SVDGP Section 4 and Appendix B)
PRESETS = ("small", "cpu", "paper")

# -- input checks ------------------------------------------------------------------------
#: the largest magnitude of a learner input, the episode store's limit
#: (:data:`gpdyn.data.store.MAX_ABS`): inputs and targets of the robots here, raw or
#: normalised, stay far below it, and beyond it squared distances and sums of squares
#: overflow (a target of 1e200 makes the caches of a linear-in-y learner infinite)
MAX_ABS = 1e100


@dataclass(frozen=True)
class EntryPoint:
    """How the base class checks one public method of a learner (see :data:`ENTRY_POINTS`).

    ``takes_y``: the method takes ``(x [N, D], y [N, P])``, both 2-D with the same rows;
    otherwise ``x [..., D]`` with any leading shape. ``empty``: what a call without rows
    gets, without the learner's body running: ``"skip"`` (nothing to learn: None),
    ``"refuse"`` (a LearnerError: a loss or bound of no rows is undefined), ``"mean"`` or
    ``"moments"`` (empty predictions, ``[..., P]``: one tensor or a pair). ``on_device``:
    the values are checked on a GPU too, a host sync (:meth:`Learner.checks_values_on_device`).
    """

    takes_y: bool
    empty: str
    on_device: bool


#: the checked entry points. Values are checked on the CPU at every call (reading a result
#: back costs nothing there); on a GPU only where the learner keeps the data, observe and
#: pretrain, because a check there is a host sync and predict, predict_mean and step
#: promise none (tests/test_cuda_sync.py): on a GPU a NaN input gives NaN outputs.
ENTRY_POINTS: dict[str, EntryPoint] = {
    "observe": EntryPoint(takes_y=True, empty="skip", on_device=True),
    "pretrain": EntryPoint(takes_y=True, empty="refuse", on_device=True),
    "step": EntryPoint(takes_y=True, empty="refuse", on_device=False),
    "vlb": EntryPoint(takes_y=True, empty="refuse", on_device=False),
    "predict": EntryPoint(takes_y=False, empty="moments", on_device=False),
    "predict_mean": EntryPoint(takes_y=False, empty="mean", on_device=False),
    "predict_y": EntryPoint(takes_y=False, empty="moments", on_device=False),
}


def _checked(method: str, body: Callable[..., Any]) -> Callable[..., Any]:
    """``body`` (a learner's ``method``) behind the base class's input checks.

    A learner calling its own entry points (``super().observe``, ``pretrain`` ending in
    ``observe``, WISKI's calibration predicting the batch it observes) is not checked
    again: only the outermost call is, once, so that a checked call costs one check (and
    on a GPU at most one host sync) however the learner is built.
    """
    if getattr(body, "__learner_entry__", None) == method:
        return body
    entry = ENTRY_POINTS[method]

    @functools.wraps(body)
    def checked(self: Learner, *args: Any, **kwargs: Any) -> Any:
        if self._inside_entry:
            return body(self, *args, **kwargs)
        x = args[0] if args else kwargs.get("x")
        y = (args[1] if len(args) > 1 else kwargs.get("y")) if entry.takes_y else None
        if not self.check_inputs(method, x, y):
            if entry.empty == "skip":
                return None
            if entry.empty == "refuse":
                raise LearnerError(f"{type(self).__name__}.{method}: x has no rows (shape {tuple(x.shape)}); "
                                   f"{method} needs at least one")
            zeros = x.new_zeros(*x.shape[:-1], self.output_dim)
            return zeros if entry.empty == "mean" else (zeros, zeros.clone())
        self._inside_entry = True
        try:
            return body(self, *args, **kwargs)
        finally:
            self._inside_entry = False

    checked.__learner_entry__ = method  # type: ignore[attr-defined]
    return checked


def _where(index: tuple[int, ...]) -> str:
    """An entry's place in words: ``row 3, column 1`` of a matrix, ``column 1`` of a vector."""
    if len(index) == 2:
        return f"row {index[0]}, column {index[1]}"
    if len(index) == 1:
        return f"column {index[0]}"
    return f"entry {list(index)}"


def _within_limit(t: Tensor) -> bool:
    """Every entry of ``t`` a finite number within ``±MAX_ABS``: one reduction, two numbers read
    back (NaN propagates through aminmax and fails every comparison)."""
    lo, hi = torch.aminmax(t)
    return -MAX_ABS <= lo.item() and hi.item() <= MAX_ABS


def _first_bad(t: Tensor, bad: Tensor) -> tuple[str, float, int]:
    """Where the first True of ``bad`` lies in ``t``, its value and how many there are."""
    index = tuple(bad.nonzero()[0].tolist())
    return _where(index), t[index].item(), int(bad.sum())


class Learner(Stateful, abc.ABC):
    """Online GP regression for ``output_dim`` independent outputs.

    Device and dtype are fixed at construction. Hyperparameters are initialised from
    the first data passed to :meth:`observe` (SVDGP Appendix B: median trick for
    lengthscales, output variance for the noise, unit amplitude).

    Class declarations (see the module docs): ``name`` (the registry name),
    ``capabilities``, ``state_fields``, ``presets`` (options by preset name) and
    ``basis_options`` (the options that size a basis or a data subset, capped at the
    training-set size by :func:`gpdyn.gp.make_learner`).
    """

    #: registry name, e.g. "svdgp"
    name: str = ""
    capabilities: ClassVar[frozenset[str]] = frozenset()
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    basis_options: ClassVar[tuple[str, ...]] = ()
    #: True once the learner has data to predict from
    initialized: bool = False
    #: True while a checked entry point runs (see :func:`_checked`)
    _inside_entry: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for method in ENTRY_POINTS:  # the input checks, whatever the class's own code does
            if method in vars(cls):
                setattr(cls, method, _checked(method, vars(cls)[method]))
        unknown = set(cls.capabilities) - set(CAPABILITIES)
        if unknown:
            raise TypeError(f"{cls.__name__}: unknown capabilities {sorted(unknown)}; known: {sorted(CAPABILITIES)}")
        for capability in cls.capabilities:
            for member in CAPABILITIES[capability]:
                if getattr(cls, member) is getattr(Learner, member):
                    raise TypeError(f"{cls.__name__} declares '{capability}' but does not define {member}")
        unknown_presets = set(cls.presets) - set(PRESETS)
        if unknown_presets:
            raise TypeError(f"{cls.__name__}: unknown presets {sorted(unknown_presets)}; known: {PRESETS}")

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64,
        seed: int = 0,
    ) -> None:
        if input_dim < 1 or output_dim < 1:
            raise LearnerError(f"{type(self).__name__}: input_dim and output_dim must be >= 1, got {input_dim}, {output_dim}")
        self.input_dim = int(input_dim)
        self.output_dim = int(output_dim)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None and torch.cuda.is_available():
            # "cuda" means the current device; pin it so input checks compare exact devices
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = dtype
        self.seed = int(seed)
        self.generator = torch.Generator(device="cpu").manual_seed(self.seed)
        # Constructor arguments (device and dtype aside): subclasses add their options so
        # that a checkpoint can rebuild the learner (gpdyn.gp.online.save_learner).
        self.config: dict[str, Any] = {"input_dim": self.input_dim, "output_dim": self.output_dim, "seed": self.seed}

    @classmethod
    def from_options(cls, input_dim: int, output_dim: int, **options: Any) -> Learner:
        """Construct from the registry's arguments (:func:`gpdyn.gp.make_learner`); a learner
        whose constructor takes other objects (ResidualGP's prior) builds them here."""
        return cls(input_dim, output_dim, **options)

    @classmethod
    def can(cls, capability: str) -> bool:
        """Whether the learner declares ``capability`` (a name of :data:`CAPABILITIES`)."""
        if capability not in CAPABILITIES:
            raise LearnerError(f"unknown learner capability '{capability}'; known: {', '.join(CAPABILITIES)}")
        return capability in cls.capabilities

    def lacks(self, capability: str, member: str) -> LearnerError:
        """The error for calling ``member`` of ``capability`` on a learner that does not declare it."""
        return LearnerError(f"{type(self).__name__}.{member}: the learner has no '{capability}' capability "
                            f"(it declares {', '.join(sorted(self.capabilities)) or 'none'})")

    # -- the contract ------------------------------------------------------------
    @abc.abstractmethod
    def observe(self, x: Tensor, y: Tensor) -> None:
        """New data ``x [N, D]``, ``y [N, P]``: add basis functions / update caches."""

    @abc.abstractmethod
    def step(self, x: Tensor, y: Tensor) -> dict[str, Tensor | float]:
        """One optimiser update on a minibatch; returns scalar metrics, at least ``loss``.

        Values may be 0-d tensors on the learner's device: converting them to floats
        would sync with the device on every step, so callers do that when they log.
        """

    @abc.abstractmethod
    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Predictive mean and variance of the latent function, ``[..., P]`` each, for ``x [..., D]``."""

    @abc.abstractmethod
    def vlb(self, x: Tensor, y: Tensor) -> Tensor:
        """Variational lower bound (or log marginal likelihood) per output, ``[P]``, per data point."""

    @abc.abstractmethod
    def noise_variance(self) -> Tensor:
        """The observation noise variance sigma^2 of each output, ``[P]``, detached: the model is
        ``y = f(x) + eps`` with ``eps ~ N(0, sigma^2)``, and :meth:`predict` gives ``f``."""

    @functools.partial(_checked, "predict_mean")
    def predict_mean(self, x: Tensor) -> Tensor:
        """Predictive mean of the latent function only, ``[..., P]`` for ``x [..., D]``.

        The planners' hot path when their cost does not use the variance: a learner
        overrides it with a path that skips the variance arithmetic (for most learners
        95 % or more of :meth:`predict`'s). Equal to ``predict(x)[0]`` up to rounding; no
        host sync; works under ``torch.no_grad()``.
        """
        return self.predict(x)[0]

    def mean_program(self) -> MeanProgram | None:
        """:meth:`predict_mean` as a :class:`MeanProgram` for callers that compile it into a
        larger program, or None (the default): the learner's mean is not written for
        :func:`torch.compile`. A learner returns one only where compiling is what its
        options asked for (WISKI's ``compiled_mean``)."""
        return None

    @functools.partial(_checked, "predict_y")
    def predict_y(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Predictive mean and variance of an observation ``y`` at ``x [..., D]``, ``[..., P]`` each:
        :meth:`predict`'s latent variance plus :meth:`noise_variance` (what held-out targets are
        scored against: log likelihood and interval coverage)."""
        mean, var = self.predict(x)
        return mean, var + self.noise_variance()

    def diagnostics(self) -> dict[str, float]:
        """Counters worth logging beside the metrics (e.g. WISKI's points clamped onto its
        grid); empty by default. Reading device counters syncs a GPU, so callers ask at
        evaluation or episode time, not every step."""
        return {}

    def _state_header(self) -> dict[str, Any]:
        return {"name": self.name}

    # -- optional capabilities: the defaults of a learner without them ----------------------
    def pretrain(self, x: Tensor, y: Tensor, iterations: int | None = None, progress: bool = True) -> dict[str, float]:
        """``"pretrain"``: a batch phase on ``x, y`` that replaces minibatch steps."""
        raise self.lacks("pretrain", "pretrain")

    @property
    def basis_capacity(self) -> dict[str, int]:
        """``"basis"``: the size of each basis (empty without bases)."""
        return {}

    @property
    def basis_counts(self) -> dict[str, int]:
        """``"basis"``: how many functions each basis holds so far (empty without bases)."""
        return {}

    def set_n_delta(self, n_delta: int) -> None:
        """``"n_delta"``: basis functions added per :meth:`observe` call (kept in the config)."""
        raise self.lacks("n_delta", "set_n_delta")

    def set_n_data(self, n_data: int) -> None:
        """``"n_data"``: the data size N of the bound (kept in the config)."""
        raise self.lacks("n_data", "set_n_data")

    @property
    def point_limit(self) -> int | None:
        """``"point_limit"``: the most points it conditions on (None: no limit)."""
        return None

    def room(self) -> int | None:
        """``"point_limit"``: how many more points :meth:`observe` accepts (None: no limit)."""
        return None

    # -- input checks ----------------------------------------------------------------
    def checks_values_on_device(self, method: str) -> bool:
        """Whether ``method`` checks its inputs' values on a GPU, one host sync per call (on the
        CPU they are always checked): the methods whose data the learner keeps, observe and
        pretrain (:data:`ENTRY_POINTS`). A learner that promises a sync-free ``observe``
        (WISKI's ``validate=False``) says no here."""
        return ENTRY_POINTS[method].on_device

    def check_inputs(self, method: str, x: Any, y: Any = None) -> bool:
        """Raise LearnerError unless ``x`` (and ``y``, where ``method`` takes it) are fit for
        ``method`` of :data:`ENTRY_POINTS`; return whether they hold any rows.

        The checks: tensors on the learner's device and of its dtype (no silent cast: a
        float32 batch to a float64 learner is a mistake upstream); ``x [N, D]`` and
        ``y [N, P]`` with the same ``N``, or ``x [..., D]`` for the predictions; then, on the
        CPU, or on a GPU where :meth:`checks_values_on_device` says so, every value a
        finite number within ``±MAX_ABS`` (:class:`NonFiniteError`). The values cost one
        fused reduction per tensor (its min and max at once; NaN propagates and fails every
        comparison) and, on a GPU, one read-back for all. Only a failure pays for the
        message, which names the learner, the method, the argument and the first bad entry.
        """
        takes_y = ENTRY_POINTS[method].takes_y
        if not takes_y:
            y = None
        if not self._fits(x, y, takes_y):
            self._refuse(f"{type(self).__name__}.{method}", x, y, takes_y)
        if x.numel() == 0:
            return False
        if self.device.type == "cpu":  # each tensor's two numbers read back (no stack to pay for)
            ok = _within_limit(x) and (y is None or _within_limit(y))
        elif self.checks_values_on_device(method):  # one read-back for all: one host sync
            extremes = torch.stack([*torch.aminmax(x), *(torch.aminmax(y) if y is not None else ())]).tolist()
            ok = all(-MAX_ABS <= e <= MAX_ABS for e in extremes)
        else:
            ok = True
        if not ok:
            self._refuse_values(f"{type(self).__name__}.{method}", {"x": x} if y is None else {"x": x, "y": y})
        return True

    def _fits(self, x: Any, y: Any, takes_y: bool) -> bool:
        """Types, dtypes, devices and shapes as :meth:`check_inputs` wants them: host metadata only."""
        fit = (isinstance(x, Tensor) and x.dtype == self.dtype and x.device == self.device
               and (x.ndim == 2 if takes_y else x.ndim >= 1) and x.shape[-1] == self.input_dim)
        if takes_y:
            fit = fit and (isinstance(y, Tensor) and y.dtype == self.dtype and y.device == self.device
                           and y.ndim == 2 and y.shape[0] == x.shape[0] and y.shape[1] == self.output_dim)
        return fit

    def _refuse(self, label: str, x: Any, y: Any, takes_y: bool) -> None:
        """Raise the LearnerError that says why ``x`` / ``y`` do not fit (:meth:`_fits` said so)."""
        d, p = self.input_dim, self.output_dim
        for arg, t in (("x", x), ("y", y)) if takes_y else (("x", x),):
            if not isinstance(t, Tensor):
                raise LearnerError(f"{label}: {arg} must be a torch.Tensor, got {type(t).__name__}")
            if t.device != self.device or t.dtype != self.dtype:
                raise LearnerError(f"{label}: {arg} is {t.dtype} on {t.device}, the learner is {self.dtype} on "
                                   f"{self.device}")
        if takes_y and x.ndim != 2:
            raise LearnerError(f"{label}: x has shape {tuple(x.shape)}, expected (rows, {d}): a 2-D batch")
        if x.ndim == 0:
            raise LearnerError(f"{label}: x is a 0-d tensor, expected (..., {d})")
        if x.shape[-1] != d:
            raise LearnerError(f"{label}: x has {x.shape[-1]} columns, expected {d} (shape {tuple(x.shape)})")
        if takes_y and (y.ndim != 2 or y.shape[1] != p or y.shape[0] != x.shape[0]):
            raise LearnerError(f"{label}: y has shape {tuple(y.shape)}, expected ({x.shape[0]}, {p}) to match x")
        raise AssertionError(f"{label}: _fits refused inputs that _refuse finds no fault with")

    @staticmethod
    def _refuse_values(label: str, tensors: Mapping[str, Tensor]) -> None:
        """Raise the NonFiniteError naming the first entry of ``tensors`` beyond ``±MAX_ABS`` or NaN."""
        for arg, t in tensors.items():
            bad = ~(t.abs() <= MAX_ABS)
            if bool(bad.any()):
                where, value, count = _first_bad(t, bad)
                kind = "NaN or inf" if not math.isfinite(value) else f"values beyond ±{MAX_ABS:g}"
                raise NonFiniteError(f"{label}: {arg} contains {kind}: {where} is {value!r} ({count} value(s) in {arg} "
                                     f"are not finite numbers within ±{MAX_ABS:g}, what a learner takes)")
        raise AssertionError(f"{label}: values refused that _refuse_values finds no fault with")

    def check_xy(self, x: Tensor, y: Tensor | None = None, where: str = "") -> None:
        """Raise LearnerError for a wrong type, device, dtype or shape (no value is read): for a
        method of a learner that is not an entry point (ORTH's ``natural_step``)."""
        takes_y = y is not None
        if not self._fits(x, y, takes_y):
            self._refuse(f"{type(self).__name__}.{where}" if where else type(self).__name__, x, y, takes_y)

    def check_finite(self, where: str, **tensors: Tensor) -> None:
        """Raise NonFiniteError on NaN/inf in tensors the learner derives from its input (a
        residual, a design matrix). This syncs with the device: not for the hot path."""
        for name, t in tensors.items():
            if not bool(torch.isfinite(t).all()):
                place, value, count = _first_bad(t, ~torch.isfinite(t))
                raise NonFiniteError(f"{type(self).__name__}.{where}: {name} contains NaN or inf: {place} is {value!r} "
                                     f"({count} such value(s))")
