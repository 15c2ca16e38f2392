"""Walker2d collection: raw states, exact replay, seeding, resume, policy loading, render."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from gpdyn.data.store import EpisodeStore, StoreError
from gpdyn.errors import InputError
from gpdyn.robots.policy import PolicyError, load_policy, save_policy
from gpdyn.robots.walker import WALKER, make_env
from gpdyn.sim.legged import collect_legged, integration_errors, legged_fields

FIELDS = tuple(legged_fields(WALKER))
NOISE = 0.1  # exercises the per-episode noise generator in every seeding test


def _collect(path, episodes, **kw):
    kw.setdefault("noise", NOISE)
    return collect_legged(WALKER, path, episodes, progress=False, **kw)


def _all(store: EpisodeStore) -> dict[str, np.ndarray]:
    return {f: store.read(f) for f in FIELDS}


@pytest.fixture(scope="module")
def short_store(tmp_path_factory):
    """2 episodes from 2 environments in parallel (the issue's short collection)."""
    path = tmp_path_factory.mktemp("walker") / "short.zarr"
    result = _collect(path, 2, envs=2, seed=3)
    assert result["episodes_added"] == 2
    return EpisodeStore.open(path)


@pytest.mark.slow
def test_short_collection_is_a_valid_store_of_raw_states(short_store):
    store = EpisodeStore.open(short_store.path)  # opening validates the schema
    assert store.n_episodes == 2 and store.n_rows == int(store.episode_lengths.sum()) > 0
    d = _all(store)
    # the observation is built from the state: qpos[1:], then qvel clipped to ±10
    np.testing.assert_array_equal(d["obs"][:, :8], d["qpos"][:, 1:])
    np.testing.assert_array_equal(d["obs"][:, 8:], np.clip(d["qvel"], -10, 10))
    # the stored qvel is the simulator's, not the clipped observation: the clip is active here
    assert (np.abs(d["qvel"]) > 10).any()
    # consecutive rows chain inside an episode
    for a, b in zip(store.episode_starts, store.episode_ends):
        np.testing.assert_array_equal(d["qvel"][a + 1 : b], d["next_qvel"][a : b - 1])
        np.testing.assert_array_equal(d["qpos"][a + 1 : b], d["next_qpos"][a : b - 1])
        assert d["terminated"][b - 1, 0] or d["truncated"][b - 1, 0]
        assert not (d["terminated"][a : b - 1].any() or d["truncated"][a : b - 1].any())
    assert np.abs(d["action"]).max() <= 1.0
    np.testing.assert_allclose(store.episode_values("return"), [r.sum() for r in np.split(d["reward"][:, 0], store.episode_ends[:-1])])


@pytest.mark.slow
def test_replay_with_set_state_reproduces_the_next_state(short_store):
    d = _all(short_store)
    env = make_env()
    sim = env.unwrapped
    env.reset(seed=0)
    for t in range(short_store.n_rows):
        sim.set_state(d["qpos"][t], d["qvel"][t])
        sim.do_simulation(d["action"][t], sim.frame_skip)
        np.testing.assert_allclose(sim.data.qpos, d["next_qpos"][t], rtol=0, atol=1e-9, err_msg=f"qpos, row {t}")
        np.testing.assert_allclose(sim.data.qvel, d["next_qvel"][t], rtol=0, atol=1e-9, err_msg=f"qvel, row {t}")
    env.close()


@pytest.mark.slow
def test_same_seed_same_data_and_resume_equals_uninterrupted(short_store, tmp_path):
    # same seed, other worker count, collected in two calls: the same episodes, none duplicated
    path = tmp_path / "resumed.zarr"
    first = _collect(path, 1, envs=1, seed=3)
    second = _collect(path, 2, envs=2, seed=3)
    again = _collect(path, 2, envs=2, seed=3)
    assert (first["episodes_added"], second["episodes_added"], again["episodes_added"]) == (1, 1, 0)
    resumed = EpisodeStore.open(path)
    np.testing.assert_array_equal(resumed.episode_ends, short_store.episode_ends)
    for f, a in _all(short_store).items():
        np.testing.assert_array_equal(_all(resumed)[f], a, err_msg=f)
    for key in ("reset_seed", "policy", "return"):
        np.testing.assert_array_equal(resumed.episode_values(key), short_store.episode_values(key))


@pytest.mark.slow
def test_other_seed_other_data_and_mixed_settings_refused(short_store, tmp_path):
    path = tmp_path / "other.zarr"
    _collect(path, 1, envs=1, seed=4)
    other = EpisodeStore.open(path)
    assert other.episode_values("reset_seed")[0] != short_store.episode_values("reset_seed")[0]
    with pytest.raises(StoreError, match="seed"):
        _collect(path, 2, envs=1, seed=5)
    with pytest.raises(StoreError, match="noise"):
        _collect(path, 2, envs=1, seed=4, noise=0.3)


def _toy_policy(path, obs_dim: int, act_dim: int):
    net = torch.nn.Sequential(torch.nn.Linear(obs_dim, 8), torch.nn.Tanh(), torch.nn.Linear(8, act_dim))
    return save_policy(
        path, net.state_dict(), hidden=[8], activation="tanh", obs_mean=np.zeros(obs_dim), obs_var=np.ones(obs_dim),
        clip_obs=10.0, epsilon=1e-8, act_low=-np.ones(act_dim), act_high=np.ones(act_dim), env_id="Walker2d-v5",
    )


def test_mismatched_policy_fails_clearly(tmp_path):
    shipped = load_policy()
    # a policy for a Hopper-sized observation (11) on Walker2d (17)
    path = _toy_policy(tmp_path / "hopper.pt", 11, 3)
    env = make_env()
    with pytest.raises(PolicyError, match=r"observations of shape \(11,\).*\(17,\)"):
        load_policy(path, env=env)
    # right observation, wrong action size
    path3 = _toy_policy(tmp_path / "three.pt", 17, 3)
    with pytest.raises(PolicyError, match=r"three.pt: outputs actions of shape \(3,\).*\(6,\)"):
        load_policy(path3, env=env)
    env.close()
    with pytest.raises(PolicyError, match="hopper.pt"):
        collect_legged(WALKER, tmp_path / "s.zarr", 1, policies=[path], progress=False)
    assert not (tmp_path / "s.zarr").exists()
    assert isinstance(PolicyError("x"), InputError)
    with pytest.raises(PolicyError, match="no such policy file"):
        load_policy(tmp_path / "missing.pt")
    assert shipped.obs_dim == 17 and shipped.act_dim == 6


class _Trap:
    def __reduce__(self):
        return (open, (str(_Trap.target), "w"))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_loading_never_unpickles_objects(tmp_path):
    _Trap.target = tmp_path / "executed"
    bad = tmp_path / "evil.pt"
    torch.save({"format": "gpdyn.policy", "trap": _Trap()}, bad)
    with open(tmp_path / "evil.pkl", "wb") as f:
        pickle.dump(_Trap(), f)
    for path in (bad, tmp_path / "evil.pkl"):
        with pytest.raises(PolicyError, match="not a gpdyn policy file"):
            load_policy(path)
    assert not _Trap.target.exists()


def test_collect_rejects_bad_arguments(tmp_path):
    for kwargs, word in (({"envs": 0}, "envs"), ({"noise": -1.0}, "noise"), ({"noise": float("nan")}, "noise")):
        with pytest.raises(InputError, match=word):
            collect_legged(WALKER, tmp_path / "x.zarr", 1, progress=False, **kwargs)
    with pytest.raises(InputError, match="episodes"):
        collect_legged(WALKER, tmp_path / "x.zarr", 0, progress=False)


def test_integration_errors_trapezoid_beats_euler(short_store):
    errs = integration_errors(short_store)
    assert set(errs) == {"trapezoid", "forward_euler", "backward_euler"}
    for rule in errs.values():
        assert rule["mean"].shape == rule["max"].shape == (8,)
        assert np.all(rule["mean"] <= rule["max"]) and np.all(np.isfinite(rule["max"]))
    assert errs["trapezoid"]["mean"].mean() < errs["forward_euler"]["mean"].mean()


@pytest.mark.slow
def test_render_writes_a_video_of_the_stored_states(short_store, tmp_path):
    import imageio.v2 as imageio

    from gpdyn.sim.render import render_episode

    out = render_episode(short_store, 0, tmp_path / "ep0.mp4", width=64, height=48, every=50)
    frames = [np.asarray(f) for f in imageio.get_reader(out)]
    n_states = short_store.episode_lengths[0] + 1
    assert len(frames) == len(range(0, n_states, 50))
    assert frames[0].shape == (48, 64, 3) and frames[0].std() > 0  # not a blank image
    assert np.abs(frames[0].astype(float) - frames[-1]).mean() > 1  # the robot moved in the frame
    with pytest.raises(InputError, match="mp4"):
        render_episode(short_store, 0, tmp_path / "ep0.avi")
    with pytest.raises(InputError, match="out of range"):
        render_episode(short_store, 5, tmp_path / "ep5.mp4")


def test_shipped_policy_is_in_the_repository():
    assert WALKER.policy_file.is_file(), "policies/walker2d_trpo.pt is missing"
    meta = load_policy().meta
    assert meta["env_id"] == "Walker2d-v5" and meta["timesteps"] >= 1_000_000


def test_shipped_critic_estimates_the_policys_discounted_return(tmp_path):
    """The exported critic, in raw reward units, against the discounted return it predicts."""
    policy = load_policy()
    env = make_env()
    obs, _ = env.reset(seed=11)
    values, rewards = [], []
    for _ in range(500):
        values.append(float(policy.value(obs)))
        obs, reward, terminated, truncated, _ = env.step(policy.act(obs))
        rewards.append(reward)
        if terminated or truncated:
            break
    env.close()
    assert len(rewards) == 500  # the shipped policy walks
    discounted = [sum(0.99**k * r for k, r in enumerate(rewards[t:])) for t in (100, 150, 200)]
    for t, ret in zip((100, 150, 200), discounted):  # truncated at 500 steps: 0.99^300 = 5% left out
        assert abs(values[t] - ret) < 0.15 * ret, (t, values[t], ret)
    toy = load_policy(_toy_policy(tmp_path / "toy.pt", 17, 6))
    with pytest.raises(PolicyError, match="no critic"):
        toy.value(obs)


def test_torch_policy_acts_as_the_numpy_policy_with_its_fast_tanh():
    from gpdyn.robots.legged import FastTanh, TorchPolicy

    x = torch.linspace(-20, 20, 4001, dtype=torch.float64)
    torch.testing.assert_close(FastTanh()(x), torch.tanh(x), rtol=0, atol=1e-15)
    policy = load_policy()
    torch_policy = TorchPolicy(policy, "cpu", torch.float64)
    assert not any(isinstance(m, torch.nn.Tanh) for m in torch_policy.net.modules())
    env = make_env()
    obs, _ = env.reset(seed=3)
    states = []
    for _ in range(20):
        data = env.unwrapped.data
        states.append(np.concatenate([data.qpos, data.qvel]))
        obs, *_ = env.step(policy.act(obs))
    states = np.stack(states)
    observations = np.concatenate([states[:, 1:9], np.clip(states[:, 9:], -10, 10)], axis=1)
    want = np.stack([policy.act(o) for o in observations])
    np.testing.assert_allclose(torch_policy(torch.as_tensor(states)).numpy(), want, atol=1e-12)


def test_walker_cost_and_policy_observation_equal_their_reference_formulas_exactly():
    """LeggedCost's in-place evaluation and TorchPolicy's folded observation clip compute the
    Walker2d-v5 formulas to the last bit, on the interval bounds, at NaN and past the clips."""
    from gpdyn.robots.walker import WALKER
    from gpdyn.robots.legged import OBS_CLIP, TorchPolicy

    gen = torch.Generator().manual_seed(0)
    policy = load_policy()
    for dtype in (torch.float64, torch.float32):
        state = 4.0 * torch.randn(400, 18, generator=gen, dtype=dtype)
        nxt = state + 0.1 * torch.randn(400, 18, generator=gen, dtype=dtype)
        nxt[:, 1] = 1.25 + 0.5 * torch.randn(400, generator=gen, dtype=dtype)
        nxt[:, 2] = 0.8 * torch.randn(400, generator=gen, dtype=dtype)
        nxt[:4, 1] = torch.tensor([0.8, 2.0, float("nan"), 1.0])  # on z's bounds, NaN
        nxt[4:8, 2] = torch.tensor([-1.0, 1.0, float("nan"), 0.0])  # on the angle's bounds, NaN
        state[8, 10], state[9, 12] = 1e4, float("nan")  # past the observation's qvel clip, NaN
        action = torch.randn(400, 6, generator=gen, dtype=dtype)
        for cost in (WALKER.cost(), WALKER.cost(forward_reward_weight=0.7, ctrl_cost_weight=0.1, healthy_reward=2.5)):
            z, angle = nxt[:, 1], nxt[:, 2]
            ok = ((z > cost.healthy_z[0]) & (z < cost.healthy_z[1])
                  & (angle > cost.healthy_angle[0]) & (angle < cost.healthy_angle[1]))
            want = (cost.forward_reward_weight * ((nxt[:, 0] - state[:, 0]) / cost.dt) + cost.healthy_reward * ok.to(dtype)
                    - cost.ctrl_cost_weight * (action * action).sum(-1))
            reward, done = cost.reward(state, action, nxt)
            assert torch.equal(cost.healthy(nxt), ok) and torch.equal(done, ~ok) and not bool(ok[2] or ok[6])
            assert torch.equal(reward, want)
            assert torch.equal(cost(state, action, nxt)[0], -want)
        torch_policy = TorchPolicy(policy, "cpu", dtype)
        s = state.clone()
        s[s.isnan()] = 0.0
        want_obs = ((WALKER.observation(s) - torch_policy.mean) / torch_policy.scale).clamp(-policy.clip_obs, policy.clip_obs)
        assert torch.equal(torch_policy._normalized_obs(s), want_obs)
        assert bool((WALKER.observation(s)[:, 8:].abs() == OBS_CLIP).any())  # the qvel clip was exercised
        assert torch.isnan(torch_policy._normalized_obs(state)[9]).any()  # NaN stays NaN


def test_fast_net_folds_tanh_into_the_linear_layers_and_computes_the_same_function():
    from gpdyn.robots.legged import FastTanh, _fast_net

    torch.manual_seed(0)
    x = 3.0 * torch.randn(64, 5, dtype=torch.float64)
    for hidden in (0, 1, 3):
        sizes = [5] + [7] * hidden + [2]
        mods: list[torch.nn.Module] = []
        for i in range(len(sizes) - 1):
            mods.append(torch.nn.Linear(sizes[i], sizes[i + 1], bias=i != 1, dtype=torch.float64))
            if i < len(sizes) - 2:
                mods.append(torch.nn.Tanh())
        net = torch.nn.Sequential(*mods)
        fast = _fast_net(net)
        assert not any(isinstance(m, (torch.nn.Tanh, FastTanh)) for m in fast.modules())
        with torch.no_grad():
            torch.testing.assert_close(fast(x), net(x), rtol=0, atol=1e-12)
    other = torch.nn.Sequential(torch.nn.Linear(5, 4, dtype=torch.float64), torch.nn.Tanh(),
                                torch.nn.Linear(4, 4, dtype=torch.float64), torch.nn.ReLU(),
                                torch.nn.Linear(4, 2, dtype=torch.float64))
    fast = _fast_net(other)  # not a Linear/Tanh stack: FastTanh in a copy, the original untouched
    assert isinstance(fast[1], FastTanh) and isinstance(other[1], torch.nn.Tanh)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), other(x), rtol=0, atol=1e-12)
