"""model.max_length chosen from the data when the config leaves it out: the length holding 99% of the
training examples whole, capped by the base, printed with the share that is cut."""
from __future__ import annotations

import logging
import random

import pytest

from adalayers import config
from adalayers.recipes import service
from adalayers.data.encoding import choose_max_length
from adalayers.data.tasks import Example

from test_files_task import FILLER, tiny_base, write_csv  # noqa: F401  (tiny_base: a fixture)


def rows(n_short: int, n_long: int, seed: int = 0) -> list[list[str]]:
    rng = random.Random(seed)
    out = [[" ".join(rng.choices(FILLER, k=rng.randint(3, 12))), "ab"[i % 2]] for i in range(n_short)]
    out += [[" ".join(rng.choices(FILLER, k=400)), "ab"[i % 2]] for i in range(n_long)]
    return out


def test_choice_is_the_99th_percentile_within_floor_and_limit(tokenizer):
    texts = [" ".join(["the"] * n) for n in range(1, 201)]  # 3..202 tokens with [CLS] and [SEP]
    choice = choose_max_length([Example(text=t) for t in texts], tokenizer, "sequence", limit=512)
    assert choice.max_length == 200 and choice.longest == 202 and choice.examples == 200
    assert choice.share_over == pytest.approx(2 / 200)              # exactly 1% longer (the 99% hold whole)
    capped = choose_max_length([Example(text=t) for t in texts], tokenizer, "sequence", limit=64)
    assert capped.max_length == 64 and capped.share_over == pytest.approx((202 - 64) / 200)
    tiny = choose_max_length([Example(text="the")], tokenizer, "sequence", limit=64)
    assert tiny.max_length == 8 and tiny.share_over == 0            # never below 8
    pairs = choose_max_length([Example(text="the the", text_pair="a a a")], tokenizer, "sequence", limit=64,
                              floor=1)
    assert pairs.max_length == 2 + 3 + 3                             # a pair is measured as one encoding
    words = choose_max_length([Example(words=["the"] * 30, tags=["O"] * 30)], tokenizer, "token", limit=64, floor=1)
    assert words.max_length == 32


def test_long_texts_get_a_length_from_the_data_and_it_is_printed(tiny_base, tmp_path, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger="adalayers")
    train = write_csv(tmp_path / "train.csv", rows(297, 3), ["text", "label"])
    cfg = config.from_dict({"task": {"train": str(train)}, "model": {"base": tiny_base},
                            "cache": {"enabled": False}})
    assert cfg.model.max_length is None
    backbone, data, encoded = service.prepare(cfg)
    printed = caplog.text
    chosen = cfg.model.max_length
    lengths = sorted(len(backbone.tokenizer(e.text)["input_ids"]) for e in data.splits["train"])
    assert chosen == lengths[-(-99 * len(lengths) // 100) - 1] and chosen < 20   # short texts decide, not the 3 long
    assert encoded["train"].num_truncated == sum(n > chosen for n in lengths) >= 1
    share = 100 * encoded["train"].num_truncated / len(lengths)
    assert f"model.max_length not set: {chosen} tokens" in printed and f"{share:.1f}% of them are truncated" in printed
    assert "--set model.max_length=N" in printed
    many_long = write_csv(tmp_path / "long.csv", rows(50, 50), ["text", "label"])
    cfg = config.from_dict({"task": {"train": str(many_long)}, "model": {"base": tiny_base},
                            "cache": {"enabled": False}})
    service.prepare(cfg)
    assert cfg.model.max_length == 128  # the tiny base's 128 positions cap it
    set_by_hand = config.from_dict({"task": {"train": str(many_long)}, "model": {"base": tiny_base, "max_length": 40},
                                    "cache": {"enabled": False}})
    caplog.clear()
    service.prepare(set_by_hand)
    assert set_by_hand.model.max_length == 40 and "not set" not in caplog.text
