"""The hidden-state cache: keys, integrity, round trip against the live base, budget, layer reads.

A tiny random BERT and a CoLA-format dataset written into tmp_path stand in for the real thing;
one slow test trains the real MiniLM on a few CoLA rows through the CLI.
"""
from __future__ import annotations

import json
import logging
import random
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from adalayers import config
from adalayers.recipes import service
from adalayers.model.backbone import Backbone
from adalayers.store.cache import source as cache_source
from adalayers.store.cache.source import cached_source
from adalayers.store.cache.store import layer_file
from adalayers.data.encoding import batches
from adalayers.model.sidetask import SideTask
from adalayers.model.states import LiveStates

WORDS = ("the a cat dog bird sat ran flew on under over mat tree house quickly slowly big small red "
         "green and but because it was is very").split()


@pytest.fixture(scope="module")
def tiny_backbone(tmp_path_factory):
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = tmp_path_factory.mktemp("tok")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"))
    torch.set_num_threads(1)  # tiny tensors: threads only add overhead on the shared 2-core machine
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=37, max_position_embeddings=64))
    return Backbone(model, tok, "tiny-bert")


def _write_cola(folder: Path, n_train: int = 60, n_dev: int = 20, seed: int = 0) -> None:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        lines = [f"src\t{i % 2}\t*\t{' '.join(rng.choice(WORDS) for _ in range(rng.randint(2, 20)))}"
                 for i in range(n)]
        (folder / name).write_text("\n".join(lines) + "\n")


@pytest.fixture
def setup(tmp_path, tiny_backbone):
    _write_cola(tmp_path / "data" / "glue" / "CoLA")

    def make(*overrides):
        cfg = config.from_dict({
            "task": {"data_dir": str(tmp_path / "data")}, "model": {"max_length": 16},
            "mixer": {"k": 8, "cutoff": 0.0}, "head": {"num_heads": 2},
            "train": {"batch_size": 4, "eval_batch_size": 8, "max_epochs": 2},
            "cache": {"dir": str(tmp_path / "cache")}}, list(overrides))
        _, data, encoded = service.prepare(cfg, tiny_backbone)
        return cfg, data, encoded
    make.root = tmp_path / "cache" / "states"
    make.backbone = tiny_backbone
    return make


class Recorder:
    """A task that keeps what it is tapped with."""

    def __init__(self, layers):
        self.layers, self.seen = layers, []

    def used_layers(self):
        return self.layers

    def begin(self):
        self.seen = []

    def tap(self, i, z):
        self.seen.append((i, z.clone()))


def _count_builds(monkeypatch) -> list:
    built = []
    real = cache_source.Writer

    def counting(*a, **kw):
        built.append(a[1])
        return real(*a, **kw)
    monkeypatch.setattr(cache_source, "Writer", counting)
    return built


def _assert_matches_live(source, backbone, encoded, split="train", batch_size=4):
    """Every batch: same layers, same values as the live base on the real tokens, zeros on padding."""
    gen = torch.Generator().manual_seed(1)
    for batch in batches(encoded[split], batch_size, 0, shuffle=True, generator=gen):
        cached, live = Recorder([0, 1, 2]), Recorder([0, 1, 2])
        source.run(batch, [cached])
        LiveStates(backbone).run(batch, [live])
        assert [i for i, _ in cached.seen] == [0, 1, 2]
        mask = batch["attention_mask"].bool()
        for (i, zc), (_, zl) in zip(cached.seen, live.seen):
            assert zc.shape == zl.shape and zc.dtype == torch.float32
            torch.testing.assert_close(zc[mask], zl[mask], rtol=2e-3, atol=2e-3)
            assert not zc[~mask].any()


@pytest.mark.parametrize("shard_mb", [256.0, 0.002])  # 0.002 MB: ~31 tokens per shard, batches span shards
def test_round_trip_equals_live_hidden_states(setup, shard_mb):
    cfg, data, encoded = setup(f"cache.shard_mb={shard_mb}")
    source = cached_source(cfg, setup.backbone, data, encoded)
    _assert_matches_live(source, setup.backbone, encoded, "train")
    _assert_matches_live(source, setup.backbone, encoded, "validation", batch_size=7)
    entry = source.entry("train")
    assert entry.manifest["tokens"] == sum(len(r["input_ids"]) for r in encoded["train"].rows)
    assert (len(entry.layout.shards) > 1) == (shard_mb < 1)



class PackedRecorder(Recorder):
    packed_ok = True  # takes the real tokens' rows (N, d), like a SideTask


@pytest.mark.parametrize("shard_mb", [256.0, 0.002])
def test_packed_read_gives_the_padded_reads_real_tokens(setup, shard_mb):
    """The packed read (one shard, or a batch spread over several) is exactly the padded read at the real tokens."""
    cfg, data, encoded = setup(f"cache.shard_mb={shard_mb}")
    source = cached_source(cfg, setup.backbone, data, encoded)
    gen = torch.Generator().manual_seed(2)
    for batch in batches(encoded["train"], 5, 0, shuffle=True, generator=gen):
        packed, padded = PackedRecorder([0, 2]), Recorder([0, 2])
        source.run(batch, [packed])
        source.run(batch, [padded])
        mask = batch["attention_mask"].bool()
        for (i, zp), (j, zd) in zip(packed.seen, padded.seen):
            assert i == j and zp.shape == (int(mask.sum()), zd.shape[-1]) and zp.dtype == torch.float32
            assert torch.equal(zp, zd[mask])
    assert (len(source.entry("train").layout.shards) > 1) == (shard_mb < 1)

def test_same_config_hits_and_changed_max_length_or_data_file_misses(setup, monkeypatch, tmp_path):
    built = _count_builds(monkeypatch)
    cfg, data, encoded = setup()
    first = cached_source(cfg, setup.backbone, data, encoded)
    first.entry("train")
    assert len(built) == 1
    again = cached_source(*setup()[:1], setup.backbone, *setup()[1:])
    assert again.keys == first.keys
    again.entry("train")
    assert len(built) == 1  # a hit: nothing rebuilt

    cfg2, data2, encoded2 = setup("model.max_length=12")
    other = cached_source(cfg2, setup.backbone, data2, encoded2)
    assert all(other.keys[s] != first.keys[s] for s in first.keys)

    # a data file edited where the tokens do not change (the source column): still a miss
    dev = tmp_path / "data" / "glue" / "CoLA" / "dev.tsv"
    dev.write_text(dev.read_text().replace("src\t", "SRC\t", 1))
    cfg3, data3, encoded3 = setup()
    assert [r["input_ids"] for r in encoded3["test"].rows] == [r["input_ids"] for r in encoded["test"].rows]
    edited = cached_source(cfg3, setup.backbone, data3, encoded3)
    assert all(edited.keys[s] != first.keys[s] for s in first.keys)
    edited.entry("train")
    assert len(built) == 2


def _damage_then_check_rebuilt(setup, monkeypatch, capsys, damage, caplog):
    cfg, data, encoded = setup()
    source = cached_source(cfg, setup.backbone, data, encoded)
    folder = source.entry("train").folder
    built = _count_builds(monkeypatch)
    damage(folder)
    fresh = cached_source(cfg, setup.backbone, data, encoded)
    _assert_matches_live(fresh, setup.backbone, encoded, "train")
    assert built == [fresh.keys["train"]]
    assert "damaged" in capsys.readouterr().out + caplog.text  # a warning through logging


def test_truncated_layer_file_is_rebuilt(setup, monkeypatch, capsys, caplog):
    def truncate(folder):
        path = folder / layer_file(0, 1)
        path.write_bytes(path.read_bytes()[:-100])
    _damage_then_check_rebuilt(setup, monkeypatch, capsys, truncate, caplog)


def test_same_size_corruption_is_caught_by_checksum(setup, monkeypatch, capsys, caplog):
    def flip(folder):
        path = folder / layer_file(0, 2)
        raw = bytearray(path.read_bytes())
        raw[-7] ^= 0xFF
        path.write_bytes(bytes(raw))
    _damage_then_check_rebuilt(setup, monkeypatch, capsys, flip, caplog)


def test_edited_manifest_is_rebuilt(setup, monkeypatch, capsys, caplog):
    def edit(folder):
        m = json.loads((folder / "manifest.json").read_text())
        m["tokens"] += 1
        (folder / "manifest.json").write_text(json.dumps(m))
    _damage_then_check_rebuilt(setup, monkeypatch, capsys, edit, caplog)


def test_entry_without_manifest_is_never_read(setup, monkeypatch):
    cfg, data, encoded = setup()
    source = cached_source(cfg, setup.backbone, data, encoded)
    folder = source.entry("train").folder
    (folder / "manifest.json").unlink()  # as if a builder died before its last write
    (setup.root / f".tmp-{source.keys['train']}-1-dead").mkdir()  # and a stale temporary folder
    built = _count_builds(monkeypatch)
    fresh = cached_source(cfg, setup.backbone, data, encoded)
    _assert_matches_live(fresh, setup.backbone, encoded, "train")
    assert built == [source.keys["train"]]
    assert not list(setup.root.glob(".tmp-*"))


def test_two_builders_at_once_leave_one_good_entry(setup, monkeypatch):
    built = _count_builds(monkeypatch)
    cfg, data, encoded = setup()
    sources = [cached_source(cfg, setup.backbone, data, encoded) for _ in range(2)]
    errors = []

    def build(s):
        try:
            s.entry("train")
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=build, args=(s,)) for s in sources]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(built) == 1  # the second waited for the lock, then found the finished entry
    assert not list(setup.root.glob(".tmp-*")) and not list(setup.root.glob(".old-*"))
    _assert_matches_live(sources[1], setup.backbone, encoded, "train")


def test_over_budget_falls_back_to_the_live_base(setup, caplog):
    caplog.set_level(logging.INFO, logger="adalayers")
    cfg, data, encoded = setup("cache.max_gb=0.00001")
    assert cached_source(cfg, setup.backbone, data, encoded) is None
    out = caplog.text
    assert "GB" in out and "over cache.max_gb" in out
    assert isinstance(service.make_source(cfg, setup.backbone, data, encoded), LiveStates)
    assert not setup.root.exists() or not any(setup.root.iterdir())


def test_pinned_layer_reads_only_that_layer(setup):
    cfg, data, encoded = setup("mixer.pin_layer=1")
    source = cached_source(cfg, setup.backbone, data, encoded)
    task = SideTask(cfg, setup.backbone.num_layers, setup.backbone.hidden_size, data.labels)
    for batch in batches(encoded["train"], 4, 0):
        source.run(batch, [task])
        task.end(batch["attention_mask"])
    assert source.entry("train").opened == {layer_file(0, 1)}


def test_training_from_the_cache_matches_training_live(setup, tmp_path):
    from adalayers.recipes.train import fit, seed_everything

    results = {}
    for name in ("live", "cached"):
        cfg, data, encoded = setup("train.lr=0.003")
        seed_everything(0)
        task = SideTask(cfg, setup.backbone.num_layers, setup.backbone.hidden_size, data.labels)
        start = {k: v.clone() for k, v in task.state_dict().items()}
        source = cached_source(cfg, setup.backbone, data, encoded) if name == "cached" else LiveStates(setup.backbone)
        (tmp_path / name).mkdir()
        fit(task, source, data, encoded, cfg, tmp_path / name, setup.backbone, 0)
        results[name] = task.state_dict()
    moved = max((results["live"][k] - start[k]).abs().max().item() for k in start)
    apart = max((results["live"][k] - results["cached"][k]).abs().max().item() for k in start)
    print(f"parameters moved up to {moved:.2e}; live and cached runs differ by up to {apart:.2e}")
    assert apart < moved / 20  # fp16 rounding of the states is noise next to what training did


def test_cli_ls_and_rm(setup, capsys):
    from adalayers.cli import main

    cfg, data, encoded = setup()
    source = cached_source(cfg, setup.backbone, data, encoded)
    for split in ("train", "test"):
        source.entry(split)
    capsys.readouterr()
    cache_folder = str(setup.root.parent)
    assert main(["cache", "ls", "--dir", cache_folder]) == 0
    out = capsys.readouterr().out
    assert source.keys["train"] in out and source.keys["test"] in out and "2 entries" in out
    assert main(["cache", "rm", "--dir", cache_folder, source.keys["train"][:8]]) == 0
    assert not (setup.root / source.keys["train"]).exists() and (setup.root / source.keys["test"]).exists()
    assert main(["cache", "rm", "--dir", cache_folder, "nosuchkey"]) == 2
    (setup.root / f".tmp-{source.keys['train']}-1-dead").mkdir()  # left by a builder that died
    assert main(["cache", "rm", "--dir", cache_folder, "--all"]) == 0
    assert not [p for p in setup.root.iterdir() if not p.name.endswith(".lock")]


@pytest.mark.slow
def test_train_uses_the_cache_automatically_on_cola(tmp_path):
    from adalayers.cli import main

    data = Path("../shared/data/glue/CoLA/train.tsv")
    if not data.is_file():
        pytest.skip("CoLA data not found at ../shared/data")
    args = ["train", "configs/cola.yaml", "--out", str(tmp_path / "run"), "--set", f"cache.dir={tmp_path / 'c'}",
            "--set", "task.max_train_examples=64", "--set", "task.max_eval_examples=48",
            "--set", "train.max_epochs=2", "--set", "train.num_threads=1"]
    assert main(args) == 0
    manifests = [json.loads(p.read_text()) for p in (tmp_path / "c" / "states").glob("*/manifest.json")]
    assert sorted(m["split"] for m in manifests) == ["test", "train", "validation"]
    assert {m["rows"] for m in manifests if m["split"] != "train"} == {48}
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert np.isfinite(metrics["test"]["mcc"])


def test_cli_build_then_train_reuses_it(setup, tmp_path, capsys, monkeypatch):
    from adalayers.cli import main

    setup.backbone.model.save_pretrained(tmp_path / "tiny")
    setup.backbone.tokenizer.save_pretrained(tmp_path / "tiny")
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(f"task: {{data_dir: {tmp_path / 'data'}}}\nmodel: {{base: {tmp_path / 'tiny'}, max_length: 16}}\n"
                        f"mixer: {{k: 8}}\nhead: {{num_heads: 2}}\ncache: {{dir: {tmp_path / 'cache'}}}\n"
                        f"train: {{max_epochs: 1, batch_size: 8}}\n")
    assert main(["cache", "build", str(cfg_file)]) == 0
    cap = capsys.readouterr()  # messages on stderr (logging), the command's table on stdout
    assert "GB still to build" in cap.err and all(s in cap.out for s in ("train", "validation", "test"))
    built = _count_builds(monkeypatch)
    assert main(["train", str(cfg_file), "--out", str(tmp_path / "run")]) == 0
    assert built == []  # training found every split already cached


class PaddedSideTask(SideTask):
    packed_ok = False


@pytest.mark.parametrize("kind,skip_bos", [("sequence", False), ("token", False), ("token", True)])
def test_packed_tokens_give_the_padded_result(setup, kind, skip_bos):
    """The cache hands heads only the real tokens (a token head takes them packed, SideTask.read_packed,
    less each row's first with head.skip_bos); outputs and gradients equal the padded path's."""
    cfg, data, encoded = setup("mixer.positional=true", "mixer.gelu_after_sum=true")
    source = cached_source(cfg, setup.backbone, data, encoded)
    head_cfg = config.from_dict(cfg.to_dict(), [f"head.kind={kind}", f"head.skip_bos={str(skip_bos).lower()}"])
    torch.manual_seed(0)
    packed = SideTask(head_cfg, setup.backbone.num_layers, setup.backbone.hidden_size, data.labels).eval()
    padded = PaddedSideTask(head_cfg, setup.backbone.num_layers, setup.backbone.hidden_size, data.labels).eval()
    padded.load_state_dict(packed.state_dict())
    batch = next(batches(encoded["train"], 5, 0))
    mask = batch["attention_mask"].bool()
    assert not mask.all()  # the batch has padding to skip
    results = []
    for task in (packed, padded):
        source.run(batch, [task])
        shape = tuple(task._acc.shape)
        out = task.end(mask)
        out = out[packed.seen(mask)] if kind == "token" else out  # a token head's padding outputs are never read
        out.sum().backward()
        results.append((shape, out.detach(), task.mixer.proj[1].weight.grad))
    assert results[0][0] == (int(mask.sum()), cfg.mixer.k) and results[1][0] == (*mask.shape, cfg.mixer.k)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results[0][2], results[1][2], rtol=1e-5, atol=1e-6)



def test_training_token_head_draws_the_same_dropout_live_and_cached(setup):
    """In training a token head gets the cache's packed rows, or the live base's rows gathered to the same
    packed shape: the same seed then draws the same dropout masks, so a run trains the same head either
    way (up to the fp16 rounding of cached states), as benchmarks/cache_speedup.py checks end to end."""
    cfg, data, encoded = setup("mixer.positional=true")
    head_cfg = config.from_dict(cfg.to_dict(), ["head.kind=token", "head.dropout=0.3", "mixer.dropout=0.3"])
    torch.manual_seed(0)
    task = SideTask(head_cfg, setup.backbone.num_layers, setup.backbone.hidden_size, data.labels).train()
    batch = next(batches(encoded["train"], 5, 0))
    mask = batch["attention_mask"].bool()
    outs = []
    for source in (cached_source(cfg, setup.backbone, data, encoded), LiveStates(setup.backbone)):
        torch.manual_seed(1)
        source.run(batch, [task])
        outs.append(task.end(mask)[mask].detach())
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-2, atol=1e-2)
    torch.manual_seed(2)  # another draw: far apart, so the check above is not loose enough to pass anyway
    LiveStates(setup.backbone).run(batch, [task])
    assert (task.end(mask)[mask].detach() - outs[1]).abs().max() > 0.1

def test_bf16_states_get_an_entry_of_their_own(setup):
    cfg, data, encoded = setup()
    fp32 = cached_source(cfg, setup.backbone, data, encoded)
    bf16 = cached_source(setup("train.precision=bf16")[0], setup.backbone, data, encoded)
    assert "precision" not in fp32.fields["train"]  # fp32 keys made before precision was keyed stay valid
    assert all(bf16.keys[s] != fp32.keys[s] for s in fp32.keys)

    modes = []  # the autocast dtype the base ran under, per batch, while each entry was built
    hook = setup.backbone.register_forward_pre_hook(
        lambda m, a: modes.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu")))
    try:
        bf16.entry("train")
        assert modes and set(modes) == {torch.bfloat16}
        modes.clear()
        fp32.entry("train")
        assert modes and set(modes) == {False}
    finally:
        hook.remove()
    batch = next(iter(batches(encoded["train"], 8, 0)))
    (rec16, rec32) = Recorder([2]), Recorder([2])
    bf16.run(batch, [rec16])
    fp32.run(batch, [rec32])
    torch.testing.assert_close(rec16.seen[0][1], rec32.seen[0][1], rtol=0.1, atol=0.1)
    assert not torch.equal(rec16.seen[0][1], rec32.seen[0][1])


@pytest.mark.parametrize("cache", ["true", "false"])
def test_training_in_bf16_on_a_cpu_runs_end_to_end(setup, tmp_path, cache):
    cfg, data, encoded = setup("train.precision=bf16", f"cache.enabled={cache}", "train.lr=0.003")
    metrics = service.train(cfg, tmp_path / "run", prepared=(setup.backbone, data, encoded))
    losses = [json.loads(line)["train_loss"] for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and all(np.isfinite(losses))
    assert set(metrics["test"]) >= {"accuracy", "mcc"}
