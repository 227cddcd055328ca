"""What makes parsed JSON unsafe to walk further: nesting past a bound, or a non-finite number.

Walked with an explicit stack, never recursion, so a body or file nested thousands of levels deep (which
json.loads can still parse) is refused in one line instead of a RecursionError deeper in the code.
Used by the service's request bodies (serve/limits.py) and run folders' config.json (run.py).
"""
from __future__ import annotations

import math


def json_problem(value, max_depth: int) -> str | None:
    """Why `value` is refused, or None: "nested more than N levels deep", or "holds a non-finite number"."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return "holds a non-finite number (NaN or Infinity); JSON numbers must be finite"
        if isinstance(v, (dict, list, tuple)):
            if depth > max_depth:
                return f"is nested more than {max_depth} levels deep"
            stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
    return None


def too_deep(value, max_depth: int) -> bool:
    """Is `value` nested more than `max_depth` levels deep? (non-finite numbers aside)"""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list, tuple)):
            if depth > max_depth:
                return True
            stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
    return False
