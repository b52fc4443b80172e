"""The runnable examples in docs/ run as documented."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parent.parent / "docs" / "examples"
EXAMPLES = sorted(p for p in FOLDER.glob("*.py") if not p.name.startswith("test_"))
EXAMPLE_TESTS = sorted(FOLDER.glob("test_*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(path), run_name="__main__")
    assert "spliced 64 tokens from L3" in capsys.readouterr().out


@pytest.mark.parametrize("path", EXAMPLE_TESTS, ids=[p.name for p in EXAMPLE_TESTS])
def test_the_example_integration_tests_pass(path: Path) -> None:
    """docs/integration.md's example test file, every test in it, as a user would run it."""
    module = runpy.run_path(str(path))
    tests = {name: test for name, test in module.items() if name.startswith("test_")}
    assert tests, f"{path.name} has no tests"
    for test in tests.values():
        test()
