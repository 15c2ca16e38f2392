"""Resumable runs: the one mechanism by which ``gpdyn learn`` and ``gpdyn replay`` continue.

A run folder of either job records in ``config.json`` the settings that decide its numbers
and the identity of the store it read (``store_identity``,
:meth:`gpdyn.data.store.EpisodeStore.identity`). Running the same command again with
``--out`` on the folder of a stopped run (:func:`open_run`) takes the folder back when
both match: other settings, or another store at the same path (replaced, appended to,
rewritten), are refused naming what differs.

Training goes in segments that each end with an evaluation (:func:`segments`). After
each, :func:`train` logs the evaluation record and then saves the learner, its stream
position and the record in the learner's checkpoint; a resumed learner continues from
its last checkpoint with no repeated work and the same numbers. A run killed between
the log and the save repeats that one segment; readers keep the last record per
iteration. When everything is done the job marks the folder finished
(:meth:`gpdyn.runs.RunDir.finish`).
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from gpdyn.data.streams import IIDStream, OrderedStream
from gpdyn.errors import InputError
from gpdyn.gp import Learner
from gpdyn.gp.online import load_learner, run_online, save_learner
from gpdyn.runs import COMPLETION_KEY, FINISHED_FILE, RunDir, is_run_dir

log = logging.getLogger(__name__)

#: the config key of the identity of the store a run read
STORE_IDENTITY = "store_identity"
#: the extras of a checkpoint that resuming reads (gpdyn.gp.online.load_learner checks them)
RESUME_KEYS = {"segments": int, "iteration": int, "seconds": (int, float), "record": dict}


class Phase:
    """One stretch of iterations fed by one stream (a replay's init, or the main phase)."""

    def __init__(self, name: str, iterations: int, make_stream: Callable[[], IIDStream | OrderedStream]):
        self.name, self.iterations, self.make_stream = name, iterations, make_stream


def segments(phases: list[Phase], eval_every: int) -> list[tuple[int, Phase, int]]:
    """(phase index, phase, iterations) per segment; an evaluation closes every segment."""

    def each() -> Iterator[tuple[int, Phase, int]]:
        for i, phase in enumerate(phases):
            done = 0
            while done < phase.iterations:
                n = min(eval_every, phase.iterations - done)
                yield i, phase, n
                done += n

    return list(each())


def store_identity(store: str | Path) -> dict[str, Any]:
    """The identity of the store at ``store`` now."""
    from gpdyn.data.store import EpisodeStore

    return EpisodeStore.open(store).identity()


def check_store(run: RunDir, store: str | Path) -> None:
    """Refuse to continue ``run`` on a store other than the one it read (same path, other content).

    A run folder made before identities were recorded cannot be checked: it is warned
    about, and the identity found now is recorded for the next time.
    """
    config = run.config()
    if config.get(STORE_IDENTITY) is None:
        found = store_identity(store)
        warnings.warn(f"{run.path}: made before runs recorded their store's identity; cannot check that {store} "
                      f"is the store it read (recording {found} now)", stacklevel=3)
        run.write_json("config.json", {**config, STORE_IDENTITY: found})
        return
    check_recorded_store(run.path, store, "Continue that run with the original store, or start a new run with "
                                          "another --out")


def check_recorded_store(run_dir: str | Path, store: str | Path, advice: str) -> None:
    """Refuse ``store`` when the run in ``run_dir`` read a store of another identity from it
    (``advice`` says what to do instead); a run that recorded none is not checked."""
    recorded = RunDir(run_dir).config().get(STORE_IDENTITY)
    if recorded is None:
        return
    found = store_identity(store)
    if _plain(recorded) != _plain(found):
        raise InputError(
            f"{store}: not the store the run in {run_dir} read (recorded identity {recorded}, found {found}): "
            f"the store at this path was replaced or changed since. {advice}"
        )


def _plain(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples as lists, dataclasses' dicts compared by content)."""
    return json.loads(json.dumps(value, default=str))


def open_run(
    job: str,
    out: str | Path | None,
    settings: Mapping[str, Any],
    new_config: Callable[[], dict[str, Any]],
    *,
    saved_settings: Callable[[dict[str, Any]], Mapping[str, Any] | None],
    store: str | Path,
    unordered: tuple[str, ...] = (),
) -> RunDir:
    """A new run folder of ``job`` (config ``new_config()``), or the stopped one at ``out``.

    The folder at ``out`` is taken back when it holds a ``job`` run whose settings
    (``saved_settings(config)``) equal ``settings`` (lists named in ``unordered`` compared
    as sets) and whose store has the identity recorded; anything else is an InputError
    saying what differs and to use another ``--out``.
    """
    if out is not None and is_run_dir(out):
        run = RunDir.resume(out)  # its writer lock: a second run on one --out is refused here
        try:
            config = run.config()
            if config.get("job", job) != job:
                raise InputError(f"{out}: holds a {config.get('job')} run, not a {job}; use another --out")
            saved = saved_settings(config)
            if saved is None:
                raise InputError(f"{out}: holds a {job} run made before runs could be continued; use another --out")
            mine, saved = _plain(dict(settings)), _plain(dict(saved))
            for key in unordered:  # e.g. replay's learners: each has its own stream, their order decides no number
                mine[key], saved[key] = sorted(mine.get(key) or []), sorted(saved.get(key) or [])
            if saved != mine:
                diff = sorted(k for k in mine if saved.get(k) != mine[k])
                raise InputError(f"{out}: holds a {job} with other settings ({', '.join(diff)}); use another --out")
            check_store(run, store)
        except BaseException:
            run.close()
            raise
        state = "finished" if run.finished() is not None else "resuming"
        log.info(f"{job} run in {out}: {state}")
        return run
    config = {**new_config(), STORE_IDENTITY: store_identity(store), COMPLETION_KEY: FINISHED_FILE}
    return RunDir.create(job, config, out)


def _stream_state(stream: IIDStream | OrderedStream) -> dict[str, Any]:
    return stream.state_dict() if isinstance(stream, IIDStream) else {"position": stream.position}


def _load_stream_state(stream: IIDStream | OrderedStream, state: Any, checkpoint: Path) -> None:
    try:
        if isinstance(stream, IIDStream):
            stream.load_state_dict(state)
        else:
            stream.position = int(state["position"])
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as err:  # a damaged checkpoint: say where
        raise InputError(f"{checkpoint}: extra 'stream' is damaged ({type(err).__name__}: {err})") from err


def train(
    name: str,
    make: Callable[[], Learner],
    plan: list[tuple[int, Phase, int]],
    checkpoint: Path,
    run: RunDir,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    *,
    device: str | torch.device,
    dtype: torch.dtype,
    bar: tqdm,
    prior_test: torch.Tensor | None = None,
    extra: Mapping[str, Any] | None = None,
    on_checkpoint: Callable[[str, int], None] | None = None,
) -> tuple[Learner, dict[str, Any] | None]:
    """Run (or continue from ``checkpoint``) the segments of ``plan`` for one learner; return
    it and its last evaluation record (None for an empty plan).

    ``make()`` builds the learner when there is no checkpoint yet. After each segment the
    record (``kind: "eval"``, ``learner``, ``phase``, cumulative ``iteration`` and training
    ``seconds``) is logged and the learner saved at ``checkpoint`` with ``extra`` beside its
    resume state; ``on_checkpoint(name, iteration)`` is called after each save.
    """
    if checkpoint.exists():
        learner, state = load_learner(checkpoint, device=device, dtype=dtype, extra_keys=RESUME_KEYS)
        done_segments, iteration, seconds = state["segments"], state["iteration"], state["seconds"]
        final: dict[str, Any] | None = state["record"]
    else:
        learner = make()
        done_segments, iteration, seconds, state, final = 0, 0, 0.0, {}, None
    bar.update(iteration)
    stream, stream_phase = None, -1
    for k, (phase_index, phase, n) in enumerate(plan):
        if k < done_segments:
            continue
        if phase_index != stream_phase:
            stream, stream_phase = phase.make_stream(), phase_index
            if state.get("phase") == phase_index:
                _load_stream_state(stream, state.get("stream"), checkpoint)
        bar.set_description(f"{name} ({phase.name})")
        # N_Delta and N are the learner's own, from make() or its checkpoint's config
        record = run_online(learner, stream, x_test, y_test, iterations=n, eval_every=n, bar=bar,
                            prior_test=prior_test)[-1]
        iteration += n
        seconds += record["elapsed_s"]  # training time only: taken before the evaluation
        record = {**record, "kind": "eval", "learner": name, "phase": phase.name, "iteration": iteration,
                  "seconds": seconds}
        # logged before the checkpoint: a crash in between repeats this segment on resume,
        # and readers keep the last record per (learner, iteration)
        run.log(**record)
        state = {"segments": k + 1, "iteration": iteration, "seconds": seconds, "phase": phase_index,
                 "stream": _stream_state(stream), "record": record}
        save_learner(learner, checkpoint, **(extra or {}), **state)
        final = record
        if on_checkpoint is not None:
            on_checkpoint(name, iteration)
    return learner, final


__all__ = ["Phase", "RESUME_KEYS", "STORE_IDENTITY", "check_recorded_store", "check_store", "open_run", "segments", "store_identity", "train"]
