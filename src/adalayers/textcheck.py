"""What makes an input text unusable, defined once for the CLI (`adalayers predict`) and the service.

A text is refused when
  - it is not valid Unicode: a lone surrogate (e.g. "\\ud800", which JSON can carry) cannot be
    encoded as UTF-8, so no tokenizer can read it;
  - it is empty: nothing is left after removing whitespace, control characters (Cc, e.g. NUL),
    format characters (Cf, e.g. the zero-width space U+200B, which tokenizers drop), marks without a
    base letter (Mn/Mc/Me: combining accents, variation selectors) and the blank fillers that render
    as nothing (U+2800 braille blank, U+3164 / U+115F / U+1160 / U+FFA0 Hangul fillers);
  - it is longer than the character limit.
"""
from __future__ import annotations

import unicodedata

from adalayers.errors import DataError

INVISIBLE = {"Cc", "Cf", "Zs", "Zl", "Zp", "Mn", "Mc", "Me"}
FILLERS = set("\u2800\u3164\u115f\u1160\uffa0")


def is_blank(text: str) -> bool:
    """True when the text holds only whitespace, control, format (zero-width) characters, lone marks and
    blank fillers: nothing a tokenizer turns into a word."""
    return all(c.isspace() or c in FILLERS or unicodedata.category(c) in INVISIBLE for c in text)


def text_problem(text, max_chars: int | None = None) -> str | None:
    """Why `text` cannot be run (a phrase without the text's number), or None when it can."""
    if not isinstance(text, str):
        return f"is a {type(text).__name__}, not a string"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"is not valid Unicode (a lone surrogate {text[e.start]!r} at character {e.start + 1})"
    if max_chars is not None and len(text) > max_chars:
        return f"has {len(text)} characters; the limit is {max_chars}"
    if is_blank(text):
        return "is empty"
    return None


def check_texts(texts: list, max_chars: int | None = None, what: str = "text") -> None:
    """Raise DataError naming the first unusable text (1-based, as users count; `what`: e.g. "second text")."""
    for i, t in enumerate(texts):
        problem = text_problem(t, max_chars)
        if problem:
            raise DataError(f"{what} {i + 1} {problem}")
