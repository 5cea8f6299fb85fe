"""The progress display of a run (issue 34, "A run shows it is alive"): it counts exchanges, so it moves within a
global iteration, not only at its end; ``sflower run`` says something before its slow imports. No timing is
asserted (the machine is shared and noisy): ``benchmarks/liveness.py`` measures the seconds."""

from __future__ import annotations

from strategies.core import progress
from tests.conftest import cli_args


def test_the_bar_counts_exchanges_within_a_global_iteration(tmp_path, capsys, monkeypatch, one_torch_thread):
    """A short GAS run from the command line: its first stdout line comes before the run's, the bar's count rises
    reply by reply inside the first global iteration, ends at the run's exchanges (100 %, estimate exact), and its
    description names the global iteration."""
    from simulation.cli import main

    seen: list[tuple[str, int, int]] = []  # (event, global iteration reached, bar count)
    bars: list[progress.RunBar] = []
    advance, tick, open_bar = progress.advance, progress.tick, progress.open_bar

    def spy_open(*args, **kwargs):
        bars.append(open_bar(*args, **kwargs))
        return bars[-1]

    def spy_advance(bar, exchanges):
        advance(bar, exchanges)
        seen.append(("reply", len([e for e in seen if e[0] == "tick"]), bar.tqdm.n))

    def spy_tick(bar, iteration, exchanges):
        tick(bar, iteration, exchanges)
        seen.append(("tick", iteration, bar.tqdm.n))

    monkeypatch.setattr(progress, "open_bar", spy_open)
    monkeypatch.setattr(progress, "advance", spy_advance)
    monkeypatch.setattr(progress, "tick", spy_tick)
    out = tmp_path / "run"
    run = {"strategy": "gas", "dataset": "mnist-5k", "model": "alexnet", "cut-layer": 2, "num-clients": 3,
           "concurrency": 2, "partition": "iid", "global-iterations": 2, "local-iterations": 3, "batch-size": 8,
           "seed": 0, "output-dir": out}
    assert main(cli_args(run)) == 0
    printed = capsys.readouterr()
    # the start-up display (seconds elapsed, redrawn with carriage returns, then cleared) is not a line of its own
    assert "starting 00:0" in printed.out
    lines = [line for line in printed.out.splitlines() if line.strip() and not line.lstrip().startswith("starting")]
    assert lines[0].startswith("sflower run: starting"), printed.out
    assert lines[1].startswith("sflower run: gas on mnist-5k, 3 clients (2 concurrent), 2 global iterations")
    assert str(out) in lines[1] and lines[-1].startswith("gas: final accuracy")
    first = [n for event, it, n in seen if event == "reply" and it == 0]
    assert len(first) >= 3 and first == sorted(first) and first[-1] > first[0] > 0, seen  # moved inside iteration 1
    ticks = [(it, n) for event, it, n in seen if event == "tick"]
    assert [it for it, _ in ticks] == [1, 2] and ticks[0][1] < ticks[1][1], seen
    import json

    exchanges = json.loads((out / "summary.json").read_text())["exchanges"]
    bar = bars[0].tqdm
    assert bar.n == exchanges == ticks[-1][1] and bar.total == exchanges
    assert "gas it 2/2" in printed.err and "exch" in printed.err


def test_a_resumed_bar_starts_at_its_checkpoint_and_estimates_its_total(monkeypatch):
    """At global iteration 2 of 6 after 100 exchanges, the bar starts at 100 of about 300; before the first global
    iteration ends it has no total. With stderr not a terminal (pytest captures it) it redraws at most once a
    second, unless TQDM_MININTERVAL says otherwise; disabled, there is no bar and the calls do nothing."""
    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    bar = progress.open_bar(True, 6, 2, "gas", exchanges=100)
    try:
        assert bar.tqdm.n == 100 and bar.tqdm.total == 300 and bar.tqdm.desc.startswith("gas it 2/6")
        assert bar.tqdm.mininterval == progress.PIPE_INTERVAL_S
        progress.advance(bar, 130)
        progress.advance(bar, 120)  # never backwards
        assert bar.tqdm.n == 130
        progress.tick(bar, 3, 140)
        assert bar.tqdm.n == 140 and bar.tqdm.total == 280 and bar.tqdm.desc.startswith("gas it 3/6")
    finally:
        progress.close_bar(bar)
    assert progress.estimate(0, 6, 50) is None and progress.estimate(6, 6, 700) == 700
    monkeypatch.setenv("TQDM_MININTERVAL", "5")  # tqdm reads it when imported: the default is then left to tqdm
    fresh = progress.open_bar(True, 6, 0, "gas")
    try:
        assert fresh.tqdm.total is None and fresh.tqdm.mininterval != progress.PIPE_INTERVAL_S
    finally:
        progress.close_bar(fresh)
    assert progress.open_bar(False, 6, 0, "gas") is None
    for call in (lambda: progress.advance(None, 3), lambda: progress.tick(None, 1, 3),
                 lambda: progress.show(None, 0.5, 1.0), lambda: progress.close_bar(None)):
        call()


def test_the_exchange_does_not_checkpoint_its_progress_callback():
    """The callback refers to this run's bar: a checkpoint leaves it out and a restored exchange has none."""
    from strategies.core.exchange import Exchange

    ex = Exchange(None, None, None, None, None)  # type: ignore[arg-type]
    ex.on_reply = print
    state = ex.__getstate__()
    assert "on_reply" not in state and "dispatcher" not in state
    restored = Exchange.__new__(Exchange)
    restored.__setstate__(state)
    assert restored.on_reply is None and restored.dispatcher is None
