"""Episode store: time-major zarr v3 arrays concatenated across episodes.

Layout (the robotics zarr convention, see docs/architecture.md "Episode store"):

    <root>/data/<field>          [rows, columns]   one array per field, time-major
    <root>/meta/episode_ends     [episodes] int64  cumulative row counts
    <root>/meta/<episode key>    [episodes]        optional per-episode scalars (seed, phase, ...)

Root attributes hold the format name and version, source, environment id, ``dt``,
the schema (column names, units and dtype of every field and episode key), the seed,
package versions, a random ``store_id`` drawn at creation and the commit record
``commit = {"episodes": n, "rows": r}``. The id and the commit record together are the
store's identity (:meth:`EpisodeStore.identity`): a run records it, and a resumed run
refuses a store at the same path with another identity.

Crash safety (docs/reliability.md "Episode store"): an append writes the rows, the
per-episode scalars and ``episode_ends`` first and the commit record last, in one atomic
replace of the root ``zarr.json``: the commit point. Anything past the commit record is
ignored on read and trimmed when the store is next opened for appending. One process
writes at a time (:class:`gpdyn.lock.WriterLock` on ``<store>.lock`` beside the store).

Damage is never read as data: every chunk of a committed row must exist (zarr would read
a missing chunk as zeros), chunks carry a zstd checksum, a chunk that does not decode is
an error naming the field and rows, and non-finite or absurd values (``|x| > MAX_ABS``)
are refused on write and on read, naming the row and column.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from gpdyn.errors import InputError
from gpdyn.lock import WriterLock

FORMAT_NAME = "gpdyn.episodes"
FORMAT_VERSION = 1
DEFAULT_CHUNK_ROWS = 16384
EPISODE_CHUNK = 4096  # entries per chunk of the per-episode arrays
# Largest magnitude a stored float may have. Physical quantities of the robots here stay
# below 1e6; 1e100 leaves room for any unit while its square (a variance, a kernel
# distance) stays finite in float64, so a learner never overflows on stored data.
MAX_ABS = 1e100
# Stores created by this version write every chunk, all-fill ones included (zarr skips
# those by default), so that a missing chunk file is always damage.
ALL_CHUNKS = "all_chunks_written"
# A random id drawn when a store is created: two stores made apart never share it, so a
# store replaced at the same path is told apart from the one a run read.
STORE_ID = "store_id"
_NUMERIC_KINDS = "biuf"  # bool, signed and unsigned int, float


class StoreError(InputError):
    """A store that cannot be opened, or an episode that cannot be appended.

    The message names the store path and the offending field.
    """


@dataclass(frozen=True)
class FieldSpec:
    """One per-step field: its column names, dtype and unit."""

    columns: tuple[str, ...]
    dtype: str = "float64"
    unit: str = ""

    @property
    def width(self) -> int:
        return len(self.columns)

    def to_json(self) -> dict[str, Any]:
        return {"columns": list(self.columns), "dtype": self.dtype, "unit": self.unit}

    @classmethod
    def from_json(cls, d: Any, where: str = "field") -> FieldSpec:
        """Parse a field's attribute; ``where`` (e.g. ``"x.zarr: attribute fields.qpos"``) prefixes errors."""
        if not isinstance(d, Mapping):
            raise StoreError(f"{where}: must be an object with 'columns' and 'dtype', is {type(d).__name__}")
        if "columns" not in d:
            raise StoreError(f"{where}: has no 'columns'")
        columns = d["columns"]
        if not isinstance(columns, list) or not columns or not all(isinstance(c, str) for c in columns):
            raise StoreError(f"{where}.columns: must be a non-empty list of names, is {columns!r:.80}")
        unit = d.get("unit", "")
        if not isinstance(unit, str):
            raise StoreError(f"{where}.unit: must be text, is {unit!r:.80}")
        return cls(columns=tuple(columns), dtype=_dtype_name(d.get("dtype"), f"{where}.dtype"), unit=unit)


def _dtype_name(value: Any, where: str) -> str:
    """``value`` checked as the name of a bool, integer or float dtype."""
    try:
        dtype = np.dtype(value) if isinstance(value, str) else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in _NUMERIC_KINDS:
        raise StoreError(f"{where}: {value!r:.80} is not a bool, integer or float dtype name (e.g. 'float64')")
    return value


def _name(value: Any, where: str) -> str:
    """A field or episode-key name: one path component."""
    if not isinstance(value, str) or not value or value in (".", "..") or "/" in value or "\\" in value:
        raise StoreError(f"{where}: {value!r:.80} is not a valid name (non-empty, no '/')")
    return value


def package_versions() -> dict[str, str]:
    """Versions of the packages that shape stored data, for provenance."""
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for name in ("gpdyn", "numpy", "torch", "zarr", "mujoco", "mujoco-core", "gymnasium", "stable-baselines3", "sb3-contrib"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def numbered_columns(prefix: str, n: int) -> tuple[str, ...]:
    """Column names ``prefix0 .. prefix{n-1}``."""
    return tuple(f"{prefix}{i}" for i in range(n))


def _writer_lock(path: Path) -> WriterLock:
    """The store's lock: a file beside it, so that it exists before the store does."""
    absolute = Path(os.path.abspath(path))
    return WriterLock(absolute.with_name(absolute.name + ".lock"), f"store {path}", StoreError)


class EpisodeStore:
    """Append-only store of whole episodes.

    Create with :meth:`create`, reopen with :meth:`open`. Reading never loads more
    than it is asked for: use :meth:`read` with row ranges, or :meth:`episode`.
    A store opened for appending holds the writer lock until :meth:`close` (or the end
    of a ``with`` block, or when the object is collected, or the process ends).
    """

    def __init__(self, path: Path, group: zarr.Group, writable: bool, lock: WriterLock | None = None) -> None:
        self.path = path
        self._group = group
        self._writable = writable
        self._lock = lock
        if lock is not None:
            weakref.finalize(self, lock.release)
        self._arrays: dict[str, zarr.Array] = {}
        attrs = dict(group.attrs)
        self.attrs: dict[str, Any] = attrs
        self.fields, self.episode_keys = _schema(path, attrs)
        self._strict = attrs.get(ALL_CHUNKS) is True
        self._ends = self._committed_ends()
        self._check_arrays()

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(
        cls,
        path: str | Path,
        fields: Mapping[str, FieldSpec],
        *,
        source: str,
        env_id: str,
        dt: float,
        seed: int | None,
        episode_keys: Mapping[str, str] | None = None,
        extra_attrs: Mapping[str, Any] | None = None,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
    ) -> EpisodeStore:
        """Create an empty store at ``path`` (which must not exist yet), holding its writer lock.

        ``episode_keys`` maps per-episode scalar names to dtypes (e.g. ``{"seed": "int64"}``).
        """
        path = Path(path)
        if not fields:
            raise StoreError(f"{path}: a store needs at least one field")
        episode_keys = dict(episode_keys or {})
        for name, spec in fields.items():
            _name(name, f"{path}: field name")
            if spec.width < 1:
                raise StoreError(f"{path}: field '{name}' has no columns")
            _dtype_name(spec.dtype, f"{path}: field '{name}' dtype")
        for name, dtype in episode_keys.items():
            _name(name, f"{path}: per-episode key name")
            _dtype_name(dtype, f"{path}: per-episode key '{name}' dtype")
        if "episode_ends" in episode_keys:
            raise StoreError(f"{path}: 'episode_ends' is the store's own per-episode array, not a key")
        try:
            step = float(dt)
        except (TypeError, ValueError):
            step = math.nan
        if not (math.isfinite(step) and step >= 0):
            raise StoreError(f"{path}: dt must be a finite time step >= 0 (0: unknown), got {dt!r}")
        # the lock first: of two creators, one creates and the other is refused
        lock = _writer_lock(path)
        lock.path.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
        try:
            if path.exists():
                raise StoreError(f"{path}: already exists; open it with EpisodeStore.open(..., mode='a') to append")
            group = zarr.open_group(str(path), mode="w-", zarr_format=3)
            data = group.require_group("data")
            meta = group.require_group("meta")
            # a checksum in every chunk: a flipped bit is an error, never a silently wrong number
            codec = zarr.codecs.ZstdCodec(level=0, checksum=True)
            for name, spec in fields.items():
                data.create_array(name, shape=(0, spec.width), chunks=(chunk_rows, spec.width), dtype=spec.dtype,
                                  compressors=codec)
            for name, dtype in episode_keys.items():
                meta.create_array(name, shape=(0,), chunks=(EPISODE_CHUNK,), dtype=dtype, compressors=codec)
            meta.create_array("episode_ends", shape=(0,), chunks=(EPISODE_CHUNK,), dtype="int64", compressors=codec)
            attrs = {
                "format": FORMAT_NAME,
                "format_version": FORMAT_VERSION,
                "source": source,
                "env_id": env_id,
                "dt": step,
                "seed": seed,
                "fields": {k: v.to_json() for k, v in fields.items()},
                "episode_keys": episode_keys,
                "versions": package_versions(),
                ALL_CHUNKS: True,
                STORE_ID: uuid.uuid4().hex,
                "commit": {"episodes": 0, "rows": 0},
            }
            attrs.update(dict(extra_attrs or {}))
            # JSON round trip so that numpy scalars in extra_attrs fail here, not on reopen
            try:
                attrs = json.loads(json.dumps(attrs, allow_nan=False))
            except (TypeError, ValueError) as err:
                raise StoreError(f"{path}: an attribute cannot be stored as JSON ({err})") from err
            group.attrs.update(attrs)
            return cls(path, group, writable=True, lock=lock)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def open(cls, path: str | Path, mode: str = "r") -> EpisodeStore:
        """Open and validate a store; ``mode='a'`` to append (takes the writer lock, trims uncommitted rows)."""
        if mode not in ("r", "a"):
            raise StoreError(f"{path}: mode must be 'r' or 'a', got {mode!r}")
        path = Path(path)
        if not path.exists():
            raise StoreError(f"{path}: no such store")
        lock = _writer_lock(path).acquire() if mode == "a" else None
        try:
            store = cls(path, _open_group(path, mode), writable=mode == "a", lock=lock)
            if mode == "a":
                store._trim_uncommitted()
            return store
        except BaseException:
            if lock is not None:
                lock.release()
            raise

    def close(self) -> None:
        """Release the writer lock (a store opened for reading holds none); the object stays readable."""
        self._writable = False
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> EpisodeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reading
    @property
    def n_episodes(self) -> int:
        return int(self._ends.shape[0])

    @property
    def n_rows(self) -> int:
        """Committed rows (rows past the last episode end are not counted)."""
        return int(self._ends[-1]) if self.n_episodes else 0

    @property
    def episode_ends(self) -> np.ndarray:
        return self._ends.copy()

    @property
    def episode_starts(self) -> np.ndarray:
        return np.concatenate([[0], self._ends[:-1]]).astype(np.int64)

    @property
    def episode_lengths(self) -> np.ndarray:
        return np.diff(np.concatenate([[0], self._ends])).astype(np.int64)

    def columns(self, field: str) -> tuple[str, ...]:
        return self._spec(field).columns

    def read(self, field: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` of one field (committed rows only).

        A missing or undecodable chunk, a non-finite value or one past ``MAX_ABS`` raises
        :class:`StoreError` naming the field, row and column.
        """
        spec = self._spec(field)
        stop = self.n_rows if stop is None else min(stop, self.n_rows)
        start = max(0, start)
        if stop <= start:
            return np.empty((0, spec.width), dtype=spec.dtype)
        block = self._read(f"data/{field}", start, stop)
        self._check_values(f"data/{field}", block, start, spec.columns)
        return block

    def episode_values(self, key: str) -> np.ndarray:
        """The per-episode scalar ``key`` for every committed episode."""
        if key not in self.episode_keys:
            raise StoreError(f"{self.path}: no per-episode key '{key}' (has {sorted(self.episode_keys)})")
        values = self._read(f"meta/{key}", 0, self.n_episodes)
        self._check_values(f"meta/{key}", values[:, None], 0, (key,), per_episode=True)
        return values

    def episode(self, index: int, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """All (or the named) fields of episode ``index``."""
        n = self.n_episodes
        if not -n <= index < n:
            raise IndexError(f"{self.path}: episode {index} out of range (store has {n})")
        index %= n
        start = int(self._ends[index - 1]) if index else 0
        stop = int(self._ends[index])
        return {f: self.read(f, start, stop) for f in (fields or self.fields)}

    def iter_episodes(self, fields: Sequence[str] | None = None) -> Iterator[dict[str, np.ndarray]]:
        for i in range(self.n_episodes):
            yield self.episode(i, fields)

    def summary(self) -> dict[str, Any]:
        """Counts, schema and attributes, for `gpdyn inspect`."""
        lengths = self.episode_lengths
        stored_rows = {f: int(self._array(f"data/{f}").shape[0]) for f in self.fields}
        return {
            "path": str(self.path),
            "format": f"{self.attrs['format']} v{self.attrs['format_version']}",
            "source": self.attrs.get("source"),
            "env_id": self.attrs.get("env_id"),
            "dt": self.attrs.get("dt"),
            "seed": self.attrs.get("seed"),
            "store_id": self.attrs.get(STORE_ID),
            "episodes": self.n_episodes,
            "rows": self.n_rows,
            "uncommitted_rows": max(stored_rows.values(), default=0) - self.n_rows,
            "episode_length": (
                {"min": int(lengths.min()), "mean": float(lengths.mean()), "max": int(lengths.max())}
                if self.n_episodes
                else None
            ),
            "fields": {f: {"width": s.width, "dtype": s.dtype, "unit": s.unit} for f, s in self.fields.items()},
            "episode_keys": self.episode_keys,
        }

    def identity(self) -> dict[str, Any]:
        """What tells this store's committed content apart from any other's: its ``store_id``
        and commit record, ``{"store_id": ..., "episodes": n, "rows": r}``.

        A store created before ids has ``{"content_sha256": ..., "episodes": n, "rows": r}``
        instead, the hash of everything committed (:meth:`content_sha256`).
        """
        counts = {"episodes": self.n_episodes, "rows": self.n_rows}
        store_id = self.attrs.get(STORE_ID)
        if isinstance(store_id, str) and store_id:
            return {STORE_ID: store_id, **counts}
        return {"content_sha256": self.content_sha256(), **counts}

    def content_sha256(self, block_rows: int = DEFAULT_CHUNK_ROWS) -> str:
        """SHA-256 of the committed content: every field's rows (name, dtype and values, in
        name order), the episode ends and every per-episode array, read ``block_rows`` at a time."""
        digest = hashlib.sha256()

        def add(name: str, block: np.ndarray) -> None:
            digest.update(f"{name}:{block.dtype.str}:{block.shape[1:]}".encode())
            digest.update(np.ascontiguousarray(block).tobytes())

        for name in sorted(self.fields):
            for start in range(0, self.n_rows, block_rows):
                add(name, self.read(name, start, start + block_rows))
        add("episode_ends", self._ends)
        for key in sorted(self.episode_keys):
            add(key, self.episode_values(key))
        return digest.hexdigest()

    # ------------------------------------------------------------------ writing
    def append_episode(self, episode: Mapping[str, np.ndarray], /, **episode_values: Any) -> None:
        """Append one whole episode; see :meth:`append_episodes`. (``episode`` is positional only, so an episode
        value may itself be named ``episode``.)"""
        self.append_episodes([episode], [episode_values])

    def append_episodes(
        self,
        episodes: Sequence[Mapping[str, np.ndarray]],
        episode_values: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Append whole episodes in one write per field, then commit.

        Every episode and its per-episode values are validated before anything is
        written: all fields present, 2-D with the right width, equal lengths, a numeric
        dtype that casts to the field's, finite values within ``MAX_ABS``, every
        per-episode key given a scalar of its dtype. A refused batch leaves the store
        unchanged.
        """
        if not self._writable:
            raise StoreError(f"{self.path}: opened read-only (or closed); open with mode='a' to append")
        if not episodes:
            return
        episode_values = list(episode_values) if episode_values is not None else [{} for _ in episodes]
        if len(episode_values) != len(episodes):
            raise StoreError(
                f"{self.path}: {len(episodes)} episodes but {len(episode_values)} per-episode value sets"
            )
        checked = [self._check_episode(ep, vals, i) for i, (ep, vals) in enumerate(zip(episodes, episode_values))]
        lengths = [len(next(iter(arrays.values()))) for arrays, _ in checked]

        start = self.n_rows
        stop = start + sum(lengths)
        for name, spec in self.fields.items():
            self._write(f"data/{name}", (stop, spec.width), start, np.concatenate([a[name] for a, _ in checked]))
        n0, n1 = self.n_episodes, self.n_episodes + len(episodes)
        for key in self.episode_keys:
            self._write(f"meta/{key}", (n1,), n0, np.stack([v[key] for _, v in checked]))
        new_ends = np.concatenate([self._ends, start + np.cumsum(lengths)]).astype(np.int64)
        self._write("meta/episode_ends", (n1,), n0, new_ends[n0:n1])
        # The commit point: one atomic replace of the root zarr.json (zarr writes a
        # temporary file and renames it). Only now do the new rows belong to the store.
        commit = {"episodes": n1, "rows": stop}
        try:
            self._group.attrs.update({"commit": commit})
        except OSError as err:
            raise StoreError(f"{self.path}: could not write the commit record ({err})") from err
        self.attrs["commit"] = commit
        self._ends = new_ends

    def _check_episode(
        self, ep: Mapping[str, np.ndarray], values: Mapping[str, Any], index: int
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """One episode's arrays and per-episode values, cast to the store's dtypes and checked."""
        where = f"{self.path}: episode {index} of the batch"
        if not isinstance(ep, Mapping):
            raise StoreError(f"{where}: must map field names to arrays, is {type(ep).__name__}")
        if not isinstance(values, Mapping):
            raise StoreError(f"{where}: per-episode values must map keys to scalars, is {type(values).__name__}")
        missing = set(self.fields) - set(ep)
        extra = set(ep) - set(self.fields)
        if missing or extra:
            raise StoreError(f"{where}: fields missing {sorted(missing)}, unknown {sorted(extra)}")
        length = None
        arrays: dict[str, np.ndarray] = {}
        for name, spec in self.fields.items():
            a = np.asarray(ep[name])
            if a.ndim == 1 and spec.width == 1:
                a = a[:, None]
            if a.ndim != 2 or a.shape[1] != spec.width:
                raise StoreError(f"{where}: field '{name}' has shape {a.shape}, expected (T, {spec.width})")
            if length is None:
                length = a.shape[0]
            elif a.shape[0] != length:
                raise StoreError(f"{where}: field '{name}' has {a.shape[0]} rows, other fields have {length}")
            arrays[name] = _cast(a, spec.dtype, f"{where}: field '{name}'", spec.columns)
        if not length:
            raise StoreError(f"{where}: an episode needs at least one step")
        missing_keys = set(self.episode_keys) - set(values)
        extra_keys = set(values) - set(self.episode_keys)
        if missing_keys or extra_keys:
            raise StoreError(
                f"{where}: per-episode values missing {sorted(missing_keys)}, unknown {sorted(extra_keys)}"
            )
        scalars = {}
        for key, dtype in self.episode_keys.items():
            v = np.asarray(values[key])
            if v.ndim != 0:
                raise StoreError(f"{where}: per-episode value '{key}' must be one number, has shape {v.shape}")
            scalars[key] = _cast(v.reshape(1, 1), dtype, f"{where}: per-episode value '{key}'", (key,))[0, 0]
        return arrays, scalars

    def _write(self, key: str, shape: tuple[int, ...], start: int, block: np.ndarray) -> None:
        """Grow ``key`` to ``shape`` and write ``block`` from row ``start``; every chunk is written."""
        arr = self._array(key).with_config({"write_empty_chunks": True})
        try:
            arr.resize(shape)
            arr[start : start + len(block)] = block
        except Exception as err:  # a full disk, or a damaged last chunk that zarr reads back to extend
            raise StoreError(
                f"{self.path}: writing '{key}' rows {start}:{start + len(block)} failed ({type(err).__name__}: {err}); "
                "nothing was committed"
            ) from err
        self._arrays[key] = arr

    def _trim_uncommitted(self) -> None:
        """Drop rows, per-episode values and episode ends written after the last commit (a crash)."""
        n, rows = self.n_episodes, self.n_rows
        targets = [("meta/episode_ends", (n,))]
        targets += [(f"data/{name}", (rows, spec.width)) for name, spec in self.fields.items()]
        targets += [(f"meta/{key}", (n,)) for key in self.episode_keys]
        for key, shape in targets:
            arr = self._array(key)
            if arr.shape[0] > shape[0]:
                arr.resize(shape)

    # ------------------------------------------------------------------ checks
    def _spec(self, field: str) -> FieldSpec:
        try:
            return self.fields[field]
        except KeyError:
            raise StoreError(f"{self.path}: no field '{field}' (has {sorted(self.fields)})") from None

    def _array(self, key: str) -> zarr.Array:
        """The array at ``key``, its metadata read once; a missing or unreadable one names the key."""
        if key not in self._arrays:
            try:
                node = self._group[key]
            except KeyError:
                raise StoreError(f"{self.path}: array '{key}' is missing") from None
            except Exception as err:  # zarr raises JSON, value and type errors for damaged metadata
                raise StoreError(
                    f"{self.path}: array '{key}': unreadable metadata {key}/zarr.json ({type(err).__name__}: {err})"
                ) from err
            if not isinstance(node, zarr.Array):
                raise StoreError(f"{self.path}: '{key}' is a group, expected an array")
            self._arrays[key] = node
        return self._arrays[key]

    def _missing_chunks(self, key: str, start: int, stop: int) -> list[tuple[int, int]]:
        """Row ranges of ``key`` in ``start:stop`` whose chunk file is missing (zarr would read fill values)."""
        arr = self._array(key)
        rows_per_chunk = arr.chunks[0]
        column_chunks = range(math.ceil(arr.shape[1] / arr.chunks[1])) if arr.ndim == 2 else [None]
        missing = []
        for i in range(start // rows_per_chunk, math.ceil(stop / rows_per_chunk)):
            for j in column_chunks:
                name = arr.metadata.encode_chunk_key((i,) if j is None else (i, j))
                if not (self.path / key / name).is_file():
                    missing.append((i * rows_per_chunk, min((i + 1) * rows_per_chunk, arr.shape[0])))
                    break
        return missing

    def _require_chunks(self, key: str, start: int, stop: int) -> None:
        """Raise when a chunk of the committed rows ``start:stop`` of ``key`` has no file."""
        # stores of older versions skip all-fill chunks: there only a float chunk of
        # exact zeros counts as damage, since real measurements are never all 0.0
        if not (self._strict or key == "meta/episode_ends" or np.dtype(self._array(key).dtype).kind == "f"):
            return
        missing = self._missing_chunks(key, start, stop)
        if missing:
            a, b = missing[0]
            raise StoreError(
                f"{self.path}: '{key}' rows {a}:{b} are committed but their chunk file is missing "
                f"({len(missing)} chunk(s) missing); the store is damaged"
            )

    def _read(self, key: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of ``key`` as stored: a missing chunk or one that does not decode raises."""
        arr = self._array(key)
        self._require_chunks(key, start, stop)
        try:
            return np.asarray(arr[start:stop])
        except Exception as err:  # numcodecs raises RuntimeError for a damaged zstd frame
            raise StoreError(
                f"{self.path}: '{key}' rows {start}:{stop}: a chunk does not decode ({type(err).__name__}: {err}); "
                "the store is damaged"
            ) from err

    def _check_values(
        self, key: str, block: np.ndarray, start: int, columns: Sequence[str], per_episode: bool = False
    ) -> None:
        """Raise naming the row (or episode) and column of the first non-finite or too large value."""
        if block.dtype.kind != "f":
            return
        bad = _bad_values(block)
        if bad is None:
            return
        r, c = (int(i) for i in np.argwhere(bad)[0])
        row = start + r
        if per_episode:
            place = f"episode {row}"
        else:
            episode = int(np.searchsorted(self._ends, row, side="right"))
            step = row - (int(self._ends[episode - 1]) if episode else 0)
            place = f"row {row} (episode {episode}, step {step})"
        raise StoreError(
            f"{self.path}: '{key}' {place}, column '{columns[c]}' holds {block[r, c]}: "
            f"not a finite number within ±{MAX_ABS:g} ({int(bad.sum())} such value(s) in rows {start}:{start + len(block)})"
        )

    def _committed_ends(self) -> np.ndarray:
        """``episode_ends`` up to the commit record (or, in a store without one, its committed prefix)."""
        key = "meta/episode_ends"
        arr = self._array(key)
        if arr.ndim != 1 or np.dtype(arr.dtype) != np.int64:
            raise StoreError(f"{self.path}: '{key}' must be 1-D int64, is {arr.ndim}-D {arr.dtype}")
        commit = self.attrs.get("commit")
        if commit is None:
            return self._legacy_committed_ends()
        if not (
            isinstance(commit, Mapping)
            and all(isinstance(commit.get(k), int) and not isinstance(commit.get(k), bool) and commit[k] >= 0
                    for k in ("episodes", "rows"))
        ):
            raise StoreError(f"{self.path}: attribute 'commit' must be {{'episodes': n, 'rows': r}}, is {commit!r:.120}")
        n, rows = commit["episodes"], commit["rows"]
        if arr.shape[0] < n:
            raise StoreError(f"{self.path}: '{key}' has {arr.shape[0]} entries but the commit record says {n} episodes")
        ends = self._read(key, 0, n).astype(np.int64)
        _check_increasing(self.path, ends)
        last = int(ends[-1]) if n else 0
        if last != rows:
            raise StoreError(f"{self.path}: '{key}' ends at row {last} but the commit record says {rows} rows")
        return ends

    def _legacy_committed_ends(self) -> np.ndarray:
        """A store written before the commit record: episode_ends was the commit point.

        A crash between its resize and its write leaves trailing zeros: those entries are
        uncommitted. Any other break in the increasing sequence, and any missing chunk, is
        damage. (A torn commit whose new entries start a chunk also leaves that chunk
        missing, but so does a deleted last chunk, whose episodes the next append would
        trim away: refusing both loses nothing.)
        """
        key = "meta/episode_ends"
        total = self._array(key).shape[0]
        missing = self._missing_chunks(key, 0, total)
        if missing:
            a, b = missing[0]
            raise StoreError(f"{self.path}: '{key}' entries {a}:{b} have no chunk file; the store is damaged")
        ends = self._read(key, 0, total).astype(np.int64)
        bad = np.flatnonzero(np.diff(np.concatenate([[0], ends])) <= 0)
        if bad.size and np.all(ends[bad[0]:] == 0):
            return ends[: bad[0]]  # the zeros of a torn commit
        _check_increasing(self.path, ends)
        return ends

    def _check_arrays(self) -> None:
        """Every field and per-episode array exists with its schema's shape and dtype, and holds every
        committed chunk."""
        for name, spec in self.fields.items():
            key = f"data/{name}"
            arr = self._array(key)
            if arr.ndim != 2 or arr.shape[1] != spec.width:
                raise StoreError(f"{self.path}: field '{key}' has shape {arr.shape}, expected (rows, {spec.width})")
            if np.dtype(arr.dtype) != np.dtype(spec.dtype):
                raise StoreError(f"{self.path}: field '{key}' has dtype {arr.dtype}, schema says {spec.dtype}")
            if arr.shape[0] < self.n_rows:
                raise StoreError(
                    f"{self.path}: field '{key}' has {arr.shape[0]} rows but episode_ends commits {self.n_rows}"
                )
        for name, dtype in self.episode_keys.items():
            key = f"meta/{name}"
            arr = self._array(key)
            if arr.ndim != 1 or np.dtype(arr.dtype) != np.dtype(dtype):
                raise StoreError(f"{self.path}: per-episode array '{key}' is {arr.ndim}-D {arr.dtype}, schema says 1-D {dtype}")
            if arr.shape[0] < self.n_episodes:
                raise StoreError(f"{self.path}: '{key}' has {arr.shape[0]} entries for {self.n_episodes} episodes")
        # chunk files only (a stat each): decoding every chunk is left to the reads
        keys = [(f"data/{f}", self.n_rows) for f in self.fields] + [(f"meta/{k}", self.n_episodes) for k in self.episode_keys]
        for key, n in keys:
            self._require_chunks(key, 0, n)


def _cast(a: np.ndarray, dtype: str, where: str, columns: Sequence[str]) -> np.ndarray:
    """``a`` as ``dtype``: numeric, no lossy kind change, integers in range, floats finite and within MAX_ABS."""
    target = np.dtype(dtype)
    if a.dtype.kind not in _NUMERIC_KINDS:
        raise StoreError(f"{where} has dtype {a.dtype}, store expects {dtype}")
    if not np.can_cast(a.dtype, target, casting="same_kind") and a.dtype != np.bool_:
        raise StoreError(f"{where} has dtype {a.dtype}, store expects {dtype}")
    if target.kind in "iu" and a.size and a.dtype.kind in "iu":
        info = np.iinfo(target)
        low, high = a.min(), a.max()
        if low < info.min or high > info.max:
            raise StoreError(f"{where} holds {low if low < info.min else high}, outside the range of {dtype}")
    with np.errstate(over="ignore", invalid="ignore"):
        out = a.astype(target, copy=False)
    if target.kind == "f":
        bad = _bad_values(out)
        if bad is not None:
            r, c = np.argwhere(bad)[0]
            raise StoreError(
                f"{where} has {a[r, c]} at step {r}, column '{columns[c]}': "
                f"not a finite number within ±{MAX_ABS:g}" + (f" as {dtype}" if np.isfinite(a[r, c]) and not np.isfinite(out[r, c]) else "")
            )
    return out


def _bad_values(block: np.ndarray) -> np.ndarray | None:
    """Mask of the non-finite values of a float block and of those beyond ``MAX_ABS``; None when there are none."""
    if block.size == 0:
        return None
    # float32 and smaller cannot hold 1e100: for them the bound is being finite
    limit = block.dtype.type(MAX_ABS if block.dtype.itemsize > 4 else np.finfo(block.dtype).max)
    # the common case in two reductions and no temporary array: NaN propagates into min and max
    low, high = block.min(), block.max()
    if -limit <= low and high <= limit:
        return None
    bad = ~np.isfinite(block)
    bad |= np.abs(np.where(bad, 0, block)) > limit
    return bad


def _check_increasing(path: Path, ends: np.ndarray) -> None:
    bad = np.flatnonzero(np.diff(np.concatenate([[0], ends])) <= 0)
    if bad.size:
        first = int(bad[0])
        raise StoreError(
            f"{path}: 'meta/episode_ends' is not strictly increasing from a positive value (entry {first}: {ends[first]})"
        )


def _open_group(path: Path, mode: str) -> zarr.Group:
    """The zarr v3 root group at ``path``; a v2 store, a file or damaged metadata is a StoreError."""
    meta = path / "zarr.json"
    if not meta.is_file():
        if (path / ".zgroup").is_file():
            raise StoreError(
                f"{path}: a zarr v2 store (.zgroup); gpdyn episode stores are zarr v3 (format "
                f"'{FORMAT_NAME}'): collect or import the data again into a new store"
            )
        raise StoreError(f"{path}: not a zarr v3 group (no zarr.json)")
    try:
        doc = json.loads(meta.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise StoreError(f"{meta}: unreadable store metadata ({type(err).__name__}: {err})") from err
    if not isinstance(doc, dict) or doc.get("node_type") != "group" or doc.get("zarr_format") != 3:
        raise StoreError(f"{meta}: not the metadata of a zarr v3 group")
    try:
        return zarr.open_group(str(path), mode="r+" if mode == "a" else "r", zarr_format=3)
    except Exception as err:  # zarr raises several types for damaged metadata
        raise StoreError(f"{path}: not a readable zarr group ({type(err).__name__}: {err})") from err


def _schema(path: Path, attrs: Mapping[str, Any]) -> tuple[dict[str, FieldSpec], dict[str, str]]:
    """The fields and per-episode keys of the root attributes; an error names the attribute."""
    fmt = attrs.get("format")
    if fmt != FORMAT_NAME:
        raise StoreError(f"{path}: attribute 'format' is {fmt!r:.80}, expected {FORMAT_NAME!r}")
    version = attrs.get("format_version")
    if version != FORMAT_VERSION:
        raise StoreError(
            f"{path}: attribute 'format_version' is {version!r:.80}; this gpdyn reads version {FORMAT_VERSION}"
        )
    for key in ("fields", "dt", "env_id", "source"):
        if key not in attrs:
            raise StoreError(f"{path}: root attribute '{key}' is missing")
    for key in ("env_id", "source"):
        if not isinstance(attrs[key], str):
            raise StoreError(f"{path}: attribute '{key}' must be text, is {attrs[key]!r:.80}")
    dt = attrs["dt"]
    if isinstance(dt, bool) or not isinstance(dt, (int, float)) or not math.isfinite(dt) or dt < 0:
        raise StoreError(f"{path}: attribute 'dt' must be a finite time step >= 0 (0: unknown), is {dt!r:.80}")
    fields_json = attrs["fields"]
    if not isinstance(fields_json, Mapping) or not fields_json:
        raise StoreError(
            f"{path}: attribute 'fields' must map field names to their schema, is {type(fields_json).__name__} "
            f"{fields_json!r:.80}"
        )
    fields = {
        _name(name, f"{path}: attribute 'fields' name"): FieldSpec.from_json(d, f"{path}: attribute 'fields.{name}'")
        for name, d in fields_json.items()
    }
    keys_json = attrs.get("episode_keys", {})
    if not isinstance(keys_json, Mapping):
        raise StoreError(f"{path}: attribute 'episode_keys' must map names to dtypes, is {keys_json!r:.80}")
    episode_keys = {
        _name(name, f"{path}: attribute 'episode_keys' name"): _dtype_name(dtype, f"{path}: attribute 'episode_keys.{name}'")
        for name, dtype in keys_json.items()
    }
    return fields, episode_keys


def is_store(path: str | Path) -> bool:
    """True if ``path`` looks like an episode store, zarr v3 or v2 (without validating it)."""
    path = Path(path)
    return ((path / "zarr.json").exists() or (path / ".zgroup").exists()) and (path / "data").is_dir()


__all__ = [
    "EpisodeStore", "FieldSpec", "StoreError", "FORMAT_NAME", "FORMAT_VERSION", "MAX_ABS", "STORE_ID", "is_store",
    "numbered_columns", "package_versions",
]
