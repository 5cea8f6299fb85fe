"""The docs site's pages: every table is whole, the nav lists every page, and the pages say what is
(history goes to CHANGELOG.md). ``mkdocs build --strict`` (in .ci/run) checks the links and anchors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """The hand-written and generated pages: README.md and docs/**/*.md, less the results folders' own files."""
    def in_a_results_folder(page: Path) -> bool:  # docs/results/NAME/...: a sweep's report.md, compare.md
        parts = page.relative_to(DOCS).parts
        return parts[0] == "results" and len(parts) > 2

    return [ROOT / "README.md", *(p for p in sorted(DOCS.rglob("*.md")) if not in_a_results_folder(p))]


def tables(text: str) -> list[list[str]]:
    """The runs of consecutive table lines (lines starting with ``|``) outside code fences."""
    runs, run, fence = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        if not fence and line.startswith("|"):
            run.append(line)
            continue
        if run:
            runs.append(run)
            run = []
    return runs + ([run] if run else [])


def cells(row: str) -> int:
    """The cell count of a table row (escaped ``\\|`` and pipes inside code spans are not separators)."""
    row = re.sub(r"`[^`]*`", "code", row.replace("\\|", ""))
    return row.strip().strip("|").count("|") + 1


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_table_is_whole(page):
    """Each table starts with a header and a separator row and keeps its width: a blank line inside a
    table (as once at the key reference's `batch-size`) leaves rows without a header, shown as text."""
    for run in tables(page.read_text()):
        assert len(run) >= 2 and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", run[1].strip()), (page.name, run[:2])
        width = cells(run[0])
        assert all(cells(row) == width for row in run), (page.name, [r[:60] for r in run if cells(r) != width])


def test_the_nav_lists_every_page_and_only_existing_ones():
    nav = re.findall(r"^\s*- (?:[^:\n]+: )?([\w./-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    listed = {DOCS / p for p in nav}
    assert all(p.is_file() for p in listed), [str(p) for p in listed if not p.is_file()]
    assert set(pages()[1:]) == listed, set(pages()[1:]) ^ listed


def test_the_key_and_strategy_references_keep_their_markers():
    """Their content is generated between the markers (``sflower keys --write``)."""
    for name, marker in (("config.md", "sflower-keys"), ("strategies.md", "sflower-strategies")):
        text = (DOCS / "reference" / name).read_text()
        assert text.count(f"<!-- {marker} -->") == 1 and text.count(f"<!-- end {marker} -->") == 1, name
        assert text.index(f"<!-- {marker} -->") < text.index(f"<!-- end {marker} -->"), name


HISTORY = re.compile(r"\bissue \d+|\bthis session\b|\bpreviously\b|\bthe earlier claim\b|\buntil this\b", re.I)


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_say_what_is(page):
    """History (issue numbers, what was true before) belongs in CHANGELOG.md, not in the docs."""
    hits = [line.strip()[:80] for line in page.read_text().splitlines() if HISTORY.search(line)]
    assert not hits, hits


def test_the_changelog_is_a_page_of_the_site():
    assert (ROOT / "CHANGELOG.md").is_file()
    assert '--8<-- "CHANGELOG.md"' in (DOCS / "changelog.md").read_text()
