"""A tiny random base saved as a model folder (so other processes and Ray actors load it) with two heads."""
from __future__ import annotations

import random
from pathlib import Path

from adalayers.model.backbone import Backbone

from conftest import WORDS, tiny_model, tiny_tokenizer
from runs_util import NER, make_run


def saved_base_and_heads(root: Path) -> tuple[str, list[str]]:
    """(base folder, [sequence head run, token head run]) under root."""
    tok = tiny_tokenizer()
    folder = root / "tiny-bert"
    tiny_model("bert", len(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    base = Backbone.load(str(folder))
    return str(folder), [str(make_run(root / "acc", base, "sequence", ["bad", "good"], seed=3)),
                         str(make_run(root / "ner", base, "token", NER, seed=4))]


def pair_heads(root: Path, base_folder: str) -> list[str]:
    """[a sentence-pair classification head, a sentence-pair regression head] on the saved base."""
    base = Backbone.load(base_folder)
    return [str(make_run(root / "para", base, "sequence", ["different", "same"], seed=5, pairs=True)),
            str(make_run(root / "sim", base, "regression", [], seed=6, pairs=True))]


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(n)]
