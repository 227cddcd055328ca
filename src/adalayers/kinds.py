"""What a task predicts: a `TaskKind`, not a bare string.

    CLASSIFICATION  one label per text (or text pair)        value "sequence"
    REGRESSION      one number per text (or text pair)       value "regression"
    TOKENS          one tag per word                         value "token"

A TaskKind is a str enum whose values are the names run folders and configs have always stored
(head.kind: sequence / regression / token), so old run folders load and `kind == "token"` still
holds. `TaskKind.parse` also takes the user-facing names classification and tokens.
"""
from __future__ import annotations

from enum import Enum

from adalayers.errors import ConfigError


class TaskKind(str, Enum):
    CLASSIFICATION = "sequence"
    REGRESSION = "regression"
    TOKENS = "token"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __hash__(self) -> int:  # equal to its string, so it hashes like it (dict keys by name keep working)
        return hash(self.value)

    @classmethod
    def parse(cls, name: "str | TaskKind", where: str = "task kind") -> "TaskKind":
        """classification/sequence, regression, tokens/token -> the TaskKind; anything else is a ConfigError."""
        if isinstance(name, cls):
            return name
        kind = ALIASES.get(str(name).strip().lower()) if name is not None else None
        if kind is None:
            raise ConfigError(f"{where}: must be classification, regression or tokens, got {name!r}")
        return kind


ALIASES = {"classification": TaskKind.CLASSIFICATION, "sequence": TaskKind.CLASSIFICATION,
           "regression": TaskKind.REGRESSION, "tokens": TaskKind.TOKENS, "token": TaskKind.TOKENS}
