"""Entity-level scores (metrics.entities) equal seqeval's own, number for number, on random tag
sequences that include what a token head really predicts: I-X after O, types switching mid-entity,
classes only one side has, and sides without any entity. The spans under them (adalayers.entities, which the
served token heads' entities also come from) equal seqeval's get_entities on sequences of every prefix."""
from __future__ import annotations

import random

import pytest
from seqeval.metrics import classification_report, f1_score, precision_score, recall_score

from adalayers import metrics
from adalayers.entities import entity_spans

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "I-MISC"]


def random_tags(rng: random.Random, n: int, tags=TAGS) -> list[list[str]]:
    return [[rng.choice(tags) for _ in range(rng.randint(1, 12))] for _ in range(n)]


def check(true: list[list[str]], pred: list[list[str]]) -> None:
    got = metrics.entities(true, pred)
    kw = {"zero_division": 0}
    assert got["f1"] == pytest.approx(f1_score(true, pred, **kw), abs=1e-12)
    assert got["precision"] == pytest.approx(precision_score(true, pred, **kw), abs=1e-12)
    assert got["recall"] == pytest.approx(recall_score(true, pred, **kw), abs=1e-12)
    report = {k: v for k, v in classification_report(true, pred, output_dict=True, **kw).items()
              if not k.endswith("avg")}
    assert sorted(got["per_class"]) == sorted(report)
    for name, v in report.items():
        c = got["per_class"][name]
        assert (c["precision"], c["recall"], c["f1"]) == pytest.approx((v["precision"], v["recall"], v["f1-score"]))
        assert c["support"] == v["support"]
    assert got["n"] == len(true) and got["words"] == sum(map(len, true))


@pytest.mark.parametrize("seed", range(20))
def test_entities_equal_seqeval_on_random_tags(seed):
    rng = random.Random(seed)
    true = random_tags(rng, rng.randint(1, 40))
    pred = [[t if rng.random() < 0.6 else rng.choice(TAGS) for t in row] for row in true]
    check(true, pred)


def test_entities_where_one_side_has_none_or_its_own_class():
    rng = random.Random(0)
    true = random_tags(rng, 10)
    check(true, [["O"] * len(r) for r in true])               # nothing predicted: precision 0, recall 0
    check([["O"] * len(r) for r in true], true)               # nothing to find
    check(true, [["B-NEW"] * len(r) for r in true])          # a class only the predictions have


@pytest.mark.parametrize("seed", range(20))
def test_entity_spans_equal_seqeval_get_entities_for_every_prefix(seed):
    from seqeval.metrics.sequence_labeling import get_entities

    rng = random.Random(seed)
    tags = ["O"] + [f"{p}-{t}" for p in "BIES" for t in ("PER", "LOC", "X-Y")]  # a type may hold a dash
    for _ in range(200):
        seq = [rng.choice(tags) for _ in range(rng.randint(0, 15))]
        assert entity_spans(seq) == get_entities(seq), seq
    assert entity_spans(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
    assert entity_spans(["O", "I-PER", "I-PER", "B-PER", "E-LOC", "S-LOC"]) == [("PER", 1, 2), ("PER", 3, 3),
                                                                                  ("LOC", 4, 4), ("LOC", 5, 5)]
