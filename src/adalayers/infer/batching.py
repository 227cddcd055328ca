"""Rows of several generations in one batch: merge (a new request's prefill joins), step, leave.

A Batch holds, per row, the left-padded columns of its text so far: attention mask, the heads' mask
(`real`), every loaded head's accumulator F (B, T, k), the KV cache and the next-token logits. Rows of
different requests line up on the right (each row's last token in the last column); merging two
batches left-pads the shorter one (attention 0, heads' mask False, zero K/V and F), so every row keeps
exactly the states it has alone (positions come from cumsum(mask) - 1, backbone.positions). A row
leaves the batch when it ends; leading columns no row uses any more are dropped.

The KV cache is the runtime decoder's (adalayers.infer.runtime.Cache): rows are selected, two batches'
caches merged and leading columns trimmed through its select / merged / trimmed, so the same Batch serves
transformers' DynamicCache (adalayers.infer.torch_runtime.KVCache) and llama.cpp's sequences.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from adalayers.infer.runtime import Cache


@dataclass
class Row:
    """One prompt's generation inside a Batch."""
    owner: object                 # the request it belongs to (adalayers.infer.generate.Job)
    index: int                    # its prompt's index in that request
    prompt_ids: list[int]
    offsets: list[tuple[int, int]]  # character offsets of its prefill columns (padding: (0, 0))
    start: int                    # batch column of its first prefill column
    answer_from: int              # batch column of its first generated token
    generated: list[int] = field(default_factory=list)
    finish: str | None = None
    steps: dict = field(default_factory=dict)  # head -> per-token values (steps or guard)
    guard: dict | None = None     # the guard that ended it: {head, label, value, token} (token 0: the prompt)


@dataclass
class Batch:
    rows: list[Row]
    attn: torch.Tensor            # (B, T) long
    real: torch.Tensor            # (B, T) bool: the columns the heads read
    accs: dict                    # head name -> (B, T, k)
    cache: Cache                  # the runtime decoder's KV cache of these rows
    logits: torch.Tensor | None   # (B, V): the next token's logits (None only inside a step, rows ending)

    @property
    def width(self) -> int:
        return self.attn.shape[1]

    def merge(self, other: "Batch") -> "Batch":
        """Both batches' rows in one, the narrower left-padded to the wider."""
        width = max(self.width, other.width)
        a, b = self._padded(width), other._padded(width)
        cache = a.cache.merged(b.cache, width)
        return Batch(a.rows + b.rows, torch.cat([a.attn, b.attn]), torch.cat([a.real, b.real]),
                     {n: torch.cat([a.accs[n], b.accs[n]]) for n in a.accs}, cache, torch.cat([a.logits, b.logits]))

    def _padded(self, width: int) -> "Batch":
        pad = width - self.width
        if pad == 0:
            return self
        for row in self.rows:
            row.start += pad
            row.answer_from += pad
        return Batch(self.rows, F.pad(self.attn, (pad, 0)), F.pad(self.real, (pad, 0)),
                     {n: F.pad(v, (0, 0, pad, 0)) for n, v in self.accs.items()}, self.cache, self.logits)

    def keep(self, idx: list[int]) -> "Batch":
        """Only the rows at `idx`; then the leading columns none of them uses are dropped."""
        if idx == list(range(len(self.rows))):
            return self  # every row stays: nothing to copy, no column freed
        at = torch.tensor(idx, dtype=torch.long, device=self.attn.device)
        kept = Batch([self.rows[i] for i in idx], self.attn.index_select(0, at), self.real.index_select(0, at),
                     {n: v.index_select(0, at) for n, v in self.accs.items()}, self.cache.select(idx),
                     None if self.logits is None else self.logits.index_select(0, at))
        return kept._trimmed()

    def _trimmed(self) -> "Batch":
        if not self.rows:
            return self
        used = self.attn.bool().any(0).nonzero()
        cut = int(used[0]) if len(used) else 0
        if cut == 0:
            return self
        width = self.width - cut
        cache = self.cache.trimmed(width)
        for row in self.rows:
            if row.start < cut:  # its own prefill padding is dropped with the columns
                row.offsets = row.offsets[cut - row.start:]
                row.start = cut
            row.start -= cut
            row.answer_from -= cut
        return Batch(self.rows, self.attn[:, cut:], self.real[:, cut:], {n: v[:, cut:] for n, v in self.accs.items()},
                     cache, self.logits)

    def grow(self, live: torch.Tensor) -> None:
        """One more column: attended by every row, read by the heads where `live`."""
        self.attn = torch.cat([self.attn, torch.ones_like(self.attn[:, :1])], 1)
        self.real = torch.cat([self.real, live.unsqueeze(1)], 1)

    def answer_mask(self, rows: list[int] | None = None) -> torch.Tensor:
        """The heads' mask without the prompt columns (heads that read the answer alone)."""
        mask = self.real.clone()
        start = torch.tensor([r.answer_from for r in self.rows], device=mask.device)
        mask &= torch.arange(mask.shape[1], device=mask.device)[None, :] >= start[:, None]
        return mask if rows is None else mask[rows]
