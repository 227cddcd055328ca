"""Linear probes in every run (adalayers.recipes.probes), the probe head kind (head.type probe) and the model a
run keeps (train.keep, adalayers.recipes.keep), on a random 2-layer BERT and a tiny decoder."""
import json

import numpy as np
import pytest
import torch

from adalayers import config
from adalayers.recipes import service
from adalayers.kinds import TaskKind
from adalayers.recipes import keep as keeplib
from adalayers.recipes.probes import PooledFeatures, fit_linear, folded, probe_config, probe_task, read_features
from adalayers.store import run as runlib

from tinymodels import conll_files, imdb_tarball, tiny_bert, tiny_config


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("probes")
    model = tiny_bert(root / "model")
    imdb_tarball(root / "data", per_class=12, test_per_class=6)
    conll_files(root / "data")
    return model, root / "data"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("ADALAYERS_DATA", raising=False)


def _trained(world, tmp_path, name, **train):
    model, data = world
    cfg = tiny_config(model, data, "imdb", train={"max_epochs": 2, **train})
    out = tmp_path / name
    return cfg, out, service.train(cfg, out)


def test_every_run_reports_its_probe_beside_the_head_and_keeps_the_better(world, tmp_path):
    cfg, out, m = _trained(world, tmp_path, "best", keep="best")
    probe = m["probe"]
    assert 0 <= probe["layer"] < 3 and probe["pooling"] == "mean"  # an encoder: mean pooling only
    assert probe["regularisation"] > 0 and len(probe["search"]) == 3 * 3  # 3 layers x the C grid
    assert set(probe["validation"]) >= {"mcc", "accuracy"} and "test" in probe
    assert m["kept"] in ("head", "probe") and m["validation"] == m[m["kept"]]["validation"]
    assert m["test"] == m[m["kept"]]["test"]
    written = json.loads((out / "metrics.json").read_text())
    assert written["probe"]["layer"] == probe["layer"] and written["kept"] == m["kept"]
    md = (out / "selection.md").read_text(encoding="utf-8")
    assert f"| {m['kept'] if m['kept'] == 'head' else 'linear probe'}" in md and "**(kept)**" in md
    assert "validation has" in md  # 3 validation rows: the bootstrap rule
    # the probe is a run folder of its own, with its checksums, whatever was kept
    meta = runlib.read_config(out / "candidates/probe")
    assert meta["config"]["head"]["type"] == "probe" and runlib.HEAD in meta["checksums"]
    assert service.evaluate(out)["mcc"] == m["test"]["mcc"]  # the run folder is the kept model


def test_max_layer_bounds_the_head_and_the_probes_search(world, tmp_path):
    """mixer.max_layer: neither the head nor any probe searched reads a state past it, so the kept model never
    does (on a decoder served by llama.cpp: no final state, no output at every prompt position)."""
    model, data = world
    cfg = tiny_config(model, data, "imdb", train={"max_epochs": 2, "keep": "best"}, mixer={"max_layer": 1})
    m = service.train(cfg, tmp_path / "top1")
    assert {e["layer"] for e in m["probe"]["search"]} == {0, 1} and m["probe"]["layer"] <= 1
    for folder in (tmp_path / "top1", tmp_path / "top1/candidates/head", tmp_path / "top1/candidates/probe"):
        task, _, _ = runlib.load_head(folder)
        assert max(task.used_layers()) <= 1, folder


def test_keep_probe_makes_the_run_folder_a_probe_served_as_any_head(world, tmp_path):
    cfg, out, m = _trained(world, tmp_path, "probe", keep="probe")
    assert m["kept"] == "probe"
    meta = runlib.read_config(out)
    assert meta["config"]["head"]["type"] == "probe" and meta["config"]["mixer"]["pin_layer"] == m["probe"]["layer"]
    task, _, _ = runlib.load_head(out)
    assert task.used_layers() == [m["probe"]["layer"]]
    # one shared projection: the head file holds it once, not once per layer
    names = list(dict(task.named_parameters()))
    assert sum(n.startswith("mixer.proj.") for n in names) == 1
    assert service.evaluate(out)["mcc"] == pytest.approx(m["probe"]["test"]["mcc"])
    # the trained head went to candidates/head, a run folder that still loads and scores as before
    assert runlib.read_config(out / "candidates/head")["config"]["head"]["type"] == "attention"
    assert service.evaluate(out / "candidates/head")["mcc"] == pytest.approx(m["head"]["test"]["mcc"])
    answers = service.predict(out, ["a wonderful film", "a dull film"])
    assert [a["label"] for a in answers] and all(abs(sum(a["probabilities"].values()) - 1) < 1e-5 for a in answers)


def test_keep_head_keeps_the_head_and_still_reports_the_probe(world, tmp_path):
    cfg, out, m = _trained(world, tmp_path, "head", keep="head")
    assert m["kept"] == "head" and "train.keep is head" in (out / "selection.md").read_text()
    assert runlib.read_config(out)["config"]["head"]["type"] == "attention" and m["probe"]["validation"]


def test_the_probe_head_computes_what_scikit_learn_fitted(world):
    """The folded probe head (standardisation in its linear map) gives sklearn's predictions on the features
    it was fitted on, for classification and regression."""
    model, data = world
    cfg = tiny_config(model, data, "imdb")
    backbone, dat, enc = service.prepare(cfg)
    source = service.make_source(cfg, backbone, dat, enc)
    layer, rows = 1, list(range(len(enc["train"].rows)))
    pcfg = probe_config(cfg, layer, "mean", backbone.hidden_size)
    template = probe_task(cfg, backbone, dat.labels, layer, "mean", np.zeros((2, backbone.hidden_size)), np.zeros(2))
    x, y = read_features(source, enc["train"], rows, [layer], ("mean",), template.seen, 8, 0)
    x = x[(layer, "mean")]
    order = sorted(rows, key=lambda r: len(enc["train"].rows[r]["input_ids"]))
    for kind, target in ((TaskKind.CLASSIFICATION, y), (TaskKind.REGRESSION, np.linspace(-1, 1, len(y)))):
        scaler, fitted = fit_linear(kind, x, target, 1.0, 0)
        w, b = folded(kind, scaler, fitted, 2)
        labels = dat.labels if kind == TaskKind.CLASSIFICATION else []
        c = config.from_dict(pcfg.to_dict(), [f"head.kind={kind}"])
        task = probe_task(c, backbone, labels, layer, "mean", w, b)
        from adalayers.data.encoding import split_batch

        batch = split_batch(enc["train"], order, 0)
        with torch.no_grad():
            source.run(batch, [task])
            out = task.end(batch["attention_mask"]).numpy()
        want = fitted.decision_function(scaler.transform(x)) if kind == TaskKind.CLASSIFICATION else \
            fitted.predict(scaler.transform(x))
        got = out[:, 1] - out[:, 0] if kind == TaskKind.CLASSIFICATION else out
        assert np.allclose(got, want, atol=1e-3), kind


def test_a_token_task_gets_a_per_token_probe(world, tmp_path):
    model, data = world
    cfg = tiny_config(model, data, "conll2003", train={"max_epochs": 1, "keep": "probe"})
    m = service.train(cfg, tmp_path / "ner")
    assert m["kept"] == "probe" and m["probe"]["pooling"] == "token" and "f1" in m["probe"]["test"]
    assert service.evaluate(tmp_path / "ner")["f1"] == pytest.approx(m["probe"]["test"]["f1"])


def test_a_token_task_compares_layers_on_a_token_subsample_then_searches_c_on_the_best(world, tmp_path,
                                                                                        monkeypatch):
    """A row per labelled token makes a full grid slow (57 fits, 305 s a seed on gemma3-270m's CoNLL subset):
    every layer at TOKEN_C on at most SEARCH_TOKENS tokens, then the C grid on the best layer's every token."""
    from adalayers.recipes import probes

    monkeypatch.setattr(probes, "SEARCH_TOKENS", 25)
    model, data = world
    cfg = tiny_config(model, data, "conll2003", train={"max_epochs": 1, "keep": "head"})
    search = service.train(cfg, tmp_path / "ner")["probe"]["search"]
    layers = [s for s in search if s["stage"] == "layers"]
    cs = [s for s in search if s["stage"] == "regularisation"]
    assert [s["layer"] for s in layers] == [0, 1, 2] and {s["rows"] for s in layers} == {25}
    assert {s["regularisation"] for s in layers} == {probes.TOKEN_C}
    best = max(layers, key=lambda s: s["validation"])
    assert [s["regularisation"] for s in cs] == list(probes.C_GRID) and {s["layer"] for s in cs} == {best["layer"]}
    assert cs[0]["rows"] > 25  # every labelled token of the search rows


def test_the_choice_rule():
    task = type("T", (), {"kind": TaskKind.CLASSIFICATION, "labels": ["a", "b"], "cfg": None})()
    ex = [type("E", (), {"label": "a" if i % 2 else "b"})() for i in range(40)]
    right = [(0 if i % 2 else 1, None) for i in range(40)]
    wrong_some = [(p if i % 4 else 1 - p, None) for i, (p, _) in enumerate(right)]
    c = keeplib.choose("best", "accuracy", task, ex, right, wrong_some, 1.0, 0.75, 0)
    assert c.kept == "head" and c.head_share == 1.0  # a clear lead over every resample
    c = keeplib.choose("best", "accuracy", task, ex, right, right, 1.0, 1.0, 0)
    assert c.kept == "probe" and c.head_share == 0.5  # a tie: the simpler model
    big = ex * 30
    c = keeplib.choose("best", "accuracy", task, big, right * 30, right * 30, 0.9, 0.89, 0)
    assert c.kept == "head" and c.head_share is None  # 1,200 rows: the higher score
    assert keeplib.choose("probe", "accuracy", task, ex, right, wrong_some, 1.0, 0.7, 0).kept == "probe"


def test_pooled_features_drop_the_bos_and_pool_the_last_token():
    col = PooledFeatures([0], ("mean", "last"), lambda m: m & (m.long().cumsum(1) > 1))
    col.mask = torch.tensor([[True, True, True, False]])
    col.labels = torch.zeros(1)
    z = torch.randn(1, 4, 8)
    col.tap(0, z)
    f = torch.nn.functional.layer_norm(torch.nn.functional.gelu(z), (8,))
    assert np.allclose(col.out[(0, "mean")][0], f[0, 1:3].mean(0).numpy(), atol=1e-6)
    assert np.allclose(col.out[(0, "last")][0], f[0, 2].numpy(), atol=1e-6)


def test_a_probe_fits_on_one_blas_thread(monkeypatch):
    """OpenBLAS's threads spinning beside torch's made the probe search 30x slower on a busy machine."""
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_info

    from adalayers.kinds import TaskKind
    from adalayers.recipes.probes import fit_linear

    seen = []
    real = LogisticRegression.fit

    def fit(self, x, y):
        seen.append({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})
        return real(self, x, y)

    monkeypatch.setattr(LogisticRegression, "fit", fit)
    rng = np.random.default_rng(0)
    fit_linear(TaskKind.CLASSIFICATION, rng.normal(size=(40, 8)), rng.integers(0, 2, 40), 1.0, 0)
    assert seen == [{1}]
