"""Per-step reads of sequence heads during decoding, incremental and exact (the numpy heads, no torch).

A sequence head read after every generated token (a guard, a per-step value) would otherwise re-run its whole
head over the whole text so far each step (numpy_heads.read_all): every position's q/k/v, every query against
every key, every position's out-projection, a cost growing with the square of the length. Once a position's F is
complete it never changes while decoding, so per sequence and per group of heads of one shape this keeps

    q, k, v of the positions seen;  per query i and attention head h the online-softmax state: the running max
    m_ih, the sum l_ih = sum_j exp(s_ijh - m_ih) and A_ih = sum_j exp(s_ijh - m_ih) v_jh

and a step costs, for its new positions: their q/k/v (one product for every sequence of the step), their keys
against every cached query (the old queries' states updated), the new queries against every key (both one
compiled call a sequence, infer/online_softmax.py), then the attention output A_ih / l_ih of every sequence's
positions side by side (features by positions, as the caches hold them: no transpose; infer/read_kernel.py),
their out-projection (one stacked product for all the step's sequences), GELU and each head's pooling (one
compiled call), the output layers: O(T k) elementwise and the O(T k^2) of one BLAS product a step,
instead of the full read's O(T^2 k + T k^2) (every position's q/k/v, every score, every out-projection).
Folding W_o into the values (B_ih = sum_j exp(s_ijh - m_ih) W_o[:, h] v_jh, no out-projection a step) was
measured slower here: its state is nh times larger (nh k a query, not k) and its per-step update, elementwise
over all of it, cost more than the one product it saves (1.2 ms against 0.6 ms a step at batch 1, T 136, k 64,
nh 8, three heads).
The compiled calls split their work among the calling thread's numba threads (infer/kernel_threads.py: after a
decode, llama.cpp's idle OpenMP team), each piece computed alike whatever thread takes it, so the values are the
same on any number of threads, and the full read's (SequenceHead, Task.read) up to float32 rounding
(tests/test_numpy_incremental.py).

Probes (head.type probe: pool(F) -> linear) keep their pooled row per sequence instead: the running sum and count
(mean, summed in float64), the running max, the first or the last seen row; a step costs O(k) a new position and
one (C, k) product. Read fully they cost a copy of every row's whole F (d wide) each step.

The positions kept are the ones the head sees: a sequence's real tokens (the rows LayerMix hands), less its first
with skip_bos, with the sinusoidal positions counted over them; padding is a batch's layout, not a sequence's,
so it never enters a cache. Where this does not apply, read with the full read (numpy_heads.read_all):
    - token heads and token probes (an answer per token, their encoder layers over every position): applies()
      is False;
    - a text that changes other than by appending (an edit, a truncation, a regenerated turn): drop() the
      sequence and give its rows again;
    - a sequence that has no token the head sees yet (only its BOS, with skip_bos): read by the full read of its
      own rows, until its first seen token arrives.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Hashable

import numpy as np

from adalayers.infer import online_softmax, read_kernel
from adalayers.infer.numpy_heads import (ProbeHead, Scratch, SequenceHead, Task, ensemble_answer, gelu,
                                        linear_output, PositionTable, read_all)


@dataclass
class _Cache:
    """One sequence's state for one group of H heads (nh attention heads of width dh, k features); q, kk, v and
    a hold each feature's values over the positions side by side (online_softmax's layout)."""
    q: np.ndarray   # (H, nh, dh, cap), already scaled by dh^-1/2
    kk: np.ndarray  # (H, nh, dh, cap)
    v: np.ndarray   # (H, nh, dh, cap)
    m: np.ndarray   # (H, nh, cap), float64
    l: np.ndarray   # (H, nh, cap), float64
    a: np.ndarray   # (H, nh, dh, cap)
    n: int = 0      # positions seen

    @classmethod
    def empty(cls, h: int, nh: int, dh: int, k: int) -> "_Cache":
        z = np.zeros
        return cls(z((h, nh, dh, 0), np.float32), z((h, nh, dh, 0), np.float32), z((h, nh, dh, 0), np.float32),
                   z((h, nh, 0), np.float64), z((h, nh, 0), np.float64), z((h, nh, dh, 0), np.float32))

    def reserve(self, n: int) -> None:
        """Room for n positions (capacity doubled, so appending costs O(1) amortised)."""
        cap = self.m.shape[2]
        if n <= cap:
            return
        new = max(n, 2 * cap, 16)
        for name in ("q", "kk", "v", "m", "l", "a"):
            a = getattr(self, name)
            grown = np.zeros((*a.shape[:-1], new), a.dtype)
            grown[..., :cap] = a
            setattr(self, name, grown)


class _Group:
    """Heads of one shape and one reading of F, read as one (numpy_heads.sequence_heads' stacking)."""

    def __init__(self, leaves: list[int], heads: list[SequenceHead], skip_bos: bool, positional: bool,
                 gelu_after_sum: bool):
        self.leaves, self.heads = leaves, heads  # leaf indices, in the order of heads
        self.skip_bos, self.positional, self.gelu_after_sum = skip_bos, positional, gelu_after_sum
        h0 = heads[0]
        self.k, self.nh = h0.in_w.shape[1], h0.num_heads
        self.dh = self.k // self.nh
        self.w_in = np.stack([h.in_w.T for h in self.heads]).astype(np.float32)           # (H, k, 3k)
        self.b_in = np.stack([h.in_b for h in self.heads]).astype(np.float32)[:, None]     # (H, 1, 3k)
        self.scale = np.float32(self.dh ** -0.5)                                             # q's
        self.w_o = np.stack([h.out_proj_w for h in self.heads]).astype(np.float32)            # (H, k out, k in)
        self.b_o = np.stack([h.out_proj_b for h in self.heads]).astype(np.float32)           # (H, k)
        self.pooling = np.array([read_kernel.POOLINGS[h.pooling] for h in self.heads], np.int64)
        self.positions = PositionTable(self.k)                                                # positional F's
        self._scratch = Scratch(2)                                                            # read()'s arrays

    def empty(self) -> _Cache:
        return _Cache.empty(len(self.heads), self.nh, self.dh, self.k)

    def add(self, caches: list[tuple[_Cache, np.ndarray]], f: np.ndarray) -> None:
        """New seen positions' features f (H, N, k) of several sequences: (cache, its rows of f, int64) each. One
        stacked product projects them all (q, k, v: (H, N, 3k)), then each sequence's cache takes its rows
        (online_softmax.extend, compiled: one call a sequence)."""
        qkv = np.matmul(f, self.w_in)
        qkv += self.b_in
        for c, sel in caches:
            t = c.n
            c.reserve(t + len(sel))
            online_softmax.extend(qkv, sel, self.scale, c.q, c.kk, c.v, c.m, c.l, c.a, t)
            c.n = t + len(sel)

    def read(self, caches: list[_Cache]) -> list[np.ndarray]:
        """Each head's output for each sequence on its positions so far: the attention heads' A_ih / l_ih of every
        sequence side by side, features by positions (read_kernel.normalise, a call a sequence), the
        out-projection (one stacked product for all of them), GELU and each head's pooling (read_kernel.pool,
        one call), then per head one output layer for all the sequences. -> per head, (sequences, ...)."""
        ends = np.cumsum([0] + [c.n for c in caches])
        att, y = (self._scratch.get(j, (len(self.heads), self.k, int(ends[-1]))) for j in range(2))
        for c, at in zip(caches, ends):
            read_kernel.normalise(c.a, c.l, c.n, att, at)
        np.matmul(self.w_o, att, out=y)
        pooled = np.empty((len(caches), len(self.heads), self.k), np.float32)
        read_kernel.pool(y, self.b_o, ends, self.pooling, pooled)
        return [head.output(pooled[:, j]) for j, head in enumerate(self.heads)]             # (sequences, C) each


@dataclass
class _Pooled:
    """One sequence's pooled row for one group of H probes: the running sum (mean), max, first or last row."""
    value: np.ndarray  # (H, k)
    n: int = 0         # positions seen


class _ProbeGroup:
    """Probes of one pooling, width and reading of F: the pooled row kept per sequence (numpy_heads.pool's
    pooling over the seen positions, updated by the new ones), then each probe's linear output."""

    def __init__(self, leaves: list[int], heads: list[ProbeHead], skip_bos: bool, positional: bool,
                 gelu_after_sum: bool):
        self.leaves, self.heads = leaves, heads
        self.skip_bos, self.positional, self.gelu_after_sum = skip_bos, positional, gelu_after_sum
        self.pooling, self.k = heads[0].pooling, heads[0].out_w.shape[1]
        self.positions = PositionTable(self.k)

    def empty(self) -> _Pooled:
        return _Pooled(np.zeros((len(self.heads), self.k), np.float64 if self.pooling == "mean" else np.float32))

    def add(self, caches: list[tuple[_Pooled, np.ndarray]], f: np.ndarray) -> None:
        for c, sel in caches:
            new = f[:, sel]                                                            # (H, n, k)
            if self.pooling == "max":
                c.value = new.max(1) if c.n == 0 else np.maximum(c.value, new.max(1))
            elif self.pooling == "first":
                c.value = new[:, 0] if c.n == 0 else c.value
            elif self.pooling == "last":
                c.value = new[:, -1]
            else:
                c.value += new.sum(1, dtype=np.float64)
            c.n += new.shape[1]

    def read(self, caches: list[_Pooled]) -> list[np.ndarray]:
        """Per probe, its outputs for the sequences (sequences, ...)."""
        pooled = np.stack([(c.value / c.n).astype(np.float32) if self.pooling == "mean" else c.value for c in caches])
        return [linear_output(pooled[:, j], h.out_w, h.out_b, h.scale) for j, h in enumerate(self.heads)]


class IncrementalReads:
    """Sequence-head reads kept per sequence while it decodes (continuous batching: sequences join and leave).

        reads = IncrementalReads(tasks)          # tasks with applies(t); the others: numpy_heads.read_all
        outs = reads.step(seqs, accs, counts)    # new rows per sequence (prefill: its prompt; a step: 1),
                                                 # accs as LayerMix.take() gives them; a new id starts a cache
        reads.drop(seq)                          # the sequence ended (or its text changed: give it again)

    outs[j]: task j's answer for each of `seqs`, in their order, as read_all's on the whole text so far.
    """

    def __init__(self, tasks: list[Task], skip_bos: bool | None = None):
        for t in tasks:
            if not self.applies(t):
                raise ValueError(f"incremental reads: task {t.kind!r} is no sequence head or probe (use read_all)")
        self.tasks, self.skip_bos = tasks, skip_bos
        self.leaves = [m for t in tasks for m in (t.members or [t])]
        groups: dict[tuple, list[int]] = {}
        for j, leaf in enumerate(self.leaves):
            sb = leaf.skip_bos if skip_bos is None else skip_bos
            shape = (("probe", leaf.head.pooling, leaf.head.out_w.shape[1]) if isinstance(leaf.head, ProbeHead)
                     else leaf.head.shape_key())
            groups.setdefault((shape, sb, leaf.positional, leaf.gelu_after_sum), []).append(j)
        self.groups = [(_ProbeGroup if key[0][0] == "probe" else _Group)(
            js, [self.leaves[j].head for j in js], key[1], key[2], key[3]) for key, js in groups.items()]
        self._caches: dict[Hashable, list[_Cache | _Pooled]] = {}
        self._rows: dict[Hashable, int] = {}                  # real rows given so far, per sequence
        self._unseen: dict[Hashable, list[np.ndarray]] = {}   # a sequence's rows while it has no seen token

    @staticmethod
    def applies(task: Task) -> bool:
        """Sequence and regression heads, sequence probes, and seed ensembles of them."""
        return all(isinstance(m.head, (SequenceHead, ProbeHead)) for m in (task.members or [task]))

    @property
    def sequences(self) -> list[Hashable]:
        return list(self._caches)

    def drop(self, seq: Hashable) -> None:
        self._caches.pop(seq, None)
        self._rows.pop(seq, None)
        self._unseen.pop(seq, None)

    def _leaf_rows(self, accs: list[np.ndarray]) -> list[np.ndarray]:
        out = []
        for t, acc in zip(self.tasks, accs):
            if t.members:
                k = t.members[0].k
                out.extend(acc[..., m * k:(m + 1) * k] for m in range(len(t.members)))
            else:
                out.append(acc)
        return out

    def step(self, seqs: list[Hashable], accs: list[np.ndarray], counts: list[int]) -> list[np.ndarray]:
        """Append counts[b] rows to sequence seqs[b] (accs[j]: (sum(counts), k), task j's, sequences in order),
        then read every task for every one of seqs."""
        if len(seqs) != len(counts) or len(set(seqs)) != len(seqs):
            raise ValueError("incremental reads: one count per sequence, each sequence once per step")
        leaf_rows = self._leaf_rows(accs)
        starts = [0, *itertools.accumulate(counts)]
        for seq in seqs:
            if seq not in self._caches:
                self._caches[seq] = [g.empty() for g in self.groups]
                self._rows[seq] = 0
        for gi, g in enumerate(self.groups):
            self._extend_group(gi, g, seqs, starts, leaf_rows)
        unseen = []  # sequences some group has seen no token of yet: read by the full read of their own rows
        for b, seq in enumerate(seqs):
            if any(c.n == 0 for c in self._caches[seq]):  # kept for the full read until every group sees a token
                self._unseen.setdefault(seq, []).extend(
                    np.stack([r[starts[b]:starts[b + 1]] for r in leaf_rows], 1))
                unseen.append(b)
            else:
                self._unseen.pop(seq, None)
            self._rows[seq] += counts[b]
        full = {b: self._full_read(seqs[b]) for b in unseen}
        leaf_out: list = [None] * len(self.leaves)
        for gi, g in enumerate(self.groups):
            seen = [b for b, seq in enumerate(seqs) if self._caches[seq][gi].n]
            ys = g.read([self._caches[seqs[b]][gi] for b in seen]) if seen else [[]] * len(g.leaves)
            for j, y in zip(g.leaves, ys):
                if len(seen) == len(seqs):
                    leaf_out[j] = y
                else:  # the others from their full read
                    rows = dict(zip(seen, y))
                    leaf_out[j] = np.stack([rows[b] if b in rows else full[b][j] for b in range(len(seqs))])
        return self._answers(leaf_out)

    def _extend_group(self, gi: int, g: _Group | _ProbeGroup, seqs: list, starts: list[int],
                      leaf_rows: list[np.ndarray]) -> None:
        """The group's new seen rows of every sequence, their features, then each sequence's cache (g.add)."""
        acc = np.stack([leaf_rows[j] for j in g.leaves])                          # (H, N, k)
        rows = np.arange(acc.shape[1])
        pos = np.zeros(acc.shape[1], np.int64)  # a seen row's position among its sequence's seen rows
        caches = []
        for b, seq in enumerate(seqs):
            lo, hi = starts[b], starts[b + 1]
            if g.skip_bos and self._rows[seq] == 0:
                lo = min(lo + 1, hi)  # the sequence's first real token is not seen
            if hi > lo:
                c = self._caches[seq][gi]
                pos[lo:hi] = np.arange(c.n, c.n + hi - lo) if hi - lo > 1 else c.n
                caches.append((c, rows[lo:hi]))
        f = gelu(acc) if g.gelu_after_sum else acc
        if g.positional:
            f = f + g.positions(pos)
        g.add(caches, f.astype(np.float32, copy=False))

    def _full_read(self, seq: Hashable) -> list[np.ndarray]:
        """A sequence without a seen token: the full read of its own rows (numpy_heads.read_all, batch of one)."""
        rows = np.stack(self._unseen[seq])                                         # (n, leaves, k)
        mask = np.ones((1, len(rows)), bool)
        return [y[0] for y in read_all(self.leaves, [rows[None, :, j] for j in range(len(self.leaves))], mask,
                                       self.skip_bos)]

    def _answers(self, leaf_out: list[np.ndarray]) -> list[np.ndarray]:
        out, j = [], 0
        for t in self.tasks:
            m = len(t.members) or 1
            out.append(leaf_out[j] if not t.members else ensemble_answer(t, leaf_out[j:j + m]))
            j += m
        return out
