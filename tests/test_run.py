"""Run folders: a saved head predicts exactly as before, and edits or a different base are refused."""
import json

import pytest
import torch

from adalayers.store import run as runlib
from adalayers.config import Config
from adalayers.errors import ModelError, RunError
from adalayers.model.sidetask import SideTask

from conftest import tiny_backbone

TEXTS = ["the book was written by john .", "john sees the big dog", "a good movie"]


def saved_run(tmp_path, backbone):
    cfg = Config()
    cfg.mixer.k, cfg.head.num_heads = 8, 2
    torch.manual_seed(1)
    task = SideTask(cfg, backbone.num_layers, backbone.hidden_size, ["no", "yes"])
    sha = runlib.save_head(tmp_path, task)
    runlib.save_config(tmp_path, cfg, ["no", "yes"], backbone, sha)
    return task


def logits(task, backbone):
    batch = backbone.tokenize(TEXTS)
    task.eval()
    task.begin()
    backbone(batch, taps=[task.tap])
    return task.end(batch["attention_mask"])


def test_round_trip_gives_identical_predictions(tmp_path, tokenizer):
    bb = tiny_backbone("bert", tokenizer)
    task = saved_run(tmp_path, bb)
    loaded, cfg, meta = runlib.load_head(tmp_path, bb)
    assert meta["labels"] == ["no", "yes"]
    assert torch.equal(logits(task, bb), logits(loaded, bb))


def test_other_base_is_refused_naming_both(tmp_path, tokenizer):
    saved_run(tmp_path, tiny_backbone("bert", tokenizer))
    other = tiny_backbone("roberta", tokenizer)
    with pytest.raises(ModelError, match="tiny-bert.*tiny-roberta"):
        runlib.load_head(tmp_path, other)


def test_edited_or_missing_files_are_refused(tmp_path, tokenizer):
    bb = tiny_backbone("bert", tokenizer)
    saved_run(tmp_path, bb)
    head = tmp_path / runlib.HEAD
    data = bytearray(head.read_bytes())
    data[-1] ^= 1
    head.write_bytes(bytes(data))
    with pytest.raises(RunError, match="checksum does not match"):
        runlib.load_head(tmp_path, bb)
    head.unlink()
    with pytest.raises(RunError, match="missing"):
        runlib.load_head(tmp_path, bb)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(RunError, match="not a valid run config"):
        runlib.load_head(tmp_path, bb)
    with pytest.raises(RunError, match="run folder not found"):
        runlib.load_head(tmp_path / "nope")


def test_atomic_write_leaves_no_temp_files(tmp_path):
    runlib.write_json(tmp_path / "a.json", {"x": 1})
    runlib.append_jsonl(tmp_path / "log.jsonl", {"e": 1})
    runlib.append_jsonl(tmp_path / "log.jsonl", {"e": 2})
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 1}
    assert [json.loads(l)["e"] for l in (tmp_path / "log.jsonl").read_text().splitlines()] == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "log.jsonl"]
