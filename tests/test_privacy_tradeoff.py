"""docs/results/privacy-tradeoff/: its summary (summary.csv, summary.md) is what collect.py makes of its
tradeoff.csv, and the tables of its README and of docs/results/privacy.md are that summary."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "privacy-tradeoff"


def _collect():
    spec = importlib.util.spec_from_file_location("tradeoff_collect", OUT / "collect.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_summary_is_rebuilt_from_tradeoff_csv(tmp_path):
    text = _collect().write_summary(OUT / "tradeoff.csv", tmp_path, plots=False)
    assert text == (OUT / "summary.md").read_text()
    assert (tmp_path / "summary.csv").read_text() == (OUT / "summary.csv").read_text()


def test_the_readme_and_the_results_page_show_the_summary():
    found = _collect().pages(OUT)
    assert [p.name for p, _ in found] == ["README.md", "privacy.md"]
    for page, begin in found:
        block = page.read_text().split(begin)[1].split("<!-- end tt -->")[0]
        assert block == (OUT / "summary.md").read_text(), page
