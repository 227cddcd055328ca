"""A generated answer as text: decoded after the prompt's tokens (so the space a token puts before its word is
kept), cut before the first stop string, with each generated token's character span."""
from __future__ import annotations


def answer_text(tok, prompt_ids: list[int], generated: list[int]) -> str:
    """The generated tokens' text as it continues the prompt's (decoded after the prompt's tokens, so
    the space a token puts before its word is kept; decoded alone, a tokenizer may strip it)."""
    head = tok.decode(prompt_ids, skip_special_tokens=True)
    full = tok.decode(prompt_ids + generated, skip_special_tokens=True)
    return full[len(head):] if full.startswith(head) else tok.decode(generated, skip_special_tokens=True)


def cut(text: str, stop) -> str:
    """The text before the first of the stop strings in it (all of it when none is in it)."""
    return text[:min([i for i in (text.find(s) for s in stop) if i >= 0], default=len(text))]


def answer(tok, prompt_ids: list[int], generated: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """The answer as it continues the prompt's text, and each generated token's character span in it.

    Decoded after the prompt's tokens, so the space a token puts before its word is kept (decoded
    alone, a tokenizer strips it); a leading space belongs to no word.
    """
    spans, prev, text = [], 0, ""
    for j in range(len(generated)):
        text = answer_text(tok, prompt_ids, generated[: j + 1])
        piece = text[prev:]
        spans.append((prev + len(piece) - len(piece.lstrip()), len(text)))
        prev = len(text)
    return text, spans
