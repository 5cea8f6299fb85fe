"""The front door: the README's two commands and strategy table, and the worked new-strategy example of
docs/how-to/add-a-strategy.md, which is the shipped code and learns."""

import inspect
import json
import re
from pathlib import Path

import pytest

from simulation.cli import main
from strategies.algorithms.psl import PSL

ROOT = Path(__file__).resolve().parents[1]
HOW_TO = ROOT / "docs" / "how-to" / "add-a-strategy.md"
#: The README is the front door; the rest of the documentation is the docs site.
README_MAX_LINES = 300


def test_the_worked_example_is_the_shipped_class():
    section = HOW_TO.read_text().split("## Worked example", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert block == inspect.getsource(PSL)


@pytest.mark.slow  # a whole learning run of the worked example (77 s in CI's fast tier)
def test_the_worked_example_strategy_learns(tmp_path):
    out = tmp_path / "psl"
    code = main(["run", "strategy=psl", "dataset=mnist-5k", "partition=iid", "num-clients=4",
                 "concurrency=4", "global-iterations=3", "local-iterations=10", "heterogeneity=none",
                 f"output-dir={out}", "-q"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strategy"] == "psl"
    assert summary["server_updates"] == 3 * 10  # one server step per local iteration
    assert summary["final_accuracy"] >= 0.5, summary["final_accuracy"]


def test_readme_gives_the_two_commands_and_ci_runs_every_tier():
    """The README's two commands (main job, tests) exist; its test command is the fast tier, followed by the
    whole suite (``-m ""``); .ci/run runs the fast tier and then every test it leaves out: the slow ones on two
    workers, the e2e ones in the test process."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^pip install torch==2\.13\.0 && pip install -e \"\.\[dev\]\" && (.+)$", section, re.M)
    assert commands[0] == "sflower run", commands
    fast = commands[1]
    assert fast == "python -m pytest tests", commands
    lines = section.splitlines()
    assert lines[lines.index(next(ln for ln in lines if ln.endswith(f"&& {fast}"))) + 1] == f'{fast} -m ""'
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    runs = [ln.replace(" --durations=25", "") for ln in ci if ln.startswith(fast)]
    assert runs == [fast, f'{fast} -m "slow and not e2e" -n 2', f"{fast} -m e2e"], ci
    assert all(ln.endswith("--durations=25") for ln in ci if ln.startswith(fast)), ci


def test_the_fast_tier_is_the_default_and_leaves_out_e2e_and_slow():
    """pyproject registers the ``e2e`` and ``slow`` markers and its addopts filter is the conftest's fast tier."""
    import tomllib

    from tests.conftest import FAST_TIER

    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert {m.split(":", 1)[0] for m in ini["markers"]} >= {"e2e", "slow"}
    assert f'-m "{FAST_TIER}"' in ini["addopts"] and FAST_TIER == "not e2e and not slow"


def test_a_file_or_test_named_runs_whatever_its_tier():
    from tests.conftest import names_only_files_or_tests

    assert names_only_files_or_tests(["tests/test_deploy.py"])
    assert names_only_files_or_tests(["tests/test_fab.py::test_flwr_run_runs_the_built_fab_in_simulation", "t/x.py"])
    assert not names_only_files_or_tests(["tests"]) and not names_only_files_or_tests([])
    assert not names_only_files_or_tests(["tests/test_deploy.py", "tests/"])


def test_ci_builds_the_docs_strictly_before_the_tests():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    build = [i for i, line in enumerate(ci) if line.startswith("mkdocs build") and "--strict" in line]
    tests = [i for i, line in enumerate(ci) if line.startswith("python -m pytest tests")]
    assert build and tests and build[0] < tests[0], ci


def test_readme_is_short_and_names_every_strategy_of_the_reference():
    """The README's strategy table lists exactly the strategies of the generated strategy reference."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    table = readme.split("## Strategies", 1)[1].split("\n## ", 1)[0]
    in_readme = set(re.findall(r"^\| `([a-z0-9-]+)`", table, re.M))
    reference = (ROOT / "docs" / "reference" / "strategies.md").read_text()
    block = reference.split("<!-- sflower-strategies -->", 1)[1].split("<!-- end sflower-strategies -->", 1)[0]
    # the generated block names each strategy as a heading (### `gas`) or at a line's start (sflower strategies)
    in_reference = set(re.findall(r"^(?:#+ `([a-z0-9-]+)`|([a-z0-9][a-z0-9-]+) {2,}\S)", block, re.M))
    in_reference = {a or b for a, b in in_reference}
    assert in_readme == in_reference, (in_readme ^ in_reference)


def test_readme_links_resolve():
    """Every relative link of the README names a file or folder of the repository."""
    readme = (ROOT / "README.md").read_text()
    links = [m for m in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in m]
    assert links
    for link in links:
        path = link.split("#", 1)[0]
        assert (ROOT / path).exists(), link
