"""One batch of rows -> one Arrow table of predictions: the model step of both predict-files engines.

BatchPredictor is Ray Data's callable class (one per actor) and the local engine's model alike, so both
engines run the same code: SideTasks.predict (one base pass per batch for every head, primary output
off) and the same conversion to columns:

    id                  the input's id column, as text
    <task>_label        sequence task: the most probable label      <task>_score  its probability
    <task>_value        regression task: the predicted value
    <task>_words        token task: the text's whitespace-separated words   <task>_tags  one tag per word
"""
from __future__ import annotations

import logging

import pyarrow as pa

from adalayers.errors import DataError

log = logging.getLogger(__name__)


def schema(heads: dict[str, str]) -> pa.Schema:
    """The output columns for heads {name: kind}."""
    fields = [pa.field("id", pa.string())]
    for name, kind in heads.items():
        if kind == "token":
            fields += [pa.field(f"{name}_words", pa.list_(pa.string())), pa.field(f"{name}_tags", pa.list_(pa.string()))]
        elif kind == "regression":
            fields.append(pa.field(f"{name}_value", pa.float64()))
        else:
            fields += [pa.field(f"{name}_label", pa.string()), pa.field(f"{name}_score", pa.float64())]
    return pa.schema(fields)


def to_table(ids: list[str], results: list[dict], heads: dict[str, str]) -> pa.Table:
    """SideTasks.predict results -> the output table (schema above)."""
    cols: dict[str, list] = {"id": ids}
    for name, kind in heads.items():
        outs = [r["tasks"][name] for r in results]
        if kind == "token":
            cols[f"{name}_words"] = [o["words"] for o in outs]
            cols[f"{name}_tags"] = [o["tags"] for o in outs]
        elif kind == "regression":
            cols[f"{name}_value"] = [o["value"] for o in outs]
        else:
            cols[f"{name}_label"] = [o["label"] for o in outs]
            cols[f"{name}_score"] = [o["probabilities"][o["label"]] for o in outs]
    return pa.Table.from_pydict(cols, schema=schema(heads))


class BatchPredictor:
    """Loads the base and heads once; called with a batch (Arrow table or {column: values}) of id + text."""

    def __init__(self, base: str, heads: list[str], id_column: str = "id", text_column: str = "text",
                 device: str = "cpu", max_length: int | None = None, batch_size: int = 32,
                 num_threads: int | None = None, skip_bad_rows: bool = False):
        import torch

        from adalayers.serve.api import SideTasks

        if num_threads:
            torch.set_num_threads(num_threads)
        self.side = SideTasks.load(base, heads, primary=False, device=device, max_length=max_length,
                                   batch_size=batch_size)
        self.heads = {h.name: h.kind for h in self.side.heads.values()}
        self.id_column, self.text_column, self.skip_bad_rows = id_column, text_column, skip_bad_rows

    def predict(self, ids: list[str], texts: list[str]) -> pa.Table:
        # every loaded head by name: a head trained on sentence pairs is refused in one line (it needs two texts)
        return to_table(ids, self.side.predict(texts, list(self.heads)) if texts else [], self.heads)

    def __call__(self, batch) -> pa.Table:
        """Ray Data's entry: rows without an id or text are errors (or dropped with skip_bad_rows)."""
        column = (lambda c: batch.column(c).to_pylist()) if isinstance(batch, pa.Table) else (lambda c: list(batch[c]))
        ids, texts = column(self.id_column), column(self.text_column)
        keep = []
        for i, (id_, text) in enumerate(zip(ids, texts)):
            if id_ is not None and isinstance(text, str) and text.strip():
                keep.append(i)
            elif not self.skip_bad_rows:
                raise DataError(f"the row with {self.id_column} {id_!r} has no text in column {self.text_column!r} "
                                f"(use --skip-bad-rows to skip such rows)")
            else:
                log.warning("skipped the row with %s %r: no text in column %r", self.id_column, id_, self.text_column)
        return self.predict([str(ids[i]) for i in keep], [texts[i] for i in keep])
