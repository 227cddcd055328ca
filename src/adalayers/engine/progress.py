"""Progress and messages, in one place for the engine.

`bar` is the one tqdm bar (rank 0 of a torchrun job only); when stderr is not a terminal the CLI's
adalayers.progress.configure turns its redraws into plain lines. Messages go through `logging`;
`setup_logging` (called by the CLI) prints adalayers' INFO messages to stderr through tqdm.write,
so they never tear a bar; under torchrun each line names its rank and ranks > 0 show warnings only.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Iterable, Iterator

from tqdm.auto import tqdm


def bar(items: Iterable, total: int | None = None, desc: str = "") -> Iterator:
    from adalayers.engine import distributed

    if not distributed.is_main():
        return iter(items)
    # tqdm reads TQDM_MININTERVAL when it is imported; the CLI sets it later, for a log file (not a terminal)
    every = float(os.environ.get("TQDM_MININTERVAL", 0.1)) if not sys.stderr.isatty() else 0.1
    return iter(tqdm(items, total=total, desc=desc, leave=False, dynamic_ncols=True, mininterval=every))


class _TqdmHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


def setup_logging(level: int = logging.INFO) -> None:
    """adalayers' messages to stderr, one plain line each."""
    from adalayers.launch import launched

    root = logging.getLogger("adalayers")
    handler = next((h for h in root.handlers if isinstance(h, _TqdmHandler)), None)
    if handler is None:  # one handler a process; its prefix and level follow the process's rank at each call
        handler = _TqdmHandler()
        root.addHandler(handler)
    rank, main = 0, True
    if launched():  # under torchrun (torch is there): the process's rank; otherwise torch is never imported here
        from adalayers.engine import distributed

        rank, main = distributed.rank(), distributed.is_main()
    handler.setFormatter(logging.Formatter((f"[rank {rank}] " if launched() else "") + "%(message)s"))
    root.setLevel(level if main else logging.WARNING)
