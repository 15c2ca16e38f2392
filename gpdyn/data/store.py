"""Episode store: time-major zarr v3 arrays concatenated across episodes.

Layout (the robotics zarr convention, see docs/architecture.md "Episode store"):

    <root>/data/<field>          [rows, columns]   one array per field, time-major
    <root>/meta/episode_ends     [episodes] int64  cumulative row counts (the commit point)
    <root>/meta/<episode key>    [episodes]        optional per-episode scalars (seed, phase, ...)

Root attributes hold the format name and version, source, environment id, ``dt``,
the schema (column names, units and dtype of every field and episode key), the seed
and package versions.

Crash safety: an episode's rows (and per-episode scalars) are written first and
``episode_ends`` last. A crash in between leaves rows past ``episode_ends[-1]``; they
are ignored on read and trimmed when the store is next opened for appending.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from gpdyn.errors import InputError

FORMAT_NAME = "gpdyn.episodes"
FORMAT_VERSION = 1
DEFAULT_CHUNK_ROWS = 16384


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
    def from_json(cls, d: Mapping[str, Any]) -> FieldSpec:
        return cls(columns=tuple(d["columns"]), dtype=str(d["dtype"]), unit=str(d.get("unit", "")))


def package_versions() -> dict[str, str]:
    """Versions of the packages that shape stored data, for provenance."""
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for name in ("gpdyn", "numpy", "torch", "zarr", "mujoco", "gymnasium", "stable-baselines3", "sb3-contrib"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def numbered_columns(prefix: str, n: int) -> tuple[str, ...]:
    """Column names ``prefix0 .. prefix{n-1}``."""
    return tuple(f"{prefix}{i}" for i in range(n))


class EpisodeStore:
    """Append-only store of whole episodes.

    Create with :meth:`create`, reopen with :meth:`open`. Reading never loads more
    than it is asked for: use :meth:`read` with row ranges, or :meth:`episode`.
    """

    def __init__(self, path: Path, group: zarr.Group, writable: bool) -> None:
        self.path = path
        self._group = group
        self._writable = writable
        attrs = dict(group.attrs)
        self.attrs: dict[str, Any] = attrs
        self.fields: dict[str, FieldSpec] = {k: FieldSpec.from_json(v) for k, v in attrs["fields"].items()}
        self.episode_keys: dict[str, str] = dict(attrs.get("episode_keys", {}))
        self._ends = committed_ends(path, np.asarray(group["meta/episode_ends"][:]))

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
        """Create an empty store at ``path`` (which must not exist yet).

        ``episode_keys`` maps per-episode scalar names to dtypes (e.g. ``{"seed": "int64"}``).
        """
        path = Path(path)
        if path.exists():
            raise StoreError(f"{path}: already exists; open it with EpisodeStore.open(..., mode='a') to append")
        if not fields:
            raise StoreError(f"{path}: a store needs at least one field")
        episode_keys = dict(episode_keys or {})
        for name, spec in fields.items():
            if spec.width < 1:
                raise StoreError(f"{path}: field '{name}' has no columns")
            np.dtype(spec.dtype)  # raises on an unknown dtype
        group = zarr.open_group(str(path), mode="w-", zarr_format=3)
        data = group.require_group("data")
        meta = group.require_group("meta")
        for name, spec in fields.items():
            data.create_array(name, shape=(0, spec.width), chunks=(chunk_rows, spec.width), dtype=spec.dtype)
        for name, dtype in episode_keys.items():
            meta.create_array(name, shape=(0,), chunks=(4096,), dtype=dtype)
        meta.create_array("episode_ends", shape=(0,), chunks=(4096,), dtype="int64")
        attrs = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "source": source,
            "env_id": env_id,
            "dt": float(dt),
            "seed": seed,
            "fields": {k: v.to_json() for k, v in fields.items()},
            "episode_keys": episode_keys,
            "versions": package_versions(),
        }
        attrs.update(dict(extra_attrs or {}))
        # JSON round trip so that numpy scalars in extra_attrs fail here, not on reopen
        group.attrs.update(json.loads(json.dumps(attrs)))
        return cls(path, group, writable=True)

    @classmethod
    def open(cls, path: str | Path, mode: str = "r") -> EpisodeStore:
        """Open and validate a store; ``mode='a'`` to append (trims uncommitted rows)."""
        if mode not in ("r", "a"):
            raise StoreError(f"{path}: mode must be 'r' or 'a', got {mode!r}")
        path = Path(path)
        if not path.exists():
            raise StoreError(f"{path}: no such store")
        try:
            group = zarr.open_group(str(path), mode="r+" if mode == "a" else "r")
        except Exception as err:  # zarr raises several types for a non-store folder
            raise StoreError(f"{path}: not a zarr group ({type(err).__name__}: {err})") from err
        _validate(path, group)
        store = cls(path, group, writable=mode == "a")
        if mode == "a":
            store._trim_uncommitted()
        return store

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
        """Rows ``start:stop`` of one field (committed rows only)."""
        self._spec(field)
        stop = self.n_rows if stop is None else min(stop, self.n_rows)
        start = max(0, start)
        if stop <= start:
            return np.empty((0, self.fields[field].width), dtype=self.fields[field].dtype)
        return np.asarray(self._group[f"data/{field}"][start:stop])

    def episode_values(self, key: str) -> np.ndarray:
        """The per-episode scalar ``key`` for every committed episode."""
        if key not in self.episode_keys:
            raise StoreError(f"{self.path}: no per-episode key '{key}' (has {sorted(self.episode_keys)})")
        return np.asarray(self._group[f"meta/{key}"][: self.n_episodes])

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
        stored_rows = {f: int(self._group[f"data/{f}"].shape[0]) for f in self.fields}
        return {
            "path": str(self.path),
            "format": f"{self.attrs['format']} v{self.attrs['format_version']}",
            "source": self.attrs.get("source"),
            "env_id": self.attrs.get("env_id"),
            "dt": self.attrs.get("dt"),
            "seed": self.attrs.get("seed"),
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
        """Append whole episodes in one write per field, then commit ``episode_ends``.

        Every episode is validated before anything is written: all fields present,
        2-D with the right width, equal lengths, finite values. A refused batch
        leaves the store unchanged.
        """
        if not self._writable:
            raise StoreError(f"{self.path}: opened read-only; open with mode='a' to append")
        if not episodes:
            return
        episode_values = list(episode_values) if episode_values is not None else [{} for _ in episodes]
        if len(episode_values) != len(episodes):
            raise StoreError(
                f"{self.path}: {len(episodes)} episodes but {len(episode_values)} per-episode value sets"
            )
        lengths = [self._check_episode(ep, vals, i) for i, (ep, vals) in enumerate(zip(episodes, episode_values))]

        start = self.n_rows
        stop = start + sum(lengths)
        for name, spec in self.fields.items():
            arr = self._group[f"data/{name}"]
            block = np.concatenate([np.asarray(ep[name], dtype=spec.dtype).reshape(-1, spec.width) for ep in episodes])
            arr.resize((stop, spec.width))
            arr[start:stop] = block
        n0, n1 = self.n_episodes, self.n_episodes + len(episodes)
        for key, dtype in self.episode_keys.items():
            arr = self._group[f"meta/{key}"]
            arr.resize((n1,))
            arr[n0:n1] = np.asarray([vals[key] for vals in episode_values], dtype=dtype)
        # The commit point: only now do the new rows become part of the store.
        new_ends = np.concatenate([self._ends, start + np.cumsum(lengths)]).astype(np.int64)
        ends = self._group["meta/episode_ends"]
        ends.resize((n1,))
        ends[n0:n1] = new_ends[n0:n1]
        self._ends = new_ends

    def _check_episode(self, ep: Mapping[str, np.ndarray], values: Mapping[str, Any], index: int) -> int:
        where = f"{self.path}: episode {index} of the batch"
        missing = set(self.fields) - set(ep)
        extra = set(ep) - set(self.fields)
        if missing or extra:
            raise StoreError(f"{where}: fields missing {sorted(missing)}, unknown {sorted(extra)}")
        length = None
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
            if a.dtype.kind in "fc" and not np.isfinite(a).all():
                bad = np.argwhere(~np.isfinite(a))[0]
                raise StoreError(
                    f"{where}: field '{name}' has a non-finite value at step {bad[0]}, column '{spec.columns[bad[1]]}'"
                )
            if not np.can_cast(a.dtype, spec.dtype, casting="same_kind") and a.dtype != np.bool_:
                raise StoreError(f"{where}: field '{name}' has dtype {a.dtype}, store expects {spec.dtype}")
        if not length:
            raise StoreError(f"{where}: an episode needs at least one step")
        missing_keys = set(self.episode_keys) - set(values)
        extra_keys = set(values) - set(self.episode_keys)
        if missing_keys or extra_keys:
            raise StoreError(
                f"{where}: per-episode values missing {sorted(missing_keys)}, unknown {sorted(extra_keys)}"
            )
        return int(length)

    def _trim_uncommitted(self) -> None:
        """Drop rows, per-episode values and torn episode ends written after the last commit (a crash)."""
        ends = self._group["meta/episode_ends"]
        if ends.shape[0] > self.n_episodes:
            ends.resize((self.n_episodes,))
        for name, spec in self.fields.items():
            arr = self._group[f"data/{name}"]
            if arr.shape[0] > self.n_rows:
                arr.resize((self.n_rows, spec.width))
        for key in self.episode_keys:
            arr = self._group[f"meta/{key}"]
            if arr.shape[0] > self.n_episodes:
                arr.resize((self.n_episodes,))

    def _spec(self, field: str) -> FieldSpec:
        try:
            return self.fields[field]
        except KeyError:
            raise StoreError(f"{self.path}: no field '{field}' (has {sorted(self.fields)})") from None


def committed_ends(path: Path, ends: np.ndarray) -> np.ndarray:
    """The committed prefix of ``meta/episode_ends``.

    The commit resizes ``episode_ends`` and then writes the new values; a crash in
    between leaves trailing fill-value zeros, which mark uncommitted episodes. Any other
    break in the strictly increasing sequence is corruption.
    """
    ends = ends.astype(np.int64)
    bad = np.flatnonzero(np.diff(np.concatenate([[0], ends])) <= 0)
    if bad.size == 0:
        return ends
    first = int(bad[0])
    if np.all(ends[first:] == 0):
        return ends[:first]
    raise StoreError(
        f"{path}: 'meta/episode_ends' is not strictly increasing from a positive value (entry {first}: {ends[first]})"
    )


def _validate(path: Path, group: zarr.Group) -> None:
    """Check the schema of an opened group; raise StoreError naming file and field."""
    attrs = dict(group.attrs)
    fmt = attrs.get("format")
    if fmt != FORMAT_NAME:
        raise StoreError(f"{path}: attribute 'format' is {fmt!r}, expected {FORMAT_NAME!r}")
    version = attrs.get("format_version")
    if version != FORMAT_VERSION:
        raise StoreError(
            f"{path}: attribute 'format_version' is {version!r}; this gpdyn reads version {FORMAT_VERSION}"
        )
    for key in ("fields", "dt", "env_id", "source"):
        if key not in attrs:
            raise StoreError(f"{path}: root attribute '{key}' is missing")
    if "meta/episode_ends" not in group:
        raise StoreError(f"{path}: array 'meta/episode_ends' is missing")
    ends_arr = group["meta/episode_ends"]
    if ends_arr.ndim != 1 or np.dtype(ends_arr.dtype) != np.int64:
        raise StoreError(f"{path}: 'meta/episode_ends' must be 1-D int64, is {ends_arr.ndim}-D {ends_arr.dtype}")
    ends = committed_ends(path, np.asarray(ends_arr[:]))
    committed = int(ends[-1]) if ends.size else 0
    for name, spec_json in attrs["fields"].items():
        key = f"data/{name}"
        if key not in group:
            raise StoreError(f"{path}: field '{key}' is missing")
        spec = FieldSpec.from_json(spec_json)
        arr = group[key]
        if arr.ndim != 2 or arr.shape[1] != spec.width:
            raise StoreError(f"{path}: field '{key}' has shape {arr.shape}, expected (rows, {spec.width})")
        if np.dtype(arr.dtype) != np.dtype(spec.dtype):
            raise StoreError(f"{path}: field '{key}' has dtype {arr.dtype}, schema says {spec.dtype}")
        if arr.shape[0] < committed:
            raise StoreError(
                f"{path}: field '{key}' has {arr.shape[0]} rows but episode_ends commits {committed}"
            )
    for name in attrs.get("episode_keys", {}):
        key = f"meta/{name}"
        if key not in group:
            raise StoreError(f"{path}: per-episode array '{key}' is missing")
        if group[key].shape[0] < ends.size:
            raise StoreError(f"{path}: '{key}' has {group[key].shape[0]} entries for {ends.size} episodes")


def is_store(path: str | Path) -> bool:
    """True if ``path`` looks like a gpdyn episode store (without validating it)."""
    path = Path(path)
    return (path / "zarr.json").exists() and (path / "data").is_dir()


__all__ = ["EpisodeStore", "FieldSpec", "StoreError", "FORMAT_NAME", "FORMAT_VERSION", "is_store", "numbered_columns", "package_versions"]
