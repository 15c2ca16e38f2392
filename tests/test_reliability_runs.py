"""Run folders and stores that must not quietly mix data.

- A resumed run checks the identity of its store (id + commit record, or a content hash for
  stores made before ids): a store replaced at the same path is refused, naming both identities.
- An import refuses the same samples twice (a file named twice, a renamed or gzip copy) and
  reads text with bounded lines.
- ``gpdyn learn`` resumes like ``gpdyn replay`` (one mechanism): a run killed at any point
  continues to the same final checkpoint, bit for bit.
- ``inspect`` and ``report`` of an unfinished run say how far it got and how to continue it,
  never showing its numbers as final.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import tracemalloc
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.io import savemat
from synthetic import make_kuka_store

from gpdyn.cli import main
from gpdyn.data import importers
from gpdyn.data.importers import ImportFormatError, import_kuka_ilgr, import_sarcos, read_kuka_ilgr
from gpdyn.data.problems import load_problem
from gpdyn.data.store import STORE_ID, EpisodeStore
from gpdyn.errors import InputError
from gpdyn.experiments import resume
from gpdyn.experiments.learn import LearnConfig, learn
from gpdyn.experiments.learned import CHECKPOINT
from gpdyn.experiments.learned import load_learned as load
from gpdyn.experiments.replay import ReplayConfig, open_run, replay
from gpdyn.experiments.report import write_report
from gpdyn.runs import COMPLETION_KEY, FINISHED_FILE, RunDir

REPO = Path(__file__).resolve().parents[1]


class Stop(Exception):
    """Stands for a kill: raised from a checkpoint hook."""


def _stop_at(iteration: int, learner: str | None = None):
    def hook(name: str, it: int) -> None:
        if it == iteration and (learner is None or name == learner):
            raise Stop

    return hook


def _kuka(path: Path, offline=(50,), online=(80, 70), seed: int = 0) -> Path:
    make_kuka_store(path, offline=list(offline), online=list(online), seed=seed).close()
    return path


def _without_id(store: Path) -> Path:
    """The store as one created before stores had ids (the attribute removed from zarr.json)."""
    meta = store / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"].pop(STORE_ID)
    meta.write_text(json.dumps(doc))
    return store


# ---------------------------------------------------------------------------------- replay and a replaced store
def _replay_cfg(store: Path, **kw) -> ReplayConfig:
    base = dict(store=str(store), problem="kuka", learners=["svi"], iterations=4, batch_size=32, eval_every=2, seed=3,
                preset="small", sizes={"svi": {"m": 8}})
    return ReplayConfig(**{**base, **kw})


def _replay(cfg: ReplayConfig, out: Path, **kw):
    problem = load_problem(cfg.store, cfg.problem, protocol=cfg.protocol, seed=cfg.seed)
    run = open_run(cfg, out, problem)
    try:
        return run, replay(cfg, run, problem=problem, progress=False, **kw)
    finally:
        run.close()


def _stopped_replay(cfg: ReplayConfig, out: Path, at: int = 2, learner: str | None = None) -> None:
    with pytest.raises(Stop):
        _replay(cfg, out, on_checkpoint=_stop_at(at, learner))


def _replace(store: Path, make) -> None:
    shutil.rmtree(store)
    make(store)


def _append(store: Path) -> None:
    with EpisodeStore.open(store, mode="a") as s:
        rng = np.random.default_rng(7)
        s.append_episode({f: rng.normal(size=(10, 7)) for f in ("q", "qd", "qdd", "tau")}, online=1)


REPLACEMENTS = {
    "different-rows": lambda p: _kuka(p, online=(90, 70)),
    "same-rows-other-content": lambda p: _kuka(p, seed=1),
    "fewer-episodes": lambda p: _kuka(p, online=(150,)),
    "same-content-new-store": lambda p: _kuka(p),  # made again from the same seed: another store all the same
}


@pytest.mark.parametrize("name", sorted(REPLACEMENTS))
@pytest.mark.slow
def test_replay_resume_refuses_a_store_replaced_at_the_same_path(name, tmp_path):
    store = _kuka(tmp_path / "kuka.zarr")
    cfg = _replay_cfg(store)
    _stopped_replay(cfg, tmp_path / "run")
    recorded = RunDir(tmp_path / "run").config()["store_identity"]
    _replace(store, REPLACEMENTS[name])
    found = EpisodeStore.open(store).identity()
    with pytest.raises(InputError) as err:
        _replay(cfg, tmp_path / "run")
    message = str(err.value)
    assert str(store) in message and str(recorded) in message and str(found) in message
    assert "original store" in message and "another --out" in message
    assert [r["iteration"] for r in RunDir(tmp_path / "run").metrics()] == [2]  # nothing was added


def test_replay_resume_refuses_a_store_appended_to_since(tmp_path):
    store = _kuka(tmp_path / "kuka.zarr")
    cfg = _replay_cfg(store)
    _stopped_replay(cfg, tmp_path / "run")
    _append(store)
    with pytest.raises(InputError, match=r"'episodes': 3, 'rows': 200\}, found \{.*'episodes': 4, 'rows': 210"):
        _replay(cfg, tmp_path / "run")


@pytest.mark.parametrize("replacement", ["same-rows-other-content", "value-changed-in-place"])
def test_a_store_without_id_is_checked_by_its_content(replacement, tmp_path):
    store = _without_id(_kuka(tmp_path / "kuka.zarr"))
    cfg = _replay_cfg(store)
    _stopped_replay(cfg, tmp_path / "run")
    recorded = RunDir(tmp_path / "run").config()["store_identity"]
    assert set(recorded) == {"content_sha256", "episodes", "rows"}
    if replacement == "value-changed-in-place":  # written behind the API: same shape, one number changed
        group = __import__("zarr").open_group(str(store), mode="r+")
        tau = group["data/tau"]
        tau[5, 3] = float(tau[5, 3]) + 1.0
    else:
        _replace(store, lambda p: _without_id(_kuka(p, seed=1)))
    with pytest.raises(InputError, match="content_sha256"):
        _replay(cfg, tmp_path / "run")


def test_a_store_without_id_resumes_to_the_same_numbers(tmp_path):
    store = _without_id(_kuka(tmp_path / "kuka.zarr"))
    cfg = _replay_cfg(store)
    _, straight = _replay(cfg, tmp_path / "straight")
    _stopped_replay(cfg, tmp_path / "run")
    _, resumed = _replay(cfg, tmp_path / "run")
    assert resumed["svi"]["nmse"] == straight["svi"]["nmse"]
    assert RunDir(tmp_path / "run").finished() is not None


def test_a_store_moved_away_and_back_is_the_same_store(tmp_path):
    store = _kuka(tmp_path / "kuka.zarr")
    cfg = _replay_cfg(store)
    _stopped_replay(cfg, tmp_path / "run")
    shutil.copytree(store, tmp_path / "elsewhere.zarr")
    shutil.rmtree(store)
    shutil.copytree(tmp_path / "elsewhere.zarr", store)
    _, finals = _replay(cfg, tmp_path / "run")
    assert finals["svi"]["iteration"] == 4


def test_a_run_folder_made_before_identities_is_resumed_with_a_warning(tmp_path):
    store = _kuka(tmp_path / "kuka.zarr")
    cfg = _replay_cfg(store)
    _stopped_replay(cfg, tmp_path / "run")
    config_file = tmp_path / "run" / "config.json"
    config = json.loads(config_file.read_text())
    del config["store_identity"]
    config_file.write_text(json.dumps(config))
    with pytest.warns(UserWarning, match="cannot check that"):
        _, finals = _replay(cfg, tmp_path / "run")
    assert finals["svi"]["iteration"] == 4
    assert json.loads(config_file.read_text())["store_identity"] == EpisodeStore.open(store).identity()


def test_the_replay_command_refuses_a_replaced_store_with_exit_2(tmp_path, capsys):
    store = _kuka(tmp_path / "kuka.zarr")
    _stopped_replay(_replay_cfg(store, dtype="float64"), tmp_path / "run")
    _replace(store, lambda p: _kuka(p, seed=2))
    argv = ["replay", "--store", str(store), "--problem", "kuka", "--learners", "svi", "--iterations", "4",
            "--batch-size", "32", "--eval-every", "2", "--seed", "3", "--preset", "small", "--size", "svi.m=8",
            "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{store}: not the store the run in {tmp_path / 'run'} read" in err


def test_store_identity_is_an_id_and_the_commit_record(tmp_path):
    one, two = _kuka(tmp_path / "one.zarr"), _kuka(tmp_path / "two.zarr")
    a, b = EpisodeStore.open(one).identity(), EpisodeStore.open(two).identity()
    assert a[STORE_ID] != b[STORE_ID] and len(a[STORE_ID]) == 32
    assert {k: v for k, v in a.items() if k != STORE_ID} == {"episodes": 3, "rows": 200}
    assert EpisodeStore.open(one).summary()["store_id"] == a[STORE_ID]
    legacy = EpisodeStore.open(_without_id(two))
    assert legacy.identity()["content_sha256"] == legacy.content_sha256() == EpisodeStore.open(two).content_sha256()


# ---------------------------------------------------------------------------------- imports: duplicates
def _rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 28))


def _text(path: Path, rows: np.ndarray) -> Path:
    np.savetxt(path, rows, fmt="%.17g")
    return path


def _copies(tmp_path: Path, kind: str) -> list[Path]:
    first = _text(tmp_path / "kuka1_offline.txt", _rows(30, 0))
    if kind == "same-file-twice":
        return [first, first]
    if kind == "renamed-copy":
        return [first, Path(shutil.copy(first, tmp_path / "kuka1_online.txt"))]
    if kind == "gzip-copy":
        (tmp_path / "kuka1_online.txt.gz").write_bytes(gzip.compress(first.read_bytes()))
        return [first, tmp_path / "kuka1_online.txt.gz"]
    if kind == "gzip-first-then-plain":
        (tmp_path / "a.txt.gz").write_bytes(gzip.compress(first.read_bytes(), compresslevel=1))
        return [tmp_path / "a.txt.gz", first]
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["same-file-twice", "renamed-copy", "gzip-copy", "gzip-first-then-plain"])
def test_an_import_refuses_the_same_samples_twice(kind, tmp_path):
    files = _copies(tmp_path, kind)
    with pytest.raises(ImportFormatError) as err:
        import_kuka_ilgr(files, tmp_path / "k.zarr")
    assert f"{files[1]}: holds the same 30 samples as {files[0]}" in str(err.value)
    assert "imported once" in str(err.value)
    assert not (tmp_path / "k.zarr").exists()


def test_the_import_command_refuses_a_repeated_file_with_exit_2(tmp_path, capsys):
    files = _copies(tmp_path, "renamed-copy")
    assert main(["import", "kuka-ilgr", *map(str, files), "--store", str(tmp_path / "k.zarr")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "kuka1_online.txt: holds the same 30 samples as" in err
    assert not (tmp_path / "k.zarr").exists()


@pytest.mark.parametrize("kind", ["same-file-twice", "copy"])
def test_a_sarcos_import_refuses_the_same_matrix_twice(kind, tmp_path):
    savemat(tmp_path / "sarcos_inv.mat", {"sarcos_inv": _rows(20, 1)})
    second = tmp_path / "sarcos_inv.mat"
    if kind == "copy":  # saved again: other bytes (a header with the time), the same samples
        savemat(tmp_path / "sarcos_inv_test.mat", {"sarcos_inv_test": _rows(20, 1)})
        second = tmp_path / "sarcos_inv_test.mat"
    with pytest.raises(ImportFormatError, match=f"{second}: holds the same 20 samples as"):
        import_sarcos([tmp_path / "sarcos_inv.mat", second], tmp_path / "s.zarr")


def test_each_imported_file_records_the_sha256_of_its_content(tmp_path):
    plain = _text(tmp_path / "kuka1_offline.txt", _rows(30, 0))
    packed = tmp_path / "kuka1_online.txt.gz"
    online_text = _text(tmp_path / "online.txt", _rows(20, 5)).read_bytes()
    packed.write_bytes(gzip.compress(online_text))
    store = import_kuka_ilgr([plain, packed], tmp_path / "k.zarr")
    entries = {e["file"]: e for e in store.attrs["imported_files"]}
    assert entries["kuka1_offline.txt"]["sha256"] == hashlib.sha256(plain.read_bytes()).hexdigest()
    assert entries["kuka1_online.txt.gz"]["sha256"] == hashlib.sha256(online_text).hexdigest()  # after gunzip
    assert entries["kuka1_offline.txt"]["data_sha256"] != entries["kuka1_online.txt.gz"]["data_sha256"]


# ---------------------------------------------------------------------------------- imports: bounded lines
def _gzip_line(path: Path, before: list[str], line_bytes: int) -> Path:
    """A gzip file: the lines ``before``, then one line of ``line_bytes`` digits, written a block at a time."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(packer.compress("".join(line + "\n" for line in before).encode()))
        for start in range(0, line_bytes, 1 << 20):
            f.write(packer.compress(b"1" * min(1 << 20, line_bytes - start)))
        f.write(packer.compress(b"\n") + packer.flush())
    return path


def _good_lines(n: int) -> list[str]:
    return [" ".join(f"{v:.17g}" for v in row) for row in _rows(n, 3)]


@pytest.mark.parametrize("compressed", [True, False])
def test_a_line_past_the_limit_is_refused_naming_file_and_line(compressed, tmp_path, monkeypatch):
    monkeypatch.setattr(importers, "MAX_LINE_BYTES", 64 * 1024)
    if compressed:
        path = _gzip_line(tmp_path / "kuka1_offline.txt.gz", _good_lines(2), 3 << 20)
    else:
        path = tmp_path / "kuka1_offline.txt"
        path.write_text("\n".join(_good_lines(2)) + "\n" + "1" * (3 << 20) + "\n")
    with pytest.raises(ImportFormatError, match=rf"{path.name}: line 3 is longer than 65536 bytes"):
        read_kuka_ilgr(path)


def test_line_numbers_stay_right_across_read_blocks(tmp_path, monkeypatch):
    """A long line far into the file (past the first blocks read) is named by its own number."""
    monkeypatch.setattr(importers, "MAX_LINE_BYTES", 2000)
    lines = _good_lines(3000)  # about 2 MB: several blocks
    lines.insert(2500, "2 " * 1500)
    path = tmp_path / "kuka1_offline.txt"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ImportFormatError, match="line 2501 is longer than 2000 bytes"):
        read_kuka_ilgr(path)
    del lines[2500]
    path.write_text("\n".join(lines) + "\n")
    assert read_kuka_ilgr(path).shape == (3000, 28)  # lines under the limit: read as before


def test_the_default_limit_bounds_the_memory_of_a_gzip_that_expands_to_one_long_line(tmp_path):
    path = _gzip_line(tmp_path / "bomb.txt.gz", [], 48 << 20)
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ImportFormatError, match=r"bomb.txt.gz: line 1 is longer than 1048576 bytes"):
            read_kuka_ilgr(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # a few blocks, never the 48 MB line


def test_a_damaged_gzip_is_still_named_as_such_before_its_garbage(tmp_path):
    packed = bytearray(gzip.compress("\n".join(_good_lines(400)).encode()))
    packed[len(packed) // 2] ^= 0xFF
    (tmp_path / "flip.txt.gz").write_bytes(bytes(packed))
    with pytest.raises(ImportFormatError, match="flip.txt.gz: not a readable gzip file"):
        read_kuka_ilgr(tmp_path / "flip.txt.gz")


# ---------------------------------------------------------------------------------- learn resumes
def _learn_cfg(store: Path, **kw) -> LearnConfig:
    base = dict(store=str(store), problem="kuka", learner="svi", iterations=8, batch_size=32, eval_every=2, seed=1,
                preset="small", sizes={"m": 8})
    return LearnConfig(**{**base, **kw})


def _state(run_dir: Path) -> dict:
    return torch.load(run_dir / CHECKPOINT, weights_only=True)["state"]


def _assert_equal(a, b, where: str) -> None:
    """Bit for bit: tensors equal in dtype, shape and every value; dicts and lists item by item."""
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_equal(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _assert_same_learner(a: Path, b: Path) -> None:
    _assert_equal(_state(a), _state(b), "state")


def _evals(run_dir: Path) -> dict[int, list[float]]:
    return {r["iteration"]: r["nmse"] for r in RunDir(run_dir).metrics()}


@pytest.fixture
def straight_learn(kuka_store, tmp_path) -> Path:
    run, _ = learn(_learn_cfg(kuka_store.path), tmp_path / "straight", progress=False)
    run.close()  # its writer lock, which a reference cycle could otherwise hold until the next garbage collection
    return tmp_path / "straight"


@pytest.mark.parametrize("stop_at", [2, 4, 6])
@pytest.mark.slow
def test_a_stopped_learn_continues_to_the_same_final_checkpoint(stop_at, straight_learn, kuka_store, tmp_path):
    cfg = _learn_cfg(kuka_store.path)
    with pytest.raises(Stop):
        learn(cfg, tmp_path / "run", progress=False, on_checkpoint=_stop_at(stop_at))
    seen: list[int] = []
    _, final = learn(cfg, tmp_path / "run", progress=False, on_checkpoint=lambda n, i: seen.append(i))
    assert seen == list(range(stop_at + 2, 9, 2))  # no repeated work
    _assert_same_learner(tmp_path / "run", straight_learn)
    assert _evals(tmp_path / "run") == _evals(straight_learn)
    assert final["iteration"] == 8 and RunDir(tmp_path / "run").finished()["iterations"] == 8


@pytest.mark.slow
def test_a_learn_stopped_between_the_record_and_the_checkpoint_repeats_one_segment(straight_learn, kuka_store, tmp_path,
                                                                                    monkeypatch):
    cfg = _learn_cfg(kuka_store.path)
    real_save = resume.save_learner

    def save_then_die(learner, path, **extra):
        if extra["iteration"] == 4:
            raise Stop  # the record of iteration 4 is logged, its checkpoint never written
        return real_save(learner, path, **extra)

    monkeypatch.setattr(resume, "save_learner", save_then_die)
    with pytest.raises(Stop):
        learn(cfg, tmp_path / "run", progress=False)
    monkeypatch.setattr(resume, "save_learner", real_save)
    learn(cfg, tmp_path / "run", progress=False)
    assert [r["iteration"] for r in RunDir(tmp_path / "run").metrics()] == [2, 4, 4, 6, 8]
    _assert_same_learner(tmp_path / "run", straight_learn)


@pytest.mark.slow
def test_a_learn_killed_by_sigkill_is_continued_by_the_same_command(straight_learn, kuka_store, tmp_path):
    out = tmp_path / "run"
    argv = ["learn", "--store", str(kuka_store.path), "--problem", "kuka", "--learner", "svi", "--iterations", "8",
            "--batch-size", "32", "--eval-every", "2", "--seed", "1", "--preset", "small", "--size", "m=8",
            "--dtype", "float64", "--out", str(out)]
    # the real command in a child, killed -9 right after its second checkpoint
    script = textwrap.dedent(f"""
        import os, signal, sys
        import torch
        torch.set_num_threads(1)
        from gpdyn.experiments import resume
        real = resume.save_learner
        def save(learner, path, **extra):
            real(learner, path, **extra)
            if extra["iteration"] == 4:
                os.kill(os.getpid(), signal.SIGKILL)
        resume.save_learner = save
        from gpdyn.cli import main
        sys.exit(main({argv!r}))
    """)
    child = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    assert child.returncode == -9, child.stderr
    assert [r["iteration"] for r in RunDir(out).metrics()] == [2, 4] and not (out / FINISHED_FILE).exists()
    with pytest.warns(UserWarning, match="stale lock of pid"):  # the lock the killed child held
        assert main(argv) == 0
    _assert_same_learner(out, straight_learn)
    assert _evals(out) == _evals(straight_learn)


@pytest.mark.slow
def test_the_same_learn_on_a_finished_folder_does_no_work(straight_learn, kuka_store):
    seen: list[int] = []
    before = (straight_learn / CHECKPOINT).read_bytes()
    _, final = learn(_learn_cfg(kuka_store.path), straight_learn, progress=False, on_checkpoint=lambda n, i: seen.append(i))
    assert seen == [] and final["iteration"] == 8 and (straight_learn / CHECKPOINT).read_bytes() == before


def test_a_stopped_learn_with_other_settings_or_another_store_is_refused(kuka_store, tmp_path):
    cfg = _learn_cfg(kuka_store.path)
    with pytest.raises(Stop):
        learn(cfg, tmp_path / "run", progress=False, on_checkpoint=_stop_at(2))
    with pytest.raises(InputError, match=r"holds a learn with other settings \(iterations\); use another --out"):
        learn(_learn_cfg(kuka_store.path, iterations=10), tmp_path / "run", progress=False)
    kuka_store.close()
    _replace(Path(kuka_store.path), lambda p: _kuka(p, seed=4))
    with pytest.raises(InputError, match="not the store the run in .* read"):
        learn(cfg, tmp_path / "run", progress=False)
    with pytest.raises(InputError, match="holds a learn run, not a replay"):
        _replay(_replay_cfg(Path(kuka_store.path)), tmp_path / "run")


def test_a_learn_folder_made_before_resuming_is_not_taken_over(straight_learn, kuka_store):
    config_file = straight_learn / "config.json"
    config = json.loads(config_file.read_text())
    del config["settings"]
    config_file.write_text(json.dumps(config))
    with pytest.raises(InputError, match="made before runs could be continued; use another --out"):
        learn(_learn_cfg(kuka_store.path), straight_learn, progress=False)


# ---------------------------------------------------------------------------------- inspect and report say so
def _stopped_learn(store: Path, out: Path, at: int = 4) -> Path:
    with pytest.raises(Stop):
        learn(_learn_cfg(store), out, progress=False, on_checkpoint=_stop_at(at))
    return out


STOPPED_LEARN = "stopped at iteration 4 of 8; rerun the same command to continue"


def test_inspect_of_a_stopped_learn_says_how_far_it_got(kuka_store, tmp_path, capsys):
    out = _stopped_learn(kuka_store.path, tmp_path / "run")
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"status: {STOPPED_LEARN} (with --out {out})" in text
    assert "last_metrics (partial, not final):" in text and "\nlast_metrics:" not in text


def test_report_and_load_of_a_stopped_learn_refuse_with_how_to_continue(kuka_store, tmp_path, capsys):
    out = _stopped_learn(kuka_store.path, tmp_path / "run")
    assert main(["report", str(out)]) == 2
    assert STOPPED_LEARN in capsys.readouterr().err
    with pytest.raises(InputError, match=f"an unfinished learn run \\({STOPPED_LEARN}"):
        load(out)  # its checkpoint holds the learner of iteration 4


@pytest.mark.slow
def test_inspect_and_report_of_a_finished_learn(straight_learn, capsys):
    assert main(["inspect", str(straight_learn)]) == 0
    text = capsys.readouterr().out
    assert "status: finished: 8 iterations" in text and "\nlast_metrics:" in text
    assert main(["report", str(straight_learn)]) == 0
    assert "| output | nMSE |" in capsys.readouterr().out
    learner, _ = load(straight_learn)
    assert learner.t == 8


@pytest.mark.slow
def test_inspect_and_report_of_a_stopped_replay(kuka_store, tmp_path, capsys):
    cfg = _replay_cfg(kuka_store.path, learners=["svi", "svdgp", "exact"], sizes={"svi": {"m": 8}, "svdgp": {"m_alpha": 16, "m_beta": 4}})
    _stopped_replay(cfg, tmp_path / "run", at=2, learner="svdgp")
    assert main(["inspect", str(tmp_path / "run")]) == 0
    status = ("stopped: svi at iteration 4 of 4, svdgp at iteration 2 of 4, exact not started; rerun the same "
              "command to continue")
    assert status in capsys.readouterr().out
    report = write_report(tmp_path / "run").read_text()
    assert f"**Unfinished run: {status}" in report.splitlines()[2]
    assert "4 iterations planned" in report and "at the last evaluation so far (the run is unfinished" in report
    _replay(cfg, tmp_path / "run")
    report = write_report(tmp_path / "run").read_text()
    assert "Unfinished" not in report and "planned" not in report
    assert RunDir(tmp_path / "run").status().describe() == "finished: 4 iterations per learner"


def test_a_replay_made_before_the_marker_reads_as_finished_by_its_records(kuka_store, tmp_path):
    cfg = _replay_cfg(kuka_store.path)
    _replay(cfg, tmp_path / "done")
    _stopped_replay(cfg, tmp_path / "stopped")
    for name in ("done", "stopped"):  # as a version without completion markers left them
        folder = tmp_path / name
        config = json.loads((folder / "config.json").read_text())
        for key in (COMPLETION_KEY, "planned_iterations"):
            config.pop(key, None)
        (folder / "config.json").write_text(json.dumps(config))
        (folder / FINISHED_FILE).unlink(missing_ok=True)
    assert RunDir(tmp_path / "done").status().finished
    assert RunDir(tmp_path / "stopped").status().describe().startswith("stopped at iteration 2 of 4;")


def test_a_run_being_written_reads_as_running_not_stopped(kuka_store, tmp_path):
    out = _stopped_learn(kuka_store.path, tmp_path / "run")
    writer = RunDir.resume(out)  # holds the writer lock, as a live run does
    try:
        assert RunDir(out).status().describe() == "running at iteration 4 of 8 so far (another process is writing this folder)"
    finally:
        writer.close()
    assert RunDir(out).status().describe().startswith("stopped at")


def test_the_ordered_protocol_plans_its_init_and_stream_iterations(kuka_store, tmp_path):
    cfg = _replay_cfg(kuka_store.path, protocol="ordered", init_iterations=2, iterations=100, batch_size=32)
    _stopped_replay(cfg, tmp_path / "run", at=2)
    # 2 init iterations, then the 150 online rows in chunks of 32: 5 more
    assert RunDir(tmp_path / "run").status().describe().startswith("stopped at iteration 2 of 7;")


def test_warnings_do_not_hide_a_clean_resume(kuka_store, tmp_path):
    """A resume with everything matching warns about nothing."""
    cfg = _replay_cfg(kuka_store.path)
    _stopped_replay(cfg, tmp_path / "run")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, finals = _replay(cfg, tmp_path / "run")
    assert finals["svi"]["iteration"] == 4


@pytest.mark.slow
def test_the_store_a_learn_run_names_is_checked_before_it_is_reused(straight_learn, kuka_store):
    from gpdyn.experiments.control_arm import run_store

    assert run_store(straight_learn) == str(kuka_store.path)  # control --from-run reads the learner's store
    kuka_store.close()
    _replace(Path(kuka_store.path), lambda p: _kuka(p, seed=5))
    with pytest.raises(InputError, match="not the store the run in .* read .* Give the store it was trained on"):
        run_store(straight_learn)


@pytest.mark.slow
def test_a_stopped_stream_learn_says_so_in_rows_and_streams_again(tmp_path, monkeypatch, capsys):
    from gpdyn.experiments import stream
    from gpdyn.gp.prequential import StreamProtocol

    store = tmp_path / "k.zarr"
    make_kuka_store(store, offline=[], online=[150, 130]).close()
    cfg = _learn_cfg(store, protocol="stream", stream=StreamProtocol(init_rows=64, chunk=32, warm_rows=96))
    real_save = stream.save_learner

    def die(*args, **kw):
        raise Stop  # every record but the final one is logged, the pass's checkpoint never written

    monkeypatch.setattr(stream, "save_learner", die)
    with pytest.raises(Stop):
        learn(cfg, tmp_path / "run", progress=False)
    status = RunDir(tmp_path / "run").status()
    rows = RunDir(tmp_path / "run").config()["problem"]["train"]
    assert not status.finished and 0 < status.done["svi"] < rows
    assert status.describe().startswith(f"stopped at row {status.done['svi']} of {rows}; rerun the same command")
    assert status.describe().endswith("(an unfinished stream starts again from its first row)")
    monkeypatch.setattr(stream, "save_learner", real_save)
    _, final = learn(cfg, tmp_path / "run", progress=False)
    assert final["rows"] == rows and final["final"] is True
    assert RunDir(tmp_path / "run").status().describe() == f"finished: {rows} rows"
    assert main(["report", str(tmp_path / "run")]) == 0 and "Unfinished" not in capsys.readouterr().out
