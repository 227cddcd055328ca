"""A generated answer as text: decoded after the prompt's tokens (so the space a token puts before its word is
kept), cut before the first stop string, with each generated token's character span.

AnswerText keeps the text as tokens arrive (a stream's deltas, the stop strings' check, the spans at the end).
With a tokenizer whose text is its tokens' bytes joined (PieceTokenizer: llama.cpp's GgufTokenizer) a token
costs its own bytes; with any other, a full decode of prompt + answer, as answer_text.
"""
from __future__ import annotations

import codecs
from typing import Protocol, runtime_checkable


@runtime_checkable
class PieceTokenizer(Protocol):
    """A tokenizer whose decode(ids, skip_special_tokens=True) is the UTF-8 text ("replace" for bad bytes) of
    piece(t) joined over the ids, is_special(t) ones left out."""

    def piece(self, token: int) -> bytes: ...

    def is_special(self, token: int) -> bool: ...


def answer_text(tok, prompt_ids: list[int], generated: list[int]) -> str:
    """The generated tokens' text as it continues the prompt's (decoded after the prompt's tokens, so
    the space a token puts before its word is kept; decoded alone, a tokenizer may strip it)."""
    head = tok.decode(prompt_ids, skip_special_tokens=True)
    full = tok.decode(prompt_ids + generated, skip_special_tokens=True)
    return full[len(head):] if full.startswith(head) else tok.decode(generated, skip_special_tokens=True)


def cut(text: str, stop) -> str:
    """The text before the first of the stop strings in it (all of it when none is in it)."""
    return text[:min([i for i in (text.find(s) for s in stop) if i >= 0], default=len(text))]


class AnswerText:
    """answer_text(tok, prompt_ids, generated) as tokens are added: after each add(), `text` equals it, and
    `spans` holds each token's character span (as `answer` gives them).

    A PieceTokenizer whose prompt bytes end on a character boundary: UTF-8 decoding is then the same over
    prompt + answer as over each part alone, so only the answer's bytes are decoded, each token's once (an
    incremental decoder; bytes of a character still incomplete shown as U+FFFD, as a full decode shows them).
    Otherwise (another tokenizer, a prompt ending inside a character) each add() decodes prompt + answer."""

    def __init__(self, tok, prompt_ids: list[int]):
        self.tok, self.prompt_ids, self.generated = tok, list(prompt_ids), []
        self.text, self.spans = "", []
        self._decoder, self._done = None, ""
        if isinstance(tok, PieceTokenizer):
            prompt = codecs.getincrementaldecoder("utf-8")("replace")
            prompt.decode(b"".join(tok.piece(t) for t in self.prompt_ids if not tok.is_special(t)))
            if prompt.getstate()[0] == b"":
                self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, token: int) -> str:
        """Append a generated token; -> the answer's text so far."""
        self.generated.append(token)
        if self._decoder is None:
            self.text = answer_text(self.tok, self.prompt_ids, self.generated)
        else:
            if not self.tok.is_special(token):
                self._done += self._decoder.decode(self.tok.piece(token))
            pending = self._decoder.getstate()[0]
            self.text = self._done + pending.decode("utf-8", "replace") if pending else self._done
        prev = self.spans[-1][1] if self.spans else 0
        piece = self.text[prev:]
        self.spans.append((prev + len(piece) - len(piece.lstrip()), len(self.text)))
        return self.text


def answer(tok, prompt_ids: list[int], generated: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """The answer as it continues the prompt's text, and each generated token's character span in it.

    Decoded after the prompt's tokens, so the space a token puts before its word is kept (decoded
    alone, a tokenizer strips it); a leading space belongs to no word.
    """
    text = AnswerText(tok, prompt_ids)
    for t in generated:
        text.add(t)
    return text.text, text.spans
