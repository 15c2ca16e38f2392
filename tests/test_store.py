"""Episode store: round trip, crash safety, validation, refused appends."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr

from gpdyn.data.store import FORMAT_VERSION, EpisodeStore, StoreError
from synthetic import WALKER_FIELDS, make_walker_store, random_walker_episode


def _store_bytes(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_round_trip_values_dtypes_attributes_and_boundaries(tmp_path):
    rng = np.random.default_rng(1)
    episodes = [random_walker_episode(rng, n) for n in (7, 3, 11)]
    store = EpisodeStore.create(
        tmp_path / "s.zarr", WALKER_FIELDS, source="unit", env_id="Walker2d-v5", dt=0.008, seed=5,
        episode_keys={"seed": "int64"}, extra_attrs={"policy": "p.zip"},
    )
    store.append_episodes(episodes[:2], [{"seed": 10}, {"seed": 11}])
    del store
    # reopen in a later "run" and append more
    store = EpisodeStore.open(tmp_path / "s.zarr", mode="a")
    store.append_episode(episodes[2], seed=12)

    reopened = EpisodeStore.open(tmp_path / "s.zarr")
    assert reopened.n_episodes == 3 and reopened.n_rows == 21
    np.testing.assert_array_equal(reopened.episode_ends, [7, 10, 21])
    np.testing.assert_array_equal(reopened.episode_values("seed"), [10, 11, 12])
    for i, ep in enumerate(reopened.iter_episodes()):
        for name, spec in WALKER_FIELDS.items():
            assert ep[name].dtype == np.dtype(spec.dtype)
            np.testing.assert_array_equal(ep[name], episodes[i][name])
    assert reopened.attrs["dt"] == 0.008 and reopened.attrs["env_id"] == "Walker2d-v5"
    assert reopened.attrs["seed"] == 5 and reopened.attrs["policy"] == "p.zip"
    assert reopened.columns("qvel")[0] == "qvel0" and reopened.fields["qvel"].unit == "m/s|rad/s"
    assert "numpy" in reopened.attrs["versions"] and "zarr" in reopened.attrs["versions"]
    summary = reopened.summary()
    assert summary["episodes"] == 3 and summary["episode_length"]["max"] == 11


class Crash(RuntimeError):
    """Stands for the process dying at that point."""


@pytest.mark.parametrize("point", ["meta/seed", "meta/episode_ends", "commit"])
def test_crash_before_the_commit_point_keeps_committed_episodes(tmp_path, monkeypatch, point):
    store = make_walker_store(tmp_path / "s.zarr", [5, 6])
    before = {k: v.copy() for k, v in store.episode(1).items()}
    rng = np.random.default_rng(3)

    # the rows of every field land, then the process dies at `point`
    real_write = EpisodeStore._write

    def dying_write(self, key, *args):
        if key == point:
            raise Crash(f"killed before writing {key}")
        return real_write(self, key, *args)

    def dying_update(self, *args, **kwargs):
        raise Crash("killed before the commit record")

    monkeypatch.setattr(EpisodeStore, "_write", dying_write)
    monkeypatch.setattr(zarr.core.attributes.Attributes, "update", dying_update if point == "commit" else
                        zarr.core.attributes.Attributes.update)
    with pytest.raises(Crash):
        store.append_episode(random_walker_episode(rng, 9), seed=99)
    monkeypatch.undo()
    store.close()  # the kernel frees a dead writer's lock

    raw = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    assert raw["data/qpos"].shape[0] == 20  # the uncommitted rows are on disk

    reader = EpisodeStore.open(tmp_path / "s.zarr")
    assert reader.n_episodes == 2 and reader.n_rows == 11
    assert reader.summary()["uncommitted_rows"] == 9
    for k, v in before.items():
        np.testing.assert_array_equal(reader.episode(1)[k], v)

    with EpisodeStore.open(tmp_path / "s.zarr", mode="a") as appender:  # trims the torn rows
        raw = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
        assert raw["data/qpos"].shape[0] == 11 and raw["meta/episode_ends"].shape[0] == 2
        nxt = random_walker_episode(rng, 4)
        appender.append_episode(nxt, seed=7)
    final = EpisodeStore.open(tmp_path / "s.zarr")
    np.testing.assert_array_equal(final.episode_ends, [5, 11, 15])
    np.testing.assert_array_equal(final.episode_values("seed"), [0, 1, 7])
    np.testing.assert_array_equal(final.episode(2)["qvel"], nxt["qvel"])


def _as_legacy(path: Path) -> None:
    """Make a store look written by an older gpdyn: no commit record, all-fill chunks not written."""
    meta = path / "zarr.json"
    doc = json.loads(meta.read_text())
    del doc["attributes"]["commit"], doc["attributes"]["all_chunks_written"]
    meta.write_text(json.dumps(doc))


def test_legacy_store_torn_commit_of_episode_ends(tmp_path):
    """A store without a commit record, killed after episode_ends was resized but before its new values
    were written: the trailing zeros are uncommitted."""
    make_walker_store(tmp_path / "s.zarr", [5, 6]).close()
    _as_legacy(tmp_path / "s.zarr")
    rng = np.random.default_rng(4)
    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="r+")
    for name, spec in WALKER_FIELDS.items():  # the rows of a third episode landed
        group[f"data/{name}"].resize((14, spec.width))
    group["meta/seed"].resize((3,))
    group["meta/episode_ends"].resize((3,))  # zero-filled: the torn commit
    assert list(group["meta/episode_ends"][:]) == [5, 11, 0]

    reader = EpisodeStore.open(tmp_path / "s.zarr")
    assert reader.n_episodes == 2 and reader.n_rows == 11
    with EpisodeStore.open(tmp_path / "s.zarr", mode="a") as appender:
        appender.append_episode(random_walker_episode(rng, 4), seed=9)
    final = EpisodeStore.open(tmp_path / "s.zarr")
    np.testing.assert_array_equal(final.episode_ends, [5, 11, 15])
    np.testing.assert_array_equal(final.episode_values("seed"), [0, 1, 9])
    assert final.attrs["commit"] == {"episodes": 3, "rows": 15}  # an append adds the commit record
    # a break that is not a torn commit is still corruption
    zarr.open_group(str(tmp_path / "s.zarr"), mode="r+")["meta/episode_ends"][1] = 3
    with pytest.raises(StoreError, match="entry 1"):
        EpisodeStore.open(tmp_path / "s.zarr")


def test_legacy_store_missing_episode_ends_chunk_is_damage(tmp_path):
    path = tmp_path / "s.zarr"
    make_walker_store(path, [5, 6]).close()
    _as_legacy(path)
    (path / "meta" / "episode_ends" / "c" / "0").unlink()
    for mode in ("r", "a"):
        with pytest.raises(StoreError, match="'meta/episode_ends' entries 0:2 have no chunk file"):
            EpisodeStore.open(path, mode)
    assert zarr.open_group(str(path), mode="r")["data/qpos"].shape[0] == 11  # nothing trimmed


@pytest.mark.parametrize(
    "damage, field",
    [
        (lambda g: g["data"].__delitem__("qvel"), "data/qvel"),
        (lambda g: g["meta"].__delitem__("episode_ends"), "meta/episode_ends"),
        (lambda g: g["data"].create_array("qpos", shape=(11, 8), dtype="float64", overwrite=True), "data/qpos"),
        (lambda g: g.attrs.update({"format_version": FORMAT_VERSION + 1}), "format_version"),
        (lambda g: g.attrs.update({"format": "something-else"}), "format"),
    ],
    ids=["missing-field", "missing-ends", "wrong-shape", "future-version", "wrong-format"],
)
def test_damaged_store_names_file_and_field(tmp_path, damage, field):
    path = tmp_path / "s.zarr"
    make_walker_store(path, [5, 6])
    damage(zarr.open_group(str(path), mode="r+"))
    with pytest.raises(StoreError) as err:
        EpisodeStore.open(path)
    assert str(path) in str(err.value) and field in str(err.value)


def test_missing_path_and_non_store(tmp_path):
    with pytest.raises(StoreError, match="no such store"):
        EpisodeStore.open(tmp_path / "nope.zarr")
    (tmp_path / "plain").mkdir()
    with pytest.raises(StoreError, match="plain"):
        EpisodeStore.open(tmp_path / "plain")


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda ep: ep["qvel"].__setitem__((3, 2), np.nan), "has nan at step 3, column 'qvel2'"),
        (lambda ep: ep.__setitem__("qpos", np.zeros((len(ep["qpos"]), 8))), "field 'qpos' has shape"),
        (lambda ep: ep.__setitem__("action", ep["action"][:-1]), "field 'action' has 5 rows"),
        (lambda ep: ep.pop("done"), "fields missing ['done']"),
    ],
    ids=["nan", "wrong-width", "mismatched-lengths", "missing-field"],
)
def test_refused_append_leaves_store_unchanged(tmp_path, corrupt, message):
    path = tmp_path / "s.zarr"
    store = make_walker_store(path, [5, 6])
    before = _store_bytes(path)
    good = random_walker_episode(np.random.default_rng(0), 6)
    bad = random_walker_episode(np.random.default_rng(1), 6)
    corrupt(bad)
    with pytest.raises(StoreError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        store.append_episodes([good, bad], [{"seed": 1}, {"seed": 2}])
    assert _store_bytes(path) == before
    assert EpisodeStore.open(path).n_episodes == 2


def test_read_only_and_existing_path(tmp_path):
    path = tmp_path / "s.zarr"
    make_walker_store(path, [5])
    with pytest.raises(StoreError, match="read-only"):
        EpisodeStore.open(path).append_episode(random_walker_episode(np.random.default_rng(0), 3), seed=0)
    with pytest.raises(StoreError, match="already exists"):
        make_walker_store(path, [5])
    attrs = json.loads((path / "zarr.json").read_text())["attributes"]
    assert attrs["format"] == "gpdyn.episodes"


def test_legacy_store_may_lack_all_fill_chunks_of_int_and_bool_fields_only(tmp_path):
    path = tmp_path / "s.zarr"
    make_walker_store(path, [5, 6]).close()
    _as_legacy(path)
    (path / "data" / "done" / "c" / "0" / "0").unlink()  # all False: older zarr writes skipped it
    np.testing.assert_array_equal(EpisodeStore.open(path).read("done"), np.zeros((11, 1), bool))
    (path / "data" / "qpos" / "c" / "0" / "0").unlink()  # a float chunk of real data is never all 0.0
    with pytest.raises(StoreError, match="'data/qpos' rows 0:11 are committed but their chunk file is missing"):
        EpisodeStore.open(path)


def test_legacy_store_missing_last_chunk_of_episode_ends_is_damage_not_a_torn_commit(tmp_path, monkeypatch):
    import gpdyn.data.store as store_module

    monkeypatch.setattr(store_module, "EPISODE_CHUNK", 2)  # several chunks of episode_ends in a tiny store
    path = tmp_path / "s.zarr"
    make_walker_store(path, [5, 6, 7, 3, 4]).close()
    _as_legacy(path)
    (path / "meta" / "episode_ends" / "c" / "2").unlink()  # entry 4: would read as a torn commit of zeros
    for mode in ("r", "a"):
        with pytest.raises(StoreError, match="'meta/episode_ends' entries 4:5 have no chunk file"):
            EpisodeStore.open(path, mode)
    assert zarr.open_group(str(path), mode="r")["data/qpos"].shape[0] == 25  # the last episode's rows are kept
