"""The real MiniLM exported with a CoLA (sequence) and a CoNLL (token) head: ONNX Runtime fp32 gives
PyTorch's probabilities within 1e-3 and the same labels and tags on 200 real CoLA dev sentences;
the int8 graph's agreement is measured.

Trained heads are read from $ADALAYERS_RUNS/{cola,conll} (default ../runs) where they exist; otherwise
a fresh head on the real base stands in (equality still checked; its int8 agreement only logged).
The 97% int8 goal is not met: the trained CoLA head agrees on 96% (see docs/export.md); the test
holds trained heads to 90%.
"""
import csv
import logging
import os
from pathlib import Path

import pytest

from adalayers.backbone import Backbone
from adalayers.export.onnx import export
from adalayers.export.runtime import OnnxSideTasks
from adalayers.serve.api import SideTasks

from conftest import DATA, ROOT, needs_data
from runs_util import NER, make_run
from test_export import assert_same

# The real base's 6 layers in ONNX Runtime differ from PyTorch by float rounding; through the heads
# (fresh ones are made confident, weights x3) probabilities moved by up to 2.9e-4 in one run: held to
# 1e-3 here, 1e-4 on the tiny models (test_export.py). Labels and tags must be identical.
TOL = 1e-3
RUNS = Path(os.environ.get("ADALAYERS_RUNS") or ROOT.parent / "runs")
log = logging.getLogger(__name__)


def agreement(ref: list[dict], got: list[dict]) -> dict[str, float]:
    out = {}
    for name in ref[0]["tasks"]:
        pairs = [(r["tasks"][name], g["tasks"][name]) for r, g in zip(ref, got)]
        if "label" in pairs[0][0]:
            out[name] = sum(a["label"] == b["label"] for a, b in pairs) / len(pairs)
        else:  # tags, word by word
            same = sum(x == y for a, b in pairs for x, y in zip(a["tags"], b["tags"]))
            out[name] = same / sum(len(a["tags"]) for a, _ in pairs)
    return out


@pytest.mark.slow
@needs_data
def test_minilm_cola_conll_onnx_equals_pytorch(tmp_path):
    rows = list(csv.reader(open(DATA / "glue" / "CoLA" / "dev.tsv", encoding="utf-8"), delimiter="\t",
                           quoting=csv.QUOTE_NONE))
    texts = [r[3] for r in rows[:200]]
    base = Backbone.load("minilm-l6")
    fresh = {"cola": ("sequence", ["unacceptable", "acceptable"]), "conll": ("token", NER)}
    heads, trained = [], []
    for seed, (name, (kind, labels)) in enumerate(fresh.items()):
        if (RUNS / name / "metrics.json").is_file():
            heads.append((name, RUNS / name))
            trained.append(name)
        else:
            heads.append((name, make_run(tmp_path / name, base, kind, labels, seed=seed, max_length=64)))
    export(base, heads, tmp_path / "exported", int8=True)
    ref = SideTasks.from_backbone(base, [f"{n}={p}" for n, p in heads]).predict(texts)
    assert_same(ref, OnnxSideTasks.open(tmp_path / "exported").predict(texts), tol=TOL)
    agree = agreement(ref, OnnxSideTasks.open(tmp_path / "exported", int8=True).predict(texts))
    log.warning("int8 agreement with PyTorch fp32 on %d CoLA dev sentences (trained: %s): %s", len(texts),
                trained, agree)
    for name in trained:  # measured 0.96 for the trained CoLA head (docs/export.md); fresh heads sit near ties
        assert agree[name] >= 0.9, agree
