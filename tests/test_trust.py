"""Issue 56 item 7: a missing checksum entry is a refusal (with an explicit escape), and folders can be signed
(HMAC-SHA256 over their checksum manifest, adalayers.store.trust); item 8: a run folder whose path is not
valid UTF-8 loads through NAME=RUN_FOLDER."""
from __future__ import annotations

import json
import os

import pytest

from adalayers import cli
from adalayers.errors import ModelError
from adalayers.infer.sidetasks import SideTasks
from adalayers.store import run as runlib
from adalayers.store import trust

from conftest import tiny_backbone
from runs_util import make_run

KEY = "team-signing-key-0123456789"


@pytest.fixture()
def base(tokenizer):
    return tiny_backbone("bert", tokenizer)


@pytest.fixture()
def run(base, tmp_path):
    return make_run(tmp_path / "acc", base, "sequence", ["bad", "good"], seed=3)


def _flip_labels(run, rehash: bool) -> None:
    """Swap the label names (predictions flip); `rehash`: recompute the sha256 as an attacker would."""
    path = run / "config.json"
    meta = json.loads(path.read_text())
    meta["labels"] = meta["labels"][::-1]
    if rehash:
        runlib.write_config(run, meta)
    else:
        meta["checksums"].pop(runlib.CONFIG)
        path.write_text(json.dumps(meta))


def test_a_deleted_checksum_entry_is_refused_and_trusted_only_on_request(run, base, capsys):
    _flip_labels(run, rehash=False)
    with pytest.raises(ModelError, match="config.json: its checksums have no"):
        SideTasks.from_backbone(base, [run])
    assert SideTasks.from_backbone(base, [run], trust_unverified=True).heads["acc"].task.labels == ["good", "bad"]
    with pytest.raises(ModelError):  # the escape does not outlive its call
        SideTasks.from_backbone(base, [run])
    assert cli.main(["predict", str(run), "a good movie"]) == 2
    assert "--trust-unverified" in capsys.readouterr().err


def test_the_cli_flag_lets_an_old_run_load(tmp_path, capsys, monkeypatch):
    from adalayers.model.backbone import Backbone
    from tinymodels import tiny_bert

    monkeypatch.setenv(trust.TRUST_ENV, "0")  # restored (unset) after the test: the flag sets it for the process
    base = Backbone.load(str(tiny_bert(tmp_path / "tiny-bert")))  # a folder: `predict` loads it by name
    run = make_run(tmp_path / "acc", base, "sequence", ["bad", "good"], seed=3)
    _flip_labels(run, rehash=False)
    assert cli.main(["predict", str(run), "a good movie"]) == 2
    assert cli.main(["predict", str(run), "a good movie", "--trust-unverified"]) == 0
    assert "loaded unchecked" in capsys.readouterr().err


def test_signed_runs_refuse_a_rehashed_edit(run, base, monkeypatch, capsys):
    monkeypatch.setenv(trust.KEY_ENV, KEY)
    with pytest.raises(ModelError, match="signature.json: missing, and a signing key is set"):
        SideTasks.from_backbone(base, [run])
    assert cli.main(["sign", str(run)]) == 0
    assert "signature.json" in capsys.readouterr().out
    SideTasks.from_backbone(base, [run])  # signed: loads
    _flip_labels(run, rehash=True)  # a sha256 alone is redone by whoever edits the file
    with pytest.raises(ModelError, match="the signature does not match"):
        SideTasks.from_backbone(base, [run])
    monkeypatch.setenv(trust.KEY_ENV, "another-key-0123456789")
    with pytest.raises(ModelError, match="the signature does not match"):
        SideTasks.from_backbone(base, [run])
    monkeypatch.delenv(trust.KEY_ENV)
    assert SideTasks.from_backbone(base, [run]).heads["acc"].task.labels == ["good", "bad"]  # no key: unchecked


def test_the_key_file_and_a_short_key(run, base, monkeypatch, tmp_path):
    (tmp_path / "key").write_text(KEY + "\n")
    trust.sign(run, runlib.read_config(run)["checksums"], KEY.encode())
    monkeypatch.setenv(trust.KEY_FILE_ENV, str(tmp_path / "key"))
    SideTasks.from_backbone(base, [run])
    monkeypatch.setenv(trust.KEY_ENV, "short")
    assert cli.main(["sign", str(run)]) == 2


def test_a_folder_whose_path_is_not_utf8_loads_with_a_name(base, tmp_path):
    folder = make_run(tmp_path / os.fsdecode(b"c\xff"), base, "sequence", ["bad", "good"], seed=3)
    side = SideTasks.from_backbone(base, [f"acc={folder}"])
    assert side.predict(["a good movie"])[0]["tasks"]["acc"]["label"] in ("bad", "good")


def test_an_export_manifest_is_signed_and_checked(tmp_path, monkeypatch):
    """The export side (export/onnx.verify), on a folder of one graph file: no checksums is refused unless
    trusted; with a key, a missing signature and an edit of export.json re-hashed are refused."""
    from adalayers.cli.sign import sign_folder
    from adalayers.export import onnx

    (tmp_path / onnx.MODEL).write_bytes(b"graph bytes")
    meta = {"outputs": [{"labels": ["bad", "good"]}], "checksums": {onnx.MODEL: runlib.sha256(tmp_path / onnx.MODEL)}}
    (tmp_path / onnx.META).write_text(json.dumps(meta))
    with pytest.raises(ModelError, match="export.json: it has no checksums"):
        onnx.verify(tmp_path, {"outputs": meta["outputs"]}, onnx.MODEL)
    with trust.trusting():
        onnx.verify(tmp_path, {"outputs": meta["outputs"]}, onnx.MODEL)
    monkeypatch.setenv(trust.KEY_ENV, KEY)
    with pytest.raises(ModelError, match="signature.json: missing"):
        onnx.verify(tmp_path, meta, onnx.MODEL)
    with trust.signing():
        assert sign_folder(tmp_path, KEY.encode()) == [tmp_path / trust.SIGNATURE]
    onnx.verify(tmp_path, meta, onnx.MODEL)
    edited = {**meta, "outputs": [{"labels": ["good", "bad"]}]}  # the checksums of the files still match
    with pytest.raises(ModelError, match="the signature does not match"):
        onnx.verify(tmp_path, edited, onnx.MODEL)
