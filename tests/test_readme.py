"""The README's Python runs as written (a user pastes it first)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"
BLOCKS = [
    (README.read_text()[: match.start()].count("\n") + 2, match.group(1))
    for match in re.finditer(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
]


def test_the_readme_has_python_to_run() -> None:
    assert BLOCKS


@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_a_readme_block_runs_as_written(
    line: int, code: str, capsys: pytest.CaptureFixture[str]
) -> None:
    exec(compile("\n" * (line - 1) + code, str(README), "exec"), {"__name__": "readme"})
    if "spliced" in code:  # the scheduler's example: the prompt comes from L3 whole
        assert "spliced 512 tokens from L3" in capsys.readouterr().out
