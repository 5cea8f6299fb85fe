"""benchmarks/authors.py: the GAS and RingSFL authors' code against sflower. GAS_main.py's edits and checks, the
timing of their output lines (on stand-ins for their scripts), the RingSFL config file their copy gets, the
torchvision stand-in's numbers, the summary table and the CLI's one-line refusals. The real side-by-side runs
take minutes and are not run here."""

from __future__ import annotations

import pytest

from benchmarks.authors import (AUTHORS_EDITS, AUTHORS_FIXED, RING_CONFIG, authors_source, iteration_seconds, main,
                                run_authors_gas, run_authors_ring, summary)
from benchmarks.common import FMNIST_DIR, MNIST_DIR
from fl_app.run.errors import ConfigError

needs_fmnist = pytest.mark.skipif(not (FMNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file(),
                                  reason="Fashion-MNIST is not in ../shared/data")

#: Like GAS_main.py: every setting a module constant; it reads Fashion-MNIST's test set through torchvision,
#: then prints "Global iteration: k" after each global iteration, 1 s apart.
_FAKE_MAIN = """import time, torch
import torchvision
{settings}
dataset = torchvision.datasets.FashionMNIST(root='../data', train=False, transform=torchvision.transforms.Compose(
    [torchvision.transforms.ToTensor(), torchvision.transforms.Normalize((0.286,), (0.3205,))]))
print("settings", fmnist, cifar, epochs, device, len(dataset), tuple(dataset[0][0].shape))
for epoch in range(1, epochs + 1):
    time.sleep(1.0)
    print("Time: 5.0")
    print("Global iteration: " + str(epoch))
    print("Accuracy: 0.1")
"""


def _settings(drop: str = "") -> str:
    lines = [old for old in AUTHORS_EDITS] + [f"{fixed}  # their comment" if fixed == "lr = 0.01" else fixed
                                              for fixed in AUTHORS_FIXED]
    return "\n".join(line for line in lines if line != drop)


def test_their_file_gets_four_lines_replaced_and_the_rest_checked():
    text = "import torch\n" + _settings() + "\nprint(epochs)\n"
    out = authors_source(text, 3).split("\n")
    assert "fmnist = True" in out and "cifar = False" in out and "epochs = 3" in out
    assert 'device = torch.device("cpu")' in out
    assert "fmnist = False" not in out and "epochs = 2000" not in out
    assert len(out) == len(text.split("\n"))  # replaced in place, nothing added
    for missing in ("epochs = 2000", "user_num = 20"):
        with pytest.raises(ConfigError, match=f"no single line '{missing}'"):
            authors_source("import torch\n" + _settings(drop=missing), 3)
    with pytest.raises(ConfigError, match="no single line 'shard = 2'"):  # twice is not once
        authors_source(_settings() + "\nshard = 2", 3)


def test_iteration_seconds_are_the_differences_from_the_second_iteration_on():
    assert iteration_seconds([10.0, 12.5, 16.0]) == [2.5, 3.5]
    assert iteration_seconds([10.0]) == []


@needs_fmnist
def test_their_script_runs_on_the_standin_and_each_iteration_line_is_timed(tmp_path):
    authors = tmp_path / "GAS"
    (authors / "utils").mkdir(parents=True)
    (authors / "GAS_main.py").write_text(_FAKE_MAIN.format(settings=_settings()))
    ends = run_authors_gas(authors, 3, str(FMNIST_DIR), tmp_path / "work")
    assert len(ends) == 3
    # 1 s of sleep each, timed as the lines arrive: a reader delayed by a busy machine moves a figure by its delay,
    # and the bounds leave half a second either way (no figure is the sleep's exactly)
    assert all(0.5 < s < 10.0 for s in iteration_seconds(ends))
    shown = (tmp_path / "work" / "GAS_main.py").read_text()
    assert "epochs = 3" in shown and "fmnist = True" in shown
    assert (authors / "GAS_main.py").read_text().count("epochs = 2000") == 1  # their file is left as it was


@needs_fmnist
def test_a_failing_or_short_run_of_theirs_is_one_line(tmp_path):
    authors = tmp_path / "GAS"
    authors.mkdir()
    (authors / "GAS_main.py").write_text("import torch\n" + _settings() + "\nraise SystemExit('their code gave up')\n")
    with pytest.raises(RuntimeError, match="GAS_main.py exited 1: their code gave up"):
        run_authors_gas(authors, 2, str(FMNIST_DIR), tmp_path / "work")
    (authors / "GAS_main.py").write_text(_FAKE_MAIN.format(settings=_settings()).replace("epochs + 1", "epochs"))
    with pytest.raises(RuntimeError, match="printed 2 of 3 global iterations"):
        run_authors_gas(authors, 3, str(FMNIST_DIR), tmp_path / "work2")


#: Like StalRingSFL's main.py: wandb's config from config-defaults.yaml in the working directory, MNIST through
#: torchvision, a round logged as "round: 0" ... "acc: ..." (1 s apart).
_FAKE_RING = """import logging, time, yaml, torchvision
logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(levelname)s - %(message)s")
config = {k: v["value"] for k, v in yaml.safe_load(open("config-defaults.yaml")).items()}
test = torchvision.datasets.MNIST("./datasets", train=False, transform=None, download=True)
print("config", config["alg"], config["prop_lens"], config["global_round"], len(test), flush=True)
logging.info("round: 0")
time.sleep(1.0)
logging.info("acc: 44.1 | round_comm: 1 | total_comm: 1")
"""


@pytest.mark.skipif(not (MNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file(), reason="MNIST is not in ../shared/data")
def test_a_ring_round_of_theirs_is_timed_from_their_log_on_a_copy_with_our_config(tmp_path):
    authors = tmp_path / "StalRingSFL"
    (authors / "alg").mkdir(parents=True)
    (authors / "alg" / "ringsfl_v2.py").write_text("")
    (authors / "main.py").write_text(_FAKE_RING)
    (authors / "config-defaults.yaml").write_text("alg:\n  value: vanilla_fl_drop\n")
    seconds = run_authors_ring(authors, str(MNIST_DIR), tmp_path / "work")
    assert 0.5 < seconds < 10.0
    copy = tmp_path / "work" / "StalRingSFL"
    assert "ringsfl_v2" in (copy / "config-defaults.yaml").read_text()
    assert (authors / "config-defaults.yaml").read_text() == "alg:\n  value: vanilla_fl_drop\n"  # theirs untouched
    assert RING_CONFIG["prop_lens"] == "8:1:1:1:1" and RING_CONFIG["global_round"] == 1
    (authors / "main.py").write_text(_FAKE_RING.replace('logging.info("acc:', 'logging.info("loss:'))
    with pytest.raises(RuntimeError, match="logged no complete round"):
        run_authors_ring(authors, str(MNIST_DIR), tmp_path / "work2")
    with pytest.raises(ConfigError, match="clone https://github.com/ShenJinglong/StalRingSFL"):
        run_authors_ring(tmp_path / "nothing", str(MNIST_DIR), tmp_path / "work3")


@needs_fmnist
def test_the_standin_does_torchvisions_per_sample_work(monkeypatch):
    import sys

    import torch

    from benchmarks.authors import STANDIN

    monkeypatch.setenv("TV_FASHIONMNIST_DIR", str(FMNIST_DIR))  # as run_authors_gas sets it
    sys.path.insert(0, str(STANDIN))
    try:
        import torchvision

        tf = torchvision.transforms.Compose([torchvision.transforms.ToTensor(),
                                             torchvision.transforms.Normalize((0.286,), (0.3205,))])
        test = torchvision.datasets.FashionMNIST(str(FMNIST_DIR / "nowhere"), train=False, transform=tf)
        assert torchvision.__version__ == "0.0-standin"
    finally:
        sys.path.remove(str(STANDIN))
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    x, y = test[7]
    raw = test.data[7].to(torch.float32)
    assert len(test) == 10_000 and x.shape == (1, 28, 28) and x.dtype == torch.float32
    assert y == int(test.targets[7]) and isinstance(y, int)
    assert torch.equal(x[0], (raw / 255 - 0.286) / 0.3205)  # ToTensor's x/255, then Normalize's (x - m)/s


def test_the_summary_gives_each_pairs_medians_and_the_overall_ratio():
    rows = [{"pair": 1, "side": "authors", "figure": k, "seconds": s} for k, s in ((1, 100.0), (2, 120.0))]
    rows += [{"pair": 1, "side": "sflower", "figure": k, "seconds": s} for k, s in ((1, 30.0), (2, 36.0))]
    rows += [{"pair": 2, "side": "authors", "figure": 1, "seconds": 140.0},
             {"pair": 2, "side": "sflower", "figure": 1, "seconds": 28.0}]
    table = summary(rows).splitlines()
    assert table[2] == "| 1 | 110.0 | 33.0 | 0.300 |"
    assert table[3] == "| 2 | 140.0 | 28.0 | 0.200 |"
    assert table[4] == "| median | 120.0 | 30.0 | **0.250** |"  # medians of all five and all three iterations


@pytest.mark.parametrize("args, says", [
    (["--iterations", "1"], "--iterations must be at least 2"),
    (["--pairs", "0"], "--pairs at least 1"),
    (["--pairs", "2", "x"], "unrecognized arguments"),
])
def test_bad_arguments_are_refused_in_one_line(tmp_path, capsys, args, says):
    with pytest.raises(SystemExit) as exit_:
        main(["gas", "--authors-dir", str(tmp_path), "--out", str(tmp_path / "out"), *args])
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_a_directory_without_their_code_is_one_line(tmp_path, capsys):
    assert main(["gas", "--authors-dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "authors: no GAS_main.py in" in err and "github.com/eejiarong/GAS" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
