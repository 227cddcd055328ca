"""Token tasks: first-sub-token labels, windows for long sentences, and re-assembly to words."""
from types import SimpleNamespace

import pytest
import torch

from adalayers.model import model_packages
from adalayers.data.encoding import encode, word_tokenizer
from adalayers.recipes.evaluate import example_predictions
from adalayers.model.sidetask import IGNORE
from adalayers.data.tasks import Example
from adalayers.data.tasks.conll import LABELS


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_packages.path_for("minilm-l6")))


def _sentence(n_words: int):
    words = ["Zwingmann", "said", "1996-08-22", "in", "Brussels", "."]  # 3, 1, 5, 1, 1, 1 MiniLM pieces
    tags = ["B-PER", "O", "O", "O", "B-LOC", "O"]
    reps = n_words // len(words) + 1
    return Example(words=(words * reps)[:n_words], tags=(tags * reps)[:n_words])


def test_first_sub_token_carries_the_label(tokenizer):
    ex = Example(words=["Zwingmann", "said", "1996-08-22"], tags=["B-PER", "O", "O"])
    split = encode([ex], tokenizer, 32, "token", LABELS)
    (row,) = split.rows
    pieces = tokenizer.convert_ids_to_tokens(row["input_ids"])
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]"
    firsts = [i for i, w in enumerate(row["word_ids"]) if w is not None and w not in row["word_ids"][:i]]
    assert [pieces[i] for i in firsts] == ["z", "said", "1996"]  # the first piece of each word
    expected = [IGNORE] * len(pieces)
    for i, tag in zip(firsts, ex.tags):
        expected[i] = LABELS.index(tag)
    assert row["labels"] == expected
    assert sum(x != IGNORE for x in row["labels"]) == 3


def test_long_sentence_is_windowed_and_every_word_comes_back(tokenizer):
    short, long_ = _sentence(5), _sentence(60)   # 60 words = ~120 pieces
    max_length = 16
    split = encode([short, long_], tokenizer, max_length, "token", LABELS)
    assert split.extra["split_examples"] == 1 and split.extra["windows"] > 2
    covered = {0: [], 1: []}
    for row in split.rows:
        assert len(row["input_ids"]) <= max_length
        assert sum(x != IGNORE for x in row["labels"]) == row["num_words"]
        covered[row["example"]] += range(row["word_start"], row["word_start"] + row["num_words"])
    assert covered == {0: list(range(5)), 1: list(range(60))}  # windows tile the sentence, in order

    # fake outputs: the gold tag at each word's first piece, a wrong tag everywhere else
    task = SimpleNamespace(kind="token", labels=LABELS)
    outs = []
    for row in split.rows:
        probs = torch.zeros(len(row["input_ids"]), len(LABELS))
        probs[:, LABELS.index("I-MISC")] = 1.0
        for pos, lab in enumerate(row["labels"]):
            if lab != IGNORE:
                probs[pos] = 0
                probs[pos, lab] = 1.0
        outs.append(probs)
    preds = example_predictions(task, split, outs, [short, long_])
    assert preds == [short.tags, long_.tags]


def test_a_word_longer_than_a_window_keeps_its_label(tokenizer):
    giant = "-".join(["1996"] * 12)  # 23 pieces, more than max_length allows
    ex = Example(words=["in", giant, "Brussels"], tags=["O", "B-MISC", "B-LOC"])
    split = encode([ex], tokenizer, 12, "token", LABELS)
    assert [r["num_words"] for r in split.rows] == [1, 1, 1]
    assert all(len(r["input_ids"]) <= 12 for r in split.rows)
    labelled = [[x for x in r["labels"] if x != IGNORE] for r in split.rows]
    assert labelled == [[LABELS.index("O")], [LABELS.index("B-MISC")], [LABELS.index("B-LOC")]]


def test_byte_level_tokenizer_gets_a_prefix_space_for_words(tmp_path):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["the cat sat on the mat near the hat"] * 20, vocab_size=300, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(tmp_path))
    tok = RobertaTokenizer(vocab=str(tmp_path / "vocab.json"), merges=str(tmp_path / "merges.txt"))
    before = tok("the cat sat")["input_ids"]
    words = word_tokenizer(tok)
    assert words is not tok and word_tokenizer(tok) is words  # copied once, then reused
    pieces = words.convert_ids_to_tokens(words([["cat", "sat"]], is_split_into_words=True,
                                               add_special_tokens=False)["input_ids"][0])
    assert pieces == ["Ġcat", "Ġsat"]  # mid-sentence pieces, as the base saw them in running text
    assert tok("the cat sat")["input_ids"] == before  # the base's own tokenizer is untouched
    split = encode([Example(words=["the", "cat"], tags=["O", "B-PER"])], tok, 16, "token", LABELS)
    assert tok.convert_ids_to_tokens(split.rows[0]["input_ids"])[1:3] == ["Ġthe", "Ġcat"]


def test_wordpiece_tokenizer_is_used_as_is(tokenizer):
    assert word_tokenizer(tokenizer) is tokenizer
