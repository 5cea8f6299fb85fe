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


def _statistics(mod) -> set[tuple[str, ...]]:
    """Every figure the prose may quote, as formatted at 2, 3 and 4 decimals: each variant's mean ± half-width
    of every score (test accuracy, worst cases, each attack), and each pair's paired difference [low, high]."""
    import csv
    import math

    runs = mod.per_run(list(csv.DictReader((OUT / "tradeoff.csv").open())))
    keys = ("accuracy", "labels", "psnr", *mod.LABEL_ATTACKS, *mod.INPUT_ATTACKS)
    variants = sorted({v for v, _ in runs})
    found: set[tuple[str, ...]] = set()
    for d in (2, 3, 4):
        for v in variants:
            for key in keys:
                xs = [r[key] for (v_, _), r in runs.items() if v_ == v and key in r]
                if xs:
                    m, h = mod.t_interval(xs)
                    found.add((f"{m:.{d}f}",) if math.isnan(h) else (f"{m:.{d}f}", f"{h:.{d}f}"))
            for b in variants:
                for key in keys:
                    p = mod.paired(runs, v, b, key)
                    if p is not None and not math.isnan(p[2]):
                        _, m, h = p
                        found.add((f"{m:+.{d}f}", f"{m - h:+.{d}f}", f"{m + h:+.{d}f}"))
    return found


def test_the_prose_of_the_results_page_quotes_tradeoff_csv():
    """Every "m ± h" and "d [low, high]" that docs/results/privacy.md's "What the numbers say" bullets state is a
    statistic of tradeoff.csv (a variant's mean ± half-width, or a paired difference with its interval): the
    bullets were written by hand, so a number typed wrong or left stale by a new sweep fails here."""
    import re

    text = (OUT.parent / "privacy.md").read_text()
    prose = text.split("**What the numbers say** (every row at 5 seeds)", 1)[1].split("\n## ", 1)[0].replace("−", "-")
    found = _statistics(_collect())
    intervals = re.findall(r"([-+]?\d+\.\d+) \[([-+]?\d+\.\d+), ([-+]?\d+\.\d+)\]", prose)
    spreads = re.findall(r"(?<![\d.])(\d+\.\d+) ± (\d+\.\d+)", prose)
    assert len(intervals) >= 8 and len(spreads) >= 8  # the bullets quote both kinds
    bad = [f"{m} [{lo}, {hi}]" for m, lo, hi in intervals
           if tuple(x if x[0] in "+-" else "+" + x for x in (m, lo, hi)) not in found]
    bad += [f"{m} ± {h}" for m, h in spreads if (m, h) not in found]
    assert not bad, f"not a statistic of tradeoff.csv: {bad}"
