"""What a task.template string may be, checked without a tokenizer (the config validates it; data.templates
applies it): None (off), 'chat', or a str.format string over FIELDS that holds {text}."""
from __future__ import annotations

import string

FIELDS = ("text", "text_pair")
EXAMPLE = "'Review: {text}\\nSentiment:'"


def spec_problem(spec: str | None) -> str | None:
    """Why `spec` is not a usable task.template (a phrase), or None: 'chat' or a format string over FIELDS."""
    if spec is None or spec == "chat":
        return None
    try:
        names = fields(spec)
    except ValueError as e:
        return f"not a valid format string ({e}; write {{{{ and }}}} for literal braces)"
    wrong = [n for n in names if n not in FIELDS]
    if wrong:
        return f"unknown field {{{wrong[0]}}} (a format string takes {{text}} and, for sentence pairs, {{text_pair}})"
    if "text" not in names:
        return f"must be 'chat' or hold {{text}}, e.g. {EXAMPLE}"
    return None


def fields(spec: str) -> list[str]:
    """The replacement fields of a format string ('{text!r:>9}' -> 'text'); ValueError when malformed."""
    return [name for _, name, _, _ in string.Formatter().parse(spec) if name is not None]
