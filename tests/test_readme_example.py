"""The README's worked new-strategy example is the shipped code, and it learns."""

import inspect
import json
import re
from pathlib import Path

from simulation.cli import main
from strategies.algorithms.psl import PSL

ROOT = Path(__file__).resolve().parents[1]


def test_readme_example_is_the_shipped_class():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Adding a strategy", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert block == inspect.getsource(PSL)


def test_readme_example_strategy_learns(tmp_path):
    out = tmp_path / "psl"
    code = main(["run", "strategy=psl", "dataset=mnist-5k", "partition=iid", "num-clients=4",
                 "concurrency=4", "global-iterations=3", "local-iterations=10", "heterogeneity=none",
                 f"output-dir={out}", "-q"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strategy"] == "psl"
    assert summary["server_updates"] == 3 * 10  # one server step per local iteration
    assert summary["final_accuracy"] >= 0.5, summary["final_accuracy"]


def test_readme_gives_the_two_commands_and_ci_runs_its_test_command():
    """The README's two commands (main job, tests) exist, and .ci/run calls the README's test command."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^pip install torch==2\.13\.0 && pip install -e \"\.\[dev\]\" && (.+)$", section, re.M)
    assert commands[0] == "sflower run", commands
    test_command = commands[1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci, (test_command, ci)
