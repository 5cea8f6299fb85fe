"""The README's worked new-strategy example is the shipped code, and it learns."""

import inspect
import json
import re
from pathlib import Path

from simulation.cli import main
from strategies.psl import PSL

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
