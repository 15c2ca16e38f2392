"""No code runs from a data file: stores, checkpoints and policy files are read as data only.

Each test plants a payload that would write a marker file if anything imported or
unpickled it, and checks both that the file is refused with a message naming it and that
the marker was never written.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gpdyn.cli import main
from gpdyn.data.store import EpisodeStore
from gpdyn.errors import InputError
from gpdyn.gp import make_learner
from gpdyn.gp.online import load_learner, save_learner
from gpdyn.robots.policy import PolicyError, load_policy, save_policy
from gpdyn.sim.legged import legged_fields
from gpdyn.robots.walker import WALKER

PACKAGE = Path(__file__).resolve().parents[1] / "gpdyn"


class _Trap:
    """Unpickling it writes ``_Trap.target``."""

    target: Path

    def __reduce__(self):
        return (Path.write_text, (_Trap.target, "executed"))


def _evil_module(folder: Path, marker: Path, name: str = "evilmod") -> None:
    """A module that writes ``marker`` when imported, importable from ``folder``."""
    (folder / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")


def _walker_store(path: Path, env_id: str) -> EpisodeStore:
    fields = legged_fields(WALKER)
    store = EpisodeStore.create(path, fields, source="test", env_id=env_id, dt=0.008, seed=0)
    rng = np.random.default_rng(0)
    store.append_episode({k: rng.normal(size=(4, f.width)).astype(f.dtype) for k, f in fields.items()})
    return store


def test_render_refuses_an_env_id_that_names_a_module(tmp_path, monkeypatch, capsys):
    marker = tmp_path / "marker"
    _evil_module(tmp_path, marker)
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m` from this folder would have it
    assert importlib.util.find_spec("evilmod") is not None  # gymnasium could import it
    store = _walker_store(tmp_path / "evil.zarr", "evilmod:Walker2d-v5")
    code = main(["render", "--store", str(store.path), "--episode", "0", "--out", str(tmp_path / "v.mp4")])
    err = capsys.readouterr().err
    assert code == 2 and "env_id" in err and "evil.zarr" in err and "evilmod:Walker2d-v5" in err
    assert "Traceback" not in err
    assert not marker.exists() and "evilmod" not in sys.modules
    assert not (tmp_path / "v.mp4").exists()


@pytest.mark.parametrize("env_id", ["Ant-v5", "evilmod:Walker2d-v5", "gymnasium.envs:Walker2d-v5", ""])
def test_only_a_registered_tasks_id_makes_an_environment(env_id):
    from gpdyn.robots.task import task_for_env

    with pytest.raises(InputError, match="test: env_id .*no registered task"):
        task_for_env(env_id, where="test: env_id")


def test_a_policy_file_naming_another_environment_is_refused(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    _evil_module(tmp_path, marker)
    monkeypatch.syspath_prepend(str(tmp_path))
    net = torch.nn.Sequential(torch.nn.Linear(17, 4), torch.nn.Tanh(), torch.nn.Linear(4, 6))
    path = save_policy(tmp_path / "p.pt", net.state_dict(), hidden=[4], activation="tanh", obs_mean=np.zeros(17),
                       obs_var=np.ones(17), clip_obs=10.0, epsilon=1e-8, act_low=-np.ones(6), act_high=np.ones(6),
                       env_id="evilmod:Walker2d-v5")
    with pytest.raises(PolicyError, match=r"p\.pt: env_id 'evilmod:Walker2d-v5'"):
        load_policy(path)
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_checkpoint_with_a_pickled_object_runs_nothing(tmp_path):
    _Trap.target = tmp_path / "marker"
    learner = make_learner("exact", 2, 1)
    good = save_learner(learner, tmp_path / "good.pt")
    ckpt = torch.load(good, weights_only=True)
    for where in ("extra", "config", "state"):
        bad = {**ckpt, where: {**ckpt[where], "trap": _Trap()}}
        torch.save(bad, tmp_path / f"{where}.pt")
        with pytest.raises(InputError, match=rf"{where}\.pt: not a gpdyn checkpoint"):
            load_learner(tmp_path / f"{where}.pt")
    with open(tmp_path / "plain.pkl", "wb") as f:
        pickle.dump(_Trap(), f)
    with pytest.raises(InputError, match="plain.pkl: not a gpdyn checkpoint"):
        load_learner(tmp_path / "plain.pkl")
    assert not _Trap.target.exists()


def test_a_zarr_v2_store_with_a_pickle_codec_runs_nothing(tmp_path):
    _Trap.target = tmp_path / "marker"
    root = tmp_path / "v2.zarr"
    for group in ("", "data", "meta"):
        (root / group).mkdir(parents=True, exist_ok=True)
        (root / group / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    (root / ".zattrs").write_text(json.dumps({
        "format": "gpdyn.episodes", "format_version": 1, "source": "t", "env_id": "Walker2d-v5", "dt": 0.008,
        "seed": 0, "fields": {"qpos": {"columns": ["a"], "dtype": "float64", "unit": ""}}, "episode_keys": {}}))
    for name, shape, dtype, chunk in (("data/qpos", [1, 1], "<f8", "0.0"), ("meta/episode_ends", [1], "<i8", "0")):
        (root / name).mkdir()
        meta = {"zarr_format": 2, "shape": shape, "chunks": shape, "dtype": dtype, "compressor": {"id": "pickle"},
                "fill_value": 0, "order": "C", "filters": None, "dimension_separator": "."}
        (root / name / ".zarray").write_text(json.dumps(meta))
        (root / name / chunk).write_bytes(pickle.dumps(_Trap()))
    with pytest.raises((InputError, ValueError)):
        EpisodeStore.open(root).read("qpos")
    assert not _Trap.target.exists()


def _calls(pattern: str) -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]  # comments and docstrings (``...``) may name these calls
            if re.search(pattern, code) and "``" not in code:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}")
    return found


def test_the_package_has_no_unsafe_loader():
    """Every torch.load reads weights only; nothing calls pickle, np.load with pickles, or eval/exec."""
    loads = _calls(r"torch\.load\(")
    assert loads and all("weights_only=True" in line for line in loads), loads
    assert not _calls(r"weights_only\s*=\s*False|allow_pickle\s*=\s*True|\bpickle\.loads?\(|\bmarshal\.|"
                      r"(?<![\w.])(eval|exec)\(|yaml\.load\(|joblib\.load|dill\.|cloudpickle")
    # gymnasium.make imports the module an id names: only the walker's make_env calls it, with its check
    makes = _calls(r"\bgym(nasium)?\.make\(")
    assert all(line.startswith(("gpdyn/robots/legged.py", "gpdyn/doctor.py")) for line in makes), makes


def test_the_shipped_policy_and_checkpoints_still_load():
    from gpdyn.robots.walker import WALKER

    for path in [None, *WALKER.checkpoint_files()]:
        policy = load_policy(path)
        assert np.isfinite(policy.act(policy.obs_mean)).all()
    assert os.path.basename(str(load_policy().path)) == "walker2d_trpo.pt"


# -- a model that predicts NaN: the online controllers skip the update and keep controlling -----------------
def _nan_prior(learner, key: str):
    """``learner`` with the state tensor at ``key`` (a dotted path) set to NaN: the mean weights,
    so that it predicts a NaN mean everywhere (a diverged model; no checkpoint holds one)."""
    state = learner.state_dict()
    tensor = state
    for part in key.split("."):
        tensor = tensor[part]
    tensor.fill_(float("nan"))
    learner.load_state_dict(state)
    return learner


def test_the_online_updater_skips_what_it_cannot_learn_and_learns_the_rest():
    from gpdyn.gp.residual import ResidualGP
    from gpdyn.gp.training import OnlineUpdater

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(60, 3, generator=gen, dtype=torch.float64)
    y = torch.stack([x.sin().sum(-1), x.cos().sum(-1)], -1)
    prior = make_learner("exact", 3, 2, max_points=100)
    prior.observe(x, y)
    residual = ResidualGP(prior, x, window=20, amplitude=1.0, gated=True)
    updater = OnlineUpdater(residual, batch=4)
    bad_x = x[:1].clone()
    bad_x[0, 1] = float("nan")
    assert updater(bad_x, y[:1]) == {"skipped": 1.0}  # a non-finite transition
    assert updater(x[:1], y[:1] + 1.0)["skipped"] == 0.0 and residual.observed == 1
    _nan_prior(prior, "whitened")  # now the residual target y - prior(x) would be NaN
    gate = residual.gate_sums.clone()
    for i in range(1, 4):
        assert updater(x[i : i + 1], y[i : i + 1])["skipped"] == 1.0
    assert updater.nonfinite == 4 and residual.observed == 1
    torch.testing.assert_close(residual.gate_sums, gate)  # the gate's statistics are untouched


def test_the_online_walker_controller_keeps_controlling_while_its_model_predicts_nan(tmp_path):
    from synthetic import make_walker_store

    from gpdyn.experiments.control_legged import (LeggedRunConfig, online_model, pretrained_model,
                                                  legged_controller, train_inputs)
    from gpdyn.sim.loop import run_episode
    from gpdyn.runs import RunDir

    store = make_walker_store(tmp_path / "walker.zarr", [40, 35, 50]).path
    cfg = LeggedRunConfig.of(learner="svdgp", steps=4, conditions=("nominal",), controllers=("online",), samples=8,
                          horizon=3, pretrain_iterations=3, pretrain_batch=32, progress=False)
    learner, frozen, _ = pretrained_model(cfg, store)
    model, updater = online_model(_nan_prior(learner, "params.a"), frozen, cfg, train_inputs(cfg, store))
    policy = load_policy()
    run = RunDir.create("t", {}, out=tmp_path / "run")
    out = run_episode(cfg.legged_task.make_env(), legged_controller("online", cfg, policy, model, updater), steps=cfg.steps, reset_seed=3, log=run.log)
    steps = [r for r in run.metrics() if r.get("kind") == "step"]
    assert out.record["length"] == len(steps) == 4 and out.record["updates_skipped"] == 4
    assert all(s["update_skipped"] == 1.0 and s["fallback"] for s in steps)
    assert np.isfinite(out.rows["action"]).all()
    np.testing.assert_allclose(out.rows["action"], policy.act(out.rows["obs"]), atol=1e-9)  # the policy's fallback


def test_the_online_arm_controller_keeps_tracking_while_its_model_predicts_nan(tmp_path):
    from synthetic import make_kuka_store

    from gpdyn.control.dynamics import LearnedModel
    from gpdyn.sim.loop import run_episode
    from gpdyn.experiments.arm_config import ArmRunConfig
    from gpdyn.experiments.control_arm import _controller, _pretrained
    from gpdyn.robots.arm import pd_gains
    from gpdyn.sim.arm_env import ArmEnv
    from gpdyn.runs import RunDir
    from gpdyn.sim.arm import get_family

    store = make_kuka_store(tmp_path / "kuka.zarr", offline=[60], online=[40]).path
    cfg = ArmRunConfig.of(learner="svdgp", steps=5, change_at=2, pretrain_iterations=3, pretrain_batch=32, progress=False)
    run = RunDir.create("t", {}, out=tmp_path / "run")
    arm = cfg.arm()
    frozen, x_stored, y_stored = _pretrained(run, cfg, arm, store)
    frozen = LearnedModel(_nan_prior(frozen.learner, "params.a"), frozen.normalizer)
    ref = cfg.reference
    poses = get_family(ref.family).pattern(cfg.seed, arm.limits).evaluate(np.arange(0.0, 0.3, 0.05), ref.speed)[0]
    controller = _controller("online", cfg, arm, pd_gains(arm.torque_model(), poses, ref.omega), poses, frozen,
                             (x_stored, y_stored))
    env = ArmEnv(arm, frame_skip=arm.steps_per_sample(ref.rate_hz), family=ref.family, pattern_seed=cfg.seed)
    episode = run_episode(env, controller, steps=cfg.steps, reset_seed=cfg.seed, log=run.log)
    env.close()
    steps = [r for r in run.metrics() if r.get("kind") == "step"]
    assert episode.record["length"] == 5 and episode.record["updates_skipped"] == 5
    assert episode.record["fallbacks"] == 5 and all(s["update_skipped"] == 1.0 for s in steps)
    assert np.isfinite(episode.rows["action"]).all()


def test_a_model_whose_cholesky_fails_makes_the_controller_fall_back(tmp_path):
    """On the CPU a failed Cholesky factor raises where a GPU gives NaN: the learned model predicts NaN on both."""
    from synthetic import make_walker_store

    from gpdyn.experiments.control_legged import LeggedRunConfig, legged_controller, pretrained_model
    from gpdyn.sim.loop import run_episode
    from gpdyn.runs import RunDir

    store = make_walker_store(tmp_path / "walker.zarr", [40, 35, 50]).path
    cfg = LeggedRunConfig.of(learner="svdgp", steps=3, conditions=("nominal",), controllers=("frozen",), samples=8,
                          horizon=3, pretrain_iterations=3, pretrain_batch=32, progress=False)
    learner, model, _ = pretrained_model(cfg, store)
    _nan_prior(learner, "params.log_ls")  # every kernel matrix is NaN: its Cholesky factor fails
    with pytest.raises(torch.linalg.LinAlgError):
        learner.predict(torch.zeros(1, learner.input_dim, dtype=learner.dtype))
    policy = load_policy()
    run = RunDir.create("t", {}, out=tmp_path / "run")
    out = run_episode(cfg.legged_task.make_env(), legged_controller("frozen", cfg, policy, model), steps=cfg.steps, reset_seed=3, log=run.log)
    steps = [r for r in run.metrics() if r.get("kind") == "step"]
    assert out.record["fallbacks"] == len(steps) == 3 and all(s["fallback"] for s in steps)
    np.testing.assert_allclose(out.rows["action"], policy.act(out.rows["obs"]), atol=1e-9)
