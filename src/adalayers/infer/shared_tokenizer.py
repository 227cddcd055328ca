"""One tokenizer, many threads: every call on it holds one lock.

A Hugging Face fast tokenizer is not safe to share across threads. Each call sets the Rust tokenizer's
truncation and padding (set_truncation_and_padding: enable_truncation / no_truncation, enable_padding)
and then encodes with whatever is set at that moment. The service calls one tokenizer from several
threads at once: the token count of a new request (count_tokens, in a worker thread: no truncation),
the prediction pass (the batcher's thread: truncation at max_length), a chat prompt's length check (the
event loop) and generation. Interleaved, a pass could encode a text untruncated because a count had
just switched truncation off (issue 56: "The size of tensor a (669) must match the size of tensor b
(512)", a 500 under load), and a count could come out truncated and let a request past --max-tokens;
a concurrent call can also fail with "Already borrowed" from the Rust side.

shared(tokenizer) wraps it so that every method call (and the call itself) runs under one reentrant
lock; attributes read and write through. Encoding runs in Rust and is quick next to a base pass, so the
lock costs little; Predictor wraps its base's tokenizer once (the same object the other parts read).
"""
from __future__ import annotations

import functools
import inspect
import threading


class SharedTokenizer:
    """A tokenizer whose calls are serialized by one lock (see the module's docstring)."""

    def __init__(self, tokenizer):
        object.__setattr__(self, "_tokenizer", tokenizer)
        object.__setattr__(self, "_lock", threading.RLock())

    @property
    def __class__(self):  # isinstance(tok, PreTrainedTokenizerBase) still holds, for library code that checks
        return type(self._tokenizer)

    @property
    def lock(self) -> threading.RLock:
        """The lock every call holds (hold it to run several calls as one)."""
        return self._lock

    @property
    def unwrapped(self):
        """The tokenizer itself (its calls unguarded)."""
        return self._tokenizer

    def __call__(self, *args, **kwargs):
        with self._lock:
            return self._tokenizer(*args, **kwargs)

    def __getattr__(self, name):
        value = getattr(self._tokenizer, name)
        if not inspect.ismethod(value):
            return value

        @functools.wraps(value)
        def locked(*args, **kwargs):
            with self._lock:
                return value(*args, **kwargs)
        return locked

    def __setattr__(self, name, value):
        setattr(self._tokenizer, name, value)

    def __len__(self):
        return len(self._tokenizer)

    def __repr__(self):
        return f"shared({self._tokenizer!r})"

    def __reduce__(self):  # pickled (Ray) as the tokenizer, wrapped again where it is unpickled
        return shared, (self._tokenizer,)


def shared(tokenizer):
    """`tokenizer` wrapped in a SharedTokenizer (once: a shared one is returned as it is; None stays None)."""
    if tokenizer is None or type(tokenizer) is SharedTokenizer:
        return tokenizer
    return SharedTokenizer(tokenizer)
