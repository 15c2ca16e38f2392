"""The wheel holds the whole package with its data, and runs from outside the source tree.

The wheel is built from a copy of the working tree, so the checkout gets no build/ or
*.egg-info; it is then unpacked into a bare folder and run from another folder with only
that one on the path, so a file the code finds outside the package would be missing.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

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
        "gpdyn/robots/assets/kuka_iiwa.xml",
    }
    assert shipped <= names
    checkpoints = {n for n in names if n.startswith("gpdyn/policies/checkpoints/")}
    assert len(checkpoints) == len(list((source / "gpdyn/policies/checkpoints").glob("*.pt"))) == 10
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

    gpdyn("collect", "walker", "--store", "walker.zarr", "--episodes", "1", "--envs", "1", "--out", "run-walker")
    gpdyn("collect", "kuka", "--store", "kuka.zarr", "--offline", "50", "--online", "50", "--out", "run-kuka")

    from gpdyn.data.store import EpisodeStore

    (policy,) = EpisodeStore.open(work / "walker.zarr").attrs["policies"]
    assert Path(policy["file"]) == site / "gpdyn" / "policies" / "walker2d_trpo.pt"
    assert EpisodeStore.open(work / "kuka.zarr").n_rows > 0
