"""Optional extras: the default install leaves out what only one feature needs (scipy for
SARCOS .mat files, imageio-ffmpeg for MP4 videos); the package imports them only where that
feature runs, and a feature used without its extra is an InputError naming the extra.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.io import savemat
from scipy.stats import spearmanr

from gpdyn.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
# top-level module -> the extra that installs it (pyproject.toml [project.optional-dependencies])
OPTIONAL_MODULES = {"scipy": "sarcos", "imageio_ffmpeg": "video"}


def _guarded_by_import_error(handlers: list[ast.ExceptHandler]) -> bool:
    names = []
    for handler in handlers:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        names += [k.id for k in kinds if isinstance(k, ast.Name)]
    return bool({"ImportError", "ModuleNotFoundError"} & set(names))


def _unguarded_optional_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import of an optional module outside a ``try`` that catches ImportError."""
    found = []

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found.extend((node.lineno, m) for m in modules if m.split(".")[0] in OPTIONAL_MODULES and not guarded)
        if isinstance(node, ast.Try):
            inner = guarded or _guarded_by_import_error(node.handlers)
            for child in node.body:
                visit(child, inner)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, guarded)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(tree, False)
    return found


def test_the_package_imports_optional_modules_only_behind_an_import_error_guard():
    unguarded = []
    for path in sorted((ROOT / "gpdyn").rglob("*.py")):
        for line, module in _unguarded_optional_imports(ast.parse(path.read_text())):
            unguarded.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not unguarded, "optional modules imported where a default install lacks them: " + "; ".join(unguarded)


def test_the_guard_check_can_fail():
    assert _unguarded_optional_imports(ast.parse("def f():\n    from scipy.io import loadmat\n")) == [(2, "scipy.io")]
    guarded = "try:\n    import imageio_ffmpeg\nexcept ImportError:\n    pass\n"
    assert _unguarded_optional_imports(ast.parse(guarded)) == []


def _without(monkeypatch, *modules: str) -> None:
    """Make ``import module`` fail as it does where the module is not installed."""
    for name in list(sys.modules):
        if name.split(".")[0] in modules:
            monkeypatch.delitem(sys.modules, name)
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def test_sarcos_import_without_scipy_names_the_extra_and_writes_no_store(tmp_path, monkeypatch):
    from gpdyn.cli import main
    from gpdyn.data.importers import read_sarcos

    mat = tmp_path / "sarcos_inv.mat"
    savemat(mat, {"sarcos_inv": np.zeros((5, 28))})
    _without(monkeypatch, "scipy")
    with pytest.raises(InputError, match=r"sarcos_inv\.mat: reading MATLAB \.mat files needs scipy: pip install 'gpdyn\[sarcos\]'"):
        read_sarcos(mat)
    assert main(["import", "sarcos", str(mat), "--store", str(tmp_path / "s.zarr")]) == 2
    assert not (tmp_path / "s.zarr").exists()


def test_mp4_render_without_imageio_ffmpeg_names_the_extra(walker_store, tmp_path, monkeypatch):
    from gpdyn.sim.render import render_episode

    _without(monkeypatch, "imageio_ffmpeg")
    out = tmp_path / "videos" / "episode.mp4"
    with pytest.raises(InputError, match=r"episode\.mp4: writing MP4 needs imageio-ffmpeg: pip install 'gpdyn\[video\]'"):
        render_episode(walker_store, 0, out)
    assert not out.parent.exists()


@pytest.mark.parametrize(
    "a, b",
    [
        ([3.0, 1.0, 2.0, 5.0, 4.0], [30.0, 10.0, 25.0, 50.0, 41.0]),
        ([1.0, 2.0, 2.0, 3.0, 3.0, 3.0], [6.0, 5.0, 5.0, 1.0, 2.0, 2.0]),  # ties share their mean rank
        (list(np.random.default_rng(0).standard_normal(64)), list(np.random.default_rng(1).standard_normal(64))),
    ],
)
def test_walker_rank_correlation_matches_scipy(a, b):
    from gpdyn.experiments.walk_learned_model import spearman

    assert spearman(np.array(a), np.array(b)) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)


def test_walker_rank_correlation_of_a_constant_sample_is_nan():
    from gpdyn.experiments.walk_learned_model import spearman

    assert np.isnan(spearman(np.ones(5), np.arange(5.0)))
