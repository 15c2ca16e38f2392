"""The Task API end to end (issue #36): a task defined in this file, registered with
``register_task``, runs collect -> learn -> control and the CLI's report with no change under gpdyn/.

The task is gymnasium's ``HalfCheetah-v5``: planar, qpos ``[rootx, rootz, rooty, bthigh, bshin,
bfoot, fthigh, fshin, ffoot]``, six motors, the observation ``[qpos[1:], qvel]`` with qvel not
clipped, the reward ``x_velocity - 0.1 |a|^2`` (no healthy reward) and no termination, timestep
0.01 x frame skip 5. Its episodes are cut to :data:`STEPS` through ``make_env``'s
``max_episode_steps`` so that the whole test runs in seconds; its policy is a tiny MLP with
seeded weights, written here with :func:`gpdyn.robots.policy.save_policy`.

Everything the task holds is a gpdyn or gymnasium function (or a partial of one), so the
collection's worker processes unpickle it without importing this module.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gpdyn.data.problems import PROBLEMS, load_problem
from gpdyn.data.store import EpisodeStore
from gpdyn.errors import InputError
from gpdyn.robots.legged import LeggedTask, TorchPolicy, legged_task, make_gym_env, state_rows
from gpdyn.robots.policy import load_policy, save_policy
from gpdyn.robots.task import TASKS, get_task, register_task, task_for_env

NAME = "cheetah-test"
ENV_ID = "HalfCheetah-v5"
QPOS_NAMES = ("rootx", "rootz", "rooty", "bthigh", "bshin", "bfoot", "fthigh", "fshin", "ffoot")
NU = 6
STEPS = 40  # control steps per episode: the environment's time limit here (gymnasium's is 1000)
HIDDEN = 16


def save_tiny_policy(path: Path) -> Path:
    """A ``17 -> 16 -> 6`` tanh MLP with fixed seeded weights, identity normalisation, for HalfCheetah-v5."""
    g = torch.Generator().manual_seed(36)
    nobs = len(QPOS_NAMES) - 1 + len(QPOS_NAMES)
    state = {"0.weight": 0.3 * torch.randn(HIDDEN, nobs, generator=g), "0.bias": 0.1 * torch.randn(HIDDEN, generator=g),
             "2.weight": 0.5 * torch.randn(NU, HIDDEN, generator=g), "2.bias": 0.1 * torch.randn(NU, generator=g)}
    return save_policy(path, state, hidden=[HIDDEN], activation="tanh", obs_mean=np.zeros(nobs), obs_var=np.ones(nobs),
                       clip_obs=10.0, epsilon=1e-8, act_low=-np.ones(NU), act_high=np.ones(NU), env_id=ENV_ID,
                       meta={"name": "cheetah-tiny", "seed": 36})


def cheetah_task(policy_file: Path) -> LeggedTask:
    """HalfCheetah-v5 as a legged task, with the numbers of gymnasium's ``half_cheetah_v5.py``."""
    task = legged_task(
        NAME, ENV_ID, QPOS_NAMES, nu=NU, healthy_z=(-math.inf, math.inf), healthy_angle=(-math.inf, math.inf),
        healthy_state=None, feet=("bfoot", "ffoot"), motor=(0, "back thigh"), spring_joint="bshin",
        policy_file=policy_file,
        frame_skip=5, timestep=0.01, episode_steps=STEPS, obs_clip=math.inf, forward_reward_weight=1.0,
        ctrl_cost_weight=0.1, healthy_reward=0.0, description="HalfCheetah-v5 with a tiny seeded policy (test task)")
    return dataclasses.replace(task, make_env=functools.partial(make_gym_env, ENV_ID, max_episode_steps=STEPS))


@pytest.fixture(scope="module")
def cheetah(tmp_path_factory):
    """The test task, registered for this module's tests and removed after them (other tests list the registries)."""
    policy = save_tiny_policy(tmp_path_factory.mktemp("policy") / "cheetah_tiny.pt")
    task = register_task(cheetah_task(policy))
    try:
        yield task
    finally:
        TASKS.pop(NAME, None)
        for problem in task.problems:
            PROBLEMS.pop(problem, None)


def env_state(env) -> np.ndarray:
    rows = state_rows(env)
    return np.concatenate([rows["qpos"], rows["qvel"]])


def test_the_registered_task_has_its_problems_and_matches_its_environment(cheetah):
    assert get_task(NAME) is cheetah and task_for_env(ENV_ID) is cheetah
    assert set(cheetah.problems) == {f"{NAME}-1", f"{NAME}-2"} and cheetah.default_problem == f"{NAME}-1"
    assert all(name in PROBLEMS for name in cheetah.problems)
    assert cheetah_task(cheetah.policy_file) is not cheetah and register_task(cheetah_task(cheetah.policy_file)) is cheetah
    for bad in ({"obs_clip": 0.0}, {"obs_clip": math.nan}, {"ctrl_cost_weight": math.inf}):
        with pytest.raises(InputError, match=f"legged_task {NAME}: {next(iter(bad))}"):
            legged_task(NAME, ENV_ID, QPOS_NAMES, nu=NU, healthy_z=(0, 1), healthy_angle=(0, 1), healthy_state=None,
                        feet=(), motor=(0, "m"), spring_joint="bshin", policy_file=None, **bad)
    layout = cheetah.layout
    env = cheetah.make_env()
    try:
        model = env.unwrapped.model
        assert (layout.nq, layout.nv, layout.nu) == (model.nq, model.nv, model.nu) == (9, 9, 6)
        assert tuple(model.joint(i).name for i in range(model.njnt)) == QPOS_NAMES
        assert layout.dt == pytest.approx(env.unwrapped.dt) and cheetah.frame_skip == env.unwrapped.frame_skip
        assert env.observation_space.shape == (cheetah.nobs,) == (17,) and env.spec.max_episode_steps == STEPS

        # reward and observation: the task's torch versions against the environment's, on a random
        # walk and on states whose velocities lie far beyond Walker2d's clip of 10
        cost, rng = cheetah.cost(), np.random.default_rng(0)
        policy = load_policy(cheetah.policy_file, env=env)
        proposal = TorchPolicy(policy, "cpu", torch.float64)  # obs_clip from the policy's task: none
        obs, _ = env.reset(seed=1)
        states, observations = [], []
        for t in range(STEPS):
            if t % 10 == 5:  # fast joints: the observation must not clip them
                qpos, qvel = env.unwrapped.data.qpos.copy(), env.unwrapped.data.qvel.copy()
                env.unwrapped.set_state(qpos, 30.0 * rng.standard_normal(qvel.shape))
                obs = env.unwrapped._get_obs()
            state = env_state(env)
            states.append(state)
            observations.append(obs)
            action = rng.uniform(-1, 1, NU)
            obs, reward, terminated, truncated, _ = env.step(action)
            r, done = cost.reward(*(torch.as_tensor(v)[None] for v in (state, action, env_state(env))))
            assert float(r) == pytest.approx(reward, rel=1e-9, abs=1e-9) and bool(done) == terminated is False
        assert truncated  # the time limit of make_env
        s = torch.as_tensor(np.array(states))
        assert float(s[:, 9:].abs().max()) > 20.0
        np.testing.assert_allclose(cheetah.observation(s).numpy(), np.array(observations), rtol=0, atol=1e-12)
        np.testing.assert_allclose(proposal(s).numpy(), policy.act(np.array(observations)), rtol=1e-9, atol=1e-9)
    finally:
        env.close()


def test_collect_learn_control_and_report_of_a_task_defined_in_a_test(cheetah, tmp_path):
    from gpdyn.experiments.control_legged import CONTROLLERS, LeggedRunConfig, run_legged
    from gpdyn.experiments.learn import LearnConfig, learn
    from gpdyn.runs import RunDir
    from gpdyn.sim.legged import collect_legged

    # collect: two worker processes, each unpickling the task
    path = tmp_path / "cheetah.zarr"
    done = collect_legged(cheetah, path, episodes=2, envs=2, seed=0, progress=False)
    assert (done["episodes"], done["rows"]) == (2, 2 * STEPS)
    store = EpisodeStore.open(path)
    assert (store.attrs["env_id"], store.attrs["source"]) == (ENV_ID, f"{NAME}-trpo")
    assert store.attrs["dt"] == pytest.approx(cheetah.layout.dt)
    assert list(store.episode_lengths) == [STEPS, STEPS]
    state = torch.as_tensor(np.hstack([store.read("qpos"), store.read("qvel")]))
    next_state = torch.as_tensor(np.hstack([store.read("next_qpos"), store.read("next_qvel")]))
    action, reward = torch.as_tensor(store.read("action")), store.read("reward")[:, 0]
    assert float(action.abs().max()) > 0.05  # the policy moves the motors
    np.testing.assert_allclose(cheetah.cost().reward(state, action, next_state)[0].numpy(), reward, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(store.read("obs"), cheetah.observation(state).numpy())
    store.close()

    problem = load_problem(path, f"{NAME}-1", protocol="iid", seed=0)
    assert (problem.input_dim, problem.output_dim) == (8 + 9 + 6, 9)
    assert len(problem.x_train) + len(problem.x_test) == 2 * STEPS

    # learn
    run, final = learn(LearnConfig(store=str(path), problem=f"{NAME}-1", learner="svdgp", iterations=20, batch_size=32,
                                   eval_every=10, preset="small"), out=tmp_path / "learn", progress=False)
    assert run.finished() is not None and final["iteration"] == 20
    assert json.loads((run.path / "config.json").read_text())["problem"]["name"] == f"{NAME}-1"
    assert len(final["nmse"]) == problem.output_dim and np.isfinite(final["nmse"]).all()  # one score per output

    # control: every controller on the nominal and the changed plant
    cfg = LeggedRunConfig.of(task=NAME, controllers=CONTROLLERS, conditions=("nominal", "changed"), change="torso_mass",
                          steps=12, samples=8, sim_samples=4, horizon=2, pretrain_iterations=5, pretrain_batch=32,
                          progress=False)
    control = RunDir.create(f"control-{NAME}", {"robot": NAME, **dataclasses.asdict(cfg)}, out=tmp_path / "control")
    result = run_legged(control, cfg, store=path)
    records = control.metrics()
    episodes = {(r["controller"], r["condition"]): r for r in records if r.get("kind") == "episode"}
    assert set(episodes) == {(c, k) for c in CONTROLLERS for k in ("nominal", "changed")}
    assert len(result["episodes"]) == len(episodes) == 8
    for (controller, condition), ep in episodes.items():
        assert ep["robot"] == NAME and ep["length"] == cfg.steps and np.isfinite(ep["return"])
        assert ep["change"] == ("torso mass x1.3" if condition == "changed" else "")
        steps = [r for r in records if r.get("kind") == "step" and r["controller"] == controller
                 and r["condition"] == condition]
        assert len(steps) == cfg.steps and sum(r["reward"] for r in steps) == pytest.approx(ep["return"])
    # the same reset seed and a deterministic policy: only the heavier torso separates the two
    assert episodes[("trpo", "changed")]["return"] != episodes[("trpo", "nominal")]["return"]
    task_record = next(r for r in records if r.get("kind") == "task")
    assert (task_record["robot"], task_record["env_id"]) == (NAME, ENV_ID)
    assert task_record["control_period_s"] == pytest.approx(0.05)
    pretrain = next(r for r in records if r.get("kind") == "pretrain")
    assert pretrain["train_rows"] == len(problem.x_train) and np.isfinite(pretrain["test_nmse_mean"])
    played = EpisodeStore.open(control.path / "episodes.zarr")
    assert played.n_episodes == 8 and played.attrs["env_id"] == ENV_ID and played.n_rows == 8 * cfg.steps
    played.close()
    report = Path(result["report"]).read_text()
    assert f"# {NAME} online control" in report and "torso mass x1.3" in report

    # the CLI, in a process of its own that has never heard of the task: the reports read the run folders
    gpdyn = [sys.executable, "-m", "gpdyn"]
    for folder, wanted in ((control.path, f"# {NAME} online control"), (run.path, f"{NAME}-1")):
        done = subprocess.run([*gpdyn, "report", str(folder)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert wanted in done.stdout
