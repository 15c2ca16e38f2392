"""The wheel holds the whole package with its data, and runs from outside the source tree;
the torch range it declares is the one scripts/setup.sh and the checkpoint loaders enforce.

The wheel is built from a copy of the working tree, so the checkout gets no build/ or
*.egg-info; it is then unpacked into a bare folder and run from another folder with only
that one on the path, so a file the code finds outside the package would be missing.
"""

from __future__ import annotations

import ast
import configparser
import email.message
import email.parser
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
# what .gitignore keeps out of the repository, and nothing a build needs: these names at the
# top level only (gpdyn/data is a package), those patterns anywhere
_TOP_LEVEL_NOT_COPIED = {".git", ".venv", "logs", "data", "build", "dist", ".whl", ".gl"}
_NOT_COPIED = shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache", "*.zarr")


def _ignore(folder: str, names: list[str]) -> set[str]:
    skipped = set(_NOT_COPIED(folder, names))
    if Path(folder) == ROOT:
        skipped |= _TOP_LEVEL_NOT_COPIED & set(names)
    return skipped


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The copy of the working tree the wheel is built from (the reference for its contents)."""
    src = tmp_path_factory.mktemp("src") / "gpdyn-src"
    shutil.copytree(ROOT, src, ignore=_ignore)
    return src


@pytest.fixture(scope="module")
def wheel(source, tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    # no build isolation: the build uses this environment's setuptools and needs no index
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(source)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = dist.glob("gpdyn-*.whl")
    return built


def test_wheel_holds_every_module_and_the_package_data(source, wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {
        "gpdyn/policies/walker2d_trpo.pt",
        "gpdyn/policies/checkpoints/walker2d_trpo_100000.pt",
        "gpdyn/policies/checkpoints/walker2d_trpo_1000000.pt",
        "gpdyn/policies/hopper_trpo.pt",
        "gpdyn/policies/checkpoints/hopper_trpo_200000.pt",
        "gpdyn/policies/checkpoints/hopper_trpo_1000000.pt",
        "gpdyn/robots/assets/kuka_iiwa.xml",
    }
    assert shipped <= names
    checkpoints = {n for n in names if n.startswith("gpdyn/policies/checkpoints/")}
    # 10 Walker2d checkpoints (every 100,000 steps) and 5 Hopper ones (every 200,000)
    assert len(checkpoints) == len(list((source / "gpdyn/policies/checkpoints").glob("*.pt"))) == 15
    packages = {
        p.parent.relative_to(source).as_posix() for p in (source / "gpdyn").rglob("__init__.py") if "__pycache__" not in p.parts
    }
    assert {"gpdyn", "gpdyn/cli", "gpdyn/control", "gpdyn/data", "gpdyn/experiments", "gpdyn/gp", "gpdyn/robots", "gpdyn/sim"} <= packages
    assert {f"{p}/__init__.py" for p in packages} <= names
    # every file under gpdyn/: the modules and the package data
    files = {p.relative_to(source).as_posix() for p in (source / "gpdyn").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    missing = files - names
    assert not missing, f"files under gpdyn/ the wheel does not carry: {sorted(missing)}"


def test_wheel_installs_one_top_level_package_and_the_command(wheel):
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    top = {n.split("/", 1)[0] for n in names}
    (info,) = [t for t in top if t.endswith(".dist-info")]
    assert top == {"gpdyn", info}, f"top-level entries besides gpdyn: {sorted(top - {'gpdyn', info})}"
    assert archive.read(f"{info}/top_level.txt").decode().split() == ["gpdyn"]
    entry_points = configparser.ConfigParser()
    entry_points.read_string(archive.read(f"{info}/entry_points.txt").decode())
    assert dict(entry_points["console_scripts"]) == {"gpdyn": "gpdyn.cli:main"}


@pytest.mark.slow
def test_unpacked_wheel_collects_with_the_shipped_policy_and_arm_model(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}

    def gpdyn(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "gpdyn", *args], cwd=work, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    where = subprocess.run(
        [sys.executable, "-c", "import gpdyn; print(gpdyn.__file__)"], cwd=work, env=env, capture_output=True, text=True
    )
    assert Path(where.stdout.strip()).parent == site / "gpdyn"  # the wheel's copy, not the checkout's
    import gpdyn as checkout

    assert gpdyn("--version") == f"gpdyn {checkout.__version__}\n"

    gpdyn("collect", "walker", "--store", "walker.zarr", "--episodes", "1", "--envs", "1", "--out", "run-walker")
    gpdyn("collect", "kuka", "--store", "kuka.zarr", "--offline", "50", "--online", "50", "--out", "run-kuka")

    from gpdyn.data.store import EpisodeStore

    (policy,) = EpisodeStore.open(work / "walker.zarr").attrs["policies"]
    assert Path(policy["file"]) == site / "gpdyn" / "policies" / "walker2d_trpo.pt"
    assert EpisodeStore.open(work / "kuka.zarr").n_rows > 0


# --- the torch range, the version, the license ---------------------------------------

SETUP_SH = ROOT / "scripts" / "setup.sh"
# torch releases on both sides of each bound, with and without a local build tag
TORCH_RELEASES = ["1.13.1", "2.5.1", "2.5.1+cu121", "2.6.0", "2.6.0+cpu", "2.13.0+cpu", "2.99.0", "3.0.0", "3.1.0+cu130"]


def _metadata(wheel: Path) -> email.message.Message:
    archive = zipfile.ZipFile(wheel)
    (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    return email.parser.Parser().parsestr(archive.read(name).decode())


def _torch_requirement(metadata: email.message.Message) -> Requirement:
    (torch,) = [r for r in map(Requirement, metadata.get_all("Requires-Dist")) if r.name == "torch"]
    return torch


def _setup_sh(*lines: str, **env: str) -> subprocess.CompletedProcess:
    """Run bash lines after sourcing scripts/setup.sh (its functions, not its main)."""
    script = "\n".join([f"source {shlex.quote(str(SETUP_SH))}", *lines])
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**os.environ, **env}, timeout=60)


def _fake_torch(folder: Path, version: str) -> Path:
    """A folder whose ``torch`` package reports ``version`` (put first on PYTHONPATH)."""
    (folder / "torch").mkdir(parents=True)
    (folder / "torch" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    return folder


def test_wheel_pins_the_torch_range_that_setup_and_the_loader_check_enforce(wheel):
    import gpdyn
    from gpdyn.torch_check import TORCH_REQUIREMENT

    metadata = _metadata(wheel)
    assert metadata["Version"] == gpdyn.__version__
    torch = _torch_requirement(metadata)
    assert torch.specifier == SpecifierSet(">=2.6,<3")  # weights_only is safe from 2.6 (CVE-2025-32434)
    assert Requirement(TORCH_REQUIREMENT).specifier == torch.specifier
    (pinned,) = re.findall(r"^torch_version=(\S+)$", SETUP_SH.read_text(), re.MULTILINE)
    assert Version(pinned) in torch.specifier, f"setup.sh installs torch {pinned}, outside {torch.specifier}"
    # setup.sh's own range check accepts exactly the releases the wheel accepts
    done = _setup_sh(*[f"torch_in_range {v} && echo {v} in || echo {v} out" for v in [pinned, *TORCH_RELEASES]])
    assert done.returncode == 0, done.stderr
    verdicts = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert verdicts == {v: "in" if Version(v) in torch.specifier else "out" for v in [pinned, *TORCH_RELEASES]}


def test_wheel_keeps_single_feature_dependencies_in_extras_that_setup_installs(wheel):
    """scipy (SARCOS .mat files) and imageio-ffmpeg (MP4) are extras, out of the default
    install; scripts/setup.sh installs every extra, since the test suite uses them all."""
    metadata = _metadata(wheel)
    requirements = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    base = {r.name for r in requirements if r.marker is None}
    extras = {e: {r.name for r in requirements if r.marker is not None and r.marker.evaluate({"extra": e})}
              for e in metadata.get_all("Provides-Extra")}
    assert extras["video"] == {"imageio-ffmpeg"} and extras["sarcos"] == {"scipy"}
    assert not base & {"imageio-ffmpeg", "scipy"}
    assert "mujoco-core" in base and "mujoco" not in base  # the engine, without mujoco 4's studio viewer app
    (installed,) = re.findall(r'install -e "\.\[([\w,]+)\]"', SETUP_SH.read_text())
    assert set(installed.split(",")) == set(extras)


def test_the_version_lives_in_one_place():
    import gpdyn

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gpdyn.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", gpdyn.__version__)
    written = [p.relative_to(ROOT).as_posix() for p in [ROOT / "pyproject.toml", SETUP_SH, *(ROOT / "gpdyn").rglob("*.py")]
               if re.search(rf"['\"]{re.escape(gpdyn.__version__)}['\"]", p.read_text())]
    assert written == ["gpdyn/__init__.py"]


def test_wheel_carries_the_mit_license(wheel):
    archive = zipfile.ZipFile(wheel)
    (license_file,) = [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    text = archive.read(license_file).decode()
    assert text.startswith("MIT License") and "the gpdyn authors" in text
    assert _metadata(wheel)["License"] == "MIT"


def test_version_flag_prints_the_package_version(capsys):
    import gpdyn
    from gpdyn.cli import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"gpdyn {gpdyn.__version__}\n"


@pytest.mark.parametrize("old", ["2.5.1+cu121", "3.1.0"])
def test_setup_refuses_a_torch_outside_the_range_before_making_the_venv(tmp_path, old):
    fake = _fake_torch(tmp_path / "site", old)
    venv = tmp_path / "venv"
    done = subprocess.run(["bash", str(SETUP_SH)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(fake), "GPDYN_PYTHON": sys.executable, "GPDYN_VENV": str(venv)})
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"has torch {old}; gpdyn needs torch>=2.6,<3" in done.stderr
    assert f"{sys.executable} -m pip install " in done.stderr and "'torch>=2.6,<3'" in done.stderr
    assert ("CVE-2025-32434" in done.stderr) == old.startswith("2.")
    assert not venv.exists()  # refused before anything was made


def test_setup_refuses_an_old_torch_in_an_existing_venv(tmp_path):
    fake = _fake_torch(tmp_path / "site", "2.4.0")
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nPYTHONPATH={shlex.quote(str(fake))} exec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    done = subprocess.run(["bash", str(SETUP_SH)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GPDYN_VENV": str(python.parents[1])})
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"'{python}' has torch 2.4.0" in done.stderr
    assert f"{python} -m pip install --upgrade 'torch>=2.6,<3'" in done.stderr
    assert "installing" not in done.stdout  # neither torch nor gpdyn was installed over it


# --- the loader's own torch check ---------------------------------------------------


@pytest.mark.parametrize("version", ["2.5.1", "2.5.1+cu121", "1.13.1", "2.0.0a0+git1234"])
def test_torch_check_refuses_a_torch_before_2_6_naming_it(version):
    from gpdyn.errors import InputError
    from gpdyn.torch_check import require_safe_torch_load

    with pytest.raises(InputError, match=rf"torch {re.escape(version)} cannot load checkpoints safely.*torch >= 2\.6"):
        require_safe_torch_load(version)


@pytest.mark.parametrize("version", ["2.6.0", "2.13.0+cpu", "2.10.0a0"])
def test_torch_check_accepts_2_6_and_later(version):
    from gpdyn.torch_check import require_safe_torch_load

    require_safe_torch_load(version)
    require_safe_torch_load()  # the installed torch (setup.sh only installs one in the range)


def test_policy_and_checkpoint_loads_refuse_an_old_torch(tmp_path, monkeypatch):
    import torch

    from gpdyn.errors import InputError
    from gpdyn.gp.online import load_learner
    from gpdyn.robots.policy import load_policy

    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(b"not read")
    monkeypatch.setattr(torch, "__version__", "2.5.1")
    with pytest.raises(InputError, match=r"torch 2\.5\.1 cannot load checkpoints safely"):
        load_policy()  # the shipped policy, which loads with a safe torch
    with pytest.raises(InputError, match=r"torch 2\.5\.1 cannot load checkpoints safely"):
        load_learner(checkpoint)


@pytest.mark.slow
def test_every_torch_load_in_the_package_checks_torch_first():
    """Each function that calls torch.load calls require_safe_torch_load on an earlier line."""
    loads = 0
    for path in sorted((ROOT / "gpdyn").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for func in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            calls = [n for n in ast.walk(func) if isinstance(n, ast.Call)]
            names = {n.lineno: ast.unparse(n.func) for n in calls}
            for line, name in names.items():
                if name == "torch.load":
                    loads += 1
                    checks = [ln for ln, nm in names.items() if nm == "require_safe_torch_load" and ln < line]
                    assert checks, f"{path.relative_to(ROOT)}:{line}: torch.load without require_safe_torch_load() before it"
    assert loads >= 2  # policies and learner checkpoints
