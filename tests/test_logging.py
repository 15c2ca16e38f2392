"""Messages and progress: the ``gpdyn`` loggers set up by the command (``--quiet``,
``--verbose``, before or after the command), progress bars drawn only on a terminal and
logged as a line now and then elsewhere, and ``gpdyn render``'s progress and speed."""

from __future__ import annotations

import logging
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_reliability_mjcf import _arm

from gpdyn import progress
from gpdyn.cli import build_parser, main
from gpdyn.data.store import EpisodeStore
from gpdyn.errors import InputError
from gpdyn.progress import LoggedProgress, progress_bar

GPDYN = [sys.executable, "-m", "gpdyn"]


# ---------------------------------------------------------------------------- the command line
@pytest.mark.slow
def test_progress_into_a_pipe_is_logged_lines_without_carriage_returns(tmp_path: Path) -> None:
    """Before: tqdm redrew its bar with '\\r' into the pipe, one endless line."""
    done = subprocess.run([*GPDYN, "collect", "kuka", "--store", str(tmp_path / "k.zarr"), "--offline", "10",
                           "--online", "10", "--out", str(tmp_path / "run")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "\r" not in done.stderr and "\r" not in done.stdout
    # the bar's last state, logged when it closes: one compact line
    assert any(line.startswith("kuka_iiwa kuka1: 20/20 sample (100%)") for line in done.stderr.splitlines()), done.stderr
    assert f"run folder: {tmp_path / 'run'}" in done.stdout  # results stay on stdout


def test_quiet_after_the_command_leaves_only_warnings_on_stderr(tmp_path: Path, capsys) -> None:
    weak = _arm(tmp_path, limit=0.5)  # its motors cannot make the motions: a warning
    common = ["collect", "arm", "--model", str(weak), "--offline", "20", "--online", "30"]
    assert main([*common, "--store", str(tmp_path / "a.zarr"), "--out", str(tmp_path / "a")]) == 0
    loud = capsys.readouterr().err.splitlines()
    assert any(": 50/50 sample (100%)" in line for line in loud), loud  # progress, when not quiet
    assert main([*common, "--store", str(tmp_path / "b.zarr"), "--out", str(tmp_path / "b"), "--quiet"]) == 0
    captured = capsys.readouterr()
    quiet = captured.err.splitlines()
    assert quiet and all(line.startswith("gpdyn collect arm: warning: ") for line in quiet), quiet
    assert "samples beyond" in captured.out  # the result is not a message: --quiet keeps it


@pytest.mark.parametrize(("argv", "level"), [
    (["inspect", "x"], logging.INFO),
    (["--quiet", "inspect", "x"], logging.WARNING),
    (["inspect", "x", "-q"], logging.WARNING),
    (["-v", "inspect", "x"], logging.DEBUG),
    (["collect", "kuka", "--store", "s", "--verbose"], logging.DEBUG),
    (["-v", "inspect", "x", "--quiet"], logging.WARNING),  # after the command: it has the last word
])
def test_quiet_and_verbose_go_before_or_after_the_command(argv: list[str], level: int) -> None:
    assert build_parser().parse_args(argv).log_level == level


def test_quiet_and_verbose_together_are_refused(capsys) -> None:
    assert main(["inspect", "x", "-q", "-v"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_help_says_where_messages_and_results_go(capsys) -> None:
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "-q, --quiet" in text and "-v, --verbose" in text and "before the command or after it" in text
    assert "progress bars only on a terminal" in text


def test_verbose_adds_debug_lines_and_errors_keep_their_form(walker_store: EpisodeStore, tmp_path: Path,
                                                             capsys) -> None:
    assert main(["inspect", str(walker_store.path), "-v"]) == 0
    err = capsys.readouterr().err
    assert "gpdyn inspect: debug: gpdyn.cli: options: " in err
    assert main(["inspect", str(walker_store.path)]) == 0
    assert "debug" not in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "missing"), "--quiet"]) == 2
    assert capsys.readouterr().err == f"gpdyn inspect: error: {tmp_path / 'missing'}: no such file or folder\n"


# ---------------------------------------------------------------------------- the bars
def test_a_bar_off_the_terminal_logs_at_most_one_line_per_interval_and_its_end(monkeypatch, caplog) -> None:
    caplog.set_level(logging.INFO, logger="gpdyn")
    monkeypatch.setattr(progress, "LOG_SECONDS", 0.05)
    start = time.monotonic()
    bar = progress_bar(total=8, desc="work", unit="step")
    assert isinstance(bar, LoggedProgress)  # pytest's stderr is no terminal
    for step in range(8):
        time.sleep(0.03)
        bar.update(1)
        bar.set_postfix(loss=0.5)  # a refresh of its own: still no more than one line per interval
        if step == 4:
            bar.set_description("work")  # tqdm keeps it as "work: "
    bar.close()
    elapsed = time.monotonic() - start
    records = [r for r in caplog.records if r.name == "gpdyn.progress"]
    lines = [r.getMessage() for r in records]
    assert 2 <= len(lines) <= elapsed / 0.05 + 1, lines  # one at most every 50 ms of the >= 240 ms, and the end
    assert all(b.created - a.created >= 0.045 for a, b in zip(records[:-2], records[1:-1])), lines
    assert lines[-1].startswith("work: 8/8 step (100%) in 00:00, 00:00 left, ") and "loss=0.5" in lines[-1]
    assert all("\r" not in line for line in lines)


def test_a_quick_bar_logs_its_end_only_and_an_inner_one_nothing(caplog) -> None:
    caplog.set_level(logging.INFO, logger="gpdyn")
    for _ in progress_bar(range(1000), desc="quick"):
        pass
    for _ in progress_bar(range(1000), desc="inner", leave=False):
        pass
    for _ in progress_bar(desc="open-ended", iterable=iter(range(5))):
        pass
    lines = [r.getMessage() for r in caplog.records if r.name == "gpdyn.progress"]
    assert len(lines) == 2 and lines[0].startswith("quick: 1000/1000 it (100%)"), lines
    assert lines[1].startswith("open-ended: 5 it in "), lines


def test_quiet_turns_the_bars_off(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="gpdyn")
    bar = progress_bar(total=3, desc="hidden")
    assert bar.disable
    bar.update(3)
    bar.close()
    assert not [r for r in caplog.records if r.name == "gpdyn.progress"]


# ---------------------------------------------------------------------------- gpdyn render
def _gait_store(path: Path, steps: int) -> Path:
    """A Walker2d store of one smooth made-up gait (rootx, rootz, rooty, six joint angles)."""
    from gpdyn.sim.legged import legged_fields
    from gpdyn.robots.walker import WALKER

    fields = legged_fields(WALKER)
    store = EpisodeStore.create(path, fields, source="test", env_id="Walker2d-v5", dt=0.008, seed=0)
    t = np.arange(steps + 1)[:, None]
    qpos = np.concatenate([0.01 * t, np.full_like(t, 1.2, dtype=float), 0.05 * np.sin(0.05 * t),
                           0.4 * np.sin(0.05 * t + np.arange(6) * np.pi / 3)], axis=1)
    qvel = np.gradient(qpos, axis=0) / 0.008
    rng = np.random.default_rng(0)
    episode = {k: rng.normal(size=(steps, f.width)).astype(f.dtype) for k, f in fields.items()}
    episode.update(qpos=qpos[:-1], qvel=qvel[:-1], next_qpos=qpos[1:], next_qvel=qvel[1:])
    store.append_episode(episode)
    return path


def _offscreen_or_skip(quality: str):
    from gpdyn.robots.walker import make_env

    try:
        from gpdyn.sim import render
    except InputError as err:
        pytest.skip(f"needs an OpenGL backend for MuJoCo (MUJOCO_GL=egl with libEGL, or osmesa): {err}")
    env = make_env()
    try:
        return render._Offscreen(env.unwrapped.model, 64, 48, quality), env
    except InputError as err:
        env.close()
        pytest.skip(f"needs an OpenGL backend for MuJoCo (MUJOCO_GL=egl with libEGL, or osmesa): {err}")


@pytest.mark.parametrize("quality", ["fast", "full"])
def test_fast_drawing_turns_off_shadows_reflections_and_multisampling(quality: str) -> None:
    import mujoco

    frames, env = _offscreen_or_skip(quality)
    try:
        flags = frames.scene.flags
        drawn = bool(flags[mujoco.mjtRndFlag.mjRND_SHADOW]), bool(flags[mujoco.mjtRndFlag.mjRND_REFLECTION])
        assert frames.fast == (quality == "fast")
        assert drawn == ((False, False) if quality == "fast" else (True, True))
        assert (env.unwrapped.model.vis.quality.offsamples == 0) == (quality == "fast")
    finally:
        frames.close()
        env.close()


@pytest.mark.slow
def test_render_shows_progress_and_writes_every_frame(tmp_path: Path, capsys) -> None:
    import imageio.v2 as imageio

    _offscreen_or_skip("auto")[0].close()
    store = _gait_store(tmp_path / "gait.zarr", 12)
    out = tmp_path / "gait.mp4"
    assert main(["render", "--store", str(store), "--episode", "0", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "render gait.mp4: 13/13 frame (100%)" in captured.err and "\r" not in captured.err
    assert f"{out}: episode 0 of {store} (12 steps)" in captured.out
    assert imageio.get_reader(out).count_frames() == 13


@pytest.mark.slow
def test_render_takes_under_20_ms_of_cpu_per_frame(tmp_path: Path, capsys) -> None:
    """Before: 80 ms per frame on Mesa's llvmpipe (shadow maps and 4x multisampling drawn by
    the CPU) and 9 ms of x264 at its default preset: 75 s for a 1,000-step episode."""
    from gpdyn.sim.render import render_episode

    _offscreen_or_skip("auto")[0].close()
    store = EpisodeStore.open(_gait_store(tmp_path / "gait.zarr", 300))
    render_episode(store, 0, tmp_path / "warm.mp4", every=100)  # imports and the GL context, not timed

    def cpu() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime  # ffmpeg is a child

    start = cpu()
    render_episode(store, 0, tmp_path / "gait.mp4")
    per_frame = (cpu() - start) / 301
    assert per_frame < 0.020, f"{per_frame * 1e3:.1f} ms of CPU per frame"
    assert os.path.getsize(tmp_path / "gait.mp4") > 0
