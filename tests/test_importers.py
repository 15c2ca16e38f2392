"""Import round trips of the KUKA1/KUKA2 text format and SARCOS .mat files; malformed files refused."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from scipy.io import savemat
from scipy.sparse import csc_matrix

from gpdyn.cli import main
from gpdyn.data.importers import (
    KUKA_TAU_SCALE,
    ImportFormatError,
    episode_splits,
    import_kuka_ilgr,
    import_sarcos,
    read_kuka_ilgr,
)
from gpdyn.data.problems import load_problem
from gpdyn.data.store import EpisodeStore
from gpdyn.errors import InputError


def _rows(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.normal(size=(n, 28))
    rows[:, 21:] /= np.asarray(KUKA_TAU_SCALE)  # file units, as in the real files
    return rows


def _write_text(path: Path, rows: np.ndarray) -> Path:
    np.savetxt(path, rows, fmt="%.17g", delimiter=" ")
    return path


def test_kuka_ilgr_round_trip_through_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    offline, online = _rows(40, 0), _rows(70, 1)
    # online file given first: the store still holds the offline part first
    on = _write_text(tmp_path / "kuka1_online.txt", online)
    off = _write_text(tmp_path / "kuka1_offline.txt", offline)
    store_path = tmp_path / "kuka1.zarr"
    assert main(["import", "kuka-ilgr", str(on), str(off), "--store", str(store_path)]) == 0
    assert "kuka1_online.txt: 70 rows -> online part" in capsys.readouterr().out
    store = EpisodeStore.open(store_path)
    assert list(store.episode_values("online")) == [0, 1]
    assert list(store.episode_lengths) == [40, 70]
    for i, name in enumerate(("q", "qd", "qdd", "tau")):
        np.testing.assert_array_equal(store.read(name), np.concatenate([offline, online])[:, 7 * i : 7 * i + 7])
    assert store.attrs["tau_scale"] == list(KUKA_TAU_SCALE)
    # the published files are normalised: no input is labelled in rad unless the user says so
    assert store.attrs["input_units"] == "normalised"
    assert {store.fields[n].unit for n in ("q", "qd", "qdd")} == {"normalised (file units)"}
    assert store.fields["tau"].unit == "N m / [40/40/20/20/4/4/2] (file units)"
    assert list(store.episode_values("file")) == [0, 1]
    assert [(e["file"], e["split"]) for e in store.attrs["imported_files"]] == [
        ("kuka1_offline.txt", "train"), ("kuka1_online.txt", "train")]
    problem = load_problem(store, "kuka", protocol="ordered")
    assert len(problem.x_init) == 40 and problem.input_dim == 21


def test_sarcos_round_trip_train_and_test(tmp_path: Path) -> None:
    train, test, more = _rows(50, 2), _rows(12, 3), _rows(7, 14)
    # a test file is recognised by its name or by its variable
    savemat(tmp_path / "sarcos_inv_test.mat", {"data": test})
    savemat(tmp_path / "held_out.mat", {"sarcos_inv_test": more})
    savemat(tmp_path / "sarcos_inv.mat", {"sarcos_inv": train})
    files = [tmp_path / "sarcos_inv_test.mat", tmp_path / "held_out.mat", tmp_path / "sarcos_inv.mat"]
    store = import_sarcos(files, tmp_path / "s.zarr")
    assert list(store.episode_values("online")) == [0, 1, 1]
    assert list(store.episode_values("file")) == [0, 1, 2]
    assert [(e["file"], e["split"]) for e in store.attrs["imported_files"]] == [
        ("sarcos_inv.mat", "train"), ("sarcos_inv_test.mat", "test"), ("held_out.mat", "test")]
    assert list(episode_splits(store)) == ["train", "test", "test"]
    np.testing.assert_array_equal(store.read("tau"), np.concatenate([train, test, more])[:, 21:])
    np.testing.assert_array_equal(store.read("q"), np.concatenate([train, test, more])[:, :7])
    assert store.attrs["tau_scale"] == [1.0] * 7 and store.attrs["env_id"] == "sarcos"
    assert store.attrs["input_units"] == "physical" and store.fields["tau"].unit == "N m"
    EpisodeStore.open(tmp_path / "s.zarr", "a").close()  # the import let go of the writer lock
    kuka = import_kuka_ilgr([_write_text(tmp_path / "k_offline.txt", train)], tmp_path / "k.zarr")
    assert list(episode_splits(kuka)) == ["train"]


def test_blank_lines_are_skipped_and_line_numbers_count_them(tmp_path: Path) -> None:
    rows = _rows(3, 4)
    lines = [" ".join(f"{v:.17g}" for v in r) for r in rows]
    path = tmp_path / "k.txt"
    path.write_text(lines[0] + "\n\n" + lines[1] + "\n" + lines[2] + " nan" + "\n")
    with pytest.raises(ImportFormatError, match=r"k.txt: line 4: expected 28 columns, found 29"):
        read_kuka_ilgr(path)
    path.write_text(lines[0] + "\n\n" + lines[1] + "\n")
    np.testing.assert_array_equal(read_kuka_ilgr(path), rows[:2])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda cells: cells[:-1], r"line 3: expected 28 columns, found 27"),
        (lambda cells: cells[:5] + ["abc"] + cells[6:], r"line 3, column 6: 'abc' is not a number"),
        # float() and numpy read these three as numbers
        (lambda cells: cells[:1] + ["1_000"] + cells[2:], r"line 3, column 2: '1_000' is not a number"),
        (lambda cells: cells[:27] + ["\u0663.5"], r"line 3, column 28: '\u0663.5' is not a number"),
        (lambda cells: cells[:3] + ["1e5_0"] + cells[4:], r"line 3, column 4: '1e5_0' is not a number"),
        (lambda cells: cells[:9] + ["NaN"] + cells[10:], r"line 3, column 10: value nan is not finite"),
        (lambda cells: cells[:27] + ["-inf"], r"line 3, column 28: value -inf is not finite"),
    ],
)
def test_malformed_kuka_files_are_refused_with_file_and_line(tmp_path: Path, edit, message: str) -> None:
    rows = _rows(4, 5)
    lines = [[f"{v:.17g}" for v in r] for r in rows]
    lines[2] = edit(lines[2])
    path = tmp_path / "kuka2_offline.txt"
    path.write_text("\n".join(" ".join(c) for c in lines) + "\n")
    good = _write_text(tmp_path / "kuka2_online.txt", rows)
    store_path = tmp_path / "bad.zarr"
    with pytest.raises(ImportFormatError, match=rf"kuka2_offline.txt: {message}"):
        import_kuka_ilgr([good, path], store_path)
    assert not store_path.exists()  # every file is checked before anything is written


def test_empty_missing_and_binary_files_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ImportFormatError, match="empty.txt: no data rows"):
        read_kuka_ilgr(tmp_path / "empty.txt")
    assert main(["import", "kuka-ilgr", str(tmp_path / "nope.txt"), "--store", str(tmp_path / "s.zarr")]) == 2
    assert "nope.txt: no such file" in capsys.readouterr().err
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00\x81" * 10)
    with pytest.raises(ImportFormatError, match="bin.txt: not a text file"):
        read_kuka_ilgr(tmp_path / "bin.txt")


def test_malformed_sarcos_files_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    savemat(tmp_path / "narrow.mat", {"sarcos_inv": np.zeros((5, 27))})
    with pytest.raises(ImportFormatError, match="narrow.mat: variable 'sarcos_inv' has 27 columns, expected 28"):
        import_sarcos([tmp_path / "narrow.mat"], tmp_path / "a.zarr")
    bad = _rows(6, 6)
    bad[4, 22] = np.nan
    savemat(tmp_path / "nan.mat", {"sarcos_inv": bad})
    with pytest.raises(ImportFormatError, match="nan.mat: row 5, column 23: value nan is not finite"):
        import_sarcos([tmp_path / "nan.mat"], tmp_path / "b.zarr")
    savemat(tmp_path / "two.mat", {"a": _rows(3, 7), "b": _rows(3, 8)})
    with pytest.raises(ImportFormatError, match=r"two.mat: expected one \[N, 28\] matrix"):
        import_sarcos([tmp_path / "two.mat"], tmp_path / "c.zarr")
    (tmp_path / "text.mat").write_text("not a mat file\n")
    assert main(["import", "sarcos", str(tmp_path / "text.mat"), "--store", str(tmp_path / "d.zarr")]) == 2
    assert "text.mat: not a MATLAB .mat file" in capsys.readouterr().err
    (tmp_path / "v73.mat").write_bytes(b"MATLAB 7.3 MAT-file, Platform: GLNXA64".ljust(128) + b"\x00" * 64)
    with pytest.raises(ImportFormatError, match="v73.mat: MATLAB v7.3 files are not supported"):
        import_sarcos([tmp_path / "v73.mat"], tmp_path / "e.zarr")
    for name in "abcde":
        assert not (tmp_path / f"{name}.zarr").exists()


def test_import_refuses_an_existing_store(tmp_path: Path) -> None:
    path = _write_text(tmp_path / "kuka1_offline.txt", _rows(5, 9))
    import_kuka_ilgr([path], tmp_path / "s.zarr")
    with pytest.raises(ImportFormatError, match="already exists"):
        import_kuka_ilgr([path], tmp_path / "s.zarr")


def test_kuka_scale_and_units_options_are_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _rows(8, 10)
    path = _write_text(tmp_path / "kuka_sim_offline.txt", rows)
    store_path = tmp_path / "sim.zarr"
    assert main(["import", "kuka-ilgr", str(path), "--store", str(store_path), "--torque-scale", "50,70,20,20,4,4,2",
                 "--units", "physical"]) == 0
    assert "inputs physical, torque N m / [50/70/20/20/4/4/2] (file units)" in capsys.readouterr().out
    store = EpisodeStore.open(store_path)
    assert store.attrs["tau_scale"] == [50.0, 70.0, 20.0, 20.0, 4.0, 4.0, 2.0]
    assert [store.fields[n].unit for n in ("q", "qd", "qdd")] == ["rad", "rad/s", "rad/s^2"]
    np.testing.assert_array_equal(store.read("tau"), rows[:, 21:])  # stored as in the file, the scale beside it
    # one factor stands for every joint; 1 means the file holds N m
    store = import_kuka_ilgr([path], tmp_path / "one.zarr", torque_scale=[1.0])
    assert store.attrs["tau_scale"] == [1.0] * 7 and store.fields["tau"].unit == "N m"


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--torque-scale", "40,40,20", "torque scale [40.0, 40.0, 20.0]: expected 1 or 7 positive finite factors"),
    ("--torque-scale", "40,40,20,20,4,4,-2", "argument --torque-scale: -2 is out of range"),
    ("--torque-scale", "40,x", "argument --torque-scale: 'x' is not a finite number"),
    ("--units", "rad", "invalid choice: 'rad'"),
])
def test_bad_import_options_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str,
                                   message: str) -> None:
    path = _write_text(tmp_path / "kuka1_offline.txt", _rows(3, 11))
    assert main(["import", "kuka-ilgr", str(path), "--store", str(tmp_path / "s.zarr"), option, value]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("scale", [[40.0, 40.0, 20.0, 20.0, 4.0, 4.0, -2.0], [float("nan")], [0.0], []])
def test_the_python_api_checks_the_torque_scale_too(tmp_path: Path, scale: list[float]) -> None:
    path = _write_text(tmp_path / "kuka1_offline.txt", _rows(3, 17))
    with pytest.raises(ImportFormatError, match="expected 1 or 7 positive finite factors"):
        import_kuka_ilgr([path], tmp_path / "s.zarr", torque_scale=scale)
    with pytest.raises(ImportFormatError, match="unknown units 'rad'; choose one of physical, normalised"):
        import_kuka_ilgr([path], tmp_path / "s.zarr", units="rad")
    assert not (tmp_path / "s.zarr").exists()


def test_gzip_text_files_are_read_and_broken_ones_refused(tmp_path: Path) -> None:
    rows = _rows(5, 12)
    text = _write_text(tmp_path / "kuka2_online.txt", rows).read_bytes()
    packed = gzip.compress(text)
    (tmp_path / "kuka2_online.txt.gz").write_bytes(packed)
    store = import_kuka_ilgr([tmp_path / "kuka2_online.txt.gz"], tmp_path / "gz.zarr")
    np.testing.assert_array_equal(store.read("qd"), rows[:, 7:14])
    assert store.attrs["imported_files"][0]["file"] == "kuka2_online.txt.gz"
    assert list(store.episode_values("online")) == [1]
    (tmp_path / "cut.txt.gz").write_bytes(packed[: len(packed) // 2])
    with pytest.raises(ImportFormatError, match="cut.txt.gz: not a readable gzip file"):
        read_kuka_ilgr(tmp_path / "cut.txt.gz")
    bad = bytearray(packed)
    bad[len(bad) // 2] ^= 0xFF  # a flipped byte in the compressed stream
    (tmp_path / "flip.txt.gz").write_bytes(bytes(bad))
    with pytest.raises(ImportFormatError, match="flip.txt.gz: not a readable gzip file"):
        read_kuka_ilgr(tmp_path / "flip.txt.gz")


def test_episode_splits_of_a_store_without_the_file_key(tmp_path: Path) -> None:
    """Stores imported before the per-episode file key: one episode per file, SARCOS's online file is its test."""
    from gpdyn.data.arm_schema import arm_episode_keys, arm_fields

    entries = [{"file": "sarcos_inv.mat", "rows": 4, "online": 0}, {"file": "b.mat", "rows": 3, "online": 1}]
    store = EpisodeStore.create(tmp_path / "old.zarr", arm_fields(7), source="import sarcos", env_id="sarcos", dt=0.0,
                                seed=None, episode_keys=arm_episode_keys(), extra_attrs={"imported_files": entries})
    rows = _rows(7, 15)
    store.append_episodes([{n: rows[a:b, 7 * i: 7 * i + 7] for i, n in enumerate(("q", "qd", "qdd", "tau"))}
                           for a, b in ((0, 4), (4, 7))], [{"online": 0}, {"online": 1}])
    assert list(episode_splits(store)) == ["train", "test"]
    plain = EpisodeStore.create(tmp_path / "sim.zarr", arm_fields(7), source="collect", env_id="kuka", dt=0.01,
                                seed=0, episode_keys=arm_episode_keys())
    with pytest.raises(InputError, match="sim.zarr: not an imported dataset"):
        episode_splits(plain)


def test_non_float_mat_matrices_are_refused(tmp_path: Path) -> None:
    savemat(tmp_path / "int.mat", {"sarcos_inv": np.arange(5 * 28, dtype=np.int32).reshape(5, 28)})
    with pytest.raises(ImportFormatError, match="int.mat: variable 'sarcos_inv' holds int32 values, expected floating"):
        import_sarcos([tmp_path / "int.mat"], tmp_path / "a.zarr")
    savemat(tmp_path / "bool.mat", {"sarcos_inv": np.ones((3, 28), dtype=bool)})
    with pytest.raises(ImportFormatError, match="bool.mat: variable 'sarcos_inv' holds uint8 values"):
        import_sarcos([tmp_path / "bool.mat"], tmp_path / "b.zarr")
    cells = np.empty((3, 28), dtype=object)
    cells[:] = 1.5
    cells[1, 4] = "abc"
    savemat(tmp_path / "cells.mat", {"sarcos_inv": cells})
    with pytest.raises(ImportFormatError, match="cells.mat: variable 'sarcos_inv' row 2, column 5: a <U3 array"):
        import_sarcos([tmp_path / "cells.mat"], tmp_path / "c.zarr")
    savemat(tmp_path / "sparse.mat", {"sarcos_inv": csc_matrix(np.eye(28))})
    with pytest.raises(ImportFormatError, match="sparse.mat: variable 'sarcos_inv' is a csc_matrix, expected a dense"):
        import_sarcos([tmp_path / "sparse.mat"], tmp_path / "d.zarr")
    single = _rows(4, 16).astype(np.float32)  # MATLAB single is floating point: accepted
    savemat(tmp_path / "single.mat", {"sarcos_inv": single})
    np.testing.assert_array_equal(import_sarcos([tmp_path / "single.mat"], tmp_path / "e.zarr").read("q"),
                                  single[:, :7].astype(np.float64))
    for name in "abcd":
        assert not (tmp_path / f"{name}.zarr").exists()
