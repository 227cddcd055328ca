"""The base pass behind every inference door: one small interface, one class per engine.

    runtime.forward(batch, heads, stop)   -> (the base's own output or None, [each head's logits])
    runtime.own_output()                  -> what that own output is: "embedding", "next_token", or a
                                             classifier's ("classes" / "tokens", its labels)
    runtime.rows_per_pass(max_length, n)  -> how many rows of max_length tokens one pass takes (at most n)
    runtime.decoder()                     -> prefill and decode steps for generation (Decoder), or a ModelError
    runtime.generation_room(max_length)   -> (rows, KV tokens) generation may hold at once beside the passes,
                                             or None (no fixed room: transformers' cache grows in memory)
    runtime.prefill_tokens()              -> prompt tokens one prefill may hold at most (llama.cpp: its n_batch),
                                             or None (no limit)
    runtime.usage()                       -> what a fixed-size runtime holds now, for /health ({} by default)
    runtime.base                          -> what the doors read of the base: name, tokenizer, fingerprint(),
                                             num_layers, hidden_size, device, is_causal

The Predictor (adalayers.infer.predictor) turns texts into rows and rows back into answers; only the pass
differs between engines:

    TappedRuntime   any base called as base(batch, taps, stop_after) whose taps get Z_i per layer: the
                    transformers Backbone (TorchRuntime, adalayers.infer.torch_runtime) and llama.cpp
                    (LlamaCppBackbone, adalayers.infer.llamacpp_backbone, fed by its eval callback)
    OnnxRuntime     one exported graph (base + every head) run by ONNX Runtime (adalayers.infer.onnx)

A new engine is one module with one Runtime subclass and one line in adalayers.runtimes naming its loader
(adalayers.infer.loaders holds the built-in ones).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Protocol, Sequence

import torch

from adalayers.errors import Cancelled, ModelError
from adalayers.infer.heads import Head
from adalayers.model.sidetask import end_all, shared_tap


class Base(Protocol):
    """What the inference doors read of a base."""
    name: str
    num_layers: int
    hidden_size: int
    device: torch.device
    is_causal: bool

    @property
    def tokenizer(self): ...

    def fingerprint(self) -> str: ...


class Cache(Protocol):
    """A decoder's KV cache of a batch's rows (left-padded columns), as adalayers.infer.batching reshapes it."""

    def select(self, idx: list[int]) -> "Cache":
        """Only the rows at idx, in that order (the others' entries are freed)."""

    def merged(self, other: "Cache", width: int) -> "Cache":
        """This cache's rows, then other's, both left-padded to `width` columns."""

    def trimmed(self, width: int) -> "Cache":
        """Only the last `width` columns (leading columns no row uses any more)."""


class Decoder(Protocol):
    """Prefill and decode steps of a decoder LLM, every layer tapped (generation: adalayers.infer.generate).

        logits, cache = decoder.prefill(ids, attn, tap)              # (B, T) left-padded -> logits (B, vocab)
        logits, cache = decoder.step(nxt[:, None], attn, cache, tap) # one token per row, attn grown by a column
        logits, cache = decoder.step(..., logits_for=[0, 2])         # the LM head on rows 0 and 2 only: (2, vocab)
        None, cache = decoder.step(..., logits_for=[], stop_after=i) # no LM head, the pass may end after state i

    logits_for=[] is the step that only feeds the heads (the last generated tokens, read once more): every
    row ends with it, so the cache it returns is only dropped (layers after stop_after never saw the token).

    interruptible: the tap may raise between layers (adalayers.errors.Cancelled) to end a prefill nobody waits
    for; the exception leaves the call and nothing of the pass is kept. False where the tap runs inside a
    foreign callback (llama.cpp's), where an exception cannot stop the engine.
    """

    interruptible: bool

    def eos_ids(self) -> set[int]: ...

    def prefill(self, input_ids: torch.Tensor, attention: torch.Tensor, tap) -> tuple[torch.Tensor, Cache]: ...

    def step(self, input_ids: torch.Tensor, attention: torch.Tensor, cache: Cache, tap,
             logits_for: list[int] | None = None, stop_after: int | None = None
             ) -> tuple[torch.Tensor | None, Cache]: ...


class Runtime(ABC):
    """The base pass (see the module doc)."""

    has_own_output: bool = True  # forward gives the base's own output (a graph exported --no-primary does not)

    @property
    @abstractmethod
    def base(self) -> Base: ...

    # forward's `cancelled` can end a pass between two layers (an exception from a tap leaves the base's forward)
    interruptible: bool = False

    @abstractmethod
    def forward(self, batch: dict, heads: Sequence[Head], stop: int | None,
                cancelled: Callable[[], bool] | None = None) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
        """One pass over a collated batch: (the base's own output, None when `stop` ends the base after that
        layer; each head's logits, float on the CPU, in the order of `heads`). `cancelled()`: True once nobody
        waits for this pass; an interruptible runtime then raises Cancelled between two layers, the others run
        the pass to its end."""

    def own_output(self) -> tuple[str, list[str]]:
        """What forward's own output is: ("embedding", []), ("next_token", []), or a classifier base's
        ("classes", labels) / ("tokens", labels)."""
        return ("next_token", []) if self.base.is_causal else ("embedding", [])

    def rows_per_pass(self, max_length: int, wanted: int) -> int:
        """At most `wanted` rows of up to max_length tokens that one pass takes."""
        return wanted

    def decoder(self) -> Decoder:
        """Prefill and decode steps (generation); a base that cannot generate is refused."""
        raise ModelError(f"{self.base.name} is not a decoder LLM with an LM head: it cannot generate")

    def generation_room(self, max_length: int) -> tuple[int, int] | None:
        """(rows, KV tokens) that running generations may hold at once while passes over texts of up to
        max_length tokens run beside them; None: no fixed room."""
        return None

    def prefill_tokens(self) -> int | None:
        """Prompt tokens (all rows together) that one prefill may hold at most; None: no limit."""
        return None

    def usage(self) -> dict:
        """What the runtime holds now (e.g. free llama.cpp sequences), for /health; {} when nothing fixed."""
        return {}

    @property
    def continuous_batching(self) -> bool:
        """Whether serve's scheduler can merge and split this runtime's KV caches between steps."""
        return False


# a pass of at most this many token positions holds its states and runs the heads' projections for every
# layer at once after the base (FusedTap's defer): at a batch of 1 x 32 tokens that is several points of the
# base's time cheaper than a few small calls per layer (benchmarks/one_pass.py, docs/export.md)
SMALL_PASS = 64


class TappedRuntime(Runtime):
    """A base called as base(batch, taps=[...], stop_after=L) that hands every layer's Z_i to the taps and
    returns a BaseOutput (logits, pooled): every task's accumulator is fed by one shared tap; then the heads'
    end(), sequence heads of one shape batched (end_all)."""

    def __init__(self, base):
        self._base = base

    @property
    def base(self):
        return self._base

    def forward(self, batch, heads, stop, cancelled=None):
        tasks = [h.task for h in heads]
        for t in tasks:
            t.begin()
        tap = shared_tap(tasks, defer=SMALL_PASS)
        watched = until_cancelled(tap, cancelled) if cancelled is not None and self.interruptible else tap
        out = self.base(batch, taps=[watched], stop_after=stop)
        tap.flush()
        logits = [y.float().cpu() for y in end_all(tasks, batch["attention_mask"])]
        own = None if stop is not None else (out.logits if out.logits is not None else out.pooled)
        return own, logits


def until_cancelled(tap, cancelled: Callable[[], bool]):
    """`tap` (or None) behind a check before every layer: once cancelled() (every request of the pass cancelled:
    its client gone, its deadline passed) the pass ends there (Cancelled), so a long pass nobody waits for does
    not hold the base. For an interruptible runtime's taps only (see Decoder.interruptible)."""
    def watched(i: int, z: torch.Tensor) -> None:
        if cancelled():
            raise Cancelled(f"the pass stopped at state {i}: every request in it was cancelled")
        if tap is not None:
            tap(i, z)
    return watched
