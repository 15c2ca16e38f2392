"""Issue #37, third round: what sits at a lock file's path, the native kernel's cache, and
the environment variables gpdyn reads (GPDYN_NATIVE, MUJOCO_GL, XDG_CACHE_HOME).

- A lock file is written only when it is a regular file of one link holding a lock record
  (or what a crash leaves of one): a link planted at its path never makes gpdyn overwrite
  the file it points to, and a FIFO never blocks.
- The kernel's cache is private, and a library in it is loaded only after its owner, mode
  and recorded sha256 are checked; a damaged one is rebuilt, a planted one never runs.
- A wrong value of an environment variable is an error naming it, never a traceback.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from synthetic import WALKER_FIELDS, random_walker_episode

from gpdyn import environment
from gpdyn.cli import main
from gpdyn.data.store import EpisodeStore, StoreError
from gpdyn.errors import InputError
from gpdyn.gp import native
from gpdyn.lock import WriterLock
from gpdyn.runs import LOCK_FILE, RunDir

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv" / "bin" / "python"
COMPILER = os.environ.get("CXX", "g++")
needs_compiler = pytest.mark.skipif(shutil.which(COMPILER) is None,
                                    reason=f"needs the C++ compiler {COMPILER} ($CXX, g++ by default) to build the native kernel")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (gives a file to another user)")
PRECIOUS = b"precious notes\n"


@contextlib.contextmanager
def _within(seconds: float):
    """Fail instead of hanging when the block blocks (a FIFO opened for reading would)."""
    def _hung(*_):
        raise TimeoutError(f"blocked for {seconds} s")

    before = signal.signal(signal.SIGALRM, _hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


# ----------------------------------------------------------------------------- lock files


def _new_store(path: Path) -> Path:
    store = EpisodeStore.create(path, WALKER_FIELDS, source="t", env_id="w", dt=0.1, seed=0,
                                episode_keys={"seed": "int64"})
    store.append_episode(random_walker_episode(np.random.default_rng(0), 5), seed=0)
    store.close()
    return path


def _take(where: str, tmp_path: Path):
    """Take the writer lock of a store (``<store>.lock``) or a run folder (``.gpdyn-writer.lock``)
    the way gpdyn collect and gpdyn learn/replay do; returns the lock's path and a callable."""
    if where == "store":
        path = _new_store(tmp_path / "s.zarr")
        return tmp_path / "s.zarr.lock", lambda: EpisodeStore.open(path, "a").close()
    run = tmp_path / "run"
    run.mkdir()
    return run / LOCK_FILE, lambda: RunDir.create("learn", {"x": 1}, out=run).close()


@pytest.mark.parametrize("where", ["store", "run folder"])
@pytest.mark.parametrize("target", ["file", "directory", "dangling"])
def test_a_symbolic_link_at_the_lock_path_is_refused_and_what_it_points_to_is_untouched(tmp_path, where, target):
    lock_path, take = _take(where, tmp_path)
    pointed = tmp_path / "notes"
    if target == "file":
        pointed.write_bytes(PRECIOUS)
    elif target == "directory":
        pointed.mkdir()
    lock_path.symlink_to(pointed)
    with pytest.raises(InputError, match=rf"lock file {lock_path} is a symbolic link \(to {pointed}\)"):
        take()
    assert lock_path.is_symlink()
    if target == "file":
        assert pointed.read_bytes() == PRECIOUS
    elif target == "directory":
        assert list(pointed.iterdir()) == []
    else:
        assert not pointed.exists()  # a dangling link made nothing appear at its target
    lock_path.unlink()
    take()  # with the link gone, the lock works


def test_a_hard_link_to_someone_elses_file_at_the_lock_path_is_refused(tmp_path):
    lock_path, take = _take("store", tmp_path)
    notes = tmp_path / "notes"
    notes.write_bytes(PRECIOUS)
    os.link(notes, lock_path)
    with pytest.raises(StoreError, match="s.zarr.lock has 2 hard links"):
        take()
    assert notes.read_bytes() == PRECIOUS


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()
    (path / "inside").write_bytes(PRECIOUS)


def _socket(path: Path) -> None:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.close()  # the socket file stays


def _device(path: Path) -> None:
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers
    except PermissionError:
        pytest.skip("needs root (CAP_MKNOD) to make a device file")


@pytest.mark.parametrize("make, kind", [(_fifo, "a FIFO"), (_directory, "a directory"), (_socket, "a socket"),
                                        (_device, "a character device")])
def test_a_lock_path_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, make, kind):
    lock = WriterLock(tmp_path / "x.lock", "thing x")
    make(lock.path)
    with _within(10), pytest.raises(InputError, match=rf"thing x: the lock file {lock.path} is {kind}; gpdyn"):
        lock.acquire()
    assert not lock.held
    if kind == "a directory":
        assert (lock.path / "inside").read_bytes() == PRECIOUS


@pytest.mark.parametrize("content, ours", [
    (b"", True),  # created, record not written yet
    (b"\0" * 80, True),  # a record a power loss left as zeros
    (json.dumps({"pid": 1, "host": "elsewhere", "started": "2024-01-01 00:00:00"}).encode() + b"\n", True),
    (PRECIOUS, False),
    (b"\x7fELF\x02\x01\x01" + b"\0" * 50, False),
    (json.dumps({"name": "not a lock"}).encode(), False),
    (b"{" + b" " * 70000 + b"}", False),  # longer than any record
])
def test_a_lock_file_is_rewritten_only_when_it_holds_a_lock_record(tmp_path, content, ours):
    lock = WriterLock(tmp_path / "x.lock", "thing x")
    lock.path.write_bytes(content)
    if ours:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a record of a holder that is gone: the stale-lock warning
            lock.acquire()
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
        lock.release()
    else:
        with pytest.raises(InputError, match="x.lock holds .* bytes that are not a gpdyn lock record"):
            lock.acquire()
        assert lock.path.read_bytes() == content and not lock.held


def test_collect_refuses_a_store_whose_lock_is_a_link_to_a_users_file(tmp_path):
    """The report's scenario through the command line: nothing is collected, the file stays."""
    notes = tmp_path / "notes"
    notes.write_bytes(PRECIOUS)
    (tmp_path / "s.zarr.lock").symlink_to(notes)
    code = main(["collect", "walker", "--store", str(tmp_path / "s.zarr"), "--episodes", "1"])
    assert code == 2 and notes.read_bytes() == PRECIOUS and not (tmp_path / "s.zarr").exists()


# ----------------------------------------------------------------------- GPDYN_NATIVE


@pytest.fixture
def fresh_setting(monkeypatch):
    """GPDYN_NATIVE read again, and no kernel loaded or remembered as failed."""
    monkeypatch.setattr(native, "_enabled", None)
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_failed", None)


@pytest.mark.parametrize("value", ["1", "on", "TRUE", "Yes", " true ", ""])
def test_gpdyn_native_values_that_turn_the_kernel_on(monkeypatch, fresh_setting, value):
    monkeypatch.setenv("GPDYN_NATIVE", value)
    assert native.wanted() is True


@pytest.mark.parametrize("value", ["0", "off", "False", "NO", " no"])
def test_gpdyn_native_values_that_turn_the_kernel_off(monkeypatch, tmp_path, fresh_setting, value):
    monkeypatch.setenv("GPDYN_NATIVE", value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert native.wanted() is False
    assert native.library() is None and not (tmp_path / "cache").exists()  # nothing built


@pytest.mark.parametrize("value", ["garbage", "2", "enable", "o n", "-1"])
def test_any_other_gpdyn_native_value_is_an_error_naming_the_variable(monkeypatch, fresh_setting, value):
    monkeypatch.setenv("GPDYN_NATIVE", value)
    with pytest.raises(InputError, match=rf"GPDYN_NATIVE={value!r}: use one of 1, on, true, yes .* or 0, off, false, no"):
        native.library()  # when the kernel is first wanted
    with pytest.raises(InputError, match="GPDYN_NATIVE"):
        native.library()  # and every time after: no silent choice


def test_the_command_line_refuses_a_wrong_gpdyn_native_before_any_work(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("GPDYN_NATIVE", "offf")
    assert main(["inspect", str(tmp_path / "missing.zarr")]) == 2
    err = capsys.readouterr().err
    assert "GPDYN_NATIVE='offf'" in err and "missing.zarr" not in err and "Traceback" not in err


# ------------------------------------------------------------------- the kernel's cache


@pytest.mark.parametrize("value", ["relative/cache", "./cache", "cache", ""])
def test_a_relative_or_empty_xdg_cache_home_is_ignored(monkeypatch, tmp_path, value):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", value)
    assert native.cache_dir() == tmp_path / "home" / ".cache" / "gpdyn" / "native"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "abs"))
    assert native.cache_dir() == tmp_path / "abs" / "gpdyn" / "native"


def test_the_cache_directories_are_created_private(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    directory = native._private_cache_dir()
    assert directory == tmp_path / "cache" / "gpdyn" / "native"
    assert stat.S_IMODE(directory.stat().st_mode) == stat.S_IMODE(directory.parent.stat().st_mode) == 0o700


@pytest.mark.parametrize("which, mode", [("native", 0o777), ("native", 0o775), ("native", 0o757), ("gpdyn", 0o777),
                                         ("gpdyn", 0o730), ("root", 0o777)])
def test_a_cache_directory_others_can_write_is_not_used(monkeypatch, tmp_path, which, mode):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    directory = native._private_cache_dir()
    opened = {"native": directory, "gpdyn": directory.parent, "root": tmp_path / "cache"}[which]
    opened.chmod(mode)
    with pytest.raises(RuntimeError, match=rf"cache is not private: {opened} is writable by group or others "
                                           rf"\(mode {mode:o}\).*chmod 700 {opened}"):
        native._private_cache_dir()


def test_a_sticky_cache_root_others_can_write_is_used_like_tmp(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache").chmod(0o1777)
    assert native._private_cache_dir() == tmp_path / "cache" / "gpdyn" / "native"


@needs_root
def test_a_cache_directory_of_another_user_is_not_used(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    directory = native._private_cache_dir()
    os.chown(directory, 65534, 65534)
    with pytest.raises(RuntimeError, match=rf"{directory} is owned by uid 65534, not by this user"):
        native._private_cache_dir()


PLANTED_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
/* what an attacker's library does: run code as soon as it is loaded */
__attribute__((constructor)) static void planted(void) {
    const char *marker = getenv("GPDYN_TEST_PLANTED_MARKER");
    if (marker) { FILE *f = fopen(marker, "w"); if (f) { fputs("ran", f); fclose(f); } }
}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One real build of the kernel (its cache folder) and a planted library without the
    kernel's symbols whose constructor writes a marker file."""
    root = tmp_path_factory.mktemp("native-cache")
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(root)
    try:
        native._build()
    finally:
        if before is None:
            del os.environ["XDG_CACHE_HOME"]
        else:
            os.environ["XDG_CACHE_HOME"] = before
    source = root / "planted.c"
    source.write_text(PLANTED_SOURCE)
    planted = root / "planted.so"
    subprocess.run([COMPILER, "-x", "c++", "-shared", "-fPIC", str(source), "-o", str(planted)], check=True,
                   capture_output=True)
    return root / "gpdyn" / "native", planted


@pytest.fixture
def cache(built, monkeypatch, tmp_path):
    """A copy of the built cache as this test's XDG_CACHE_HOME: (folder, library, digest file, marker)."""
    folder = tmp_path / "xdg" / "gpdyn" / "native"
    shutil.copytree(built[0], folder)
    for path in (folder.parent, folder):
        path.chmod(0o700)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    marker = tmp_path / "planted-ran"
    monkeypatch.setenv("GPDYN_TEST_PLANTED_MARKER", str(marker))
    library = next(folder.glob("exp2-*.so"))
    return folder, library, library.with_name(library.name + native.DIGEST_SUFFIX), marker


def _assert_a_working_kernel(lib: ctypes.CDLL, library: Path, digest: Path) -> None:
    """The returned library has the kernels and the cache holds a library that passes its checks."""
    assert all(hasattr(lib, name) for name in native.KERNELS.values())
    assert native._library_problem(library, digest) is None
    assert stat.S_IMODE(library.stat().st_mode) & 0o022 == 0


def _digest_of(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest() + "\n"


def _plant_without_digest(planted, library, digest):
    digest.unlink()
    shutil.copy(planted, library)


def _plant_with_a_wrong_digest(planted, library, digest):
    shutil.copy(planted, library)  # the digest still names the real build


def _plant_group_writable(planted, library, digest):
    shutil.copy(planted, library)
    digest.write_text(_digest_of(planted))
    library.chmod(0o775)


def _plant_with_a_world_writable_digest(planted, library, digest):
    shutil.copy(planted, library)
    digest.write_text(_digest_of(planted))
    digest.chmod(0o666)


def _plant_a_symbolic_link(planted, library, digest):
    library.unlink()
    library.symlink_to(planted)
    digest.write_text(_digest_of(planted))


def _plant_as_another_user(planted, library, digest):
    if os.geteuid() != 0:
        pytest.skip("needs root (gives a file to another user)")
    shutil.copy(planted, library)
    digest.write_text(_digest_of(planted))
    os.chown(library, 65534, 65534)


@needs_compiler
@pytest.mark.parametrize("plant, reason", [
    (_plant_without_digest, None),
    (_plant_with_a_wrong_digest, "its sha256 is not the one recorded"),
    (_plant_group_writable, "is writable by group or others \\(mode 775\\)"),
    (_plant_with_a_world_writable_digest, "sha256 is writable by group or others \\(mode 666\\)"),
    (_plant_a_symbolic_link, "cannot be opened \\(a symbolic link\\)"),
    (_plant_as_another_user, "is owned by uid 65534"),
])
@pytest.mark.slow
def test_a_planted_library_is_never_loaded_and_the_kernel_is_rebuilt(cache, built, plant, reason):
    folder, library, digest, marker = cache
    plant(built[1], library, digest)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lib = native._build()
    assert not marker.exists(), "the planted library's constructor ran"
    _assert_a_working_kernel(lib, library, digest)
    told = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    if reason is None:  # no digest: a library from before digests, rebuilt quietly
        assert told == []
    else:
        assert len(told) == 1 and str(library) in told[0] and "removed and rebuilt" in told[0]
        assert re.search(reason, told[0])


@needs_compiler
@pytest.mark.parametrize("damage", ["truncated to half", "one byte flipped", "emptied"])
@pytest.mark.slow
def test_a_damaged_library_is_rebuilt_instead_of_crashing_the_process(cache, damage):
    """A half-length library was a SIGBUS in every predicting command."""
    folder, library, digest, marker = cache
    data = library.read_bytes()
    if damage == "truncated to half":
        data = data[: len(data) // 2]
    elif damage == "one byte flipped":
        data = data[:4000] + bytes([data[4000] ^ 0xFF]) + data[4001:]
    else:
        data = b""
    library.write_bytes(data)
    with pytest.warns(RuntimeWarning, match="its sha256 is not the one recorded .*removed and rebuilt"):
        lib = native._build()
    _assert_a_working_kernel(lib, library, digest)


@needs_compiler
@pytest.mark.slow
def test_a_library_without_the_kernels_symbols_is_rebuilt_and_the_new_one_is_used(cache, built):
    folder, library, digest, marker = cache
    shutil.copy(built[1], library)
    digest.write_text(_digest_of(built[1]))  # as if our own build had gone wrong
    with pytest.warns(RuntimeWarning, match="has no symbol gpdyn_exp2_matvec_f32; it is removed and rebuilt"):
        lib = native._build()
    _assert_a_working_kernel(lib, library, digest)


@needs_compiler
def test_temporaries_of_a_killed_build_are_removed_by_the_next_and_a_running_builds_are_kept(cache):
    folder, library, digest, marker = cache
    old = time.time() - native.STALE_BUILD_SECONDS - 60
    stale = [folder / "tmpkilled1.so", folder / "tmpkilled2.so.sha256"]
    for path in stale:
        path.write_bytes(b"half a library")
        os.utime(path, (old, old))
    running = folder / "tmprunning.so"
    running.write_bytes(b"being written")
    native._build()
    assert not any(p.exists() for p in stale) and running.exists()


@needs_compiler
def test_a_build_leaves_only_its_library_its_digest_and_the_lock(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    before = os.umask(0o002)  # a umask that lets the linker make its output group-writable
    try:
        native._build()
    finally:
        os.umask(before)
    names = sorted(p.name for p in (tmp_path / "gpdyn" / "native").iterdir())
    assert len(names) == 3 and names[0] == native.BUILD_LOCK and names[2] == names[1] + native.DIGEST_SUFFIX
    library = tmp_path / "gpdyn" / "native" / names[1]
    assert stat.S_IMODE(library.stat().st_mode) & 0o022 == 0  # loadable by the next process's checks
    assert native._library_problem(library, library.with_name(names[2])) is None


@needs_compiler
def test_an_unsafe_cache_warns_once_and_predictions_take_the_torch_path(cache, built, fresh_setting, monkeypatch):
    import torch

    from gpdyn.gp import kernels

    folder, library, digest, marker = cache
    shutil.copy(built[1], library)
    digest.write_text(_digest_of(built[1]))
    folder.chmod(0o777)  # another user could have put these there
    monkeypatch.setenv("GPDYN_NATIVE", "on")
    with pytest.warns(RuntimeWarning, match=rf"not available: the kernel's cache is not private: {folder} is writable"):
        assert native.library() is None
    assert native.library() is None  # once
    assert not marker.exists()
    u, v, vec = torch.ones(3, 2), torch.ones(4, 2), torch.ones(1, 4)
    torch.testing.assert_close(kernels.exp2_matvec(u, v, vec), torch.full((1, 3), 16.0))


# --------------------------------------------------------------------------- MUJOCO_GL


def _gpdyn(*args: str, **env: str | None) -> subprocess.CompletedProcess:
    environ = {**os.environ, **{k: v for k, v in env.items() if v is not None}}
    for k, v in env.items():
        if v is None:
            environ.pop(k, None)
    return subprocess.run([str(PYTHON), "-m", "gpdyn", *args], capture_output=True, text=True, env=environ,
                          cwd=REPO, timeout=300)


@pytest.mark.parametrize("value", ["garbage", "EGLX", "opengl"])
def test_the_command_line_refuses_a_mujoco_gl_that_mujoco_does_not_know(tmp_path, value):
    done = _gpdyn("render", "--store", str(tmp_path / "missing.zarr"), "--episode", "0", "--out",
                  str(tmp_path / "v.mp4"), MUJOCO_GL=value)
    assert done.returncode == 2, done.stderr
    assert f"MUJOCO_GL={value!r} is not a rendering backend MuJoCo accepts: use one of egl, osmesa, glfw" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("value, read", [(None, ""), ("", ""), ("egl", "egl"), ("EGL", "egl"), (" osmesa ", "osmesa"),
                                         ("glfw", "glfw"), ("disable", "disable"), ("1", "1")])
def test_the_mujoco_gl_values_mujoco_accepts_pass(monkeypatch, value, read):
    if value is None:
        monkeypatch.delenv("MUJOCO_GL", raising=False)
    else:
        monkeypatch.setenv("MUJOCO_GL", value)
    assert environment.check_mujoco_gl() == read
    environment.check()


@pytest.mark.parametrize("value, backend", [("", "egl"), ("EGL", "egl"), (" glfw", "glfw"),
                                            ("off", "turns MuJoCo's rendering off"), ("disabled", "turns MuJoCo's rendering off"),
                                            ("glx", "is not a backend gpdyn renders with"),
                                            ("on", "is not a backend gpdyn renders with")])
def test_render_picks_the_backend_mujoco_gl_names_or_refuses_what_it_cannot_draw_with(monkeypatch, value, backend):
    from gpdyn.sim import render

    monkeypatch.setenv("MUJOCO_GL", value)
    if backend in render.RENDER_BACKENDS:
        assert render.render_backend() == backend
    else:
        with pytest.raises(InputError, match=rf"render: MUJOCO_GL={value} {backend}; use egl, osmesa, glfw"):
            render.render_backend()


def _loadable(name: str) -> bool:
    for filename in [f"lib{name}.so", *(f"lib{name}.so.{i}" for i in range(10))]:
        with contextlib.suppress(OSError):
            ctypes.CDLL(filename)
            return True
    return False


@pytest.mark.skipif(_loadable("OSMesa"), reason="needs a machine without libOSMesa (checks the error when it is missing)")
@pytest.mark.slow
def test_render_with_osmesa_but_no_libosmesa_names_the_variable_and_the_package(tmp_path):
    done = _gpdyn("render", "--store", str(tmp_path / "missing.zarr"), "--episode", "0", "--out",
                  str(tmp_path / "v.mp4"), MUJOCO_GL="osmesa")
    assert done.returncode == 2, done.stderr
    assert "MUJOCO_GL=osmesa needs libOSMesa.so, which cannot be loaded" in done.stderr
    assert "apt install libosmesa6" in done.stderr and "MUJOCO_GL=egl" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_render_with_glfw_and_no_display_is_an_error_naming_the_variable(tmp_path):
    code = ("import mujoco\nfrom gpdyn.errors import InputError\nfrom gpdyn.sim.render import _Offscreen\n"
            "try:\n    _Offscreen(mujoco.MjModel.from_xml_string('<mujoco/>'), 64, 48)\n    print('rendered')\n"
            "except InputError as err:\n    print('refused:', err)\n")
    environ = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    done = subprocess.run([str(PYTHON), "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**environ, "MUJOCO_GL": "glfw"})
    assert done.stdout.startswith("refused: render: MUJOCO_GL=glfw cannot make an OpenGL context"), done.stdout + done.stderr
    assert "it needs a display" in done.stdout and "MUJOCO_GL=egl" in done.stdout
