"""The one validator of what a request gives: how many texts, how long each, the text rules, the task names.

    check_count(prompts, cfg.max_texts, "prompts", "prompt")        # Empty, TooLarge (--max-texts)
    check_texts(prompts, cfg.max_chars, "prompt")                  # TooLarge (--max-chars), BadText (text rules)
    check_tasks(side, tasks + answer_only + list(guard))           # UnknownTask

Every check raises a typed error of serve/errors.py; each router answers it in its own shape (and, for Empty,
its own status). /predict, /generate, /generate/stream and the /v1 routes all check through here.
"""
from __future__ import annotations

from typing import Iterable

from adalayers.serve.errors import BadText, Empty, TooLarge, UnknownTask
from adalayers.textcheck import text_problem


def check_count(items: list, max_texts: int, what: str, one: str, param: str | None = None,
                field: str | None = None) -> None:
    """At least one item, at most max_texts (--max-texts): `what` names them ("prompts"), `one` one of them,
    `field` the request's field (default: `what`)."""
    if not items:
        raise Empty(f"{field or what} is empty: give at least one {one}", param)
    if len(items) > max_texts:
        raise TooLarge(f"{len(items)} {what} in one request; the limit is {max_texts} (--max-texts)", param)


def check_text(text: str, max_chars: int, name: str, param: str | None = None, blank_ok: bool = False) -> None:
    """One text (called `name` in the message, e.g. "prompt 2"): at most max_chars characters (--max-chars)
    and no problem of textcheck's rules (lone surrogates, blank; blank_ok: an empty or blank text passes)."""
    if len(text) > max_chars:
        raise TooLarge(f"{name} has {len(text)} characters; the limit is {max_chars} (--max-chars)", param)
    problem = text_problem(text)
    if problem and not (blank_ok and (not text or problem == "is empty")):
        raise BadText(f"{name} {problem}", param)


def check_texts(texts: Iterable[str], max_chars: int, what: str, param: str | None = None) -> None:
    """check_text on each, named "`what` 1", "`what` 2", ..."""
    for i, t in enumerate(texts):
        check_text(t, max_chars, f"{what} {i + 1}", param)


def check_tasks(side, names: Iterable[str] | None, param: str | None = None) -> None:
    """Every name is a loaded head's."""
    unknown = [t for t in (names or []) if t not in side.heads]
    if unknown:
        raise UnknownTask(f"unknown task(s): {', '.join(unknown)}; known tasks: {', '.join(side.names)}", param)
