"""Every published table is what the results files give: each docs/results report.md and every
generated block of README.md and docs/**/*.md (the results pages docs/results/*.md among them) is
rebuilt from its results.csv and sweep.json and compared."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulation.pages import BLOCK, blocks, render_page, update_pages
from simulation.outputs.report import load_results, render

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted(p.parent for p in (ROOT / "docs" / "results").glob("*/sweep.json"))


@pytest.mark.parametrize("out", RESULTS, ids=[p.name for p in RESULTS])
def test_each_report_is_rebuilt_from_its_results_file(out):
    table, keys, meta = load_results(out)
    assert render(out, table, keys, meta) == (out / "report.md").read_text()


def test_every_results_folder_with_a_table_has_its_sweep_file_and_plots():
    for out in (ROOT / "docs" / "results").iterdir():
        if (out / "results.csv").is_file():
            assert (out / "sweep.json").is_file(), f"{out.name}: results.csv without sweep.json"
        if (out / "report.md").is_file():
            text = (out / "report.md").read_text()
            for name in ("curves.png", "profiles.png", "dissimilarity.png"):
                assert f"]({name})" not in text or (out / name).is_file(), f"{out.name}/report.md links a missing {name}"


def test_the_generated_blocks_of_the_docs_equal_their_results():
    assert blocks(ROOT), "no generated results block in README.md or docs/"
    assert update_pages(ROOT, check=True) == []


def test_each_results_page_holds_its_papers_blocks():
    """The results pages, one per paper, in docs/results/ beside the folders, hold the blocks."""
    pages = {page.relative_to(ROOT).as_posix() for page, _ in blocks(ROOT)}
    assert {f"docs/results/{name}.md" for name in ("gas", "mu-splitfed", "gapsl", "ringsfl")} <= pages
    named = [out for _, out in blocks(ROOT)]
    assert len(named) == len(set(named)), "a results folder is stated twice"


def test_a_stale_block_is_found_and_rewritten(tmp_path):
    out = RESULTS[0]
    page = tmp_path / "README.md"
    rel = out.relative_to(ROOT)
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).symlink_to(out)
    page.write_text(f"intro\n<!-- sflower-report {rel} -->\n| old | table |\n<!-- end sflower-report -->\nafter\n")
    assert update_pages(tmp_path, check=True) == [page]
    assert "| old | table |" in page.read_text()
    assert update_pages(tmp_path) == [page] and update_pages(tmp_path, check=True) == []
    text = page.read_text()
    assert text.startswith("intro\n") and text.endswith("after\n") and "| old | table |" not in text
    assert BLOCK.search(text) and render_page(text, tmp_path) == text


def test_blocks_are_found_in_pages_at_any_depth_under_docs(tmp_path):
    out = RESULTS[0]
    rel = out.relative_to(ROOT)
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).symlink_to(out)
    page = tmp_path / "docs" / "results" / "deeper" / "page.md"
    page.parent.mkdir(parents=True)
    page.write_text(f"<!-- sflower-report {rel} -->\n| old | table |\n<!-- end sflower-report -->\n")
    assert blocks(tmp_path) == [(page, rel.as_posix())]
    assert update_pages(tmp_path) == [page] and update_pages(tmp_path, check=True) == []
