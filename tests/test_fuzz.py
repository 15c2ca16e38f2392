"""Fuzz suite: bad input of every kind is refused clearly, never with a traceback, never accepted, never hung.

Each generated case feeds one bad input to the ``gpdyn`` command (in-process, ``gpdyn.cli.main``)
or to the Python API, and :func:`outcome` classifies what happened:

- ``clear``: exit status 2 (the command) or the documented exception (the API: InputError and
  its subclasses), with a message that names every fragment the case lists (the file, field,
  key or option at fault);
- ``unclear``: refused, but the message misses a fragment;
- ``traceback``: any other exception or exit status, or a traceback in the output;
- ``silent``: the input was accepted (exit 0, or no exception);
- ``hang``: still running after :data:`TIMEOUT` seconds.

Every case must be ``clear``. The areas: command-line options, checkpoints, policy files,
stores (their chunks and attributes), imported files, learner tensors, run folders, and
data that names code (security). The world the cases damage copies of (a tiny arm store, a
walker store, a ``gpdyn learn`` run, a replay run, a policy file, one checkpoint per
learner) is built once per module.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zarr
from synthetic import make_kuka_store

from gpdyn.cli import main
from gpdyn.data.store import EpisodeStore
from gpdyn.errors import InputError
from gpdyn.gp import LEARNERS, make_learner
from gpdyn.gp.online import load_learner, save_learner
from gpdyn.robots.policy import load_policy, save_policy
from gpdyn.sim.legged import legged_fields
from gpdyn.robots.walker import WALKER

TIMEOUT = 30  # seconds a case may take before it counts as a hang
ARM_XML = Path(__file__).parent / "data" / "three_link_arm.xml"
TENSOR_LEARNERS = sorted(n for n in LEARNERS if n != "residual")  # residual needs a prior: its own cases


class Hang(Exception):
    """Raised by the alarm of :func:`_deadline`."""


@contextlib.contextmanager
def _deadline(seconds: int):
    def ring(signum, frame):
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------------------- the world
@dataclass
class World:
    """What the cases damage copies of (paths under ``root``)."""

    root: Path
    kuka: Path = field(init=False)
    walker: Path = field(init=False)
    learn_run: Path = field(init=False)
    replay_run: Path = field(init=False)
    policy: Path = field(init=False)
    checkpoints: dict[str, Path] = field(default_factory=dict)
    _count: int = 0

    def fresh(self, name: str) -> Path:
        """A new, empty path under the world (one per case)."""
        self._count += 1
        folder = self.root / "cases" / f"{self._count:04d}"
        folder.mkdir(parents=True)
        return folder / name

    def copy(self, source: Path) -> Path:
        """A private copy of ``source`` (a file or a folder) for one case to damage."""
        target = self.fresh(source.name)
        (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
        return target


def _walker_store(path: Path, env_id: str = "Walker2d-v5") -> Path:
    fields = legged_fields(WALKER)
    store = EpisodeStore.create(path, fields, source="fuzz", env_id=env_id, dt=0.008, seed=0)
    rng = np.random.default_rng(0)
    store.append_episode({k: rng.normal(size=(6, f.width)).astype(f.dtype) for k, f in fields.items()})
    return path


def _toy_policy(path: Path, **overrides: Any) -> Path:
    net = torch.nn.Sequential(torch.nn.Linear(17, 8), torch.nn.Tanh(), torch.nn.Linear(8, 6))
    kwargs = dict(hidden=[8], activation="tanh", obs_mean=np.zeros(17), obs_var=np.ones(17), clip_obs=10.0,
                  epsilon=1e-8, act_low=-np.ones(6), act_high=np.ones(6), env_id="Walker2d-v5")
    kwargs.update(overrides)
    return save_policy(path, net.state_dict(), **kwargs)


REPLAY_ARGS = ["--problem", "kuka", "--learners", "svi", "--iterations", "4", "--batch-size", "16", "--eval-every", "2",
               "--preset", "small"]


def build_world(root: Path) -> World:
    world = World(root)
    world.kuka = make_kuka_store(root / "kuka.zarr", offline=[50], online=[80, 70]).path
    world.walker = _walker_store(root / "walker.zarr")
    world.policy = _toy_policy(root / "policy.pt")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=gen, dtype=torch.float64)
    y = torch.stack([x.sin().sum(-1), x.cos().sum(-1)], -1)
    for name in TENSOR_LEARNERS:
        learner = make_learner(name, 3, 2, preset="small")
        learner.observe(x, y)
        learner.step(x, y)
        world.checkpoints[name] = save_learner(learner, root / f"{name}.pt", note="fuzz")
    # the runs come from a child process: a run folder's writer lock lasts as long as its process
    world.learn_run, world.replay_run = root / "learnrun", root / "replayrun"
    script = (
        "import sys; from gpdyn.cli import main\n"
        f"assert main(['learn', '--store', {str(world.kuka)!r}, '--problem', 'kuka', '--learner', 'svi', '--iterations', "
        f"'2', '--batch-size', '16', '--eval-every', '2', '--preset', 'small', '--out', {str(world.learn_run)!r}]) == 0\n"
        f"assert main(['replay', '--store', {str(world.kuka)!r}, *{REPLAY_ARGS!r}, '--out', {str(world.replay_run)!r}]) == 0\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, cwd=root, timeout=300)
    return world


# ---------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    """One bad input: ``run(world)`` returns an exit status (``cli``) or raises; ``names`` must
    all appear in the message."""

    id: str
    area: str
    run: Callable[[World], Any]
    names: tuple[str, ...]
    cli: bool = True


def outcome(case: Case, world: World) -> tuple[str, str]:
    """(status, message) of one case: clear, unclear, traceback, silent or hang (module docs)."""
    err, out = io.StringIO(), io.StringIO()
    result: Any = None
    message = ""
    try:
        with _deadline(TIMEOUT), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            result = case.run(world)
    except Hang as hang:
        return "hang", str(hang)
    except InputError as refused:
        if case.cli:  # main() turns every InputError into exit 2: one escaping it is a bug
            return "traceback", "".join(traceback.format_exception(refused))
        message = str(refused)
    except BaseException as crash:  # noqa: BLE001 - a traceback is what the suite counts
        return "traceback", "".join(traceback.format_exception(crash))
    else:
        if not case.cli:
            return "silent", f"accepted, returned {result!r}"
        message = err.getvalue()
        if "Traceback (most recent call last)" in message:
            return "traceback", message
        if result == 0:
            return "silent", f"exit 0: {out.getvalue()[-300:]}"
        if result != 2:
            return "traceback", f"exit {result}: {message[-500:]}"
    missing = [n for n in case.names if n not in message]
    return ("unclear", f"missing {missing}: {message[-500:]}") if missing else ("clear", message)


def _cli(argv_of: Callable[[World], list[str]]) -> Callable[[World], int]:
    return lambda w: main([str(a) for a in argv_of(w)])


CASES: list[Case] = []


def case(id: str, area: str, run: Callable[[World], Any], *names: str, cli: bool = True) -> None:
    assert all(c.id != id for c in CASES), id
    CASES.append(Case(id, area, run, tuple(names), cli))


# -- options: every numeric option of every command, and the names ------------------------------------
def _control(robot: str) -> Callable[[World], list[str]]:
    extra = ["--model", ARM_XML] if robot == "arm" else []
    return lambda w: ["control", robot, "--learner", "svdgp", *extra, "--out", w.fresh("run")]


COMMANDS: dict[str, Callable[[World], list[str]]] = {
    "control-walker": _control("walker"),
    "control-kuka": _control("kuka"),
    "control-arm": _control("arm"),
    "collect-walker": lambda w: ["collect", "walker", "--store", w.fresh("s.zarr"), "--episodes", "1"],
    "collect-kuka": lambda w: ["collect", "kuka", "--store", w.fresh("s.zarr"), "--offline", "20", "--online", "20"],
    "collect-arm": lambda w: ["collect", "arm", "--model", ARM_XML, "--store", w.fresh("s.zarr"), "--offline", "20",
                              "--online", "20"],
    "learn": lambda w: ["learn", "--store", w.kuka, "--problem", "kuka", "--learner", "svi", "--iterations", "2",
                        "--batch-size", "16", "--preset", "small", "--out", w.fresh("run")],
    "replay": lambda w: ["replay", "--store", w.kuka, "--problem", "kuka", "--learners", "svi", "--iterations", "2",
                         "--batch-size", "16", "--preset", "small", "--out", w.fresh("run")],
    "bench-mpc": lambda w: ["bench", "mpc", "--out", w.fresh("run")],
    "render": lambda w: ["render", "--store", w.walker, "--episode", "0", "--out", w.fresh("v.mp4")],
}

# (command, option, bad values): refused by the option's type, before any work
OPTION_VALUES: list[tuple[str, str, tuple[str, ...]]] = [
    ("control-walker", "--steps", ("0", "-3", "2.5")),
    ("control-walker", "--seed", ("-1", "4294967296", "abc")),
    ("control-walker", "--change-at", ("-1",)),
    ("control-walker", "--pretrain-iterations", ("-1",)),
    ("control-walker", "--episodes", ("0",)),
    ("control-walker", "--track-offset-weight", ("-1", "nan")),
    ("control-walker", "--samples", ("0", "1")),
    ("control-walker", "--sim-samples", ("0",)),
    ("control-walker", "--horizon", ("0",)),
    ("control-walker", "--noise-std", ("0", "nan")),
    ("control-walker", "--temperature", ("0", "inf")),
    ("control-walker", "--control-cost", ("1.5", "-0.1")),
    ("control-walker", "--proposal-tail", ("-1",)),
    ("control-walker", "--var-weight", ("-1",)),
    ("control-walker", "--change-factor", ("0", "-2")),
    ("control-walker", "--residual-gate-z", ("-1",)),
    ("control-walker", "--residual-forget", ("0", "2")),
    ("control-walker", "--learner", ("nosuch",)),
    ("control-walker", "--scale", ("huge",)),
    ("control-walker", "--dtype", ("float16",)),
    ("control-walker", "--planner", ("ilqr",)),
    ("control-kuka", "--steps", ("1", "0")),
    ("control-kuka", "--payload", ("-1", "nan")),
    ("control-kuka", "--speed", ("0", "-1")),
    ("control-kuka", "--seed", ("-1",)),
    ("control-kuka", "--damping", ("-1", "1,,2", "x")),
    ("control-kuka", "--family", ("nosuch",)),
    ("control-arm", "--velocity-limits", ("0", "-1,2,3")),
    ("control-arm", "--armature", ("-0.5",)),
    ("collect-walker", "--episodes", ("0", "-1")),
    ("collect-walker", "--envs", ("0", "100000")),
    ("collect-walker", "--noise", ("-1", "nan")),
    ("collect-walker", "--seed", ("-1",)),
    ("collect-kuka", "--offline", ("-1",)),
    ("collect-kuka", "--online", ("-5",)),
    ("collect-kuka", "--rate", ("0", "-100")),
    ("collect-kuka", "--torque-noise", ("-1",)),
    ("collect-kuka", "--position-noise", ("nan",)),
    ("collect-kuka", "--payload", ("-2",)),
    ("collect-kuka", "--derivatives", ("spline",)),
    ("collect-arm", "--friction", ("-1",)),
    ("learn", "--iterations", ("0",)),
    ("learn", "--batch-size", ("0",)),
    ("learn", "--n-delta", ("0",)),
    ("learn", "--eval-every", ("0",)),
    ("learn", "--seed", ("-1",)),
    ("learn", "--preset", ("nosuch",)),
    ("learn", "--problem", ("nosuch",)),
    ("learn", "--size", ("noequals",)),
    ("replay", "--learners", ("nosuch",)),
    ("replay", "--init-iterations", ("0",)),
    ("replay", "--eval-rows", ("0",)),
    ("replay", "--select-lr", ("0", "-1,0.1", "abc")),
    ("replay", "--select-iterations", ("0",)),
    ("replay", "--size", ("nosuch.m=3",)),
    ("bench-mpc", "--samples", ("0", "1")),
    ("bench-mpc", "--horizon", ("0",)),
    ("bench-mpc", "--repeats", ("0",)),
    ("render", "--episode", ("x",)),
]
for command, option, values in OPTION_VALUES:
    for value in values:
        case(f"option:{command}:{option}={value}", "options",
             _cli(lambda w, c=command, o=option, v=value: [*COMMANDS[c](w), o, v]), option)

# options whose values parse but do not fit: checked before any work, naming the option
SEMANTIC: list[tuple[str, str, list[str], tuple[str, ...]]] = [
    ("device-meta", "control-walker", ["--device", "meta"], ("--device", "meta")),
    ("device-junk", "learn", ["--device", "xyz"], ("--device", "xyz")),
    ("device-cuda-index", "learn", ["--device", "cuda:9"], ("--device", "cuda:9")),
    ("threads-0", "learn", ["--threads", "0"], ("--threads",)),
    ("threads-huge", "control-walker", ["--threads", "100000"], ("--threads", "100000")),
    ("threads-negative", "bench-mpc", ["--threads", "-4"], ("--threads",)),
    ("walker-change-after-steps", "control-walker", ["--steps", "10", "--change-at", "10"], ("--change-at",)),
    ("walker-controllers", "control-walker", ["--controllers", "trpo,bogus"], ("controllers", "bogus")),
    ("walker-conditions", "control-walker", ["--conditions", "windy"], ("conditions", "windy")),
    ("walker-horizon-past-episode", "control-walker", ["--horizon", "5000"], ("horizon", "5000")),
    ("walker-steps-past-episode", "control-walker", ["--steps", "5000"], ("steps", "5000")),
    ("walker-samples-memory", "control-walker", ["--samples", "100000000"], ("samples=100000000", "GiB")),
    ("walker-sim-samples-memory", "control-walker", ["--sim-samples", "1000000000"], ("samples=1000000000", "GiB")),
    ("walker-track-terminal", "control-walker", ["--cost", "track", "--terminal-value"], ("--terminal-value",)),
    ("walker-store-missing", "control-walker", ["--store", "/nonexistent/w.zarr"], ("/nonexistent/w.zarr",)),
    ("kuka-steps-memory", "control-kuka", ["--steps", "1000000000000"], ("--steps", "GiB")),
    ("kuka-change-after-steps", "control-kuka", ["--steps", "10", "--change-at", "12"], ("--change-at",)),
    ("kuka-controllers", "control-kuka", ["--controllers", "pd,ilc"], ("controllers", "ilc")),
    ("kuka-from-run-missing", "control-kuka", ["--from-run", "/nonexistent/run"], ("--from-run", "/nonexistent/run")),
    ("kuka-joint-terms-count", "control-kuka", ["--damping", "1,2"], ("damping",)),
    ("arm-model-missing", "control-arm", ["--model", "/nonexistent/arm.xml"], ("/nonexistent/arm.xml",)),
    ("bench-samples-memory", "bench-mpc", ["--samples", "100000000"], ("samples=100000000", "GiB")),
    ("bench-models", "bench-mpc", ["--models", "svdgp,nosuch"], ("nosuch",)),
    ("learn-jitter-negative", "learn", ["--size", "jitter=-1"], ("jitter", "-1")),
    ("learn-lr-nan", "learn", ["--size", "lr=nan"], ("lr", "nan")),
    ("learn-lr-zero", "learn", ["--size", "lr=0"], ("lr",)),
    ("learn-size-unknown", "learn", ["--size", "bogus=1"], ("bogus",)),
    ("learn-size-text", "learn", ["--size", "m=abc"], ("m",)),
    ("learn-eval-chunk-zero", "learn", ["--size", "eval_chunk=0"], ("eval_chunk",)),
    ("learn-store-missing", "learn", ["--store", "/nonexistent/k.zarr"], ("/nonexistent/k.zarr",)),
    ("replay-learner-twice", "replay", ["--learners", "svi,svi"], ("svi",)),
    ("replay-size-negative-jitter", "replay", ["--size", "svi.jitter=-1"], ("jitter",)),
    ("render-episode-range", "render", ["--episode", "99"], ("episode 99",)),
    ("render-suffix", "render", ["--out", "/tmp/video.txt"], ("video.txt", ".mp4")),
    ("collect-kuka-no-samples", "collect-kuka", ["--offline", "0", "--online", "0"], ("offline",)),
    ("collect-kuka-memory", "collect-kuka", ["--online", "1000000000000"], ("--online 1000000000000", "GiB")),
    ("collect-arm-memory", "collect-arm", ["--offline", "1000000000000"], ("--offline 1000000000000", "GiB")),
    ("collect-walker-policy-missing", "collect-walker", ["--policy", "/nonexistent/p.pt"], ("/nonexistent/p.pt",)),
]
for name, command, extra, names in SEMANTIC:
    case(f"semantic:{name}", "options", _cli(lambda w, c=command, e=extra: [*COMMANDS[c](w), *e]), *names)


# -- checkpoints: load_learner on damaged files, and the commands that resume from them ------------------
def _load_damaged(name: str, damage: Callable[[dict], Any]) -> Callable[[World], Any]:
    def run(w: World) -> Any:
        ckpt = torch.load(w.checkpoints[name], weights_only=True)
        damage(ckpt)
        path = w.fresh(f"{name}.pt")
        torch.save(ckpt, path)
        return load_learner(path)

    return run


def _first_float(state: dict) -> tuple[dict, str]:
    """The dict and key of the first floating tensor in a state (depth first)."""
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
            return state, key
        if isinstance(value, dict):
            found = _first_float(value)
            if found[1]:
                return found
    return state, ""


def _poison(ckpt: dict, value: float) -> None:
    holder, key = _first_float(ckpt["state"])
    holder[key].view(-1)[0] = value


def _shape(ckpt: dict) -> None:
    holder, key = _first_float(ckpt["state"])
    holder[key] = torch.zeros(*holder[key].shape, 2, dtype=holder[key].dtype)


CHECKPOINT_DAMAGE: list[tuple[str, Callable[[dict], Any], tuple[str, ...]]] = [
    ("nan-parameter", lambda c: _poison(c, float("nan")), ("NaN or inf",)),
    ("inf-parameter", lambda c: _poison(c, float("inf")), ("NaN or inf",)),
    ("wrong-shape", _shape, ("shape",)),
    ("dtype-float13", lambda c: c.__setitem__("dtype", "float13"), ("dtype", "float13")),
    ("unknown-learner", lambda c: c.__setitem__("learner", "nosuch"), ("nosuch",)),
    ("learner-not-text", lambda c: c.__setitem__("learner", 7), ("learner",)),
    ("config-not-dict", lambda c: c.__setitem__("config", [1, 2]), ("config",)),
    ("config-no-input-dim", lambda c: c["config"].pop("input_dim"), ("input_dim",)),
    ("config-nan-option", lambda c: c["config"].__setitem__("seed", float("nan")), ("config.seed",)),
    ("config-unknown-option", lambda c: c["config"].__setitem__("bogus", 1), ("bogus",)),
    ("state-not-dict", lambda c: c.__setitem__("state", "x"), ("state",)),
    ("extra-not-dict", lambda c: c.__setitem__("extra", [1]), ("extra",)),
    ("format-1", lambda c: c.__setitem__("format", 1), ("format",)),
    ("missing-learner-key", lambda c: c.pop("learner"), ("learner",)),
]
for learner in TENSOR_LEARNERS:
    for damage_name, damage, names in CHECKPOINT_DAMAGE:
        case(f"checkpoint:{learner}:{damage_name}", "checkpoints", _load_damaged(learner, damage),
             f"{learner}.pt", *names, cli=False)
for learner in ("svdgp", "exact", "wiski"):  # every state key, missing
    for key in make_learner(learner, 3, 2, preset="small").state_names():
        case(f"checkpoint:{learner}:missing-{key}", "checkpoints",
             _load_damaged(learner, lambda c, k=key: c["state"].pop(k)), f"{learner}.pt", key, cli=False)


def _file_bytes(name: str, data: bytes) -> Callable[[World], Any]:
    def run(w: World) -> Any:
        path = w.fresh(name)
        path.write_bytes(data)
        return load_learner(path)

    return run


def _truncated(w: World) -> Any:
    path = w.copy(w.checkpoints["svi"])
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return load_learner(path)


case("checkpoint:truncated", "checkpoints", _truncated, "svi.pt", "not a gpdyn checkpoint", cli=False)
case("checkpoint:empty-file", "checkpoints", _file_bytes("empty.pt", b""), "empty.pt", cli=False)
case("checkpoint:text-file", "checkpoints", _file_bytes("text.pt", b"not a checkpoint\n"), "text.pt", cli=False)
case("checkpoint:missing", "checkpoints", lambda w: load_learner(w.fresh("gone.pt")), "gone.pt", "no such checkpoint",
     cli=False)
case("checkpoint:a-folder", "checkpoints", lambda w: (lambda p: (p.mkdir(), load_learner(p))[1])(w.fresh("dir.pt")),
     "dir.pt", cli=False)
case("checkpoint:self-referencing-prior", "checkpoints",
     lambda w: (lambda p: (torch.save({"format": 2, "learner": "residual", "dtype": "float64", "state": {}, "extra": {},
                                       "config": {"input_dim": 3, "output_dim": 2, "prior": str(p)}}, p),
                           load_learner(p))[1])(w.fresh("loop.pt")),
     "loop.pt", "leads back", cli=False)


def _learn_run_damaged(damage: Callable[[dict], Any]) -> Callable[[World], int]:
    """``control kuka --from-run`` on a copy of the learn run whose checkpoint is damaged."""

    def run(w: World) -> int:
        folder = w.copy(w.learn_run)
        ckpt = torch.load(folder / "checkpoint.pt", weights_only=True)
        damage(ckpt)
        torch.save(ckpt, folder / "checkpoint.pt")
        return main(["control", "kuka", "--learner", "svi", "--from-run", str(folder), "--store", str(w.kuka),
                     "--steps", "4", "--controllers", "frozen", "--out", str(w.fresh("run"))])

    return run


for name, damage, names in [
    ("no-normalizer", lambda c: c["extra"].pop("normalizer"), ("normalizer",)),
    ("zero-std", lambda c: c["extra"]["normalizer"].__setitem__("y_std", [0.0] * 7), ("normalizer.y_std",)),
    ("short-mean", lambda c: c["extra"]["normalizer"].__setitem__("x_mean", [0.0] * 3), ("normalizer.x_mean",)),
    ("nan-mean", lambda c: c["extra"]["normalizer"]["x_mean"].__setitem__(0, float("nan")), ("normalizer.x_mean",)),
    ("nan-parameter", lambda c: _poison(c, float("nan")), ("NaN or inf",)),
    ("dtype", lambda c: c.__setitem__("dtype", "float13"), ("float13",)),
]:
    case(f"checkpoint:from-run:{name}", "checkpoints", _learn_run_damaged(damage), "checkpoint.pt", *names)


def _midway(damage_stream: Callable[[dict], Any]) -> Callable[[dict], None]:
    """Make the finished replay checkpoint one saved after its first segment (as if the run had
    stopped there), so that resuming reads its stream state, then damage that state."""

    def damage(ckpt: dict) -> None:
        ckpt["extra"].update(segments=1, iteration=2)
        damage_stream(ckpt["extra"]["stream"])

    return damage


def _replay_damaged(damage: Callable[[dict], Any]) -> Callable[[World], int]:
    """``gpdyn replay`` resuming a copy of the replay run whose checkpoint is damaged."""

    def run(w: World) -> int:
        folder = w.copy(w.replay_run)
        path = folder / "checkpoints" / "svi.pt"
        ckpt = torch.load(path, weights_only=True)
        damage(ckpt)
        torch.save(ckpt, path)
        return main(["replay", "--store", str(w.kuka), *REPLAY_ARGS, "--out", str(folder)])

    return run


for name, damage, names in [
    ("no-segments", lambda c: c["extra"].pop("segments"), ("segments",)),
    ("segments-text", lambda c: c["extra"].__setitem__("segments", "two"), ("segments",)),
    ("no-record", lambda c: c["extra"].pop("record"), ("record",)),
    ("no-perm", _midway(lambda s: s.pop("perm")), ("stream", "perm")),
    ("perm-not-a-permutation", _midway(lambda s: s["perm"].fill_(0)), ("perm",)),
    ("pos-out-of-range", _midway(lambda s: s.__setitem__("pos", 10**9)), ("pos",)),
    ("generator-garbage", _midway(lambda s: s.__setitem__("generator", torch.zeros(3))), ("stream",)),
    ("nan-state", lambda c: _poison(c, float("nan")), ("NaN or inf",)),
]:
    case(f"checkpoint:replay-resume:{name}", "checkpoints", _replay_damaged(damage), "svi.pt", *names)


# -- policy files ----------------------------------------------------------------------------------------
def _policy_damaged(damage: Callable[[dict], Any], cli: bool = False) -> Callable[[World], Any]:
    def run(w: World) -> Any:
        payload = torch.load(w.policy, weights_only=True)
        damage(payload)
        path = w.fresh("bad_policy.pt")
        torch.save(payload, path)
        if cli:
            return main(["collect", "walker", "--store", str(w.fresh("s.zarr")), "--episodes", "1", "--envs", "1",
                         "--policy", str(path)])
        return load_policy(path)

    return run


def _set(key: str, value: Any) -> Callable[[dict], None]:
    return lambda p: p.__setitem__(key, value)


def _weight(name: str, value: float) -> Callable[[dict], None]:
    return lambda p: p["state_dict"][name].view(-1).__setitem__(0, value)


POLICY_DAMAGE: list[tuple[str, Callable[[dict], Any], tuple[str, ...]]] = [
    ("nan-weight", _weight("0.weight", float("nan")), ("0.weight", "NaN")),
    ("inf-bias", _weight("2.bias", float("inf")), ("2.bias", "NaN or inf")),
    ("overflowing-weights", lambda p: [p["state_dict"][k].fill_(3e38) for k in ("0.weight", "2.weight")] and
     p["state_dict"]["2.bias"].copy_(torch.tensor([-3e38] * 6)), ("NaN or inf",)),
    ("nan-obs-mean", lambda p: p["obs_mean"].__setitem__(3, float("nan")), ("obs_mean",)),
    ("negative-obs-var", lambda p: p["obs_var"].__setitem__(0, -1.0), ("obs_var",)),
    ("short-obs-var", _set("obs_var", torch.ones(5, dtype=torch.float64)), ("obs_var",)),
    ("inf-act-high", lambda p: p["act_high"].__setitem__(0, float("inf")), ("act_high",)),
    ("low-above-high", _set("act_low", torch.full((6,), 2.0, dtype=torch.float64)), ("act_low",)),
    ("clip-nan", _set("clip_obs", float("nan")), ("clip_obs",)),
    ("epsilon-negative", _set("epsilon", -1.0), ("epsilon",)),
    ("epsilon-text", _set("epsilon", "small"), ("epsilon",)),
    ("value-scale-nan", _set("value_scale", float("nan")), ("value_scale",)),
    ("hidden-huge", _set("hidden", [10**9]), ("state_dict",)),
    ("hidden-negative", _set("hidden", [-8]), ("hidden",)),
    ("hidden-text", _set("hidden", "8"), ("hidden",)),
    ("activation", _set("activation", "gelu"), ("gelu",)),
    ("missing-state-dict", lambda p: p.pop("state_dict"), ("state_dict",)),
    ("missing-obs-mean", lambda p: p.pop("obs_mean"), ("obs_mean",)),
    ("missing-act-low", lambda p: p.pop("act_low"), ("act_low",)),
    ("layer-missing", lambda p: p["state_dict"].pop("2.bias"), ("state_dict",)),
    ("layer-shape", lambda p: p["state_dict"].__setitem__("0.weight", torch.zeros(8, 11)), ("0.weight",)),
    ("obs-mean-text", _set("obs_mean", "zeros"), ("obs_mean",)),
    ("meta-not-dict", _set("meta", [1, 2]), ("meta",)),
    ("version", _set("version", 99), ("version",)),
    ("format", _set("format", "sb3"), ("not a gpdyn policy file",)),
    ("value-net-nan", lambda p: p.__setitem__("value_state_dict", {
        k: torch.full_like(v[:1] if k == "2.weight" or k == "2.bias" else v, float("nan"))
        for k, v in p["state_dict"].items()}), ("value_state_dict",)),
    ("env-id-names-a-module", _set("env_id", "evilmod:Walker2d-v5"), ("evilmod:Walker2d-v5",)),
]
for name, damage, names in POLICY_DAMAGE:
    case(f"policy:{name}", "policies", _policy_damaged(damage), "bad_policy.pt", *names, cli=False)
for name, damage, names in POLICY_DAMAGE[:3] + POLICY_DAMAGE[-1:]:  # the same files through the collector
    case(f"policy:collect:{name}", "policies", _policy_damaged(damage, cli=True), "bad_policy.pt", *names)


def _policy_bytes(data: bytes) -> Callable[[World], Any]:
    def run(w: World) -> Any:
        path = w.fresh("bad_policy.pt")
        path.write_bytes(data)
        return load_policy(path)

    return run


case("policy:truncated", "policies", lambda w: _policy_bytes(w.policy.read_bytes()[:200])(w), "bad_policy.pt",
     cli=False)
case("policy:text", "policies", _policy_bytes(b"policy"), "bad_policy.pt", "not a gpdyn policy file", cli=False)
case("policy:tensor-only", "policies",
     lambda w: (lambda p: (torch.save(torch.zeros(3), p), load_policy(p))[1])(w.fresh("bad_policy.pt")),
     "bad_policy.pt", cli=False)


# -- stores: chunks and attributes, through the commands that read them ---------------------------------
def _store_damaged(damage: Callable[[Path], Any], command: str = "learn") -> Callable[[World], int]:
    def run(w: World) -> int:
        store = w.copy(w.kuka)
        damage(store)
        if command == "inspect":
            return main(["inspect", str(store)])
        return main(["learn", "--store", str(store), "--problem", "kuka", "--learner", "svi", "--iterations", "2",
                     "--batch-size", "16", "--preset", "small", "--out", str(w.fresh("run"))])

    return run


def _attrs(change: Callable[[dict], Any]) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        meta = json.loads((store / "zarr.json").read_text())
        change(meta["attributes"])
        (store / "zarr.json").write_text(json.dumps(meta))

    return damage


def _write_value(field_name: str, row: int, value: float) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        array = zarr.open_array(str(store / "data" / field_name), mode="r+")
        block = array[row : row + 1]
        block[0, 2] = value
        array[row : row + 1] = block

    return damage


def _chunk(path: str, change: Callable[[bytes], bytes | None]) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        target = store / path
        data = change(target.read_bytes())
        if data is None:
            target.unlink()
        else:
            target.write_bytes(data)

    return damage


# inspect summarises a store without reading its data chunks: their damage is found by the
# commands that read them (the learn cases), not by inspect
INSPECT_READS_NO_DATA = ("data-chunk-truncated", "data-chunk-garbage")
STORE_DAMAGE: list[tuple[str, Callable[[Path], Any], tuple[str, ...]]] = [
    ("episode-ends-chunk-deleted", _chunk("meta/episode_ends/c/0", lambda b: None), ("episode_ends",)),
    ("data-chunk-deleted", _chunk("data/qd/c/0/0", lambda b: None), ("qd",)),
    ("data-chunk-truncated", _chunk("data/tau/c/0/0", lambda b: b[: len(b) // 2]), ("tau",)),
    ("data-chunk-garbage", _chunk("data/q/c/0/0", lambda b: b"\x00garbage" * 8), ("data/q",)),
    ("episode-ends-garbage", _chunk("meta/episode_ends/c/0", lambda b: b"xx"), ("episode_ends",)),
    ("zarr-json-garbage", _chunk("zarr.json", lambda b: b"{not json"), ("zarr.json",)),
    ("array-json-garbage", _chunk("data/qdd/zarr.json", lambda b: b"[]"), ("qdd",)),
    ("fields-a-list", _attrs(lambda a: a.__setitem__("fields", ["q", "qd"])), ("fields",)),
    ("field-without-columns", _attrs(lambda a: a["fields"]["q"].pop("columns")), ("fields.q", "columns")),
    ("field-dtype-float99", _attrs(lambda a: a["fields"]["tau"].__setitem__("dtype", "float99")), ("float99",)),
    ("format-version", _attrs(lambda a: a.__setitem__("format_version", 99)), ("99",)),
    ("format-name", _attrs(lambda a: a.__setitem__("format", "other")), ("format",)),
    ("dt-text", _attrs(lambda a: a.__setitem__("dt", "fast")), ("dt",)),
    ("nan-in-data", _write_value("q", 7, float("nan")), ("data/q", "row 7")),
    ("inf-in-data", _write_value("qdd", 120, float("inf")), ("qdd", "row 120")),
    ("huge-in-data", _write_value("tau", 33, 1e300), ("tau", "row 33")),
]
for name, damage, names in STORE_DAMAGE:
    case(f"store:learn:{name}", "stores", _store_damaged(damage), "kuka.zarr", *names)
for name, damage, names in [d for d in STORE_DAMAGE[:13] if d[0] not in INSPECT_READS_NO_DATA]:  # found on opening
    case(f"store:inspect:{name}", "stores", _store_damaged(damage, "inspect"), "kuka.zarr", *names)
case("store:not-a-store", "stores", lambda w: main(["inspect", str(w.root / "policy.pt")]), "policy.pt")
def _empty_folder(w: World) -> int:
    folder = w.fresh("empty.zarr")
    folder.mkdir()
    return main(["inspect", str(folder)])


case("store:empty-folder", "stores", _empty_folder, "empty.zarr")
case("store:learn-on-a-walker-store", "stores",
     lambda w: main(["learn", "--store", str(w.walker), "--problem", "kuka", "--learner", "svi", "--iterations", "2",
                     "--out", str(w.fresh("run"))]), "walker.zarr")
case("store:api-append-bad-key", "stores",
     lambda w: EpisodeStore.open(w.copy(w.kuka), "a").append_episode(
         {k: np.zeros((3, 7)) for k in ("q", "qd", "qdd", "tau")}, online=0, bogus=1),
     "bogus", cli=False)
case("store:api-append-nan", "stores",
     lambda w: EpisodeStore.open(w.copy(w.kuka), "a").append_episode(
         {k: np.full((3, 7), np.nan) for k in ("q", "qd", "qdd", "tau")}, online=0),
     "q", cli=False)
case("store:api-append-wrong-width", "stores",
     lambda w: EpisodeStore.open(w.copy(w.kuka), "a").append_episode(
         {k: np.zeros((3, 6)) for k in ("q", "qd", "qdd", "tau")}, online=0),
     "q", cli=False)


# -- imported files -------------------------------------------------------------------------------------
def _import(fmt: str, name: str, write: Callable[[Path], Any], *extra: str) -> Callable[[World], int]:
    def run(w: World) -> int:
        path = w.fresh(name)
        write(path)
        return main(["import", fmt, str(path), "--store", str(w.fresh("imported.zarr")), *extra])

    return run


def _kuka_text(rows: np.ndarray, fmt: str = "%.6g") -> Callable[[Path], None]:
    return lambda p: np.savetxt(p, rows, fmt=fmt)


_ROWS = np.random.default_rng(0).normal(size=(20, 28))
_NAN_ROWS = _ROWS.copy()
_NAN_ROWS[4, 9] = np.nan
IMPORTS = [
    ("kuka-27-columns", "kuka-ilgr", "kuka1_offline.txt", _kuka_text(_ROWS[:, :27]), (), ("kuka1_offline.txt",)),
    ("kuka-nan-cell", "kuka-ilgr", "kuka1_offline.txt", _kuka_text(_NAN_ROWS), (), ("kuka1_offline.txt",)),
    ("kuka-text-cell", "kuka-ilgr", "kuka1_offline.txt",
     lambda p: p.write_text("\n".join(" ".join(["1"] * 27 + ["x"]) for _ in range(5))), (), ("kuka1_offline.txt",)),
    ("kuka-empty", "kuka-ilgr", "kuka1_offline.txt", lambda p: p.write_text(""), (), ("kuka1_offline.txt",)),
    ("kuka-bad-gzip", "kuka-ilgr", "kuka1_offline.txt.gz", lambda p: p.write_bytes(b"\x1f\x8bnot gzip"), (),
     ("kuka1_offline.txt.gz",)),
    ("kuka-torque-scale-zero", "kuka-ilgr", "kuka1_offline.txt", _kuka_text(_ROWS), ("--torque-scale", "0"),
     ("--torque-scale",)),
    ("kuka-torque-scale-count", "kuka-ilgr", "kuka1_offline.txt", _kuka_text(_ROWS), ("--torque-scale", "1,2"),
     ("torque",)),
    ("kuka-missing", "kuka-ilgr", "kuka1_offline.txt", lambda p: None, (), ("kuka1_offline.txt",)),
    ("sarcos-garbage", "sarcos", "sarcos_inv.mat", lambda p: p.write_bytes(b"MATLAB garbage" * 10), (),
     ("sarcos_inv.mat",)),
    ("sarcos-two-matrices", "sarcos", "sarcos_inv.mat",
     lambda p: __import__("scipy.io", fromlist=["savemat"]).savemat(p, {"a": np.zeros((3, 28)), "b": np.ones((4, 28))}),
     (), ("sarcos_inv.mat",)),
    ("sarcos-no-matrix", "sarcos", "sarcos_inv.mat",
     lambda p: __import__("scipy.io", fromlist=["savemat"]).savemat(p, {"note": "none"}), (), ("sarcos_inv.mat",)),
    ("sarcos-wrong-width", "sarcos", "sarcos_inv.mat",
     lambda p: __import__("scipy.io", fromlist=["savemat"]).savemat(p, {"sarcos_inv": np.zeros((5, 20))}), (),
     ("sarcos_inv.mat",)),
]
for name, fmt, filename, write, extra, names in IMPORTS:
    case(f"import:{name}", "imports", _import(fmt, filename, write, *extra), *names)


# -- learner tensors ------------------------------------------------------------------------------------
def _tensor_case(name: str, call: str, x_shape: tuple[int, ...], y_shape: tuple[int, ...] | None,
                 bad: str) -> Callable[[World], Any]:
    def run(w: World) -> Any:
        learner = make_learner(name, 3, 2, preset="small")
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(*x_shape, generator=gen, dtype=torch.float64)
        y = torch.randn(*(y_shape or (x_shape[0], 2)), generator=gen, dtype=torch.float64)
        if bad == "nan-x":
            x.view(-1)[1] = float("nan")
        elif bad == "inf-y":
            y.view(-1)[0] = float("inf")
        elif bad == "float32-x":
            x = x.float()
        if call == "predict":
            learner.observe(*(torch.randn(20, 3, generator=gen, dtype=torch.float64),
                              torch.randn(20, 2, generator=gen, dtype=torch.float64)))
            return learner.predict(x)
        return getattr(learner, call)(x, y)

    return run


TENSORS = [
    ("observe", (8, 3), None, "nan-x", ("x", "NaN")),
    ("observe", (8, 3), None, "inf-y", ("y", "NaN")),
    ("observe", (8, 4), None, "wrong-width", ("x", "4 columns")),
    ("observe", (8, 3), (8, 3), "wrong-y", ("y", "shape")),
    ("observe", (8, 3), None, "float32-x", ("x", "float32")),
    ("predict", (5, 4), None, "wrong-width", ("x", "4 columns")),
]
for learner in TENSOR_LEARNERS:
    for call, x_shape, y_shape, bad, names in TENSORS:
        case(f"tensor:{learner}:{call}:{bad}", "tensors", _tensor_case(learner, call, x_shape, y_shape, bad),
             *names, cli=False)


# -- run folders ----------------------------------------------------------------------------------------
def _run_damaged(damage: Callable[[Path], Any], command: str) -> Callable[[World], int]:
    def run(w: World) -> int:
        folder = w.copy(w.replay_run)
        damage(folder)
        return main([command, str(folder)])

    return run


RUNS = [
    # a torn last line is what a crash leaves (skipped with a warning); a bad line before others is damage
    ("garbage-line-inside", lambda f: (f / "metrics.jsonl").write_text(
        '{"kind": "eval", "learner": "sv\n' + (f / "metrics.jsonl").read_text()), ("report",), ("metrics.jsonl",)),
    ("garbage-config", lambda f: (f / "config.json").write_text("{oops"), ("report", "inspect"), ("config.json",)),
    ("config-a-list", lambda f: (f / "config.json").write_text("[1, 2]"), ("report", "inspect"), ("config.json",)),
    ("metrics-missing", lambda f: (f / "metrics.jsonl").unlink(), ("report",), ("metrics.jsonl",)),
    ("record-without-learner", lambda f: (f / "metrics.jsonl").write_text('{"kind": "eval", "iteration": 2}\n'),
     ("report",), ("metrics.jsonl",)),
]
for name, damage, commands, names in RUNS:
    for command in commands:
        case(f"run:{command}:{name}", "runs", _run_damaged(damage, command), *names)
case("run:report-missing-folder", "runs", lambda w: main(["report", str(w.fresh("norun"))]), "norun")


# -- data that names code -------------------------------------------------------------------------------
def _render_env_id(env_id: str) -> Callable[[World], int]:
    def run(w: World) -> int:
        store = _walker_store(w.fresh("evil.zarr"), env_id)
        return main(["render", "--store", str(store), "--episode", "0", "--out", str(w.fresh("v.mp4"))])

    return run


for env_id in ("evilmod:Walker2d-v5", "os:Walker2d-v5", "Hopper-v5", "gymnasium.envs.mujoco:Walker2d-v5"):
    case(f"security:render-env-id:{env_id}", "security", _render_env_id(env_id), "evil.zarr", "env_id", env_id)


# ---------------------------------------------------------------------------- the tests
@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return build_world(tmp_path_factory.mktemp("fuzz"))


def test_the_suite_is_large_and_its_cases_distinct():
    assert len(CASES) >= 150 and len({c.id for c in CASES}) == len(CASES)
    assert {c.area for c in CASES} >= {"options", "checkpoints", "policies", "stores", "imports", "tensors", "runs",
                                       "security"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.slow
def test_bad_input_is_refused_clearly(case: Case, world: World):
    status, message = outcome(case, world)
    assert status == "clear", f"{case.id}: {status}\n{message}"


@pytest.mark.slow
def test_a_good_input_is_clear_of_the_checks(world: World):
    """The checks refuse the damage, not the files: the undamaged world loads and runs."""
    for name, path in world.checkpoints.items():
        assert load_learner(path)[0].name == name
    assert np.isfinite(load_policy(world.policy).act(np.zeros(17))).all()
    out = world.fresh("ok")
    assert main(["learn", "--store", str(world.kuka), "--problem", "kuka", "--learner", "svi", "--iterations", "2",
                 "--batch-size", "16", "--preset", "small", "--out", str(out)]) == 0
    assert main(["replay", "--store", str(world.kuka), *REPLAY_ARGS, "--out", str(world.copy(world.replay_run))]) == 0
    assert _replay_damaged(_midway(lambda stream: None))(world) == 0  # resumed from its first segment
    assert _learn_run_damaged(lambda ckpt: None)(world) == 0  # control kuka --from-run
