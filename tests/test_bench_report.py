"""docs/benchmarks.md's marked sections: each belongs to one benchmark, which rewrites it whole.

Text written by hand inside a benchmark's markers is lost the next time that benchmark runs (a
hand-written section on parallel sweeps once sat inside ``bench:storage``), so every marked
section must be exactly what :func:`stagefate.bench.report.render` writes: its own heading, its
machine, command and date, its body, and no other section.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stagefate.bench.report import Section, write_section

REPORT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
MARKED = re.compile(r"<!-- bench:([\w-]+) -->\n(.*?)<!-- /bench:\1 -->", re.DOTALL)
RENDERED_HEAD = re.compile(
    r"## .+\n\nMachine: .+  \nCommand: `.+`.*  \nDate: \d{4}-\d{2}-\d{2}\n\n"
)
"""How :func:`render` opens a section (a note after the command, such as its commit, is kept)."""


def _sections() -> list[tuple[str, str]]:
    return MARKED.findall(REPORT.read_text(encoding="utf-8"))


def test_the_report_has_marked_sections() -> None:
    names = [name for name, _ in _sections()]
    assert {"dispatch", "tree", "replay", "storage", "vllm"} <= set(names)
    assert len(names) == len(set(names)), f"a benchmark's markers stand twice: {names}"


@pytest.mark.parametrize(("name", "body"), _sections(), ids=lambda value: value[:24])
def test_each_marked_section_is_one_benchmarks_output(name: str, body: str) -> None:
    assert RENDERED_HEAD.match(body), (
        f"bench:{name} does not open as `stagefate bench` writes it (## title, Machine, "
        "Command, Date): text written by hand belongs outside the markers"
    )
    others = re.findall(r"^## .*$", body, re.MULTILINE)[1:]
    assert not others, (
        f"bench:{name} holds another section {others}: the next `stagefate bench` run would "
        "erase it; move it outside the markers"
    )


def test_writing_a_section_replaces_only_its_own(tmp_path: Path) -> None:
    report = tmp_path / "benchmarks.md"
    report.write_text(
        "# Benchmarks\n\nby hand, before\n\n"
        "<!-- bench:a -->\n## A\n\nold a\n<!-- /bench:a -->\n\nby hand, between\n\n"
        "<!-- bench:b -->\n## B\n\nold b\n<!-- /bench:b -->\n\nby hand, after\n",
        encoding="utf-8",
    )
    write_section(Section("a", "A", "new a"), "stagefate bench a", report)
    write_section(Section("c", "C", "new c"), "stagefate bench c", report)
    text = report.read_text(encoding="utf-8")
    assert "old a" not in text and "new a" in text and "old b" in text
    for hand in ("by hand, before", "by hand, between", "by hand, after"):
        assert text.count(hand) == 1
    assert text.index("by hand, after") < text.index("<!-- bench:c -->")  # a new one is appended
    assert [name for name, _ in MARKED.findall(text)] == ["a", "b", "c"]
    assert all(RENDERED_HEAD.match(body) for name, body in MARKED.findall(text) if name != "b")
