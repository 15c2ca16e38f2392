"""The test suite's own conventions: every skip says what it needs, and the ``slow`` marker that
``pytest -m "not slow"`` (the fast core) deselects is registered.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_CALLS = {"skip", "skipif", "importorskip"}


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "text"`` constants."""
    strings = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            strings.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return strings


def _text(node: ast.expr | None, strings: dict[str, str]) -> str | None:
    """The reason's text, or its leading literal part for an f-string; None when it cannot be read."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return node.values[0].value
    if isinstance(node, ast.Name):
        return strings.get(node.id)
    return None


def skip_reasons(source: str) -> list[tuple[int, str | None]]:
    """(line, reason) of every pytest.skip / skipif / importorskip call (None: no readable reason)."""
    tree = ast.parse(source)
    strings = _module_strings(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SKIP_CALLS):
            continue
        keyword = next((k.value for k in node.keywords if k.arg in ("reason", "msg")), None)
        positional = {"skip": 0, "importorskip": 2}.get(node.func.attr)  # skip(reason), importorskip(name, minversion, reason)
        if keyword is None and positional is not None and len(node.args) > positional:
            keyword = node.args[positional]
        found.append((node.lineno, _text(keyword, strings)))
    return found


def test_every_skip_says_what_it_needs():
    vague = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for line, reason in skip_reasons(path.read_text()):
            if reason is None or not reason.startswith("needs "):
                vague.append(f"{path.name}:{line}: {reason!r}")
    assert not vague, "skip reasons must start with 'needs ' and name the requirement: " + "; ".join(vague)


def test_the_skip_check_reads_every_form_and_can_fail():
    source = (
        'NEED = "needs X: install it"\n'
        "a = pytest.mark.skipif(True, reason='no g++ here')\n"
        "b = pytest.importorskip('gpytorch')\n"
        "c = pytest.importorskip('gpytorch', reason=NEED)\n"
        "pytest.skip(f'needs an OpenGL backend: {err}')\n"
    )
    assert skip_reasons(source) == [(2, "no g++ here"), (3, None), (4, "needs X: install it"), (5, "needs an OpenGL backend: ")]


def test_the_fast_subset_marker_is_registered():
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("slow:") for m in markers) and any(m.startswith("gpu:") for m in markers)
