"""The torch-free half of the inference front door: texts (or sentence pairs) -> rows, and rows' outputs -> answers.

PredictorBase holds everything of adalayers.infer.predictor.Predictor that does not depend on how the base is
run: which heads answer (select, check_tasks), how a text is wrapped (task.template) and tokenized into rows
(plain rows, word-boundary windows for token heads, sentence pairs), how many tokens a request costs
(count_tokens), the micro-batches of a pass (skipping texts nobody waits for), and the answers (the output
schema, adalayers.infer.outputs). A subclass runs the rows:

    _run(rows, heads, abandoned) -> {"base": [per row: the base's own output or None],
                                     "heads": {head: [per row: probabilities, per-token probabilities, or the value]}}

    Predictor (infer/predictor.py)        torch: every runtime's pass (transformers, ONNX Runtime, llama.cpp)
    GgufPredictor (infer/gguf_serving.py) numpy heads on llama.cpp's states, no torch in the process

The module docstring of adalayers.infer.predictor says how texts become rows.
"""
from __future__ import annotations

import copy
import threading
from typing import Callable

import numpy as np

from adalayers.data.tasks import check_pairs
from adalayers.data.templates import Template
from adalayers.data.windows import word_windows
from adalayers.errors import Cancelled, DataError, ModelError
from adalayers.infer.heads import Head, input_kind
from adalayers.infer.numpy_heads import softmax
from adalayers.infer.outputs import sequence_output, tag_words, word_ids, word_spans
from adalayers.infer.shared_tokenizer import SharedTokenizer, shared
from adalayers.kinds import TaskKind
from adalayers.textcheck import check_texts


POOLINGS = ("mean", "last")  # embed's (llama-server's --pooling mean / last)


def chunks(n: int, size: int) -> list[list[int]]:
    """Rows 0..n-1 in order, `size` at a time (a pass's micro-batches)."""
    return [list(range(s, min(s + size, n))) for s in range(0, n, size)]


class PredictorBase:
    def __init__(self, runtime, heads: list[Head], primary: bool = True,
                 max_length: int | None = None, batch_size: int = 32):
        """`runtime`: what runs the base (its `base`: name, tokenizer, is_causal, ...; rows_per_pass, own_output).
        `batch_size`: rows per pass, at most what the runtime takes per pass (runtime.rows_per_pass)."""
        names = [h.name for h in heads]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ModelError(f"two heads are named {', '.join(dupes)}; name them apart with NAME=RUN_FOLDER")
        self.runtime = runtime
        backbone = self.runtime.base
        self.heads, self.primary = {h.name: h for h in heads}, primary
        limit = min(int(getattr(backbone.tokenizer, "model_max_length", 512) or 512), 100_000)
        self.max_length = min(max_length or max([h.max_length for h in heads] or [limit]), limit)
        self.batch_size = self.runtime.rows_per_pass(self.max_length, batch_size)
        self._lock = threading.Lock()  # the heads hold per-pass state: one pass at a time
        self.rows_run = 0      # token rows (plain rows and windows) the base has run, all passes together
        self.rows_skipped = 0  # rows of passes stopped early because nobody waited for them (Cancelled)
        self._counter = None  # count_tokens' tokenizer, made at its first call (_counting)
        self._counter_lock = threading.Lock()
        for h in heads:
            h.template.check(backbone.tokenizer, backbone.name, h.pairs, h.kind)
        templates = {h.template for h in heads}
        if len(templates) > 1:  # one pass reads one text: heads that wrap it differently cannot share it
            raise ModelError("the heads were trained with different task.template settings ("
                             + "; ".join(f"{h.name}: {h.template.describe()}" for h in heads)
                             + "); serve them separately")
        self.template = templates.pop() if templates else Template()
        if any(h.kind == TaskKind.TOKENS for h in heads) and not backbone.tokenizer.is_fast:
            raise ModelError(f"{backbone.name}: token heads need a fast tokenizer (for character offsets)")

    @property
    def backbone(self):
        """The base (name, tokenizer, fingerprint(), sizes, device, is_causal): runtime.base."""
        return self.runtime.base

    @property
    def names(self) -> list[str]:
        return list(self.heads)

    def describe(self) -> list[dict]:
        return [h.describe() for h in self.heads.values()]

    def check_tasks(self, tasks: list[str] | None) -> list[str]:
        if tasks is None:
            return self.names
        unknown = [t for t in tasks if t not in self.heads]
        if unknown:
            raise DataError(f"unknown task(s) {', '.join(map(repr, unknown))}; known: {', '.join(self.names)}")
        return list(dict.fromkeys(tasks))

    def select(self, tasks: list[str] | None, pairs: bool) -> list[str]:
        """The heads to answer: the named ones, each checked to take this input (single texts or sentence
        pairs), or, when none are named, every head that takes it."""
        if tasks is None:
            names = [n for n, h in self.heads.items() if h.pairs == pairs]
            if self.heads and not names:
                raise DataError(f"no loaded head takes {'sentence pairs' if pairs else 'single texts'} "
                                f"(heads: {', '.join(f'{n} ({input_kind(h)})' for n, h in self.heads.items())})")
            return names
        names = self.check_tasks(tasks)
        for n in names:
            check_pairs(f"task {n!r}", self.heads[n].pairs, [] if pairs else None, 0)
        return names

    def predict(self, texts: list[str], tasks: list[str] | None = None,
                text_pairs: list[str] | None = None, windows: list[bool] | None = None,
                abandoned: Callable[[], set[int]] | None = None) -> list[dict]:
        """Every asked head's prediction per text. A head trained on sentence pairs needs `text_pairs`
        (one second text per text); the others refuse them. Without `tasks`: the heads that take the input.
        `windows`: per text, whether its long text is split into windows for the token heads (default: for
        every text when a token head is asked); a text without them gets token-head answers from its plain
        (truncated) row. `abandoned`: asked before every micro-batch of the pass, the indices of the texts
        nobody waits for any more: their rows are skipped from then on and their results are None; when it
        names every text the pass stops (Cancelled)."""
        if text_pairs is not None and len(text_pairs) != len(texts):
            raise DataError(f"{len(texts)} texts but {len(text_pairs)} second texts: give one second text per text")
        names = self.select(tasks, text_pairs is not None)
        check_texts(texts)  # the same rule as `adalayers predict`
        check_texts(text_pairs or [], what="second text")
        heads = [self.heads[n] for n in names]
        wrapped, second = self.wrap(texts, text_pairs)
        if second is not None:
            rows, spans = self._pair_rows(wrapped, second), [[] for _ in texts]
        else:
            tokens = any(h.kind == TaskKind.TOKENS for h in heads)
            rows, spans = self._rows(wrapped, [tokens and w for w in windows] if windows else [tokens] * len(texts))
        with self._lock:
            outs = self._run(rows, heads, abandoned)
        skipped = {rows[r]["text"] for r, out in enumerate(outs["heads"][heads[0].name]) if out is None} if heads \
            else set()
        results = [None if i in skipped else self._result(i, text, rows, outs, heads, spans[i])
                   for i, text in enumerate(wrapped)]
        for r, text in zip(results, texts):
            if r is not None:
                r["text"] = text  # the caller's text, not the wrapped one
        for r, second in zip(results, text_pairs or []):
            if r is not None:
                r["text_pair"] = second
        return results

    def wrap(self, texts: list[str], text_pairs: list[str] | None = None) -> tuple[list[str], list[str] | None]:
        """The texts as the base reads them: wrapped by the heads' task.template (adalayers.data.templates)."""
        return self.template.apply(self.backbone.tokenizer, texts, text_pairs)

    def _pair_rows(self, texts: list[str], text_pairs: list[str]) -> list[dict]:
        """One row per pair, encoded as in training (the tokenizer's pair encoding, longest-first truncation)."""
        enc = self._tokenize(texts, text_pairs, truncation=True, max_length=self.max_length)
        full = self._tokenize(texts, text_pairs, verbose=False)["input_ids"]
        rows = []
        for i in range(len(texts)):
            row = self._row(enc, i, i, 0, [])
            row["pair_truncated"] = len(full[i]) > self.max_length
            rows.append(row)
        return rows

    @property
    def _counting(self):
        """count_tokens' own copy of a shared (locked) tokenizer, with a lock of its own: counting a new request's
        tokens (serve's checks thread) neither waits for the pass's tokenization nor holds it up (a cancel storm's
        counts held the one lock for seconds at a time). Made at the first count (a copy of Gemma's tokenizer
        takes about a second and a half), not when the predictor loads."""
        with self._counter_lock:
            if self._counter is None:
                tok = self.backbone.tokenizer
                self._counter = shared(copy.deepcopy(tok.unwrapped)) if isinstance(tok, SharedTokenizer) else tok
            return self._counter

    def _tokenize(self, *texts, counting: bool = False, **kw):
        """The tokenizer (`counting`: count_tokens' own copy), its failures turned into a DataError (the service
        answers it 422, alone)."""
        try:
            return (self._counting if counting else self.backbone.tokenizer)(*texts, **kw)
        except Exception as e:  # noqa: BLE001  (tokenizers raise assorted types on unreadable input)
            raise DataError(f"the tokenizer cannot read the text(s): {type(e).__name__}: {e}") from None

    def count_tokens(self, texts: list[str], tasks: list[str] | None = None,
                     text_pairs: list[str] | None = None) -> list[int]:
        """Tokens the base runs per text: its plain row, n + s tokens at most max_length (s special
        tokens), plus, when a token head is asked for and n > max_length - s, its windows:
        n + s * ceil(n / (max_length - s)) more (a sentence pair: its one row, at most max_length).
        Used to bound the work of a request and of a batch."""
        check_texts(texts)
        if text_pairs is not None:
            check_texts(text_pairs, what="second text")
        texts, text_pairs = self.template.apply(self._counting, texts, text_pairs)  # wrap, on the counting copy
        if text_pairs is not None:
            return [min(len(ids), self.max_length) for ids in
                    self._tokenize(texts, text_pairs, counting=True, verbose=False)["input_ids"]]
        windows = any(self.heads[n].kind == TaskKind.TOKENS for n in self.check_tasks(tasks))
        special = self._counting.num_special_tokens_to_add(pair=False)
        budget = max(1, self.max_length - special)
        counts = []
        for ids in self._tokenize(texts, add_special_tokens=False, counting=True, verbose=False)["input_ids"]:
            n = len(ids)
            counts.append(min(n, budget) + special + (n + special * -(-n // budget) if windows and n > budget else 0))
        return counts

    def _rows(self, texts: list[str], windows: list[bool]) -> tuple[list[dict], list[list[tuple[int, int]]]]:
        """Token rows: one plain (truncated) row per text, then word-boundary windows of the long texts
        whose `windows` flag is set."""
        tok = self.backbone.tokenizer
        spans = [word_spans(t) for t in texts]
        enc = self._tokenize(texts, truncation=True, max_length=self.max_length, return_offsets_mapping=tok.is_fast)
        budget = self.max_length - tok.num_special_tokens_to_add(pair=False)
        full = self._tokenize(texts, add_special_tokens=False, return_offsets_mapping=tok.is_fast, verbose=False)
        rows = [self._row(enc, i, i, 0, spans[i]) for i in range(len(texts))]
        for i, row in enumerate(rows):  # truncated: tokens were cut, not merely characters the tokenizer drops
            row["truncated"] = len(full["input_ids"][i]) > budget
        if not any(windows):
            return rows, spans
        cuts = []  # (text index, character span of the window)
        for i, text in enumerate(texts):
            if not windows[i] or len(full["input_ids"][i]) <= budget:
                continue
            rows[i]["token_rows"] = False  # the token heads read this text's windows instead
            rows[i]["windows"] = []
            counts = [0] * len(spans[i])
            for w in word_ids(full["offset_mapping"][i], spans[i], 0):
                if w is not None:
                    counts[w] += 1
            cuts += [(i, spans[i][a][0], spans[i][b - 1][1]) for a, b in word_windows(counts, budget)]
        if cuts:
            wenc = self._tokenize([texts[i][a:b] for i, a, b in cuts], truncation=True, max_length=self.max_length,
                                  return_offsets_mapping=True)
            for r, (i, a, _) in enumerate(cuts):
                rows[i]["windows"].append(len(rows))
                rows.append(self._row(wenc, r, i, a, spans[i], window=True))
        return rows, spans

    @staticmethod
    def _row(enc, r: int, text: int, offset: int, spans, window: bool = False) -> dict:
        row = {"input_ids": enc["input_ids"][r], "text": text, "window": window, "token_rows": True}
        if "token_type_ids" in enc:
            row["token_type_ids"] = enc["token_type_ids"][r]
        if "offset_mapping" in enc:
            row["word_ids"] = word_ids(enc["offset_mapping"][r], spans, offset)
        return row

    def _run(self, rows: list[dict], heads: list[Head], abandoned: Callable[[], set[int]] | None = None) -> dict:
        """One base pass per micro-batch of rows (_plan), every head reading it (see the module doc)."""
        raise NotImplementedError

    def _embedding_ids(self, texts: list[str], pooling: str) -> list[list[int]]:
        """embed's input checked (`pooling` one of POOLINGS, the text rules): each text's ids, truncated to
        max_length, BOS included (what a decoder base's embedding is read over)."""
        if pooling not in POOLINGS:
            raise DataError(f"pooling {pooling!r}: choose one of {', '.join(POOLINGS)}")
        check_texts(texts)
        return self._tokenize(texts, truncation=True, max_length=self.max_length)["input_ids"]

    def _plan(self, rows: list[dict], abandoned: Callable[[], set[int]] | None):
        """The micro-batches of row indices, in order; before each, the rows of texts nobody waits for are
        left out (counted in rows_skipped), and once no text is waited for the pass stops (Cancelled)."""
        texts, seen = len({r["text"] for r in rows}), 0
        for idx in chunks(len(rows), self.batch_size):
            gone = abandoned() if abandoned is not None else set()
            if gone and len(gone) >= texts:
                self.rows_skipped += len(rows) - seen
                raise Cancelled("nobody waits for this pass any more")
            seen += len(idx)
            keep = [i for i in idx if rows[i]["text"] not in gone]
            self.rows_skipped += len(idx) - len(keep)
            if keep:
                yield keep

    def _result(self, i: int, text: str, rows, outs, heads: list[Head], spans) -> dict:
        plain = rows[i]
        result = {"text": text, "truncated": plain.get("pair_truncated", plain.get("truncated", False))}
        if self.primary:
            result["base"] = self._base_output(outs["base"][i], text, spans, plain)
        result["tasks"] = {}
        for h in heads:
            if h.kind == TaskKind.TOKENS:  # the plain row when the text fits, else the text's windows
                mine = [(rows[r], outs["heads"][h.name][r]) for r in [i] + plain.get("windows", [])
                        if rows[r]["token_rows"]]
                result["tasks"][h.name] = tag_words(h.task.labels, text, spans, [(r["word_ids"], v) for r, v in mine])
            else:
                result["tasks"][h.name] = sequence_output(h.kind, h.task.labels, outs["heads"][h.name][i])
        return result

    def _base_output(self, out, text: str, spans, row: dict) -> dict | None:
        """The base's own output (runtime.own_output): a decoder's next token, a classifier base's
        prediction, or the sentence embedding."""
        if out is None:
            return None
        kind, labels = self.runtime.own_output()
        if kind == "next_token":  # a decoder LLM: its next token after the text
            probs = softmax(np.asarray(out[-1], np.float64))
            best = int(probs.argmax())
            return {"next_token": self.backbone.tokenizer.decode([best]), "probability": float(probs[best])}
        if kind == "embedding":
            return {"embedding": out.tolist()}
        if kind == "tokens":  # a token-classification base
            if "pair_truncated" in row:
                return None  # words of a sentence pair: not tagged
            return tag_words(labels, text, spans, [(row["word_ids"], softmax(np.asarray(out, np.float64)))])
        return sequence_output(TaskKind.CLASSIFICATION, labels, softmax(np.asarray(out, np.float64)))


def _real(values: torch.Tensor, n: int, left: bool) -> torch.Tensor:
    """A row's n real positions out of its padded values (padding on the left or the right)."""
    return values[values.shape[0] - n:] if left else values[:n]
