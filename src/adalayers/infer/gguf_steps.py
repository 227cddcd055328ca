"""Generation's passes on llama.cpp without torch: each row one llama.cpp sequence, the heads in numpy.

infer/generate.Generation runs one loop for every runtime; this module is what a pass is on the torch-free
serving path (adalayers.infer.gguf_serving):

    prefill   the prompts' tokens as llama.cpp sequences from position 0 (rows in groups of one llama_decode),
              the heads' accumulators F fed by the eval callback (layer_mix.LayerMix); the rows already
              generating may step between two of its llama_decodes (`between`: serve's scheduler)
    decode    one token per row appended to its sequence; a step of at most GATHER_TOKENS rows has its states
              copied by the compiled gather (no Python inside llama.cpp's graph) and mixed for every layer at
              once (LayerMix.add_layers: one compiled call per head group), the step's compiled kernels on
              llama.cpp's own threads, idle once its decode has returned (LlamaCpp.decode sets it); or, where
              llama.cpp leaves a core free (LlamaCpp.beside), mixed on a thread beside the decode once the
              deepest state read is copied, while llama.cpp computes the rest, the step's sequence-head reads
              done there too (the kernels on that one thread)
              heads not read at a step (a head asked for at the end, a token head) are mixed later, many steps'
              rows in one product (LATER_ROWS: their states kept on the batch until then, or until a read)
    read      sequence heads and sequence probes incrementally (numpy_incremental.IncrementalReads: a row's
              positions are fed once, when first read, and each read costs the new positions only); token heads,
              token probes and heads that read the answer alone by the full read (numpy_heads.read_all) over the
              row's F so far

A row's sequence positions are its own (no padding, no columns): a row's prompt starts at position 0 and its
answer right after it. A batch's sequences are given back when rows leave (keep) or the batch is dropped.
"""
from __future__ import annotations

import itertools
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from adalayers.errors import ModelError
from adalayers.infer.heads import used_layers
from adalayers.infer.llamacpp import GATHER_TOKENS, Row as SeqRow, Sequences
from adalayers.infer.layer_mix import LayerMix
from adalayers.infer.numpy_heads import probabilities, read_all
from adalayers.infer.numpy_incremental import IncrementalReads
from adalayers.infer.request import Row

# Positions whose outputs one llama_decode asks for at most. A pass whose heads read the final state asks for every
# position's output (llama.cpp computes its last layer only for those), and llama.cpp keeps room for each asked
# output's logits (Gemma 3: 1 MB a position, kept once reserved): such passes are cut into decodes of this many.
OUTPUTS_AT_ONCE = 64
# Decode-step rows whose states are kept for the heads not read at those steps before they are mixed in one
# product: a step of 1-8 rows reads each head's whole W_i for a few rows' worth of work; 64 rows read it once.
LATER_ROWS = 64


def decode_rows(engine, rows: list[SeqRow], mix, layers: list[int], stop: int | None,
                between: Callable[[int], None] | None = None) -> tuple[np.ndarray | None, list[np.ndarray]]:
    """The rows (each a llama.cpp sequence from its start) in as many llama_decodes as their tokens need: at most
    n_batch tokens each, OUTPUTS_AT_ONCE when the final state is read; a longer row is cut into pieces at its
    successive positions (only the piece that ends a row asks for its logits: LlamaCpp.run's logits_of). `mix`
    (LayerMix-like: begin(n), add(i, z), take(); None: no state read) is fed per decode (on the engine's side
    thread where llama.cpp leaves a core free, LlamaCpp.beside: the states mixed while llama.cpp computes the next
    layers). between(n): called after each decode but the last with its n tokens, the engine and `mix` free
    (serve's scheduler steps the rows already generating there). -> each row's next-token logits (None when the
    pass stops early), each head's F over the rows' tokens in order, as one pass would give them."""
    last = engine.num_states - 1
    reads_last = mix is not None and last in layers and (stop is None or stop >= last)
    budget = min(engine.n_batch, OUTPUTS_AT_ONCE) if reads_last else engine.n_batch
    decodes, current, used = [], [], 0
    for b, r in enumerate(rows):
        at = 0
        while at < len(r.tokens):
            take = min(len(r.tokens) - at, budget - used)
            current.append((b, SeqRow(r.tokens[at:at + take], r.seq, r.start + at), at + take == len(r.tokens)))
            used, at = used + take, at + take
            if used == budget:
                decodes.append(current)
                current, used = [], 0
    if current:
        decodes.append(current)
    logits = None if stop is not None else np.zeros((len(rows), engine.n_vocab), np.float32)
    parts: list[list] = [[[] for _ in rows] for _ in range(len(mix.tasks) if mix is not None else 0)]
    side = engine.side_thread() if mix is not None and engine.beside() else None
    for d, pieces in enumerate(decodes):
        if d and between is not None:
            between(sum(len(p.tokens) for _, p, _ in decodes[d - 1]))
        if mix is not None:
            mix.begin(sum(len(p.tokens) for _, p, _ in pieces))
        added: list[Future] = []  # beside: each state mixed on the side thread, in order, while llama.cpp goes on
        taps = [] if mix is None else [mix.add] if side is None else [
            lambda i, z: added.append(side.submit(mix.add, i, z))]
        try:
            out = engine.run([p for _, p, _ in pieces], taps, stop, wanted=set(layers),
                             logits_of=[j for j, (_, _, ends) in enumerate(pieces) if ends])
        finally:
            wait(added)
        for f in added:
            f.result()
        accs = mix.take() if mix is not None else []
        at = 0
        for j, (b, p, ends) in enumerate(pieces):
            if logits is not None and ends:
                logits[b] = out[j]
            for h, acc in enumerate(accs):
                parts[h][b].append(acc[at:at + len(p.tokens)])
            at += len(p.tokens)
    return logits, [np.concatenate([c for row in head for c in row]) for head in parts]


def read_rows(names: list[str], tasks: list, F: list[list[np.ndarray]], starts: list[int],
              skip_bos: bool | None = None) -> list[list[np.ndarray]]:
    """The full read (numpy_heads.read_all) of tasks[j] (head names[j]) over each row's F (F[j][b]: (T_b, k)) from position
    starts[b] on, the rows right-padded into one batch: per task, per row, its probabilities or value (a token
    task: per position, T_b of them). A non-finite value is a ModelError (never answered as NaN)."""
    lengths = [len(f) for f in F[0]]
    T = max(lengths)
    mask = (np.arange(T)[None, :] < np.array(lengths)[:, None]) & (np.arange(T)[None, :] >= np.array(starts)[:, None])
    padded = []
    for rows in F:
        acc = np.zeros((len(rows), T, rows[0].shape[-1]), np.float32)
        for b, f in enumerate(rows):
            acc[b, :len(f)] = f
        padded.append(acc)
    out = []
    for name, t, y in zip(names, tasks, read_all(tasks, padded, mask, skip_bos)):
        values = probabilities(t, y)
        if not np.isfinite(values).all():
            raise ModelError(f"head {name!r} produced non-finite values (NaN or infinity)")
        out.append([values[b, :lengths[b]] if values.ndim == 3 else values[b] for b in range(len(lengths))])
    return out


class Grown:
    """A (T, k) array grown by appending rows (capacity doubled: appending is O(1) amortised)."""

    def __init__(self, k: int):
        self.data, self.n = np.zeros((16, k), np.float32), 0

    def append(self, rows: np.ndarray) -> None:
        need = self.n + len(rows)
        if need > len(self.data):
            grown = np.zeros((max(need, 2 * len(self.data)), self.data.shape[1]), np.float32)
            grown[:self.n] = self.data[:self.n]
            self.data = grown
        self.data[self.n:need] = rows
        self.n = need

    def view(self, start: int = 0) -> np.ndarray:
        return self.data[start:self.n]


@dataclass
class SequenceBatch:
    """Rows decoding together: per row its llama.cpp sequence, tokens held, and each head's F so far."""
    rows: list[Row]
    seqs: Sequences
    keys: list[int]                       # each row's own id (its incremental reads' caches)
    lengths: list[int]                    # tokens each row's sequence holds
    F: list[dict[str, Grown]]             # per row: head -> F (T, k)
    logits: np.ndarray | None             # (B, V): the next token's logits (None inside a step, rows ending)
    gone: list[int] = field(default_factory=list)  # keys of rows that left, their caches to drop
    # decode steps' states not mixed yet for the heads not read at those steps (later_heads): (the step's row
    # keys, (their layers, rows, d)); a batch fresh from its prefill has none
    later: list[tuple[list[int], np.ndarray]] = field(default_factory=list)
    later_heads: frozenset = frozenset()

    def keep(self, idx: list[int]) -> "SequenceBatch":
        if idx == list(range(len(self.rows))):
            return self
        kept = set(idx)
        gone = self.gone + [k for j, k in enumerate(self.keys) if j not in kept]
        mine = {self.keys[i] for i in idx}
        later = [([k for k in keys if k in mine], z[:, [j for j, k in enumerate(keys) if k in mine]])
                 for keys, z in self.later]
        return SequenceBatch([self.rows[i] for i in idx], self.seqs.select(idx), [self.keys[i] for i in idx],
                             [self.lengths[i] for i in idx], [self.F[i] for i in idx],
                             None if self.logits is None else self.logits[idx], gone, [b for b in later if b[0]],
                             self.later_heads)

    def merge(self, other: "SequenceBatch") -> "SequenceBatch":
        return SequenceBatch(self.rows + other.rows, self.seqs.merged(other.seqs, 0), self.keys + other.keys,
                             self.lengths + other.lengths, self.F + other.F,
                             np.concatenate([self.logits, other.logits]), self.gone + other.gone,
                             self.later + other.later, self.later_heads if self.later else other.later_heads)


class SequencePasses:
    """infer/generate.Passes on a GgufPredictor (adalayers.infer.gguf_serving): llama.cpp and numpy heads."""

    def __init__(self, side, heads: list):
        self.side, self.heads = side, heads
        self.engine = side.runtime.engine
        self.tasks = {h.name: h.task for h in heads}
        self.mix = LayerMix([h.task for h in heads]) if heads else None  # prefills and passes of many rows
        self.layers = used_layers(heads)
        self._mixes: dict[frozenset, tuple[LayerMix, list[int], list]] = {}  # a decode step's heads: their mix
        if heads:  # every head read at a step: the same mix (one copy of the stacked W)
            self._mixes[frozenset(self.tasks)] = self.mix, self.layers, list(heads)
        self.reads: dict[tuple[str, ...], IncrementalReads] = {}
        self.fed: dict[tuple[tuple, int], int] = {}       # (heads read together, row key) -> positions fed
        self.last: dict[tuple[tuple, int], list] = {}     # ... -> their values then
        self._keys = itertools.count()

    def prefill(self, wrapped: list[str], cancelled, between: Callable[[int], None] | None = None
                ) -> tuple[SequenceBatch, list[tuple]]:
        tok = self.side.backbone.tokenizer
        enc = tok(wrapped, truncation=True, max_length=self.side.max_length, return_offsets_mapping=True)
        ids = enc["input_ids"]
        seqs = Sequences(self.engine, len(ids))
        F = [{h.name: Grown(self.mix_k(h.name)) for h in self.heads} for _ in ids]
        rows = [SeqRow(ids[j], seqs.ids[j], 0) for j in range(len(ids))]
        logits, accs = decode_rows(self.engine, rows, self.mix, self.layers, None, between)
        self._append(F, [len(i) for i in ids], accs)
        batch = SequenceBatch([], seqs, [next(self._keys) for _ in ids], [len(i) for i in ids], F, logits)
        return batch, [(ids[j], list(enc["offset_mapping"][j]), 0, len(ids[j])) for j in range(len(ids))]

    def mix_k(self, name: str) -> int:
        task = self.tasks[name]
        return task.k * (len(task.members) or 1)  # a seed ensemble's members side by side (LayerMix.take)

    def decode(self, batch: SequenceBatch, nxt: np.ndarray, go_on: list[int], deepest: int | None,
               reads: list[tuple[list[str], list[int]]] = ()) -> np.ndarray | None:
        rows = [SeqRow([int(t)], s, n) for t, s, n in zip(nxt.tolist(), batch.seqs.ids, batch.lengths)]
        self._forget(batch)
        stop = None if go_on else deepest
        if self._beside(rows):
            logits = self._step_beside(batch, rows, stop, reads)
        elif self.heads and len(rows) <= GATHER_TOKENS:  # a step: the compiled gather
            logits = self.engine.decode(rows, (), set(self.layers), outputs="last", stop_after=stop, read=True)
            self._step_mix(batch, len(rows), self.engine.states().__getitem__, reads)
        else:
            logits, accs = decode_rows(self.engine, rows, self.mix, self.layers, stop)
            self._mix_later(batch)  # the kept steps first: each row's F in the order of its positions
            self._append(batch.F, [1] * len(rows), accs)
        batch.lengths = [n + 1 for n in batch.lengths]
        everyone = len(go_on) == len(batch.rows)
        batch.logits = logits if everyone else None
        return None if logits is None else (logits if everyone else logits[go_on])

    def _beside(self, rows: list[SeqRow]) -> bool:
        """A step whose head work runs beside llama.cpp's decode (LlamaCpp.beside: where it leaves a core free)."""
        return bool(self.heads) and len(rows) <= GATHER_TOKENS and self.engine.beside()

    def _step_beside(self, batch: SequenceBatch, rows: list[SeqRow], stop: int | None,
                     reads: list[tuple[list[str], list[int]]]) -> np.ndarray | None:
        """One decode step, the heads' work on LlamaCpp.decode's `during` thread while llama.cpp computes: once
        the deepest state the heads read is copied (every other is copied before it), the mix of all of them
        (_step_mix, as a step after the decode does it), the rows' F appended, then the sequence heads of `reads` read
        incrementally (their values wait in the caches read() looks in), while llama.cpp computes what follows
        that state (the LM head: 58% of a gemma3-270m step). The same values as the step done after the decode."""
        mixed = []

        def during(state):
            if state(self.layers[-1]) is None:  # the decode ended without it: decode raises why
                return
            self._step_mix(batch, len(rows), state, reads)
            mixed.append(True)
            for names, idx in reads:
                step = self._stepped(names)
                if step:
                    self._incremental(batch, step, idx)

        logits = self.engine.decode(rows, (), set(self.layers), outputs="last", stop_after=stop, read=True,
                                    during=during)
        if not mixed:
            raise ModelError("llama.cpp's step ended before every state the heads read was copied")
        return logits

    def _step_mix(self, batch: SequenceBatch, n: int, state: Callable[[int], np.ndarray],
                  reads: list[tuple[list[str], list[int]]]) -> None:
        """A decode step's states (state(i): (n, d), every row of the batch): the heads read at this step (`reads`)
        mixed now, every state they read at once (LayerMix.add_layers), their F appended; the states of the
        other heads kept on the batch, mixed LATER_ROWS rows at a time, or before one of them is read, or when
        the heads read at a step change (the kept steps first: each row's F in the order of its positions)."""
        now = frozenset(n for names, _ in reads for n in self._stepped(names))
        later = frozenset(self.tasks) - now
        if batch.later and batch.later_heads != later:
            self._mix_later(batch)
        if now:
            mix, layers, heads = self._mix_of(now)
            mix.begin(n)
            mix.add_layers(layers, np.stack([state(i) for i in layers]))
            self._append(batch.F, [1] * n, mix.take(), heads)
        if later:
            batch.later.append((list(batch.keys), np.stack([state(i) for i in self._mix_of(later)[1]])))
            batch.later_heads = later
            if sum(len(keys) for keys, _ in batch.later) >= LATER_ROWS:
                self._mix_later(batch)

    def _mix_of(self, names: frozenset) -> tuple[LayerMix, list[int], list]:
        """The LayerMix of the heads `names`, the states they read, the heads (in the order of self.heads)."""
        if names not in self._mixes:
            heads = [h for h in self.heads if h.name in names]
            self._mixes[names] = LayerMix([h.task for h in heads]), used_layers(heads), heads
        return self._mixes[names]

    def _mix_later(self, batch: SequenceBatch) -> None:
        """The kept steps' states, mixed in one product for the heads they were kept for, each row's F appended."""
        if not batch.later:
            return
        mix, layers, heads = self._mix_of(batch.later_heads)
        z = np.concatenate([z for _, z in batch.later], 1)
        mix.begin(z.shape[1])
        mix.add_layers(layers, z)
        accs = mix.take()
        where = {k: b for b, k in enumerate(batch.keys)}
        at = 0
        for keys, _ in batch.later:  # in step order: each row's positions in order
            for j, key in enumerate(keys):
                for h, acc in zip(heads, accs):
                    batch.F[where[key]][h.name].append(acc[at + j:at + j + 1])
            at += len(keys)
        batch.later = []

    def _stepped(self, names) -> tuple[str, ...]:
        """The heads of `names` read incrementally at each step (sequence heads and probes)."""
        return tuple(n for n in names if IncrementalReads.applies(self.tasks[n]))

    def _append(self, F: list[dict], counts: list[int], accs: list[np.ndarray], heads: list | None = None) -> None:
        at = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        for b, row in enumerate(F):
            for h, acc in zip(self.heads if heads is None else heads, accs):
                row[h.name].append(acc[at[b]:at[b + 1]])

    def _forget(self, batch: SequenceBatch) -> None:
        """The incremental caches of rows that left the batch."""
        for key in batch.gone:
            for names, reads in self.reads.items():
                reads.drop(key)
                self.fed.pop((names, key), None)
                self.last.pop((names, key), None)
        batch.gone = []

    def read(self, batch: SequenceBatch, names: list[str], rows: list[int], answer_alone: bool
             ) -> dict[str, list[np.ndarray]]:
        if batch.later and any(n in batch.later_heads for n in names):  # their kept steps mixed first
            self._mix_later(batch)
        step = () if answer_alone else self._stepped(names)
        out = self._incremental(batch, step, rows) if step else {}
        full = [n for n in names if n not in step]
        if full:
            out.update(self._full(batch, full, rows, answer_alone))
        for n in step:  # the full read checks its own (read_rows)
            if not all(np.isfinite(v).all() for v in out[n]):  # never answered as NaN: a server-side fault
                raise ModelError(f"head {n!r} produced non-finite values (NaN or infinity)")
        return out

    def _incremental(self, batch: SequenceBatch, names: tuple[str, ...], rows: list[int]) -> dict[str, list]:
        """Sequence heads read together, each row's positions not yet fed given once (IncrementalReads.step)."""
        reads = self.reads.get(names)
        if reads is None:
            reads = self.reads[names] = IncrementalReads([self.tasks[n] for n in names])
        fresh = [r for r in rows if self.fed.get((names, batch.keys[r])) != batch.F[r][names[0]].n]
        if fresh:
            counts = [batch.F[r][names[0]].n - self.fed.get((names, batch.keys[r]), 0) for r in fresh]
            accs = [np.concatenate([batch.F[r][n].view(self.fed.get((names, batch.keys[r]), 0)) for r in fresh])
                    for n in names]
            ys = reads.step([batch.keys[r] for r in fresh], accs, counts)
            for b, r in enumerate(fresh):
                key = (names, batch.keys[r])
                self.fed[key] = batch.F[r][names[0]].n
                self.last[key] = [probabilities(self.tasks[n], y[b]) for n, y in zip(names, ys)]
        return {n: [self.last[(names, batch.keys[r])][j] for r in rows] for j, n in enumerate(names)}

    def _full(self, batch: SequenceBatch, names: list[str], rows: list[int], answer_alone: bool) -> dict:
        """The full read over each row's F so far (answer_alone: its generated tokens only, BOS not skipped)."""
        starts = [batch.rows[r].answer_from if answer_alone else 0 for r in rows]
        outs = read_rows(names, [self.tasks[n] for n in names], [[batch.F[r][n].view() for r in rows] for n in names], starts,
                         False if answer_alone else None)
        return dict(zip(names, outs))
