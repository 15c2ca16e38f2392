"""`gpdyn doctor`'s lines on the outside tools: each starts with ok or missing and says what it affects.

The tools are the real ones of this machine, or real programs that fail: a path that does
not exist, a "compiler" that exits with an error, a GL backend that does not load. Both
depths are checked: the default one finds the tools without loading torch or MuJoCo,
``--deep`` tries them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from gpdyn import doctor
from gpdyn.cli import main

TOOLS = ("C++ compiler", "ffmpeg", "GL backend")


def _lines(out: str) -> dict[str, str]:
    return {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in out.splitlines()}


@pytest.mark.parametrize("deep", [False, True])
@pytest.mark.slow
def test_doctor_prints_one_ok_or_missing_line_per_tool(deep, capsys):
    assert main(["doctor", *(["--deep"] if deep else [])]) == 0
    lines = _lines(capsys.readouterr().out)
    for tool in TOOLS:
        assert lines[tool].startswith(("ok ", "missing")), lines[tool]
        assert ("--deep" in lines[tool]) == (not deep and lines[tool].startswith("ok") and tool != "ffmpeg")
    assert "MUJOCO_GL" in lines["GL backend"]
    assert lines["Walker2d-v5"].startswith("ok (nq=9" if deep else "not made (--deep")
    assert ("default dtype" in lines) == deep


def test_doctor_by_default_imports_neither_torch_nor_mujoco():
    """In a fresh interpreter: loading them is what takes doctor --deep seconds."""
    probe = ("import json, sys\nfrom gpdyn.cli import main\ncode = main(['doctor'])\n"
             "print(json.dumps([code, [m for m in ('torch', 'mujoco', 'gymnasium') if m in sys.modules]]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    *report, last = done.stdout.strip().splitlines()
    assert json.loads(last) == [0, []]
    lines = _lines("\n".join(report))
    for tool in TOOLS:
        assert lines[tool].startswith(("ok ", "missing")), lines[tool]
    assert lines["torch threads"].startswith("1 (--threads")


def test_torch_build_read_without_torch_is_the_one_torch_reports():
    import torch

    assert doctor.torch_cuda_build() == torch.version.cuda
    versions = doctor.package_versions()
    assert versions["torch"] == torch.__version__
    from gpdyn.data.store import package_versions

    assert set(package_versions()) <= set(versions)  # every package the stores record


def test_gpus_are_read_from_the_driver_files_or_the_device_files(tmp_path):
    gpus, dev = tmp_path / "gpus", tmp_path / "dev"
    (gpus / "0000:01:00.0").mkdir(parents=True)
    (gpus / "0000:01:00.0" / "information").write_text("Model: \t NVIDIA H100 80GB HBM3\nIRQ: 42\n")
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (dev / name).write_text("")
    assert doctor.nvidia_gpus(gpus, dev) == ["NVIDIA H100 80GB HBM3 (0000:01:00.0)"]
    assert doctor.nvidia_gpus(tmp_path / "no-driver", dev) == [f"{dev / 'nvidia0'} (model unknown)",
                                                               f"{dev / 'nvidia1'} (model unknown)"]
    assert doctor.nvidia_gpus(tmp_path / "no-driver", tmp_path / "no-dev") == []


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_compiler_ok_names_it_and_the_native_kernel(monkeypatch):
    monkeypatch.setenv("CXX", "g++")
    monkeypatch.delenv("GPDYN_NATIVE", raising=False)
    line = doctor.check_compiler()
    assert line.startswith("ok (") and "g++" in line and "native GP prediction kernel" in line


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_compiler_found_without_compiling_says_deep_compiles(monkeypatch):
    monkeypatch.setenv("CXX", "g++")
    monkeypatch.delenv("GPDYN_NATIVE", raising=False)
    line = doctor.check_compiler(compile_probe=False)
    assert line.startswith("ok (") and "g++" in line and "--deep compiles one" in line


@pytest.mark.parametrize("compile_probe", [True, False])
def test_compiler_missing_says_predictions_take_the_torch_path(compile_probe, tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    line = doctor.check_compiler(compile_probe)
    assert line.startswith("missing: CXX=") and "no-such-compiler" in line and "slower torch path" in line


def test_compiler_that_cannot_compile_is_missing(tmp_path, monkeypatch):
    broken = tmp_path / "broken-c++"
    broken.write_text("#!/bin/sh\necho 'broken-c++: no C++ here' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CXX", str(broken))
    line = doctor.check_compiler()
    assert line.startswith("missing:") and "cannot compile C++ (broken-c++: no C++ here)" in line
    line = doctor.check_compiler(compile_probe=False)  # nor does it answer --version
    assert line.startswith("missing:") and "--version exited 1" in line


def test_ffmpeg_ok_from_the_imageio_ffmpeg_dependency(monkeypatch):
    monkeypatch.delenv("IMAGEIO_FFMPEG_EXE", raising=False)
    line = doctor.check_ffmpeg()
    assert line.startswith("ok (ffmpeg version ") and ".mp4" in line


def test_ffmpeg_missing_says_render_cannot_write_mp4(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(tmp_path / "no-ffmpeg"))
    line = doctor.check_ffmpeg()
    assert line.startswith("missing:") and "no-ffmpeg" in line and "cannot write .mp4" in line and ".gif still works" in line


@pytest.mark.parametrize("create_context", [True, False])
def test_gl_backend_that_render_does_not_use_is_missing(create_context, monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "glx")  # MuJoCo takes it; gpdyn render draws with egl, osmesa, glfw
    line = doctor.check_gl_backend(create_context)
    assert line.startswith("missing (MUJOCO_GL='glx')") and "cannot draw frames" in line


@pytest.mark.parametrize("create_context", [True, False])
def test_gl_backend_that_does_not_load_is_missing(create_context, monkeypatch):
    # MuJoCo's EGL module refuses to load when PyOpenGL is told to use another platform
    monkeypatch.setenv("MUJOCO_GL", "egl")
    monkeypatch.setenv("PYOPENGL_PLATFORM", "osmesa")
    line = doctor.check_gl_backend(create_context)
    assert line.startswith("missing (MUJOCO_GL='egl': the egl library does not load: ImportError")
    assert "PYOPENGL_PLATFORM" in line and "install libegl1" in line


@pytest.mark.parametrize("create_context", [True, False])
def test_gl_backend_unset_is_probed_as_render_uses_it(create_context, monkeypatch):
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.delenv("PYOPENGL_PLATFORM", raising=False)
    line = doctor.check_gl_backend(create_context)
    assert "MUJOCO_GL unset, render uses egl" in line
    assert line.startswith(("ok (", "missing ("))


def test_gl_backend_found_or_not_as_the_context_is_made(monkeypatch):
    """Where the egl library loads, the quick check finds it (and says that it made no context)."""
    monkeypatch.setenv("MUJOCO_GL", "egl")
    monkeypatch.delenv("PYOPENGL_PLATFORM", raising=False)
    if doctor.check_gl_backend(create_context=True).startswith("missing"):
        pytest.skip("needs an EGL library that makes a context (none on this machine)")
    found = doctor.check_gl_backend(create_context=False)
    assert found.startswith("ok (MUJOCO_GL='egl'; lib") and "--deep creates one" in found


def test_glfw_without_a_display_is_missing(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "glfw")
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    line = doctor.check_gl_backend(create_context=False)
    assert line.startswith("missing (MUJOCO_GL='glfw': the glfw library does not load:") and "display" in line
