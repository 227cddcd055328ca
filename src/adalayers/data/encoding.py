"""Examples -> token rows -> padded batches.

Sequence tasks: one row per example, truncated to max_length (the count of truncated rows is kept).
Token tasks: a sentence longer than max_length is split at word boundaries into windows, never cut;
the first sub-token of each word carries the word's tag, the rest (and special tokens) are IGNORE.
Every row remembers its example and its words, so predictions map back to words.
"""
from __future__ import annotations

import copy
import json
import weakref
from dataclasses import dataclass, field

import torch

from adalayers.engine.loss import IGNORE
from adalayers.data.tasks import Example
from adalayers.data.templates import Template
from adalayers.kinds import TaskKind
from adalayers.data.windows import consecutive, first_subtokens, word_windows  # noqa: F401  (imported from here too)


@dataclass
class EncodedSplit:
    name: str                      # train / validation / test: batches carry it, so a cache knows where to read
    rows: list[dict]
    num_examples: int
    num_truncated: int = 0
    extra: dict = field(default_factory=dict)


def encode(examples: list[Example], tokenizer, max_length: int, kind: str, labels: list[str],
           name: str = "", template: Template | None = None) -> EncodedSplit:
    """`template` (task.template) wraps each sequence example's text first (adalayers.data.templates)."""
    if kind == TaskKind.TOKENS:
        return _encode_tokens(examples, tokenizer, max_length, labels, name)
    label_id = {name: i for i, name in enumerate(labels)}
    texts, pairs = _texts(examples, tokenizer, template)
    enc = tokenizer(texts, pairs, truncation=True, max_length=max_length)
    rows, truncated = [], 0
    for i, e in enumerate(examples):
        row = {"input_ids": enc["input_ids"][i], "example": i}
        if "token_type_ids" in enc:
            row["token_type_ids"] = enc["token_type_ids"][i]
        if e.label is not None:
            row["label"] = float(e.label) if kind == TaskKind.REGRESSION else label_id[e.label]
        rows.append(row)
    # a row of exactly max_length tokens may have fit: count only texts that really lost tokens
    full = [i for i, r in enumerate(rows) if len(r["input_ids"]) >= max_length]
    if full:
        lengths = tokenizer([texts[i] for i in full], [pairs[i] for i in full] if pairs else None,
                            verbose=False)["input_ids"]
        truncated = sum(len(ids) > max_length for ids in lengths)
    return EncodedSplit(name, rows, len(examples), truncated)


@dataclass
class LengthChoice:
    max_length: int      # the chosen number of tokens per row
    share_over: float    # share of the training examples longer than that (truncated, or split into windows)
    longest: int         # tokens of the longest training example
    examples: int


def _texts(examples: list[Example], tokenizer, template: Template | None) -> tuple[list[str], list[str] | None]:
    """The texts (and second texts of pairs) the tokenizer reads: as given, or wrapped by the template."""
    texts = [e.text for e in examples]
    pairs = [e.text_pair for e in examples] if examples and examples[0].text_pair is not None else None
    return (template or Template()).apply(tokenizer, texts, pairs)


def choose_max_length(examples: list[Example], tokenizer, kind: str, limit: int, coverage: float = 0.99,
                      floor: int = 8, template: Template | None = None) -> LengthChoice:
    """max_length from the data: the smallest length that holds `coverage` of the training examples whole
    (their token count with special tokens, pairs encoded together), within [floor, limit].

    L = min(limit, max(floor, ceil-quantile_coverage(lengths))); the share of examples longer than L is
    what truncation (sequence tasks) or word-boundary windows (token tasks) will touch.
    """
    import math

    if kind == TaskKind.TOKENS:
        tok = word_tokenizer(tokenizer)
        lengths = [len(ids) for ids in tok([e.words for e in examples], is_split_into_words=True,
                                           verbose=False)["input_ids"]]
    else:
        texts, pairs = _texts(examples, tokenizer, template)
        lengths = [len(ids) for ids in tokenizer(texts, pairs, verbose=False)["input_ids"]]
    ordered = sorted(lengths)
    at = ordered[max(0, math.ceil(coverage * len(ordered)) - 1)] if ordered else floor
    chosen = min(limit, max(floor, at))
    over = sum(n > chosen for n in lengths)
    return LengthChoice(chosen, over / max(1, len(lengths)), max(lengths, default=0), len(lengths))


_WORD_TOKENIZERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _prefix_space_off(node) -> bool:
    """Does this pre-tokenizer (as JSON) hold a ByteLevel step with add_prefix_space off? Turns it on."""
    found = False
    if isinstance(node, dict):
        if node.get("type") == "ByteLevel" and node.get("add_prefix_space") is False:
            node["add_prefix_space"], found = True, True
        for v in node.values():
            found |= _prefix_space_off(v)
    elif isinstance(node, list):
        for v in node:
            found |= _prefix_space_off(v)
    return found


def word_tokenizer(tokenizer):
    """The tokenizer to use on pre-split words.

    Byte-level BPE tokenizers (RoBERTa, BART, GPT-2) mark a word start with a leading space; fed
    one word at a time without add_prefix_space, every word is tokenized as if it began the text
    and gets pieces the base never saw mid-sentence. Such a tokenizer is copied once with the
    prefix space turned on (what add_prefix_space=True does); the base's own tokenizer, used for
    whole texts, is left untouched.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return tokenizer
    if tokenizer not in _WORD_TOKENIZERS:
        from tokenizers import Tokenizer

        spec = json.loads(backend.to_str())
        fixed = None  # None: the tokenizer is fine as it is
        if _prefix_space_off(spec.get("pre_tokenizer")):
            fixed = copy.deepcopy(tokenizer)
            fixed.backend_tokenizer.pre_tokenizer = Tokenizer.from_str(json.dumps(spec)).pre_tokenizer
            fixed.add_prefix_space = True
        _WORD_TOKENIZERS[tokenizer] = fixed
    return _WORD_TOKENIZERS[tokenizer] or tokenizer


def _encode_tokens(examples, tokenizer, max_length, labels, name) -> EncodedSplit:
    tokenizer = word_tokenizer(tokenizer)
    tag_id = {name: i for i, name in enumerate(labels)}
    budget = max_length - tokenizer.num_special_tokens_to_add(pair=False)
    words_all = [e.words for e in examples]
    pieces = tokenizer(words_all, is_split_into_words=True, add_special_tokens=False)
    windows = []  # (example index, first word, last word + 1)
    for i, e in enumerate(examples):
        counts = [0] * len(e.words)
        for w in pieces.word_ids(i):
            if w is not None:
                counts[w] += 1
        windows += [(i, a, b) for a, b in word_windows(counts, budget)]
    enc = tokenizer([examples[i].words[a:b] for i, a, b in windows], is_split_into_words=True,
                    truncation=True, max_length=max_length)
    rows = []
    for r, (i, a, b) in enumerate(windows):
        word_ids = enc.word_ids(r)
        tags = examples[i].tags
        firsts = dict(first_subtokens(word_ids)) if tags is not None else {}
        row_labels = [tag_id[tags[a + firsts[p]]] if p in firsts else IGNORE for p in range(len(word_ids))]
        row = {"input_ids": enc["input_ids"][r], "example": i, "word_start": a, "num_words": b - a,
               "word_ids": word_ids, "labels": row_labels}
        if "token_type_ids" in enc:
            row["token_type_ids"] = enc["token_type_ids"][r]
        rows.append(row)
    split_up = len({i for i, a, _ in windows if a > 0})  # sentences that needed more than one window
    return EncodedSplit(name, rows, len(examples), 0, {"windows": len(windows), "split_examples": split_up})


def collate(rows: list[dict], indices: list[int], pad_id: int, split: str = "", left: bool = False) -> dict:
    """Rows -> padded tensors; padding on the right, or with `left` on the left (a decoder's next-token
    output then sits in the last column of every row)."""
    T = max(len(r["input_ids"]) for r in rows)
    B = len(rows)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.long)
    batch = {"input_ids": input_ids, "attention_mask": mask, "index": torch.tensor(indices), "split": split}
    if "token_type_ids" in rows[0]:
        batch["token_type_ids"] = torch.zeros((B, T), dtype=torch.long)
    if "labels" in rows[0]:
        batch["labels"] = torch.full((B, T), IGNORE, dtype=torch.long)
    elif "label" in rows[0]:
        batch["labels"] = torch.tensor([r["label"] for r in rows])
    for b, r in enumerate(rows):
        n = len(r["input_ids"])
        at = slice(T - n, T) if left else slice(0, n)
        input_ids[b, at] = torch.tensor(r["input_ids"])
        mask[b, at] = 1
        if "token_type_ids" in batch:
            batch["token_type_ids"][b, at] = torch.tensor(r["token_type_ids"])
        if "labels" in r:
            batch["labels"][b, at] = torch.tensor(r["labels"])
    return batch


def batch_plan(split: EncodedSplit, batch_size: int, shuffle: bool = False,
               generator: torch.Generator | None = None) -> list[list[int]]:
    """Row indices per batch. Training: shuffled. Evaluation: sorted by length (less padding)."""
    n = len(split.rows)
    if shuffle:
        order = torch.randperm(n, generator=generator).tolist()
    else:
        order = sorted(range(n), key=lambda i: len(split.rows[i]["input_ids"]))
    return [order[s: s + batch_size] for s in range(0, n, batch_size)]


def split_batch(split: EncodedSplit, idx: list[int], pad_id: int) -> dict:
    """The padded batch of rows `idx` of a split; `index` says which rows, `split` where they come from."""
    return collate([split.rows[i] for i in idx], idx, pad_id, split.name)


def batches(split: EncodedSplit, batch_size: int, pad_id: int, shuffle: bool = False,
            generator: torch.Generator | None = None):
    """Training: shuffled. Evaluation: sorted by length (less padding); `index` says which rows."""
    for idx in batch_plan(split, batch_size, shuffle, generator):
        yield split_batch(split, idx, pad_id)


class SplitFeed:
    """Training batches of one split for adalayers.engine.fit, plus the validation score.

    Under torchrun every rank draws the same shuffled global batch and keeps rows rank, rank + N, ...
    with loss_weight = N * (its rows) / (the batch's rows); a rank left without rows (a last batch
    smaller than N) runs one row with weight 0, so every rank takes part in every step.
    `rows`: only these rows of the split (their indices, which batches keep, so a cache reads the right
    states); None = all of them.
    """

    def __init__(self, split: EncodedSplit, batch_size: int, pad_id: int, validate, rows: list[int] | None = None):
        self.split, self.batch_size, self.pad_id, self.validate = split, batch_size, pad_id, validate
        self.rows = rows
        self.steps = -(-(len(split.rows) if rows is None else len(rows)) // batch_size)

    def plan(self, generator: torch.Generator) -> list[list[int]]:
        """This epoch's batches of row indices, shuffled."""
        if self.rows is None:
            return batch_plan(self.split, self.batch_size, shuffle=True, generator=generator)
        order = [self.rows[i] for i in torch.randperm(len(self.rows), generator=generator).tolist()]
        return [order[s: s + self.batch_size] for s in range(0, len(order), self.batch_size)]

    def epoch(self, epoch: int, generator: torch.Generator):
        from adalayers.engine import distributed

        world, rank = distributed.world_size(), distributed.rank()
        for idx in self.plan(generator):
            if not distributed.active():
                yield split_batch(self.split, idx, self.pad_id)
                continue
            mine = idx[rank::world]
            weight = world * len(mine) / len(idx)
            batch = split_batch(self.split, mine or idx[:1], self.pad_id)
            batch["loss_weight"] = weight
            yield batch
