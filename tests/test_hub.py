"""Run folders as Hub repos, without a network: the model card and its metadata, the upload's file
list (huggingface_hub CommitOperationAdd), and loading an id from a Hub cache laid out as
snapshot_download leaves it (models--user--name/snapshots/<rev>/, refs/main)."""
import json
import shutil

import pytest
import yaml
from huggingface_hub import ModelCard

from adalayers.store import hub
from adalayers.store import run as runlib
from adalayers.cli import main
from adalayers.errors import RunError
from adalayers.infer.sidetasks import SideTasks

from conftest import tiny_backbone
from runs_util import NER, make_run
from test_sidetasks import TEXTS

REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def run(tokenizer, tmp_path):
    base = tiny_backbone("bert", tokenizer)
    folder = make_run(tmp_path / "ner", base, "token", NER, seed=4, p=[1, 0, 1, 0])
    cfg = runlib.read_config(folder)
    cfg["config"]["task"]["name"] = "conll2003"
    runlib.write_config(folder, cfg)
    runlib.write_json(folder / "metrics.json", {"test": {"f1": 0.8123456, "precision": 0.8, "recall": 0.82, "n": 10},
                                                "validation": {"f1": 0.85, "n": 5}, "trainable_params": 1234,
                                                "base_params": 99999, "layer_weights": [0.5, 0, 0.5, 0]})
    (folder / "log.jsonl").write_text('{"epoch": 1}\n')
    return base, folder


def test_card_metadata_round_trips(run):
    _, folder = run
    text = hub.model_card(folder, "me/ner")
    header = yaml.safe_load(text.split("---")[1])
    assert header["library_name"] == "adalayers" and header["datasets"] == ["eriktks/conll2003"]
    assert header["base_model"] == "tiny-bert" and header["pipeline_tag"] == "token-classification"
    card = ModelCard(text)  # huggingface_hub's own parser, as the Hub reads it
    got = {r.metric_type: r.metric_value for r in card.data.eval_results}
    metrics = json.loads((folder / "metrics.json").read_text())
    assert got == {k: round(v, 4) for k, v in metrics["test"].items() if k != "n"}
    assert all(r.dataset_split == "test" and r.task_type == "token-classification" for r in card.data.eval_results)
    assert "SideTasks.load(\"tiny-bert\", [\"me/ner\"])" in text and "| 2 | 0.500" in text


def test_upload_operations_list_the_run_and_the_card(run, capsys):
    _, folder = run
    (folder / "weights.png").write_bytes(b"\x89PNG fake")
    ops = hub.upload_operations(folder, "me/ner")
    assert [o.path_in_repo for o in ops] == ["config.json", "head.safetensors", "metrics.json", "log.jsonl",
                                           "weights.png", "README.md"]
    assert ops[-1].path_or_fileobj == hub.model_card(folder, "me/ner").encode()
    assert ops[1].upload_info.sha256.hex() == runlib.sha256(folder / "head.safetensors")
    assert main(["push", str(folder), "--repo", "me/ner", "--dry-run"]) == 0
    assert capsys.readouterr().out.split() == [o.path_in_repo for o in ops]
    (folder / "head.safetensors").unlink()
    with pytest.raises(RunError, match="head.safetensors is missing"):
        hub.upload_operations(folder)


def test_hub_id_from_the_cache_loads_and_predicts_like_the_folder(run, tmp_path, monkeypatch, capsys):
    import huggingface_hub.constants as constants

    base, folder = run
    cache = tmp_path / "hub"
    snap = cache / "models--me--ner" / "snapshots" / REV
    snap.mkdir(parents=True)
    for f in ("config.json", "head.safetensors", "metrics.json"):
        shutil.copy2(folder / f, snap / f)
    (cache / "models--me--ner" / "refs").mkdir()
    (cache / "models--me--ner" / "refs" / "main").write_text(REV)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # no local folder me/ner: the id goes to the Hub cache
    assert hub.resolve_run("me/ner") == snap and hub.resolve_run(f"me/ner@{REV}") == snap
    ref = SideTasks.from_backbone(base, [folder]).predict(TEXTS)
    got = SideTasks.from_backbone(base, ["me/ner"]).predict(TEXTS)
    assert [r["tasks"]["ner"] for r in got] == [r["tasks"]["ner"] for r in ref]
    (snap / "head.safetensors").write_bytes((folder / "head.safetensors").read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(RunError, match="checksum"):  # the same checks as for a local folder
        SideTasks.from_backbone(base, ["me/ner"])
    with pytest.raises(RunError, match="not in the cache"):
        hub.resolve_run("someone/missing")
    assert main(["predict", "someone/missing", "a text"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: someone/missing: no such run folder") and "\n" not in err
