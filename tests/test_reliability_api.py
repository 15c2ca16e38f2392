"""The Python API's edge values: the learner base class checks every entry point's inputs
(issue #36 item 5, issue #37), and a recipe nested too deep is an InputError.

Every registered learner, and a new learner written without any checks of its own, refuses
NaN, inf and values beyond ``MAX_ABS`` in ``x`` and ``y``, wrong widths, ranks, rows,
types, dtypes and devices, before its own code runs (its state unchanged), with a message
that names the learner, the method, the argument and the first bad entry; an empty batch
gets the contract's answer (docs/reliability.md "Learner input checks").
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import pytest
import torch
from learner_data import random_data
from torch import Tensor

from gpdyn.data.store import MAX_ABS as STORE_MAX_ABS
from gpdyn.errors import InputError
from gpdyn.gp import LEARNERS, Learner, LearnerError, learner_class, make_learner
from gpdyn.gp.base import ENTRY_POINTS, MAX_ABS, NonFiniteError
from gpdyn.recipes import MAX_NESTING, RECIPE_DIR, load_recipe

D, P = 3, 2
ROWS = 48
OPTIONS: dict[str, dict[str, Any]] = {"exact": {"refit_every": 1, "refit_iters": 1},
                                      "residual": {"refit_every": 1, "refit_iters": 1}}
NAMES = sorted(LEARNERS)
XY_METHODS = ("observe", "step", "vlb")
X_METHODS = ("predict", "predict_mean", "predict_y")


def _methods(name: str) -> list[str]:
    return [*XY_METHODS, *X_METHODS, *(["pretrain"] if learner_class(name).can("pretrain") else [])]


NAME_METHOD = [(name, method) for name in NAMES for method in _methods(name)]


def _learner(name: str) -> Learner:
    return make_learner(name, D, P, preset="small", rows=ROWS, **OPTIONS.get(name, {}))


@functools.cache
def _trained(name: str) -> Learner:
    """One learner per name with data, shared: every call on it below is refused before its body runs."""
    x, y = random_data(40, D, P, seed=5)
    learner = _learner(name)
    learner.observe(x, y)
    learner.step(x, y)
    return learner


def _batch(rows: int = 6) -> tuple[Tensor, Tensor]:
    return random_data(rows, D, P, seed=9)


def _call(learner: Learner, method: str, x: Any, y: Any) -> Any:
    if method == "pretrain":
        return learner.pretrain(x, y, iterations=1, progress=False)
    return getattr(learner, method)(x, y) if method in XY_METHODS else getattr(learner, method)(x)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor):
        return isinstance(b, Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


# -- values: NaN, inf and magnitudes beyond MAX_ABS ----------------------------------------------------
#: (argument, row, column, value) planted in a finite batch
BAD_VALUES = [("x", 1, 2, math.nan), ("x", 4, 0, -math.inf), ("x", 0, 1, -1e200),
              ("y", 2, 1, math.inf), ("y", 3, 0, math.nan), ("y", 5, 1, 1e200)]


@pytest.mark.parametrize("name, method", NAME_METHOD)
@pytest.mark.slow
def test_bad_values_are_refused_naming_learner_method_argument_and_entry(name: str, method: str) -> None:
    learner = _trained(name)
    label = f"{type(learner).__name__}.{method}"
    before = learner.state_dict()
    for arg, row, col, value in BAD_VALUES:
        if arg == "y" and method in X_METHODS:
            continue
        x, y = _batch()
        (x if arg == "x" else y)[row, col] = value
        kind = "NaN or inf" if not math.isfinite(value) else r"values beyond ±1e\+100"
        want = rf"^{re.escape(label)}: {arg} contains {kind}: row {row}, column {col} is {re.escape(repr(value))} .*finite"
        with pytest.raises(NonFiniteError, match=want):
            _call(learner, method, x, y)
    assert _same(before, learner.state_dict()), f"{label} changed the learner before refusing"


@pytest.mark.parametrize("name", NAMES)
def test_predict_of_a_batch_with_leading_axes_names_the_bad_entry(name: str) -> None:
    x = _batch(6)[0].reshape(2, 3, D)
    x[1, 2, 0] = math.nan
    with pytest.raises(NonFiniteError, match=r"predict: x contains NaN or inf: entry \[1, 2, 0\] is nan"):
        _trained(name).predict(x)
    with pytest.raises(NonFiniteError, match=r"predict_mean: x contains NaN or inf: column 1 is inf"):
        _trained(name).predict_mean(torch.tensor([0.0, math.inf, 0.0], dtype=torch.float64))


def test_the_limit_is_the_stores_and_holds_at_its_edge() -> None:
    assert MAX_ABS == STORE_MAX_ABS
    learner = _learner("rls")
    x, y = _batch()
    y[0, 0] = MAX_ABS  # the limit itself is taken
    learner.observe(x, y)
    y[0, 0] = -MAX_ABS * 1.01
    with pytest.raises(NonFiniteError, match=r"RLS.observe: y contains values beyond ±1e\+100: row 0, column 0 is -1.01e\+100"):
        learner.observe(x, y)


# -- the findings of issue #37 ------------------------------------------------------------------------
def test_wiski_refuses_y_1e200_and_keeps_predicting_finite_values() -> None:
    learner = _learner("wiski")
    x, y = random_data(40, D, P, seed=2)
    learner.observe(x, y)
    with pytest.raises(NonFiniteError, match=r"WISKI.observe: y contains values beyond ±1e\+100: row 0, column 0 is 1e\+200"):
        learner.observe(x[:4], torch.full((4, P), 1e200, dtype=torch.float64))
    mean, var = learner.predict(x)
    assert bool(torch.isfinite(mean).all() and torch.isfinite(var).all())


def test_exact_step_refuses_nan_y_and_inf_x() -> None:
    learner = _learner("exact")
    x, y = random_data(20, D, P, seed=3)
    learner.observe(x, y)
    steps = learner.steps
    y[7, 1] = math.nan
    with pytest.raises(NonFiniteError, match="ExactOnlineGP.step: y contains NaN or inf: row 7, column 1 is nan"):
        learner.step(x, y)
    x, y = random_data(20, D, P, seed=3)
    x[3, 0] = math.inf
    with pytest.raises(NonFiniteError, match="ExactOnlineGP.step: x contains NaN or inf: row 3, column 0 is inf"):
        learner.step(x, y)
    assert learner.steps == steps  # neither counted as a step


@pytest.mark.parametrize("name", ["svdgp", "exact", "svi", "orthnat"])
def test_predict_with_nan_inputs_raises_instead_of_returning_nan(name: str) -> None:
    x = _batch()[0]
    x[2, 1] = math.nan
    for method in X_METHODS:
        with pytest.raises(NonFiniteError, match=f"{method}: x contains NaN or inf: row 2, column 1 is nan"):
            getattr(_trained(name), method)(x)


def test_a_non_finite_input_is_a_floating_point_error_for_the_planners_fallback() -> None:
    # gpdyn.control.mpc.Planner.plan falls back on a FloatingPointError from the model
    assert issubclass(NonFiniteError, FloatingPointError) and issubclass(NonFiniteError, InputError)


# -- types, devices, dtypes, ranks, widths and rows -----------------------------------------------------
def _shape_faults(method: str) -> list[tuple[str, Any, Any, str]]:
    """(what, x, y, the message's pattern) for ``method``."""
    x, y = _batch()
    faults = [
        ("numpy x", x.numpy(), y, r"x must be a torch.Tensor, got ndarray"),
        ("list x", x.tolist(), y, r"x must be a torch.Tensor, got list"),
        ("float32 x", x.float(), y, r"x is torch.float32 on cpu, the learner is torch.float64 on cpu"),
        ("integer x", x.long(), y, r"x is torch.int64 on cpu"),
        ("meta x", x.to("meta"), y, r"x is torch.float64 on meta, the learner is torch.float64 on cpu"),
        ("wide x", torch.cat([x, x[:, :1]], 1), y, rf"x has {D + 1} columns, expected {D}"),
        ("narrow x", x[:, :1], y, rf"x has 1 columns, expected {D}"),
    ]
    if method in X_METHODS:
        return faults + [("0-d x", x[0, 0], None, rf"x is a 0-d tensor, expected \(\.\.\., {D}\)")]
    return faults + [
        ("1-D x", x[0], y, rf"x has shape \({D},\), expected \(rows, {D}\): a 2-D batch"),
        ("3-D x", x[None], y, rf"x has shape \(1, 6, {D}\), expected \(rows, {D}\)"),
        ("numpy y", x, y.numpy(), r"y must be a torch.Tensor, got ndarray"),
        ("float32 y", x, y.float(), r"y is torch.float32 on cpu"),
        ("1-D y", x, y[:, 0], rf"y has shape \(6,\), expected \(6, {P}\) to match x"),
        ("wide y", x, torch.cat([y, y], 1), rf"y has shape \(6, {2 * P}\), expected \(6, {P}\)"),
        ("fewer y rows", x, y[:5], rf"y has shape \(5, {P}\), expected \(6, {P}\) to match x"),
        ("more y rows", x[:5], y, rf"y has shape \(6, {P}\), expected \(5, {P}\) to match x"),
        ("no y", x, None, r"y must be a torch.Tensor, got NoneType"),
    ]


@pytest.mark.parametrize("name, method", NAME_METHOD)
def test_wrong_types_shapes_and_rows_are_refused_naming_the_argument(name: str, method: str) -> None:
    learner = _trained(name)
    label = re.escape(f"{type(learner).__name__}.{method}")
    for what, x, y, pattern in _shape_faults(method):
        try:
            _call(learner, method, x, y)
        except LearnerError as err:
            assert re.search(f"^{label}: {pattern}", str(err)), f"{what}: {err}"
        else:
            pytest.fail(f"{name}.{method}: {what} was accepted")


# -- empty batches ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_an_empty_batch_gets_the_contracts_answer(name: str) -> None:
    """observe: nothing to learn (None, no change); step, vlb, pretrain: refused (a loss or bound of
    no rows is undefined); the predictions: empty tensors of the batch's leading shape."""
    learner = _trained(name)
    x, y = _batch(0)
    before = learner.state_dict()
    assert learner.observe(x, y) is None
    for method in ("step", "vlb", *(["pretrain"] if learner.can("pretrain") else [])):
        with pytest.raises(LearnerError, match=f"{type(learner).__name__}.{method}: x has no rows"):
            _call(learner, method, x, y)
    assert _same(before, learner.state_dict())
    for lead in ((0,), (2, 0)):
        xe = torch.zeros(*lead, D, dtype=torch.float64)
        mean, var = learner.predict(xe)
        assert mean.shape == var.shape == (*lead, P)
        assert learner.predict_mean(xe).shape == (*lead, P)
        assert all(t.shape == (*lead, P) for t in learner.predict_y(xe))
    fresh = _learner(name)  # an empty first batch starts nothing
    fresh.observe(x, y)
    assert _same(fresh.state_dict(), _learner(name).state_dict())


# -- how the checks are attached -------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_every_entry_point_of_every_learner_is_checked(name: str) -> None:
    cls = learner_class(name)
    for method in ENTRY_POINTS:
        if method == "pretrain" and not cls.can("pretrain"):
            continue
        assert getattr(getattr(cls, method), "__learner_entry__", None) == method, f"{name}.{method} is not checked"


def test_gpu_value_checks_are_where_a_sync_is_allowed() -> None:
    """On a GPU a value check is a host sync: observe and pretrain only, and not WISKI's observe
    with validate=False once the grid is set (tests/test_cuda_sync.py holds the promise)."""
    svdgp = _learner("svdgp")
    assert [m for m in ENTRY_POINTS if svdgp.checks_values_on_device(m)] == ["observe", "pretrain"]
    wiski = make_learner("wiski", D, P, preset="small", validate=False)
    assert wiski.checks_values_on_device("observe")  # the first batch sets the grid: checked
    wiski.observe(*_batch(20))
    assert not wiski.checks_values_on_device("observe") and wiski.checks_values_on_device("pretrain")
    assert _trained("wiski").checks_values_on_device("observe")  # validate=True, the default


class Bare(Learner):
    """A new learner written without a single check: the running mean of what it observed,
    recording which calls reached its body."""

    name = "bare"

    def __init__(self, input_dim: int, output_dim: int, **kwargs: Any) -> None:
        super().__init__(input_dim, output_dim, **kwargs)
        self.total = torch.zeros(output_dim, dtype=self.dtype)
        self.count = 0
        self.reached: list[str] = []
        self.fail_next = False

    def observe(self, x: Tensor, y: Tensor) -> None:
        self.reached.append("observe")
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the body failed")
        self.total = self.total + y.sum(0)
        self.count += y.shape[0]
        self.initialized = True

    def step(self, x: Tensor, y: Tensor) -> dict[str, float]:
        self.reached.append("step")
        return {"loss": float((y - self.total / max(self.count, 1)).pow(2).mean())}

    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        self.reached.append("predict")
        mean = (self.total / max(self.count, 1)).expand(*x.shape[:-1], self.output_dim)
        return mean, torch.ones_like(mean)

    def vlb(self, x: Tensor, y: Tensor) -> Tensor:
        self.reached.append("vlb")
        return torch.zeros(self.output_dim, dtype=self.dtype)

    def noise_variance(self) -> Tensor:
        return torch.ones(self.output_dim, dtype=self.dtype)


class BareTwice(Bare):
    """A subclass that extends observe through super(): the inputs are checked once."""

    name = "bare-twice"

    def observe(self, x: Tensor, y: Tensor) -> None:
        self.reached.append("observe (subclass)")
        super().observe(x, y)


def test_a_new_learner_without_checks_of_its_own_is_checked_by_the_base_class() -> None:
    learner = Bare(D, P)
    x, y = _batch()
    bad_y = y.clone()
    bad_y[1, 0] = math.nan
    with pytest.raises(NonFiniteError, match=r"^Bare.observe: y contains NaN or inf: row 1, column 0 is nan"):
        learner.observe(x, bad_y)
    with pytest.raises(NonFiniteError, match=r"^Bare.step: y contains values beyond ±1e\+100: row 5, column 0 is 1e\+200"):
        learner.step(x, torch.where(torch.arange(6)[:, None] == 5, 1e200, y))
    with pytest.raises(LearnerError, match=rf"^Bare.predict: x has 2 columns, expected {D}"):
        learner.predict(x[:, :2])
    with pytest.raises(LearnerError, match=r"^Bare.vlb: y has shape \(5, 2\), expected \(6, 2\) to match x"):
        learner.vlb(x, y[:5])
    with pytest.raises(NonFiniteError, match=r"^Bare.predict_mean: x contains NaN or inf: row 0, column 0 is inf"):
        learner.predict_mean(torch.where(x == x[0, 0], math.inf, x))  # the base class's default, checked too
    with pytest.raises(LearnerError, match=r"^Bare.predict_y: x is torch.float32"):
        learner.predict_y(x.float())
    with pytest.raises(LearnerError, match=r"^Bare.step: x has no rows"):
        learner.step(x[:0], y[:0])
    assert learner.reached == [] and learner.count == 0  # nothing reached the learner's code
    learner.observe(x, y)
    learner.observe(x[:0], y[:0])  # empty: the body is not called
    assert learner.predict_mean(x).shape == (6, P) and learner.reached == ["observe", "predict"]
    assert torch.allclose(learner.predict_mean(x[:1])[0], y.mean(0))


def test_a_learner_calling_its_own_entry_points_is_checked_once_and_again_after_a_failure(monkeypatch) -> None:
    learner = BareTwice(D, P)
    calls: list[str] = []
    check = Learner.check_inputs
    monkeypatch.setattr(Learner, "check_inputs", lambda self, method, *a: calls.append(method) or check(self, method, *a))
    x, y = _batch()
    learner.observe(x, y)
    assert calls == ["observe"] and learner.reached == ["observe (subclass)", "observe"]
    learner.fail_next = True
    with pytest.raises(RuntimeError, match="the body failed"):
        learner.observe(x, y)
    x[0, 0] = math.nan  # the failure above left nothing behind: this call is checked again
    with pytest.raises(NonFiniteError, match="BareTwice.observe: x contains NaN or inf: row 0, column 0 is nan"):
        learner.observe(x, y)
    assert calls == ["observe"] * 3


# -- recipes nested too deep -----------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 100_000])
def test_a_recipe_nested_too_deep_is_an_input_error_naming_the_file_and_the_limit(tmp_path, depth: int) -> None:
    """Arrays nested ``depth`` deep are refused before the parser recurses; as many brackets in a
    string or a comment are no nesting."""
    shipped = (RECIPE_DIR / "walker-quick-look.toml").read_text()
    brackets = "[" * depth
    quoted = tmp_path / "quoted.toml"
    quoted.write_text(shipped.replace('title = "', f'title = "{brackets} ', 1) + f"\n# {brackets}\n")
    recipe = load_recipe(str(quoted))
    assert recipe.title.startswith(brackets) and recipe.values == load_recipe("walker-quick-look").values
    deep = tmp_path / "deep.toml"
    deep.write_text(f"{shipped}\n[extra]\nvalues = {brackets}{']' * depth}\n")
    with pytest.raises(InputError, match=rf"recipe {re.escape(str(deep))}: line \d+: arrays or tables nested more "
                                         rf"than {MAX_NESTING} deep \(the nesting limit of a recipe\)"):
        load_recipe(str(deep))
