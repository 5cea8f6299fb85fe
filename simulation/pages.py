"""Results pages: the tables in the README and the docs are generated from the results files.

A markdown file (README.md, or any page under ``docs/`` at any depth: the
results pages ``docs/results/NAME.md`` sit beside the results folders) states a
sweep's results through a marked block::

    <!-- sflower-report docs/results/mu-splitfed-table1 -->
    (the tables of that directory's report, written by this module)
    <!-- end sflower-report -->

whose content is :func:`simulation.outputs.report.tables` of the named directory's
``results.csv`` and ``sweep.json``: the configurations with their 95 %
intervals and the ranked pairs with their verdicts. The prose around a
block is written by hand; its numbers are not. ``sflower report --pages``
rewrites every block, ``sflower report --pages --check`` lists the stale
ones (and a test runs that check).
"""

from __future__ import annotations

import re
from pathlib import Path

from simulation.outputs.report import load_results, tables

#: A generated block: its directory (relative to the repository root) and its content.
BLOCK = re.compile(r"(<!-- sflower-report (?P<dir>\S+) -->\n)(?P<body>.*?)(<!-- end sflower-report -->)", re.S)


def page_files(root: Path) -> list[Path]:
    """The markdown files that may hold blocks: README.md and ``docs/**/*.md``, searched recursively."""
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("**/*.md"))] if p.is_file()]


def render_page(text: str, root: Path) -> str:
    """``text`` with every block's content regenerated from its directory under ``root``.

    Raises:
        ConfigError: a block names a directory without results.
    """
    def body(match: re.Match) -> str:
        table, keys, meta = load_results(root / match["dir"])
        return f"{match[1]}\n{tables(table, keys, meta)}\n{match[4]}"

    return BLOCK.sub(body, text)


def update_pages(root: str | Path = ".", *, check: bool = False) -> list[Path]:
    """Regenerate the blocks of every page under ``root``.

    Args:
        check: only report, write nothing.

    Returns:
        the pages whose blocks differed from their results files (rewritten unless ``check``).
    """
    root = Path(root)
    stale = []
    for page in page_files(root):
        text = page.read_text()
        if not BLOCK.search(text):
            continue
        new = render_page(text, root)
        if new != text:
            stale.append(page)
            if not check:
                page.write_text(new)
    return stale


def blocks(root: str | Path = ".") -> list[tuple[Path, str]]:
    """Every (page, results directory) pair that a block names."""
    root = Path(root)
    return [(page, m["dir"]) for page in page_files(root) for m in BLOCK.finditer(page.read_text())]


