"""Importers of the real inverse-dynamics datasets into the arm store format (:mod:`gpdyn.data.arm_schema`).

- KUKA1/KUKA2 (Meier et al. 2014, the ILGR data used by SVDGP Section 5): text
  files, one sample per line, 28 whitespace-separated numbers: 7 joint positions,
  7 velocities, 7 accelerations, 7 torques. The torques in the files are divided
  by ``KUKA_TAU_SCALE`` = [40, 40, 20, 20, 4, 4, 2]; they are stored as they are in
  the file and the scale goes to the store attributes (torque in N m = tau x scale).
  A file whose name contains "online" (e.g. ``kuka1_online.txt``) becomes the
  online part (``online = 1``), any other file the offline part; offline files are
  stored first, then online files, each file one episode, in command-line order.
- SARCOS (``sarcos_inv.mat``, ``sarcos_inv_test.mat``): MATLAB v4-v7.2 files
  holding one [N, 28] matrix with the same column order; torques unscaled. The
  training file becomes ``online = 0``; a file whose name or variable contains
  "test" becomes ``online = 1`` (so that the ``kuka`` problem's ordered protocol
  streams the test set after the training set), stored after the training files.

Malformed input (wrong column count, non-numeric cell, NaN or infinity, no rows)
is refused with the file and line (text) or row (.mat, 1-based) named; nothing is
written before every file has been read and checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpdyn.data.arm_schema import ARM_FIELD_NAMES, OFFLINE, ONLINE, arm_episode_keys, arm_fields
from gpdyn.data.store import EpisodeStore
from gpdyn.errors import InputError

N_JOINTS = 7  # both datasets record 7-DOF arms (KUKA LBR, SARCOS master arm)
N_COLUMNS = 4 * N_JOINTS
KUKA_TAU_SCALE = (40.0, 40.0, 20.0, 20.0, 4.0, 4.0, 2.0)


class ImportFormatError(InputError):
    """A dataset file that cannot be imported; the message names file and line."""


@dataclass(frozen=True)
class ImportedFile:
    """One file's rows [N, 28] and the part it belongs to."""

    path: Path
    rows: np.ndarray
    online: int


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


def read_kuka_ilgr(path: str | Path) -> np.ndarray:
    """The [N, 28] rows of one KUKA1/KUKA2 text file, checked line by line.

    Blank lines are skipped (they hold no sample); every other line must hold
    exactly 28 finite numbers.
    """
    path = Path(path)
    if not path.is_file():
        raise ImportFormatError(f"{path}: no such file")
    try:
        text = path.read_text()
    except UnicodeDecodeError as err:
        raise ImportFormatError(f"{path}: not a text file ({err})") from err
    tokens: list[list[str]] = []
    numbers: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        cells = line.split()
        if not cells:
            continue
        if len(cells) != N_COLUMNS:
            raise ImportFormatError(f"{path}: line {number}: expected {N_COLUMNS} columns, found {len(cells)}")
        tokens.append(cells)
        numbers.append(number)
    try:
        rows = np.array(tokens, dtype=np.float64).reshape(-1, N_COLUMNS)
    except ValueError:
        # only on failure: find the first bad cell to name it
        for cells, number in zip(tokens, numbers):
            for col, cell in enumerate(cells):
                try:
                    float(cell)
                except ValueError:
                    raise ImportFormatError(
                        f"{path}: line {number}, column {col + 1}: {cell!r} is not a number"
                    ) from None
        raise
    return _check_rows(path, rows, "line", np.asarray(numbers))


def read_sarcos(path: str | Path) -> tuple[np.ndarray, str]:
    """The [N, 28] matrix of one SARCOS .mat file and its variable name."""
    from scipy.io import loadmat

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
    matrices = {k: v for k, v in content.items() if not k.startswith("__") and isinstance(v, np.ndarray) and v.ndim == 2}
    preferred = [k for k in matrices if k.startswith("sarcos_inv")]
    names = preferred or sorted(matrices)
    if len(names) != 1:
        raise ImportFormatError(
            f"{path}: expected one [N, {N_COLUMNS}] matrix (e.g. 'sarcos_inv'), found {sorted(matrices) or 'none'}"
        )
    name = names[0]
    matrix = matrices[name]
    if matrix.shape[1] != N_COLUMNS:
        raise ImportFormatError(f"{path}: variable '{name}' has {matrix.shape[1]} columns, expected {N_COLUMNS}")
    if not np.issubdtype(matrix.dtype, np.number) or np.iscomplexobj(matrix):
        raise ImportFormatError(f"{path}: variable '{name}' has dtype {matrix.dtype}, expected real numbers")
    return _check_rows(path, matrix.astype(np.float64), "row"), name


def _episode(rows: np.ndarray) -> dict[str, np.ndarray]:
    """Split the 28 columns into q, qd, qdd, tau (the column order of both datasets)."""
    return {name: rows[:, i * N_JOINTS : (i + 1) * N_JOINTS] for i, name in enumerate(ARM_FIELD_NAMES)}


def _write(
    store_path: Path, files: list[ImportedFile], *, source: str, env_id: str, tau_unit: str, tau_scale: Sequence[float]
) -> EpisodeStore:
    if store_path.exists():
        raise ImportFormatError(f"{store_path}: already exists; an import writes a new store")
    ordered = sorted(files, key=lambda f: f.online)  # stable: offline first, then online, command-line order
    store = EpisodeStore.create(
        store_path,
        arm_fields(N_JOINTS, tau_unit),
        source=source,
        env_id=env_id,
        dt=0.0,
        seed=None,
        episode_keys=arm_episode_keys(),
        extra_attrs={
            "dt_note": "unknown: the source files carry no time stamps (dt = 0)",
            "tau_scale": [float(s) for s in tau_scale],
            "tau_scale_note": "torque in N m = tau * tau_scale (per joint)",
            "imported_files": [{"file": f.path.name, "rows": int(f.rows.shape[0]), "online": f.online} for f in ordered],
        },
    )
    store.append_episodes([_episode(f.rows) for f in ordered], [{"online": f.online} for f in ordered])
    return store


def import_kuka_ilgr(files: Sequence[str | Path], store_path: str | Path) -> EpisodeStore:
    """KUKA1/KUKA2 text files into a new store; "online" in a file name marks the online part."""
    imported = []
    for f in files:
        path = Path(f)
        online = ONLINE if "online" in path.name.lower() and "offline" not in path.name.lower() else OFFLINE
        imported.append(ImportedFile(path, read_kuka_ilgr(path), online))
    scale = "/".join(f"{s:g}" for s in KUKA_TAU_SCALE)
    return _write(
        Path(store_path),
        imported,
        source="import kuka-ilgr (Meier et al. 2014)",
        env_id="kuka-ilgr",
        tau_unit=f"N m / [{scale}] (file units)",
        tau_scale=KUKA_TAU_SCALE,
    )


def import_sarcos(files: Sequence[str | Path], store_path: str | Path) -> EpisodeStore:
    """SARCOS .mat files into a new store; a test file (name or variable) is the online part."""
    imported = []
    for f in files:
        path = Path(f)
        rows, name = read_sarcos(path)
        online = ONLINE if "test" in name.lower() or "test" in path.name.lower() else OFFLINE
        imported.append(ImportedFile(path, rows, online))
    return _write(
        Path(store_path),
        imported,
        source="import sarcos",
        env_id="sarcos",
        tau_unit="as in file",
        tau_scale=[1.0] * N_JOINTS,
    )


__all__ = [
    "ImportFormatError",
    "KUKA_TAU_SCALE",
    "import_kuka_ilgr",
    "import_sarcos",
    "read_kuka_ilgr",
    "read_sarcos",
]
