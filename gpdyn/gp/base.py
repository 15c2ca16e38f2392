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
"""

from __future__ import annotations

import abc
import copy
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


class NonFiniteError(LearnerError):
    """NaN or inf in a learner's data, raised before the learner changes any state."""


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
}
#: the named scales of every learner's size table (``presets``): "small", the control runs
#: (minutes on 2 cores); "cpu", the steps of a 2000-iteration replay at N_m = 1024 in 2.5 to
#: 6 minutes of one core (measured in CPU time, float64, D = 23, P = 9); "paper", the
#: papers' sizes (SVDGP Section 4 and Appendix B)
PRESETS = ("small", "cpu", "paper")


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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
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

    # -- helpers shared by the learners -------------------------------------------
    def check_xy(self, x: Tensor, y: Tensor | None = None, where: str = "") -> None:
        """Raise LearnerError for a wrong shape, device, dtype or a non-finite value."""
        label = f"{type(self).__name__}.{where}" if where else type(self).__name__
        if x.shape[-1] != self.input_dim:
            raise LearnerError(f"{label}: x has {x.shape[-1]} columns, expected {self.input_dim} (shape {tuple(x.shape)})")
        if x.device != self.device or x.dtype != self.dtype:
            raise LearnerError(f"{label}: x is {x.dtype} on {x.device}, the learner is {self.dtype} on {self.device}")
        if y is not None:
            if y.ndim != 2 or y.shape[1] != self.output_dim or y.shape[0] != x.shape[0]:
                raise LearnerError(
                    f"{label}: y has shape {tuple(y.shape)}, expected ({x.shape[0]}, {self.output_dim}) to match x"
                )
            if y.device != self.device or y.dtype != self.dtype:
                raise LearnerError(f"{label}: y is {y.dtype} on {y.device}, the learner is {self.dtype} on {self.device}")

    def check_finite(self, where: str, **tensors: Tensor) -> None:
        """Raise on NaN/inf. This syncs with the device: call it on inputs, not in predict."""
        for name, t in tensors.items():
            if not bool(torch.isfinite(t).all()):
                raise NonFiniteError(f"{type(self).__name__}.{where}: {name} contains NaN or inf")
