"""How progress reaches the user: tqdm bars on a terminal, plain lines in a redirected log.

`configure(verbose)` is called once by the CLI before a command runs:
- transformers' and huggingface_hub's own progress bars ("Loading weights", downloads) are switched
  off unless `verbose`; adalayers' bars (caching, epochs) stay.
- when stderr is not a terminal, a bar's redraws (carriage returns and cursor moves) become whole
  lines, one per `TQDM_MININTERVAL` seconds (default here: 30) per bar, so a log file reads top to bottom.
"""
from __future__ import annotations

import io
import os
import re
import sys
from collections.abc import Callable

PLAIN_INTERVAL_S = "30"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class PlainLines(io.TextIOBase):
    """A text stream that turns every carriage-return redraw written to it into a line of its own."""

    def __init__(self, stream):
        self.stream = stream
        self._open = False    # the last line written has no newline yet
        self._redraw = False  # a carriage return came: what follows would overwrite the line

    def write(self, s: str) -> int:
        for i, part in enumerate(_ANSI.sub("", s).split("\r")):
            if i > 0:
                self._redraw = True
            if not part:
                continue
            if self._redraw and not part.strip():
                if part.endswith("\n") and self._open:
                    self.stream.write("\n")
                    self._open = False
                continue  # a bar wiping itself, or nothing
            if self._redraw:
                if self._open:
                    self.stream.write("\n")
                part, self._redraw = part.strip(" "), False
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
    """Switch transformers' and huggingface_hub's progress bars on or off; returns whether they were on."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hub_on = not are_progress_bars_disabled()
    (hf_logging.enable_progress_bar if on else hf_logging.disable_progress_bar)()
    (enable_progress_bars if on else disable_progress_bars)()
    return was_on and hub_on


def configure(verbose: bool = False) -> Callable[[], None]:
    """Set up progress output for one command; returns a function that undoes it (for in-process callers)."""
    hf_was_on = _hf_progress(verbose)
    stderr, interval = sys.stderr, os.environ.get("TQDM_MININTERVAL")
    if not sys.stderr.isatty() and not isinstance(sys.stderr, PlainLines):
        os.environ.setdefault("TQDM_MININTERVAL", PLAIN_INTERVAL_S)
        sys.stderr = PlainLines(sys.stderr)

    def restore() -> None:
        _hf_progress(hf_was_on)
        if isinstance(sys.stderr, PlainLines) and sys.stderr.stream is stderr:
            sys.stderr = stderr
        if interval is None:
            os.environ.pop("TQDM_MININTERVAL", None)
        else:
            os.environ["TQDM_MININTERVAL"] = interval

    return restore
