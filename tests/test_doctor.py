"""`gpdyn doctor`'s lines on the outside tools: each starts with ok or missing and says what it affects.

The tools are the real ones of this machine, or real programs that fail: a path that does
not exist, a "compiler" that exits with an error, a GL backend that does not load.
"""

from __future__ import annotations

import shutil

import pytest

from gpdyn import doctor
from gpdyn.cli import main

TOOLS = ("C++ compiler", "ffmpeg", "GL backend")


@pytest.mark.slow
def test_doctor_prints_one_ok_or_missing_line_per_tool(capsys):
    assert main(["doctor"]) == 0
    lines = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in capsys.readouterr().out.splitlines()}
    for tool in TOOLS:
        assert lines[tool].startswith(("ok ", "missing")), lines[tool]
    assert "MUJOCO_GL" in lines["GL backend"]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_compiler_ok_names_it_and_the_native_kernel(monkeypatch):
    monkeypatch.setenv("CXX", "g++")
    monkeypatch.delenv("GPDYN_NATIVE", raising=False)
    line = doctor.check_compiler()
    assert line.startswith("ok (") and "g++" in line and "native GP prediction kernel" in line


def test_compiler_missing_says_predictions_take_the_torch_path(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    line = doctor.check_compiler()
    assert line.startswith("missing: CXX=") and "no-such-compiler" in line and "slower torch path" in line


def test_compiler_that_cannot_compile_is_missing(tmp_path, monkeypatch):
    broken = tmp_path / "broken-c++"
    broken.write_text("#!/bin/sh\necho 'broken-c++: no C++ here' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CXX", str(broken))
    line = doctor.check_compiler()
    assert line.startswith("missing:") and "cannot compile C++ (broken-c++: no C++ here)" in line


def test_ffmpeg_ok_from_the_imageio_ffmpeg_dependency(monkeypatch):
    monkeypatch.delenv("IMAGEIO_FFMPEG_EXE", raising=False)
    line = doctor.check_ffmpeg()
    assert line.startswith("ok (ffmpeg version ") and ".mp4" in line


def test_ffmpeg_missing_says_render_cannot_write_mp4(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(tmp_path / "no-ffmpeg"))
    line = doctor.check_ffmpeg()
    assert line.startswith("missing:") and "no-ffmpeg" in line and "cannot write .mp4" in line and ".gif still works" in line


def test_gl_backend_that_render_does_not_use_is_missing(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "glx")  # MuJoCo takes it; gpdyn render draws with egl, osmesa, glfw
    line = doctor.check_gl_backend()
    assert line.startswith("missing (MUJOCO_GL='glx')") and "cannot draw frames" in line


def test_gl_backend_that_does_not_load_is_missing(monkeypatch):
    # MuJoCo's EGL module refuses to load when PyOpenGL is told to use another platform
    monkeypatch.setenv("MUJOCO_GL", "egl")
    monkeypatch.setenv("PYOPENGL_PLATFORM", "osmesa")
    line = doctor.check_gl_backend()
    assert line.startswith("missing (MUJOCO_GL='egl': the egl library does not load: ImportError")
    assert "PYOPENGL_PLATFORM" in line and "install libegl1" in line


def test_gl_backend_unset_is_probed_as_render_uses_it(monkeypatch):
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.delenv("PYOPENGL_PLATFORM", raising=False)
    line = doctor.check_gl_backend()
    assert "MUJOCO_GL unset, render uses egl" in line
    assert line.startswith(("ok (", "missing ("))
