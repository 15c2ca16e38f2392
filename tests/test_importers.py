"""Import round trips of the KUKA1/KUKA2 text format and SARCOS .mat files; malformed files refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.io import savemat

from gpdyn.cli import main
from gpdyn.data.importers import (
    KUKA_TAU_SCALE,
    ImportFormatError,
    import_kuka_ilgr,
    import_sarcos,
    read_kuka_ilgr,
)
from gpdyn.data.problems import load_problem
from gpdyn.data.store import EpisodeStore


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
    assert "file units" in store.fields["tau"].unit and store.fields["q"].unit == "rad"
    problem = load_problem(store, "kuka", protocol="ordered")
    assert len(problem.x_init) == 40 and problem.input_dim == 21


def test_sarcos_round_trip_train_and_test(tmp_path: Path) -> None:
    train, test = _rows(50, 2), _rows(12, 3)
    savemat(tmp_path / "sarcos_inv_test.mat", {"sarcos_inv_test": test})
    savemat(tmp_path / "sarcos_inv.mat", {"sarcos_inv": train})
    store = import_sarcos([tmp_path / "sarcos_inv_test.mat", tmp_path / "sarcos_inv.mat"], tmp_path / "s.zarr")
    assert list(store.episode_values("online")) == [0, 1]
    np.testing.assert_array_equal(store.read("tau"), np.concatenate([train, test])[:, 21:])
    np.testing.assert_array_equal(store.read("q"), np.concatenate([train, test])[:, :7])
    assert store.attrs["tau_scale"] == [1.0] * 7 and store.attrs["env_id"] == "sarcos"


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
