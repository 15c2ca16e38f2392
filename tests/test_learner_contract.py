"""The contract every registered learner keeps: declared capabilities, an exact save/load
round trip through the checkpoint helpers, its presets, and errors that name a bad state key."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from learner_data import random_data

from gpdyn.errors import InputError
from gpdyn.gp import LEARNERS, PRESETS, Learner, LearnerError, learner_class, learner_options, make_learner
from gpdyn.gp.base import CAPABILITIES
from gpdyn.gp.online import load_learner, save_learner

D, P = 3, 2
ROWS = 48  # caps every basis of the small preset: the round trips stay fast
# refits every other step, so that the continued runs exercise the restored optimisers
OPTIONS: dict[str, dict[str, Any]] = {"exact": {"refit_every": 2, "refit_iters": 2},
                                      "residual": {"refit_every": 2, "refit_iters": 2}}


def _learner(name: str, **overrides: Any) -> Learner:
    return make_learner(name, D, P, preset="small", rows=ROWS, **{**OPTIONS.get(name, {}), **overrides})


def _trained(name: str, seed: int = 3) -> tuple[Learner, torch.Tensor, torch.Tensor]:
    x, y = random_data(120, D, P, seed=seed)
    learner = _learner(name, seed=seed)
    for lo in (0, 40, 80):  # 120 rows: the exact GP grows its buffers 64 -> 128
        learner.observe(x[lo : lo + 40], y[lo : lo + 40])
        learner.step(x[lo : lo + 40], y[lo : lo + 40])
    return learner, x, y


def _same_predictions(a: Learner, b: Learner, x: torch.Tensor) -> None:
    for got, want in zip(b.predict(x), a.predict(x)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_capabilities_are_declared_and_their_defaults_say_no(name: str) -> None:
    cls = learner_class(name)
    assert cls.name == name and set(cls.capabilities) <= set(CAPABILITIES)
    learner = _learner(name)
    x, y = random_data(8, D, P)
    if cls.can("pretrain"):
        learner.pretrain(x, y, iterations=1, progress=False)
        assert learner.initialized
    else:
        with pytest.raises(LearnerError, match="'pretrain' capability"):
            learner.pretrain(x, y)
    if cls.can("basis"):
        assert learner.basis_capacity and set(learner.basis_counts) == set(learner.basis_capacity)
        assert max(learner.basis_capacity.values()) <= ROWS  # capped at the data size
    else:
        assert learner.basis_capacity == {} and learner.basis_counts == {}
    for capability, setter in (("n_delta", "set_n_delta"), ("n_data", "set_n_data")):
        if cls.can(capability):
            getattr(learner, setter)(7)
            assert learner.config[capability] == 7  # a checkpoint rebuilds it so
        else:
            with pytest.raises(LearnerError, match=f"'{capability}' capability"):
                getattr(learner, setter)(7)
    if cls.can("point_limit"):
        fresh = _learner(name)
        assert isinstance(fresh.point_limit, int) and fresh.room() == fresh.point_limit
    else:
        assert learner.point_limit is None and learner.room() is None
    with pytest.raises(LearnerError, match="unknown learner capability"):
        cls.can("teleport")


def test_a_class_must_define_what_it_declares() -> None:
    with pytest.raises(TypeError, match="does not define pretrain"):
        type("Bad", (learner_class("exact"),), {"capabilities": frozenset({"point_limit", "pretrain"})})
    with pytest.raises(TypeError, match="unknown capabilities"):
        type("Bad", (learner_class("exact"),), {"capabilities": frozenset({"teleport"})})
    with pytest.raises(TypeError, match="unknown presets"):
        type("Bad", (learner_class("exact"),), {"presets": {"huge": {}}})


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_checkpoint_round_trip_is_bit_identical(name: str, tmp_path) -> None:
    learner, x, y = _trained(name)
    path = save_learner(learner, tmp_path / f"{name}.pt", note="kept")
    assert set(torch.load(path, weights_only=True)) >= {"learner", "config", "state"}  # plain data only
    restored, extra = load_learner(path)
    assert extra == {"note": "kept"} and type(restored) is type(learner) and restored.config == learner.config
    _same_predictions(learner, restored, x)
    # resuming continues exactly as the original would (optimiser state, generator, counters)
    for model in (learner, restored):
        for lo in (80, 100):
            model.observe(x[lo : lo + 20], y[lo : lo + 20])
            model.step(x[lo : lo + 20], y[lo : lo + 20])
    _same_predictions(learner, restored, x)
    # in memory as well, into a learner built with another seed: everything comes from the state
    twin = _learner(name, seed=11)
    twin.load_state_dict(learner.state_dict())
    _same_predictions(learner, twin, x)


def test_exact_gp_restores_its_buffers_at_their_size(tmp_path) -> None:
    learner, x, _ = _trained("exact")
    assert learner.n == 120 and learner.buffer_size == 128  # grown 64 -> 128 by doubling
    restored, _ = load_learner(save_learner(learner, tmp_path / "exact.pt"))
    assert restored.buffer_size == 128 and restored.n == 120
    assert restored.chol.stride() == learner.chol.stride()
    _same_predictions(learner, restored, x)


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_every_preset_constructs_and_is_recorded(name: str) -> None:
    cls = learner_class(name)
    assert set(cls.presets) == set(PRESETS)
    options = learner_options(cls)
    for preset in PRESETS:
        assert set(cls.presets[preset]) <= set(options), f"{name}.{preset} names an option the learner lacks"
        learner = make_learner(name, D, P, preset=preset)
        assert learner.config["preset"] == preset
        for key, value in cls.presets[preset].items():
            assert learner.config[key] == value, (preset, key)
        capped = make_learner(name, D, P, preset=preset, rows=10)
        for key in cls.basis_options:
            assert capped.config[key] == min(10, cls.presets[preset].get(key, options[key].default))
    with pytest.raises(LearnerError, match="unknown preset"):
        make_learner(name, D, P, preset="huge")


def test_overrides_beat_the_preset() -> None:
    learner = make_learner("svdgp", D, P, preset="paper", m_alpha=64, rows=1000)
    assert learner.config["m_alpha"] == 64 and learner.config["m_beta"] == 128 and learner.config["preset"] == "paper"


def _tensor_leaf(state: dict[str, Any]) -> tuple[list[str], torch.Tensor]:
    """The path to a tensor of the state that is neither a generator nor optimiser state."""
    for key, value in state.items():
        if key in ("generator", "optimizer"):
            continue
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            return [key], value
        if isinstance(value, dict):
            try:
                path, leaf = _tensor_leaf(value)
            except LookupError:
                continue
            return [key, *path], leaf
    raise LookupError("no tensor in the state")


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_a_bad_state_is_an_error_naming_the_key(name: str) -> None:
    learner, _, _ = _trained(name)
    first = learner.state_names()[0]
    state = learner.state_dict()
    del state[first]
    with pytest.raises(LearnerError, match=f"missing key\\(s\\) '{first}'"):
        learner.load_state_dict(state)
    with pytest.raises(LearnerError, match="unexpected key\\(s\\) 'bogus'"):
        learner.load_state_dict({**learner.state_dict(), "bogus": 1})
    state = learner.state_dict()
    path, leaf = _tensor_leaf(state)
    parent = state
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = torch.zeros(*leaf.shape, 5, dtype=leaf.dtype)
    with pytest.raises(LearnerError, match=f"{'.'.join(path)}: shape"):
        learner.load_state_dict(state)
    with pytest.raises(LearnerError, match="name: the state is for 'other'"):
        learner.load_state_dict({**learner.state_dict(), "name": "other"})


def test_a_checkpoint_of_another_format_or_with_foreign_objects_is_refused(tmp_path) -> None:
    learner, _, _ = _trained("svdgp")
    path = save_learner(learner, tmp_path / "a.pt")
    ckpt = torch.load(path, weights_only=True)
    torch.save({**ckpt, "format": 1}, tmp_path / "old.pt")
    with pytest.raises(InputError, match="format 1"):
        load_learner(tmp_path / "old.pt")
    ckpt["state"]["params"]["log_ls"] = torch.zeros(1)
    torch.save(ckpt, tmp_path / "bad.pt")
    with pytest.raises(InputError, match="bad.pt: SVDGP.load_state_dict: params.log_ls: shape"):
        load_learner(tmp_path / "bad.pt")
    with pytest.raises(LearnerError, match="extra.thing: an object of type object is not checkpoint data"):
        save_learner(learner, tmp_path / "c.pt", thing=object())


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_predict_mean_is_the_mean_of_predict(name: str) -> None:
    """``predict_mean`` (the planners' mean-only path, which skips the variance) gives
    ``predict``'s mean to rounding, for any leading batch shape, under ``no_grad``."""
    learner, _, _ = _trained(name)
    g = torch.Generator().manual_seed(11)
    for lead in ((), (7,), (2, 3)):
        x = torch.randn(*lead, D, generator=g, dtype=torch.float64)
        with torch.no_grad():
            mean, _ = learner.predict(x)
            got = learner.predict_mean(x)
        assert got.shape == (*lead, P) and got.dtype == torch.float64
        scale = float(mean.abs().max()) if mean.numel() else 1.0
        torch.testing.assert_close(got, mean, rtol=1e-10, atol=1e-10 * scale)
