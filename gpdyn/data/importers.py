"""Importers of the real inverse-dynamics datasets into the arm store format (:mod:`gpdyn.data.arm_schema`).

- KUKA1/KUKA2 (Meier et al. 2014, the ILGR data used by SVDGP Section 5): text
  files, plain or gzip-compressed (``.txt.gz``), one sample per line, 28
  whitespace-separated numbers: 7 joint positions, 7 velocities, 7 accelerations,
  7 torques. The published files are normalised: the inputs are not in rad, and the
  torques are divided by a per-joint scale (``KUKA_TAU_SCALE`` = [40, 40, 20, 20, 4,
  4, 2] for the real KUKA1/KUKA2 files; the simulated files use [50, 70, 20, 20, 4,
  4, 2]). Values are stored as they are in the file; the scale (``torque_scale``)
  and the input units (``units``) are options, written to the store attributes
  ``tau_scale`` and ``input_units`` and to the field units. A file whose name
  contains "online" (e.g. ``kuka1_online.txt``) becomes the online part
  (``online = 1``), any other file the offline part.
- SARCOS (``sarcos_inv.mat``, ``sarcos_inv_test.mat``): MATLAB v4-v7.2 files
  holding one floating-point [N, 28] matrix with the same column order, in physical
  units, torques unscaled. The training file becomes ``online = 0``; the test file
  ``online = 1`` (so that the ``kuka`` problem's ordered protocol streams the test
  set after the training set).

Each file is one episode; offline files are stored first, then online files, in
command-line order. The per-episode key ``file`` indexes the root attribute
``imported_files`` (one entry per file in stored order: name, rows, ``online`` and
``split``). ``split`` is ``"test"`` for a file whose name or .mat variable contains
"test" (``sarcos_inv_test.mat``), ``"train"`` otherwise; :func:`episode_splits`
reads it back for the protocols that train on one file and score on another.

The same samples twice (a file named twice, a renamed or gzip copy of another) are
refused, naming both files: each file's rows would otherwise be stored twice. Every
entry of ``imported_files`` records the SHA-256 of the file's content (``sha256``, of
the text after gunzip or of the .mat bytes) and of its rows (``data_sha256``).

Text files are read a line at a time, each line at most ``MAX_LINE_BYTES``: a longer
line (a gzip file can expand to one line of any size) is refused naming the file and
line, so memory stays bounded.

Malformed input (wrong column count, a cell that is not a plain decimal number such
as ``1_000`` or ``0x1p3``, NaN or infinity, no rows, a .mat matrix that is not
floating point) is refused with the file and line and column (text) or row and
column (.mat, 1-based) named; nothing is written before every file has been read
and checked.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from gpdyn.data.arm_schema import ARM_FIELD_NAMES, OFFLINE, ONLINE, arm_episode_keys, arm_fields
from gpdyn.data.store import EpisodeStore, FieldSpec
from gpdyn.errors import InputError

N_JOINTS = 7  # both datasets record 7-DOF arms (KUKA LBR, SARCOS master arm)
N_COLUMNS = 4 * N_JOINTS
KUKA_TAU_SCALE = (40.0, 40.0, 20.0, 20.0, 4.0, 4.0, 2.0)  # the real KUKA1/KUKA2 files
# Longest text line read, in bytes: a sample line of 28 numbers is well under 1 KB, so a
# longer line is not a sample, and reading it whole would let one line (a gzip file can
# expand a few KB into GBs) take any amount of memory.
MAX_LINE_BYTES = 1 << 20
TRAIN, TEST = "train", "test"  # the values of ``imported_files[i]["split"]``
# What the input columns (q, qd, qdd) hold: the unit each field is labelled with.
UNITS: dict[str, tuple[str, str, str]] = {
    "physical": ("rad", "rad/s", "rad/s^2"),
    "normalised": ("normalised (file units)",) * 3,
}

# A plain decimal number, or a NaN/infinity spelling (refused later as "not finite",
# which names the problem better than "not a number"). Python's float() and numpy
# also accept "1_000" and non-ASCII digits ("\u0663"): neither is in the published
# files, and each is more likely a corrupted cell than data.
_NUMBER = r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|(?i:nan|inf|infinity))"
NUMBER = re.compile(_NUMBER)
# A whole line of N_COLUMNS numbers: the fast path; lines it rejects are looked at cell by cell.
_LINE = re.compile(rf"\s*{_NUMBER}(?:\s+{_NUMBER}){{{N_COLUMNS - 1}}}\s*")


class ImportFormatError(InputError):
    """A dataset file that cannot be imported; the message names file and line."""


@dataclass(frozen=True)
class ImportedFile:
    """One file's rows [N, 28], the part it belongs to, its split and the SHA-256 of its content
    (of the text after gunzip for a text file, of the bytes for a .mat file)."""

    path: Path
    rows: np.ndarray
    online: int
    split: str = TRAIN
    sha256: str = ""

    @property
    def data_sha256(self) -> str:
        """SHA-256 of the rows as float64: equal for two files that hold the same samples."""
        return hashlib.sha256(np.ascontiguousarray(self.rows, dtype=np.float64).tobytes()).hexdigest()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _refuse_repeats(files: Sequence[ImportedFile]) -> None:
    """Refuse a file whose samples another file of the import already holds (the same file
    named twice, a renamed copy, a gzip copy of a plain file): its rows would be stored twice."""
    first: dict[str, Path] = {}
    for f in files:
        key = f.data_sha256
        if key in first:
            raise ImportFormatError(
                f"{f.path}: holds the same {f.rows.shape[0]} samples as {first[key]} (sha256 of the rows "
                f"{key[:16]}...); each dataset file is imported once: leave out the repeat"
            )
        first[key] = f.path


def _check_rows(path: Path, rows: np.ndarray, where: str, line_numbers: np.ndarray | None = None) -> np.ndarray:
    """Refuse a non-finite cell, naming the line (text) or row (.mat)."""
    bad = np.argwhere(~np.isfinite(rows))
    if bad.size:
        row, col = bad[0]
        number = int(line_numbers[row]) if line_numbers is not None else int(row) + 1
        raise ImportFormatError(f"{path}: {where} {number}, column {col + 1}: value {rows[row, col]} is not finite")
    if rows.shape[0] == 0:
        raise ImportFormatError(f"{path}: no data rows")
    return rows


def _open_text(path: Path) -> BinaryIO:
    """The file opened for reading bytes, gunzipped on the fly when it starts with the gzip
    magic bytes (whatever its name)."""
    if not path.is_file():
        raise ImportFormatError(f"{path}: no such file")
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")  # type: ignore[return-value]


def _gzip_error(path: Path, err: BaseException) -> ImportFormatError:
    return ImportFormatError(f"{path}: not a readable gzip file ({err or type(err).__name__})")


def _line_error(path: Path, message: str) -> ImportFormatError:
    """The error for a bad line; in a gzip file whose stream is damaged, the damage instead
    (the rest is read a block at a time: the garbage a damaged stream decodes to is not the
    problem to report)."""
    with _open_text(path) as f:
        if isinstance(f, gzip.GzipFile):
            try:
                while f.read(1 << 20):
                    pass
            except (OSError, EOFError, zlib.error) as err:
                return _gzip_error(path, err)
    return ImportFormatError(f"{path}: {message}")


def _lines(path: Path, digest: Any) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of every line of the file (numbered as ``str.splitlines`` splits
    them), read a block at a time with no line longer than :data:`MAX_LINE_BYTES`, so that
    memory stays bounded whatever the file holds (a gzip file that expands to one huge line
    included); ``digest`` is fed every byte.

    A line longer than that, or text that is not UTF-8, is refused naming the line.
    """
    limit = MAX_LINE_BYTES
    block_size = max(limit, 1 << 20)
    number = 1  # of the first line not yet yielded
    tail = b""  # the start of a line whose end is not read yet
    with _open_text(path) as f:
        while True:
            try:
                block = f.read(block_size)
            except (OSError, EOFError, zlib.error) as err:  # BadGzipFile is an OSError; a cut file an EOFError
                raise _gzip_error(path, err) from err
            digest.update(block)
            data = tail + block
            cut = data.rfind(b"\n") + 1 if block else len(data)  # whole lines only, until the end
            head, tail = data[:cut], data[cut:]
            try:
                lines = head.decode("utf-8").splitlines()
            except UnicodeDecodeError as err:
                line = number + len(head[: err.start].decode("utf-8").splitlines())
                raise _line_error(path, f"not a text file (line {line}: {err})") from err
            too_long = [i for i, text in enumerate(lines) if len(text) > limit]
            if too_long or len(tail) > limit:
                line = number + (too_long[0] if too_long else len(lines))
                raise _line_error(path, f"line {line} is longer than {limit} bytes (a sample line holds "
                                        f"{N_COLUMNS} numbers); not a KUKA1/KUKA2 text file")
            yield from enumerate(lines, start=number)
            number += len(lines)
            if not block:
                return


def read_kuka_ilgr(path: str | Path) -> np.ndarray:
    """The [N, 28] rows of one KUKA1/KUKA2 text file (plain or gzip), checked line by line.

    Blank lines are skipped (they hold no sample); every other line must hold
    exactly 28 finite plain decimal numbers.
    """
    return _read_kuka_ilgr(Path(path))[0]


def _read_kuka_ilgr(path: Path) -> tuple[np.ndarray, str]:
    """The rows of :func:`read_kuka_ilgr` and the SHA-256 of the file's text (after gunzip)."""
    digest = hashlib.sha256()
    kept: list[str] = []
    numbers: list[int] = []
    for number, line in _lines(path, digest):
        if not _LINE.fullmatch(line):
            cells = line.split()
            if not cells:
                continue
            if len(cells) != N_COLUMNS:
                raise _line_error(path, f"line {number}: expected {N_COLUMNS} columns, found {len(cells)}")
            for col, cell in enumerate(cells):
                if not NUMBER.fullmatch(cell):
                    raise _line_error(path, f"line {number}, column {col + 1}: {cell!r} is not a number")
        kept.append(line)
        numbers.append(number)
    # every cell matched NUMBER, which float() parses the same way
    rows = np.array(" ".join(kept).split(), dtype=np.float64).reshape(-1, N_COLUMNS)
    return _check_rows(path, rows, "line", np.asarray(numbers)), digest.hexdigest()


def _first_bad_cell(matrix: np.ndarray) -> tuple[int, int, str] | None:
    """Row, column (0-based) and description of the first cell of an object array that is not one real float."""
    for (row, col), cell in np.ndenumerate(matrix):
        value = np.asarray(cell)
        if value.size != 1 or value.dtype.kind != "f":
            return row, col, f"{value.dtype} array of shape {value.shape}"
    return None


def read_sarcos(path: str | Path) -> tuple[np.ndarray, str]:
    """The [N, 28] floating-point matrix of one SARCOS .mat file and its variable name."""
    try:
        from scipy.io import loadmat
    except ImportError as err:  # scipy is the optional extra 'sarcos'
        raise InputError(f"{path}: reading MATLAB .mat files needs scipy: pip install 'gpdyn[sarcos]'") from err

    path = Path(path)
    if not path.is_file():
        raise ImportFormatError(f"{path}: no such file")
    with open(path, "rb") as f:
        header = f.read(128)
    if header.startswith(b"MATLAB 7.3"):  # HDF5-based, which scipy does not read
        raise ImportFormatError(f"{path}: MATLAB v7.3 files are not supported; save the matrix with -v7")
    try:
        content = loadmat(str(path))
    except Exception as err:  # scipy raises several types for a non-.mat file
        raise ImportFormatError(f"{path}: not a MATLAB .mat file ({type(err).__name__}: {err})") from err
    variables = {k: v for k, v in content.items() if not k.startswith("__")}
    preferred = [k for k in variables if k.startswith("sarcos_inv")]
    matrices = [k for k, v in variables.items() if isinstance(v, np.ndarray) and v.ndim == 2 and v.shape[1] > 1]
    names = preferred or matrices
    if len(names) != 1:
        raise ImportFormatError(
            f"{path}: expected one [N, {N_COLUMNS}] matrix (e.g. 'sarcos_inv'), found {sorted(variables) or 'none'}"
        )
    name = names[0]
    matrix = variables[name]
    if not isinstance(matrix, np.ndarray):  # a sparse matrix
        raise ImportFormatError(f"{path}: variable '{name}' is a {type(matrix).__name__}, expected a dense matrix")
    if matrix.ndim != 2:
        raise ImportFormatError(f"{path}: variable '{name}' has shape {matrix.shape}, expected [N, {N_COLUMNS}]")
    if matrix.shape[1] != N_COLUMNS:
        raise ImportFormatError(f"{path}: variable '{name}' has {matrix.shape[1]} columns, expected {N_COLUMNS}")
    if matrix.dtype.kind == "O":  # a MATLAB cell array: name the first cell that is not a number
        bad = _first_bad_cell(matrix)
        if bad is not None:
            row, col, what = bad
            raise ImportFormatError(f"{path}: variable '{name}' row {row + 1}, column {col + 1}: a {what}, "
                                    "expected a floating-point number")
    elif matrix.dtype.kind != "f":
        # integer, logical or character data: a quantised or mislabelled file, not the recorded torques
        raise ImportFormatError(f"{path}: variable '{name}' holds {matrix.dtype} values, expected floating-point "
                                "numbers (MATLAB double or single)")
    return _check_rows(path, matrix.astype(np.float64), "row"), name


def _episode(rows: np.ndarray) -> dict[str, np.ndarray]:
    """Split the 28 columns into q, qd, qdd, tau (the column order of both datasets)."""
    return {name: rows[:, i * N_JOINTS : (i + 1) * N_JOINTS] for i, name in enumerate(ARM_FIELD_NAMES)}


def _is_test(*names: str) -> bool:
    return any("test" in n.lower() for n in names)


def check_torque_scale(scale: Sequence[float]) -> tuple[float, ...]:
    """One positive finite factor for every joint (a single value stands for all of them)."""
    values = tuple(float(s) for s in scale)
    if len(values) == 1:
        values *= N_JOINTS
    if len(values) != N_JOINTS or not all(np.isfinite(v) and v > 0 for v in values):
        raise ImportFormatError(
            f"torque scale {list(scale)}: expected 1 or {N_JOINTS} positive finite factors (torque in N m = "
            "file value x factor)"
        )
    return values


def _fields(units: str, tau_scale: tuple[float, ...]) -> dict[str, FieldSpec]:
    """The arm fields labelled with the input ``units`` and the torque unit the scale implies."""
    if units not in UNITS:
        raise ImportFormatError(f"unknown units '{units}'; choose one of {', '.join(UNITS)}")
    if all(s == 1.0 for s in tau_scale):
        tau_unit = "N m"
    else:
        tau_unit = "N m / [" + "/".join(f"{s:g}" for s in tau_scale) + "] (file units)"
    fields = arm_fields(N_JOINTS, tau_unit)
    for name, unit in zip(ARM_FIELD_NAMES, UNITS[units]):
        fields[name] = replace(fields[name], unit=unit)
    return fields


def _write(
    store_path: Path, files: list[ImportedFile], *, source: str, env_id: str, units: str, scale: tuple[float, ...]
) -> EpisodeStore:
    if store_path.exists():
        raise ImportFormatError(f"{store_path}: already exists; an import writes a new store")
    _refuse_repeats(files)
    fields = _fields(units, scale)
    ordered = sorted(files, key=lambda f: f.online)  # stable: offline first, then online, command-line order
    store = EpisodeStore.create(
        store_path,
        fields,
        source=source,
        env_id=env_id,
        dt=0.0,
        seed=None,
        episode_keys=arm_episode_keys(file="int32"),
        extra_attrs={
            "dt_note": "unknown: the source files carry no time stamps (dt = 0)",
            "tau_scale": list(scale),
            "tau_scale_note": "torque in N m = tau * tau_scale (per joint)",
            "input_units": units,
            "imported_files": [
                {"file": f.path.name, "rows": int(f.rows.shape[0]), "online": f.online, "split": f.split,
                 "sha256": f.sha256, "data_sha256": f.data_sha256}
                for f in ordered
            ],
            "imported_files_note": "per-episode key 'file' = index into imported_files; split 'test' marks a "
                                   "dataset's test file; sha256: of the file's content (text after gunzip, "
                                   ".mat bytes); data_sha256: of its rows as float64 (no two files share one)",
        },
    )
    store.append_episodes([_episode(f.rows) for f in ordered],
                          [{"online": f.online, "file": i} for i, f in enumerate(ordered)])
    store.close()  # an import is written once: the store is returned readable, its writer lock released
    return store


def import_kuka_ilgr(
    files: Sequence[str | Path],
    store_path: str | Path,
    *,
    torque_scale: Sequence[float] = KUKA_TAU_SCALE,
    units: str = "normalised",
) -> EpisodeStore:
    """KUKA1/KUKA2 text files (plain or gzip) into a new store; "online" in a file name marks the online part.

    ``torque_scale``: the factors the file's torques were divided by (N m = value x factor);
    ``units``: what the input columns hold, ``"normalised"`` (the published files) or ``"physical"``.
    """
    scale = check_torque_scale(torque_scale)
    _fields(units, scale)  # options are checked before any file is read
    imported = []
    for f in files:
        path = Path(f)
        online = ONLINE if "online" in path.name.lower() and "offline" not in path.name.lower() else OFFLINE
        rows, sha256 = _read_kuka_ilgr(path)
        imported.append(ImportedFile(path, rows, online, TEST if _is_test(path.name) else TRAIN, sha256))
    return _write(Path(store_path), imported, source="import kuka-ilgr (Meier et al. 2014)", env_id="kuka-ilgr",
                  units=units, scale=scale)


def import_sarcos(
    files: Sequence[str | Path],
    store_path: str | Path,
    *,
    torque_scale: Sequence[float] = (1.0,),
    units: str = "physical",
) -> EpisodeStore:
    """SARCOS .mat files into a new store; a test file (name or variable) is the online part and split "test"."""
    scale = check_torque_scale(torque_scale)
    _fields(units, scale)  # options are checked before any file is read
    imported = []
    for f in files:
        path = Path(f)
        rows, name = read_sarcos(path)
        test = _is_test(name, path.name)
        imported.append(ImportedFile(path, rows, ONLINE if test else OFFLINE, TEST if test else TRAIN, _file_sha256(path)))
    return _write(Path(store_path), imported, source="import sarcos", env_id="sarcos", units=units, scale=scale)


def episode_splits(store: EpisodeStore) -> np.ndarray:
    """Per episode of an imported store, the split (``"train"`` or ``"test"``) of the file it came from.

    Stores imported before the ``file`` key and ``split`` existed hold one episode per
    file in ``imported_files`` order, and only SARCOS test files were online there.
    """
    entries = store.attrs.get("imported_files")
    if not entries:
        raise InputError(f"{store.path}: not an imported dataset (no 'imported_files' attribute)")
    if "file" in store.episode_keys:
        index = store.episode_values("file").astype(np.int64)
    elif len(entries) == store.n_episodes:
        index = np.arange(store.n_episodes)
    else:
        raise InputError(f"{store.path}: {store.n_episodes} episodes but {len(entries)} imported files and no "
                         "per-episode 'file' key")
    legacy_test = store.attrs.get("env_id") == "sarcos"
    splits = np.array([e.get("split", TEST if legacy_test and e["online"] == ONLINE else TRAIN) for e in entries])
    return splits[index]


__all__ = [
    "ImportFormatError",
    "KUKA_TAU_SCALE",
    "MAX_LINE_BYTES",
    "TEST",
    "TRAIN",
    "UNITS",
    "check_torque_scale",
    "episode_splits",
    "import_kuka_ilgr",
    "import_sarcos",
    "read_kuka_ilgr",
    "read_sarcos",
]
