"""Examples -> rows -> batches, in the input form a head reads.

single  one text                        -> one side
cross   a pair as one sequence (the tokenizer's pair encoding: [CLS] a [SEP] b [SEP]) -> one side
bi      a pair as two sequences, one pass each                                     -> two sides
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from adalayers.data.encoding import collate as encoding_collate, encode
from adalayers.errors import ConfigError
from adalayers.kinds import TaskKind


@dataclass
class TaskRows:
    form: str                 # single | cross | bi
    sides: list[list[dict]]   # per side: one encoded row {input_ids, token_type_ids?, ...} per example
    labels: list              # class index or float per example

    def __len__(self):
        return len(self.labels)


def input_form(head_sides: int, is_pair: bool, task: str) -> str:
    if head_sides == 2:
        if not is_pair:
            raise ConfigError(f"task {task}: a bilinear or cosine head needs a sentence-pair task")
        return "bi"
    return "cross" if is_pair else "single"


def encode_rows(examples, tokenizer, max_length: int, form: str, kind: TaskKind, labels: list[str]) -> TaskRows:
    """The examples through the one encoding (adalayers.data.encoding.encode): a bi-encoded pair is two
    single-text encodings, one per side."""
    if form == "bi":
        firsts = [replace(e, text_pair=None) for e in examples]
        seconds = [replace(e, text=e.text_pair, text_pair=None) for e in examples]
        splits = [encode(firsts, tokenizer, max_length, kind, labels), encode(seconds, tokenizer, max_length, kind,
                                                                             labels)]
    else:  # single, or cross: the tokenizer's pair encoding
        splits = [encode(examples, tokenizer, max_length, kind, labels)]
    return TaskRows(form, [s.rows for s in splits], [r["label"] for r in splits[0].rows])


def _pad(rows: list[dict], pad_id: int) -> dict:
    """input_ids / attention_mask / token_type_ids of one side, padded by the one collate (adalayers.data.encoding)."""
    batch = encoding_collate(rows, list(range(len(rows))), pad_id)
    return {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}


def collate(rows: TaskRows, idx: list[int], pad_id: int) -> dict:
    return {"sides": [_pad([side[i] for i in idx], pad_id) for side in rows.sides],
            "labels": torch.tensor([rows.labels[i] for i in idx]), "index": idx}
