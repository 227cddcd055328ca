"""AnswerText (infer/answers.py): the answer's text kept as tokens come equals the full decode of prompt + answer
(answer_text) after every token, and its spans equal the per-prefix decodes' (the slow obvious reference below),
on llama.cpp's tokenizer of a tiny byte-level vocabulary (any byte sequence: characters split over tokens,
invalid UTF-8, control tokens) and on a tokenizer that is not a PieceTokenizer."""
from __future__ import annotations

import numpy as np
import pytest

from adalayers.infer.answers import AnswerText, PieceTokenizer, answer, answer_text

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'adalayers[llamacpp]')")


def _reference(tok, prompt_ids, generated):
    """answer() as it was: every prefix decoded with the prompt."""
    spans, prev, text = [], 0, ""
    for j in range(len(generated)):
        text = answer_text(tok, prompt_ids, generated[: j + 1])
        piece = text[prev:]
        spans.append((prev + len(piece) - len(piece.lstrip()), len(text)))
        prev = len(text)
    return text, spans


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from adalayers.infer.llamacpp import LlamaCpp
    from adalayers.infer.llamacpp_tokenizer import GgufTokenizer
    from tinygguf import write_tiny_llama

    path = write_tiny_llama(tmp_path_factory.mktemp("answers") / "tiny.gguf")
    return GgufTokenizer(LlamaCpp(path, n_ctx=64, n_seq=1, n_batch=64, threads=1, read_states=False))


def _check(tok, prompt, generated):
    kept = AnswerText(tok, prompt)
    for j, t in enumerate(generated):
        assert kept.add(t) == answer_text(tok, prompt, generated[: j + 1]), (prompt, generated[: j + 1])
    assert (kept.text, kept.spans) == _reference(tok, prompt, generated)
    assert answer(tok, prompt, generated) == _reference(tok, prompt, generated)
    return kept


def test_text_of_any_bytes_equals_the_full_decode_after_every_token(tok):
    assert isinstance(tok, PieceTokenizer)
    rng = np.random.default_rng(0)
    ids = list(range(tok.n_vocab))  # 256 byte tokens, merges, BOS and EOS (control tokens: no text)
    fast = slow = 0
    for _ in range(300):
        prompt = rng.choice(ids, int(rng.integers(0, 12))).tolist()
        generated = rng.choice(ids, int(rng.integers(1, 24))).tolist()
        kept = _check(tok, prompt, generated)
        fast, slow = fast + (kept._decoder is not None), slow + (kept._decoder is None)
    assert fast > 100 and slow > 10  # both ways taken: prompts that end inside a character decode it all


def test_characters_split_over_tokens(tok):
    for text in ["café au lait", "日本語のテキスト", "emoji 🙂 and ümlauts", "a\ufffdb"]:
        ids = tok.encode(text, add_special_tokens=False)
        for cut in range(len(ids)):
            _check(tok, ids[:cut], ids[cut:])


def test_a_tokenizer_that_is_not_a_piece_tokenizer_decodes_in_full():
    class Words:  # decode strips a leading space, as sentencepiece does when decoding alone
        words = ["<s>", " the", " cat", " sat", ".", " é"]

        def decode(self, ids, skip_special_tokens=False):
            return "".join(self.words[i] for i in ids if not (skip_special_tokens and i == 0)).lstrip()

    tok = Words()
    assert not isinstance(tok, PieceTokenizer)
    kept = _check(tok, [0, 1, 2], [3, 4, 5, 0, 1])
    assert kept.text == " sat. é the"
