"""The README opens with the two set-up commands, and CI runs the second one."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_opens_with_two_commands_and_ci_runs_the_test_one():
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert text.index("```bash") < text.index("\n## ")  # before any section
    assert len(block) == 2 and "gpdyn demo" in block[0] and "pytest" in block[1]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [block[1]]
