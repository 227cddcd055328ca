"""A probe head (head.type probe, what a run keeps when its linear probe wins) is served as any head: `predict` on
the torch and the llama.cpp runtime, `adalayers serve`'s /v1/classify under uvicorn in a subprocess, and
generation (the prompt's value read from the generation pass), on a tiny F32 GGUF base written by the test."""
from __future__ import annotations

import httpx
import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'adalayers[llamacpp]')")

from adalayers.recipes import service  # noqa: E402
from adalayers.config import Config  # noqa: E402
from adalayers.infer.sidetasks import SideTasks  # noqa: E402
from adalayers.model.backbone import Backbone  # noqa: E402
from adalayers.recipes.probes import probe_task  # noqa: E402
from adalayers.store import run as runlib  # noqa: E402
from runs_util import NER, ServeProcess, assert_json_close  # noqa: E402
from tinygguf import write_tiny_llama  # noqa: E402

TEXTS = ["the cat sat on the mat", "a man in the other room", "there"]


def probe_run(run_dir, backbone, kind: str, labels: list[str], layer: int, pooling: str):
    """A probe head of random weights on `layer`, saved the way training saves a kept probe."""
    cfg = Config()
    cfg.head.kind, cfg.model.base, cfg.model.max_length = kind, backbone.name, 64
    torch.manual_seed(layer)
    w, b = 0.3 * torch.randn(len(labels), backbone.hidden_size), 0.1 * torch.randn(len(labels))
    task = probe_task(cfg, backbone, labels, layer, pooling, w, b)
    run_dir.mkdir(parents=True)
    sha = runlib.save_head(run_dir, task)
    runlib.save_config(run_dir, task.cfg, labels, backbone, sha, task=run_dir.name, kind=kind)
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe_serving")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ADALAYERS_CACHE", str(root / "cache"))
        gguf = write_tiny_llama(root / "tiny-llama.gguf")
        base = Backbone.load(str(gguf), "decoder")
        yield {"root": root, "base": gguf, "backbone": base,
               "probe": probe_run(root / "probe", base, "sequence", ["bad", "good"], 2, "last"),
               "tags": probe_run(root / "tags", base, "token", NER, 1, "mean")}


def test_a_probe_reads_one_layer_and_predicts_on_both_runtimes(runs):
    task, _, meta = runlib.load_head(runs["probe"], runs["backbone"])
    assert task.used_layers() == [2] and meta["config"]["head"]["type"] == "probe"
    for name in ("probe", "tags"):
        torch_out = service.predict(runs[name], TEXTS)
        assert_json_close(service.predict(runs[name], TEXTS, runtime="llama.cpp"), torch_out, 5e-3)
    assert len({a["label"] for a in service.predict(runs["probe"], TEXTS)}) >= 1


def test_serve_classifies_with_a_probe_as_predict_does(runs):
    server = ServeProcess(runs["base"], [runs["probe"]], runs["root"]).wait_started()
    try:
        got = httpx.post(f"{server.url}/v1/classify", json={"model": "probe", "input": TEXTS}, timeout=60)
        assert got.status_code == 200, got.text
        want = service.predict(runs["probe"], TEXTS)
        for d, p in zip(got.json()["data"], want):
            assert d["label"] == p["label"]
            assert d["probs"] == pytest.approx([p["probabilities"][lab] for lab in ("bad", "good")], abs=1e-4)
    finally:
        server.stop()


def test_generation_reads_a_probe_from_its_own_pass(runs):
    side = SideTasks.from_backbone(runs["backbone"], [f"probe={runs['probe']}"])
    out = side.generate(TEXTS[:2], max_new_tokens=3, tasks=["probe"])
    pred = side.predict(TEXTS[:2], ["probe"])
    for g, p in zip(out, pred):
        assert g["prompt_tasks"]["probe"]["label"] == p["tasks"]["probe"]["label"]
        assert g["prompt_tasks"]["probe"]["probabilities"] == pytest.approx(p["tasks"]["probe"]["probabilities"],
                                                                             abs=1e-4)
        assert set(g["tasks"]["probe"]["probabilities"]) == {"bad", "good"}


def test_a_probes_per_step_values_and_guard_without_torch_equal_the_torch_path(runs):
    """The torch-free path (GgufPredictor) reads a probe at every step from its pooled row kept per sequence
    (numpy_incremental); the torch path reads it over the whole text each step: the same values, and a guard
    on it stops the same rows at the same token."""
    from adalayers.infer.gguf_serving import GgufPredictor

    mean = probe_run(runs["root"] / "probe_mean", runs["backbone"], "sequence", ["bad", "good"], 1, "mean")
    heads = [f"probe={runs['probe']}", f"mean={mean}"]
    torch_side = SideTasks.load(str(runs["base"]), heads, runtime="llama.cpp")
    numpy_side = GgufPredictor.load(str(runs["base"]), heads)
    kw = dict(max_new_tokens=6, steps=True, ignore_eos=True)
    a, b = torch_side.generate(TEXTS, **kw), numpy_side.generate(TEXTS, **kw)
    assert [r["token_ids"] for r in a] == [r["token_ids"] for r in b]
    assert all(len(r["steps"]["mean"]) == 6 for r in b)
    assert_json_close(a, b, 1e-4)
    values = [p for r in b for p in r["steps"]["mean"]]
    cut = sorted(v["good"] if isinstance(v, dict) else v[1] for v in values)[len(values) // 2]
    guard = dict(max_new_tokens=6, ignore_eos=True, guard={"mean": ("good", cut)})
    a, b = torch_side.generate(TEXTS, **guard), numpy_side.generate(TEXTS, **guard)
    assert [(r["finish"], r.get("guard", {}).get("token")) for r in a] == \
        [(r["finish"], r.get("guard", {}).get("token")) for r in b]
    assert any(r["finish"] == "guard" for r in b)
