"""Faults of episode stores and run folders: two writers, damaged chunks and metadata, values written
behind the API, refused appends, torn and garbage run files.

Every case asserts a StoreError/InputError (or, through the command, exit 2 and no traceback) whose
message names the file and the field, line or holder; and that nothing was lost or trimmed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr
from synthetic import WALKER_FIELDS, make_walker_store, random_walker_episode

from gpdyn.cli import main
from gpdyn.data.problems import load_problem
from gpdyn.data.store import MAX_ABS, EpisodeStore, FieldSpec, StoreError
from gpdyn.errors import InputError
from gpdyn.lock import WriterLock
from gpdyn.runs import LOCK_FILE, RunDir

REPO = Path(__file__).resolve().parents[1]


def _store(path: Path, lengths=(5, 6), chunk_rows: int | None = None) -> Path:
    """A closed walker store; ``chunk_rows`` small to have several chunks."""
    if chunk_rows is None:
        make_walker_store(path, list(lengths)).close()
        return path
    rng = np.random.default_rng(0)
    with EpisodeStore.create(path, WALKER_FIELDS, source="test", env_id="Walker2d-v5", dt=0.008, seed=0,
                             episode_keys={"seed": "int64"}, chunk_rows=chunk_rows) as store:
        store.append_episodes([random_walker_episode(rng, n) for n in lengths], [{"seed": i} for i in range(len(lengths))])
    return path


def _bytes(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _episode(n: int = 4, seed: int = 9) -> dict[str, np.ndarray]:
    return random_walker_episode(np.random.default_rng(seed), n)


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


class Holder:
    """Another process that holds a writer: a store opened for appending, or a run folder."""

    def __init__(self, kind: str, path: Path) -> None:
        code = (
            "import sys\n"
            "from gpdyn.data.store import EpisodeStore\nfrom gpdyn.runs import RunDir\n"
            f"obj = EpisodeStore.open({str(path)!r}, 'a') if {kind!r} == 'store' else RunDir.resume({str(path)!r})\n"
            "print('ready', flush=True)\nsys.stdin.read()\n"
        )
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=REPO)
        assert self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


@pytest.fixture
def holder():
    made = []

    def start(kind: str, path: Path) -> Holder:
        made.append(Holder(kind, path))
        return made[-1]

    yield start
    for h in made:
        h.close()


# ------------------------------------------------------------------ one writer per store and run folder


def test_second_writer_in_this_process_is_refused(tmp_path):
    path = _store(tmp_path / "s.zarr")
    first = EpisodeStore.open(path, "a")
    for attempt in (lambda: EpisodeStore.open(path, "a"),
                    lambda: EpisodeStore.create(path, WALKER_FIELDS, source="t", env_id="w", dt=0.1, seed=0)):
        with pytest.raises(StoreError, match=rf"store {path} is open for writing by pid {os.getpid()} .*\(this process\)"):
            attempt()
    reader = EpisodeStore.open(path)  # readers never lock
    first.append_episode(_episode(), seed=3)
    assert reader.n_episodes == 2 and EpisodeStore.open(path).n_episodes == 3  # a reader keeps its snapshot
    first.close()
    with EpisodeStore.open(path, "a") as again:
        again.append_episode(_episode(), seed=4)
    with pytest.raises(StoreError, match="read-only"):
        again.append_episode(_episode(), seed=5)  # closed: no longer a writer
    second = EpisodeStore.open(path, "a")
    del second  # collected: the lock goes with it
    EpisodeStore.open(path, "a").close()
    assert EpisodeStore.open(path).n_episodes == 4


@pytest.mark.slow
def test_writer_in_another_process_is_refused_by_name_and_pid(tmp_path, holder, capsys):
    path = _store(tmp_path / "s.zarr")
    other = holder("store", path)
    with pytest.raises(StoreError, match=rf"store {path} is open for writing by pid {other.pid} on host"):
        EpisodeStore.open(path, "a")
    # through the command: an import to a store another process is creating
    target = tmp_path / "k.zarr"
    creator = holder("store", _store(target))
    shutil.rmtree(target)  # the lock beside it is still held
    rows = np.random.default_rng(0).normal(size=(20, 28))
    np.savetxt(tmp_path / "on.txt", rows)
    np.savetxt(tmp_path / "off.txt", rows + 1)  # other samples: the same ones twice are refused before the lock
    code, err = _cli(["import", "kuka-ilgr", str(tmp_path / "on.txt"), str(tmp_path / "off.txt"), "--store", str(target)],
                     capsys)
    assert code == 2 and f"pid {creator.pid}" in err and str(target) in err
    assert not target.exists()


def test_stale_lock_of_a_killed_writer_is_taken_over(tmp_path, holder):
    path = _store(tmp_path / "s.zarr")
    other = holder("store", path)
    other.kill()  # kill -9: no cleanup ran, the lock file is still there
    lock_file = tmp_path / "s.zarr.lock"
    assert json.loads(lock_file.read_text())["pid"] == other.pid
    with pytest.warns(UserWarning, match=rf"stale lock of pid {other.pid} .*ended without releasing"):
        store = EpisodeStore.open(path, "a")
    assert json.loads(lock_file.read_text())["pid"] == os.getpid()
    store.append_episode(_episode(), seed=1)
    store.close()
    assert not lock_file.exists() and EpisodeStore.open(path).n_episodes == 3


def test_a_lock_record_torn_by_a_crash_is_taken_over_and_foreign_content_is_refused(tmp_path):
    path = _store(tmp_path / "s.zarr")
    (tmp_path / "s.zarr.lock").write_bytes(b"\x00" * 60)  # a record whose data a power loss left as zeros
    with EpisodeStore.open(path, "a") as store:
        store.append_episode(_episode(), seed=1)
    assert EpisodeStore.open(path).n_episodes == 3
    (tmp_path / "s.zarr.lock").write_bytes(b"\x00garbage{")  # not a record: someone's data, left as it is
    with pytest.raises(StoreError, match="s.zarr.lock holds 9 bytes that are not a gpdyn lock record"):
        EpisodeStore.open(path, "a")
    assert (tmp_path / "s.zarr.lock").read_bytes() == b"\x00garbage{"


def test_a_forked_child_neither_holds_nor_releases_the_parents_lock(tmp_path):
    lock = WriterLock(tmp_path / "x.lock", "thing x").acquire()
    ready, tell = os.pipe()
    child = os.fork()
    if child == 0:  # the child (its copy of the lock closed at fork): its release must not touch the parent's lock
        lock.release()
        os.write(tell, b"x")
        time.sleep(1.0)
        os._exit(0)
    os.read(ready, 1)
    try:
        with pytest.raises(InputError, match="thing x is open for writing"):
            WriterLock(tmp_path / "x.lock", "thing x").acquire()
        lock._forget()  # the parent "dies" (its descriptor closes) while the child still runs
        with pytest.warns(UserWarning, match="stale lock"):
            WriterLock(tmp_path / "x.lock", "thing x").acquire().release()  # not held by the child
    finally:
        os.waitpid(child, 0)


@pytest.mark.slow
def test_two_processes_racing_to_create_one_store(tmp_path):
    path = tmp_path / "race.zarr"
    code = (
        "import sys, numpy as np\nsys.path.insert(0, 'tests')\n"
        "from synthetic import WALKER_FIELDS, random_walker_episode\n"
        "from gpdyn.data.store import EpisodeStore, StoreError\n"
        "try:\n"
        f"    s = EpisodeStore.create({str(path)!r}, WALKER_FIELDS, source='t', env_id='w', dt=0.1, seed=0,"
        " episode_keys={'seed': 'int64'})\n"
        "    for i in range(20): s.append_episode(random_walker_episode(np.random.default_rng(i), 7), seed=i)\n"
        "    print('created')\n"
        "except StoreError as e:\n"
        "    print('refused', e)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=REPO) for _ in range(3)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in results]
    outcomes = [out.split()[0] for out, _ in results]
    assert outcomes.count("created") >= 1
    for out, _ in results:
        if out.startswith("refused"):
            assert "is open for writing by pid" in out or "already exists" in out
    store = EpisodeStore.open(path)
    assert store.n_episodes == 20 * outcomes.count("created") == 20


def test_run_folder_has_one_writer(tmp_path, holder, capsys):
    run = RunDir.create("job", {"x": 1}, out=tmp_path / "run")
    for attempt in (lambda: RunDir.resume(tmp_path / "run"), lambda: RunDir(tmp_path / "run").log(step=1)):
        with pytest.raises(InputError, match=rf"run folder {tmp_path / 'run'} is open for writing by pid {os.getpid()}"):
            attempt()
    run.log(step=1)
    assert "files" in run.summary() and LOCK_FILE not in run.summary()["files"]
    run.close()
    other = holder("run", tmp_path / "run")
    with pytest.raises(InputError, match=f"pid {other.pid}"):
        RunDir.resume(tmp_path / "run")
    other.kill()
    with pytest.warns(UserWarning, match="stale lock"):
        again = RunDir.resume(tmp_path / "run")
    again.log(step=2)
    assert [m["step"] for m in again.metrics()] == [1, 2]


def test_two_replays_on_one_out_are_refused(walker_store, tmp_path, capsys):
    from gpdyn.experiments.replay import ReplayConfig, open_run

    cfg = ReplayConfig(store=str(walker_store.path), problem="walker-1", learners=["exact"], iterations=1, batch_size=8)
    first = open_run(cfg, tmp_path / "r")
    with pytest.raises(InputError, match="is open for writing by pid"):
        open_run(cfg, tmp_path / "r")
    argv = ["replay", "--store", str(walker_store.path), "--problem", "walker-1", "--learners", "exact",
            "--iterations", "1", "--batch-size", "8", "--out", str(tmp_path / "r")]
    code, err = _cli(argv, capsys)
    assert code == 2 and f"run folder {tmp_path / 'r'} is open for writing by pid {os.getpid()}" in err
    assert not first.metrics()  # the refused runs logged nothing


# ------------------------------------------------------------------ damaged chunks: never data loss


def _chunk(path: Path, key: str, index: int = 0) -> Path:
    arr = zarr.open_group(str(path), mode="r")[key]
    return path / key / arr.metadata.encode_chunk_key((index,) + (0,) * (arr.ndim - 1))


DAMAGE = {
    "deleted": lambda f: f.unlink(),
    "flipped-byte": lambda f: f.write_bytes(f.read_bytes()[:-4] + bytes([f.read_bytes()[-4] ^ 0xFF]) + f.read_bytes()[-3:]),
    "truncated": lambda f: f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2]),
    "empty": lambda f: f.write_bytes(b""),
    "garbage": lambda f: f.write_bytes(b"not a zstd frame at all" * 3),
}


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.slow
def test_damaged_episode_ends_chunk_is_corruption_and_nothing_is_trimmed(tmp_path, damage, capsys):
    path = _store(tmp_path / "s.zarr")
    DAMAGE[damage](_chunk(path, "meta/episode_ends"))
    before = _bytes(path)
    for mode in ("r", "a"):
        with pytest.raises(StoreError, match=rf"{path}: 'meta/episode_ends' .*damaged"):
            EpisodeStore.open(path, mode)
    assert _bytes(path) == before  # no row trimmed, nothing appended
    code, err = _cli(["inspect", str(path)], capsys)
    assert code == 2 and "meta/episode_ends" in err


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("key", ["data/qvel", "data/done", "meta/seed"])
@pytest.mark.slow
def test_damaged_data_chunk_is_never_read_as_data(tmp_path, damage, key, capsys):
    path = _store(tmp_path / "s.zarr", lengths=(5, 6, 7), chunk_rows=4) if key.startswith("data") else _store(tmp_path / "s.zarr")
    index = 1 if key.startswith("data") else 0
    DAMAGE[damage](_chunk(path, key, index))
    before = _bytes(path)
    rows = "rows 4:8" if key.startswith("data") else "rows 0:2"
    if damage == "deleted":  # found on open, by the missing chunk file
        for mode in ("r", "a"):
            with pytest.raises(StoreError, match=rf"{path}: '{key}' {rows} are committed but their chunk file is missing"):
                EpisodeStore.open(path, mode)
        assert _cli(["inspect", str(path)], capsys)[0] == 2
    else:  # found when read, by zstd (its checksum catches a flipped byte)
        store = EpisodeStore.open(path)
        with pytest.raises(StoreError, match=rf"'{key}' rows \d+:\d+: a chunk does not decode .*damaged"):
            store.read(key[5:], 0, 18) if key.startswith("data") else store.episode_values("seed")
        if key == "data/qvel":
            with pytest.raises(StoreError, match=rf"{path}: 'data/qvel'"):
                load_problem(path, "walker-1")
    assert _bytes(path) == before


def test_chunk_deleted_after_the_store_was_opened(tmp_path):
    path = _store(tmp_path / "s.zarr", lengths=(5, 6, 7), chunk_rows=4)
    store = EpisodeStore.open(path)
    _chunk(path, "data/qpos", 2).unlink()
    np.testing.assert_array_equal(store.read("qpos", 0, 8).shape, (8, 9))  # other chunks still read
    with pytest.raises(StoreError, match="'data/qpos' rows 8:12 are committed but their chunk file is missing"):
        store.read("qpos")


def test_append_after_a_damaged_last_chunk_commits_nothing(tmp_path):
    path = _store(tmp_path / "s.zarr", lengths=(5, 6), chunk_rows=8)
    DAMAGE["garbage"](_chunk(path, "data/qpos", 1))  # rows 8:11, which an append extends
    store = EpisodeStore.open(path, "a")
    with pytest.raises(StoreError, match=r"writing 'data/qpos' rows 11:15 failed .*nothing was committed"):
        store.append_episode(_episode(), seed=2)
    store.close()
    reader = EpisodeStore.open(path)
    assert reader.n_episodes == 2 and reader.attrs["commit"] == {"episodes": 2, "rows": 11}


# ------------------------------------------------------------------ damaged metadata and attributes


def _set_attrs(path: Path, **changes) -> None:
    doc = json.loads((path / "zarr.json").read_text())
    for key, value in changes.items():
        if value is KeyError:
            del doc["attributes"][key]
        else:
            doc["attributes"][key] = value
    (path / "zarr.json").write_text(json.dumps(doc))


def _field(name: str, **changes):
    spec = WALKER_FIELDS[name].to_json() | changes
    return {k: v for k, v in spec.items() if v is not KeyError}


ATTRIBUTE_CASES = {
    "fields-a-list": ({"fields": [["qpos"]]}, "attribute 'fields' must map field names"),
    "fields-empty": ({"fields": {}}, "attribute 'fields' must map field names"),
    "fields-missing": ({"fields": KeyError}, "root attribute 'fields' is missing"),
    "field-not-an-object": ({"fields": {"qpos": "float64"}}, "attribute 'fields.qpos': must be an object"),
    "field-without-columns": ({"fields": {"qpos": _field("qpos", columns=KeyError)}}, "'fields.qpos': has no 'columns'"),
    "columns-a-string": ({"fields": {"qpos": _field("qpos", columns="q0")}}, "'fields.qpos'.columns: must be a non-empty"),
    "columns-empty": ({"fields": {"qpos": _field("qpos", columns=[])}}, "'fields.qpos'.columns: must be a non-empty"),
    "columns-numbers": ({"fields": {"qpos": _field("qpos", columns=[1, 2])}}, "'fields.qpos'.columns"),
    "dtype-float99": ({"fields": {"qpos": _field("qpos", dtype="float99")}}, "'fields.qpos'.dtype: 'float99' is not"),
    "dtype-object": ({"fields": {"qpos": _field("qpos", dtype="object")}}, "'fields.qpos'.dtype: 'object' is not"),
    "dtype-text": ({"fields": {"qpos": _field("qpos", dtype="U8")}}, "'fields.qpos'.dtype: 'U8' is not"),
    "dtype-number": ({"fields": {"qpos": _field("qpos", dtype=8)}}, "'fields.qpos'.dtype: 8 is not"),
    "dtype-missing": ({"fields": {"qpos": _field("qpos", dtype=KeyError)}}, "'fields.qpos'.dtype: None is not"),
    "unit-a-number": ({"fields": {"qpos": _field("qpos", unit=3)}}, "'fields.qpos'.unit: must be text"),
    "field-name-a-path": ({"fields": {"../qpos": _field("qpos")}}, "attribute 'fields' name: '../qpos' is not a valid"),
    "width-disagrees": ({"fields": {**{k: v.to_json() for k, v in WALKER_FIELDS.items()}, "qpos": _field("qpos", columns=["a"])}},
                        "field 'data/qpos' has shape"),
    "dtype-disagrees": ({"fields": {**{k: v.to_json() for k, v in WALKER_FIELDS.items()}, "qpos": _field("qpos", dtype="float32")}},
                        "field 'data/qpos' has dtype float64, schema says float32"),
    "unknown-field": ({"fields": {**{k: v.to_json() for k, v in WALKER_FIELDS.items()}, "extra": _field("qpos")}},
                      "array 'data/extra' is missing"),
    "episode-keys-a-list": ({"episode_keys": ["seed"]}, "attribute 'episode_keys' must map names to dtypes"),
    "episode-key-dtype": ({"episode_keys": {"seed": "int999"}}, "attribute 'episode_keys.seed': 'int999' is not"),
    "episode-key-unknown": ({"episode_keys": {"seed": "int64", "phase": "int8"}}, "array 'meta/phase' is missing"),
    "dt-text": ({"dt": "fast"}, "attribute 'dt' must be a finite time step"),
    "dt-negative": ({"dt": -0.1}, "attribute 'dt' must be a finite time step"),
    "dt-bool": ({"dt": True}, "attribute 'dt' must be a finite time step"),
    "dt-missing": ({"dt": KeyError}, "root attribute 'dt' is missing"),
    "env-id-a-number": ({"env_id": 5}, "attribute 'env_id' must be text"),
    "source-missing": ({"source": KeyError}, "root attribute 'source' is missing"),
    "format-other": ({"format": "other"}, "attribute 'format' is 'other'"),
    "format-version-text": ({"format_version": "1"}, "attribute 'format_version' is '1'"),
    "commit-a-list": ({"commit": [2, 11]}, "attribute 'commit' must be"),
    "commit-negative": ({"commit": {"episodes": -1, "rows": 0}}, "attribute 'commit' must be"),
    "commit-past-the-ends": ({"commit": {"episodes": 5, "rows": 30}}, "'meta/episode_ends' has 2 entries but the commit record says 5"),
    "commit-wrong-rows": ({"commit": {"episodes": 2, "rows": 12}}, "'meta/episode_ends' ends at row 11 but the commit record says 12"),
    "commit-fewer-episodes": ({"commit": {"episodes": 1, "rows": 11}}, "'meta/episode_ends' ends at row 5 but the commit record says 11"),
}


@pytest.mark.parametrize("case", ATTRIBUTE_CASES)
@pytest.mark.slow
def test_malformed_attributes_are_named(tmp_path, case, capsys):
    path = _store(tmp_path / "s.zarr")
    changes, message = ATTRIBUTE_CASES[case]
    _set_attrs(path, **changes)
    before = _bytes(path)
    for mode in ("r", "a"):
        with pytest.raises(StoreError) as err:
            EpisodeStore.open(path, mode)
        assert str(path) in str(err.value) and message in str(err.value), str(err.value)
    code, err = _cli(["inspect", str(path)], capsys)
    assert code == 2 and message in err
    assert _bytes(path) == before


METADATA_CASES = {
    "root-garbage": ("zarr.json", b"garbage{", "s.zarr/zarr.json: unreadable store metadata"),
    "root-empty": ("zarr.json", b"", "s.zarr/zarr.json: unreadable store metadata"),
    "root-a-list": ("zarr.json", b"[1, 2]", "s.zarr/zarr.json: not the metadata of a zarr v3 group"),
    "root-an-array": ("zarr.json", json.dumps({"zarr_format": 3, "node_type": "array"}).encode(), "not the metadata of a zarr v3 group"),
    "root-binary": ("zarr.json", b"\xff\xfe\x00garbage", "unreadable store metadata"),
    "array-garbage": ("data/qpos/zarr.json", b"garbage{", "array 'data/qpos': unreadable metadata"),
    "array-empty-object": ("data/qvel/zarr.json", b"{}", "array 'data/qvel': unreadable metadata"),
    "ends-garbage": ("meta/episode_ends/zarr.json", b"{\"zarr_format\": 3", "array 'meta/episode_ends': unreadable metadata"),
    "ends-a-group": ("meta/episode_ends/zarr.json", json.dumps({"zarr_format": 3, "node_type": "group"}).encode(),
                     "'meta/episode_ends' is a group, expected an array"),
    "key-garbage": ("meta/seed/zarr.json", b"nonsense", "array 'meta/seed': unreadable metadata"),
}


@pytest.mark.parametrize("case", METADATA_CASES)
@pytest.mark.slow
def test_garbage_zarr_metadata_is_named(tmp_path, case, capsys):
    path = _store(tmp_path / "s.zarr")
    name, content, message = METADATA_CASES[case]
    (path / name).write_bytes(content)
    for mode in ("r", "a"):
        with pytest.raises(StoreError, match=message.replace("{", r"\{").replace("[", r"\[")):
            EpisodeStore.open(path, mode)
    code, err = _cli(["inspect", str(path)], capsys)
    assert code == 2 and message in err


@pytest.mark.parametrize("damage", ["array-deleted", "ends-deleted", "key-deleted", "data-is-a-file", "store-is-a-file"])
def test_missing_arrays_and_odd_paths(tmp_path, damage, capsys):
    path = _store(tmp_path / "s.zarr")
    if damage == "array-deleted":
        shutil.rmtree(path / "data" / "qpos")
        message = "array 'data/qpos' is missing"
    elif damage == "ends-deleted":
        shutil.rmtree(path / "meta" / "episode_ends")
        message = "array 'meta/episode_ends' is missing"
    elif damage == "key-deleted":
        shutil.rmtree(path / "meta" / "seed")
        message = "array 'meta/seed' is missing"
    elif damage == "data-is-a-file":
        shutil.rmtree(path / "data")
        (path / "data").write_text("x")
        message = "data/"
    else:
        shutil.rmtree(path)
        path.write_text("not a store")
        message = "not a zarr v3 group"
    with pytest.raises(StoreError, match=message):
        EpisodeStore.open(path)
    code, err = _cli(["inspect", str(path)], capsys)
    assert code == 2 and str(path) in err


def test_zarr_v2_store_is_refused_everywhere_with_the_same_message(tmp_path, capsys):
    path = tmp_path / "v2.zarr"
    group = zarr.open_group(str(path), mode="w", zarr_format=2)
    attrs = json.loads((_store(tmp_path / "v3.zarr") / "zarr.json").read_text())["attributes"]
    group.attrs.update(attrs)
    for name, spec in WALKER_FIELDS.items():
        group.create_array(f"data/{name}", shape=(11, spec.width), dtype=spec.dtype)
    group.create_array("meta/episode_ends", shape=(2,), dtype="int64")[:] = [5, 11]
    message = "a zarr v2 store (.zgroup); gpdyn episode stores are zarr v3"
    for mode in ("r", "a"):
        with pytest.raises(StoreError, match=r"a zarr v2 store \(\.zgroup\)"):
            EpisodeStore.open(path, mode)
    code, err = _cli(["inspect", str(path)], capsys)
    assert code == 2 and message in err
    with pytest.raises(StoreError, match=r"a zarr v2 store"):
        load_problem(path, "walker-1")


# ------------------------------------------------------------------ values written behind the API


BAD_VALUES = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "1e300": 1e300, "-1e300": -1e300,
              "just-past-the-bound": MAX_ABS * 1.01}


@pytest.mark.parametrize("value", BAD_VALUES)
def test_bad_values_behind_the_api_are_named_by_row_and_column(tmp_path, value, capsys):
    path = _store(tmp_path / "s.zarr")
    zarr.open_group(str(path), mode="r+")["data/qvel"][7, 4] = BAD_VALUES[value]
    store = EpisodeStore.open(path)
    where = rf"{path}: 'data/qvel' row 7 \(episode 1, step 2\), column 'qvel4' holds"
    with pytest.raises(StoreError, match=where):
        store.read("qvel")
    with pytest.raises(StoreError, match=where):
        store.episode(1)
    store.read("qvel", 0, 7)  # rows before it still read
    with pytest.raises(StoreError, match=where):
        load_problem(path, "walker-1")
    code, err = _cli(["learn", "--store", str(path), "--problem", "walker-1", "--learner", "exact", "--iterations", "1",
                      "--out", str(tmp_path / "run")], capsys)
    assert code == 2 and "'data/qvel' row 7" in err and "column 'qvel4'" in err


def test_the_magnitude_bound_itself_is_accepted(tmp_path):
    path = _store(tmp_path / "s.zarr")
    with EpisodeStore.open(path, "a") as store:
        ep = _episode()
        ep["qpos"][0, 0], ep["qpos"][1, 1] = MAX_ABS, -MAX_ABS
        store.append_episode(ep, seed=1)
    assert EpisodeStore.open(path).episode(2)["qpos"][0, 0] == MAX_ABS
    with EpisodeStore.open(path, "a") as store:
        ep["qpos"][0, 0] = np.nextafter(MAX_ABS, np.inf)
        with pytest.raises(StoreError, match=r"field 'qpos' has 1.0000000000000002e\+100 at step 0, column 'qpos0': not a finite number within"):
            store.append_episode(ep, seed=1)


def test_non_finite_per_episode_value_behind_the_api(tmp_path):
    path = tmp_path / "s.zarr"
    fields = {"x": FieldSpec(("a",))}
    with EpisodeStore.create(path, fields, source="t", env_id="w", dt=0.1, seed=0, episode_keys={"gain": "float64"}) as s:
        s.append_episodes([{"x": np.ones((2, 1))}] * 2, [{"gain": 1.0}, {"gain": 2.0}])
    zarr.open_group(str(path), mode="r+")["meta/gain"][1] = np.inf
    with pytest.raises(StoreError, match=rf"{path}: 'meta/gain' episode 1, column 'gain' holds inf"):
        EpisodeStore.open(path).episode_values("gain")


# ------------------------------------------------------------------ refused appends change nothing


EPISODE_CASES = {
    "value-text": ({"seed": "abc"}, None, "per-episode value 'seed' has dtype <U3, store expects int64"),
    "value-none": ({"seed": None}, None, "per-episode value 'seed' has dtype object"),
    "value-a-list": ({"seed": [1, 2]}, None, "per-episode value 'seed' must be one number, has shape (2,)"),
    "value-fraction": ({"seed": 1.5}, None, "per-episode value 'seed' has dtype float64, store expects int64"),
    "value-too-big": ({"seed": 2**70}, None, "per-episode value 'seed'"),
    "value-missing": ({}, None, "per-episode values missing ['seed']"),
    "value-unknown": ({"seed": 1, "phase": 2}, None, "unknown ['phase']"),
    "values-not-a-mapping": ([1], None, "per-episode values must map keys to scalars"),
    "field-object": ({"seed": 1}, ("qvel", lambda a: a.astype(object)), "field 'qvel' has dtype object"),
    "field-text": ({"seed": 1}, ("qvel", lambda a: a.astype(str)), "field 'qvel' has dtype <U"),
    "field-complex": ({"seed": 1}, ("qvel", lambda a: a + 1j), "field 'qvel' has dtype complex128"),
    "field-1e300": ({"seed": 1}, ("qvel", lambda a: np.where(np.arange(a.size).reshape(a.shape) == 5, 1e300, a)),
                    "field 'qvel' has 1e+300 at step 0, column 'qvel5'"),
    "field-float32-overflow": ({"seed": 1}, ("action", lambda a: np.full(a.shape, 1e39)),
                               "field 'action' has 1e+39 at step 0, column 'a0': not a finite number within ±1e+100 as float32"),
    "field-inf": ({"seed": 1}, ("qpos", lambda a: np.full(a.shape, -np.inf)), "field 'qpos' has -inf at step 0"),
    "field-bool-from-int": ({"seed": 1}, ("done", lambda a: a.astype(np.int64)), "field 'done' has dtype int64, store expects bool"),
    "field-3d": ({"seed": 1}, ("qpos", lambda a: a[:, :, None]), "field 'qpos' has shape"),
    "field-empty": ({"seed": 1}, ("*", lambda a: a[:0]), "an episode needs at least one step"),
}


@pytest.mark.parametrize("case", EPISODE_CASES)
@pytest.mark.slow
def test_refused_append_writes_no_row(tmp_path, case):
    path = _store(tmp_path / "s.zarr")
    values, change, message = EPISODE_CASES[case]
    bad = _episode()
    if change is not None:
        name, fn = change
        for key in (WALKER_FIELDS if name == "*" else [name]):
            bad[key] = fn(bad[key])
    before = _bytes(path)
    with EpisodeStore.open(path, "a") as store:
        with pytest.raises(StoreError) as err:
            store.append_episodes([_episode(), bad], [{"seed": 1}, values])
        assert str(path) in str(err.value) and "episode 1 of the batch" in str(err.value)
        assert message in str(err.value), str(err.value)
    assert _bytes(path) == before


def test_int_range_of_a_narrow_field(tmp_path):
    path = tmp_path / "n.zarr"
    with EpisodeStore.create(path, {"k": FieldSpec(("k",), "int8")}, source="t", env_id="w", dt=0.1, seed=0,
                             episode_keys={"online": "int8"}) as s:
        with pytest.raises(StoreError, match="field 'k' holds 300, outside the range of int8"):
            s.append_episode({"k": np.array([[1], [300]])}, online=0)
        with pytest.raises(StoreError, match="per-episode value 'online' holds -129, outside the range of int8"):
            s.append_episode({"k": np.array([[1]])}, online=-129)
        s.append_episode({"k": np.array([[1], [-128]])}, online=np.int64(1))
    assert EpisodeStore.open(path).n_rows == 2


@pytest.mark.parametrize("bad, message", [
    ({"fields": {"a/b": FieldSpec(("x",))}}, "field name: 'a/b' is not a valid name"),
    ({"fields": {"x": FieldSpec(("x",), "float99")}}, "field 'x' dtype: 'float99' is not"),
    ({"fields": {"x": FieldSpec(())}}, "field 'x' has no columns"),
    ({"episode_keys": {"episode_ends": "int64"}}, "'episode_ends' is the store's own"),
    ({"episode_keys": {"k": "str"}}, "per-episode key 'k' dtype: 'str' is not"),
    ({"dt": float("nan")}, "dt must be a finite time step"),
    ({"dt": "x"}, "dt must be a finite time step"),
    ({"extra_attrs": {"gain": float("inf")}}, "an attribute cannot be stored as JSON"),
], ids=["field-path", "field-dtype", "no-columns", "ends-as-key", "key-dtype", "dt-nan", "dt-text", "attr-inf"])
def test_create_refuses_a_bad_schema_and_leaves_no_store(tmp_path, bad, message):
    kwargs = {"fields": {"x": FieldSpec(("x",))}, "source": "t", "env_id": "w", "dt": 0.1, "seed": 0} | bad
    with pytest.raises(StoreError, match=message.replace("(", r"\(")):
        EpisodeStore.create(tmp_path / "s.zarr", **kwargs)
    assert not (tmp_path / "s.zarr" / "zarr.json").exists() or "extra_attrs" in bad
    EpisodeStore.create(tmp_path / "t.zarr", fields={"x": FieldSpec(("x",))}, source="t", env_id="w", dt=0.1,
                        seed=0).close()  # the lock of the refused one is not left held


# ------------------------------------------------------------------ run folders: torn and garbage files


def _eval(learner="exact", iteration=1, width=2, **changes):
    record = {"kind": "eval", "learner": learner, "iteration": iteration, "seconds": 0.5,
              "nmse": [0.1] * width, "vlb": [-1.0] * width} | changes
    return {k: v for k, v in record.items() if v is not KeyError}


def _run_folder(tmp_path: Path, records: list, config: object = None) -> Path:
    path = tmp_path / "run"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config if config is not None else {"job": "replay", "problem": "p"}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_torn_last_line_is_skipped_with_a_warning_and_dropped_by_the_next_writer(tmp_path, capsys):
    path = _run_folder(tmp_path, [_eval(iteration=1), _eval(iteration=2)])
    with open(path / "metrics.jsonl", "a") as f:
        f.write('{"kind": "eval", "learner": "exa')  # killed mid-write
    with pytest.warns(UserWarning, match=r"metrics.jsonl: line 3 is incomplete"):
        assert len(RunDir(path).metrics()) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["report", str(path)]) == 0
        assert main(["inspect", str(path)]) == 0
    assert "metric_records: 2" in capsys.readouterr().out
    with pytest.warns(UserWarning, match="removing the incomplete line 3"):
        run = RunDir.resume(path)
    run.log(kind="eval", learner="exact", iteration=3, seconds=1.0, nmse=[0.1, 0.1], vlb=[-1.0, -1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing torn is left
        assert [r["iteration"] for r in run.metrics()] == [1, 2, 3]


def test_complete_last_record_without_its_newline_is_kept(tmp_path):
    path = _run_folder(tmp_path, [_eval(iteration=1)])
    with open(path / "metrics.jsonl", "a") as f:
        f.write(json.dumps(_eval(iteration=2)))  # killed between the record and its newline
    run = RunDir.resume(path)
    run.log(kind="note")
    assert [r.get("iteration") for r in run.metrics()] == [1, 2, None]


GARBAGE_LINES = {
    "garbage-line": (b'{"kind": "eval"\n', "line 2: not valid JSON"),
    "a-list": (b"[1, 2, 3]\n", "line 2: expected a JSON object, found list"),
    "a-number": (b"42\n", "line 2: expected a JSON object, found int"),
    "binary": (b"\xff\xfe\x00\x01\n", "line 2: not valid JSON"),
    "two-records-on-a-line": (b'{"a": 1}{"b": 2}\n', "line 2: not valid JSON"),
}


@pytest.mark.parametrize("case", GARBAGE_LINES)
def test_garbage_line_in_metrics_exits_2_naming_file_and_line(tmp_path, case, capsys):
    path = _run_folder(tmp_path, [_eval(iteration=1)])
    content, message = GARBAGE_LINES[case]
    with open(path / "metrics.jsonl", "ab") as f:
        f.write(content + (json.dumps(_eval(iteration=2)) + "\n").encode())
    for command in ("report", "inspect"):
        code, err = _cli([command, str(path)], capsys)
        assert code == 2 and f"{path / 'metrics.jsonl'}: {message}" in err, err


CONFIG_CASES = {
    "garbage": (b'{"job": "replay",\n  "problem": }', "config.json: line 2, column 14: not valid JSON"),
    "empty": (b"", "config.json: line 1, column 1: not valid JSON"),
    "a-list": (b"[]", "config.json: expected a JSON object, found list"),
    "binary": (b"\xff\xfe\x00", "config.json: unreadable"),
}


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_garbage_config_exits_2_naming_the_file(tmp_path, case, capsys):
    path = _run_folder(tmp_path, [_eval()])
    content, message = CONFIG_CASES[case]
    (path / "config.json").write_bytes(content)
    for command in ("report", "inspect"):
        code, err = _cli([command, str(path)], capsys)
        assert code == 2 and message in err, err


EVAL_CASES = {
    "no-learner": (_eval(learner=KeyError), "line 2: evaluation record: 'learner' must be a name"),
    "learner-a-number": (_eval(learner=3), "'learner' must be a name"),
    "iteration-text": (_eval(iteration="ten"), "'iteration' must be an integer >= 0"),
    "iteration-negative": (_eval(iteration=-1), "'iteration' must be an integer >= 0"),
    "no-seconds": (_eval(seconds=KeyError), "'seconds' must be a number >= 0"),
    "no-nmse": (_eval(nmse=KeyError), "'nmse' must be a list of numbers"),
    "nmse-a-number": (_eval(nmse=0.1), "'nmse' must be a list of numbers"),
    "nmse-text": (_eval(nmse=["a", "b"]), "'nmse' must be a list of numbers"),
    "vlb-empty": (_eval(vlb=[]), "'vlb' must be a list of numbers"),
    "other-width": (_eval(width=3), "'nmse' has 3 outputs, other records have 2"),
    "nll-text": (_eval(nll="x"), "'nll' must be a list of numbers"),
}


@pytest.mark.parametrize("case", EVAL_CASES)
def test_malformed_evaluation_record_exits_2_naming_the_line(tmp_path, case, capsys):
    record, message = EVAL_CASES[case]
    path = _run_folder(tmp_path, [_eval(iteration=1), record])
    code, err = _cli(["report", str(path)], capsys)
    assert code == 2 and str(path / "metrics.jsonl") in err and message in err, err


@pytest.mark.parametrize("content, message", [
    ("{", "step_size.json: line 1, column 2: not valid JSON"),
    ("[]", "step_size.json: expected an object of learners"),
    ('{"exact": {"lr": "x"}}', "step_size.json: learner 'exact': expected"),
    ('{"exact": {"lr": 0.1, "objective": {"fast": 1.0}, "iterations": 5}}', "candidate step size 'fast' is not a number"),
], ids=["garbage", "a-list", "bad-entry", "bad-candidate"])
def test_garbage_step_size_file_exits_2(tmp_path, content, message, capsys):
    path = _run_folder(tmp_path, [_eval()])
    (path / "step_size.json").write_text(content)
    code, err = _cli(["report", str(path)], capsys)
    assert code == 2 and message in err, err


def test_outputs_of_the_config_must_match_the_records(tmp_path, capsys):
    path = _run_folder(tmp_path, [_eval()], config={"job": "replay", "outputs": ["only-one"]})
    code, err = _cli(["report", str(path)], capsys)
    assert code == 2 and "config.json: 'outputs' must list 2 output names" in err
