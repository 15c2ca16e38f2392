"""Regression problems and streams: shapes, splits, normalisation, reproducibility, memory."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch
from synthetic import make_walker_store

from gpdyn.data.problems import load_problem
from gpdyn.data.store import EpisodeStore, StoreError
from gpdyn.data.streams import IIDStream, OrderedStream
from gpdyn.errors import InputError

WALKER_LENGTHS = [30, 25, 40, 12, 33]


@pytest.mark.parametrize("name, d_in, per_episode_loss", [("walker-1", 23, 1), ("walker-2", 46, 2)])
def test_walker_shapes_and_sample_construction(walker_store, name, d_in, per_episode_loss):
    p = load_problem(walker_store, name, seed=3)
    n = sum(WALKER_LENGTHS) - per_episode_loss * len(WALKER_LENGTHS)
    assert p.input_dim == d_in and p.output_dim == 9
    assert len(p.x_train) + len(p.x_test) == n and len(p.x_test) == round(0.1 * n)
    assert len(p.input_names) == d_in and p.input_names[0].startswith("qpos1")
    # every training sample is (inputs at t [and t-1]) -> qvel at t+1 of one episode
    ep = walker_store.episode(2)
    row = lambda t: np.concatenate([ep["qpos"][t, 1:], ep["qvel"][t], ep["action"][t].astype(np.float64)])
    t = 7
    x_expected = row(t) if name == "walker-1" else np.concatenate([row(t - 1), row(t)])
    hit = np.flatnonzero((np.abs(np.concatenate([p.x_train, p.x_test]) - x_expected).max(axis=1) == 0))
    assert hit.size == 1
    y_all = np.concatenate([p.y_train, p.y_test])
    np.testing.assert_array_equal(y_all[hit[0]], ep["qvel"][t + 1])


def test_next_state_field_keeps_the_last_transition(tmp_path):
    """A store with next_qvel (as collected) gives one sample per step, target next_qvel."""
    from synthetic import WALKER_FIELDS, random_walker_episode

    from gpdyn.data.store import FieldSpec, numbered_columns

    fields = {**WALKER_FIELDS, "next_qvel": FieldSpec(numbered_columns("qvel", 9))}
    store = EpisodeStore.create(tmp_path / "n.zarr", fields, source="t", env_id="w", dt=0.008, seed=0)
    rng = np.random.default_rng(0)
    episodes = []
    for n in (20, 15):
        ep = random_walker_episode(rng, n)
        ep["next_qvel"] = np.concatenate([ep["qvel"][1:], rng.normal(size=(1, 9))])
        episodes.append(ep)
    store.append_episodes(episodes)
    one = load_problem(store, "walker-1", seed=0)
    two = load_problem(store, "walker-2", seed=0)
    assert len(one.x_train) + len(one.x_test) == 35 and len(two.x_train) + len(two.x_test) == 33
    last = episodes[1]
    x_last = np.concatenate([last["qpos"][-1, 1:], last["qvel"][-1], last["action"][-1].astype(np.float64)])
    xs, ys = np.concatenate([one.x_train, one.x_test]), np.concatenate([one.y_train, one.y_test])
    hit = np.flatnonzero((xs == x_last).all(axis=1))
    np.testing.assert_array_equal(ys[hit[0]], last["next_qvel"][-1])
    assert one.output_names[0] == "qvel0[t+1]"
    bad = {**WALKER_FIELDS, "next_qvel": FieldSpec(numbered_columns("qvel", 8))}
    wrong = EpisodeStore.create(tmp_path / "w.zarr", bad, source="t", env_id="w", dt=0.008, seed=0)
    with pytest.raises(StoreError, match="next_qvel"):
        load_problem(wrong, "walker-1")


def test_split_disjoint_covering_and_reproducible(walker_store):
    a = load_problem(walker_store, "walker-1", seed=0)
    b = load_problem(walker_store, "walker-1", seed=0)
    c = load_problem(walker_store, "walker-1", seed=1)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.x_test, b.x_test)
    assert not np.array_equal(a.x_test, c.x_test)
    train = {r.tobytes() for r in a.x_train}
    test = {r.tobytes() for r in a.x_test}
    assert not train & test
    assert len(train | test) == sum(WALKER_LENGTHS) - len(WALKER_LENGTHS)


def test_chunk_size_does_not_change_the_problem(walker_store):
    a = load_problem(walker_store, "walker-2", seed=4, chunk_rows=1)
    b = load_problem(walker_store, "walker-2", seed=4, chunk_rows=10_000)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)


def test_normalisation_from_training_split_only(walker_store):
    p = load_problem(walker_store, "walker-1", seed=2)
    np.testing.assert_allclose(p.normalizer.x_mean, p.x_train.mean(axis=0), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(p.normalizer.y_std, p.y_train.std(axis=0, ddof=1), rtol=1e-12)
    everything = np.concatenate([p.x_train, p.x_test])
    assert not np.allclose(p.normalizer.x_mean, everything.mean(axis=0), rtol=1e-9, atol=0)
    x, y = p.tensors("train")
    torch.testing.assert_close(x.mean(0), torch.zeros(23, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(y.std(0), torch.ones(9, dtype=torch.float64), atol=1e-12, rtol=0)


def test_kuka_protocols(kuka_store):
    iid = load_problem(kuka_store, "kuka", protocol="iid", seed=0)
    assert iid.input_dim == 21 and iid.output_dim == 7
    assert len(iid.x_init) == 0 and len(iid.x_train) + len(iid.x_test) == 200
    ordered = load_problem(kuka_store, "kuka", protocol="ordered", seed=0)
    assert len(ordered.x_init) == 50 and len(ordered.x_train) + len(ordered.x_test) == 150
    q = kuka_store.read("q")
    np.testing.assert_array_equal(ordered.x_init[:, :7], q[:50])  # the offline part, in order
    # the streamed part keeps time order: training rows are an increasing subsequence of the online rows
    online = q[50:]
    positions = [int(np.flatnonzero((online == r).all(axis=1))[0]) for r in ordered.x_train[:, :7]]
    assert positions == sorted(positions)
    stats = np.concatenate([ordered.x_train, ordered.x_init]).mean(axis=0)
    np.testing.assert_allclose(ordered.normalizer.x_mean, stats, rtol=1e-12, atol=1e-14)


def test_bad_problem_requests(walker_store, kuka_store, tmp_path):
    with pytest.raises(InputError, match="unknown problem"):
        load_problem(walker_store, "walker-3")
    with pytest.raises(InputError, match="unknown protocol"):
        load_problem(walker_store, "walker-1", protocol="random")
    with pytest.raises(StoreError, match="needs field 'qpos'"):
        load_problem(kuka_store, "walker-1")
    tiny = make_walker_store(tmp_path / "tiny.zarr", [3, 2])
    with pytest.raises(InputError, match="needs at least 10"):
        load_problem(tiny, "walker-2")


def test_iid_stream_reproducible_and_resumable(walker_store):
    p = load_problem(walker_store, "walker-1")
    x, y = p.tensors("train")
    a = IIDStream(x, y, batch_size=16, seed=5)
    b = IIDStream(x, y, batch_size=16, seed=5)
    first = [a.next_batch() for _ in range(20)]  # crosses several epochs
    for xa, ya in first:
        xb, yb = b.next_batch()
        torch.testing.assert_close(xa, xb, rtol=0, atol=0)
        torch.testing.assert_close(ya, yb, rtol=0, atol=0)
    # within an epoch no row repeats
    c = IIDStream(x, y, batch_size=16, seed=5)
    idx = torch.cat([c.next_indices() for _ in range(len(x) // 16)])
    assert len(set(idx.tolist())) == len(idx)
    # resume from a saved state
    state = a.state_dict()
    expected = [a.next_batch() for _ in range(5)]
    d = IIDStream(x, y, batch_size=16, seed=123)
    d.load_state_dict(state)
    for xe, _ in expected:
        torch.testing.assert_close(d.next_batch()[0], xe, rtol=0, atol=0)
    other = IIDStream(x, y, batch_size=16, seed=6).next_batch()[0]
    assert not torch.equal(other, first[0][0])


def test_ordered_stream_and_dtype():
    x = np.arange(20.0).reshape(10, 2)
    y = np.arange(10.0).reshape(10, 1)
    s = OrderedStream(x, y, chunk_size=4, dtype=torch.float32)
    assert len(s) == 3
    chunks = list(s)
    assert [len(c[0]) for c in chunks] == [4, 4, 2] and chunks[0][0].dtype == torch.float32
    torch.testing.assert_close(torch.cat([c[1] for c in chunks]).squeeze(1), torch.arange(10.0))
    assert list(s) == []
    resumed = OrderedStream(x, y, chunk_size=4, start=8)
    assert [c[1].squeeze(1).tolist() for c in resumed] == [[8.0, 9.0]]
    with pytest.raises(InputError, match="rows"):
        OrderedStream(x, y[:5])


def test_problem_peak_memory_is_a_small_multiple_of_its_arrays(tmp_path):
    """Chunked reading: peak traced allocation < 3x the problem's own arrays."""
    rng = np.random.default_rng(0)
    from synthetic import WALKER_FIELDS

    store = EpisodeStore.create(tmp_path / "m.zarr", WALKER_FIELDS, source="t", env_id="w", dt=0.008, seed=0)
    for _ in range(6):  # 60 episodes x 1000 steps
        store.append_episodes(
            [
                {
                    "qpos": rng.normal(size=(1000, 9)),
                    "qvel": rng.normal(size=(1000, 9)),
                    "action": rng.normal(size=(1000, 6)).astype(np.float32),
                    "done": np.zeros((1000, 1), bool),
                }
                for _ in range(10)
            ]
        )
    tracemalloc.start()
    p = load_problem(EpisodeStore.open(tmp_path / "m.zarr"), "walker-1", chunk_rows=8192)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    own = sum(a.nbytes for a in (p.x_train, p.y_train, p.x_test, p.y_test, p.x_init, p.y_init))
    assert peak < 3 * own, f"peak {peak / 1e6:.1f} MB vs arrays {own / 1e6:.1f} MB"


def test_change_targets_are_the_next_value_minus_the_input(walker_store):
    p = load_problem(walker_store, "walker-1", seed=1)
    qvel = slice(8, 17)
    c = p.as_change_of(qvel)
    for split in ("train", "test"):
        x, y = p.split(split)
        xc, yc = c.split(split)
        np.testing.assert_array_equal(xc, x)
        np.testing.assert_allclose(yc, y - x[:, qvel], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(c.normalizer.x_mean, p.normalizer.x_mean)
    np.testing.assert_allclose(c.normalizer.y_mean, c.y_train.mean(axis=0), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(c.normalizer.y_std, c.y_train.std(axis=0, ddof=1), rtol=1e-12)
    assert c.name == "walker-1/change" and c.output_names[0] == "qvel0[t+1] - qvel0[t]"
    with pytest.raises(InputError, match="input columns"):
        p.as_change_of(slice(0, 5))



def _walker1_samples(store: EpisodeStore) -> tuple[np.ndarray, np.ndarray]:
    """Every walker-1 input in store order, and the episode of each."""
    xs, episodes = [], []
    for i in range(store.n_episodes):
        ep = store.episode(i)
        x = np.concatenate([ep["qpos"][:-1, 1:], ep["qvel"][:-1], ep["action"][:-1].astype(np.float64)], axis=1)
        xs.append(x)
        episodes.append(np.full(len(x), i))
    return np.concatenate(xs), np.concatenate(episodes)


def test_iid_holds_out_the_seeded_choice_over_samples_in_store_order(walker_store):
    x_all, _ = _walker1_samples(walker_store)
    chosen = np.zeros(len(x_all), dtype=bool)
    chosen[np.random.default_rng(7).choice(len(x_all), size=round(0.1 * len(x_all)), replace=False)] = True
    p = load_problem(walker_store, "walker-1", seed=7)
    np.testing.assert_array_equal(p.x_test, x_all[chosen])
    np.testing.assert_array_equal(p.x_train, x_all[~chosen])
    assert p.held_out == "a seeded 10% of the samples" and p.describe()["held_out"] == p.held_out


def test_block_protocol_holds_out_one_contiguous_block_per_episode(walker_store):
    x_all, episode = _walker1_samples(walker_store)
    p = load_problem(walker_store, "walker-1", protocol="block", seed=3)
    position = {row.tobytes(): i for i, row in enumerate(x_all)}
    test_at = np.array([position[r.tobytes()] for r in p.x_test])
    train_at = np.array([position[r.tobytes()] for r in p.x_train])
    assert np.all(np.diff(test_at) > 0) and np.all(np.diff(train_at) > 0)  # time order kept
    assert sorted(np.concatenate([test_at, train_at]).tolist()) == list(range(len(x_all)))
    for i, length in enumerate(WALKER_LENGTHS):
        block = test_at[episode[test_at] == i]
        assert len(block) == round(0.1 * (length - 1))
        assert len(block) == 0 or block[-1] - block[0] == len(block) - 1  # contiguous
    # the block's place is seeded
    again = load_problem(walker_store, "walker-1", protocol="block", seed=3)
    other = load_problem(walker_store, "walker-1", protocol="block", seed=4)
    np.testing.assert_array_equal(p.x_test, again.x_test)
    assert not np.array_equal(p.x_test, other.x_test)
    assert "contiguous block" in p.held_out


def _sarcos_files(tmp_path, rows: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Tiny SARCOS-format .mat files (28 columns), name -> matrix."""
    from scipy.io import savemat

    rng = np.random.default_rng(seed)
    matrices = {}
    for name, n in rows.items():
        matrices[name] = rng.normal(size=(n, 28))
        savemat(tmp_path / f"{name}.mat", {name: matrices[name]})
    return matrices


def test_split_protocol_trains_on_the_training_file_and_scores_on_the_test_file(tmp_path):
    from gpdyn.data.importers import import_sarcos

    m = _sarcos_files(tmp_path, {"sarcos_inv": 60, "sarcos_inv_test": 15})
    # the test file named first: the split follows the files, not the order given
    store = import_sarcos([tmp_path / "sarcos_inv_test.mat", tmp_path / "sarcos_inv.mat"], tmp_path / "s.zarr")
    p = load_problem(store, "kuka", protocol="split", seed=0)
    np.testing.assert_array_equal(p.x_train, m["sarcos_inv"][:, :21])
    np.testing.assert_array_equal(p.y_train, m["sarcos_inv"][:, 21:])
    np.testing.assert_array_equal(p.x_test, m["sarcos_inv_test"][:, :21])
    np.testing.assert_array_equal(p.y_test, m["sarcos_inv_test"][:, 21:])
    assert len(p.x_init) == 0 and "sarcos_inv_test.mat" in p.held_out
    np.testing.assert_allclose(p.normalizer.x_mean, m["sarcos_inv"][:, :21].mean(0), rtol=1e-12)  # training file only
    # the iid protocol mixes both files; block holds out a block of each
    assert len(load_problem(store, "kuka", protocol="iid").x_test) == round(0.1 * 75)
    assert len(load_problem(store, "kuka", protocol="block").x_test) == 6 + 2


def test_split_protocol_needs_an_imported_store_with_both_files(tmp_path, walker_store):
    from gpdyn.data.importers import import_sarcos

    _sarcos_files(tmp_path, {"sarcos_inv": 30, "sarcos_inv_test": 12})
    train_only = import_sarcos([tmp_path / "sarcos_inv.mat"], tmp_path / "train.zarr")
    with pytest.raises(InputError, match="needs a test file.*sarcos_inv.mat"):
        load_problem(train_only, "kuka", protocol="split")
    test_only = import_sarcos([tmp_path / "sarcos_inv_test.mat"], tmp_path / "test.zarr")
    with pytest.raises(InputError, match="needs a training file"):
        load_problem(test_only, "kuka", protocol="split")
    with pytest.raises(InputError, match="protocol split.*not an imported dataset"):
        load_problem(walker_store, "walker-1", protocol="split")
