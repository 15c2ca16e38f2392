"""The README opens with the two set-up commands, CI runs the second one, and the guides stand alone.

The guides (README, docs/, policies/ and logs/ READMEs) may only point at what the
repository holds: their links and repository paths exist, every `gpdyn.*` name they
cite imports, and every complete `gpdyn` command in their code blocks parses. The dated
records under docs/studies/ describe code of their time and are left as written.
"""

import importlib
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDES = sorted(
    [ROOT / "README.md", ROOT / "policies" / "README.md", ROOT / "logs" / "README.md", ROOT / "docs" / "results" / "README.md"]
    + list((ROOT / "docs").glob("*.md"))
)
STUDIES = sorted((ROOT / "docs" / "studies").glob("*.md"))
# a repository path in backquotes; gymnasium ids such as gpdyn/KukaIiwa-v0 are names, not paths
REPO_PATH = re.compile(r"`((?:gpdyn|docs|scripts|tests|policies|envs|logs)/[^`\s]*)`")
GYM_ID = re.compile(r"gpdyn/[A-Z]\w*-v\d+$")
# a repository file named anywhere in the text, e.g. in `python scripts/x.py ...`
REPO_FILE = re.compile(r"(?<![\w/.-])((?:scripts|docs|gpdyn|tests|envs|policies)/[\w./-]*\.(?:py|md|xml|pt|sh|json|png))")
# the tracker's items and numbered studies: the history of how the code came to be
_ORDINAL = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|\d+(?:st|nd|rd|th))"
HISTORY = re.compile(rf"\bissue\b|\b{_ORDINAL} study\b", re.IGNORECASE)


def _guide_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_readme_opens_with_two_commands_and_ci_runs_the_test_one():
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert text.index("```bash") < text.index("\n## ")  # before any section
    assert len(block) == 2 and "gpdyn demo" in block[0] and "pytest" in block[1]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [block[1]]


@pytest.mark.parametrize("guide", GUIDES + STUDIES, ids=_guide_id)
def test_docs_cite_nothing_outside_the_repository(guide):
    text = guide.read_text()
    for outside in ("../shared", "DESIGN.md", "papers/"):
        assert outside not in text, f"{_guide_id(guide)} cites {outside!r}, which is not in the repository"
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        target = target.split("#", 1)[0]
        if target and not re.match(r"[a-z]+:", target):  # a relative link, not a URL
            assert (guide.parent / target).exists(), f"{_guide_id(guide)}: link to {target} goes nowhere"


@pytest.mark.parametrize("guide", GUIDES, ids=_guide_id)
def test_guides_name_paths_that_exist_and_no_process_history(guide):
    text = guide.read_text()
    for path in REPO_PATH.findall(text):
        if any(c in path for c in "*<>[]{}|") or GYM_ID.match(path):  # patterns and placeholders
            continue
        assert (ROOT / path).exists(), f"{_guide_id(guide)} names {path}, which does not exist"
    for path in REPO_FILE.findall(text):
        assert (ROOT / path).exists(), f"{_guide_id(guide)} names {path}, which does not exist"
    history = HISTORY.search(text)
    assert history is None, f"{_guide_id(guide)}: '{history.group(0)}' is process history; it belongs in docs/studies/"


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("guide", GUIDES, ids=_guide_id)
def test_guides_cite_python_names_that_exist(guide):
    names = sorted(set(re.findall(r"(?<![\w./-])(gpdyn(?:\.[A-Za-z_]\w*)+)", guide.read_text())))
    missing = [n for n in names if not _resolves(n)]
    assert not missing, f"{_guide_id(guide)} cites names that do not import: {missing}"


def _commands(text: str) -> list[str]:
    """Complete `gpdyn` command lines of the code blocks (synopses with placeholders left out)."""
    lines = []
    for block in re.findall(r"```(?:bash)?\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.split(r"\s#", line.strip(), maxsplit=1)[0].strip()
            if not re.match(r"(\.venv/bin/)?gpdyn ", line):
                continue
            # placeholders: "...", shell variables, [optional] parts, a|b choices, NAME
            if re.search(r"\.\.\.|\$|\[|\||\b[A-Z][A-Z_]{2,}\b", line):
                continue
            lines.append(line)
    return lines


@pytest.mark.parametrize("guide", GUIDES, ids=_guide_id)
def test_guide_commands_parse(guide):
    from gpdyn.cli import build_parser

    for line in _commands(guide.read_text()):
        try:
            build_parser().parse_args(shlex.split(line)[1:])
        except SystemExit:
            pytest.fail(f"{_guide_id(guide)}: `{line}` is not a valid gpdyn command")


def test_the_command_check_can_fail():
    from gpdyn.cli import build_parser

    (line,) = _commands("```bash\ngpdyn control walker --learner svdgp --no-such-option 3\n```")
    with pytest.raises(SystemExit):
        build_parser().parse_args(shlex.split(line)[1:])


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


@pytest.mark.slow
def test_readme_python_snippets_run_as_written(tmp_path):
    """Every Python block of the README runs as written, in order and in one namespace, in a
    folder holding a small Walker2d store under the name the blocks use (``walker.zarr``)."""
    from synthetic import make_walker_store

    blocks = _python_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 3 and any("ReplayConfig" in b for b in blocks)
    make_walker_store(tmp_path / "walker.zarr", [80, 60, 70])  # the working directory is tmp_path (conftest)
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
    assert (namespace["final"]["coverage_mean"] >= 0) and set(namespace["cfg"].learners) == {"svdgp", "svi"}
    assert len(list((tmp_path / "logs").glob("replay-*"))) == 1 and len(list((tmp_path / "logs").glob("learn-*"))) == 1


def test_the_snippet_check_can_fail(tmp_path):
    with pytest.raises(NameError):
        exec(compile(_python_blocks("```python\nlearner.step(x, y)\n```")[0], "snippet", "exec"), {})
