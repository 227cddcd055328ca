"""ONNX export of base + every head: ONNX Runtime gives the PyTorch path's answers.

Tolerances: fp32 logits/probabilities and the embedding within 1e-4 of PyTorch (the graph is the
same arithmetic; only kernels differ), predicted labels and tags identical. int8 is checked for
running and for quantizing the base's matrices only (random tiny models); its agreement on real
sentences is measured in test_export_real.py.
"""
import onnx
import pytest
import torch

from adalayers.errors import AdaLayersError, ModelError, RunError
from adalayers.export.int8 import DEFAULT_INT8
from adalayers.export.onnx import export, read_meta
from adalayers.infer.sidetasks import SideTasks
from adalayers.store.head_spec import HeadSpec

from conftest import tiny_backbone
from runs_util import NER, make_run
from test_sidetasks import TEXTS

TOL = 1e-4


def make_runs(root, base):
    return {"acc": make_run(root / "acc", base, "sequence", ["bad", "good", "meh"], seed=3, p=[1, 1, 0, 0],
                            max_length=16),
            "score": make_run(root / "score", base, "regression", [], seed=2, p=[0, 1, 1, 0], max_length=16),
            "ner": make_run(root / "ner", base, "token", NER, seed=4, p=[1, 0, 1, 0], max_length=16)}


def assert_same(ref: list[dict], got: list[dict], tol: float = TOL) -> None:
    for r, g in zip(ref, got, strict=True):
        assert r["truncated"] == g["truncated"]
        if "base" in r:
            e1, e2 = torch.tensor(r["base"]["embedding"]), torch.tensor(g["base"]["embedding"])
            assert (e1 - e2).abs().max() <= tol
        for name, a in r["tasks"].items():
            b = g["tasks"][name]
            if "value" in a:
                assert abs(a["value"] - b["value"]) <= tol
            elif "label" in a:
                assert a["label"] == b["label"]
                assert max(abs(a["probabilities"][k] - b["probabilities"][k]) for k in a["probabilities"]) <= tol
            else:
                assert a["tags"] == b["tags"] and a["entities"] == b["entities"]
                assert max(abs(x - y) for x, y in zip(a["scores"], b["scores"])) <= tol


def layers_in_graph(model_path, base) -> int:
    """How many of the base's transformer layers have weights in the graph: each has two feed-forward
    matrices with the intermediate size (37 in the tiny models) as one side."""
    inits = onnx.load(str(model_path)).graph.initializer
    n = sum(1 for i in inits if len(i.dims) == 2 and base.model.config.intermediate_size in i.dims)
    assert n % 2 == 0
    return n // 2


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_onnx_equals_pytorch_tiny(kind, tokenizer, tmp_path):
    base = tiny_backbone(kind, tokenizer)
    runs = make_runs(tmp_path, base)
    primary = kind == "bert"  # roberta: exported without the base output, so cut after layer 2
    meta = export(base, [HeadSpec(*r) for r in runs.items()], tmp_path / "exported", primary=primary, int8=primary)
    folder = tmp_path / "exported"
    assert [o["name"] for o in meta["outputs"]] == \
        (["sentence_embedding"] if primary else []) + ["acc_logits", "score_logits", "ner_logits"]
    graph = onnx.load(str(folder / "model.onnx")).graph
    assert [i.name for i in graph.input] == meta["inputs"]
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param  # dynamic batch
    assert graph.input[0].type.tensor_type.shape.dim[1].dim_param  # dynamic sequence
    assert ("token_type_ids" in meta["inputs"]) == (base.model.config.type_vocab_size > 1)
    # the heads use states 0..2 (0 = embedding output); the base has 3 layers (states 1..3)
    assert layers_in_graph(folder / "model.onnx", base) == (3 if primary else 2)

    torch_side = SideTasks.from_backbone(base, list(runs.values()), primary=primary)
    onnx_side = SideTasks.load(str(folder), [], runtime="onnx", primary=primary)
    assert onnx_side.names == torch_side.names
    assert_same(torch_side.predict(TEXTS), onnx_side.predict(TEXTS))
    assert_same(torch_side.predict(TEXTS, tasks=["ner"]), onnx_side.predict(TEXTS, tasks=["ner"]))
    if primary:
        assert meta["int8_scheme"]["name"] == DEFAULT_INT8
        quantized = [n.name for n in onnx.load(str(folder / "model.int8.onnx")).graph.node
                     if n.op_type in ("MatMulNBits", "MatMulInteger", "DynamicQuantizeMatMul")]
        assert quantized and all(n.startswith("/model/") for n in quantized)  # the base only, never a head
        int8 = SideTasks.open_export(folder, int8=True)
        got = int8.predict(TEXTS)
        assert len(got) == len(TEXTS) and all(set(g["tasks"]) == {"acc", "score", "ner"} for g in got)


def test_export_refuses_bad_input(tokenizer, tmp_path):
    base = tiny_backbone("bert", tokenizer)
    run = make_run(tmp_path / "acc", base, "sequence", ["a", "b"], seed=1)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(RunError, match="not an export folder"):
        export(base, [HeadSpec("acc", run)], tmp_path / "busy")
    with pytest.raises(AdaLayersError, match="task name"):
        export(base, [HeadSpec("a b", run)], tmp_path / "out")
    with pytest.raises(ModelError, match="int8 scheme 'nope'"):
        export(base, [HeadSpec("acc", run)], tmp_path / "out", int8=True, int8_scheme="nope")
    with pytest.raises(RunError, match="run folder not found"):
        export(base, [HeadSpec("x", tmp_path / "missing")], tmp_path / "out")
    assert not (tmp_path / "out").exists() and (tmp_path / "busy" / "notes.txt").read_text() == "mine"
    with pytest.raises(RunError, match="export.json"):
        read_meta(tmp_path / "busy")


def test_cli_export_then_serve_runtime_onnx(tokenizer, tmp_path):
    """`adalayers export` on a model folder, then `adalayers serve --runtime onnx` (a real uvicorn in a
    subprocess on 127.0.0.1) answers /predict as the PyTorch SideTasks does."""
    import json
    import os
    import socket
    import subprocess
    import sys
    import time

    import httpx

    from adalayers.cli import main

    base = tiny_backbone("bert", tokenizer)
    base.model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    runs = make_runs(tmp_path, base)
    assert main(["export", "--base", str(tmp_path / "base"), "--heads", str(runs["acc"]), f"tags={runs['ner']}",
                 "--out", str(tmp_path / "exported")]) == 0
    assert json.loads((tmp_path / "exported" / "export.json").read_text())["heads"].keys() == {"acc", "tags"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "adalayers.cli", "serve", "--runtime", "onnx", "--base",
                             str(tmp_path / "exported"), "--heads", "acc", "tags", "--host", "127.0.0.1",
                             "--port", str(port), "--threads", "1"],
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "server did not start in 120 s"
            try:  # serve binds first and loads in the background: 503 while loading, as llama-server
                got = httpx.post(f"http://127.0.0.1:{port}/predict", json={"texts": TEXTS[:4]}, timeout=30)
                if got.status_code != 503:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        assert got.status_code == 200, got.text
        ref = SideTasks.from_backbone(base, [runs["acc"], f"tags={runs['ner']}"]).predict(TEXTS[:4])
        assert_same(ref, got.json()["results"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_load_backend_onnx_from_base_and_runs_exports_once(tokenizer, tmp_path, monkeypatch):
    """SideTasks.load(base, runs, runtime="onnx") exports into the cache once, then reuses it."""
    import adalayers.infer.onnx as runtime

    base = tiny_backbone("bert", tokenizer)
    base.model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    runs = make_runs(tmp_path, base)
    monkeypatch.setenv("ADALAYERS_CACHE", str(tmp_path / "cache"))
    heads = [str(runs["acc"]), str(runs["score"])]
    side = SideTasks.load(str(tmp_path / "base"), heads, runtime="onnx")
    assert len(list((tmp_path / "cache" / "onnx").iterdir())) == 1
    assert_same(SideTasks.from_backbone(base, heads).predict(TEXTS), side.predict(TEXTS))
    monkeypatch.setattr(runtime, "export", lambda *a, **k: pytest.fail("exported again"))
    with pytest.warns(DeprecationWarning, match="backend= is deprecated"):  # the old name, kept one release
        assert SideTasks.load(str(tmp_path / "base"), heads, backend="onnx").names == ["acc", "score"]
    with pytest.raises(AdaLayersError, match="runtime 'tf': choose one of torch, onnx, onnx-int8, llama.cpp"):
        SideTasks.load(str(tmp_path / "base"), heads, runtime="tf")


def test_an_edited_export_is_refused_and_paths_are_relative(tokenizer, tmp_path, caplog):
    import json

    import numpy as np

    base = tiny_backbone("bert", tokenizer)
    runs = make_runs(tmp_path / "runs", base)
    folder = tmp_path / "exported"
    meta = export(base, [HeadSpec(*r) for r in runs.items()], folder)
    text = (folder / "export.json").read_text()
    assert str(tmp_path) not in text and meta["heads"]["acc"]["run"] == "../runs/acc"
    assert set(meta["checksums"]) >= {"model.onnx", "tokenizer.json"}
    before = SideTasks.open_export(folder).predict(TEXTS)
    # the graph's weights overwritten with other finite values: ONNX Runtime would run it and answer differently
    good = (folder / "model.onnx").read_bytes()
    raw = bytearray(good)
    middle = len(raw) // 2 // 4 * 4
    raw[middle: middle + 4096] = np.full(1024, 0.5, dtype=np.float32).tobytes()
    (folder / "model.onnx").write_bytes(bytes(raw))
    with pytest.raises(RunError, match="model.onnx: checksum does not match export.json"):
        SideTasks.open_export(folder)
    (folder / "model.onnx").write_bytes(good)
    vocab = folder / "tokenizer.json"
    vocab.write_text(vocab.read_text().replace('"the"', '"thee"', 1))
    with pytest.raises(RunError, match="tokenizer.json: checksum does not match"):
        SideTasks.open_export(folder)
    # an export without checksums (older, or deleted): refused unless trusted, then loaded with a warning
    old = json.loads(text)
    old.pop("checksums")
    (folder / "export.json").write_text(json.dumps(old))
    vocab.write_text(vocab.read_text().replace('"thee"', '"the"', 1))
    with pytest.raises(ModelError, match="export.json: it has no checksums"):
        SideTasks.open_export(folder)
    with caplog.at_level("WARNING"):
        assert_same(before, SideTasks.open_export(folder, trust_unverified=True).predict(TEXTS))
    assert "has no checksums" in caplog.text
