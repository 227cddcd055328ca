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

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from adalayers.infer.request import Row  # noqa: F401  (a Batch's rows; imported from here too)
from adalayers.infer.runtime import Cache, until_cancelled
from adalayers.kinds import TaskKind
from adalayers.model.sidetask import read_all


@dataclass
class Batch:
    rows: list[Row]
    attn: torch.Tensor            # (B, T) long
    real: torch.Tensor            # (B, T) bool: the columns the heads read
    accs: dict                    # head name -> (B, T, k)
    cache: Cache                  # the runtime decoder's KV cache of these rows
    logits: np.ndarray | None     # (B, V) float32: the next token's logits (None only inside a step, rows ending)

    @property
    def width(self) -> int:
        return self.attn.shape[1]

    def merge(self, other: "Batch") -> "Batch":
        """Both batches' rows in one, the narrower left-padded to the wider."""
        width = max(self.width, other.width)
        a, b = self._padded(width), other._padded(width)
        cache = a.cache.merged(b.cache, width)
        return Batch(a.rows + b.rows, torch.cat([a.attn, b.attn]), torch.cat([a.real, b.real]),
                     {n: torch.cat([a.accs[n], b.accs[n]]) for n in a.accs}, cache, np.concatenate([a.logits, b.logits]))

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
                     None if self.logits is None else self.logits[idx])
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


class TorchPasses:
    """infer/generate.Passes on a torch runtime's decoder (transformers, llama.cpp through LlamaCppBackbone): the
    rows left-padded in one Batch, the heads' accumulators torch tensors, read by the torch heads."""

    def __init__(self, side, heads: list):
        self.side, self.heads = side, heads
        self.decoder = side.runtime.decoder()

    def prefill(self, wrapped: list[str], cancelled, between=None) -> tuple[Batch, list[tuple]]:
        # one forward: nothing runs between its parts (`between` is never called)
        side, tok = self.side, self.side.backbone.tokenizer
        enc = tok(wrapped, padding=True, truncation=True, max_length=side.max_length, return_tensors="pt",
                  return_offsets_mapping=tok.is_fast)
        ids, attn = enc["input_ids"].to(side.backbone.device), enc["attention_mask"].to(side.backbone.device)
        watch = (lambda tap: until_cancelled(tap, cancelled)) if self.decoder.interruptible else (lambda tap: tap)
        (logits, cache), accs = side.tapped(self.heads, lambda tap: self.decoder.prefill(ids, attn, watch(tap)))
        real = attn.bool()
        columns = [(ids[b][real[b]].tolist(), offsets(enc, b), 0, attn.shape[1]) for b in range(len(wrapped))]
        return Batch([], attn, real, accs, cache, _numpy(logits)), columns

    def decode(self, batch: Batch, nxt: np.ndarray, go_on: list[int], deepest: int | None,
               reads: list[tuple[list[str], list[int]]] = ()) -> np.ndarray | None:
        """Passes.decode; `reads` are done when asked (read), not during the pass."""
        device = batch.attn.device
        batch.grow(torch.ones(len(batch.rows), dtype=torch.bool, device=device))
        everyone = len(go_on) == len(batch.rows)
        step = torch.as_tensor(nxt, dtype=torch.long, device=device).unsqueeze(1)
        (logits, batch.cache), new = self.side.tapped(self.heads, lambda tap: self.decoder.step(
            step, batch.attn, batch.cache, tap, logits_for=None if everyone else go_on, stop_after=deepest))
        batch.accs = {n: torch.cat([batch.accs[n], v], 1) for n, v in new.items()}
        logits = _numpy(logits)
        batch.logits = logits if everyone else None
        return logits

    def read(self, batch: Batch, names: list[str], rows: list[int], answer_alone: bool) -> dict[str, list]:
        mask = batch.answer_mask(rows) if answer_alone else batch.real[rows]
        values = read_heads(self.side, names, [batch.accs[n][rows] for n in names], mask, answer_alone)
        return {n: list(v.numpy()) for n, v in values.items()}


def _numpy(logits: torch.Tensor | None) -> np.ndarray | None:
    return None if logits is None else logits.float().cpu().numpy()


def offsets(enc, b: int) -> list[tuple[int, int]] | None:
    """Row b's character offsets per (left-padded) column, when the tokenizer gives them."""
    return [tuple(o) for o in enc["offset_mapping"][b].tolist()] if "offset_mapping" in enc else None


@torch.no_grad()
def read_heads(side, names: list[str], accs: list[torch.Tensor], mask: torch.Tensor, only_answer: bool = False
               ) -> dict[str, torch.Tensor]:
    """Each head's values on its accumulator F under `mask` (one mask for all): class probabilities, or the
    value. Sequence heads of one shape run as one (adalayers.model.sidetask.read_all)."""
    tasks = [side.heads[n].task for n in names]
    outs = read_all(tasks, accs, mask, False if only_answer else None)
    return {n: (o.float().cpu() if t.kind == TaskKind.REGRESSION else torch.softmax(o.float().cpu(), -1))
            for n, t, o in zip(names, tasks, outs)}
