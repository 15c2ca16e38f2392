"""Regression problems built from an episode store (docs/architecture.md "Regression problems").

=========  ==========================================================  =======
name       x                                                           y
=========  ==========================================================  =======
walker-1   [qpos[1:], qvel, action] at t                        (23)   qvel at t+1 (9)
walker-2   the walker-1 inputs at t-1 and at t                  (46)   qvel at t+1 (9)
hopper-1   [qpos[1:], qvel, action] at t                        (14)   qvel at t+1 (6)
kuka       [q, qd, qdd] at t                                    (21)   tau at t (7)
arm        [q, qd, qdd] at t of any n-joint arm store             (3n)   tau at t (n)
=========  ==========================================================  =======

The arm problems are defined here; a legged robot's (``walker-1``, ``walker-2``,
``hopper-1``) are registered by its task (:mod:`gpdyn.robots.tasks`), derived from its state
layout, so that stored and live data are encoded by one description.

Samples never cross an episode boundary. The protocols (:data:`PROTOCOLS`) differ in
which samples are held out for testing:

- ``iid``: every sample is in the pool; a seeded 10% of the pool is held out as the
  test split, the other 90% is the training split (SVDGP's protocol, Appendix B).
- ``ordered``: episodes marked offline (per-episode key ``online == 0``, KUKA) form
  the ``init`` split used to initialise a learner; the rest is the pool, streamed in
  time order. A seeded 10% of the pool is held out for testing (the ILGR protocol).
- ``block``: every episode holds out one contiguous block of 10% of its samples, at a
  seeded place. An iid holdout of a densely sampled trajectory (a robot log at hundreds
  of Hz or more) scores rows whose neighbours, a few milliseconds away, are training
  rows, and so measures interpolation between near-copies; a block's rows are that
  close to training rows only at its two ends.
- ``split``: a dataset's own split into files: the episodes of its test files are the
  test split, the others the training split (the store must be imported, its files
  marked by :func:`gpdyn.data.importers.episode_splits`; SARCOS: train on
  ``sarcos_inv.mat``, score on ``sarcos_inv_test.mat``, the protocol of Rasmussen &
  Williams 2006, Table 8.1).
- ``stream``: nothing is held out. Every sample is in the training split in store order
  (episode by episode, each in time order), to be predicted before it is learned
  (:mod:`gpdyn.gp.prequential`). The normalisation statistics come from the first
  ``init_rows`` samples alone, the rows a learner has when it starts: a statistic of the
  whole stream would tell it the future.

Every split keeps time order; minibatches come from :mod:`gpdyn.data.streams` (iid
ones for every protocol but ``ordered``). Normalisation statistics come from the
training (and init) rows only.

The store is read in chunks of whole episodes straight into the preallocated split
arrays, so building a problem needs little beyond the arrays it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpdyn.data.arm_schema import ARM_FIELD_NAMES
from gpdyn.data.importers import TEST, episode_splits
from gpdyn.data.store import EpisodeStore, StoreError
from gpdyn.errors import InputError
from gpdyn.progress import progress_bar

TEST_FRACTION = 0.1
CHUNK_ROWS = 65536  # rows per read and per statistics block
PROTOCOLS = ("iid", "ordered", "block", "split", "stream")
#: stream protocol: the rows the normalisation statistics come from, by default (the learner's init rows)
STREAM_INIT_ROWS = 1024


@dataclass(frozen=True)
class ProblemSpec:
    """How samples are cut from episodes.

    Input rows are ``concat(fields_in)`` (a field may drop leading columns: qpos
    without the x position); ``history`` consecutive input rows are stacked; the
    target is ``field_out`` ``target_shift`` steps after the last input row.
    """

    name: str
    fields_in: tuple[tuple[str, int], ...]  # (field, first column kept)
    field_out: str
    history: int
    target_shift: int
    # every field read, with the width the store must have; None: any width, the same for
    # every such field (an arm's joint count, read from the store)
    widths: tuple[tuple[str, int | None], ...]
    # A field holding the target's value one step later in the same row (Walker2d stores
    # keep ``next_qvel``), so that an episode's last transition is a sample too.
    next_field: str | None = None

    def for_store(self, store: EpisodeStore) -> ProblemSpec:
        """This spec, reading ``next_field`` at shift 0 when the store has it."""
        if self.next_field and self.next_field in store.fields and self.target_shift == 1:
            return replace(self, field_out=self.next_field, target_shift=0, next_field=None)
        return self

    def samples_in_episode(self, length: int) -> int:
        return max(0, length - (self.history - 1) - self.target_shift)


_ARM_IN = (("q", 0), ("qd", 0), ("qdd", 0))
#: the problems by name: the arms' here; each robot task registers its own (:func:`register_problem`,
#: from its state layout: :meth:`gpdyn.robots.layout.StateLayout.problem_spec`)
PROBLEMS: dict[str, ProblemSpec] = {
    "kuka": ProblemSpec("kuka", _ARM_IN, "tau", history=1, target_shift=0, widths=tuple((f, 7) for f in ARM_FIELD_NAMES)),
    "arm": ProblemSpec("arm", _ARM_IN, "tau", history=1, target_shift=0, widths=tuple((f, None) for f in ARM_FIELD_NAMES)),
}


def register_problem(spec: ProblemSpec) -> None:
    """Add ``spec`` to :data:`PROBLEMS`; the same spec again is a no-op, another under a taken name an error."""
    known = PROBLEMS.get(spec.name)
    if known is not None and known != spec:
        raise InputError(f"problem '{spec.name}' is already registered with other fields")
    PROBLEMS[spec.name] = spec


@dataclass
class Normalizer:
    """Per-column mean and standard deviation of the training inputs and outputs."""

    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: np.ndarray
    y_std: np.ndarray

    def normalize_x(self, x: Any) -> Any:
        return (x - _like(self.x_mean, x)) / _like(self.x_std, x)

    def denormalize_x(self, x: Any) -> Any:
        return x * _like(self.x_std, x) + _like(self.x_mean, x)

    def normalize_y(self, y: Any) -> Any:
        return (y - _like(self.y_mean, y)) / _like(self.y_std, y)

    def denormalize_y(self, y: Any) -> Any:
        return y * _like(self.y_std, y) + _like(self.y_mean, y)

    def denormalize_var(self, var: Any) -> Any:
        return var * _like(self.y_std, var) ** 2

    def to_json(self) -> dict[str, list[float]]:
        return {k: getattr(self, k).tolist() for k in ("x_mean", "x_std", "y_mean", "y_std")}

    @classmethod
    def from_json(cls, d: dict[str, list[float]]) -> Normalizer:
        return cls(**{k: np.asarray(v, dtype=np.float64) for k, v in d.items()})


def _like(stat: np.ndarray, ref: Any) -> Any:
    """The statistic as the same kind of array as ``ref`` (numpy or torch on its device)."""
    if isinstance(ref, torch.Tensor):
        return torch.as_tensor(stat, dtype=ref.dtype, device=ref.device)
    return stat


@dataclass
class Problem:
    """A regression problem: raw (unnormalised) float64 splits plus training statistics."""

    name: str
    protocol: str
    seed: int
    source: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    x_init: np.ndarray
    y_init: np.ndarray
    normalizer: Normalizer
    held_out: str = ""  # which samples the test split holds, in words (the protocol's rule)

    @property
    def input_dim(self) -> int:
        return self.x_train.shape[1]

    @property
    def output_dim(self) -> int:
        return self.y_train.shape[1]

    def split(self, which: str) -> tuple[np.ndarray, np.ndarray]:
        if which not in ("train", "test", "init"):
            raise InputError(f"problem {self.name}: no split '{which}' (train, test, init)")
        return getattr(self, f"x_{which}"), getattr(self, f"y_{which}")

    def tensors(
        self,
        which: str,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64,
        normalize: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One split as torch tensors on ``device``, normalised with the training statistics."""
        x, y = self.split(which)
        xt = torch.as_tensor(x, dtype=dtype, device=device)
        yt = torch.as_tensor(y, dtype=dtype, device=device)
        if normalize:
            xt, yt = self.normalizer.normalize_x(xt), self.normalizer.normalize_y(yt)
        return xt, yt

    def as_change_of(self, input_columns: slice) -> Problem:
        """This problem with every target replaced by its change from an input: ``y - x[:, input_columns]``.

        A dynamics model's usual target (PILCO, PETS): for ``walker-1`` the velocity change
        over the step instead of the next velocity. A GP's prior mean then says "the
        velocity persists" away from its data, where a GP on the next velocity reverts to
        the training mean. Output statistics are recomputed.
        """
        width = len(range(self.input_dim)[input_columns])
        if width != self.output_dim:
            raise InputError(f"problem {self.name}: input columns {input_columns} give {width} values for "
                             f"{self.output_dim} targets")
        ys = {split: getattr(self, f"y_{split}") - getattr(self, f"x_{split}")[:, input_columns]
              for split in ("train", "test", "init")}
        names = self.input_names[input_columns]
        y_mean, y_std = _column_stats(ys["train"], ys["init"], CHUNK_ROWS)
        return replace(
            self, name=f"{self.name}/change",
            output_names=tuple(f"{out} - {inp}" for out, inp in zip(self.output_names, names)),
            y_train=ys["train"], y_test=ys["test"], y_init=ys["init"],
            normalizer=Normalizer(self.normalizer.x_mean, self.normalizer.x_std, y_mean, y_std),
        )

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "protocol": self.protocol,
            "seed": self.seed,
            "source": self.source,
            "input_dim": self.input_dim,
            "output_dim": self.output_dim,
            "train": len(self.x_train),
            "test": len(self.x_test),
            "init": len(self.x_init),
            "held_out": self.held_out,
            "inputs": list(self.input_names),
            "outputs": list(self.output_names),
        }


def load_problem(
    store: str | Path | EpisodeStore,
    name: str,
    protocol: str = "iid",
    seed: int = 0,
    chunk_rows: int = CHUNK_ROWS,
    progress: bool = False,
    init_rows: int = STREAM_INIT_ROWS,
) -> Problem:
    """Build problem ``name`` from ``store``, its test split held out under ``protocol`` (seeded);
    ``progress`` shows a bar over the rows read; ``init_rows``: the stream protocol's rows
    of normalisation statistics."""
    if name not in PROBLEMS:
        raise InputError(f"unknown problem '{name}'; choose one of {', '.join(PROBLEMS)} (a robot's problems are "
                         "registered with its task: import gpdyn.robots.tasks)")
    if protocol not in PROTOCOLS:
        raise InputError(f"unknown protocol '{protocol}'; choose one of {', '.join(PROTOCOLS)}")
    if not isinstance(store, EpisodeStore):
        store = EpisodeStore.open(store)
    planned = store.attrs.get("planned_rows")  # set by collectors that know their size in advance
    if isinstance(planned, int) and store.n_rows < planned:
        raise InputError(f"{store.path}: holds {store.n_rows} of its {planned} planned rows: its collection stopped "
                         "early (rerun the same collect command to finish it)")
    base = PROBLEMS[name]
    _check_fields(store, base)
    shift = f"t+{base.target_shift}" if base.target_shift else "t"
    output_names = tuple(f"{c}[{shift}]" for c in store.columns(base.field_out))
    spec = base.for_store(store)

    lengths = store.episode_lengths
    counts = np.array([spec.samples_in_episode(int(n)) for n in lengths], dtype=np.int64)
    if protocol == "ordered" and "online" in store.episode_keys:
        is_init_episode = store.episode_values("online") == 0
    else:
        is_init_episode = np.zeros(store.n_episodes, dtype=bool)
    n_init = int(counts[is_init_episode].sum())
    pool_is_test, held_out = _held_out(store, name, protocol, counts[~is_init_episode], ~is_init_episode, seed)
    n_pool, n_test = len(pool_is_test), int(pool_is_test.sum())
    if protocol == "stream":
        if init_rows < 1:
            raise InputError(f"--init-rows must be >= 1, got {init_rows}")
        if n_pool <= init_rows:
            raise InputError(f"{store.path}: problem {name} has {n_pool} samples, none after the {init_rows} init rows "
                             "of the stream protocol (lower --init-rows)")
    elif n_pool - n_test < 1 or n_test < 1:
        lengths_text = f"lengths {lengths.min() if lengths.size else 0}..{lengths.max() if lengths.size else 0}"
        raise InputError(
            f"{store.path}: problem {name} under protocol {protocol} has {n_pool} samples to split, {n_test} of them "
            f"held out; it needs at least 10 (block: an episode of at least 10) ({store.n_episodes} episodes, {lengths_text})"
        )

    in_width = sum(store.fields[f].width - first for f, first in spec.fields_in)
    x_width = in_width * spec.history
    y_width = store.fields[spec.field_out].width
    arrays = {
        split: (np.empty((n, x_width)), np.empty((n, y_width)))
        for split, n in (("train", n_pool - n_test), ("test", n_test), ("init", n_init))
    }
    filled = {"train": 0, "test": 0, "init": 0}
    pool_pos = 0
    bar = progress_bar(total=int(lengths.sum()), desc=f"load {name}", unit="row", unit_scale=True, leave=False,
               disable=not progress)
    for first, last in _episode_chunks(lengths, chunk_rows):
        x_chunk, y_chunk, chunk_counts = _read_samples(store, spec, first, last)
        bar.update(int(lengths[first:last].sum()))
        offset = 0
        for ep, n in zip(range(first, last), chunk_counts):
            xs, ys = x_chunk[offset : offset + n], y_chunk[offset : offset + n]
            offset += n
            if is_init_episode[ep]:
                _put(arrays["init"], filled, "init", xs, ys)
                continue
            test_mask = pool_is_test[pool_pos : pool_pos + n]
            pool_pos += n
            _put(arrays["test"], filled, "test", xs[test_mask], ys[test_mask])
            _put(arrays["train"], filled, "train", xs[~test_mask], ys[~test_mask])
    bar.close()

    x_train, y_train = arrays["train"]
    x_init, y_init = arrays["init"]
    if protocol == "stream":  # the statistics a learner has when it starts, nothing later
        x_stats, y_stats = x_train[:init_rows], y_train[:init_rows]
    else:
        x_stats, y_stats = x_train, y_train
    normalizer = Normalizer(
        *_column_stats(x_stats, x_init, chunk_rows), *_column_stats(y_stats, y_init, chunk_rows)
    )
    return Problem(
        name=name,
        protocol=protocol,
        seed=seed,
        source=str(store.path),
        input_names=_input_names(store, spec),
        output_names=output_names,
        x_train=x_train,
        y_train=y_train,
        x_test=arrays["test"][0],
        y_test=arrays["test"][1],
        x_init=x_init,
        y_init=y_init,
        normalizer=normalizer,
        held_out=held_out,
    )


def _held_out(
    store: EpisodeStore, name: str, protocol: str, counts: np.ndarray, in_pool: np.ndarray, seed: int
) -> tuple[np.ndarray, str]:
    """Which pool samples (those of the episodes ``in_pool``, ``counts`` samples each, in
    store order) are test samples under ``protocol``, and the rule in words."""
    n_pool = int(counts.sum())
    rng = np.random.default_rng(seed)
    is_test = np.zeros(n_pool, dtype=bool)
    if protocol == "stream":
        return is_test, "nothing: every sample is predicted before it is learned, in store order"
    if protocol in ("iid", "ordered"):
        n_test = int(round(TEST_FRACTION * n_pool))
        if 0 < n_test < n_pool:
            is_test[rng.choice(n_pool, size=n_test, replace=False)] = True
        return is_test, f"a seeded {TEST_FRACTION:.0%} of the samples"
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    if protocol == "block":
        for start, n in zip(starts, counts):
            k = int(round(TEST_FRACTION * int(n)))
            first = int(rng.integers(0, int(n) - k + 1))
            is_test[start + first : start + first + k] = True
        return is_test, f"one contiguous block of {TEST_FRACTION:.0%} of each episode's samples, at a seeded place"
    try:
        splits = episode_splits(store)[in_pool]
    except InputError as err:
        raise InputError(f"protocol split (a dataset's own train and test files): {err}") from err
    for start, n, split in zip(starts, counts, splits):
        is_test[start : start + int(n)] = split == TEST
    files = [e["file"] for e in store.attrs["imported_files"]]
    if not (splits == TEST).any() or (splits == TEST).all():
        missing = "test" if not (splits == TEST).any() else "training"
        raise InputError(f"{store.path}: protocol split for problem {name} needs a {missing} file; the store was "
                         f"imported from {', '.join(files)}")
    test_files = [e["file"] for e in store.attrs["imported_files"] if e.get("split") == TEST]
    return is_test, f"the dataset's test file(s) {', '.join(test_files) or '(marked online)'}"


def _check_fields(store: EpisodeStore, spec: ProblemSpec) -> None:
    widths = dict(spec.widths)
    if spec.next_field and spec.next_field in store.fields:
        widths[spec.next_field] = widths[spec.field_out]
    shared: tuple[str, int] | None = None  # the first field of free width, and its width
    for field, width in widths.items():
        if field not in store.fields:
            raise StoreError(f"{store.path}: problem {spec.name} needs field '{field}', the store has {sorted(store.fields)}")
        have = store.fields[field].width
        if width is None:
            if shared is None:
                shared = (field, have)
                continue
            width = shared[1]
        if have != width:
            also = f" (as '{shared[0]}')" if shared is not None and widths[field] is None else ""
            raise StoreError(
                f"{store.path}: problem {spec.name} needs field '{field}' of width {width}{also}, the store's has {have}"
            )


def _episode_chunks(lengths: np.ndarray, chunk_rows: int):
    """Ranges of whole episodes ``[first, last)`` of about ``chunk_rows`` rows each."""
    first, rows = 0, 0
    for i, n in enumerate(lengths):
        rows += int(n)
        if rows >= chunk_rows:
            yield first, i + 1
            first, rows = i + 1, 0
    if first < len(lengths):
        yield first, len(lengths)


def _read_samples(
    store: EpisodeStore, spec: ProblemSpec, first: int, last: int
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Samples of episodes ``first..last-1`` (one contiguous read per field)."""
    starts, ends = store.episode_starts, store.episode_ends
    row0, row1 = int(starts[first]), int(ends[last - 1])
    features = np.concatenate(
        [store.read(f, row0, row1)[:, col:].astype(np.float64, copy=False) for f, col in spec.fields_in], axis=1
    )
    target = store.read(spec.field_out, row0, row1).astype(np.float64, copy=False)
    xs, ys, counts = [], [], []
    for ep in range(first, last):
        a, b = int(starts[ep]) - row0, int(ends[ep]) - row0
        n = spec.samples_in_episode(b - a)
        counts.append(n)
        if n == 0:
            continue
        lo = a + spec.history - 1  # the last input row of the first sample
        stacked = [features[lo - lag : lo - lag + n] for lag in reversed(range(spec.history))]
        xs.append(np.concatenate(stacked, axis=1) if spec.history > 1 else stacked[0])
        ys.append(target[lo + spec.target_shift : lo + spec.target_shift + n])
    width_x = features.shape[1] * spec.history
    x = np.concatenate(xs) if xs else np.empty((0, width_x))
    y = np.concatenate(ys) if ys else np.empty((0, target.shape[1]))
    return x, y, counts


def _put(arrays: tuple[np.ndarray, np.ndarray], filled: dict[str, int], split: str, xs: np.ndarray, ys: np.ndarray) -> None:
    i = filled[split]
    arrays[0][i : i + len(xs)] = xs
    arrays[1][i : i + len(ys)] = ys
    filled[split] = i + len(xs)


def _column_stats(train: np.ndarray, init: np.ndarray, chunk_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std per column over train and init rows, two passes by chunks (no full copies)."""
    n = len(train) + len(init)
    blocks = [a[i : i + chunk_rows] for a in (train, init) for i in range(0, len(a), chunk_rows)]
    mean = sum(b.sum(axis=0) for b in blocks) / n
    var = sum(((b - mean) ** 2).sum(axis=0) for b in blocks) / max(n - 1, 1)
    std = np.sqrt(var)
    # a constant column (e.g. an unused actuator) must not divide by zero
    return mean, np.where(std > 1e-12, std, 1.0)


def _input_names(store: EpisodeStore, spec: ProblemSpec) -> tuple[str, ...]:
    row = [c for f, first in spec.fields_in for c in store.columns(f)[first:]]
    if spec.history == 1:
        return tuple(f"{c}[t]" for c in row)
    return tuple(f"{c}[t-{lag}]" if lag else f"{c}[t]" for lag in reversed(range(spec.history)) for c in row)


__all__ = ["PROBLEMS", "PROTOCOLS", "Normalizer", "Problem", "ProblemSpec", "load_problem", "register_problem"]
