"""Examples -> rows -> batches, in the input form a head reads.

single  one text                        -> one side
cross   a pair as one sequence (the tokenizer's pair encoding: [CLS] a [SEP] b [SEP]) -> one side
bi      a pair as two sequences, one pass each                                     -> two sides
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from adalayers.data.encoding import collate as encoding_collate
from adalayers.errors import ConfigError
from adalayers.kinds import TaskKind


@dataclass
class TaskRows:
    form: str                 # single | cross | bi
    sides: list[list[dict]]   # per side: one {input_ids, token_type_ids?} per example
    labels: list              # class index or float per example

    def __len__(self):
        return len(self.labels)


def input_form(head_sides: int, is_pair: bool, task: str) -> str:
    if head_sides == 2:
        if not is_pair:
            raise ConfigError(f"task {task}: a bilinear or cosine head needs a sentence-pair task")
        return "bi"
    return "cross" if is_pair else "single"


def encode_rows(examples, tokenizer, max_length: int, form: str, kind: str, labels: list[str]) -> TaskRows:
    def enc(a, b=None):
        out = tokenizer(a, b, truncation=True, max_length=max_length)
        keys = [k for k in ("input_ids", "token_type_ids") if k in out]
        return [{k: out[k][i] for k in keys} for i in range(len(a))]

    first = [e.text for e in examples]
    second = [e.text_pair for e in examples]
    if form == "single":
        sides = [enc(first)]
    elif form == "cross":
        sides = [enc(first, second)]
    else:
        sides = [enc(first), enc(second)]
    label_id = {n: i for i, n in enumerate(labels)}
    ys = [float(e.label) if kind == TaskKind.REGRESSION else label_id[e.label] for e in examples]
    return TaskRows(form, sides, ys)


def _pad(rows: list[dict], pad_id: int) -> dict:
    """input_ids / attention_mask / token_type_ids of one side, padded by the one collate (adalayers.data.encoding)."""
    batch = encoding_collate(rows, list(range(len(rows))), pad_id)
    return {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}


def collate(rows: TaskRows, idx: list[int], pad_id: int) -> dict:
    return {"sides": [_pad([side[i] for i in idx], pad_id) for side in rows.sides],
            "labels": torch.tensor([rows.labels[i] for i in idx]), "index": idx}
