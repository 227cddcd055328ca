"""How progress reaches the user: tqdm bars on a terminal, plain lines in a redirected log.

`configure(verbose)` is called once by the CLI before a command runs:
- transformers' and huggingface_hub's own progress bars ("Loading weights", downloads) are switched
  off unless `verbose`; adalayers' bars (caching, epochs) stay. Without the CLI (SideTasks.load,
  Backbone.load) `quiet_loading` switches them off while a model loads.
- when stderr is not a terminal, a bar's redraws (carriage returns and cursor moves) become whole
  lines, at most one per PLAIN_INTERVAL_S seconds (and the bar's last state before other output),
  so a log file reads top to bottom; every other message passes unchanged.
`bar` is the one tqdm bar of adalayers' own work (rank 0 of a torchrun job only); `setup_logging` (called by the
CLI) prints adalayers' INFO messages to stderr through tqdm.write, so they never tear a bar; under torchrun each
line names its rank and ranks > 0 show warnings only. No torch here unless under torchrun.
"""
from __future__ import annotations

import io
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Iterable, Iterator

from tqdm.auto import tqdm

PLAIN_INTERVAL_S = 30.0
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_BAR = re.compile(r"\d+%\||\| *\d+/\S+ \[")  # tqdm's "NN%|" or "| n/total [" (what a bar redraw shows)


class PlainLines(io.TextIOBase):
    """A text stream that turns tqdm's carriage-return redraws into lines of their own, at most one bar
    line per `interval` seconds; a bar line held back is written before the next other output."""

    def __init__(self, stream, interval: float = PLAIN_INTERVAL_S):
        self.stream, self.interval = stream, interval
        self._open = False     # the last line written has no newline yet
        self._redraw = False   # a carriage return came: what follows would overwrite the line
        self._pending = None   # the latest bar line held back
        self._last = -float("inf")

    def _line(self, text: str) -> None:
        if self._open:
            self.stream.write("\n")
        self.stream.write(text)
        self._open = not text.endswith("\n")

    def _release(self) -> None:
        if self._pending is not None:
            self._line(self._pending)
            self._pending = None

    def write(self, s: str) -> int:
        for i, part in enumerate(_ANSI.sub("", s).split("\r")):
            if i > 0:
                self._redraw = True
            if not part:
                continue
            if self._redraw and not part.strip():
                if part.endswith("\n"):
                    self._release()
                    if self._open:
                        self.stream.write("\n")
                        self._open = False
                continue  # a bar wiping itself, or nothing
            if self._redraw:
                self._redraw, text = False, part.strip(" ")
                if _BAR.search(text):
                    now = time.monotonic()
                    if now - self._last >= self.interval:
                        self._pending, self._last = None, now
                        self._line(text)
                    else:
                        self._pending = text
                    continue
                self._release()
                self._line(text)
                continue
            self._release()
            self.stream.write(part)
            self._open = not part.endswith("\n")
        return len(s)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", "utf-8")


def _hf_progress(on: bool) -> bool:
    """Switch transformers' and huggingface_hub's progress bars on or off; returns whether they were on.
    transformers is not imported for it (1.2 s and 34 MB, in every command, the torch-free serving path's too):
    where it is not imported yet, it takes huggingface_hub's setting when it is."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    hub_on = not are_progress_bars_disabled()
    (enable_progress_bars if on else disable_progress_bars)()
    if sys.modules.get("transformers") is None:
        return hub_on
    from transformers.utils import logging as hf_logging
    was_on = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if on else hf_logging.disable_progress_bar)()
    return was_on and hub_on


_VERBOSE = False  # the CLI's --verbose: transformers' own bars stay on while models load


@contextmanager
def quiet_loading():
    """transformers' and huggingface_hub's bars ("Loading weights") off while a model loads, for the Python
    API as for the CLI (unless the CLI was given --verbose); as they were afterwards."""
    if _VERBOSE:
        yield
        return
    was_on = _hf_progress(False)
    try:
        yield
    finally:
        _hf_progress(was_on)


def configure(verbose: bool = False) -> Callable[[], None]:
    """Set up progress output for one command; returns a function that undoes it (for in-process callers)."""
    global _VERBOSE
    hf_was_on, verbose_was = _hf_progress(verbose), _VERBOSE
    _VERBOSE = verbose
    stderr, interval = sys.stderr, os.environ.get("TQDM_MININTERVAL")
    if not sys.stderr.isatty() and not isinstance(sys.stderr, PlainLines):
        sys.stderr = PlainLines(sys.stderr)
        # bars created with it in mind (engine.progress) redraw no more often than their lines are kept
        os.environ.setdefault("TQDM_MININTERVAL", str(PLAIN_INTERVAL_S))

    def restore() -> None:
        global _VERBOSE
        _VERBOSE = verbose_was
        _hf_progress(hf_was_on)
        if isinstance(sys.stderr, PlainLines) and sys.stderr.stream is stderr:
            sys.stderr = stderr
        if interval is None:
            os.environ.pop("TQDM_MININTERVAL", None)
        else:
            os.environ["TQDM_MININTERVAL"] = interval

    return restore


def bar(items: Iterable, total: int | None = None, desc: str = "") -> Iterator:
    from adalayers.launch import rank

    if rank() != 0:  # under torchrun: rank 0's bar only
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
    from adalayers.launch import launched, rank

    root = logging.getLogger("adalayers")
    handler = next((h for h in root.handlers if isinstance(h, _TqdmHandler)), None)
    if handler is None:  # one handler a process; its prefix and level follow the process's rank at each call
        handler = _TqdmHandler()
        root.addHandler(handler)
    handler.setFormatter(logging.Formatter((f"[rank {rank()}] " if launched() else "") + "%(message)s"))
    root.setLevel(level if rank() == 0 else logging.WARNING)
