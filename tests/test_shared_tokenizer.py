"""Issue 56 item 4: one tokenizer shared by threads. The service counts a request's tokens in a worker thread
(no truncation) while the batcher's thread runs a pass (truncation at max_length); a fast tokenizer's
truncation is a setting each call changes, so a pass could encode a text untruncated ("The size of tensor a
(669) must match the size of tensor b (...)", a 500). Predictor wraps its base's tokenizer in one lock
(adalayers.infer.shared_tokenizer)."""
from __future__ import annotations

import pickle
import threading

from transformers import PreTrainedTokenizerBase

from adalayers.infer.shared_tokenizer import SharedTokenizer, shared
from adalayers.infer.sidetasks import SideTasks

from conftest import tiny_backbone, tiny_tokenizer
from runs_util import NER, make_run


def test_counts_and_passes_in_threads_never_mix_their_truncation(tokenizer, tmp_path):
    base = tiny_backbone("bert", tokenizer)
    side = SideTasks.from_backbone(base, [make_run(tmp_path / "acc", base, "sequence", ["bad", "good"], seed=3),
                                          make_run(tmp_path / "ner", base, "token", NER, seed=4)])
    texts = ["ab " * 667] * 2
    expected = side.count_tokens(texts, ["acc"])
    failures = []

    def count():
        for _ in range(200):
            try:
                got = side.count_tokens(texts, ["acc"])
                assert got == expected, got
            except Exception as e:  # noqa: BLE001  (collected: any failure fails the test)
                failures.append(f"{type(e).__name__}: {str(e)[:100]}")

    def predict():
        for _ in range(40):
            try:
                side.predict(texts, tasks=["acc"])
            except Exception as e:  # noqa: BLE001
                failures.append(f"{type(e).__name__}: {str(e)[:100]}")

    threads = [threading.Thread(target=count) for _ in range(3)] + [threading.Thread(target=predict) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:3]


def test_the_shared_tokenizer_reads_writes_and_pickles_as_the_tokenizer():
    tokenizer = tiny_tokenizer()  # its own: the test sets padding_side, the session's fixture must not change
    tok = shared(tokenizer)
    assert shared(tok) is tok and isinstance(tok, PreTrainedTokenizerBase) and type(tok) is SharedTokenizer
    assert tok("a b c")["input_ids"] == tokenizer("a b c")["input_ids"] and len(tok) == len(tokenizer)
    tok.padding_side = "left"
    assert tokenizer.padding_side == "left"
    again = pickle.loads(pickle.dumps(tok))
    assert type(again) is SharedTokenizer and again("a b")["input_ids"] == tokenizer("a b")["input_ids"]
